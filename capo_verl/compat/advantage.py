"""verl glue for batch-aware advantage estimators (the ``capo`` estimator and its ablations).

verl 0.9.1 calls a registered estimator as ``fn(token_level_rewards=, response_mask=, config=, index=)``
(``verl/trainer/ppo/ray_trainer.py::compute_advantage``), although ``old_log_probs`` and ``ref_log_prob``
are in ``data.batch`` at that moment. This module:

1. wraps ``compute_advantage`` so that an estimator registered with :func:`register_batch_aware_adv_est`
   receives the batch tensors it declares (``batch_keys``) as keyword arguments. The call still goes
   through verl's own ``compute_advantage``; every other estimator runs exactly as before.
2. extends ``need_reference_policy`` (``verl/trainer/ppo/utils.py``) so that an estimator that needs
   ``ref_log_prob`` turns the reference pass on, without any KL term in loss or reward.
3. moves the metrics an estimator records with :func:`record_step_metrics` into the step's metrics:
   v1 trainer ``PPOTrainer._compute_advantage(batch, metrics)`` (``verl/trainer/ppo/v1/trainer_base.py``)
   and the legacy trainer's ``compute_data_metrics`` call (``verl/trainer/ppo/ray_trainer.py``).
4. logs the ``capo/*`` calibration metrics of the training batch for *every* estimator (GRPO, GSPO, ...),
   computed from the batch after the estimator ran (:func:`batch_calibration_metrics`), without changing what
   the estimator does: the paper's point is that GRPO's batch AUC-mean falls while CAPO's rises.
5. passes the training step (verl's ``trainer.global_steps``, 1 for the first update, restored from the checkpoint on
   resume) to estimators registered with ``needs_training_step=True``, as ``global_step=``: the v1 trainer's
   ``PPOTrainer._compute_advantage`` reads it from the trainer; the legacy trainer from ``data.meta_info``.

Which estimators are registered, and with which batch keys, is decided in :mod:`capo_verl.compat.methods`.
The metrics queue itself (:func:`record_step_metrics`, :func:`pop_step_metrics`) lives in the pure
:mod:`capo_verl.estimators.common`; it is re-exported here.
"""

from __future__ import annotations

import contextvars
import functools
import inspect
import logging
from collections.abc import Callable, Sequence

from capo_verl.estimators.common import pop_step_metrics, queued_step_metrics, record_step_metrics

from .patching import after_import, patch

__all__ = [
    "batch_calibration_metrics",
    "estimator_needs_reference_policy",
    "install",
    "pop_step_metrics",
    "record_step_metrics",
    "register_batch_aware_adv_est",
]

logger = logging.getLogger("capo_verl")

# Batch tensors for the estimator that verl's compute_advantage is calling right now.
_BATCH_EXTRAS: contextvars.ContextVar[dict | None] = contextvars.ContextVar("capo_verl_batch_extras", default=None)
# verl's trainer.global_steps of the v1 trainer step whose _compute_advantage is running, for needs_training_step.
_TRAINING_STEP: contextvars.ContextVar[int | None] = contextvars.ContextVar("capo_verl_training_step", default=None)
_logged_ref_reason = False
_logged_no_calib: set[str] = set()


