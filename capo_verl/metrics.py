"""Calibration metrics of the CAPO paper: per-question AUC of confidence against correctness.

Confidence is a response's mean token log-probability ``lpm`` (nats; higher = more confident,
equivalently lower perplexity ``PPL = exp(-lpm)``). Relative calibration (paper section 2.2, Eq. 7-8):

    AUC(q)   = P(lpm_i > lpm_j | R_i = 1, R_j = 0)  for responses i, j to the same question q,
               ties counting 1/2 (the Mann-Whitney U statistic divided by n_pos * n_neg);
    AUC-mean = mean of AUC(q) over the questions q that have both outcomes.

Everything here is vectorised numpy in float64: O(n log n) time, O(n) memory, no (n, n) matrix.
"""

from __future__ import annotations

import math

import numpy as np

__all__ = ["LOG_PROB_TOLERANCE", "per_group_auc", "auc_mean", "capo_step_metrics"]

#: A response's mean token log-prob (nats) above this is no log-probability: 0 up to float rounding is accepted (the
#: estimators' :func:`capo_verl.estimators.common.check_log_prob_means` and :func:`its_credit` use it).
LOG_PROB_TOLERANCE = 1e-4


def _real_values(fn: str, name: str, values) -> np.ndarray:
    """``values`` as a 1-D float64 array, refusing what is not real numbers (strings, complex numbers, dates): a
    check of the dtype, no pass over the values except to convert an object array.

    Raises:
        ValueError: naming ``fn``, ``name`` and the dtype given.
    """
    a = np.asarray(values)
    if a.dtype.kind == "O":
        try:
            a = a.astype(np.float64)
        except (TypeError, ValueError):
            pass
    if a.dtype.kind not in "biuf":
        raise ValueError(
            f"{fn}: {name} must hold real numbers, got dtype {a.dtype} (e.g. {a.reshape(-1)[:3].tolist()})"
        )
    return a.astype(np.float64, copy=False).reshape(-1)


def _correct_values(fn: str, correct) -> np.ndarray:
    """``correct`` as a 1-D bool array: given as bools, or as numbers that are each exactly 0 or 1 (one reduction);
    strings, probabilities, NaN and complex numbers are refused rather than cast (``bool("no")`` and ``bool(0.3)``
    are True).

    Raises:
        ValueError: naming ``fn``, ``correct``, the allowed values and what was given.
    """
    a = np.asarray(correct)
    if a.dtype == bool:
        return a.reshape(-1)
    try:
        x = _real_values(fn, "correct", a)
    except ValueError:
        x = None
    if x is None:
        given = f"dtype {a.dtype} (e.g. {a.reshape(-1)[:3].tolist()})"
    else:
        ok = (x == 0) | (x == 1)  # NaN fails both
        if ok.all():
            return x.astype(bool)
        given = f"{int((~ok).sum())} other value(s), e.g. {x[~ok][:3].tolist()}"
    raise ValueError(
        f"{fn}: correct must be bool, or 0/1 numbers, one per response (1 = correct); got {given}: a probability or "
        "a string is not cast, threshold it first (e.g. correct = reward > 0.5)"
    )


def per_group_auc(scores, correct, group) -> tuple[np.ndarray, np.ndarray]:
    """ROC-AUC of ``scores`` against ``correct`` inside each group, ties counted 0.5.

    Args:
        scores: ``(n,)`` real confidence per response (e.g. ``lpm`` in nats); must be finite.
        correct: ``(n,)`` bool (or numbers each exactly 0 or 1) correctness per response.
        group: ``(n,)`` group id per response (verl's ``uid``/``index``; any hashable, e.g. str
            in an object array, or ints). Groups may be ragged and need not be contiguous.

    Returns:
        ``(auc, keys)``: ``auc`` is ``(n_groups,)`` float64, NaN for a group without both a
        correct and an incorrect response; ``keys`` are the sorted unique group ids in the
        same order.

    Raises:
        ValueError: if the three inputs differ in length, a score is NaN/inf or not a real number (a complex
            number, a string), or a ``correct`` is neither a bool nor 0/1 (a string, a probability, NaN); each
            message names the argument.

    Source: Mann-Whitney form of the paper's Eq. 7; matches ``sklearn.metrics.roc_auc_score``
    on every mixed group.
    """
    scores = _real_values("per_group_auc", "scores", scores)
    correct = _correct_values("per_group_auc", correct)
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
        The sum is exactly rounded (``math.fsum``), so the value does not depend on the order of the
        group ids: verl's ``uid`` is a random uuid, and two runs with the same responses must agree to
        the last bit.
    """
    auc, _ = per_group_auc(scores, correct, group)
    mixed = ~np.isnan(auc)
    n_mixed = int(mixed.sum())
    return (math.fsum(auc[mixed]) / n_mixed if n_mixed else float("nan")), n_mixed


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
        ``adv_abs_mean``, ``adv_mean_correct``, ``adv_mean_incorrect`` (the mean sequence advantage of the
        correct / incorrect responses), ``mask_frac_correct``, ``mask_frac_incorrect``, ``ref_ppl_correct_q75``,
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
        adv = np.asarray(adv, dtype=np.float64).reshape(-1)[valid]
        out["adv_abs_mean"] = float(np.abs(adv).mean())
        for name, sel in (("correct", correct), ("incorrect", ~correct)):
            if sel.any():
                out[f"adv_mean_{name}"] = float(adv[sel].mean())
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
