"""verl glue for capo-verl's advantage estimators (the ``capo`` estimator, its ablations and the baselines).

verl 0.9.1 calls a registered estimator as ``fn(token_level_rewards=, response_mask=, config=, index=)``
(``verl/trainer/ppo/ray_trainer.py::compute_advantage``), although ``old_log_probs`` and ``ref_log_prob``
are in ``data.batch`` at that moment. This module:

1. registers every estimator of the table :data:`capo_verl.estimators.registry.ESTIMATORS` with verl's
   ``register_adv_est``, through one wrapper (:func:`verl_estimator`) that takes verl's keywords plus ``batch=`` and
   ``non_tensor_batch=`` and fills in the batch tensors the estimator declared (``batch_keys``);
2. wraps ``compute_advantage`` so that, for those estimators, verl's generic estimator call also passes
   ``batch=data.batch`` and ``non_tensor_batch=data.non_tensor_batch``: the call shape of verl's open PR #7473
   ("pass non_tensor_batch to advantage estimators that can accept it"). Once verl passes them itself, that
   branch of the wrapper is deleted and nothing else changes. Every other estimator runs verl's code, untouched;
3. extends ``need_reference_policy`` (``verl/trainer/ppo/utils.py``) so that an estimator that needs
   ``ref_log_prob`` turns the reference pass on, without any KL term in loss or reward;
4. moves the metrics an estimator records with :func:`record_step_metrics` into the step's metrics:
   v1 trainer ``PPOTrainer._compute_advantage(batch, metrics)`` (``verl/trainer/ppo/v1/trainer_base.py``)
   and the legacy trainer's ``compute_data_metrics`` call (``verl/trainer/ppo/ray_trainer.py``);
5. logs the ``capo/*`` calibration metrics of the training batch for *every* estimator (GRPO, GSPO, ...),
   computed from the batch after the estimator ran (:func:`batch_calibration_metrics`), without changing what
   the estimator does: the paper's point is that GRPO's batch AUC-mean falls while CAPO's rises;
6. passes the training step (verl's ``trainer.global_steps``, 1 for the first update, restored from the checkpoint on
   resume) to estimators declared with ``needs_training_step=True``, as ``global_step=``: the v1 trainer's
   ``PPOTrainer._compute_advantage`` reads it from the trainer; the legacy trainer from ``data.meta_info``.

The metrics queue itself (:func:`record_step_metrics`, :func:`pop_step_metrics`) lives in the pure
:mod:`capo_verl.estimators.common`; it is re-exported here.
"""

from __future__ import annotations

import contextvars
import functools
import inspect
import logging
from collections.abc import Callable

import capo_verl.estimators  # noqa: F401  imports every estimator module, so each has declared itself
from capo_verl.estimators.common import pop_step_metrics, queued_step_metrics, record_step_metrics
from capo_verl.estimators.registry import ESTIMATORS, EstimatorSpec, on_declare

from .patching import after_import, patch

__all__ = [
    "ESTIMATORS",
    "batch_calibration_metrics",
    "declared_spec",
    "estimator_needs_reference_policy",
    "install",
    "pop_step_metrics",
    "record_step_metrics",
    "verl_estimator",
]

logger = logging.getLogger("capo_verl")

# verl's trainer.global_steps of the v1 trainer step whose _compute_advantage is running, for needs_training_step:
# the v1 trainer builds the DataProto it hands to compute_advantage inside that method, without the step in meta_info.
_TRAINING_STEP: contextvars.ContextVar[int | None] = contextvars.ContextVar("capo_verl_training_step", default=None)
_logged_no_calib: set[str] = set()


# --- 1. registration: one wrapper per declared estimator ---------------------------------------------------------
def verl_estimator(spec: EstimatorSpec) -> Callable:
    """The function verl's ``ADV_ESTIMATOR_REGISTRY`` holds for ``spec``: it takes verl's keywords
    (``token_level_rewards``, ``response_mask``, ``index``, ``config``, ...) plus ``batch=`` (``data.batch``) and
    ``non_tensor_batch=``, and calls ``spec.fn`` with verl's keywords, each of ``spec.batch_keys`` that ``batch`` holds
    (an absent key is not passed; ``spec.fn`` decides whether that is an error) and, when ``spec.needs_training_step``,
    ``global_step=`` (if the trainer gives it). ``__wrapped__`` is ``spec.fn``; ``spec`` is its ``spec`` attribute.

    Raises:
        RuntimeError: (when called) without ``batch=``: outside verl's ``compute_advantage``, or capo-verl did not
            install into verl in this process; the message says how to call ``spec.fn`` instead.
    """

    @functools.wraps(spec.fn)
    def called_by_verl(*, batch=None, non_tensor_batch=None, global_step=None, **verl_kwargs):
        if batch is None:
            raise RuntimeError(_no_batch_message(spec))
        present = set(batch.keys())
        extras = {key: batch[key] for key in spec.batch_keys if key in present}
        if spec.needs_training_step and global_step is not None:
            extras["global_step"] = int(global_step)
        return spec.fn(**verl_kwargs, **extras)

    called_by_verl.spec = spec
    return called_by_verl


def _no_batch_message(spec: EstimatorSpec) -> str:
    from .patching import INSTALL_ERROR as error

    if error is not None:
        return (
            f"advantage estimator '{spec.name}' needs {list(spec.batch_keys)} from the batch, which verl 0.9.1 "
            "passes only through capo-verl's compute_advantage patch, and capo-verl failed to install into verl in "
            f"this process: {error}"
        )
    fn = spec.fn
    keys = "".join(f", {k}=..." for k in spec.batch_keys)
    return (
        f"advantage estimator '{spec.name}' was called without batch=: the function registered with verl takes "
        f"{list(spec.batch_keys)} from data.batch, which verl.trainer.ppo.ray_trainer.compute_advantage(data, "
        "adv_estimator=...) passes (capo-verl wraps it); call that with a DataProto, or call "
        f"{fn.__module__}.{fn.__name__}(token_level_rewards=..., response_mask=..., index=..., config=...{keys}) "
        "with the tensors yourself"
    )


