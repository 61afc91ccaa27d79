"""CoDaPO's confidence- and difficulty-weighted GRPO advantage (CoDaWeighting), registered with verl as ``codapo``.

Source: Zhou et al. 2025, "CoDaPO: Confidence and Difficulty-Adaptive Policy Optimization"; the authors' code,
tmlr-group/CoDaPO at commit 210c2051f54de76fdf92eb4cef9bb919dd404789,
``alphaapollo/core/generation/verl/trainer/ppo/core_algos.py::compute_codapo_advantage`` (a verl 0.3 fork), called
from ``codapo/ray_trainer.py::compute_advantage`` with ``log_probs=old_log_probs``.

For one question (one verl ``uid`` group) with responses o_1..o_G, outcome R_i (summed ``token_level_rewards``)
and lpm_i (mean token log-prob of o_i under the behaviour policy, nats; 0 for a response with no valid token):

    A_i      = (R_i - mean R) / (std R + 1e-6)       GRPO (torch.std, unbiased); R_i - mean R without
                                                     algorithm.norm_adv_by_std_in_grpo; a lone response:
                                                     mean 0, std 1 (as verl's GRPO); a group whose R are
                                                     all equal: exactly 0
    p        = fraction of the group that is correct (R_i > reward_threshold)
    d_weight = 4 p (1 - p)                           the authors' 1 - 4 (d - 0.5)^2 with difficulty d = 1 - p
    c        = exp(mean_i lpm_i)                     the group's confidence
    A_i     <- A_i * (c * d_weight + weight_offset)   weight_offset 0.1

Differences from the authors' code: a response is correct iff R_i > ``reward_threshold`` (the rule of every
capo-verl estimator) where the authors count ``R_i == 1.0``; everything is vectorised in float32 (the authors
loop in Python, c in float64). CoDaPO's resampling (CoDaSampling / CoDaLearning: every batch used twice, the
second time only its top-quarter questions by weight, each repeated 4 times; ``codapo/ray_trainer.py``) is not
part of this estimator: verl 0.9.1 has no public hook through which the advantage step can choose the next
step's prompts (docs/algorithms/codapo.md, "Resampling is not implemented"). Nothing here imports verl;
``capo_verl.compat.methods`` registers :func:`compute_codapo_outcome_advantage`.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from capo_verl.estimators.common import (
    check_number,
    grpo_group_advantages,
    norm_adv_by_std,
    read_batch,
    read_config_section,
    record_step_metrics,
)

__all__ = ["CodapoConfig", "codapo_group_weights", "codapo_advantages", "compute_codapo_outcome_advantage"]

_NOT_IMPLEMENTED = (
    "CoDaPO's resampling (CoDaSampling/CoDaLearning) is not implemented in capo-verl: verl 0.9.1 offers no public "
    "hook to choose the next step's prompts from this step's weights; the codapo estimator applies CoDaWeighting "
    "only (docs/algorithms/codapo.md, section 'Resampling is not implemented'). Remove this key."
)


@dataclass(frozen=True)
class CodapoConfig:
    """``algorithm.codapo`` of a verl config; defaults are the authors' (tmlr-group/CoDaPO).

    Attributes:
        weight_offset: added to c * 4p(1-p), so every question keeps a minimum learning signal; a finite number
            >= 0. Authors: 0.1 (``algorithm.codapo.weight_offset``).
        reward_threshold: a response is correct iff its summed reward is > this; a finite number.
    """

    weight_offset: float = 0.1
    reward_threshold: float = 0.5

    def __post_init__(self):
        offset = check_number("codapo", "weight_offset", self.weight_offset, CodapoConfig.weight_offset)
        if offset < 0:
            raise ValueError(
                f"algorithm.codapo.weight_offset must be >= 0, got {offset!r}: a negative weight would flip the sign "
                "of a group's advantages; the authors use 0.1"
            )
        check_number("codapo", "reward_threshold", self.reward_threshold, CodapoConfig.reward_threshold)

    @classmethod
    def from_algorithm_config(cls, config) -> CodapoConfig:
        """Read ``config.codapo`` from verl's algorithm config (DictConfig, dict, dataclass or None).

        Raises:
            ValueError: an unknown key under ``algorithm.codapo`` (``percentile``/``repeat_count`` with the reason
                resampling is absent) or an invalid value; each message names the key.
        """
        return read_config_section(
            cls, config, "codapo", {"percentile": _NOT_IMPLEMENTED, "repeat_count": _NOT_IMPLEMENTED}
        )


def _group_mean(x: torch.Tensor, gid: torch.Tensor, sizes: torch.Tensor) -> torch.Tensor:
    """``(n_groups,)`` float32 mean of ``x`` ``(bs,)`` over each group."""
    sums = torch.zeros(sizes.shape[0], dtype=torch.float32, device=x.device).index_add_(0, gid, x.to(torch.float32))
    return sums / sizes.clamp_min(1).to(torch.float32)


def codapo_group_weights(
    lpm: torch.Tensor, correct: torch.Tensor, gid: torch.Tensor, n_groups: int, weight_offset: float = 0.1
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """CoDaWeighting: one weight per question, ``c * 4 p (1 - p) + weight_offset``.

    Args:
        lpm: ``(bs,)`` float mean token log-prob (nats) of each response under the behaviour policy (0 for a
            response without valid tokens, which still counts in its group's mean, as in the authors' code).
        correct: ``(bs,)`` bool.
        gid: ``(bs,)`` int64 dense group ids in [0, n_groups); groups may be ragged and interleaved.
        n_groups: number of groups.
        weight_offset: the floor added to every weight.

    Returns:
        ``(weight, confidence, difficulty_weight)``, each ``(n_groups,)`` float32: the weight, c = exp(mean lpm)
        (a probability-like number in (0, 1]) and 4 p (1 - p) in [0, 1].

    Source: tmlr-group/CoDaPO ``compute_codapo_advantage`` (``weight = c_weight * d_weight + weight_offset``).
    """
    sizes = torch.bincount(gid, minlength=n_groups)
    p = _group_mean(correct, gid, sizes)
    difficulty_weight = 4.0 * p * (1.0 - p)
    confidence = torch.exp(_group_mean(lpm, gid, sizes))
    return confidence * difficulty_weight + weight_offset, confidence, difficulty_weight


def codapo_advantages(
    scores: torch.Tensor,
    lpm: torch.Tensor,
    correct: torch.Tensor,
    gid: torch.Tensor,
    n_groups: int,
    norm_by_std: bool = True,
    weight_offset: float = 0.1,
    epsilon: float = 1e-6,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """CoDaPO's sequence advantage ``A_i * (c * 4p(1-p) + weight_offset)`` with A_i GRPO's.

    Args:
        scores: ``(bs,)`` float32 outcome R_i.
        lpm, correct, gid, n_groups, weight_offset: as :func:`codapo_group_weights`.
        norm_by_std: divide GRPO's centred reward by the group std (``algorithm.norm_adv_by_std_in_grpo``).
        epsilon: added to the std (GRPO's 1e-6).

    Returns:
        ``(advantage (bs,), weight, confidence, difficulty_weight (n_groups,))``, float32.
    """
    weight, confidence, difficulty_weight = codapo_group_weights(lpm, correct, gid, n_groups, weight_offset)
    adv = grpo_group_advantages(scores.to(torch.float32), gid, n_groups, norm_by_std, epsilon) * weight[gid]
    return adv, weight, confidence, difficulty_weight


def compute_codapo_outcome_advantage(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    index: np.ndarray | None = None,
    config=None,
    old_log_probs: torch.Tensor | None = None,
    rollout_log_probs: torch.Tensor | None = None,
    **kwargs,
) -> tuple[torch.Tensor, torch.Tensor]:
    """CoDaPO advantages for ``algorithm.adv_estimator=codapo`` (see the module docstring for the formula).

    verl's ``compute_advantage`` calls this (registered by :mod:`capo_verl.compat.methods`, which forwards
    ``old_log_probs`` and ``rollout_log_probs``). Records the batch's ``capo/*`` calibration metrics (correctness by
    ``algorithm.codapo.reward_threshold``) and ``codapo/weight_mean``, ``codapo/weight_max``,
    ``codapo/confidence_mean``, ``codapo/difficulty_weight_mean`` (means over the batch's questions) for the step's
    metrics.

    Args:
        token_level_rewards: ``(bs, response_length)`` rewards; R_i is their sum.
        response_mask: ``(bs, response_length)`` 1 on valid response tokens.
        index: ``(bs,)`` group id (verl ``uid``) per response.
        config: verl's algorithm config: ``codapo`` section (:class:`CodapoConfig`) and
            ``norm_adv_by_std_in_grpo`` (default true, as in verl's and the authors' GRPO).
        old_log_probs: ``(bs, response_length)`` behaviour-policy log-probs (nats), the confidence source.
        rollout_log_probs: ``(bs, response_length)``, used only when ``old_log_probs`` is None (logged once).

    Returns:
        ``(advantages, returns)``: the same ``(bs, response_length)`` float32 tensor, the sequence advantage
        broadcast over valid tokens and 0 on padding.

    Raises:
        ValueError: missing ``uid`` or log-probs, NaN/inf in a used log-prob, or an invalid ``algorithm.codapo``
            value; each message names the key and the fix.
    """
    cfg = CodapoConfig.from_algorithm_config(config)
    batch = read_batch(
        "codapo", token_level_rewards, response_mask, index, cfg.reward_threshold,
        old_log_probs=old_log_probs, rollout_log_probs=rollout_log_probs,
    )  # fmt: skip
    adv, weight, confidence, difficulty_weight = codapo_advantages(
        batch.score, batch.lpm, batch.correct, batch.gid, batch.n_groups, norm_adv_by_std(config), cfg.weight_offset
    )
    metrics = batch.calibration_metrics(adv)
    if batch.n_groups:
        metrics.update(
            {
                "codapo/weight_mean": float(weight.mean()),
                "codapo/weight_max": float(weight.max()),
                "codapo/confidence_mean": float(confidence.mean()),
                "codapo/difficulty_weight_mean": float(difficulty_weight.mean()),
            }
        )
    record_step_metrics(metrics)
    advantages = batch.broadcast(adv)
    return advantages, advantages
