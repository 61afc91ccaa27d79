"""Evaluation metrics of capo_verl.evaluation.metrics: hand-computed cases, scikit-learn, brute force."""

import itertools
import math
import re

import numpy as np
import pytest
from sklearn.metrics import roc_auc_score

from capo_verl.evaluation import metrics as M

# ------------------------------------------------------------------------------------------- mean@k, AUC


def test_mean_at_k_hand_computed_ragged():
    # q0: 1/4 correct, q1: 2/2, q2: 0/3 -> (0.25 + 1 + 0) / 3, not the pooled 3/9
    correct = [1, 0, 0, 0, 1, 1, 0, 0, 0]
    group = ["a", "a", "a", "a", "b", "b", "c", "c", "c"]
    value, nq = M.mean_at_k(correct, group)
    assert nq == 3
    assert value == pytest.approx((0.25 + 1 + 0) / 3, abs=1e-15)


def test_mean_at_k_empty_and_errors():
    value, nq = M.mean_at_k([], [])
    assert nq == 0 and math.isnan(value)
    with pytest.raises(ValueError, match="correct \\(2\\), group \\(3\\)"):
        M.mean_at_k([1, 0], [0, 0, 1])


def test_auc_mean_matches_sklearn_on_random_groups_with_ties():
    rng = np.random.default_rng(0)
    n_groups, k = 200, 16
    group = np.repeat(np.arange(n_groups), k)
    # lpm rounded to 1 decimal: many ties inside a group, which sklearn counts 1/2 as well
    lpm = np.round(rng.normal(-0.8, 0.4, n_groups * k), 1)
    p = rng.uniform(0, 1, n_groups)[group]
    correct = rng.uniform(size=n_groups * k) < p
    value, n_mixed = M.auc_mean(lpm, correct, group)
    ref = [
        roc_auc_score(correct[group == g], lpm[group == g])
        for g in range(n_groups)
        if 0 < correct[group == g].sum() < k
    ]
    assert n_mixed == len(ref) > 50
    assert value == pytest.approx(float(np.mean(ref)), abs=1e-12)


def test_auc_hand_computed():
    # q: correct lpm {-0.1, -0.5}, incorrect {-0.3, -0.5}: pairs (>, >), (<, =) -> (1 + 1 + 0 + 0.5) / 4
    value, n_mixed = M.auc_mean([-0.1, -0.5, -0.3, -0.5, -1.0], [1, 1, 0, 0, 1], [0, 0, 0, 0, 1])
    assert n_mixed == 1 and value == pytest.approx(0.625)


# ------------------------------------------------------------------------------------------- pass@k


def test_pass_at_k_hand_computed():
    # n = 4, c = 1, k = 2: 1 - C(3, 2) / C(4, 2) = 1 - 3/6
    assert M.pass_at_k([1, 0, 0, 0], [0, 0, 0, 0], 2) == (0.5, 1)
    # n = 5, c = 2, k = 2: 1 - C(3, 2) / C(5, 2) = 1 - 3/10; k = 3: 1 - C(3, 3) / C(5, 3) = 1 - 1/10
    assert M.pass_at_k([0, 1, 0, 1, 0], ["q"] * 5, 2)[0] == pytest.approx(0.7, abs=1e-15)
    assert M.pass_at_k([0, 1, 0, 1, 0], ["q"] * 5, 3)[0] == pytest.approx(0.9, abs=1e-15)
    # n - c < k: every k-subset holds a correct response -> exactly 1; c = 0 -> exactly 0; c = n -> exactly 1
    assert M.pass_at_k([0, 1, 1, 1, 0], ["q"] * 5, 3)[0] == 1.0
    assert M.pass_at_k([0, 0, 0], ["q"] * 3, 3)[0] == 0.0 and M.pass_at_k([0, 0, 0], ["q"] * 3, 1)[0] == 0.0
    assert M.pass_at_k([1, 1, 1], ["q"] * 3, 1)[0] == 1.0 and M.pass_at_k([1, 1, 1], ["q"] * 3, 3)[0] == 1.0
    # k = n: 1 unless every response is wrong
    assert M.pass_at_k([0, 0, 0, 1], ["q"] * 4, 4)[0] == 1.0


