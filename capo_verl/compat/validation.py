"""Calibration in verl's validation pass: ``val-calib/<data_source>/auc_mean`` (paper Figure 1 b, c).

verl 0.9.1's validation (``verl/trainer/ppo/v1/trainer_base.py::PPOTrainer._validate``; legacy
``verl/trainer/ppo/ray_trainer.py::RayPPOTrainer._validate``) logs accuracy per data source
(``val-core/<data_source>/acc/mean@16``) but drops the rollout's log-probs: it only reads ``rm_scores`` and the reward's
``reward_extra_info`` of each response. Two patches carry the confidence through:

1. ``verl/experimental/agent_loop/agent_loop.py::AgentLoopWorker._compute_score`` (the agent-loop worker, v1 and
   legacy): after verl scores a response, add its ``lpm`` -- the mean of ``response_logprobs`` (the rollout's log-probs,
   ``rollout.calculate_log_probs``) over the response mask, in nats -- to the response's
   ``extra_fields["reward_extra_info"]``, the dict ``_validate`` collects per response.
2. ``_val_metrics_update`` of both trainers (called by ``_validate`` with the per-response lists): take ``lpm`` out
   before verl's own statistics, then add per data source, from :func:`capo_verl.metrics.capo_step_metrics`::

       val-calib/<ds>/auc_mean            mean over questions with both outcomes of the per-question ROC-AUC
                                          of lpm against correctness (left out when no question is mixed)
       val-calib/<ds>/mixed_group_frac    fraction of questions with both outcomes
       val-calib/<ds>/n_questions         number of questions / of mixed questions (what the end-of-run summary,
       val-calib/<ds>/n_mixed             capo_verl.compat.run_summary, says each change rests on)
       val-calib/<ds>/lpm_correct_mean    mean lpm of correct / incorrect responses
       val-calib/<ds>/lpm_incorrect_mean

   Correct = ``acc > 0.5`` when the reward returns ``acc`` (capo_verl.reward does), else ``reward > 0.5``:
   the same variable verl picks for its ``val-core`` section.

Installing capo-verl must not break a verl run that uses none of its estimators, so step 2 has three modes,
chosen by ``trainer.val_calib`` (:func:`val_calib_mode`):

- absent, ``null`` or ``auto`` (the default; verl's own configs lack the key): the metrics are added when the responses
  carry ``lpm``. When none does (``actor_rollout_ref.rollout.calculate_log_probs=false``, or a colocated reward model
  that scores outside the agent loop) they are skipped with one warning (``capo_verl`` logger) per process, i.e. per
  run, and the run goes on as without capo-verl. The same holds for any error computing them. If
  ``algorithm.adv_estimator`` is one of capo-verl's estimators (capo, grpo_mask, codapo, cde: those declared with
  :func:`capo_verl.estimators.registry.register_estimator`), auto means required.
- ``true``: required. A validation pass in which no response has ``lpm`` raises RuntimeError naming the fix.
- ``false``: off; verl's metrics only.

With a capo-verl estimator and validation at verl's defaults (one answer per question, or greedy decoding:
:func:`single_draw_validation`), auto means off: the run's start says so in one line with the keys that turn the
metrics on (:data:`TURN_ON`); ``trainer.val_calib=true`` with such a validation is refused at the start
(:func:`capo_verl.compat.run_checks.check_run_config`).

verl's own configs lack the key: set it with ``+trainer.val_calib=...`` there (``++`` works either way).
"""

from __future__ import annotations

import functools
import logging
import math
from collections.abc import Sequence

import numpy as np

from .patching import after_import, patch

logger = logging.getLogger("capo_verl")

#: Key of the per-response mean log-prob in ``reward_extra_info``.
LPM_KEY = "lpm"
#: Prefix of the logged metrics.
PREFIX = "val-calib"


