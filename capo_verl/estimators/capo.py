"""The CAPO advantage estimator (paper section 4.1, Eqs. 12-18), registered with verl as ``capo``.

For a question with responses o_1..o_G (one verl ``uid`` group), outcome R_i = sum of
``token_level_rewards`` (correct iff R_i > reward_threshold) and confidence

    lpm_i = (1/|o_i|) sum_t log pi_old(o_{i,t} | q, o_{i,<t})            (mean of ``old_log_probs``, nats)

CAPO replaces GRPO's reward-only advantage by the gradient weights of the logistic AUC surrogate
phi_tau(t) = log(1 + exp(-t / tau)) over (correct, incorrect) pairs (Eq. 14, up to the constant 1/tau):

    w_ij  = sigmoid(-(lpm_i - lpm_j) / tau)        i correct, j incorrect, same group
    A_i   = + sum_{j incorrect} w_ij                for a correct i
    A_j   = - sum_{i correct}   w_ij                for an incorrect j

Exactly: with the group's surrogate loss L = sum_{i correct, j incorrect} phi_tau(lpm_i - lpm_j) (Eq. 12 with
t = (lpm_i - lpm_j)(R_i - R_j) for 0/1 outcomes, summed over the group's pairs instead of averaged),

    A_i = -tau * dL/dlpm_i            (normalize="none")
    A_i = -(tau / G) * dL/dlpm_i      (normalize="group", G the group's size)

since phi_tau'(t) = -sigmoid(-t / tau) / tau; the paper's Eq. 14 writes phi'(t) = -sigmoid(-t), i.e. the same
weights with the 1/tau left out. A pair that is already well ranked (lpm_i >> lpm_j) gets a small weight; a
misranked one (lpm_i < lpm_j) a weight near 1. A group with no correct or no incorrect response gets A = 0.
``normalize="group"`` with tau -> infinity gives w_ij = 1/2 and A_i = (R_i - mean(R)) / 2 for 0/1 rewards: half of
Dr. GRPO's advantage.

Noise mask (Eqs. 16-18), with the reference model's perplexity PPL_ref(o) = exp(-mean_t ref_log_prob):

    m(o) = [PPL_ref(o) <= ref_high] if o is correct  (drop likely lucky guesses)
           [PPL_ref(o) >= ref_low]  if o is incorrect (drop near-correct reasoning)
    A^CAPO_i = m(o_i) * A_i

The mask multiplies only the response's own advantage: a masked response is still an opponent in the
sums of the others. The sequence advantage is broadcast over the response's valid tokens and used in
verl's usual PPO-clip loss.

Cost: one masked mean over ``old_log_probs`` (and ``ref_log_prob``) plus the pairwise step over the pairs of each
group (sum of G^2 over the mixed groups), processed per group size in blocks of at most :data:`PAIR_BLOCK` pairs, so
the extra memory is O(bs + PAIR_BLOCK) whatever the group sizes; no (bs, bs) matrix and no padding to the largest
group. Nothing here imports verl; :func:`compute_capo_outcome_advantage` declares its registration
(:func:`~capo_verl.estimators.registry.register_estimator`), which ``capo_verl.compat.methods`` makes with verl.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch

from capo_verl.estimators.common import (
    check_groups,
    check_log_prob_means,
    check_number,
    check_positive,
    check_rows,
    group_layout,
    noise_mask,
    read_batch,
    read_config_section,
    record_step_metrics,
)
from capo_verl.estimators.registry import register_estimator

__all__ = [
    "CapoConfig",
    "PAIR_BLOCK",
    "capo_pairwise_advantages",
    "check_mask_thresholds",
    "check_tau",
    "compute_capo_outcome_advantage",
]

NORMALIZE_MODES = ("none", "group")

#: Most (i, j) pairs whose weights exist at one time in :func:`capo_pairwise_advantages` (float32 and bool
#: temporaries of about 13 bytes per pair: ~14 MB).
PAIR_BLOCK = 1 << 20


def check_tau(tau) -> float:
    """``tau`` as a float if CAPO can use it in float32, else ValueError naming ``algorithm.capo.tau``.

    Valid: a finite number > 0 whose float32 rounding is > 0 and finite and whose reciprocal 1/tau, rounded to
    float32, is finite and > 0; i.e. about 2.9e-39 < tau <= 3.4e38 (float32's range). Outside it the weights
    ``sigmoid(-(lpm_i - lpm_j) / tau)`` would be computed with a tau of 0 or inf (NaN for ties).
    """
    value = check_positive("capo", "tau", tau, CapoConfig.tau)
    with np.errstate(over="ignore", under="ignore"):
        tau32, inv32 = np.float32(value), np.float32(1.0 / value)
    if not (math.isfinite(tau32) and tau32 > 0 and math.isfinite(inv32) and inv32 > 0):
        raise ValueError(
            f"algorithm.capo.tau={value!r} is outside float32's range, in which CAPO computes its weights: tau and "
            "1/tau must both be finite and > 0 in float32 (about 2.9e-39 < tau <= 3.4e38); the paper uses 0.5-1.0 "
            "(set e.g. algorithm.capo.tau=0.6)"
        )
    return value


#: ``(ref_low, ref_high)`` committed in ``configs/``: the paper's (Qwen2.5-Math) and SmolLM2-135M-Instruct's, from
#: ``capo-verl mask-thresholds`` (``configs/capo_smollm2_135m_cpu.yaml``); the fixes of a refused threshold use them.
COMMITTED_THRESHOLDS = {"qwen2.5-math": (1.05, 2.5), "smollm2-135m-instruct": (3.97, 6.43)}


@dataclass(frozen=True)
class CapoConfig:
    """``algorithm.capo`` of a verl config. Defaults are the paper's Qwen2.5-Math-1.5B settings.

    Attributes:
        tau: temperature of the logistic surrogate phi_tau (Eq. 12); > 0 and usable in float32 (:func:`check_tau`).
            Paper: 0.6 (1.5B), 0.5 (7B).
        ref_high: PPL threshold above which a *correct* response is masked (Eq. 18); >= 1 (a perplexity is >= 1).
        ref_low: PPL threshold below which an *incorrect* response is masked (Eq. 18); > 0.
        use_mask: apply the reference-PPL noise mask (needs ``ref_log_prob``; turns the reference pass on).
        normalize: ``"none"`` (Eq. 14 as written: plain sums) or ``"group"`` (divide by group size G).
        reward_threshold: a response is correct iff its summed reward is > this (0/1 and +-1 both work); a number.

    Raises:
        ValueError: on construction, for an invalid value; the message names ``algorithm.capo.<key>`` and the fix.
    """

    tau: float = 0.6
    ref_high: float = 2.5
    ref_low: float = 1.05
    use_mask: bool = True
    normalize: str = "none"
    reward_threshold: float = 0.5

    def __post_init__(self):
        check_tau(self.tau)
        for key in ("ref_high", "ref_low"):
            check_positive("capo", key, getattr(self, key), self._threshold_fix(key))
        if self.ref_high < 1:
            raise ValueError(
                f"algorithm.capo.ref_high must be >= 1, got {self.ref_high!r}: a perplexity is >= 1, so below 1 every "
                f"correct response would be masked; the paper uses 2.5 (set e.g. algorithm.capo.ref_high="
                f"{self._threshold_fix('ref_high'):g})"
            )
        check_number("capo", "reward_threshold", self.reward_threshold, CapoConfig.reward_threshold)
        if self.normalize not in NORMALIZE_MODES:
            lower = str(self.normalize).lower()
            example = lower if lower in NORMALIZE_MODES else "none"
            raise ValueError(
                f"algorithm.capo.normalize must be one of {NORMALIZE_MODES}, got {self.normalize!r}: 'none' (Eq. 14 "
                f"as written) or 'group' (divide by group size); set algorithm.capo.normalize={example}"
            )
        if not isinstance(self.use_mask, bool):
            raise ValueError(
                f"algorithm.capo.use_mask must be true or false, got {self.use_mask!r} (true: the reference-PPL "
                "noise mask of Eqs. 16-18); set algorithm.capo.use_mask=true or algorithm.capo.use_mask=false"
            )

    def _threshold_fix(self, key: str) -> float:
        """The value a refusal of ``ref_high`` / ``ref_low`` suggests: the paper's, unless the other threshold leaves
        it no window; then the committed pair (:data:`COMMITTED_THRESHOLDS`) whose other threshold is this one's, or
        the nearest that keeps ``ref_low`` < ``ref_high`` (e.g. SmolLM2's ``ref_high`` 6.43 for its ``ref_low``
        3.97), else the other threshold scaled by the paper's ratio ref_high / ref_low."""
        other = self.ref_low if key == "ref_high" else self.ref_high
        default = getattr(CapoConfig, key)
        if isinstance(other, bool) or not isinstance(other, (int, float)) or not 0 < other < math.inf:
            return default
        high = key == "ref_high"
        if (default > other) if high else (default < other):
            return default
        pairs = sorted(COMMITTED_THRESHOLDS.values())
        same = [p for p in pairs if (p[0] if high else p[1]) == other]
        if same:
            return same[0][1] if high else same[0][0]
        beyond = [p[1] for p in pairs if p[1] > other] if high else [p[0] for p in pairs if p[0] < other]
        if beyond:
            return min(beyond) if high else max(beyond)
        ratio = CapoConfig.ref_high / CapoConfig.ref_low
        return round(other * ratio, 2) if high else round(other / ratio, 2)

    @classmethod
    def from_algorithm_config(cls, config) -> CapoConfig:
        """Read ``config.capo`` from verl's algorithm config (DictConfig, dict, dataclass or None).

        Raises:
            ValueError: on an unknown key under ``algorithm.capo`` (a typo would otherwise be ignored)
                or an invalid value (each message names the key).
        """
        return read_config_section(cls, config, "capo")


def uses_noise_mask(algorithm_config) -> bool:
    """``algorithm.capo.use_mask``: the noise mask (Eq. 18) needs the reference model's log-probs (``ref_log_prob``).

    Raises:
        ValueError: an invalid ``algorithm.capo`` (:meth:`CapoConfig.from_algorithm_config`).
    """
    return CapoConfig.from_algorithm_config(algorithm_config).use_mask


def mask_keys_unread(cfg: CapoConfig) -> dict[str, tuple[str, str]]:
    """The keys of ``algorithm.capo`` that the noise mask alone reads, when ``cfg`` turns it off: ``ref_high`` and
    ``ref_low`` (Eq. 18), each with the reason and the key that makes them count
    (:attr:`~capo_verl.estimators.registry.EstimatorSpec.unread_keys`)."""
    if cfg.use_mask:
        return {}
    unread = ("the noise mask is off (algorithm.capo.use_mask=false)", "set algorithm.capo.use_mask=true")
    return {"ref_high": unread, "ref_low": unread}


def check_mask_thresholds(config, capo: CapoConfig) -> None:
    """The ``check_config`` of the estimators reading ``algorithm.capo``: ``ref_low`` <= ``ref_high`` when the noise
    mask is on; else ValueError with a fix (``+`` where the trainer ``config`` lacks the key). Eq. 18 masks a correct
    response above ``ref_high`` and an incorrect one below ``ref_low`` (lucky guesses, near-misses), so the paper's
    window has ``ref_low`` < ``ref_high`` ([1.05, 2.5]); swapped, an incorrect response is masked at perplexities
    where a correct one still counts as genuine."""
    if not capo.use_mask or capo.ref_low <= capo.ref_high:
        return
    low = min(CapoConfig.ref_low, capo.ref_high)
    plus = "" if "ref_low" in ((config.get("algorithm") or {}).get("capo") or {}) else "+"
    raise ValueError(
        f"algorithm.capo.ref_low={capo.ref_low:g}: must be <= algorithm.capo.ref_high={capo.ref_high:g} (Eq. 18 "
        "masks incorrect responses below ref_low and correct ones above ref_high; with ref_low above ref_high the "
        "mask drops incorrect responses the reference finds less likely than correct ones it keeps); set "
        f"{plus}algorithm.capo.ref_low={low:g}, or swap the two values"
    )


MASK_SUMMARY = (("mask, share of incorrect responses dropped", "capo/mask_frac_incorrect"),)


def capo_pairwise_advantages(
    lpm: torch.Tensor,
    correct: torch.Tensor,
    valid: torch.Tensor,
    gid: torch.Tensor,
    n_groups: int,
    tau: float,
    normalize: str = "none",
) -> torch.Tensor:
    """Eq. 14 with the logistic surrogate: sequence-level CAPO advantages, before the noise mask.

    ``A_i = -tau * dL/dlpm_i`` (divided by the group size G for ``normalize="group"``) with
    ``L = sum over each group's (correct i, incorrect j) pairs of log(1 + exp(-(lpm_i - lpm_j) / tau))``.

    Args:
        lpm: ``(bs,)`` float mean token log-prob (nats) of each response; finite and <= 0 where ``valid``.
        correct: ``(bs,)`` bool.
        valid: ``(bs,)`` bool; a response with no valid token joins no pair and gets 0.
        gid: ``(bs,)`` int64 dense group ids in [0, n_groups); groups may be ragged and interleaved.
        n_groups: number of groups.
        tau: surrogate temperature, see :func:`check_tau`.
        normalize: ``"none"`` (plain sums) or ``"group"`` (divide by the group's size G, invalid responses included).

    Returns:
        ``(bs,)`` float32: +sum_j w_ij for correct i, -sum_i w_ij for incorrect j, exactly 0 in a group without
        both outcomes. Never NaN for finite lpm: ``lpm_i - lpm_j`` (float32) times the float32 ``-1/tau`` is finite or
        +-inf, whose sigmoid is 0 or 1.

    Raises:
        TypeError: an argument of ``lpm``, ``correct``, ``valid``, ``gid`` that is not a ``torch.Tensor``.
        ValueError: ``tau`` outside float32's range (:func:`check_tau`) or an unknown ``normalize``.
        EstimatorInputError: ``lpm`` not real (complex), ``correct`` or ``valid`` not bool, ``gid`` not integer, or
            one of them not ``(bs,)`` like the others (:func:`~.common.check_rows`); ``n_groups`` not an integer >= 1
            or ``gid`` outside [0, n_groups) (:func:`~.common.check_groups`); ``lpm`` NaN, inf or above 0 nats where
            ``valid`` (:func:`~.common.check_log_prob_means`).

    Memory: O(bs + PAIR_BLOCK). The groups with both outcomes are taken per distinct size s, as ``(n_s, s)`` tables
    of their lpm, and the weights of at most :data:`PAIR_BLOCK` pairs exist at a time (several groups of a size at
    once, or row blocks of one group larger than sqrt(PAIR_BLOCK)); float32 throughout. Time: sum of G^2 over those
    groups.
    """
    check_rows("capo", lpm=lpm, correct=correct, valid=valid, gid=gid)
    n_groups = check_groups("capo", gid, n_groups)
    check_log_prob_means("capo", "lpm", lpm, valid)
    return _pairwise_advantages(lpm, correct, valid, gid, n_groups, tau, normalize)


def _pairwise_advantages(lpm, correct, valid, gid, n_groups: int, tau: float, normalize: str) -> torch.Tensor:
    """:func:`capo_pairwise_advantages` without the check of ``lpm``, which :func:`read_batch` made already."""
    scale = -1.0 / check_tau(tau)  # float32(scale) is finite and nonzero (check_tau)
    if normalize not in NORMALIZE_MODES:
        raise ValueError(f"algorithm.capo.normalize must be one of {NORMALIZE_MODES}, got {normalize!r}")
    bs, device = lpm.shape[0], lpm.device
    pos, neg = correct & valid, ~correct & valid
    layout = group_layout(gid, n_groups)
    n_pos = torch.bincount(gid, weights=pos.to(torch.float32), minlength=n_groups)
    n_neg = torch.bincount(gid, weights=neg.to(torch.float32), minlength=n_groups)
    lpm_s, pos_s, neg_s = lpm.to(torch.float32)[layout.order], pos[layout.order], neg[layout.order]

    adv_s = torch.zeros(bs, dtype=torch.float32, device=device)
    for size, _, idx in layout.buckets(select=(n_pos > 0) & (n_neg > 0), min_size=2):
        rows_per_block = max(1, min(size, PAIR_BLOCK // size))
        groups_per_block = max(1, PAIR_BLOCK // (rows_per_block * size))
        for g0 in range(0, idx.shape[0], groups_per_block):
            members = idx[g0 : g0 + groups_per_block]  # (n, s) positions in the sorted order
            lp, p, q = lpm_s[members], pos_s[members], neg_s[members]
            lp_j, q_j = lp.unsqueeze(1), q.unsqueeze(1)  # (n, 1, s): the incorrect side j
            acc = torch.zeros_like(lp)
            for i0 in range(0, size, rows_per_block):
                i1 = min(i0 + rows_per_block, size)
                # w[g, i, j] = sigmoid(-(lpm_i - lpm_j) / tau) on (correct i, incorrect j) pairs, else 0
                w = torch.sigmoid((lp[:, i0:i1, None] - lp_j) * scale)
                w = torch.where(p[:, i0:i1, None] & q_j, w, 0.0)  # (n, rows, s)
                acc[:, i0:i1] += w.sum(2)  # correct i: + sum_j w_ij
                acc -= w.sum(1)  # incorrect j: - sum_i w_ij
            adv_s[members] = acc

    adv = torch.empty(bs, dtype=torch.float32, device=device)
    adv[layout.order] = adv_s
    if normalize == "group":
        adv = adv / layout.sizes[gid].to(torch.float32)
    return adv


@register_estimator(
    "capo",
    batch_keys=("old_log_probs", "rollout_log_probs", "ref_log_prob"),
    section="capo",
    config_class=CapoConfig,
    needs_reference_policy=uses_noise_mask,
    unread_keys=mask_keys_unread,
    check_config=check_mask_thresholds,
    group_reason="CAPO ranks each prompt's correct responses against its incorrect ones (Eq. 14); a group of one "
    "has no pair, so every advantage would be 0 and nothing would be trained",
    trains_without_kl=True,
    summary_metrics=MASK_SUMMARY,
)
def compute_capo_outcome_advantage(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    index: np.ndarray | None = None,
    config=None,
    old_log_probs: torch.Tensor | None = None,
    ref_log_prob: torch.Tensor | None = None,
    rollout_log_probs: torch.Tensor | None = None,
    **kwargs,
) -> tuple[torch.Tensor, torch.Tensor]:
    """CAPO advantages (Eq. 14 with the logistic surrogate, times the noise mask of Eqs. 16-18).

    verl's ``compute_advantage`` calls this for ``algorithm.adv_estimator=capo`` (registered by
    :mod:`capo_verl.compat.methods`, which forwards ``old_log_probs``, ``rollout_log_probs`` and ``ref_log_prob``
    from the batch). Records the ``capo/*`` calibration metrics of the batch for the trainer's step metrics.

    Args:
        token_level_rewards: ``(bs, response_length)`` rewards; R_i is their sum.
        response_mask: ``(bs, response_length)`` 1 on valid response tokens.
        index: ``(bs,)`` group id (verl ``uid``) per response.
        config: verl's algorithm config; its ``capo`` section is a :class:`CapoConfig`.
        old_log_probs: ``(bs, response_length)`` log-probs (nats) of the behaviour policy; lpm source.
        ref_log_prob: ``(bs, response_length)`` reference-model log-probs (nats); needed when use_mask.
        rollout_log_probs: ``(bs, response_length)`` used for lpm only when ``old_log_probs`` is None.

    Returns:
        ``(advantages, returns)``: the same ``(bs, response_length)`` float32 tensor, the sequence
        advantage broadcast over valid tokens and 0 on padding.

    Raises:
        ValueError: missing ``uid``/log-probs/``ref_log_prob`` (mask on), NaN/inf in a used log-prob,
            or an invalid ``algorithm.capo`` value; each message names the key and the fix.
    """
    cfg = CapoConfig.from_algorithm_config(config)
    batch = read_batch(
        "capo", token_level_rewards, response_mask, index, cfg.reward_threshold,
        old_log_probs=old_log_probs, rollout_log_probs=rollout_log_probs,
        ref_log_prob=ref_log_prob, need_ref=cfg.use_mask,
    )  # fmt: skip
    adv = _pairwise_advantages(  # batch.lpm and batch.ref_ppl are checked (read_batch)
        batch.lpm, batch.correct, batch.valid, batch.gid, batch.n_groups, cfg.tau, cfg.normalize
    )
    keep = None
    if cfg.use_mask:
        keep = noise_mask(batch.ref_ppl, batch.correct, cfg.ref_high, cfg.ref_low)
        adv = adv * keep
    record_step_metrics(batch.calibration_metrics(adv, keep))
    advantages = batch.broadcast(adv)
    return advantages, advantages
