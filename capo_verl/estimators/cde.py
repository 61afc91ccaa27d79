"""CDE's actor-curiosity bonus on GRPO's reward, registered with verl as ``cde``.

Source: Dai et al. 2025, "CDE: Curiosity-Driven Exploration for Efficient Reinforcement Learning in Large
Language Models" (arXiv 2509.09675), Eqs. 1-2 (the actor-side bonus and its clipped use in the reward). The
authors released no code; this follows the paper's equations.

For one question (one verl ``uid`` group) with responses o_1..o_G:

    B_i  = -lpm_i = -(1/|o_i|) sum_t log pi_old(o_{i,t} | q, o_{i,<t})    log-perplexity of o_i (nats, >= 0) under
                                                                         the behaviour policy (``old_log_probs``)
    R_i  = +1 if o_i is correct (summed reward > reward_threshold), else -1
    R~_i = R_i + w_t * min(|R_i| / kappa, alpha * B_i)                    kappa 3, alpha 1
    A_i  = (R~_i - mean R~) / (std R~ + 1e-6)                            GRPO within the group (torch.std, unbiased;
                                                                         R~_i - mean R~ without
                                                                         algorithm.norm_adv_by_std_in_grpo); exactly
                                                                         0 in a group whose R~ are all equal (e.g.
                                                                         one outcome, every bonus at the cap)

Within one outcome a higher-perplexity response gets the larger shaped reward: among right answers the bonus favours
the less likely ones (diversity); among wrong answers the confident ones end up lowest (the paper's "penalises
overconfident errors"). The cap keeps the bonus at most |R| / kappa = 1/3 of the reward, so for w_t < 6 a wrong
answer's shaped reward stays below every right answer's.

``w_t`` is a step schedule (the paper's "staircase"): ``w0`` for training steps ``t <= w_zero_after_step``, 0
after (never 0 when ``w_zero_after_step`` is None). t is verl's ``trainer.global_steps`` (1 for the first update),
which verl restores from the checkpoint on resume, so a resumed run continues the schedule.

Differences from the paper: the paper assumes rewards in {+1, -1}; capo-verl's reward is 0/1, with which a wrong
answer (|R| = 0) would get no bonus at all, so correctness is mapped to +-1 first. With ``w_t = 0`` this is
GRPO on +-1 rewards: the same advantages as GRPO on 0/1 rewards when normalised by the std (up to the 1e-6), and
twice Dr. GRPO's without (a lone response in its group keeps its reward, as in verl's GRPO: -1 instead of 0).
CDE's critic-side bonus (variance of a multi-head critic, PPO only) is not implemented.

``w_zero_after_step`` needs verl's v1 trainer (``trainer.use_v1=true``): the legacy trainer does not hand the step to
the advantage step, and capo-verl's ``validate_config`` check refuses that combination before anything starts.
Nothing here imports verl; :func:`compute_cde_outcome_advantage` declares its registration
(:func:`~capo_verl.estimators.registry.register_estimator`), which ``capo_verl.compat.methods`` makes with verl.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from capo_verl.estimators.common import (
    _grpo_group_advantages,
    check_constant,
    check_groups,
    check_log_prob_means,
    check_number,
    check_positive,
    check_rows,
    norm_adv_by_std,
    read_batch,
    read_config_section,
    record_step_metrics,
)
from capo_verl.estimators.registry import register_estimator

__all__ = ["CdeConfig", "cde_bonus_weight", "cde_shaped_rewards", "cde_advantages", "compute_cde_outcome_advantage"]


@dataclass(frozen=True)
class CdeConfig:
    """``algorithm.cde`` of a verl config.

    Attributes:
        w0: bonus weight while the bonus is on; a finite number >= 0 (0 turns CDE into GRPO on +-1 rewards).
        w_zero_after_step: the last training step with weight ``w0``; from the next step on the weight is 0. A
            non-negative integer, or None for a constant ``w0``.
        kappa: the bonus is capped at ``|R| / kappa``; > 0. Paper: 3.
        alpha: scale of the log-perplexity inside the cap; > 0. Paper: 1.
        reward_threshold: a response is correct iff its summed reward is > this; a finite number.
    """

    w0: float = 1.0
    w_zero_after_step: int | None = None
    kappa: float = 3.0
    alpha: float = 1.0
    reward_threshold: float = 0.5

    def __post_init__(self):
        if check_number("cde", "w0", self.w0, CdeConfig.w0) < 0:
            raise ValueError(f"algorithm.cde.w0 must be >= 0, got {self.w0!r} (a negative weight rewards confidence)")
        step = self.w_zero_after_step
        if step is not None and (isinstance(step, bool) or not isinstance(step, int) or step < 0):
            raise ValueError(
                "algorithm.cde.w_zero_after_step must be a non-negative integer (the last training step with the "
                f"bonus) or null (the bonus throughout), got {step!r}; set e.g. algorithm.cde.w_zero_after_step=null"
            )
        check_positive("cde", "kappa", self.kappa, CdeConfig.kappa)
        check_positive("cde", "alpha", self.alpha, CdeConfig.alpha)
        check_number("cde", "reward_threshold", self.reward_threshold, CdeConfig.reward_threshold)

    @classmethod
    def from_algorithm_config(cls, config) -> CdeConfig:
        """Read ``config.cde`` from verl's algorithm config (DictConfig, dict, dataclass or None).

        Raises:
            ValueError: an unknown key under ``algorithm.cde`` or an invalid value; each message names the key.
        """
        return read_config_section(cls, config, "cde")


def check_schedule_trainer(config, cde: CdeConfig) -> None:
    """CDE's ``check_config``: ValueError naming ``algorithm.cde.w_zero_after_step`` with ``trainer.use_v1=false``,
    whose trainer (``verl/trainer/ppo/ray_trainer.py``) never passes the training step: the schedule would fail."""
    if cde.w_zero_after_step is not None and (config.get("trainer") or {}).get("use_v1") is False:
        raise ValueError(
            f"algorithm.cde.w_zero_after_step={cde.w_zero_after_step} (the bonus schedule) needs verl's v1 trainer "
            "(with trainer.use_v1=false the legacy trainer does not pass the training step to the advantage "
            "estimator, and the first update would stop); set trainer.use_v1=true, or "
            "algorithm.cde.w_zero_after_step=null for a constant bonus weight"
        )


def cde_bonus_weight(step: int, w0: float, w_zero_after_step: int | None) -> float:
    """The staircase schedule: ``w0`` for training steps ``step <= w_zero_after_step`` (or always, if None), else 0.

    Args:
        step: verl's ``trainer.global_steps`` of the update (1-based).
    """
    return float(w0) if w_zero_after_step is None or step <= w_zero_after_step else 0.0


def cde_shaped_rewards(
    outcome: torch.Tensor, bonus: torch.Tensor, w: float, kappa: float = 3.0, alpha: float = 1.0
) -> torch.Tensor:
    """CDE's reward with the actor bonus, ``R + w * min(|R| / kappa, alpha * B)`` (arXiv 2509.09675, Eq. 2).

    Args:
        outcome: ``(bs,)`` float32 reward R (+-1 in CDE).
        bonus: ``(bs,)`` float32 log-perplexity B = -lpm (nats, >= 0).
        w: bonus weight of this step; a finite number >= 0 (``algorithm.cde.w0``'s range).
        kappa, alpha: the cap's constants; finite numbers > 0 (paper: 3 and 1).

    Returns:
        ``(bs,)`` float32 shaped reward.

    Raises:
        TypeError: ``outcome`` or ``bonus`` not a ``torch.Tensor``.
        EstimatorInputError: ``outcome`` or ``bonus`` not a real ``(bs,)`` tensor of one length
            (:func:`~.common.check_rows`); ``w``, ``kappa`` or ``alpha`` outside its range
            (:func:`~.common.check_constant`).
    """
    check_rows("cde_shaped_rewards", outcome=outcome, bonus=bonus)
    w, kappa, alpha = _check_cde_constants("cde_shaped_rewards", w, kappa, alpha)
    return _shaped_rewards(outcome, bonus, w, kappa, alpha)


def _shaped_rewards(outcome, bonus, w: float, kappa: float, alpha: float) -> torch.Tensor:
    return outcome + w * torch.minimum(outcome.abs() / kappa, alpha * bonus)


def _check_cde_constants(fn: str, w, kappa, alpha) -> tuple[float, float, float]:
    """``(w, kappa, alpha)`` as floats in CDE's ranges (arXiv 2509.09675, Eq. 2; ``algorithm.cde``): w >= 0,
    kappa > 0, alpha > 0, all finite; else :class:`~.common.EstimatorInputError` naming the constant."""
    return (
        check_constant(fn, "w", w, 0.0, hint="a negative weight rewards confidence (algorithm.cde.w0 >= 0)"),
        check_constant(fn, "kappa", kappa, 0.0, low_open=True, hint="the bonus cap is |R| / kappa; the paper uses 3"),
        check_constant(fn, "alpha", alpha, 0.0, low_open=True, hint="the paper uses 1"),
    )


def cde_advantages(
    correct: torch.Tensor,
    lpm: torch.Tensor,
    gid: torch.Tensor,
    n_groups: int,
    w: float,
    kappa: float = 3.0,
    alpha: float = 1.0,
    norm_by_std: bool = True,
    epsilon: float = 1e-6,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """GRPO advantage of CDE's shaped reward, with correctness mapped to R = +-1.

    Args:
        correct: ``(bs,)`` bool.
        lpm: ``(bs,)`` float mean token log-prob (nats) under the behaviour policy; B = -lpm.
        gid: ``(bs,)`` int64 dense group ids in [0, n_groups); groups may be ragged and interleaved.
        n_groups: number of groups.
        w, kappa, alpha: as :func:`cde_shaped_rewards` (w >= 0, kappa > 0, alpha > 0, finite).
        norm_by_std: divide by the group std (``algorithm.norm_adv_by_std_in_grpo``).
        epsilon: added to the std (GRPO's 1e-6); a finite number >= 0.

    Returns:
        ``(advantage, shaped_reward, bonus)``, each ``(bs,)`` float32.

    Raises:
        TypeError: ``correct``, ``lpm`` or ``gid`` not a ``torch.Tensor``.
        EstimatorInputError: ``correct`` not bool, ``lpm`` not real (complex), ``gid`` not integer, or one of them not
            ``(bs,)`` like the others (:func:`~.common.check_rows`); ``n_groups`` not an integer >= 1 or ``gid``
            outside [0, n_groups) (:func:`~.common.check_groups`); ``lpm`` NaN, inf or above 0 nats
            (:func:`~.common.check_log_prob_means`); ``w``, ``kappa``, ``alpha`` or ``epsilon`` outside its range
            (:func:`~.common.check_constant`).
    """
    check_rows("cde", correct=correct, lpm=lpm, gid=gid)
    n_groups = check_groups("cde", gid, n_groups)
    check_log_prob_means("cde", "lpm", lpm)
    w, kappa, alpha = _check_cde_constants("cde", w, kappa, alpha)
    epsilon = check_constant("cde", "epsilon", epsilon, 0.0, hint="GRPO's is 1e-6")
    return _cde_advantages(correct, lpm, gid, n_groups, w, kappa, alpha, norm_by_std, epsilon)


def _cde_advantages(correct, lpm, gid, n_groups: int, w, kappa, alpha, norm_by_std=True, epsilon=1e-6):
    """:func:`cde_advantages` without its checks, for the batch :func:`read_batch` checked and a parsed config."""
    outcome = torch.where(correct, 1.0, -1.0).to(torch.float32)
    bonus = -lpm.to(torch.float32)
    shaped = _shaped_rewards(outcome, bonus, w, kappa, alpha)
    return _grpo_group_advantages(shaped, gid, n_groups, norm_by_std, epsilon), shaped, bonus


@register_estimator(
    "cde",
    batch_keys=("old_log_probs", "rollout_log_probs"),
    section="cde",
    config_class=CdeConfig,
    needs_training_step=True,
    check_config=check_schedule_trainer,
)
def compute_cde_outcome_advantage(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    index: np.ndarray | None = None,
    config=None,
    old_log_probs: torch.Tensor | None = None,
    rollout_log_probs: torch.Tensor | None = None,
    global_step: int | None = None,
    **kwargs,
) -> tuple[torch.Tensor, torch.Tensor]:
    """CDE advantages for ``algorithm.adv_estimator=cde`` (see the module docstring for the formula).

    verl's ``compute_advantage`` calls this (registered by :mod:`capo_verl.compat.methods`, which forwards
    ``old_log_probs``, ``rollout_log_probs`` and the training step). Records the batch's ``capo/*`` calibration
    metrics (correctness by ``algorithm.cde.reward_threshold``) and ``cde/w`` (the step's weight), ``cde/bonus_mean``
    (mean B, nats), ``cde/bonus_correct_mean``, ``cde/bonus_incorrect_mean``, ``cde/shaped_bonus_mean`` (mean R~ - R)
    and ``cde/bonus_cap_frac`` (fraction of responses whose bonus is capped at |R|/kappa).

    Args:
        token_level_rewards: ``(bs, response_length)`` rewards; their sum decides correctness.
        response_mask: ``(bs, response_length)`` 1 on valid response tokens.
        index: ``(bs,)`` group id (verl ``uid``) per response.
        config: verl's algorithm config: ``cde`` section (:class:`CdeConfig`) and ``norm_adv_by_std_in_grpo``
            (default true).
        old_log_probs: ``(bs, response_length)`` behaviour-policy log-probs (nats), the bonus source.
        rollout_log_probs: ``(bs, response_length)``, used only when ``old_log_probs`` is None (logged once).
        global_step: verl's ``trainer.global_steps`` of this update; needed when ``w_zero_after_step`` is set.

    Returns:
        ``(advantages, returns)``: the same ``(bs, response_length)`` float32 tensor, the sequence advantage
        broadcast over valid tokens and 0 on padding.

    Raises:
        ValueError: missing ``uid``, log-probs or (with a schedule) the training step, NaN/inf in a used log-prob,
            or an invalid ``algorithm.cde`` value; each message names the key and the fix.
    """
    cfg = CdeConfig.from_algorithm_config(config)
    if cfg.w_zero_after_step is None:
        w = float(cfg.w0)
    elif global_step is None:
        raise ValueError(
            "cde needs the training step for its bonus schedule (algorithm.cde.w_zero_after_step="
            f"{cfg.w_zero_after_step}), and none was passed. verl's v1 trainer (trainer.use_v1=true, the default) "
            "passes trainer.global_steps through capo_verl.compat; the legacy trainer does not, so use the v1 "
            "trainer, or set algorithm.cde.w_zero_after_step=null for a constant weight (when calling directly, "
            "pass global_step=<int>)"
        )
    else:
        w = cde_bonus_weight(int(global_step), cfg.w0, cfg.w_zero_after_step)
    batch = read_batch(
        "cde", token_level_rewards, response_mask, index, cfg.reward_threshold,
        old_log_probs=old_log_probs, rollout_log_probs=rollout_log_probs,
    )  # fmt: skip
    correct, valid = batch.correct, batch.valid
    adv, shaped, bonus = _cde_advantages(  # batch checked by read_batch, constants by CdeConfig
        correct, batch.lpm, batch.gid, batch.n_groups, w, cfg.kappa, cfg.alpha, norm_adv_by_std(config)
    )
    metrics = batch.calibration_metrics(adv)
    metrics["cde/w"] = w
    if valid.any():
        b = bonus[valid]
        metrics["cde/bonus_mean"] = float(b.mean())
        metrics["cde/shaped_bonus_mean"] = float((shaped - torch.where(correct, 1.0, -1.0))[valid].mean())
        metrics["cde/bonus_cap_frac"] = float((cfg.alpha * b > 1.0 / cfg.kappa).float().mean())
        for name, sel in (("correct", correct[valid]), ("incorrect", ~correct[valid])):
            if sel.any():
                metrics[f"cde/bonus_{name}_mean"] = float(b[sel].mean())
    record_step_metrics(metrics)
    advantages = batch.broadcast(adv)
    return advantages, advantages