def response_lpm(log_probs: Sequence[float] | None, mask: Sequence[int] | None) -> float | None:
    """Mean log-prob (nats) of a response's generated tokens.

    Args:
        log_probs: ``(T,)`` per-token log-probs of the response (``AgentLoopOutput.response_logprobs``).
        mask: ``(T,)`` 1 for model-generated tokens, 0 for tool/padding tokens
            (``AgentLoopOutput.response_mask``), or None for all ones.

    Returns:
        ``sum(lp * m) / sum(m)``, or None when there are no log-probs, no generated token, the two lengths
        differ, or the value is not finite (such a response gets no ``lpm`` and is left out of val-calib).
    """
    if log_probs is None:
        return None
    lp = np.asarray(log_probs, dtype=np.float64).reshape(-1)
    m = np.ones_like(lp) if mask is None else np.asarray(mask, dtype=np.float64).reshape(-1)
    if lp.shape != m.shape or m.sum() <= 0:
        return None
    value = float((lp * m).sum() / m.sum())
    return value if math.isfinite(value) else None


def attach_lpm(output) -> None:
    """Store :func:`response_lpm` of an ``AgentLoopOutput`` in its ``extra_fields["reward_extra_info"]``.

    Responses without log-probs (``rollout.calculate_log_probs=False``) get nothing; a response whose lpm is
    undefined gets NaN, so that every response of a batch has the same keys (verl's legacy agent loop
    builds one array per key of the first response).
    """
    if output.response_logprobs is None:
        return
    value = response_lpm(output.response_logprobs, output.response_mask)
    output.extra_fields.setdefault("reward_extra_info", {})[LPM_KEY] = float("nan") if value is None else value


def validation_calibration_metrics(data_sources, sample_uids, reward_extra_infos_dict) -> dict[str, float]:
    """``val-calib/<data_source>/...`` metrics of one validation pass.

    Args:
        data_sources: ``(N,)`` data source of each response.
        sample_uids: ``(N,)`` question id of each response (the ``val_kwargs.n`` responses of a question
            share it).
        reward_extra_infos_dict: ``{name: (N,) list}`` as built by verl's ``_validate``; needs ``lpm`` and
            ``acc`` or ``reward``. Entries may be None (a response without that key).

    Returns:
        ``{"val-calib/<ds>/<name>": float}`` (see the module docstring), plus
        ``val-calib/<ds>/lpm_missing_frac`` when some responses of ``ds`` have no finite ``lpm`` (they are
        left out of the other metrics).

    Raises:
        RuntimeError: no response at all has ``lpm`` (log-probs are off, or the reward runs where the patch
            cannot reach it).
        ValueError: the lists differ in length from ``data_sources``.
    """
    from capo_verl.metrics import capo_step_metrics

    n = len(data_sources)
    lpm_list = reward_extra_infos_dict.get(LPM_KEY)
    if n == 0:
        return {}
    if not carries_lpm(reward_extra_infos_dict):
        raise RuntimeError(_missing_lpm_message(None))
    if "acc" in reward_extra_infos_dict:
        outcome_name, outcome = "acc", reward_extra_infos_dict["acc"]
    else:
        outcome_name, outcome = "reward", reward_extra_infos_dict["reward"]
    for name, values in ((LPM_KEY, lpm_list), (outcome_name, outcome), ("uid", sample_uids)):
        if len(values) != n:
            raise ValueError(f"val-calib: {name} has {len(values)} entries for {n} validation responses")

    sources = np.asarray([str(s) for s in data_sources], dtype=object)
    uids = np.asarray([str(u) for u in sample_uids], dtype=object)
    lpm = np.array([np.nan if v is None else float(v) for v in lpm_list], dtype=np.float64)
    has_lpm = np.isfinite(lpm)
    has_outcome = np.array([v is not None for v in outcome], dtype=bool)
    lpm[~has_lpm] = 0.0
    correct = np.array([v is not None and float(v) > 0.5 for v in outcome], dtype=bool)

    metrics: dict[str, float] = {}
    for source in sorted(set(sources)):
        sel = sources == source
        valid = has_lpm[sel] & has_outcome[sel]
        part = capo_step_metrics(lpm[sel], correct[sel], uids[sel], valid, prefix=f"{PREFIX}/{source}/")
        metrics.update(part)
        ids, ok = uids[sel][valid], correct[sel][valid]
        metrics[f"{PREFIX}/{source}/n_questions"] = float(len(set(uids[sel])))
        metrics[f"{PREFIX}/{source}/n_mixed"] = float(len(set(ids[ok]) & set(ids[~ok])))
        missing = float((~has_lpm[sel]).mean())
        if missing > 0:
            metrics[f"{PREFIX}/{source}/lpm_missing_frac"] = missing
    return metrics


