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
loop in Python, c in float64).

CoDaPO's resampling (CoDaSampling / CoDaLearning, ``algorithm.codapo.resample``: every batch used twice, the second
time only its top-quarter questions by weight, each repeated ``repeat_count`` times; ``codapo/ray_trainer.py``) has
its pure parts here: :func:`select_questions` (which questions qualify) and :func:`apply_batch_rows` (the rows of
the second step's batch). verl's trainer is driven by :mod:`capo_verl.compat.codapo_sampling`, which reads the
per-question weights this estimator leaves for it (:func:`pop_question_weights`). Nothing here imports verl;
:func:`compute_codapo_outcome_advantage` declares its registration
(:func:`~capo_verl.estimators.registry.register_estimator`), which ``capo_verl.compat.methods`` makes with verl.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd
import torch

from capo_verl.estimators.common import (
    _grpo_group_advantages,
    check_constant,
    check_finite,
    check_groups,
    check_log_prob_means,
    check_number,
    check_rows,
    norm_adv_by_std,
    read_batch,
    read_config_section,
    record_step_metrics,
)
from capo_verl.estimators.registry import register_estimator

__all__ = [
    "CodapoConfig",
    "apply_batch_rows",
    "codapo_advantages",
    "codapo_group_weights",
    "compute_codapo_outcome_advantage",
    "pop_question_weights",
    "select_questions",
]

#: the per-question weights of the last batch this estimator saw: ``(uids in order of first appearance, weights)``;
#: read and cleared by :func:`pop_question_weights` (capo_verl.compat.codapo_sampling, CoDaPO's resampling).
_QUESTION_WEIGHTS: list[tuple[list, list[float]]] = []


@dataclass(frozen=True)
class CodapoConfig:
    """``algorithm.codapo`` of a verl config; defaults are the authors' (tmlr-group/CoDaPO).

    Attributes:
        weight_offset: added to c * 4p(1-p), so every question keeps a minimum learning signal; a finite number
            >= 0. Authors: 0.1 (``algorithm.codapo.weight_offset``).
        reward_threshold: a response is correct iff its summed reward is > this; a finite number.
        resample: CoDaPO's resampling (CoDaSampling / CoDaLearning): every prompt batch is trained on two
            consecutive steps, the second time only its top questions by weight, each ``repeat_count`` times
            (:mod:`capo_verl.compat.codapo_sampling`). Authors: on whenever ``adv_estimator=codapo``.
        percentile: questions whose weight is >= the ``percentile`` quantile of the batch's weights qualify for the
            second step; in (0, 1). Authors: 0.75 (the top quarter).
        repeat_count: how many times each qualifying question is put in the second step's batch; an integer >= 1.
            Authors: 4 (1 / (1 - percentile): the top quarter, 4 times each, fills the batch).
    """

    weight_offset: float = 0.1
    reward_threshold: float = 0.5
    resample: bool = False
    percentile: float = 0.75
    repeat_count: int = 4

    def __post_init__(self):
        offset = check_number("codapo", "weight_offset", self.weight_offset, CodapoConfig.weight_offset)
        if offset < 0:
            raise ValueError(
                f"algorithm.codapo.weight_offset must be >= 0, got {offset!r}: a negative weight would flip the sign "
                "of a group's advantages; the authors use 0.1"
            )
        check_number("codapo", "reward_threshold", self.reward_threshold, CodapoConfig.reward_threshold)
        if not isinstance(self.resample, bool):
            raise ValueError(
                f"algorithm.codapo.resample must be true or false, got {self.resample!r}; "
                "set algorithm.codapo.resample=true for CoDaPO's resampling"
            )
        percentile = self.percentile
        if isinstance(percentile, bool) or not isinstance(percentile, (int, float)) or not 0 < percentile < 1:
            raise ValueError(
                f"algorithm.codapo.percentile must be a number in (0, 1) (exclusive), got {percentile!r}; "
                "the authors use algorithm.codapo.percentile=0.75 (the top quarter)"
            )
        count = self.repeat_count
        if isinstance(count, bool) or not isinstance(count, int) or count < 1:
            raise ValueError(
                f"algorithm.codapo.repeat_count must be an integer >= 1, got {count!r}; "
                "the authors use algorithm.codapo.repeat_count=4"
            )

    @classmethod
    def from_algorithm_config(cls, config) -> CodapoConfig:
        """Read ``config.codapo`` from verl's algorithm config (DictConfig, dict, dataclass or None).

        Raises:
            ValueError: an unknown key under ``algorithm.codapo`` or an invalid value; each message names the key.
        """
        return read_config_section(cls, config, "codapo")


def select_questions(weights, percentile: float) -> list[int]:
    """CoDaSampling's choice: the questions whose weight is >= the ``percentile`` quantile of the batch's weights.

    Args:
        weights: ``(n_questions,)`` per-question CoDaPO weights (any float sequence), in the order the questions
            first appear in the prepare step's batch.
        percentile: in (0, 1); the authors' 0.75 keeps the top quarter.

    Returns:
        The positions of the qualifying questions, in that order (ties at the threshold all qualify, so there may be
        more than ``(1 - percentile) * n_questions``; never empty, since the largest weight always qualifies).

    Source: tmlr-group/CoDaPO@210c2051 ``codapo/ray_trainer.py`` L1356-1374: ``question_weights =
    torch.tensor(list(uid2avg_weight.values()))`` (float32), ``weight_threshold = torch.quantile(question_weights,
    percentile).item()`` (linear interpolation), ``top_uids = [uid for uid, w in uid2avg_weight.items() if w >=
    weight_threshold]``.

    Raises:
        ValueError: no weights.
    """
    w = torch.as_tensor(list(weights), dtype=torch.float32)
    if w.numel() == 0:
        raise ValueError("CoDaPO resampling: the prepare step's batch has no question to select from")
    threshold = torch.quantile(w, float(percentile)).item()
    return [i for i, x in enumerate(w.tolist()) if x >= threshold]


def apply_batch_rows(selected_rows, batch_size: int, repeat_count: int) -> list[int]:
    """CoDaLearning's batch: the prepare batch's rows that the apply step generates for, in order.

    Each selected question is taken ``repeat_count`` times in turn, from the first; when the selected questions run
    out before ``batch_size`` rows, the authors' loop starts again from the first selected question; the list is
    cut at ``batch_size``. So with fewer qualifying questions than ``batch_size / repeat_count`` a question is
    repeated more than ``repeat_count`` times, and with more, only the first ``batch_size / repeat_count`` are used.

    Args:
        selected_rows: row (prompt) index in the prepare batch of each selected question, in selection order.
        batch_size: prompts per step (``data.train_batch_size``).
        repeat_count: copies of each question per pass, >= 1.

    Returns:
        ``batch_size`` row indices.

    Source: tmlr-group/CoDaPO@210c2051 ``codapo/ray_trainer.py`` L1140-1158 (the ``while len(selected_entity_indices)
    < original_batch_size`` loop, ``selected_entity_indices[:original_batch_size]``), with one row per question (the
    authors match every row holding the question's text: a question twice in one batch gives both rows).

    Raises:
        ValueError: no selected row (the authors' loop would never end), or ``batch_size``/``repeat_count`` < 1.
    """
    rows = [int(r) for r in selected_rows]
    if not rows:
        raise ValueError("CoDaPO resampling: no question was selected for the apply step")
    if batch_size < 1 or repeat_count < 1:
        raise ValueError(f"batch_size ({batch_size}) and repeat_count ({repeat_count}) must be >= 1")
    out: list[int] = []
    q = 0
    while len(out) < batch_size:
        out.extend([rows[q]] * repeat_count)
        q = (q + 1) % len(rows)
    return out[:batch_size]


def pop_question_weights() -> tuple[list, list[float]] | None:
    """The ``(uids, weights)`` of the last batch :func:`compute_codapo_outcome_advantage` weighted (uids in order
    of first appearance in the batch, one float weight each), or None if it ran on no batch since the last call.
    Clears them."""
    out = _QUESTION_WEIGHTS[-1] if _QUESTION_WEIGHTS else None
    _QUESTION_WEIGHTS.clear()
    return out


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
        weight_offset: the floor added to every weight; a finite number >= 0 (``algorithm.codapo.weight_offset``'s
            range: the authors' 0.1 is a minimum learning signal, and a negative one flips a group's advantages).

    Returns:
        ``(weight, confidence, difficulty_weight)``, each ``(n_groups,)`` float32: the weight, c = exp(mean lpm)
        (a probability-like number in (0, 1]) and 4 p (1 - p) in [0, 1].

    Raises:
        TypeError: ``lpm``, ``correct`` or ``gid`` not a ``torch.Tensor``.
        EstimatorInputError: ``lpm`` not real (complex), ``correct`` not bool, ``gid`` not integer, or one of them not
            ``(bs,)`` like the others (:func:`~.common.check_rows`); ``n_groups`` not an integer >= 1 or ``gid``
            outside [0, n_groups) (:func:`~.common.check_groups`); ``lpm`` NaN, inf or above 0 nats
            (:func:`~.common.check_log_prob_means`: its confidence exp(lpm) would be NaN or exceed 1);
            ``weight_offset`` not a finite number >= 0 (:func:`~.common.check_constant`).

    Source: tmlr-group/CoDaPO ``compute_codapo_advantage`` (``weight = c_weight * d_weight + weight_offset``).
    """
    check_rows("codapo", lpm=lpm, correct=correct, gid=gid)
    n_groups = check_groups("codapo", gid, n_groups)
    check_log_prob_means("codapo", "lpm", lpm)
    weight_offset = _check_weight_offset(weight_offset)
    return _codapo_group_weights(lpm, correct, gid, n_groups, weight_offset)


def _check_weight_offset(weight_offset) -> float:
    hint = "a negative one flips a group's advantages; the authors use 0.1"
    return check_constant("codapo", "weight_offset", weight_offset, 0.0, hint=hint)


def _codapo_group_weights(lpm, correct, gid, n_groups: int, weight_offset: float):
    """:func:`codapo_group_weights` without its checks, for the batch :func:`read_batch` checked."""
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
        epsilon: added to the std (GRPO's 1e-6); a finite number >= 0.

    Returns:
        ``(advantage (bs,), weight, confidence, difficulty_weight (n_groups,))``, float32.

    Raises:
        TypeError, EstimatorInputError: as :func:`codapo_group_weights`; and ``scores`` not a real ``(bs,)`` tensor
            like the others (:func:`~.common.check_rows`) or with NaN/inf (:func:`~.common.check_finite`), or
            ``epsilon`` not a finite number >= 0.
    """
    check_rows("codapo", scores=scores, lpm=lpm, correct=correct, gid=gid)
    n_groups = check_groups("codapo", gid, n_groups)
    check_finite("codapo", "scores", scores)
    check_log_prob_means("codapo", "lpm", lpm)
    weight_offset = _check_weight_offset(weight_offset)
    epsilon = check_constant("codapo", "epsilon", epsilon, 0.0, hint="GRPO's is 1e-6")
    return _codapo_advantages(scores, lpm, correct, gid, n_groups, norm_by_std, weight_offset, epsilon)


def _codapo_advantages(scores, lpm, correct, gid, n_groups: int, norm_by_std=True, weight_offset=0.1, epsilon=1e-6):
    """:func:`codapo_advantages` without its checks, for the batch :func:`read_batch` checked and a parsed config."""
    weight, confidence, difficulty_weight = _codapo_group_weights(lpm, correct, gid, n_groups, weight_offset)
    adv = _grpo_group_advantages(scores.to(torch.float32), gid, n_groups, norm_by_std, epsilon) * weight[gid]
    return adv, weight, confidence, difficulty_weight


@register_estimator(
    "codapo",
    batch_keys=("old_log_probs", "rollout_log_probs"),
    section="codapo",
    config_class=CodapoConfig,
    resamples=True,
)
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
    metrics, and leaves the per-question weights for CoDaPO's resampling (:func:`pop_question_weights`).

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
    adv, weight, confidence, difficulty_weight = _codapo_advantages(  # read_batch and CodapoConfig checked them
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
    _QUESTION_WEIGHTS.clear()
    _QUESTION_WEIGHTS.append((list(pd.unique(np.asarray(index))), weight.tolist()))
    advantages = batch.broadcast(adv)
    return advantages, advantages
