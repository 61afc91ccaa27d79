"""Store a study's raw dumps compressed, as they are committed: every ``*.jsonl`` under the folders given
but compare's ``attempts.jsonl`` becomes
``*.jsonl.gz`` (gzip level 9, mtime 0: the same file always gives the same bytes), and a method's copy of its
seed's shared step-0 pass (``val_generations/0.jsonl[.gz]`` beside ``0.shared.json``) is removed where the pass it
names is kept and holds the recorded SHA-256. Every reader takes both forms (:mod:`capo_verl.stored`,
:func:`capo_verl.compare.report.validation_dump`), so summaries, figures and numbers read the same.

    .venv/bin/python benchmarks/compress_results.py benchmarks/results            # in place
    .venv/bin/python benchmarks/compress_results.py --dry-run benchmarks/results  # what it would do
"""

from __future__ import annotations

import argparse
import hashlib
import json
from pathlib import Path

from capo_verl.compare.report import SHARED_STEP0
from capo_verl.stored import compress, read_bytes, stored

#: compare's own records of a unit's starts (a few lines; read and appended to as they are), not raw dumps
KEPT_PLAIN = {"attempts.jsonl"}


def shared_copies(root: Path) -> list[Path]:
    """Every method's own copy of its seed's shared step-0 pass under ``root`` that the pass it names makes
    redundant: the named file is there and both hold the bytes whose SHA-256 the marker records."""
    redundant = []
    for marker in sorted(root.rglob(SHARED_STEP0)):
        copy = stored(marker.parent / "0.jsonl")
        record = json.loads(marker.read_text())
        source = stored(marker.parent.parent.parent / record["from"].removesuffix(".gz"))
        if not copy.exists() or not source.exists() or copy == source:
            continue
        plain = hashlib.sha256(read_bytes(source)).hexdigest()
        recorded = record["sha256"] in (plain, hashlib.sha256(source.read_bytes()).hexdigest())
        if recorded and hashlib.sha256(read_bytes(copy)).hexdigest() == plain:
            redundant.append(copy)
    return redundant


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("folders", type=Path, nargs="+", help="folders whose dumps to store compressed")
    p.add_argument("--dry-run", action="store_true", help="print what would change, change nothing")
    args = p.parse_args(argv)
    before = after = 0
    for root in args.folders:
        for copy in shared_copies(root):
            before += copy.stat().st_size
            print(f"remove (the seed's step-0 pass, kept once): {copy}")
            if not args.dry_run:
                copy.unlink()
        for path in sorted(p for p in root.rglob("*.jsonl") if p.name not in KEPT_PLAIN):
            size = path.stat().st_size
            before += size
            print(f"compress: {path}")
            if not args.dry_run:
                after += compress(path).stat().st_size
    print(f"{before / 2**20:.1f} MiB of files " + ("would change" if args.dry_run else f"now {after / 2**20:.1f} MiB"))


if __name__ == "__main__":
    main()