def test_per_group_pass_at_k_ragged_and_averaged_per_question():
    correct = [1, 0, 0, 0, 1, 1, 0, 0, 0]  # a: 1 of 4, b: 2 of 2, c: 0 of 3
    group = ["a", "a", "a", "a", "b", "b", "c", "c", "c"]
    values, keys = M.per_group_pass_at_k(correct, group, 2)
    assert keys.tolist() == ["a", "b", "c"] and values.tolist() == [0.5, 1.0, 0.0]
    assert M.pass_at_k(correct, group, 2) == (0.5, 3)  # (0.5 + 1 + 0) / 3: each question weighs the same
    curve, nq = M.pass_at_k_curve(correct, group)  # K = 2, the smallest group
    assert nq == 3 and curve.tolist() == pytest.approx([(0.25 + 1 + 0) / 3, 0.5], abs=1e-15)


def test_pass_at_1_is_mean_at_k_and_the_curve_is_non_decreasing():
    rng = np.random.default_rng(3)
    n_q, k = 300, 16
    group = np.repeat(np.arange(n_q), k)
    correct = rng.uniform(size=n_q * k) < rng.uniform(size=n_q)[group]
    curve, nq = M.pass_at_k_curve(correct, group)
    assert nq == n_q and curve.shape == (k,)
    assert curve[0] == pytest.approx(M.mean_at_k(correct, group)[0], abs=1e-14)
    assert M.pass_at_k(correct, group, 1)[0] == pytest.approx(M.mean_at_k(correct, group)[0], abs=1e-14)
    assert (np.diff(curve) >= 0).all()
    # k = n: the fraction of questions with a correct response
    assert curve[-1] == pytest.approx(np.mean([correct[group == q].any() for q in range(n_q)]), abs=1e-15)
    assert M.pass_at_k_curve(correct, group, max_k=4)[0].tolist() == curve[:4].tolist()


def test_pass_at_k_matches_enumeration_over_all_k_subsets():
    rng = np.random.default_rng(0)
    for _ in range(60):
        n_q = int(rng.integers(1, 5))
        sizes = rng.integers(1, 9, n_q)
        group = np.repeat(np.arange(n_q), sizes)
        correct = rng.uniform(size=len(group)) < rng.uniform()
        for k in range(1, int(sizes.min()) + 1):
            per_q = []
            for q in range(n_q):
                c = correct[group == q]
                subsets = list(itertools.combinations(range(len(c)), k))
                per_q.append(sum(c[list(s)].any() for s in subsets) / len(subsets))
            values, _ = M.per_group_pass_at_k(correct, group, k)
            assert values == pytest.approx(per_q, abs=1e-13)
            assert M.pass_at_k(correct, group, k)[0] == pytest.approx(np.mean(per_q), abs=1e-13)


def test_pass_at_k_large_n_stays_accurate():
    # n = 1000, c = 3, k = 500: 1 - C(997, 500) / C(1000, 500) = 1 - (500 * 499 * 498) / (1000 * 999 * 998), in
    # exact integer arithmetic; C(1000, 500) alone overflows float64
    exact = 1 - (500 * 499 * 498) / (1000 * 999 * 998)
    correct = np.zeros(1000, dtype=bool)
    correct[[5, 500, 999]] = True
    assert M.pass_at_k(correct, np.zeros(1000), 500)[0] == pytest.approx(exact, rel=1e-14)


def test_pass_at_k_errors_and_empty():
    with pytest.raises(ValueError, match=r"\bk = 3\b.*\bn = 2\b.*\(question 'b'\)"):
        M.pass_at_k([1, 0, 0, 1, 1], ["a", "a", "a", "b", "b"], 3)
    with pytest.raises(ValueError, match=r"\bmax_k = 5\b.*\bn = 4\b"):
        M.pass_at_k_curve([1, 0, 0, 1], [7] * 4, max_k=5)
    for bad in (0, -1, 1.5, True, "2"):
        with pytest.raises(ValueError, match=rf"\bk\b.*>= 1\b.*{re.escape(repr(bad))}$"):
            M.pass_at_k([1, 0], [0, 0], bad)
    assert M.pass_at_k([1, 0, 0, 0], [0] * 4, np.int64(2)) == (0.5, 1)
    with pytest.raises(ValueError, match="correct \\(2\\), group \\(3\\)"):
        M.pass_at_k([1, 0], [0, 0, 1], 1)
    value, nq = M.pass_at_k([], [], 3)
    assert nq == 0 and math.isnan(value)
    assert M.pass_at_k_curve([], [])[0].shape == (0,)
    curve, nq = M.pass_at_k_curve([], [], max_k=2)
    assert nq == 0 and curve.shape == (2,) and np.isnan(curve).all()


# ------------------------------------------------------------------------------------------- ITS voting