#: Values of :func:`val_calib_mode`.
OFF, AUTO, REQUIRED = "off", "auto", "required"
_warned_skipped = False  # the one "skipped" warning of this process (a run's trainer lives in one process)


def carries_lpm(reward_extra_infos_dict) -> bool:
    """True if at least one response carries ``lpm`` (NaN, an undefined lpm, counts as carried)."""
    values = reward_extra_infos_dict.get(LPM_KEY)
    return values is not None and any(v is not None for v in values)


def is_capo_verl_estimator(name) -> bool:
    """True if verl's ``algorithm.adv_estimator`` ``name`` is one of capo-verl's declared estimators (capo,
    grpo_mask, codapo, cde, and any other declared with :func:`capo_verl.estimators.registry.register_estimator`):
    verl holds it through :func:`capo_verl.compat.advantage.verl_estimator`."""
    from .advantage import declared_spec

    return declared_spec(name) is not None


def parse_val_calib(value) -> bool | None:
    """``trainer.val_calib`` as True (required), False (off) or None (auto).

    :func:`val_calib_mode` (at the first validation pass) and verl's ``validate_config`` (through
    :func:`capo_verl.compat.methods.check_method_configs`, before the run starts) both parse it here.

    Args:
        value: the key's value: True, False, None or the string ``auto`` (any case).

    Raises:
        ValueError: anything else (``maybe``, 1, ...); the message names the key, the value and the allowed values.
    """
    if value is None or value is True or value is False:
        return value
    if isinstance(value, str) and value.strip().lower() == "auto":
        return None
    raise ValueError(
        f"trainer.val_calib={value!r}: must be true, false, auto or null (null = auto); e.g. trainer.val_calib=auto "
        "(+trainer.val_calib=auto if your config lacks the key)"
    )


def val_calib_mode(config) -> tuple[str, str]:
    """How the ``val-calib/...`` metrics run for a trainer config: ``(mode, reason)``.

    Args:
        config: the trainer's config (``trainer.config``, a DictConfig), or None.

    Returns:
        ``(OFF | AUTO | REQUIRED, reason)``: ``trainer.val_calib`` false -> OFF; true -> REQUIRED; absent,
        null or ``"auto"`` -> REQUIRED if ``algorithm.adv_estimator`` is capo-verl's
        (:func:`is_capo_verl_estimator`) and the validation samples several answers per question, OFF if it is
        capo-verl's and the validation draws one answer or decodes greedily (:func:`single_draw_validation`,
        verl's defaults), else AUTO. ``reason`` says which setting decided, for messages (for OFF at verl's
        defaults also the keys that turn the metrics on, :data:`TURN_ON`).

    Raises:
        ValueError: ``trainer.val_calib`` is something else (a string other than ``auto``, a number, ...).
    """
    trainer_cfg = (config.get("trainer", None) if config is not None else None) or {}
    value = parse_val_calib(trainer_cfg.get("val_calib", None))
    if value is False:
        return OFF, "trainer.val_calib=false"
    if value is True:
        return REQUIRED, "trainer.val_calib=true"
    algorithm = (config.get("algorithm", None) if config is not None else None) or {}
    estimator = algorithm.get("adv_estimator", None)
    if estimator is not None and is_capo_verl_estimator(estimator):
        name = getattr(estimator, "value", estimator)
        problem = single_draw_validation(config)
        if problem is not None:
            return OFF, (
                f"{problem}, so no question has both a correct and an incorrect answer to compare; "
                f"turn them on with {TURN_ON}"
            )
        return REQUIRED, f"algorithm.adv_estimator={name} is a capo-verl estimator and trainer.val_calib is auto"
    return AUTO, "trainer.val_calib is auto"


#: the keys that make verl's validation draw several sampled answers per question (``val-calib/*`` needs them)
TURN_ON_KEYS = {
    "actor_rollout_ref.rollout.val_kwargs.n": 4,
    "actor_rollout_ref.rollout.val_kwargs.do_sample": True,
    "actor_rollout_ref.rollout.val_kwargs.temperature": 1.0,
}
TURN_ON = " ".join(f"{k}={str(v).lower() if isinstance(v, bool) else v}" for k, v in TURN_ON_KEYS.items())


