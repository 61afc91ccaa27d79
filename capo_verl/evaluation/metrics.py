"""Evaluation metrics of the CAPO paper (section 5): mean@k, pass@k, inference-time scaling by answer voting,
precision-coverage. Used by ``capo-verl eval score`` (:mod:`capo_verl.evaluation.score`) and the study tools; a
training run never loads them. Same conventions as :mod:`capo_verl.metrics` (the per-question AUC, which every
training step logs, and which is re-exported here): vectorised numpy in float64, ragged groups allowed, one entry
per response.
"""

from __future__ import annotations

import numpy as np

from capo_verl.metrics import LOG_PROB_TOLERANCE, _correct_values, _real_values, auc_mean, per_group_auc

__all__ = [
    "auc_mean",
    "per_group_auc",
    "ITS_METHODS",
    "mean_at_k",
    "per_group_pass_at_k",
    "pass_at_k",
    "pass_at_k_curve",
    "its_credit",
    "its_accuracy",
    "precision_coverage_curve",
    "precision_at_coverage",
    "precision_coverage_area",
]

#: Inference-time scaling rules understood by :func:`its_credit`.
ITS_METHODS = ("ppl_consistency", "majority_vote", "max_lpm")


def _check_same_length(fn: str, **arrays) -> int:
    lengths = {name: len(a) for name, a in arrays.items()}
    if len(set(lengths.values())) > 1:
        listed = ", ".join(f"{name} ({n})" for name, n in lengths.items())
        raise ValueError(f"{fn}: {listed} must have the same length (one entry per response)")
    return next(iter(lengths.values()), 0)


def mean_at_k(correct, group) -> tuple[float, int]:
    """mean@k accuracy: the mean over questions of the fraction of a question's responses that are correct.

    Every question weighs the same whatever its number of responses (ragged k is allowed), which is what
    the paper reports as mean@8 / mean@16 (section 5.1, following Yue et al. 2025).

    Args:
        correct: ``(n,)`` bool (or 0/1) correctness per response.
        group: ``(n,)`` question id per response (any hashable numpy can sort: ints, str).

    Returns:
        ``(mean_acc, n_questions)``: float in [0, 1] (NaN when ``n == 0``) and the number of questions.

    Raises:
        ValueError: if ``correct`` and ``group`` differ in length, or a ``correct`` is neither a bool nor 0/1.
    """
    correct = _correct_values("mean_at_k", correct).astype(np.float64)
    group = np.asarray(group).reshape(-1)
    _check_same_length("mean_at_k", correct=correct, group=group)
    if len(correct) == 0:
        return float("nan"), 0
    _, gid = np.unique(group, return_inverse=True)
    per_q = np.bincount(gid, weights=correct) / np.bincount(gid)
    return float(per_q.mean()), int(len(per_q))


def _pass_at_k_of_counts(n: np.ndarray, c: np.ndarray, k: int) -> np.ndarray:
    """Unbiased pass@k of each question from its ``n`` responses and ``c`` correct ones (int arrays, ``k <= n``).

    ``1 - C(n-c, k) / C(n, k) = 1 - prod_{i=n-c+1}^{n} (1 - k/i)``, each factor computed as ``(i - k) / i`` (one
    rounding). Exactly 0 when ``c == 0`` (empty product) and exactly 1 when ``n - c < k`` (every k-subset holds a
    correct response; the product then has the factor ``i = k``, which is 0). The ragged products over questions
    are one ``np.multiply.reduceat`` over the ``sum(c)`` factors: O(sum c) time and memory.
    """
    out = np.zeros(len(n), dtype=np.float64)
    out[n - c < k] = 1.0
    rest = np.flatnonzero((c > 0) & (n - c >= k))
    if rest.size:
        cr, nr = c[rest], n[rest]
        seg_start = np.cumsum(cr) - cr  # where each question's factors start in the flat array
        i = np.arange(int(cr.sum()), dtype=np.int64) - np.repeat(seg_start, cr) + np.repeat(nr - cr + 1, cr)
        factors = (i - k).astype(np.float64) / i
        out[rest] = 1.0 - np.multiply.reduceat(factors, seg_start)
    return out