def credit(group, answer, lpm, correct, method):
    c, keys = M.its_credit(group, answer, lpm, correct, method)
    return dict(zip(keys.tolist(), c.tolist()))


def test_ppl_consistency_aggregates_probability_not_count():
    # "7" is said twice with low confidence, "9" once with high: C(7) = 2 e^-2 = 0.27 < C(9) = e^-0.1 = 0.90
    args = ([0, 0, 0], ["7", "7", "9"], [-2.0, -2.0, -0.1], [0, 0, 1])
    assert credit(*args, "ppl_consistency") == {0: 1.0}
    assert credit(*args, "majority_vote") == {0: 0.0}
    assert credit(*args, "max_lpm") == {0: 1.0}
    # ... but three fairly confident "7"s outweigh one very confident "9": 3 e^-0.5 = 1.82 > e^0 = 1
    args = ([0] * 4, ["7", "7", "7", "9"], [-0.5, -0.5, -0.5, 0.0], [0, 0, 0, 1])
    assert credit(*args, "ppl_consistency") == {0: 0.0}
    assert credit(*args, "max_lpm") == {0: 1.0}


def test_its_ties_split_credit():
    # two answers with exactly equal C: 1/2 credit when one of them is correct
    args = ([0] * 4, ["3", "3", "4", "4"], [-0.2, -0.7, -0.7, -0.2], [1, 1, 0, 0])
    assert credit(*args, "ppl_consistency") == {0: 0.5}
    assert credit(*args, "majority_vote") == {0: 0.5}
    assert credit(*args, "max_lpm") == {0: 0.5}  # lpm -0.2 twice: one correct, one not
    # three-way tie in counts, one correct -> 1/3
    args = ([0] * 3, ["a", "b", "c"], [-1.0, -0.5, -0.1], [0, 1, 0])
    assert credit(*args, "majority_vote") == {0: pytest.approx(1 / 3)}
    assert credit(*args, "ppl_consistency") == {0: 0.0}  # "c" has the largest exp(lpm)


def test_its_empty_answers_do_not_vote():
    # the two most confident responses have no answer: they are not candidates
    args = ([0] * 4, ["", None, "5", "6"], [-0.01, -0.01, -0.3, -0.9], [0, 0, 1, 0])
    for method in M.ITS_METHODS:
        assert credit(*args, method) == {0: pytest.approx(1.0 if method != "majority_vote" else 0.5)}
    # a question where nobody answered still counts, with credit 0
    c = credit([0, 0, 1], ["", "  ", "2"], [-0.1, -0.2, -0.3], [0, 0, 1], "ppl_consistency")
    assert c == {0: 0.0, 1: 1.0}
    assert M.its_accuracy([0, 0, 1], ["", "  ", "2"], [-0.1, -0.2, -0.3], [0, 0, 1]) == 0.5


def test_its_one_response_and_whitespace():
    for method in M.ITS_METHODS:
        assert credit(["q"], ["42"], [-3.0], [True], method) == {"q": 1.0}
        assert credit(["q"], ["42"], [-3.0], [False], method) == {"q": 0.0}
    # answers are compared after stripping whitespace
    assert credit([0, 0, 0], [" 1", "1 ", "2"], [-1.0, -1.0, -0.6], [1, 1, 0], "ppl_consistency") == {0: 1.0}


def test_its_no_underflow_for_very_negative_lpm():
    # exp(-800) underflows to 0 in float64; the shifted sum keeps the right winner
    args = ([0] * 3, ["a", "a", "b"], [-800.0, -800.0, -800.5], [1, 1, 0])
    assert credit(*args, "ppl_consistency") == {0: 1.0}


def test_its_matches_loop_reference_on_random_data():
    rng = np.random.default_rng(1)
    n_q, k = 60, 8
    group = np.repeat(np.arange(n_q), k)
    answer = rng.choice(["", "1", "2", "3"], size=n_q * k, p=[0.2, 0.4, 0.3, 0.1])
    lpm = -np.abs(rng.normal(-1, 0.5, n_q * k))  # a mean log-prob is <= 0 (a positive one is refused)
    correct = answer == "1"
    got = credit(group, answer, lpm, correct, "ppl_consistency")
    for q in range(n_q):
        sel = (group == q) & (answer != "")
        scores = {}
        for a, l in zip(answer[sel], lpm[sel]):
            scores[a] = scores.get(a, 0.0) + math.exp(l)
        expected = 0.0 if not scores else float(max(scores, key=scores.get) == "1")
        assert got[q] == expected


