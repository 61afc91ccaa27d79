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
"""

from __future__ import annotations

import contextvars
import functools
import logging
from collections.abc import Callable, Sequence

from . import after_import, check_signature

logger = logging.getLogger("capo_verl")

# Batch tensors for the estimator that verl's compute_advantage is calling right now.
_BATCH_EXTRAS: contextvars.ContextVar[dict | None] = contextvars.ContextVar("capo_verl_batch_extras", default=None)
# Metrics recorded by an estimator during the current step, consumed by the trainer hooks below.
_STEP_METRICS: dict[str, float] = {}
_logged_ref_reason = False


def register_batch_aware_adv_est(
    name: str,
    batch_keys: Sequence[str],
    needs_reference_policy: Callable[[object], bool] | None = None,
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

    Raises:
        ValueError: from verl if another function is already registered under ``name``.
    """
    from verl.trainer.ppo import core_algos

    def decorator(fn):
        @functools.wraps(fn)
        def called_by_verl(**verl_kwargs):
            extras = _BATCH_EXTRAS.get()
            if extras is None:
                from capo_verl import compat

                error = compat.INSTALL_ERROR
                reason = f" (capo_verl.compat failed to install: {error})" if error else ""
                raise RuntimeError(
                    f"advantage estimator '{name}' needs {list(batch_keys)} from the batch, which verl "
                    f"0.9.1 passes only through capo_verl.compat's compute_advantage patch, and that patch "
                    f"did not run{reason}. Install capo-verl in the environment of every Ray process and "
                    "keep VERL_USE_EXTERNAL_PLUGINS unset (or include 'capo' in it)."
                )
            return fn(**verl_kwargs, **extras)

        called_by_verl.batch_keys = tuple(batch_keys)
        called_by_verl.needs_reference_policy = needs_reference_policy
        core_algos.register_adv_est(name)(called_by_verl)
        return fn

    return decorator


def record_step_metrics(metrics: dict[str, float]) -> None:
    """Queue metrics for the current training step; the trainer hooks add them to the step's metrics."""
    _STEP_METRICS.update(metrics)


def pop_step_metrics() -> dict[str, float]:
    """Return and clear the metrics queued by :func:`record_step_metrics`."""
    out = dict(_STEP_METRICS)
    _STEP_METRICS.clear()
    return out


def _estimator_name(adv_estimator) -> str:
    return getattr(adv_estimator, "value", adv_estimator)


# --- 1. compute_advantage: forward batch tensors to batch-aware estimators --------------------------------
def _patch_compute_advantage(ray_trainer) -> None:
    """verl/trainer/ppo/ray_trainer.py: wrap ``compute_advantage`` (also used by the v1 trainer, which
    imports it by name in verl/trainer/ppo/v1/utils.py after this patch is applied)."""
    from verl.trainer.ppo import core_algos

    original = ray_trainer.compute_advantage
    check_signature(original, ["data", "adv_estimator", "gamma", "lam", "num_repeat"], "compute_advantage")

    @functools.wraps(original)
    def compute_advantage(data, adv_estimator, *args, **kwargs):
        fn = core_algos.ADV_ESTIMATOR_REGISTRY.get(_estimator_name(adv_estimator))
        batch_keys = getattr(fn, "batch_keys", None)
        if not batch_keys:  # every other estimator: verl's code path, untouched
            return original(data, adv_estimator, *args, **kwargs)
        present = set(data.batch.keys())
        token = _BATCH_EXTRAS.set({k: data.batch[k] for k in batch_keys if k in present})
        try:
            return original(data, adv_estimator, *args, **kwargs)
        finally:
            _BATCH_EXTRAS.reset(token)

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


def _patch_need_reference_policy(utils) -> None:
    """verl/trainer/ppo/utils.py: ``need_reference_policy`` is ``use_kl_in_reward or use_kl_loss``; add the
    estimator's own need. Applied before main_ppo.py, ray_trainer.py and v1/trainer_base.py import it."""
    original = utils.need_reference_policy
    check_signature(original, ["config"], "need_reference_policy")

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
def _patch_v1_trainer(trainer_base) -> None:
    """verl/trainer/ppo/v1/trainer_base.py: after ``PPOTrainer._compute_advantage(batch, metrics)``, add the
    metrics the estimator recorded to that step's ``metrics`` dict."""
    cls = trainer_base.PPOTrainer
    original = cls._compute_advantage
    check_signature(original, ["self", "batch", "metrics"], "PPOTrainer._compute_advantage")

    @functools.wraps(original)
    def _compute_advantage(self, batch, metrics):
        pop_step_metrics()  # drop anything left over from outside a training step
        out = original(self, batch, metrics=metrics)
        metrics.update(pop_step_metrics())
        return out

    cls._compute_advantage = _compute_advantage


def install() -> None:
    """Register this module's patches with :func:`capo_verl.compat.after_import` (applied at verl's import)."""
    after_import("verl.trainer.ppo.utils", _patch_need_reference_policy)
    after_import("verl.trainer.ppo.ray_trainer", _patch_compute_advantage)
    after_import("verl.trainer.ppo.v1.trainer_base", _patch_v1_trainer)
