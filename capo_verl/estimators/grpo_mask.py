"""The paper's "GRPO + mask only" ablation (appendix), registered with verl as ``grpo_mask``: verl's GRPO advantage
times CAPO's reference-PPL noise mask (Eq. 18). Reads ``algorithm.capo.{ref_high, ref_low, use_mask,
reward_threshold}`` and ``algorithm.norm_adv_by_std_in_grpo``.
"""

from __future__ import annotations

import numpy as np
import torch

from capo_verl.compat.advantage import record_step_metrics, register_batch_aware_adv_est
from capo_verl.estimators.capo import CapoConfig, require_ref_log_prob
from capo_verl.estimators.common import correct_mask, group_ids, reference_ppl_mask, sequence_mean

__all__ = ["compute_grpo_mask_outcome_advantage"]


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

    Args:
        token_level_rewards: ``(bs, response_length)`` rewards; R_i is their sum.
        response_mask: ``(bs, response_length)`` 1 on valid response tokens.
        index: ``(bs,)`` group id (verl ``uid``) per response.
        config: verl's algorithm config.
        ref_log_prob: ``(bs, response_length)`` reference-model log-probs (nats); needed when use_mask.

    Returns:
        ``(advantages, returns)``: the same ``(bs, response_length)`` tensor (float32 for float32 rewards).

    Raises:
        ValueError: missing ``uid`` or ``ref_log_prob`` (mask on), NaN/inf in ``ref_log_prob``, or an invalid
            ``algorithm.capo`` value; each message names the key and the fix.
    """
    from verl.trainer.ppo import core_algos

    cfg = CapoConfig.from_algorithm_config(config)
    group_ids(index, token_level_rewards.shape[0], "grpo_mask")  # validates uid
    norm_by_std = True if config is None else bool(config.get("norm_adv_by_std_in_grpo", True))
    advantages, _ = core_algos.compute_grpo_outcome_advantage(
        token_level_rewards=token_level_rewards,
        response_mask=response_mask,
        index=index,
        norm_adv_by_std_in_grpo=norm_by_std,
    )
    if cfg.use_mask:
        correct = correct_mask(token_level_rewards.sum(-1, dtype=torch.float32), cfg.reward_threshold)
        require_ref_log_prob(ref_log_prob, "grpo_mask")
        ref_ppl = torch.exp(-sequence_mean(ref_log_prob, response_mask, "ref_log_prob")[0])
        keep = reference_ppl_mask(ref_ppl, correct, cfg.ref_high, cfg.ref_low)
        advantages = advantages * keep.unsqueeze(-1)
        valid = response_mask.sum(-1) > 0
        for name, sel in (("correct", correct & valid), ("incorrect", ~correct & valid)):
            if sel.any():
                record_step_metrics({f"capo/mask_frac_{name}": float((~keep[sel]).float().mean())})
    return advantages, advantages