def _group_counts(fn: str, correct, group) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(n, c, keys)``: responses and correct responses per question (int64), sorted unique question ids."""
    correct = _correct_values(fn, correct)
    group = np.asarray(group).reshape(-1)
    _check_same_length(fn, correct=correct, group=group)
    keys, gid = np.unique(group, return_inverse=True)
    n = np.bincount(gid, minlength=len(keys)).astype(np.int64)
    c = np.bincount(gid[correct], minlength=len(keys)).astype(np.int64)
    return n, c, keys


def _check_k(fn: str, k, n: np.ndarray, keys: np.ndarray, what: str = "k") -> int:
    if isinstance(k, (bool, np.bool_)) or not isinstance(k, (int, np.integer)) or k < 1:
        raise ValueError(f"{fn}: {what} must be an integer >= 1, got {k!r}")
    if len(n) and k > n.min():
        q = int(np.argmin(n))
        key = keys[q].item() if isinstance(keys[q], np.generic) else keys[q]
        raise ValueError(
            f"{fn}: {what} = {int(k)} exceeds the smallest number of responses per question, n = {int(n[q])} "
            f"(question {key!r}); pass@k is defined for k <= n only"
        )
    return int(k)


def per_group_pass_at_k(correct, group, k: int) -> tuple[np.ndarray, np.ndarray]:
    """Unbiased pass@k of each question: the probability that k responses drawn without replacement from its
    n include a correct one, ``1 - C(n-c, k) / C(n, k)`` with c the correct responses among the n.

    Args:
        correct: ``(n,)`` bool (or 0/1) correctness per response.
        group: ``(n,)`` question id per response (any hashable numpy can sort: ints, str); ragged allowed.
        k: integer ``1 <= k <= `` the smallest number of responses of a question.

    Returns:
        ``(pass_k, keys)``: ``(n_questions,)`` float64 in [0, 1] and the sorted unique question ids in the same
        order. 0 for a question without a correct response, 1 when ``n - c < k`` (so 1 when all are correct).

    Raises:
        ValueError: inputs of different lengths, a ``correct`` neither a bool nor 0/1, ``k`` not an integer >= 1,
            or ``k`` larger than some question's
            number of responses (the message names that smallest n and its question): there is no k-subset to
            draw then, and this module does not extrapolate.

    Source: Chen et al. 2021, "Evaluating Large Language Models Trained on Code" (arXiv:2107.03374), section 2.1,
    Eq. 1, computed in float64 in their numerically stable product form ``1 - prod_{i=n-c+1}^{n} (1 - k/i)``
    (their Figure 3), vectorised over questions. For k = 1 it is ``c / n``.
    """
    n, c, keys = _group_counts("pass_at_k", correct, group)
    k = _check_k("pass_at_k", k, n, keys)
    return _pass_at_k_of_counts(n, c, k), keys


def pass_at_k(correct, group, k: int) -> tuple[float, int]:
    """pass@k: the mean over questions of :func:`per_group_pass_at_k` (each question weighs the same).

    pass@1 equals :func:`mean_at_k` (up to float rounding): both are the mean over questions of ``c / n``.

    Args/raises: as :func:`per_group_pass_at_k`.

    Returns:
        ``(pass_k, n_questions)``: float in [0, 1] (NaN when ``n == 0``) and the number of questions.
    """
    values, _ = per_group_pass_at_k(correct, group, k)
    return (float(values.mean()) if len(values) else float("nan")), int(len(values))


def pass_at_k_curve(correct, group, max_k: int | None = None) -> tuple[np.ndarray, int]:
    """pass@k for every ``k = 1 .. K`` (:func:`pass_at_k`), K = ``max_k`` or the smallest number of responses of
    a question.

    Args:
        correct, group: as :func:`per_group_pass_at_k`.
        max_k: the largest k, an integer >= 1 and at most the smallest n; None for that smallest n.

    Returns:
        ``(values, n_questions)``: ``values`` is ``(K,)`` float64 with ``values[k - 1]`` = pass@k, non-decreasing
        in k; all NaN (or empty when ``max_k`` is None) when ``n == 0``. O(K * sum of correct) time.

    Raises:
        ValueError: as :func:`per_group_pass_at_k`, for ``max_k``.
    """
    n, c, keys = _group_counts("pass_at_k_curve", correct, group)
    if max_k is None:
        max_k = int(n.min()) if len(n) else 0
        if max_k == 0:
            return np.zeros(0), 0
    max_k = _check_k("pass_at_k_curve", max_k, n, keys, what="max_k")
    if len(n) == 0:
        return np.full(max_k, np.nan), 0
    return np.array([_pass_at_k_of_counts(n, c, k).mean() for k in range(1, max_k + 1)]), int(len(n))


def its_credit(group, answer, lpm, correct, method: str = "ppl_consistency") -> tuple[np.ndarray, np.ndarray]:
    """Per-question credit of an inference-time scaling rule that picks one answer out of k responses.

    Rules (``method``):

    - ``"ppl_consistency"``: the paper's Algorithm 1 (perplexity consistency, Zhou et al. 2025): group the
      question's responses by identical extracted answer ``a``, score ``C(a) = sum_{i: a_i = a} exp(lpm_i)``,
      pick ``argmax_a C(a)``.
    - ``"majority_vote"``: ``C(a)`` = number of responses with answer ``a`` (self-consistency).
    - ``"max_lpm"``: the single most confident response, ``argmax_i lpm_i``.

    Conventions that make the result deterministic:

    - answers are compared as exact strings after stripping surrounding whitespace (Algorithm 1's
      "identical extracted answers"); a response whose answer is empty does not vote (it is not a
      candidate). A question where no response has an answer earns 0.
    - a candidate's correctness is the mean ``correct`` of its responses (0 or 1 whenever the reward is a
      function of the extracted answer, as with the project's math-verify reward).
    - ties: when m candidates share the best score, the question earns ``(1/m) * sum of their
      correctness``, the expected accuracy of breaking the tie uniformly at random. Scores count as tied
      when they agree to a relative 1e-12 (sums of exponentials are order-dependent in the last bit).
    - ``C(a)`` is computed as ``sum exp(lpm_i - max_q lpm)`` per question, which has the same argmax and ties
      as Algorithm 1 but cannot underflow for long responses (very negative lpm).

    Args:
        group: ``(n,)`` question id per response.
        answer: ``(n,)`` extracted final answer per response (str; ``""`` or None when there is none).
        lpm: ``(n,)`` float mean token log-probability (nats) per response; must be finite and <= 0 (up to
            :data:`LOG_PROB_TOLERANCE`) where the answer is non-empty.
        correct: ``(n,)`` bool (or 0/1) correctness per response.
        method: one of :data:`ITS_METHODS`.

    Returns:
        ``(credit, keys)``: ``credit`` is ``(n_questions,)`` float64 in [0, 1]; ``keys`` the sorted unique
        question ids in the same order.

    Raises:
        ValueError: unknown ``method``, inputs of different lengths, an ``lpm`` that is not real, or NaN, inf or
            above 0 nats on a voting response, or a ``correct`` neither a bool nor 0/1; each names the argument.

    Source: paper Appendix, Algorithm 1 (Perplexity-Consistency Based Inference-Time Scaling), N = k.
    """
    if method not in ITS_METHODS:
        raise ValueError(f"its_credit: unknown method {method!r}; choose one of {', '.join(ITS_METHODS)}")
    group = np.asarray(group).reshape(-1)
    answer = np.array(
        ["" if a is None else str(a).strip() for a in np.asarray(answer, dtype=object).reshape(-1)], dtype=object
    )
    lpm = _real_values("its_credit", "lpm", lpm)
    correct = _correct_values("its_credit", correct).astype(np.float64)
    n = _check_same_length("its_credit", group=group, answer=answer, lpm=lpm, correct=correct)
    keys, qid = np.unique(group, return_inverse=True)
    nq = len(keys)
    credit = np.zeros(nq, dtype=np.float64)
    if n == 0:
        return credit, keys
    votes = answer != ""
    if not np.isfinite(lpm[votes]).all():
        raise ValueError("its_credit: lpm is NaN or inf on a response that has an answer; fix or drop it first")
    above = votes & (lpm > LOG_PROB_TOLERANCE)
    if above.any():
        raise ValueError(
            f"its_credit: lpm is above 0 nats on {int(above.sum())} response(s) that have an answer (rows "
            f"{np.flatnonzero(above)[:5].tolist()}, values {lpm[above][:5].tolist()}); a mean token log-prob lies in "
            f"(-inf, 0] (up to {LOG_PROB_TOLERANCE:g} of float rounding): is it a probability or a negated log-prob?"
        )
    if not votes.any():
        return credit, keys
    qv, lv, cv, av = qid[votes], lpm[votes], correct[votes], answer[votes]

    if method == "max_lpm":
        # each voting response is its own candidate, scored by its lpm
        cand_q, cand_score, cand_credit = qv, lv, cv
    else:
        _, aid = np.unique(av.astype(str), return_inverse=True)
        _, cand_first, cand = np.unique(qv * (aid.max() + 1) + aid, return_index=True, return_inverse=True)
        cand_q = qv[cand_first]
        n_cand = np.bincount(cand).astype(np.float64)
        cand_credit = np.bincount(cand, weights=cv) / n_cand
        if method == "majority_vote":
            cand_score = n_cand
        else:
            q_max = np.full(nq, -np.inf)
            np.maximum.at(q_max, qv, lv)
            cand_score = np.bincount(cand, weights=np.exp(lv - q_max[qv]))  # C(a) / exp(max lpm of q)

    best = np.full(nq, -np.inf)
    np.maximum.at(best, cand_q, cand_score)
    b = best[cand_q]
    tied = cand_score >= b - 1e-12 * np.abs(b)
    n_tied = np.bincount(cand_q[tied], minlength=nq).astype(np.float64)
    won = np.bincount(cand_q[tied], weights=cand_credit[tied], minlength=nq)
    has = n_tied > 0
    credit[has] = won[has] / n_tied[has]
    return credit, keys


def its_accuracy(group, answer, lpm, correct, method: str = "ppl_consistency") -> float:
    """Inference-time scaling accuracy: the mean over questions of :func:`its_credit` (NaN if no question).

    Args/raises: as :func:`its_credit`. Returns a float in [0, 1].
    """
    credit, _ = its_credit(group, answer, lpm, correct, method)
    return float(credit.mean()) if len(credit) else float("nan")


def precision_coverage_curve(scores, correct) -> tuple[np.ndarray, np.ndarray]:
    """Precision-coverage curve: abstain on the least confident responses, measure accuracy on the rest.

    Responses are pooled (across questions) and sorted from most to least confident. Answering the top
    ``m`` of ``n`` gives coverage ``m / n`` and precision = fraction correct among those ``m``. Responses
    with equal scores are indistinguishable to a threshold, so a cut inside a block of ties takes the
    block's mean accuracy for its share of the block (the expectation over random tie-breaking); the curve
    is therefore deterministic and independent of input order.

    Args:
        scores: ``(n,)`` float confidence per response (``lpm`` in nats; higher = more confident), finite.
        correct: ``(n,)`` bool (or 0/1) correctness per response.

    Returns:
        ``(coverage, precision)``: two ``(n,)`` float64 arrays, ``coverage[m-1] = m / n`` and
        ``precision[m-1]`` the precision when the ``m`` most confident responses are answered.
        ``precision[-1]`` is the overall accuracy. Empty arrays when ``n == 0``.

    Raises:
        ValueError: if the inputs differ in length, a score is NaN/inf or not real, or a ``correct`` is neither a
            bool nor 0/1.

    Source: paper section 5.2 "Hallucination Mitigation" and Figure 4 (precision-coverage curves).
    """
    scores = _real_values("precision_coverage_curve", "scores", scores)
    correct = _correct_values("precision_coverage_curve", correct).astype(np.float64)
    n = _check_same_length("precision_coverage_curve", scores=scores, correct=correct)
    if not np.isfinite(scores).all():
        raise ValueError("precision_coverage_curve: scores contain NaN or inf; drop or fix those responses first")
    if n == 0:
        return np.zeros(0), np.zeros(0)
    order = np.argsort(-scores, kind="stable")
    s, y = scores[order], correct[order]
    block = np.cumsum(np.r_[True, s[1:] != s[:-1]]) - 1  # tie-block id of each sorted position
    block_start = np.flatnonzero(np.r_[True, s[1:] != s[:-1]])
    block_mean = np.bincount(block, weights=y) / np.bincount(block)
    cum_before = np.r_[0.0, np.cumsum(y)][block_start]  # correct answers before each block
    m = np.arange(1, n + 1, dtype=np.float64)
    hits = cum_before[block] + (m - block_start[block]) * block_mean[block]
    return m / n, hits / m


def precision_at_coverage(scores, correct, levels=(0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0)) -> np.ndarray:
    """Precision at given coverage levels, read off :func:`precision_coverage_curve`.

    At level ``c`` the ``m = ceil(c * n)`` most confident responses are answered (at least one).

    Args:
        scores, correct: as :func:`precision_coverage_curve`.
        levels: coverages in (0, 1].

    Returns:
        ``(len(levels),)`` float64 precision; all NaN when ``n == 0``.

    Raises:
        ValueError: a level outside (0, 1] (NaN, or not a real number), or as :func:`precision_coverage_curve`.
    """
    levels = _real_values("precision_at_coverage", "levels", levels)
    if not ((levels > 0) & (levels <= 1)).all():  # NaN fails it too
        raise ValueError(f"precision_at_coverage: levels must lie in (0, 1], got {levels.tolist()}")
    _, precision = precision_coverage_curve(scores, correct)
    n = len(precision)
    if n == 0:
        return np.full(len(levels), np.nan)
    m = np.clip(np.ceil(np.round(levels * n, 9)).astype(np.int64), 1, n)  # round: 0.3 * 10 is 3.0000000000000004
    return precision[m - 1]


def precision_coverage_area(scores, correct) -> float:
    """Area under the full precision-coverage curve, coverage from 0 to 1 (NaN when ``n == 0``).

    The curve is a step function: precision of the top ``m`` holds on coverage ``((m-1)/n, m/n]``, so the
    area is ``(1/n) * sum_m precision(m)``. It is the mean precision over all abstention thresholds: the
    overall accuracy when confidence carries no information (random ranking, in expectation), 1 only if
    every response is correct, and higher the more correct responses come first.

    Args/raises: as :func:`precision_coverage_curve`.
    """
    _, precision = precision_coverage_curve(scores, correct)
    return float(precision.mean()) if len(precision) else float("nan")
