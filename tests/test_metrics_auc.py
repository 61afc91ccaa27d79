"""per_group_auc / auc_mean against scikit-learn and hand cases."""

import numpy as np
import pytest
from sklearn.metrics import roc_auc_score

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