def register_batch_aware_adv_est(
    name: str,
    batch_keys: Sequence[str],
    needs_reference_policy: Callable[[object], bool] | None = None,
    needs_training_step: bool = False,
):
    """Decorator: register ``fn`` with verl's ``register_adv_est(name)``, receiving extra batch tensors.

    When verl's ``compute_advantage`` runs estimator ``name``, each key of ``batch_keys`` present in
    ``data.batch`` is passed to ``fn`` as a keyword argument (absent keys are not passed; ``fn``
    decides whether that is an error). ``fn`` itself is returned unchanged, so it can also be called
    directly with explicit tensors.

    Args:
        name: the ``algorithm.adv_estimator`` value.
        batch_keys: names in ``DataProto.batch`` to forward, e.g. ``("old_log_probs", "ref_log_prob")``.
        needs_reference_policy: ``f(algorithm_config) -> bool``; when true verl computes
            ``ref_log_prob`` (see :func:`_patch_need_reference_policy`).
        needs_training_step: pass ``global_step=<int>``, verl's ``trainer.global_steps`` of the step being
            trained (1-based; continues from the checkpoint's step after a resume), when verl's trainer provides it
            (v1 trainer: always; legacy trainer: when ``data.meta_info`` has ``global_steps``); otherwise the
            keyword is not passed and ``fn`` decides whether that is an error.

    Registering the same ``fn`` under the same name again is a no-op.

    Raises:
        ValueError: from verl if another function is already registered under ``name``.
    """
    from verl.trainer.ppo import core_algos

    def decorator(fn):
        if getattr(core_algos.ADV_ESTIMATOR_REGISTRY.get(name), "__wrapped__", None) is fn:
            return fn

        @functools.wraps(fn)
        def called_by_verl(**verl_kwargs):
            extras = _BATCH_EXTRAS.get()
            if extras is None:
                from .patching import INSTALL_ERROR as error

                if error is not None:
                    raise RuntimeError(
                        f"advantage estimator '{name}' needs {list(batch_keys)} from the batch, which verl 0.9.1 "
                        "passes only through capo-verl's compute_advantage patch, and capo-verl failed to install "
                        f"into verl in this process: {error}"
                    )
                raise RuntimeError(
                    f"advantage estimator '{name}' was called outside verl's compute_advantage: the function "
                    f"registered with verl receives {list(batch_keys)} from data.batch only inside "
                    "verl.trainer.ppo.ray_trainer.compute_advantage(data, adv_estimator=...), which capo-verl "
                    f"wraps; call that with a DataProto, or call {fn.__module__}.{fn.__name__}(token_level_rewards="
                    f"..., response_mask=..., index=..., config=..., "
                    + ", ".join(f"{k}=..." for k in batch_keys)
                    + ") with the tensors yourself"
                )
            return fn(**verl_kwargs, **extras)

        called_by_verl.batch_keys = tuple(batch_keys)
        called_by_verl.needs_training_step = needs_training_step
        called_by_verl.needs_reference_policy = needs_reference_policy
        core_algos.register_adv_est(name)(called_by_verl)
        return fn

    return decorator


def _estimator_name(adv_estimator) -> str:
    return getattr(adv_estimator, "value", adv_estimator)


def batch_calibration_metrics(data, reward_threshold: float = 0.5) -> dict[str, float]:
    """``capo/*`` calibration metrics of a training batch whose advantages are computed, for an estimator that does
    not log its own (verl's GRPO, GSPO, ...): the same computation as capo-verl's estimators
    (:meth:`~capo_verl.estimators.common.BatchView.calibration_metrics` of
    :func:`~capo_verl.estimators.common.read_batch`).

    Reads ``data.batch``: ``token_level_rewards`` and ``response_mask`` ``(bs, response_length)``,
    ``old_log_probs`` (or, without it, ``rollout_log_probs``) ``(bs, response_length)`` in nats, ``advantages``
    ``(bs, response_length)``; and ``data.non_tensor_batch["uid"]`` ``(bs,)``. A response is correct iff its summed
    reward is > ``reward_threshold``, and its sequence advantage is the mean of ``advantages`` over its valid tokens.

    Returns:
        :func:`capo_verl.metrics.capo_step_metrics` (``capo/auc_mean``, ``capo/mixed_group_frac``,
        ``capo/lpm_correct_mean``, ``capo/lpm_incorrect_mean``, ``capo/adv_abs_mean``, ``capo/adv_mean_correct``,
        ``capo/adv_mean_incorrect``), or ``{}`` when the batch has no ``uid``, no log-probs or no ``advantages``
        (nothing to measure; the caller warns once).
    """
    from capo_verl.estimators.common import read_batch

    batch = data.batch
    keys = set(batch.keys())
    if "uid" not in data.non_tensor_batch or "advantages" not in keys:
        return {}
    if not keys & {"old_log_probs", "rollout_log_probs"}:
        return {}
    log_probs = {k: batch[k] for k in ("old_log_probs", "rollout_log_probs") if k in keys}
    view = read_batch(
        "batch metrics", batch["token_level_rewards"], batch["response_mask"], data.non_tensor_batch["uid"],
        reward_threshold, **log_probs,
    )  # fmt: skip
    adv = (batch["advantages"].float() * view.out).sum(-1) / view.n_valid.clamp_min(1.0)
    return view.calibration_metrics(adv)


