"""The CAPO advantage estimator (paper section 4.1, Eqs. 12-18), registered with verl as ``capo``.

For a question with responses o_1..o_G (one verl ``uid`` group), outcome R_i = sum of
``token_level_rewards`` (correct iff R_i > reward_threshold) and confidence

    lpm_i = (1/|o_i|) sum_t log pi_old(o_{i,t} | q, o_{i,<t})            (mean of ``old_log_probs``, nats)

CAPO replaces GRPO's reward-only advantage by the gradient weights of the logistic AUC surrogate
phi_tau(t) = log(1 + exp(-t / tau)) over (correct, incorrect) pairs (Eq. 14, up to the constant 1/tau):

    w_ij  = sigmoid(-(lpm_i - lpm_j) / tau)        i correct, j incorrect, same group
    A_i   = + sum_{j incorrect} w_ij                for a correct i
    A_j   = - sum_{i correct}   w_ij                for an incorrect j

A pair that is already well ranked (lpm_i >> lpm_j) gets a small weight; a misranked one (lpm_i < lpm_j)
a weight near 1. A group with no correct or no incorrect response gets A = 0. ``normalize="group"``
divides by the group size G; then tau -> infinity gives w_ij = 1/2 and A_i = (R_i - mean(R)) / 2 for
0/1 rewards: half of Dr. GRPO's advantage.

Noise mask (Eqs. 16-18), with the reference model's perplexity PPL_ref(o) = exp(-mean_t ref_log_prob):

    m(o) = [PPL_ref(o) <= ref_high] if o is correct  (drop likely lucky guesses)
           [PPL_ref(o) >= ref_low]  if o is incorrect (drop near-correct reasoning)
    A^CAPO_i = m(o_i) * A_i

The mask multiplies only the response's own advantage: a masked response is still an opponent in the
sums of the others. The sequence advantage is broadcast over the response's valid tokens and used in
verl's usual PPO-clip loss.

Cost: one masked mean over ``old_log_probs`` (and ``ref_log_prob``) plus an O(bs * G) pairwise step on
(n_groups, G, G) padded groups; no (bs, bs) matrix.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from capo_verl.estimators.common import (
    behaviour_log_probs,
    check_number,
    check_positive,
    correct_mask,
    group_ids,
    group_table,
    read_config_section,
    reference_ppl_mask,
    row_sweep,
)
from capo_verl.metrics import capo_step_metrics

__all__ = [
    "CapoConfig",
    "capo_pairwise_advantages",
    "compute_capo_outcome_advantage",
    "require_ref_log_prob",
]

NORMALIZE_MODES = ("none", "group")


@dataclass(frozen=True)
class CapoConfig:
    """``algorithm.capo`` of a verl config. Defaults are the paper's Qwen2.5-Math-1.5B settings.

    Attributes:
        tau: temperature of the logistic surrogate phi_tau (Eq. 12); > 0. Paper: 0.6 (1.5B), 0.5 (7B).
        ref_high: PPL threshold above which a *correct* response is masked (Eq. 18); >= 1 (a perplexity is >= 1).
        ref_low: PPL threshold below which an *incorrect* response is masked (Eq. 18); > 0.
        use_mask: apply the reference-PPL noise mask (needs ``ref_log_prob``; turns the reference pass on).
        normalize: ``"none"`` (Eq. 14 as written: plain sums) or ``"group"`` (divide by group size G).
        reward_threshold: a response is correct iff its summed reward is > this (0/1 and +-1 both work); a number.
    """

    tau: float = 0.6
    ref_high: float = 2.5
    ref_low: float = 1.05
    use_mask: bool = True
    normalize: str = "none"
    reward_threshold: float = 0.5

    def __post_init__(self):
        for key in ("tau", "ref_high", "ref_low"):
            check_positive("capo", key, getattr(self, key), getattr(CapoConfig, key))
        if self.ref_high < 1:
            raise ValueError(
                f"algorithm.capo.ref_high must be >= 1, got {self.ref_high!r}: a perplexity is >= 1, so below 1 every "
                "correct response would be masked; the paper uses 2.5 (set e.g. algorithm.capo.ref_high=2.5)"
            )
        check_number("capo", "reward_threshold", self.reward_threshold, CapoConfig.reward_threshold)
        if self.normalize not in NORMALIZE_MODES:
            raise ValueError(
                f"algorithm.capo.normalize must be one of {NORMALIZE_MODES}, got {self.normalize!r}; "
                "use 'none' (Eq. 14 as written) or 'group' (divide by group size)"
            )
        if not isinstance(self.use_mask, bool):
            raise ValueError(f"algorithm.capo.use_mask must be true or false, got {self.use_mask!r}")

    @classmethod
    def from_algorithm_config(cls, config) -> CapoConfig:
        """Read ``config.capo`` from verl's algorithm config (DictConfig, dict, dataclass or None).

        Raises:
            ValueError: on an unknown key under ``algorithm.capo`` (a typo would otherwise be ignored)
                or an invalid value (each message names the key).
        """
        return read_config_section(cls, config, "capo")


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

    Args:
        lpm: ``(bs,)`` float mean token log-prob (nats) of each response.
        correct: ``(bs,)`` bool.
        valid: ``(bs,)`` bool; a response with no valid token joins no pair and gets 0.
        gid: ``(bs,)`` int64 dense group ids in [0, n_groups); groups may be ragged and interleaved.
        n_groups: number of groups.
        tau: surrogate temperature, > 0.
        normalize: ``"none"`` (plain sums) or ``"group"`` (divide by the group's size G).

    Returns:
        ``(bs,)`` float32: +sum_j w_ij for correct i, -sum_i w_ij for incorrect j.

    Memory: O(n_groups * G_max^2) = O(bs * G_max), computed in float32.
    """
    bs = lpm.shape[0]
    device = lpm.device
    # Lay the groups out as rows of a padded (n_groups, G_max) table.
    order, g_sorted, slot, sizes, g_max = group_table(gid, n_groups)

    def table(x, fill):
        t = torch.full((n_groups, g_max), fill, dtype=x.dtype, device=device)
        t[g_sorted, slot] = x[order]
        return t

    lpm_t = table(lpm.to(torch.float32), 0.0)
    pos_t = table(correct & valid, False)  # correct responses, i
    neg_t = table(~correct & valid, False)  # incorrect responses, j

    # w[g, i, j] = sigmoid(-(lpm_i - lpm_j) / tau) on (correct i, incorrect j) pairs, else 0.
    w = torch.sigmoid((lpm_t.unsqueeze(2) - lpm_t.unsqueeze(1)) / -tau)
    w = w * (pos_t.unsqueeze(2) & neg_t.unsqueeze(1))
    adv_t = w.sum(2) - w.sum(1)  # row i: +sum_j w_ij (0 unless i correct); column j: -sum_i w_ij
    if normalize == "group":
        adv_t = adv_t / sizes.clamp_min(1).unsqueeze(1).to(adv_t.dtype)

    adv = torch.empty(bs, dtype=torch.float32, device=device)
    adv[order] = adv_t[g_sorted, slot]
    return adv


