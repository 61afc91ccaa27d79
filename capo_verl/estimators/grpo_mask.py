"""The paper's "GRPO + mask only" ablation (appendix), registered with verl as ``grpo_mask``: GRPO's advantage
times CAPO's reference-PPL noise mask (Eq. 18). Reads ``algorithm.capo.{ref_high, ref_low, use_mask,
reward_threshold}`` and ``algorithm.norm_adv_by_std_in_grpo``. Nothing here imports verl; the function declares its
registration (:func:`~capo_verl.estimators.registry.register_estimator`).
"""

from __future__ import annotations

import numpy as np
import torch

from capo_verl.estimators.capo import MASK_SUMMARY, CapoConfig, check_mask_thresholds, mask_keys_unread, uses_noise_mask
from capo_verl.estimators.common import (
    _grpo_group_advantages,
    noise_mask,
    norm_adv_by_std,
    read_batch,
    record_step_metrics,
)
from capo_verl.estimators.registry import register_estimator

__all__ = ["compute_grpo_mask_outcome_advantage"]


def _unread_keys(cfg: CapoConfig) -> dict[str, tuple[str, str]]:
    """``algorithm.capo`` keys grpo_mask does not read: CAPO's ranking keys (``tau``, ``normalize``), and the
    thresholds with the mask off."""
    ranking = ("grpo_mask ranks no pairs (its advantage is GRPO's times the mask)", "set algorithm.adv_estimator=capo")
    return {"tau": ranking, "normalize": ranking, **mask_keys_unread(cfg)}


@register_estimator(
    "grpo_mask",
    batch_keys=("ref_log_prob",),
    section="capo",
    config_class=CapoConfig,
    needs_reference_policy=uses_noise_mask,
    unread_keys=_unread_keys,
    check_config=check_mask_thresholds,
    trains_without_kl=True,  # the paper's recipe, as CAPO's
    summary_metrics=MASK_SUMMARY,
)
def compute_grpo_mask_outcome_advantage(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    index: np.ndarray | None = None,
    config=None,
    ref_log_prob: torch.Tensor | None = None,
    **kwargs,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Ablation "GRPO + mask" (paper appendix): GRPO's advantage times the noise mask of Eq. 18.

    GRPO's advantage is :func:`~capo_verl.estimators.common.grpo_group_advantages` with
    ``algorithm.norm_adv_by_std_in_grpo`` (default true; the paper's Dr. GRPO baseline sets false): equal to verl's
    ``core_algos.compute_grpo_outcome_advantage`` (up to one float32 rounding of a group's std, rarely) except that a
    group whose rewards are all equal gets exactly 0. The mask uses ``algorithm.capo.{ref_high, ref_low, use_mask,
    reward_threshold}``. Records ``capo/mask_frac_correct`` and ``capo/mask_frac_incorrect`` (the ``capo/*`` calibration
    metrics are added by ``capo_verl.compat`` from the batch, as for any estimator).

    Args:
        token_level_rewards: ``(bs, response_length)`` rewards; R_i is their sum (float32).
        response_mask: ``(bs, response_length)`` 1 on valid response tokens.
        index: ``(bs,)`` group id (verl ``uid``) per response.
        config: verl's algorithm config.
        ref_log_prob: ``(bs, response_length)`` reference-model log-probs (nats); needed when use_mask.

    Returns:
        ``(advantages, returns)``: the same ``(bs, response_length)`` float32 tensor, 0 on padding.

    Raises:
        ValueError: missing ``uid`` or ``ref_log_prob`` (mask on), NaN/inf in ``ref_log_prob``, or an invalid
            ``algorithm.capo`` value; each message names the key and the fix.
    """
    cfg = CapoConfig.from_algorithm_config(config)
    batch = read_batch(
        "grpo_mask", token_level_rewards, response_mask, index, cfg.reward_threshold,
        need_lpm=False, ref_log_prob=ref_log_prob if cfg.use_mask else None, need_ref=cfg.use_mask,
    )  # fmt: skip
    adv = _grpo_group_advantages(batch.score, batch.gid, batch.n_groups, norm_adv_by_std(config))  # read_batch's
    if cfg.use_mask:
        keep = noise_mask(batch.ref_ppl, batch.correct, cfg.ref_high, cfg.ref_low)  # ref_ppl checked by read_batch
        adv = adv * keep
        for name, sel in (("correct", batch.correct & batch.valid), ("incorrect", ~batch.correct & batch.valid)):
            if sel.any():
                record_step_metrics({f"capo/mask_frac_{name}": float((~keep[sel]).float().mean())})
    advantages = batch.broadcast(adv)
    return advantages, advantages
