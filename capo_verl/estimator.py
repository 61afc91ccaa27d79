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

import logging
from collections.abc import Mapping
from dataclasses import dataclass, fields

import numpy as np
import pandas as pd
import torch

from capo_verl.compat.advantage import record_step_metrics, register_batch_aware_adv_est
from capo_verl.metrics import capo_step_metrics

logger = logging.getLogger("capo_verl")

__all__ = [
    "CapoConfig",
    "sequence_mean",
    "group_ids",
    "capo_pairwise_advantages",
    "reference_ppl_mask",
    "compute_capo_outcome_advantage",
    "compute_grpo_mask_outcome_advantage",
]

NORMALIZE_MODES = ("none", "group")


@dataclass(frozen=True)
class CapoConfig:
    """``algorithm.capo`` of a verl config. Defaults are the paper's Qwen2.5-Math-1.5B settings.

    Attributes:
        tau: temperature of the logistic surrogate phi_tau (Eq. 12); > 0. Paper: 0.6 (1.5B), 0.5 (7B).
        ref_high: PPL threshold above which a *correct* response is masked (Eq. 18); > 0.
        ref_low: PPL threshold below which an *incorrect* response is masked (Eq. 18); > 0.
        use_mask: apply the reference-PPL noise mask (needs ``ref_log_prob``; turns the reference pass on).
        normalize: ``"none"`` (Eq. 14 as written: plain sums) or ``"group"`` (divide by group size G).
        reward_threshold: a response is correct iff its summed reward is > this (0/1 and +-1 both work).
    """

    tau: float = 0.6
    ref_high: float = 2.5
    ref_low: float = 1.05
    use_mask: bool = True
    normalize: str = "none"
    reward_threshold: float = 0.5

    def __post_init__(self):
        for key in ("tau", "ref_high", "ref_low"):
            value = getattr(self, key)
            if not isinstance(value, (int, float)) or not np.isfinite(value) or value <= 0:
                raise ValueError(
                    f"algorithm.capo.{key} must be a positive number, got {value!r}; "
                    f"set e.g. +algorithm.capo.{key}={getattr(CapoConfig, key)}"
                )
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
                or an invalid value.
        """
        if config is None:
            section = None
        elif isinstance(config, Mapping) or hasattr(config, "get"):
            section = config.get("capo", None)
        else:
            section = getattr(config, "capo", None)
        if section is None:
            return cls()
        if not isinstance(section, Mapping):
            try:
                from omegaconf import OmegaConf

                section = OmegaConf.to_container(section, resolve=True)
            except Exception as exc:  # pragma: no cover - defensive
                raise ValueError(f"algorithm.capo must be a mapping, got {type(section).__name__}") from exc
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(section) - known)
        if unknown:
            raise ValueError(
                f"unknown key(s) algorithm.capo.{', algorithm.capo.'.join(unknown)}; valid keys: {sorted(known)}"
            )
        return cls(**{k: section[k] for k in section})


def sequence_mean(values: torch.Tensor, response_mask: torch.Tensor, key: str) -> tuple[torch.Tensor, torch.Tensor]:
    """Mean over each response's valid tokens, accumulated in float32 (e.g. lpm from ``old_log_probs``).

    Args:
        values: ``(bs, response_length)`` per-token log-probs (nats), any float dtype.
        response_mask: ``(bs, response_length)`` 1 for valid tokens (bool/int/float).
        key: the batch key of ``values``, for error messages.

    Returns:
        ``(mean, n_valid)``: ``(bs,)`` float32 mean (0 where a response has no valid token) and
        ``(bs,)`` float32 count of valid tokens.

    Raises:
        ValueError: on a shape mismatch, or a NaN/inf at a valid position (padding is ignored).
    """
    _, n_valid, sums, _ = _row_sweep(response_mask, {key: values})
    return sums[key] / n_valid.clamp_min(1.0), n_valid


#: Rows per block of :func:`_row_sweep` on CPU: a block of every input stays in cache across its row sums.
_CPU_ROW_BLOCK = 256


def _row_sweep(response_mask, masked: dict, rewards=None):
    """Everything CAPO reads from the ``(bs, T)`` tensors, in one cache-friendly sweep over row blocks.

    Args:
        response_mask: ``(bs, T)`` 1 on valid tokens.
        masked: ``{batch key: (bs, T) tensor}`` to sum over valid tokens (float32 accumulation).
        rewards: ``(bs, T)`` tensor to sum over all tokens, or None.

    Returns:
        ``(mask_f32, n_valid, sums, reward_sum)``: a float32 copy of the mask (``(bs, T)``, the caller may
        overwrite it), ``(bs,)`` valid-token counts, ``{key: (bs,) float32 masked row sum}``, ``(bs,)`` float32
        or None.

    Raises:
        ValueError: a shape differs from ``response_mask``'s, or NaN/inf at a valid token.
    """
    shape = response_mask.shape
    for key, x in [*masked.items(), ("token_level_rewards", rewards)]:
        if x is not None and x.shape != shape:
            raise ValueError(f"{key} has shape {tuple(x.shape)} but response_mask {tuple(shape)}")
    bs, device = shape[0], response_mask.device
    mask_f32 = torch.empty(shape, dtype=torch.float32, device=device)
    n_valid = torch.empty(bs, dtype=torch.float32, device=device)
    sums = {key: torch.empty(bs, dtype=torch.float32, device=device) for key in masked}
    reward_sum = None if rewards is None else torch.empty(bs, dtype=torch.float32, device=device)
    block = _CPU_ROW_BLOCK if device.type == "cpu" else max(bs, 1)
    for start in range(0, bs, block):
        rows = slice(start, start + block)
        m = mask_f32[rows]
        m.copy_(response_mask[rows])
        torch.sum(m, -1, out=n_valid[rows])
        for key, x in masked.items():
            # row-wise dot product with the mask: the fastest masked row sum on CPU (benchmarks/capo_speed.py)
            sums[key][rows] = torch.linalg.vecdot(x[rows].to(torch.float32), m)
        if rewards is not None:
            torch.sum(rewards[rows], -1, dtype=torch.float32, out=reward_sum[rows])
    for key, x in masked.items():
        if not torch.isfinite(sums[key]).all():
            # NaN * 0 is NaN: re-sum ignoring padding before deciding the input is bad.
            sums[key] = torch.where(mask_f32.bool(), x.to(torch.float32), 0.0).sum(-1)
            bad = ~torch.isfinite(sums[key])
            if bad.any():
                rows_bad = bad.nonzero().flatten()[:5].tolist()
                raise ValueError(
                    f"{key} has NaN or inf at valid tokens of {int(bad.sum())} response(s) (rows {rows_bad}...); "
                    f"check the log-prob computation that produced {key}"
                )
    return mask_f32, n_valid, sums, reward_sum


def group_ids(index, bs: int) -> tuple[np.ndarray, int]:
    """Dense group ids ``(bs,)`` int64 in [0, n_groups) from verl's ``uid`` array (any hashables).

    Hash-based (``pandas.factorize``): O(bs), in order of first appearance.

    Raises:
        ValueError: if ``index`` is None, its length is not ``bs``, or an entry is None/NaN.
    """
    if index is None:
        raise ValueError(
            "capo needs the group id of every response: non_tensor_batch['uid'] (the `index` argument) is "
            "missing. verl's trainer sets it (one uid per prompt, repeated rollout.n times); when calling "
            "directly pass index=<array of one id per response>"
        )
    index = np.asarray(index)
    if index.shape != (bs,):
        raise ValueError(f"uid/index has shape {index.shape}, expected ({bs},): one group id per response")
    gid, keys = pd.factorize(index)
    if (gid < 0).any():
        raise ValueError(f"uid/index has None or NaN at rows {np.flatnonzero(gid < 0)[:5].tolist()}; every response needs a uid")
    return gid.astype(np.int64, copy=False), len(keys)


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
    order = torch.argsort(gid, stable=True)
    sizes = torch.bincount(gid, minlength=n_groups)
    g_max = int(sizes.max()) if bs else 0
    starts = torch.cumsum(sizes, 0) - sizes
    g_sorted = gid[order]
    slot = torch.arange(bs, device=device) - starts[g_sorted]

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


def reference_ppl_mask(ref_ppl: torch.Tensor, correct: torch.Tensor, ref_high: float, ref_low: float) -> torch.Tensor:
    """The noise mask m(o) of Eq. 18.

    Args:
        ref_ppl: ``(bs,)`` reference-model perplexity ``exp(-mean ref_log_prob)`` (>= 1 for real models).
        correct: ``(bs,)`` bool.
        ref_high, ref_low: thresholds (perplexity units).

    Returns:
        ``(bs,)`` bool, False where the response's advantage is dropped: correct with PPL_ref > ref_high,
        or incorrect with PPL_ref < ref_low.
    """
    return torch.where(correct, ref_ppl <= ref_high, ref_ppl >= ref_low)


_warned_rollout_log_probs = False


def _behaviour_log_probs(old_log_probs, rollout_log_probs):
    global _warned_rollout_log_probs
    if old_log_probs is not None:
        return old_log_probs, "old_log_probs"
    if rollout_log_probs is not None:
        if not _warned_rollout_log_probs:
            _warned_rollout_log_probs = True
            logger.warning("capo: old_log_probs absent from the batch; using rollout_log_probs for lpm")
        return rollout_log_probs, "rollout_log_probs"
    raise ValueError(
        "capo needs per-token log-probs of the responses for lpm: the batch has neither 'old_log_probs' nor "
        "'rollout_log_probs'. verl computes old_log_probs in the trainer's old_log_prob step; when calling "
        "directly pass old_log_probs=(bs, response_length) tensor (or set "
        "actor_rollout_ref.rollout.calculate_log_probs=true for rollout_log_probs)"
    )


def _require_ref_log_prob(ref_log_prob, estimator):
    if ref_log_prob is None:
        raise ValueError(
            f"{estimator} with algorithm.capo.use_mask=true needs 'ref_log_prob' (reference-model log-probs) in "
            "the batch, and it is missing. In verl's trainer capo-verl turns the reference pass on by itself; if "
            "you disabled it, configure actor_rollout_ref.ref, or set algorithm.capo.use_mask=false to train "
            "without the noise mask (when calling directly, pass ref_log_prob=(bs, response_length))"
        )


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
    log_probs, lp_key = _behaviour_log_probs(old_log_probs, rollout_log_probs)

    if cfg.use_mask:
        _require_ref_log_prob(ref_log_prob, "capo")
    masked = {lp_key: log_probs}
    if ref_log_prob is not None:
        masked["ref_log_prob"] = ref_log_prob
    # out: a float32 copy of the mask, overwritten in place by the advantages at the end.
    out, n_valid, sums, score = _row_sweep(response_mask, masked, token_level_rewards)
    lpm = sums[lp_key] / n_valid.clamp_min(1.0)
    valid = n_valid > 0
    correct = score > cfg.reward_threshold
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


@register_batch_aware_adv_est(
    "grpo_mask",
    batch_keys=("ref_log_prob",),
    needs_reference_policy=lambda algorithm: CapoConfig.from_algorithm_config(algorithm).use_mask,
)
def compute_grpo_mask_outcome_advantage(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    index: np.ndarray | None = None,
    config=None,
    ref_log_prob: torch.Tensor | None = None,
    **kwargs,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Ablation "GRPO + mask" (paper appendix): verl's GRPO advantage times the noise mask of Eq. 18.

    GRPO's advantage comes from verl's ``core_algos.compute_grpo_outcome_advantage`` with
    ``algorithm.norm_adv_by_std_in_grpo`` (default true; the paper's Dr. GRPO baseline sets false).
    The mask uses ``algorithm.capo.{ref_high, ref_low, use_mask, reward_threshold}``.

    Args/returns/raises: as :func:`compute_capo_outcome_advantage` (no lpm is needed).
    """
    from verl.trainer.ppo import core_algos

    cfg = CapoConfig.from_algorithm_config(config)
    group_ids(index, token_level_rewards.shape[0])  # validates uid
    norm_by_std = True if config is None else bool(config.get("norm_adv_by_std_in_grpo", True))
    advantages, _ = core_algos.compute_grpo_outcome_advantage(
        token_level_rewards=token_level_rewards,
        response_mask=response_mask,
        index=index,
        norm_adv_by_std_in_grpo=norm_by_std,
    )
    if cfg.use_mask:
        correct = token_level_rewards.sum(-1, dtype=torch.float32) > cfg.reward_threshold  # R_i > threshold
        _require_ref_log_prob(ref_log_prob, "grpo_mask")
        ref_ppl = torch.exp(-sequence_mean(ref_log_prob, response_mask, "ref_log_prob")[0])
        keep = reference_ppl_mask(ref_ppl, correct, cfg.ref_high, cfg.ref_low)
        advantages = advantages * keep.unsqueeze(-1)
        valid = response_mask.sum(-1) > 0
        for name, sel in (("correct", correct & valid), ("incorrect", ~correct & valid)):
            if sel.any():
                record_step_metrics({f"capo/mask_frac_{name}": float((~keep[sel]).float().mean())})
    return advantages, advantages