def single_draw_validation(config) -> str | None:
    """Why verl's validation of ``config`` gives each question one distinct answer, or None when it samples several.

    verl 0.9.1's defaults (``verl/trainer/config/rollout/rollout.yaml``, ``val_kwargs``): ``n: 1``,
    ``do_sample: False``, ``temperature: 0`` (greedy). With ``n`` < 2, or greedy decoding (``do_sample`` false or
    ``temperature`` <= 0: the ``n`` answers are the same), no question is mixed and calibration is undefined.

    Args:
        config: the trainer's config (a DictConfig or a nested dict), or None.
    """
    node = config
    for part in ("actor_rollout_ref", "rollout", "val_kwargs"):
        node = node.get(part, None) if node is not None and hasattr(node, "get") else None
    if node is None:
        return None
    n, do_sample, temperature = (node.get(k, None) for k in ("n", "do_sample", "temperature"))
    if isinstance(n, int) and not isinstance(n, bool) and n < 2:
        return f"validation draws one answer per question (actor_rollout_ref.rollout.val_kwargs.n={n})"
    if do_sample is False:
        return "validation decodes greedily (actor_rollout_ref.rollout.val_kwargs.do_sample=false)"
    if isinstance(temperature, (int, float)) and not isinstance(temperature, bool) and temperature <= 0:
        return f"validation decodes greedily (actor_rollout_ref.rollout.val_kwargs.temperature={temperature})"
    return None


def _missing_lpm_message(reason: str | None) -> str:
    why = "cannot be computed" if reason is None else f"are required ({reason})"
    return (
        "val-calib: no validation response carries its mean log-prob ('lpm'), so the calibration metrics "
        f"val-calib/<data_source>/auc_mean {why}. Set actor_rollout_ref.rollout."
        "calculate_log_probs=true (the rollout must return log-probs), make sure capo-verl is installed in every "
        "Ray process (capo_verl.compat patches the agent-loop worker; note that a colocated reward model, "
        "reward.reward_model.enable=true without enable_resource_pool, bypasses it), or turn the metrics off "
        "with trainer.val_calib=false (+trainer.val_calib=false if your config lacks the key)."
    )


def _warn_skipped_once(why: str) -> None:
    """Log the "val-calib skipped" warning once per process (on the ``capo_verl`` logger, whose console handler,
    :mod:`capo_verl.logs`, prints it also in verl's TaskRunner, where vLLM's import sets the root logger to ERROR)."""
    global _warned_skipped
    if _warned_skipped:
        return
    _warned_skipped = True
    logger.warning(
        "capo-verl: val-calib/* calibration metrics skipped for this run: %s. verl's own validation metrics "
        "are unaffected. To compute them, set actor_rollout_ref.rollout.calculate_log_probs=true and score in the "
        "agent loop (no colocated reward model). trainer.val_calib=false silences this, trainer.val_calib=true "
        "makes it an error (on the command line: ++trainer.val_calib=...). (Warned once per run.)",
        why,
    )


def calibration_metrics_for(trainer, data_sources, sample_uids, reward_extra_infos_dict) -> dict[str, float]:
    """The ``val-calib/...`` metrics that ``trainer``'s config asks for (:func:`val_calib_mode`).

    OFF: ``{}``. AUTO: :func:`validation_calibration_metrics`, or ``{}`` and one logged warning
    per process when no response has ``lpm`` or computing them fails. REQUIRED:
    :func:`validation_calibration_metrics`.

    Raises:
        RuntimeError: REQUIRED and no response has ``lpm``; the message names the setting that made the metrics
            required and the fixes.
        ValueError: invalid ``trainer.val_calib`` (see :func:`val_calib_mode`); in REQUIRED mode also what
            :func:`validation_calibration_metrics` raises.
    """
    mode, reason = val_calib_mode(getattr(trainer, "config", None))
    if mode == OFF or len(data_sources) == 0:
        return {}
    if not carries_lpm(reward_extra_infos_dict):
        if mode == REQUIRED:
            raise RuntimeError(_missing_lpm_message(reason))
        _warn_skipped_once("no validation response carries its mean log-prob ('lpm')")
        return {}
    if mode == REQUIRED:
        return validation_calibration_metrics(data_sources, sample_uids, reward_extra_infos_dict)
    try:
        return validation_calibration_metrics(data_sources, sample_uids, reward_extra_infos_dict)
    except Exception as exc:  # auto: an added metric must not fail a run that did not ask for it
        _warn_skipped_once(f"computing them failed ({type(exc).__name__}: {exc})")
        return {}


