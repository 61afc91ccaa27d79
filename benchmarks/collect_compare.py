"""Copy the small outputs of a ``capo-verl compare`` folder into the repository, leaving checkpoints behind.

    python benchmarks/collect_compare.py ~/capo_pilot/out benchmarks/results/compare_decisive_cpu/pilot

Copies every file under SRC except checkpoints (``ckpt/``), Hydra's run folders (``outputs/``), logs (``*.log``),
the partial files of a stopped step (``*.partial*``, ``metrics.attempt.jsonl``) and files over ``--max-mb``
(listed, not copied). A unit that has not finished (no ``done.json``) is copied too, but only its marker and
attempts, so that the repository holds finished results and says what is under way. Rerunning copies what changed.
With ``--compress-dumps`` (formerly ``--gzip-dumps``), every JSON-lines file but ``attempts.jsonl`` (validation
dumps, ``metrics.jsonl``, held-out generations, the teacher-forced pool; plain or compressed in SRC) is stored as
``<name>.jsonl.xz`` (:func:`capo_verl.stored.xz_bytes`: the same text gives the same bytes; an older
``<name>.jsonl.gz`` beside it is removed), a method's copy of its seed's shared step-0 pass (``val_generations/0.jsonl``
in any form, beside ``0.shared.json``) is left out where the pass it names is copied, and a ``0.shared.json`` that
names a compressed pass by that file's SHA-256 is stored naming the plain dump with the SHA-256 of its text
(:func:`capo_verl.compare.report.plain_step0_record`): every reader takes every form
(:mod:`capo_verl.stored`, :func:`capo_verl.compare.report.validation_dump`), as ``benchmarks/compress_results.py``
stores the older studies.
The seeds summary at the top of SRC (``seeds_summary.json``/``.md``, ``seeds_curves.png``) is copied only when it
compares two or more methods: a call that trains or plots one method (``--methods grpo``) writes a one-method summary
there, which would replace the last comparison's; it is listed as left out. ``--skip PATTERN`` (repeatable) leaves out
every file whose relative path, or a folder above it, matches the glob (e.g. ``'seed*/grpo'``, ``'*.png'``): what a
study shares with another and does not copy again, or figures anyone can redraw with ``compare --plot-only``.
"""

from __future__ import annotations

import argparse
import json
import shutil
from fnmatch import fnmatch
from pathlib import Path

from capo_verl.compare.report import SHARED_STEP0, plain_step0_record
from capo_verl.stored import GZ, XZ, plain_name, read_bytes, stored, xz_bytes

SKIP_DIRS = {"ckpt", "outputs", "__pycache__"}
SUMMARY_FILES = {"seeds_summary.json", "seeds_summary.md", "seeds_curves.png"}
#: what is copied of a unit that has not finished (no ``done.json``)
UNDER_WAY_FILES = {".capo-verl-run.json", "attempts.jsonl"}
ONE_METHOD = "a one-method seeds summary"


def _one_method_summary(src: Path) -> bool:
    """True if ``src/seeds_summary.json`` exists and names fewer than two ``methods``.

    Raises:
        json.JSONDecodeError, KeyError: the file is not a ``capo-verl compare --seeds`` summary.
    """
    path = src / "seeds_summary.json"
    return path.exists() and len(json.loads(path.read_text())["methods"]) < 2


def _unit_of(src: Path, rel: Path) -> Path | None:
    """The method folder (``seed<k>/<method>`` or ``<method>``, marked ``.capo-verl-run.json``) that holds ``rel``,
    else None."""
    for depth in (1, 2):
        if len(rel.parts) > depth and (src / Path(*rel.parts[:depth]) / ".capo-verl-run.json").exists():
            return Path(*rel.parts[:depth])
    return None


def _shared_copy(src: Path, rel: Path) -> bool:
    """True if ``src/rel`` (``0.jsonl``, plain or compressed) is a method's copy of its seed's shared step-0 pass
    (:data:`SHARED_STEP0` beside it) whose source, named in the marker, is under ``src`` with the same text: the one
    copy kept is the source's."""
    marker = src / rel.parent / SHARED_STEP0
    if plain_name(rel).name != "0.jsonl" or not marker.exists():
        return False
    source = stored(plain_name(src / rel.parent.parent.parent / json.loads(marker.read_text())["from"]))
    return source.is_file() and source != src / rel and read_bytes(source) == read_bytes(src / rel)