def declared_spec(adv_estimator) -> EstimatorSpec | None:
    """The :class:`EstimatorSpec` of the estimator verl holds under ``adv_estimator`` (a name or verl's enum), or
    None for verl's own estimators (and names verl does not know)."""
    from verl.trainer.ppo import core_algos

    return getattr(core_algos.ADV_ESTIMATOR_REGISTRY.get(_estimator_name(adv_estimator)), "spec", None)


@patch("verl.trainer.ppo.core_algos", {"register_adv_est": ("name_or_enum",), "ADV_ESTIMATOR_REGISTRY": None})
def _register_declared(core_algos) -> None:
    """``verl/trainer/ppo/core_algos.py``: register every estimator of :data:`ESTIMATORS` with verl, now and as
    each later one is declared (:func:`~capo_verl.estimators.registry.on_declare`)."""
    on_declare(_register_with_verl)


def _register_with_verl(spec: EstimatorSpec) -> None:
    """``register_adv_est(spec.name)`` of :func:`verl_estimator` (a no-op when verl holds ``spec`` already).

    Raises:
        ValueError: from verl, when it holds another function under ``spec.name``.
    """
    from verl.trainer.ppo import core_algos

    if getattr(core_algos.ADV_ESTIMATOR_REGISTRY.get(spec.name), "spec", None) is spec:
        return
    core_algos.register_adv_est(spec.name)(verl_estimator(spec))


def register_estimators() -> None:
    """Register every declared estimator with verl's ``ADV_ESTIMATOR_REGISTRY``, right after verl executes
    ``verl/trainer/ppo/core_algos.py`` (now, if it already has), and each one declared later. Idempotent."""
    after_import("verl.trainer.ppo.core_algos", _register_declared)


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


# --- 2. compute_advantage: the batch to capo-verl's estimators ----------------------------------------------------
def _declared_advantage(data, spec: EstimatorSpec, config):
    """verl 0.9.1's generic estimator call (the last branch of ``ray_trainer.compute_advantage``) with verl PR
    #7473's ``batch=`` and ``non_tensor_batch=``, and the training step for an estimator that needs it. Delete this
    when verl passes them itself."""
    from verl.trainer.ppo import core_algos
    from verl.trainer.ppo.ray_trainer import compute_response_mask

    if "response_mask" not in data.batch.keys():
        data.batch["response_mask"] = compute_response_mask(data)
    adv_kwargs = {
        "token_level_rewards": data.batch["token_level_rewards"],
        "response_mask": data.batch["response_mask"],
        "config": config,
        "batch": data.batch,
        "non_tensor_batch": data.non_tensor_batch,
    }
    if "uid" in data.non_tensor_batch:
        adv_kwargs["index"] = data.non_tensor_batch["uid"]
    if "reward_baselines" in data.batch.keys():
        adv_kwargs["reward_baselines"] = data.batch["reward_baselines"]
    if spec.needs_training_step:
        step = _TRAINING_STEP.get()
        if step is None:
            step = (getattr(data, "meta_info", None) or {}).get("global_steps")
        if step is not None:
            adv_kwargs["global_step"] = int(step)
    advantages, returns = core_algos.get_adv_estimator_fn(spec.name)(**adv_kwargs)
    data.batch["advantages"] = advantages
    data.batch["returns"] = returns
    return data


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
        "compute_response_mask": ("data",),
    },
)
def _patch_compute_advantage(ray_trainer) -> None:
    """verl/trainer/ppo/ray_trainer.py: wrap ``compute_advantage`` (also used by the v1 trainer, which
    imports it by name in verl/trainer/ppo/v1/utils.py after this patch is applied)."""
    original = ray_trainer.compute_advantage

    bound = inspect.signature(original)

    @functools.wraps(original)
    def compute_advantage(data, adv_estimator, *args, **kwargs):
        config = bound.bind(data, adv_estimator, *args, **kwargs).arguments.get("config")
        spec = declared_spec(adv_estimator)
        if spec is None:  # verl's own estimators: verl's code path, untouched
            out = original(data, adv_estimator, *args, **kwargs)
        else:
            out = _declared_advantage(data, spec, config)
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


# --- 3. reference policy gate --------------------------------------------------------------------------------
def estimator_needs_reference_policy(config) -> bool:
    """True if ``config.algorithm.adv_estimator`` is one of capo-verl's and asks for ``ref_log_prob``
    (its declared ``needs_reference_policy``)."""
    algorithm = config.algorithm
    spec = declared_spec(algorithm.adv_estimator)
    needs = spec and spec.needs_reference_policy
    return bool(needs and needs(algorithm))


@patch("verl.trainer.ppo.utils", {"need_reference_policy": ("config",)})
def _patch_need_reference_policy(utils) -> None:
    """verl/trainer/ppo/utils.py: ``need_reference_policy`` is ``use_kl_in_reward or use_kl_loss``; add the
    estimator's own need. Applied before main_ppo.py, ray_trainer.py and v1/trainer_base.py import it. The start
    block says why the pass is on (:func:`capo_verl.compat.start_report.start_report`)."""
    original = utils.need_reference_policy

    @functools.wraps(original)
    def need_reference_policy(config) -> bool:
        return original(config) or estimator_needs_reference_policy(config)

    utils.need_reference_policy = need_reference_policy


# --- 4. estimator metrics into the v1 trainer's step metrics ------------------------------------------------
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