def test_its_errors():
    with pytest.raises(ValueError, match="unknown method 'best'"):
        M.its_credit([0], ["1"], [0.0], [1], "best")
    with pytest.raises(ValueError, match="lpm is NaN"):
        M.its_credit([0, 0], ["1", "2"], [np.nan, 0.0], [1, 0])
    with pytest.raises(ValueError, match="answer \\(1\\)"):
        M.its_credit([0, 0], ["1"], [0.0, 0.0], [1, 0])


# ------------------------------------------------------------------------------------------- precision-coverage


def test_precision_coverage_hand_computed():
    # ranked by lpm: 1 (c), 0.5 (w), 0.2 (c), -1 (w)
    cov, prec = M.precision_coverage_curve([0.2, 1.0, -1.0, 0.5], [1, 1, 0, 0])
    np.testing.assert_allclose(cov, [0.25, 0.5, 0.75, 1.0])
    np.testing.assert_allclose(prec, [1.0, 0.5, 2 / 3, 0.5])
    assert M.precision_coverage_area([0.2, 1.0, -1.0, 0.5], [1, 1, 0, 0]) == pytest.approx((1 + 0.5 + 2 / 3 + 0.5) / 4)
    # levels 0.1..1.0 of n = 4 answer ceil(c * 4) responses: 1, 1, 2, 2, 2, 3, 3, 4, 4, 4
    at = M.precision_at_coverage([0.2, 1.0, -1.0, 0.5], [1, 1, 0, 0])
    np.testing.assert_allclose(at, [1, 1, 0.5, 0.5, 0.5, 2 / 3, 2 / 3, 0.5, 0.5, 0.5])


def test_precision_coverage_level_rounding():
    # 0.3 * 10 = 3.0000000000000004 in floating point must answer 3, not 4
    at = M.precision_at_coverage(np.arange(10.0)[::-1], [1, 1, 1, 0, 0, 0, 0, 0, 0, 0], [0.3, 0.4])
    np.testing.assert_allclose(at, [1.0, 0.75])


def test_precision_coverage_ties_are_averaged_over_orderings():
    rng = np.random.default_rng(2)
    scores = np.array([1.0, 1.0, 1.0, 0.5, 0.5, 0.0])
    correct = np.array([1, 0, 0, 1, 1, 0])
    _, prec = M.precision_coverage_curve(scores, correct)
    # brute force: mean over every ordering of the tied blocks
    sums = np.zeros(6)
    perms = 0
    for p1 in itertools.permutations(range(3)):
        for p2 in itertools.permutations(range(3, 5)):
            order = list(p1) + list(p2) + [5]
            sums += np.cumsum(correct[order]) / np.arange(1, 7)
            perms += 1
    np.testing.assert_allclose(prec, sums / perms, atol=1e-12)
    # and it does not depend on the input order
    perm = rng.permutation(6)
    np.testing.assert_allclose(M.precision_coverage_curve(scores[perm], correct[perm])[1], prec, atol=1e-12)


def test_precision_coverage_without_ties_is_sorted_cumulative_accuracy():
    rng = np.random.default_rng(3)
    scores = rng.normal(size=500)
    correct = rng.uniform(size=500) < 1 / (1 + np.exp(-2 * scores))
    _, prec = M.precision_coverage_curve(scores, correct)
    order = np.argsort(-scores)
    np.testing.assert_allclose(prec, np.cumsum(correct[order]) / np.arange(1, 501), atol=1e-12)
    assert prec[-1] == pytest.approx(correct.mean())
    # informative confidence: the area beats the overall accuracy; a constant confidence gives it exactly
    assert M.precision_coverage_area(scores, correct) > correct.mean() + 0.05
    assert M.precision_coverage_area(np.zeros(500), correct) == pytest.approx(correct.mean())


def test_precision_coverage_edge_cases():
    cov, prec = M.precision_coverage_curve([], [])
    assert len(cov) == len(prec) == 0
    assert math.isnan(M.precision_coverage_area([], []))
    assert np.isnan(M.precision_at_coverage([], [], [0.5])).all()
    with pytest.raises(ValueError, match="levels must lie in"):
        M.precision_at_coverage([0.0], [1], [0.0])
    with pytest.raises(ValueError, match="NaN or inf"):
        M.precision_coverage_curve([np.inf], [1])
    with pytest.raises(ValueError, match="scores \\(2\\), correct \\(1\\)"):
        M.precision_coverage_curve([0.0, 1.0], [1])
