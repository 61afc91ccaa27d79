"""per_group_auc / auc_mean against scikit-learn and hand cases."""

import numpy as np
import pytest
from sklearn.metrics import roc_auc_score

from capo_verl.evaluation import metrics as M
from capo_verl.metrics import auc_mean, per_group_auc


def test_matches_sklearn_on_random_ragged_groups_with_ties():
    rng = np.random.default_rng(0)
    n = 2000
    group = rng.integers(0, 150, n).astype(str).astype(object)
    scores = np.round(rng.normal(size=n), 1)  # many ties
    correct = rng.random(n) < 0.4
    auc, keys = per_group_auc(scores, correct, group)
    for k, value in zip(keys, auc):
        sel = group == k
        if correct[sel].all() or (~correct[sel]).all():
            assert np.isnan(value)
        else:
            assert value == pytest.approx(roc_auc_score(correct[sel], scores[sel]), abs=1e-12)
    mean, n_mixed = auc_mean(scores, correct, group)
    assert n_mixed == int((~np.isnan(auc)).sum())
    assert mean == pytest.approx(np.nanmean(auc))


def test_auc_mean_does_not_depend_on_the_group_ids():
    # verl's uids are random uuids: relabelling the questions reorders the per-question AUCs,
    # and a plain float mean of them then differs in the last bit (as it does for this draw).
    rng = np.random.default_rng(0)
    group = np.repeat(np.arange(40), 4)
    scores, correct = rng.normal(size=160), rng.random(160) < 0.5
    relabelled = rng.permutation(40)[group]
    aucs = [per_group_auc(scores, correct, g)[0] for g in (group, relabelled)]
    plain = [a[~np.isnan(a)].mean() for a in aucs]
    assert plain[0] != plain[1]  # the draw shows the order effect
    assert auc_mean(scores, correct, group) == auc_mean(scores, correct, relabelled)


def test_hand_cases():
    # perfect ranking, reversed ranking, all tied
    auc, _ = per_group_auc([3, 2, 1, 0, 1, 0, 5, 5], [1, 1, 0, 0, 0, 1, 1, 0], [0, 0, 0, 0, 1, 1, 2, 2])
    np.testing.assert_allclose(auc, [1.0, 0.0, 0.5])
    assert np.isnan(auc_mean([1.0, 2.0], [1, 1], ["a", "a"])[0])


def test_rejects_bad_input():
    with pytest.raises(ValueError, match="same length"):
        per_group_auc([1.0], [1, 0], [0, 0])
    with pytest.raises(ValueError, match="NaN"):
        per_group_auc([np.nan, 1.0], [1, 0], [0, 0])


# --- values that cannot be right are refused, naming the argument (hostile round 4, L23-L30) -----------------------
def _calls(scores, correct, lpm=None):
    """Every metric of ``correct`` (and ``scores``) on four responses to two questions."""
    group = [0, 0, 1, 1]
    lpm = scores if lpm is None else lpm
    return {
        "auc_mean": lambda: M.auc_mean(scores, correct, group),
        "per_group_auc": lambda: per_group_auc(scores, correct, group),
        "mean_at_k": lambda: M.mean_at_k(correct, group),
        "pass_at_k": lambda: M.pass_at_k(correct, group, 1),
        "precision_coverage_curve": lambda: M.precision_coverage_curve(scores, correct),
        "precision_at_coverage": lambda: M.precision_at_coverage(scores, correct),
        "its_accuracy": lambda: M.its_accuracy(group, ["1", "2", "1", "2"], lpm, correct),
    }


GOOD_SCORES = [-1.0, -2.0, -1.0, -2.0]


@pytest.mark.parametrize("metric", list(_calls(GOOD_SCORES, [1, 0, 1, 0])))
@pytest.mark.parametrize(
    "correct",
    [
        ["no", "yes", "no", "yes"],  # strings: bool("no") is True
        [0.3, 0.9, 0.2, 1.0],  # probabilities
        [np.nan, 0, 1, 0],
        [1 + 0j, 0, 1, 0],
        np.array([None, 1, 0, 1], dtype=object),
        [2, 0, 1, 0],
    ],
)
def test_correct_that_is_not_bool_or_0_1_is_refused(metric, correct):
    with pytest.raises(ValueError, match=r": correct must be bool, or 0/1\b"):
        _calls(GOOD_SCORES, correct)[metric]()


@pytest.mark.parametrize("metric", ["auc_mean", "per_group_auc", "precision_coverage_curve", "its_accuracy"])
@pytest.mark.parametrize(
    "scores", [np.array([-1 + 1j, -2, -1, -2]), ["a", "b", "c", "d"], np.array(["-1", "-2", "-1", "-2"])]
)
def test_scores_that_are_not_real_numbers_are_refused(metric, scores):
    name = "lpm" if metric == "its_accuracy" else "scores"
    with pytest.raises(ValueError, match=rf": {name} must hold real numbers\b"):
        _calls(scores, [1, 0, 1, 0])[metric]()


@pytest.mark.parametrize(
    "correct", [[True, False, True, False], [1, 0, 1, 0], [1.0, 0.0, 1.0, 0.0], np.array([1, 0, 1, 0], dtype=object)]
)
def test_bool_and_0_1_correct_of_any_dtype_give_the_same_values(correct):
    want = {k: f() for k, f in _calls(GOOD_SCORES, [True, False, True, False]).items()}
    got = {k: f() for k, f in _calls(GOOD_SCORES, correct).items()}
    assert repr(got) == repr(want)


@pytest.mark.parametrize("levels", [[np.nan], [0.5, np.nan], [0.0], [1.5], [1j]])
def test_precision_at_coverage_refuses_levels_outside_0_1(levels):
    with pytest.raises(ValueError, match=r"precision_at_coverage: levels\b"):
        M.precision_at_coverage([-1.0, -2.0, -3.0], [1, 0, 1], levels=levels)


@pytest.mark.parametrize("method", M.ITS_METHODS)
def test_its_accuracy_refuses_a_positive_lpm_on_a_voting_response(method):
    with pytest.raises(ValueError, match=r"its_credit: lpm is above 0 nats\b.*rows \[0\]"):
        M.its_accuracy([0, 0], ["1", "2"], [5.0, -2.0], [1, 0], method)
    assert M.its_accuracy([0, 0], ["", "2"], [5.0, -2.0], [1, 0], method) == 0.0  # no answer: it does not vote
    M.its_accuracy([0, 0], ["1", "2"], [M.LOG_PROB_TOLERANCE / 2, -2.0], [1, 0], method)  # 0 up to rounding