# --- 1. verl/experimental/agent_loop/agent_loop.py: lpm into reward_extra_info ------------------------------
@patch("verl.experimental.agent_loop.agent_loop", {"AgentLoopWorker._compute_score": ("self", "outputs", "kwargs")})
def _patch_agent_loop(agent_loop) -> None:
    """``AgentLoopWorker._compute_score(self, outputs, kwargs)`` fills ``reward_extra_info`` of the final
    output (``outputs[-1]``); afterwards, attach that output's ``lpm``. ``AgentLoopWorkerTQ`` (v1,
    verl/trainer/ppo/v1/agent_loop_tq.py) inherits the method."""
    cls = agent_loop.AgentLoopWorker
    original = cls._compute_score

    @functools.wraps(original)
    async def _compute_score(self, outputs, *args, **kwargs):
        await original(self, outputs, *args, **kwargs)
        if outputs:
            attach_lpm(outputs[-1])

    cls._compute_score = _compute_score


# --- 2. trainers: val-calib metrics next to verl's val-core ---------------------------------------------
#: the parameters of verl 0.9.1's ``_val_metrics_update`` (v1 and legacy trainer) that the patch passes on
_VAL_METRICS_UPDATE = ("self", "data_sources", "sample_uids", "reward_extra_infos_dict", "sample_turns")


def _wrap_val_metrics_update(cls) -> None:
    """Wrap ``cls._val_metrics_update``: verl's metrics without ``lpm``, plus :func:`calibration_metrics_for`.

    The patched method raises what :func:`calibration_metrics_for` raises (only when ``trainer.val_calib`` is
    invalid or the metrics are required). The callers' :func:`~capo_verl.compat.patch` declarations check
    verl's parameters first.
    """
    original = cls._val_metrics_update

    @functools.wraps(original)
    def _val_metrics_update(self, data_sources, sample_uids, reward_extra_infos_dict, sample_turns, *args, **kwargs):
        # verl's own statistics without lpm (its mean@/best@/maj@ of a log-prob mean nothing); the dict that
        # _validate dumped to trainer.validation_data_dir still has it.
        verl_infos = {k: v for k, v in reward_extra_infos_dict.items() if k != LPM_KEY}
        metrics = original(self, data_sources, sample_uids, verl_infos, sample_turns, *args, **kwargs)
        metrics.update(calibration_metrics_for(self, data_sources, sample_uids, reward_extra_infos_dict))
        return metrics

    cls._val_metrics_update = _val_metrics_update


@patch("verl.trainer.ppo.v1.trainer_base", {"PPOTrainer._val_metrics_update": _VAL_METRICS_UPDATE})
def _patch_v1_trainer(trainer_base) -> None:
    """verl/trainer/ppo/v1/trainer_base.py: ``PPOTrainer._val_metrics_update``."""
    _wrap_val_metrics_update(trainer_base.PPOTrainer)


@patch("verl.trainer.ppo.ray_trainer", {"RayPPOTrainer._val_metrics_update": _VAL_METRICS_UPDATE})
def _patch_legacy_trainer(ray_trainer) -> None:
    """verl/trainer/ppo/ray_trainer.py: ``RayPPOTrainer._val_metrics_update`` (trainer.use_v1=false)."""
    _wrap_val_metrics_update(ray_trainer.RayPPOTrainer)


def install() -> None:
    """Register the patches (applied when verl executes each module)."""
    after_import("verl.experimental.agent_loop.agent_loop", _patch_agent_loop)
    after_import("verl.trainer.ppo.v1.trainer_base", _patch_v1_trainer)
    after_import("verl.trainer.ppo.ray_trainer", _patch_legacy_trainer)
