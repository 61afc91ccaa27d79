"""Calibration metrics of the CAPO paper: per-question AUC of confidence against correctness.

Confidence is a response's mean token log-probability ``lpm`` (nats; higher = more confident,
equivalently lower perplexity ``PPL = exp(-lpm)``). Relative calibration (paper section 2.2, Eq. 7-8):

    AUC(q)   = P(lpm_i > lpm_j | R_i = 1, R_j = 0)  for responses i, j to the same question q,
               ties counting 1/2 (the Mann-Whitney U statistic divided by n_pos * n_neg);
    AUC-mean = mean of AUC(q) over the questions q that have both outcomes.

Everything here is vectorised numpy in float64: O(n log n) time, O(n) memory, no (n, n) matrix.
"""

from __future__ import annotations

import numpy as np

__all__ = ["per_group_auc", "auc_mean", "capo_step_metrics"]


def per_group_auc(scores, correct, group) -> tuple[np.ndarray, np.ndarray]:
    """ROC-AUC of ``scores`` against ``correct`` inside each group, ties counted 0.5.

    Args:
        scores: ``(n,)`` float confidence per response (e.g. ``lpm`` in nats); must be finite.
        correct: ``(n,)`` bool (or 0/1) correctness per response.
        group: ``(n,)`` group id per response (verl's ``uid``/``index``; any hashable, e.g. str
            in an object array, or ints). Groups may be ragged and need not be contiguous.

    Returns:
        ``(auc, keys)``: ``auc`` is ``(n_groups,)`` float64, NaN for a group without both a
        correct and an incorrect response; ``keys`` are the sorted unique group ids in the
        same order.

    Raises:
        ValueError: if the three inputs differ in length or a score is NaN/inf.

    Source: Mann-Whitney form of the paper's Eq. 7; matches ``sklearn.metrics.roc_auc_score``
    on every mixed group.
    """
    scores = np.asarray(scores, dtype=np.float64).reshape(-1)
    correct = np.asarray(correct).reshape(-1).astype(bool)
    group = np.asarray(group).reshape(-1)
    if not (len(scores) == len(correct) == len(group)):
        raise ValueError(
            f"per_group_auc: scores ({len(scores)}), correct ({len(correct)}) and group ({len(group)}) "
            "must have the same length (one entry per response)"
        )
    if not np.isfinite(scores).all():
        raise ValueError("per_group_auc: scores contain NaN or inf; drop or fix those responses first")
    if len(scores) == 0:
        return np.zeros(0), group[:0]

    keys, gid = np.unique(group, return_inverse=True)
    n_groups = len(keys)
    order = np.lexsort((scores, gid))  # by group, then by score ascending
    s, g, y = scores[order], gid[order], correct[order]

    n = len(s)
    group_start = np.flatnonzero(np.r_[True, g[1:] != g[:-1]])  # gid is dense: group k starts at group_start[k]
    rank = np.arange(n, dtype=np.float64) - group_start[g] + 1.0  # 1-based rank inside the group
    # Tied scores inside a group share the average of their ranks (the 1/2 credit of a tie).
    run_id = np.cumsum(np.r_[True, (g[1:] != g[:-1]) | (s[1:] != s[:-1])]) - 1
    avg_rank = (np.bincount(run_id, weights=rank) / np.bincount(run_id))[run_id]

    n_total = np.bincount(g, minlength=n_groups).astype(np.float64)
    n_pos = np.bincount(g, weights=y.astype(np.float64), minlength=n_groups)
    n_neg = n_total - n_pos
    rank_sum_pos = np.bincount(g, weights=avg_rank * y, minlength=n_groups)
    u_stat = rank_sum_pos - n_pos * (n_pos + 1.0) / 2.0
    with np.errstate(invalid="ignore", divide="ignore"):
        auc = np.where((n_pos > 0) & (n_neg > 0), u_stat / (n_pos * n_neg), np.nan)
    return auc, keys


def auc_mean(scores, correct, group) -> tuple[float, int]:
    """AUC-mean (paper Eq. 8): the mean of :func:`per_group_auc` over groups with both outcomes.

    Args/raises: as :func:`per_group_auc`.

    Returns:
        ``(auc_mean, n_mixed)``: float (NaN when no group is mixed) and the number of mixed groups.
    """
    auc, _ = per_group_auc(scores, correct, group)
    mixed = ~np.isnan(auc)
    n_mixed = int(mixed.sum())
    return (float(auc[mixed].mean()) if n_mixed else float("nan")), n_mixed


def capo_step_metrics(
    lpm,
    correct,
    group,
    valid,
    adv=None,
    ref_ppl=None,
    keep=None,
    prefix: str = "capo/",
) -> dict[str, float]:
    """Calibration metrics of one training batch, logged every step under ``capo/``.

    Args:
        lpm: ``(bs,)`` mean token log-prob (nats) of each response under the behaviour policy.
        correct: ``(bs,)`` bool, ``R_i > reward_threshold``.
        group: ``(bs,)`` group id per response (``uid``); ints or hashables.
        valid: ``(bs,)`` bool, the response has at least one valid token (others are ignored).
        adv: ``(bs,)`` sequence-level advantage, or None.
        ref_ppl: ``(bs,)`` reference-model perplexity ``exp(-mean ref_log_prob)``, or None.
        keep: ``(bs,)`` bool, the noise mask ``m(o_i)`` of Eq. 18 (False = masked), or None.

    Returns:
        ``{prefix + name: float}`` with ``auc_mean`` (per-group ROC-AUC of lpm vs correctness averaged
        over mixed groups), ``mixed_group_frac``, ``lpm_correct_mean``, ``lpm_incorrect_mean``,
        ``adv_abs_mean``, ``mask_frac_correct``, ``mask_frac_incorrect``, ``ref_ppl_correct_q75``,
        ``ref_ppl_incorrect_q25``. A metric that is undefined in this batch (no mixed group, no
        correct response, no ``ref_ppl``...) is left out rather than logged as NaN.
    """
    valid = np.asarray(valid, dtype=bool).reshape(-1)
    lpm = np.asarray(lpm, dtype=np.float64).reshape(-1)[valid]
    correct = np.asarray(correct, dtype=bool).reshape(-1)[valid]
    group = np.asarray(group).reshape(-1)[valid]
    out: dict[str, float] = {}
    n_groups = len(np.unique(group))
    if n_groups:
        value, n_mixed = auc_mean(lpm, correct, group)
        out["mixed_group_frac"] = n_mixed / n_groups
        if n_mixed:
            out["auc_mean"] = value
    for name, sel in (("correct", correct), ("incorrect", ~correct)):
        if sel.any():
            out[f"lpm_{name}_mean"] = float(lpm[sel].mean())
    if adv is not None and valid.any():
        out["adv_abs_mean"] = float(np.abs(np.asarray(adv, dtype=np.float64).reshape(-1)[valid]).mean())
    if keep is not None:
        keep = np.asarray(keep, dtype=bool).reshape(-1)[valid]
        for name, sel in (("correct", correct), ("incorrect", ~correct)):
            if sel.any():
                out[f"mask_frac_{name}"] = float((~keep[sel]).mean())
    if ref_ppl is not None:
        ref_ppl = np.asarray(ref_ppl, dtype=np.float64).reshape(-1)[valid]
        if correct.any():
            out["ref_ppl_correct_q75"] = float(np.quantile(ref_ppl[correct], 0.75))
        if (~correct).any():
            out["ref_ppl_incorrect_q25"] = float(np.quantile(ref_ppl[~correct], 0.25))
    return {prefix + k: v for k, v in out.items()}
