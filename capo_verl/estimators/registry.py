"""The one table of capo-verl's estimators, each declared next to its function, in the spirit of verl's
``@register_adv_est`` (``verl/trainer/ppo/core_algos.py``).

An estimator module decorates its ``compute_<name>_outcome_advantage`` with :func:`register_estimator`, which records
an :class:`EstimatorSpec` in :data:`ESTIMATORS` and returns the function unchanged. Nothing here imports verl: the
verl glue (:mod:`capo_verl.compat.advantage`) subscribes with :func:`on_declare` and registers each declared estimator
with verl's ``register_adv_est``, through one wrapper that fills in the declared batch keys; its config section is
checked in verl's ``validate_config`` (:mod:`capo_verl.compat.methods`). Adding an estimator is one decorated
function, in a module of :mod:`capo_verl.estimators` or in any module imported in every process of the run
(verl's ``VERL_USE_EXTERNAL_MODULES=<module>``), declared before or after verl is imported. The rest of capo-verl
reads a method off its :class:`EstimatorSpec`, never its name (``tests/test_method_declared_once.py``)::

    @register_estimator("my_adv", batch_keys=("old_log_probs",), section="my_adv", config_class=MyConfig)
    def compute_my_adv(token_level_rewards, response_mask, index=None, config=None, old_log_probs=None, **kwargs):
        ...
        return advantages, returns  # (bs, response_length) each
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

__all__ = ["ESTIMATORS", "EstimatorSpec", "config_sections", "on_declare", "register_estimator"]


@dataclass(frozen=True)
class EstimatorSpec:
    """How verl calls one of capo-verl's estimators.

    Attributes:
        name: the ``algorithm.adv_estimator`` value.
        fn: the estimator, called as ``fn(token_level_rewards=, response_mask=, index=, config=, **batch_keys)``
            (verl's keywords, then each declared ``data.batch`` tensor that the batch has); it takes ``**kwargs``, as
            verl's own estimators do, for keywords a later verl adds.
        batch_keys: ``data.batch`` tensors passed to ``fn`` as keywords when present.
        section: the ``algorithm.<section>`` it reads.
        config_class: the frozen dataclass that parses that section (``from_algorithm_config(algorithm)``).
        needs_reference_policy: ``f(algorithm_config) -> bool``, true when it needs ``ref_log_prob``; or None.
        needs_training_step: it is passed ``global_step=`` (verl's ``trainer.global_steps``).
        unread_keys: ``f(section_config) -> {key: (why, fix)}``: the keys of its section it does not read under that
            parsed config (CAPO's thresholds with the mask off), each with the reason and another way to make the
            key count; a key typed for it is refused at the start. None: it reads every key of its section.
        check_config: ``f(trainer_config, section_config)``, run by the start checks (``check_method_configs``);
            raises ValueError, one line naming the key and the fix, for a setup it cannot run; or None.
        group_reason: why ``actor_rollout_ref.rollout.n=1`` cannot train it; None: the generic reason.
        trains_without_kl: its recipe has no KL loss (the start report names the key when one is on).
        summary_metrics: ``((label, metric_key), ...)`` whose means the run summary prints.
        resamples: it leaves the per-question weights of CoDaPO's resampling (``algorithm.codapo.resample``).
    """

    name: str
    fn: Callable
    batch_keys: tuple[str, ...]
    section: str
    config_class: type
    needs_reference_policy: Callable[[object], bool] | None = None
    needs_training_step: bool = False
    unread_keys: Callable[[object], Mapping[str, tuple[str, str]]] | None = None
    check_config: Callable[[object, object], None] | None = None
    group_reason: str | None = None
    trains_without_kl: bool = False
    summary_metrics: tuple[tuple[str, str], ...] = ()
    resamples: bool = False


#: ``algorithm.adv_estimator`` name -> how verl calls it; filled by :func:`register_estimator` when the estimator
#: modules are imported (``import capo_verl.estimators`` imports them all).
ESTIMATORS: dict[str, EstimatorSpec] = {}

#: called with each :class:`EstimatorSpec` as it is declared (:func:`on_declare`)
_listeners: list[Callable[[EstimatorSpec], None]] = []


def on_declare(listener: Callable[[EstimatorSpec], None]) -> None:
    """Call ``listener(spec)`` for every estimator declared so far and for each one declared later (once per
    listener, however often this is called with it)."""
    if listener not in _listeners:
        _listeners.append(listener)
    for spec in list(ESTIMATORS.values()):
        listener(spec)


def register_estimator(
    name: str,
    *,
    batch_keys: Sequence[str],
    section: str,
    config_class: type,
    needs_reference_policy: Callable[[object], bool] | None = None,
    needs_training_step: bool = False,
    unread_keys: Callable[[object], Mapping[str, tuple[str, str]]] | None = None,
    check_config: Callable[[object, object], None] | None = None,
    group_reason: str | None = None,
    trains_without_kl: bool = False,
    summary_metrics: Sequence[tuple[str, str]] = (),
    resamples: bool = False,
):
    """Decorator: declare ``fn`` as capo-verl's estimator ``name`` (:class:`EstimatorSpec`); returns ``fn`` unchanged.

    Args:
        name: the ``algorithm.adv_estimator`` value.
        batch_keys: ``data.batch`` tensors ``fn`` takes as keywords, e.g. ``("old_log_probs", "ref_log_prob")``.
        section: the ``algorithm.<section>`` ``fn`` reads (several estimators may share one).
        config_class: the dataclass that parses ``algorithm.<section>``.
        needs_reference_policy: ``f(algorithm_config) -> bool``, true when the run needs ``ref_log_prob``.
        needs_training_step: ``fn`` takes ``global_step=`` (verl's ``trainer.global_steps``).
        unread_keys: ``f(section_config) -> {key: (why, fix)}``, the keys of ``section`` that ``fn`` does not read
            under that config (:attr:`EstimatorSpec.unread_keys`); None when it reads them all.
        check_config, group_reason, trains_without_kl, summary_metrics, resamples: :class:`EstimatorSpec`'s.

    Raises:
        ValueError: ``name`` is already declared by another function, or ``section`` is already parsed by another
            class; once verl is imported, also verl's, when verl holds another function under ``name``.
    """

    def decorator(fn):
        spec = EstimatorSpec(name, fn, tuple(batch_keys), section, config_class, needs_reference_policy,
                             needs_training_step, unread_keys, check_config, group_reason, trains_without_kl,
                             tuple(map(tuple, summary_metrics)), resamples)  # fmt: skip
        known = ESTIMATORS.get(name)
        if known is not None and known.fn is not fn:
            raise ValueError(f"estimator {name!r} is already declared by {known.fn.__module__}.{known.fn.__qualname__}")
        other = config_sections().get(section, config_class)
        if other is not config_class:
            raise ValueError(f"algorithm.{section} is already parsed by {other.__name__}, not {config_class.__name__}")
        ESTIMATORS[name] = spec
        try:
            for listener in list(_listeners):
                listener(spec)
        except Exception:  # e.g. verl holds another function under this name: the declaration did not happen
            del ESTIMATORS[name]
            raise
        return fn

    return decorator


def config_sections() -> dict[str, type]:
    """``algorithm.<section>`` -> the dataclass that parses it, for every declared estimator's section."""
    return {spec.section: spec.config_class for spec in ESTIMATORS.values()}
