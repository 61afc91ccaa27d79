"""benchmarks/step0_check.py: two step-0 passes compared, on hand-written dumps (plain and gzip) with the values
computed by hand, and on the main run's committed seed-3 passes against a count made independently."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
ATTEMPT1 = REPO / "benchmarks" / "results" / "compare_main_cpu" / "units" / "failed" / "seed3_grpo_attempt1"


@pytest.fixture(scope="module")
def sc(load_benchmark):
    return load_benchmark("step0_check")


def _dump(run: Path, rows: list[tuple], gz: bool = False) -> None:
    lines = "".join(
        json.dumps({"input": q, "output": o, "score": float(c), "acc": c, "lpm": lpm, "uid": str(i)}) + "\n"
        for i, (q, o, c, lpm) in enumerate(rows)
    )
    folder = run / "val_generations"
    folder.mkdir(parents=True)
    if gz:
        (folder / "0.jsonl.gz").write_bytes(gzip.compress(lines.encode(), mtime=0))
    else:
        (folder / "0.jsonl").write_text(lines)


def test_shares_lpm_difference_and_each_pass_by_hand(sc, tmp_path):
    # q1 the same in both passes but for one lpm (2e-6 nats); q2's correct response differs in text and rank
    a = [("q1", "x", 1, -1.0), ("q1", "y", 0, -2.0), ("q2", "z", 0, -1.5), ("q2", "w", 1, -1.0)]
    b = [("q2", "z", 0, -1.5), ("q2", "v", 1, -1.6), ("q1", "y", 0, -2.0), ("q1", "x", 1, -1.0 + 2e-6)]
    _dump(tmp_path / "a", a)
    _dump(tmp_path / "b", b, gz=True)
    r = sc.compare(tmp_path / "a", tmp_path / "b")
    assert r["identical_a_in_b"] == r["identical_b_in_a"] == 0.75  # x, y, z of 4
    assert r["lpm_max_abs_diff"] == pytest.approx(2e-6, abs=1e-12)  # over x, y, z; w and v are not matched
    assert r["a"] == {"n_samples": 4, "accuracy": 0.5, "auc_mean": 1.0, "n_mixed": 2}  # correct above wrong in both
    assert r["b"] == {"n_samples": 4, "accuracy": 0.5, "auc_mean": 0.5, "n_mixed": 2}  # q2: v (-1.6) below z (-1.5)


def test_other_questions_and_a_missing_pass_are_refused(sc, tmp_path):
    _dump(tmp_path / "a", [("q1", "x", 1, -1.0), ("q1", "y", 0, -2.0)])
    _dump(tmp_path / "b", [("q9", "x", 1, -1.0), ("q9", "y", 0, -2.0)])
    with pytest.raises(ValueError, match="validated other questions"):
        sc.compare(tmp_path / "a", tmp_path / "b")
    with pytest.raises(
        FileNotFoundError, match=r"\bmissing\b.*\bstep-0\b.*--step0-only\b.*\btrainer\.val_before_train=true\b"
    ):
        sc.compare(tmp_path / "a", tmp_path / "missing")
    with pytest.raises(SystemExit) as exc:
        sc.main([str(tmp_path / "a"), str(tmp_path / "missing")])
    assert exc.value.code == 2


def test_the_committed_seed3_passes_against_an_independent_count(sc):
    """The main run's seed-3 check (its plan's item 2): the pass made apart (``seed3/step0``) against the one GRPO seed
    3's first start made inside training. The script's shares, lpm difference, accuracy and AUC-mean equal a count
    made here from the raw dumps, with scikit-learn's ROC-AUC per question."""
    from collections import Counter

    import numpy as np
    from sklearn.metrics import roc_auc_score

    from capo_verl.stored import read_text

    step0 = ATTEMPT1.parents[1] / "seed3" / "step0"
    r = sc.compare(step0, ATTEMPT1)
    rows = {
        name: [json.loads(line) for line in read_text(run / "val_generations" / "0.jsonl").split("\n") if line]
        for name, run in (("a", step0), ("b", ATTEMPT1))
    }
    texts = {name: Counter((row["input"], row["output"]) for row in rs) for name, rs in rows.items()}
    shared = sum((texts["a"] & texts["b"]).values())
    assert r["identical_a_in_b"] == pytest.approx(shared / len(rows["a"]))
    assert r["identical_b_in_a"] == pytest.approx(shared / len(rows["b"]))
    assert r["identical_a_in_b"] == 1.0  # the plan's condition for sharing the pass held
    assert 0.0 <= r["lpm_max_abs_diff"] < 1e-4  # the same responses, lpm equal to float32 rounding of the layout
    for name, rs in rows.items():
        groups: dict[str, list] = {}
        for row in rs:
            groups.setdefault(row["input"], []).append((bool(row["acc"]), float(row["lpm"])))
        aucs = [
            roc_auc_score([c for c, _ in g], [x for _, x in g])
            for g in groups.values()
            if 0 < sum(c for c, _ in g) < len(g)
        ]
        assert r[name]["n_samples"] == len(rs) == 580 * 16
        assert r[name]["accuracy"] == pytest.approx(np.mean([row["acc"] for row in rs]))
        assert r[name]["n_mixed"] == len(aucs)
        assert r[name]["auc_mean"] == pytest.approx(np.mean(aucs), abs=1e-12)
