"""Store a study's raw dumps compressed, as they are committed: every ``*.jsonl`` under the folders given but
compare's ``attempts.jsonl``, and every ``*.jsonl.gz`` of an earlier study, becomes ``*.jsonl.xz``
(:func:`capo_verl.stored.xz_bytes`: the same file always gives the same bytes), and a method's copy of its seed's
shared step-0 pass (``val_generations/0.jsonl[.xz|.gz]`` beside ``0.shared.json``) is removed where the pass it names
is kept and holds the recorded SHA-256. A ``0.shared.json`` that names its pass by a compressed file's name and
records that file's SHA-256 (a run that took a committed pass) is rewritten to name the plain dump and record the
SHA-256 of its decompressed bytes, after checking the old record, so that it still holds once the file is stored
anew. Two forms of one dump (``x.jsonl`` beside ``x.jsonl.gz`` or ``x.jsonl.xz``) are stored as one where they hold
the same data and refused, before anything changes, where they do not. Every reader takes every form
(:mod:`capo_verl.stored`, :func:`capo_verl.compare.report.validation_dump`), so summaries, figures and numbers read
the same.

    .venv/bin/python benchmarks/compress_results.py benchmarks/results            # in place
    .venv/bin/python benchmarks/compress_results.py --dry-run benchmarks/results  # what it would do
"""

from __future__ import annotations

import argparse
import hashlib
import json
from pathlib import Path

from capo_verl.compare.report import SHARED_STEP0, plain_step0_record
from capo_verl.stored import GZ, XZ, compress, plain_name, read_bytes, stored

#: compare's own records of a unit's starts (a few lines; read and appended to as they are), not raw dumps
KEPT_PLAIN = {"attempts.jsonl"}


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def shared_copies(root: Path) -> list[Path]:
    """Every method's own copy of its seed's shared step-0 pass under ``root`` that the pass it names makes
    redundant: the named file is there and both hold the bytes whose SHA-256 the marker records."""
    redundant = []
    for marker in sorted(root.rglob(SHARED_STEP0)):
        copy = stored(marker.parent / "0.jsonl")
        record = json.loads(marker.read_text())
        source = stored(plain_name(marker.parent.parent.parent / record["from"]))
        if not copy.exists() or not source.exists() or copy == source:
            continue
        plain = _sha256(read_bytes(source))
        recorded = record["sha256"] in (plain, _sha256(source.read_bytes()))
        if recorded and _sha256(read_bytes(copy)) == plain:
            redundant.append(copy)
    return redundant


def markers_by_file(root: Path) -> list[tuple[Path, dict]]:
    """``(marker, new record)`` for every :data:`SHARED_STEP0` under ``root`` that names a compressed file and
    records that file's own SHA-256: the new record names the plain dump and the SHA-256 of its decompressed bytes
    (:func:`capo_verl.compare.report.plain_step0_record`).

    Raises:
        ValueError: such a marker's file is missing or differs from the recorded SHA-256 (nothing is changed).
    """
    found = []
    for marker in sorted(root.rglob(SHARED_STEP0)):
        record = plain_step0_record(marker)
        if record != json.loads(marker.read_text()):
            found.append((marker, record))
    return found


def dumps(root: Path) -> dict[Path, list[Path]]:
    """Every raw dump under ``root`` to store anew, by its plain name: the forms it is there in (plain, ``.gz``, and
    ``.xz`` beside one of them), for each name with a plain or ``.gz`` form (:data:`KEPT_PLAIN` left out).

    Raises:
        ValueError: two forms of one name hold different data (nothing is changed: keep the right one by hand).
    """
    found: dict[Path, list[Path]] = {}
    for path in [*root.rglob("*.jsonl"), *root.rglob("*.jsonl" + GZ)]:
        if plain_name(path).name not in KEPT_PLAIN:
            found.setdefault(plain_name(path), []).append(path)
    for plain, forms in found.items():
        forms += [p for p in (plain.with_name(plain.name + XZ),) if p.exists()]
        if len(forms) > 1 and len({_sha256(read_bytes(p)) for p in forms}) > 1:  # one form: nothing to compare
            raise ValueError(
                f"{', '.join(map(str, forms))}: forms of one dump that hold different data; left as they are"
            )
    return dict(sorted(found.items()))


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("folders", type=Path, nargs="+", help="folders whose dumps to store compressed")
    p.add_argument("--dry-run", action="store_true", help="print what would change, change nothing")
    args = p.parse_args(argv)
    before = after = 0
    # a marker that does not hold, or two forms of a dump that differ: nothing changes
    markers = {root: markers_by_file(root) for root in args.folders}
    stores = {root: dumps(root) for root in args.folders}
    for root in args.folders:
        for copy in shared_copies(root):
            before += copy.stat().st_size
            print(f"remove (the seed's step-0 pass, kept once): {copy}")
            if not args.dry_run:
                copy.unlink()
        for marker, record in markers[root]:  # before the files they name are stored anew
            print(f"name the plain dump: {marker}")
            if not args.dry_run:
                marker.write_text(json.dumps(record, indent=1) + "\n")
        for plain, forms in stores[root].items():
            # the .xz form stays; a step-0 copy removed above is gone (in a dry run, still listed)
            packed = [p for p in forms if p.suffix != XZ and p.exists()]
            for path in packed:
                before += path.stat().st_size
                print(f"compress: {path}")
                if not args.dry_run:
                    compress(path)
            if packed and not args.dry_run:
                after += plain.with_name(plain.name + XZ).stat().st_size
    print(f"{before / 2**20:.1f} MiB of files " + ("would change" if args.dry_run else f"now {after / 2**20:.1f} MiB"))


if __name__ == "__main__":
    main()
