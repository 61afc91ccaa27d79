"""benchmarks/step0_check.py: two step-0 passes compared, on hand-written dumps (plain and gzip) with the values
computed by hand, and on the committed pass of GRPO seed 3's first start against itself."""

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
    with pytest.raises(FileNotFoundError, match=r"no step-0 validation pass.*--step0-only.*val_before_train=true"):
        sc.compare(tmp_path / "a", tmp_path / "missing")
    with pytest.raises(SystemExit) as exc:
        sc.main([str(tmp_path / "a"), str(tmp_path / "missing")])
    assert exc.value.code == 2


def test_the_committed_first_start_pass_against_itself(sc, capsys):
    """The main run's seed-3 pass made inside training (580 questions x 16): identical to itself, its accuracy the
    dump's share of correct responses."""
    assert sc.main([str(ATTEMPT1), str(ATTEMPT1)]) == 0
    r = json.loads(capsys.readouterr().out)
    assert r["identical_a_in_b"] == 1.0 and r["lpm_max_abs_diff"] == 0.0
    assert r["a"]["n_samples"] == 580 * 16
    rows = [json.loads(line) for line in gzip.open(ATTEMPT1 / "val_generations" / "0.jsonl.gz", "rt")]
    assert r["a"]["accuracy"] == pytest.approx(sum(row["acc"] for row in rows) / len(rows))  # 16 per question
