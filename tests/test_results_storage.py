"""The committed results as stored: the tracked tree stays small enough to travel to a GPU machine, the raw dumps
are kept compressed, and every study's ``seeds_summary.json`` is what today's code computes from those compressed
files."""

from __future__ import annotations

import json
import math
import shutil
import subprocess
from pathlib import Path

import pytest

from capo_verl.compare.seeds import write_seeds_summary
from capo_verl.compare.verdict import load_plan

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "benchmarks" / "results"
#: the tracked tree travels to a lent GPU machine with the verl kit's wheels (about 15 MB) in one transfer of at
#: most 64 MiB
MAX_TRACKED_MIB = 40
#: study folder -> its plan file (None: a study without one)
STUDIES = {
    "compare_main_cpu/units": "compare_main_cpu/plan.yaml",
    "compare_nomask_cpu/units": "compare_nomask_cpu/plan.yaml",
    "compare_nomask_cpu/mask_reading": None,
    "compare_nomask_cpu/main_reading": "compare_main_cpu/plan.yaml",
    "compare_pilot2_cpu/pilot": "compare_pilot2_cpu/plan.yaml",
    "compare_decisive_cpu/pilot": None,
}
#: study folder -> what it reads from other studies' committed files, as ``(study, top-level names, per-seed
#: names)``: the no-mask run pairs with the main run's GRPO units, step-0 passes and teacher-forced pool, committed
#: once, in the main run's folder; its mask reading sets its no-mask units against the main run's CAPO units, and
#: its main reading is the main run's CAPO against GRPO over the no-mask run's seeds
#: (benchmarks/results/compare_nomask_cpu/readings.sh)
SHARES = {
    "compare_nomask_cpu/units": [("compare_main_cpu/units", ("teacher_forced",), ("step0", "grpo"))],
    "compare_nomask_cpu/mask_reading": [
        ("compare_main_cpu/units", ("teacher_forced",), ("step0", "capo")),
        ("compare_nomask_cpu/units", (), ("capo_no_mask",)),
    ],
    "compare_nomask_cpu/main_reading": [("compare_main_cpu/units", ("teacher_forced",), ("step0", "grpo", "capo"))],
}


def _tracked() -> list[tuple[int, str]]:
    """``(bytes, path)`` of every tracked file that exists in the work tree, largest first."""
    names = subprocess.run(
        ["git", "ls-files", "-z"], cwd=REPO, capture_output=True, check=True, text=True
    ).stdout.split("\0")
    sizes = [((REPO / n).stat().st_size, n) for n in names if n and (REPO / n).is_file()]
    return sorted(sizes, reverse=True)


def test_tracked_tree_fits_a_gpu_transfer():
    sizes = _tracked()
    total = sum(s for s, _ in sizes)
    largest = ", ".join(f"{n} ({s / 2**20:.2f} MiB)" for s, n in sizes[:8])
    assert total <= MAX_TRACKED_MIB * 2**20, (
        f"the tracked files total {total / 2**20:.1f} MiB, over {MAX_TRACKED_MIB} MiB: a lent GPU machine could not "
        f"receive the tree with the verl kit. Largest: {largest}. Store raw dumps compressed "
        "(benchmarks/compress_results.py) or leave them out of the repository"
    )


def test_raw_dumps_are_stored_compressed():
    """Every raw dump under benchmarks/results is stored as ``.jsonl.xz`` (not plain, not the larger gzip form)."""
    loose = [
        n
        for _, n in _tracked()
        if n.startswith("benchmarks/results/")
        and n.endswith((".jsonl", ".jsonl.gz"))
        and Path(n).name != "attempts.jsonl"
    ]  # compare's own records of a unit's starts stay plain (benchmarks/compress_results.py, KEPT_PLAIN)
    assert not loose, (
        f"JSON-lines dumps under benchmarks/results not stored as .jsonl.xz: {loose[:5]}; "
        "run benchmarks/compress_results.py"
    )


def _leaves(a, b, path=""):
    """``(path, committed, regenerated)`` of every leaf present in both records that differs (NaN equals NaN)."""
    if isinstance(a, dict) and isinstance(b, dict):
        for key in a.keys() & b.keys():
            yield from _leaves(a[key], b[key], f"{path}.{key}")
    elif isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            yield from _leaves(x, y, f"{path}[{i}]")
    elif not (a == b or (isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b))):
        yield path, a, b


@pytest.mark.parametrize("study", sorted(STUDIES))
def test_seeds_summary_regenerates_from_the_compressed_files(study, tmp_path):
    """``capo-verl compare --plot-only``'s summary, recomputed from the committed (compressed, step-0 passes kept
    once) files, holds the committed summary's numbers: every value both have is equal. (A summary written by an
    earlier release may lack keys today's code adds; those are not compared. The main run's has every key.)"""
    committed = json.loads((RESULTS / study / "seeds_summary.json").read_text())
    out = tmp_path / "out"
    shutil.copytree(RESULTS / study, out)
    for source, top, per_seed in SHARES.get(study, []):
        for name in top:
            shutil.copytree(RESULTS / source / name, out / name)
        for k in committed["seeds"]:
            for name in per_seed:
                shutil.copytree(RESULTS / source / f"seed{k}" / name, out / f"seed{k}" / name)
    plan = STUDIES[study]
    write_seeds_summary(
        out,
        committed["methods"],
        committed["seeds"],
        plan=load_plan(RESULTS / plan) if plan else None,
        n_boot=committed["n_boot"],
    )
    regenerated = json.loads((out / "seeds_summary.json").read_text())
    differ = list(_leaves(committed, regenerated))
    assert not differ, f"{study}: {len(differ)} values differ, e.g. {differ[:3]}"
    if study.startswith(("compare_main_cpu/", "compare_nomask_cpu/")):
        assert json.dumps(regenerated, sort_keys=True) == json.dumps(committed, sort_keys=True)