def _reward_threshold(config) -> float:
    """``algorithm.capo.reward_threshold`` as :class:`~capo_verl.estimators.CapoConfig` reads it (0.5 without the
    section): the correctness rule of the batch metrics of verl's own estimators."""
    from capo_verl.estimators.capo import CapoConfig

    return float(CapoConfig.from_algorithm_config(config).reward_threshold)


def _record_batch_calibration(data, adv_estimator, config) -> None:
    """Add :func:`batch_calibration_metrics` to the step's metrics unless the estimator already logged its own."""
    queued = queued_step_metrics()
    if "capo/mixed_group_frac" in queued:
        return
    metrics = batch_calibration_metrics(data, _reward_threshold(config))
    name = _estimator_name(adv_estimator)
    if not metrics and name not in _logged_no_calib:
        _logged_no_calib.add(name)
        logger.warning(
            "capo-verl: no capo/* calibration metrics for adv_estimator=%s: the batch has no uid or no "
            "old_log_probs/rollout_log_probs",
            name,
        )
    record_step_metrics({key: value for key, value in metrics.items() if key not in queued})


#: how many advantage computations (training steps) :func:`watch_rewards` watches
WATCHED_STEPS = 3
_reward_watch: dict[str, object] = {"seen": set(), "calls": 0, "done": False}


def watch_rewards(rewards) -> bool:
    """Warn once when every response of the first :data:`WATCHED_STEPS` advantage computations earned the same
    reward: every group-relative advantage is then 0 and nothing is learned. Called by capo-verl's wrapper of
    verl's ``compute_advantage`` (``verl/trainer/ppo/ray_trainer.py``) with each step's sequence rewards.

    Args:
        rewards: the step's per-response summed rewards (a sequence of floats).

    Returns:
        True when this call logged the warning.
    """
    watch = _reward_watch
    if watch["done"]:
        return False
    watch["seen"].update(round(float(r), 9) for r in rewards)
    watch["calls"] += 1
    if len(watch["seen"]) > 1:
        watch["done"] = True
        return False
    if watch["calls"] < WATCHED_STEPS:
        return False
    watch["done"] = True
    [value] = watch["seen"] or {float("nan")}
    logger.warning(
        "capo-verl: every response of the first %d steps earned the same reward (%s): every advantage is 0 and "
        "nothing is learned. Check the reward's answer format: each row's reward_model.ground_truth and the final-"
        "answer form its data source's scorer expects (verl's gsm8k scorer reads '#### N'), against what the "
        "model writes within data.max_response_length tokens. (Warned once.)",
        WATCHED_STEPS,
        value,
    )
    return True


# --- 1. compute_advantage: forward batch tensors to batch-aware estimators --------------------------------
@patch(
    "verl.trainer.ppo.ray_trainer",
    {
        "compute_advantage": (
            "data",
            "adv_estimator",
            "gamma",
            "lam",
            "num_repeat",
            "norm_adv_by_std_in_grpo",
            "config",
        ),
        "compute_data_metrics": ("batch", "use_critic"),
    },
)
def _patch_compute_advantage(ray_trainer) -> None:
    """verl/trainer/ppo/ray_trainer.py: wrap ``compute_advantage`` (also used by the v1 trainer, which
    imports it by name in verl/trainer/ppo/v1/utils.py after this patch is applied)."""
    from verl.trainer.ppo import core_algos

    original = ray_trainer.compute_advantage

    bound = inspect.signature(original)

    @functools.wraps(original)
    def compute_advantage(data, adv_estimator, *args, **kwargs):
        fn = core_algos.ADV_ESTIMATOR_REGISTRY.get(_estimator_name(adv_estimator))
        batch_keys = getattr(fn, "batch_keys", None)
        if not batch_keys:  # every other estimator: verl's code path, untouched
            out = original(data, adv_estimator, *args, **kwargs)
        else:
            present = set(data.batch.keys())
            extras = {k: data.batch[k] for k in batch_keys if k in present}
            if getattr(fn, "needs_training_step", False):
                step = _TRAINING_STEP.get()
                if step is None:
                    step = (getattr(data, "meta_info", None) or {}).get("global_steps")
                if step is not None:
                    extras["global_step"] = int(step)
            token = _BATCH_EXTRAS.set(extras)
            try:
                out = original(data, adv_estimator, *args, **kwargs)
            finally:
                _BATCH_EXTRAS.reset(token)
        config = bound.bind(data, adv_estimator, *args, **kwargs).arguments.get("config")
        _record_batch_calibration(out, adv_estimator, config)
        watch_rewards(out.batch["token_level_rewards"].sum(-1).tolist())
        return out

    compute_advantage.__wrapped_by_capo_verl__ = True
    ray_trainer.compute_advantage = compute_advantage

    # Legacy RayPPOTrainer.fit: metrics of the step are gathered by compute_data_metrics(batch=..., ...).
    original_data_metrics = ray_trainer.compute_data_metrics

    @functools.wraps(original_data_metrics)
    def compute_data_metrics(*args, **kwargs):
        metrics = original_data_metrics(*args, **kwargs)
        metrics.update(pop_step_metrics())
        return metrics

    ray_trainer.compute_data_metrics = compute_data_metrics