def require_ref_log_prob(ref_log_prob, estimator: str) -> None:
    """Raise ValueError naming ``ref_log_prob`` and the fix if it is None (the noise mask needs it)."""
    if ref_log_prob is None:
        raise ValueError(
            f"{estimator} with algorithm.capo.use_mask=true needs 'ref_log_prob' (reference-model log-probs) in "
            "the batch, and it is missing. In verl's trainer capo-verl turns the reference pass on by itself; if "
            "you disabled it, configure actor_rollout_ref.ref, or set algorithm.capo.use_mask=false to train "
            "without the noise mask (when calling directly, pass ref_log_prob=(bs, response_length))"
        )


# --- registration with verl (the only part that touches capo_verl.compat) ---------------------------------------
from capo_verl.compat.advantage import record_step_metrics, register_batch_aware_adv_est  # noqa: E402


@register_batch_aware_adv_est(
    "capo",
    batch_keys=("old_log_probs", "rollout_log_probs", "ref_log_prob"),
    needs_reference_policy=lambda algorithm: CapoConfig.from_algorithm_config(algorithm).use_mask,
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

    Called by verl's ``compute_advantage`` for ``algorithm.adv_estimator=capo``; capo_verl.compat forwards
    ``old_log_probs``, ``rollout_log_probs`` and ``ref_log_prob`` from the batch. Records the ``capo/*``
    calibration metrics of the batch for the trainer's step metrics.

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
    bs = token_level_rewards.shape[0]
    gid_np, n_groups = group_ids(index, bs)
    log_probs, lp_key = behaviour_log_probs(old_log_probs, rollout_log_probs, "capo")

    if cfg.use_mask:
        require_ref_log_prob(ref_log_prob, "capo")
    masked = {lp_key: log_probs}
    if ref_log_prob is not None:
        masked["ref_log_prob"] = ref_log_prob
    # out: a float32 copy of the mask, overwritten in place by the advantages at the end.
    out, n_valid, sums, score = row_sweep(response_mask, masked, token_level_rewards)
    lpm = sums[lp_key] / n_valid.clamp_min(1.0)
    valid = n_valid > 0
    correct = correct_mask(score, cfg.reward_threshold)
    gid = torch.from_numpy(gid_np).to(lpm.device)

    adv = capo_pairwise_advantages(lpm, correct, valid, gid, n_groups, cfg.tau, cfg.normalize)
    keep = ref_ppl = None
    if ref_log_prob is not None:
        ref_ppl = torch.exp(-sums["ref_log_prob"] / n_valid.clamp_min(1.0))  # PPL_ref, Eq. 16
    if cfg.use_mask:
        keep = reference_ppl_mask(ref_ppl, correct, cfg.ref_high, cfg.ref_low)
        adv = adv * keep

    record_step_metrics(
        capo_step_metrics(
            lpm.numpy(force=True),
            correct.numpy(force=True),
            gid_np,
            valid.numpy(force=True),
            adv=adv.numpy(force=True),
            ref_ppl=None if ref_ppl is None else ref_ppl.numpy(force=True),
            keep=None if keep is None else keep.numpy(force=True),
        )
    )
    advantages = out.mul_(adv.unsqueeze(-1))  # (bs, T): A_i on valid tokens, 0 on padding
    return advantages, advantages