def _write(data: bytes, target: Path) -> bool:
    """Write ``data`` to ``target`` unless it holds those bytes; returns True if written."""
    if target.exists() and target.read_bytes() == data:
        return False
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_bytes(data)
    return True


def _compress_dump(path: Path, target: Path) -> bool:
    """Write the text of the dump ``path`` (plain or compressed) xz-compressed (:func:`capo_verl.stored.xz_bytes`) to
    ``target`` (``<name>.jsonl.xz``) unless it holds the same bytes, and remove the dump's gzip form beside it;
    returns True if written."""
    written = _write(xz_bytes(read_bytes(path)), target)
    target.with_suffix(GZ).unlink(missing_ok=True)
    return written


def collect(
    src: Path, dest: Path, *, max_bytes: int, compress_dumps: bool = False, skip: tuple[str, ...] = ()
) -> tuple[list[Path], list[tuple[Path, str]]]:
    """Copy as described in the module doc; returns the copied relative paths and the left-out ones, each with why
    (:data:`ONE_METHOD`, or ``over N MB``). ``skip``: globs of relative paths (a file's or a folder's above it) not
    copied."""
    copied, left_out = [], []
    one_method = _one_method_summary(src)
    for path in sorted(src.rglob("*")):
        rel = path.relative_to(src)
        if not path.is_file() or SKIP_DIRS & set(rel.parts[:-1]):
            continue
        if any(fnmatch(str(Path(*rel.parts[:i])), pattern) for pattern in skip for i in range(1, len(rel.parts) + 1)):
            continue
        name = path.name
        if name.endswith(".log") or ".partial" in name or name == "metrics.attempt.jsonl":
            continue
        if one_method and len(rel.parts) == 1 and name in SUMMARY_FILES:
            left_out.append((rel, ONE_METHOD))
            continue
        unit = _unit_of(src, rel)
        if unit is not None and not (src / unit / "done.json").exists() and name not in UNDER_WAY_FILES:
            continue
        if compress_dumps and _shared_copy(src, rel):
            continue
        plain = plain_name(rel)
        if compress_dumps and plain.name.endswith(".jsonl") and plain.name not in UNDER_WAY_FILES:
            if _compress_dump(path, dest / plain.with_name(plain.name + XZ)):
                copied.append(plain.with_name(plain.name + XZ))
            continue
        if compress_dumps and name == SHARED_STEP0:  # naming the plain dump, which holds in any stored form
            if _write((json.dumps(plain_step0_record(path), indent=1) + "\n").encode(), dest / rel):
                copied.append(rel)
            continue
        if path.stat().st_size > max_bytes:
            left_out.append((rel, f"over {max_bytes / 2**20:g} MB"))
            continue
        target = dest / rel
        if (
            target.exists()
            and target.stat().st_size == path.stat().st_size
            and target.read_bytes() == path.read_bytes()
        ):
            continue
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(path, target)
        copied.append(rel)
    return copied, left_out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("src", type=Path, help="the --out folder of capo-verl compare")
    p.add_argument("dest", type=Path, help="where in the repository")
    p.add_argument("--max-mb", type=float, default=8.0, help="leave out files larger than this (default 8 MB)")
    p.add_argument(
        "--compress-dumps",
        "--gzip-dumps",  # its former name, in the commands that earlier studies record
        action="store_true",
        help="store the JSON-lines dumps as <name>.jsonl.xz",
    )
    p.add_argument("--skip", action="append", default=[], metavar="PATTERN", help="leave out paths matching it")
    args = p.parse_args()
    copied, left_out = collect(
        args.src.expanduser(),
        args.dest,
        max_bytes=int(args.max_mb * 2**20),
        compress_dumps=args.compress_dumps,
        skip=tuple(args.skip),
    )
    for rel in copied:
        print(f"copied {rel}")
    for rel, why in left_out:
        print(f"left out ({why}): {rel}")
    print(f"{len(copied)} file(s) copied into {args.dest}")


if __name__ == "__main__":
    main()