# --- 2. reference policy gate --------------------------------------------------------------------------------
def estimator_needs_reference_policy(config) -> bool:
    """True if ``config.algorithm.adv_estimator`` is batch-aware and asks for ``ref_log_prob``."""
    from verl.trainer.ppo import core_algos

    algorithm = config.algorithm
    fn = core_algos.ADV_ESTIMATOR_REGISTRY.get(_estimator_name(algorithm.adv_estimator))
    needs = getattr(fn, "needs_reference_policy", None)
    return bool(needs and needs(algorithm))


@patch("verl.trainer.ppo.utils", {"need_reference_policy": ("config",)})
def _patch_need_reference_policy(utils) -> None:
    """verl/trainer/ppo/utils.py: ``need_reference_policy`` is ``use_kl_in_reward or use_kl_loss``; add the
    estimator's own need. Applied before main_ppo.py, ray_trainer.py and v1/trainer_base.py import it."""
    original = utils.need_reference_policy

    @functools.wraps(original)
    def need_reference_policy(config) -> bool:
        global _logged_ref_reason
        if original(config):
            return True
        if not estimator_needs_reference_policy(config):
            return False
        if not _logged_ref_reason:
            _logged_ref_reason = True
            logger.warning(
                "capo-verl: reference model on because algorithm.adv_estimator=%s with algorithm.capo.use_mask=true "
                "needs ref_log_prob for the reference-PPL noise mask (paper Eqs. 16-18); no KL term is added "
                "(use_kl_loss and use_kl_in_reward stay false)",
                _estimator_name(config.algorithm.adv_estimator),
            )
        return True

    utils.need_reference_policy = need_reference_policy


# --- 3. estimator metrics into the v1 trainer's step metrics ------------------------------------------------
@patch("verl.trainer.ppo.v1.trainer_base", {"PPOTrainer._compute_advantage": ("self", "batch", "metrics")})
def _patch_v1_trainer(trainer_base) -> None:
    """verl/trainer/ppo/v1/trainer_base.py: around ``PPOTrainer._compute_advantage(batch, metrics)``, expose the
    trainer's ``global_steps`` to estimators that need the training step, and afterwards add the metrics the
    estimator recorded to that step's ``metrics`` dict."""
    cls = trainer_base.PPOTrainer
    original = cls._compute_advantage

    @functools.wraps(original)
    def _compute_advantage(self, batch, metrics):
        pop_step_metrics()  # drop anything left over from outside a training step
        step = getattr(self, "global_steps", None)  # set by PPOTrainer._load_checkpoint, advanced by fit()
        token = _TRAINING_STEP.set(None if step is None else int(step))
        try:
            out = original(self, batch, metrics=metrics)
        finally:
            _TRAINING_STEP.reset(token)
        metrics.update(pop_step_metrics())
        return out

    cls._compute_advantage = _compute_advantage


def install() -> None:
    """Register this module's patches with :func:`capo_verl.compat.after_import` (applied at verl's import)."""
    after_import("verl.trainer.ppo.utils", _patch_need_reference_policy)
    after_import("verl.trainer.ppo.ray_trainer", _patch_compute_advantage)
    after_import("verl.trainer.ppo.v1.trainer_base", _patch_v1_trainer)
