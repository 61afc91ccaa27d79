"""benchmarks/power_main.py's vectorised per-question AUC is the package's ``metrics.per_group_auc``."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from capo_verl.metrics import per_group_auc

REPO = Path(__file__).resolve().parents[1]
PILOT2 = REPO / "benchmarks" / "results" / "compare_pilot2_cpu" / "pilot"


@pytest.fixture(scope="module")
def pm(load_benchmark):
    return load_benchmark("power_main")


def _reference(lpm, correct):
    q, k = lpm.shape
    auc, keys = per_group_auc(lpm.reshape(-1), correct.reshape(-1), np.repeat(np.arange(q), k))
    assert (keys == np.arange(q)).all()
    return auc


def test_question_auc_is_per_group_auc_on_pilot2_dumps(pm):
    for seed in range(3):
        for method in pm.METHODS:
            lpm, correct, _ = pm.per_question(PILOT2 / f"seed{seed}" / method / "val_generations" / "30.jsonl")
            got, want = pm.question_auc(lpm, correct), _reference(lpm, correct)
            assert np.isnan(want).sum() > 0 and (~np.isnan(want)).sum() > 100  # both kinds of question occur
            np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
            np.testing.assert_allclose(got[~np.isnan(got)], want[~np.isnan(want)], rtol=0, atol=1e-12)


def test_question_auc_with_ties_and_a_leading_bootstrap_axis(pm):
    rng = np.random.default_rng(0)
    lpm = rng.integers(-3, 0, (4, 6, 8)).astype(np.float64)  # many ties
    correct = rng.random((4, 6, 8)) < 0.5
    got = pm.question_auc(lpm, correct)
    assert got.shape == (4, 6)
    for b in range(4):
        np.testing.assert_allclose(got[b], _reference(lpm[b], correct[b]), rtol=0, atol=1e-12, equal_nan=True)
