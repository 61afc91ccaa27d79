"""What a run's method will do, read off its resolved config and printed once at the start.

:func:`start_report` is called by capo-verl's hook of verl's ``validate_config`` (``verl/utils/config.py``;
:func:`capo_verl.compat.methods.hook_validate_config`) after every check passed, in the process that starts the run
(``verl.trainer.main_ppo.main``, before Ray starts) and in the launch scripts' ``--dry-run``. One block, one log
record on the ``capo_verl`` logger:

- the advantage estimator and its keys (capo-verl's: the parsed ``algorithm.<section>``; verl's ``grpo``: its
  ``norm_adv_by_std_in_grpo``);
- the KL term in the loss (``actor_rollout_ref.actor.use_kl_loss``, ``kl_loss_type``, ``kl_loss_coef``) and in the
  reward (``algorithm.use_kl_in_reward``, ``kl_penalty``, ``kl_ctrl.kl_coef``), on or off; with a KL loss and an
  estimator declared ``trains_without_kl`` (CAPO's recipe), that its recipe has none and the key that turns it off;
- the reference pass (verl's ``need_reference_policy``, with capo-verl's gate);
- with the noise mask on (a section parsed by ``CapoConfig``), the model its thresholds were measured on
  (:func:`thresholds_warning`), logged again as a WARNING when it is not the run's reference model;
- ``val-calib/*`` on or off and why (:func:`capo_verl.compat.validation.val_calib_mode`);
- the dtypes verl uses: the rollout's, and the actor's and the reference model's parameters and compute dtype
  (:func:`dtype_line`).
"""

from __future__ import annotations

import dataclasses
import logging
import os

from capo_verl.estimators.capo import COMMITTED_THRESHOLDS, CapoConfig
from capo_verl.estimators.registry import ESTIMATORS

from .run_checks import MISSING, format_value, select
from .validation import OFF, REQUIRED, val_calib_mode

logger = logging.getLogger("capo_verl")


def _value(config, key: str, absent: str = "absent"):
    value = select(config, key)
    return absent if value is MISSING else format_value(value)


def _estimator_line(config, name: str) -> str:
    spec = ESTIMATORS.get(name)
    if spec is not None:
        parsed = spec.config_class.from_algorithm_config(select(config, "algorithm"))
        fields = ", ".join(f"{f.name}={format_value(getattr(parsed, f.name))}" for f in dataclasses.fields(parsed))
        return f"estimator: {name} (capo-verl; algorithm.{spec.section}: {fields})"
    if name in ("grpo", "grpo_vectorized"):
        norm = _value(config, "algorithm.norm_adv_by_std_in_grpo")
        return f"estimator: {name} (verl's; algorithm.norm_adv_by_std_in_grpo={norm})"
    return f"estimator: {name} (verl's)"


def kl_lines(config, name: str) -> list[str]:
    """The KL lines of the block: in the loss and in the reward, each on or off with its type and coefficient; with
    a KL loss and an estimator declared with ``trains_without_kl`` (CAPO's recipe,
    ``configs/capo_qwen2.5_math_1.5b.yaml``), that its recipe trains without it and the key that turns it off."""
    actor = "actor_rollout_ref.actor"
    if select(config, f"{actor}.use_kl_loss") is True:
        loss = (
            f"KL in loss: on ({actor}.use_kl_loss=true, kl_loss_type={_value(config, f'{actor}.kl_loss_type')}, "
            f"kl_loss_coef={_value(config, f'{actor}.kl_loss_coef')})"
        )
        spec = ESTIMATORS.get(name)
        if spec is not None and spec.trains_without_kl:
            loss += f"; {name}'s recipe trains without it: set {actor}.use_kl_loss=false for its recipe"
    else:
        loss = f"KL in loss: off ({actor}.use_kl_loss={_value(config, f'{actor}.use_kl_loss')})"
    if select(config, "algorithm.use_kl_in_reward") is True:
        reward = (
            f"KL in reward: on (algorithm.use_kl_in_reward=true, kl_penalty={_value(config, 'algorithm.kl_penalty')}, "
            f"kl_ctrl.type={_value(config, 'algorithm.kl_ctrl.type')}, "
            f"kl_ctrl.kl_coef={_value(config, 'algorithm.kl_ctrl.kl_coef')})"
        )
    else:
        reward = f"KL in reward: off (algorithm.use_kl_in_reward={_value(config, 'algorithm.use_kl_in_reward')})"
    return [loss, reward]


def _reference_line(config, name: str, use_reference_policy: bool) -> str:
    if not use_reference_policy:
        return "reference pass: off (no KL term, and the estimator needs no ref_log_prob)"
    from .advantage import estimator_needs_reference_policy

    why = []
    if (
        select(config, "actor_rollout_ref.actor.use_kl_loss") is True
        or select(config, "algorithm.use_kl_in_reward") is True
    ):
        why.append("for the KL term")
    if estimator_needs_reference_policy(config):
        why.append(
            f"for the estimator: algorithm.adv_estimator={name} with algorithm.capo.use_mask=true needs ref_log_prob "
            "for the reference-PPL noise mask (paper Eqs. 16-18), without a KL term"
        )
    return f"reference pass: on, ref_log_prob each step ({'; '.join(why) or 'verl asked for it'})"


def thresholds_warning(config, name: str) -> str | None:
    """With the noise mask on (``algorithm.capo.use_mask``, estimators whose section parses to
    :class:`~capo_verl.estimators.capo.CapoConfig`): the warning when ``[ref_low, ref_high]`` are the pair measured
    on another model than the reference (``actor_rollout_ref.model.path``, whose folder name does not contain the
    model of :data:`~capo_verl.estimators.capo.COMMITTED_THRESHOLDS`, case ignored), else None. Thresholds of no
    committed model (e.g. the user's own, from ``capo-verl mask-thresholds``) are not questioned.

    A perplexity window is the reference model's: the paper's [1.05, 2.5] (Qwen2.5-Math) on SmolLM2-135M, whose
    quartiles are [3.97, 6.43], would mask most of its incorrect responses and few correct ones."""
    spec = ESTIMATORS.get(name)
    if spec is None or spec.config_class is not CapoConfig:
        return None
    capo = spec.config_class.from_algorithm_config(select(config, "algorithm"))
    measured_on = next((m for m, pair in COMMITTED_THRESHOLDS.items() if pair == (capo.ref_low, capo.ref_high)), None)
    path = select(config, "actor_rollout_ref.model.path")
    if not capo.use_mask or measured_on is None or not isinstance(path, str):
        return None
    folder = os.path.basename(os.path.normpath(os.path.expanduser(path)))
    if measured_on in folder.lower():
        return None
    return (
        f"algorithm.capo.ref_low={capo.ref_low:g}, ref_high={capo.ref_high:g} are the thresholds measured on "
        f"{measured_on}, and the reference model is {folder} (actor_rollout_ref.model.path): a perplexity window is "
        "its model's; measure this one's with `capo-verl mask-thresholds --model <actor_rollout_ref.model.path> "
        "--data <training parquet> --out thresholds.json` and paste its overrides"
    )


def _val_calib_line(config) -> str:
    if select(config, "data.val_files") in (MISSING, None, ""):
        return "val-calib: off (no data.val_files: no validation)"
    mode, reason = val_calib_mode(config)
    if mode == OFF:
        return f"val-calib: off ({reason})"
    if mode == REQUIRED:
        return f"val-calib: on ({reason})"
    return f"val-calib: when the validation responses carry log-probs ({reason})"


#: the FSDP strategies of verl's engine (``verl/workers/engine/fsdp/transformer_impl.py``), whose dtypes
#: :func:`dtype_line` reads
FSDP_STRATEGIES = ("fsdp", "fsdp2")


def _engine_dtypes(config, role: str) -> str:
    """The dtypes of ``actor_rollout_ref.<role>``'s FSDP engine as verl 0.9.1 uses them
    (``verl/workers/engine/fsdp/transformer_impl.py``): ``_build_module`` loads the weights in
    ``fsdp_config.model_dtype`` (unset: fp32 to train, bf16 when ``forward_only``), ``_build_fsdp_module`` computes in
    ``fsdp_config.mixed_precision.param_dtype`` (no ``mixed_precision``, or no key in it: bf16; autocast off when it
    is fp32) and reduces gradients in its ``reduce_dtype`` (default fp32)."""
    fsdp = f"actor_rollout_ref.{role}.fsdp_config"
    strategy = select(config, f"actor_rollout_ref.{role}.strategy")
    if strategy not in FSDP_STRATEGIES:
        return f"{role}: not read (actor_rollout_ref.{role}.strategy={format_value(strategy)}, not FSDP)"
    forward_only = select(config, f"{fsdp}.forward_only") is True
    params = select(config, f"{fsdp}.model_dtype")
    if params in (MISSING, None):
        params = f"{'bf16' if forward_only else 'fp32'} (verl's default)"
    else:
        params = f"{format_value(params)} (fsdp_config.model_dtype)"
    mixed = select(config, f"{fsdp}.mixed_precision")
    mixed = mixed if mixed not in (MISSING, None) and hasattr(mixed, "get") else {}

    def mixed_dtype(key: str, default: str) -> str:
        value = mixed.get(key)
        if value is None:
            return f"{default} (verl's default)"
        return f"{format_value(value)} (fsdp_config.mixed_precision.{key})"

    line = f"{role} params {params}, compute {mixed_dtype('param_dtype', 'bf16')}"
    if not forward_only:
        line += f", gradients reduced in {mixed_dtype('reduce_dtype', 'fp32')}"
    return line


def dtype_line(config, use_reference_policy: bool) -> str:
    """The dtype line of the block: the rollout's (``actor_rollout_ref.rollout.dtype``), and for the actor and, when
    the reference pass runs, the reference model, what verl's FSDP engine keeps the parameters in and computes in
    (:func:`_engine_dtypes`): with the recipes' config, parameters fp32 and compute bf16 for both."""
    parts = [f"rollout {_value(config, 'actor_rollout_ref.rollout.dtype')}", _engine_dtypes(config, "actor")]
    parts.append(_engine_dtypes(config, "ref") if use_reference_policy else "ref: no reference pass")
    return "dtype: " + "; ".join(parts)


def start_report(config, use_reference_policy: bool) -> str:
    """The block (module docstring) for the resolved trainer ``config``.

    Args:
        config: the composed trainer config (OmegaConf ``DictConfig``) after verl's ``validate_config`` passed.
        use_reference_policy: what ``verl.trainer.main_ppo`` computed with ``need_reference_policy`` (capo-verl's
            gate included) and passed to ``validate_config``.

    Raises nothing for a config that passed the start checks.
    """
    name = format_value(select(config, "algorithm.adv_estimator"))
    lines = [
        "capo-verl: what this run will do",
        _estimator_line(config, name),
        *kl_lines(config, name),
        _reference_line(config, name, use_reference_policy),
        *([f"mask thresholds: {warning}"] if (warning := thresholds_warning(config, name)) else []),
        _val_calib_line(config),
        dtype_line(config, use_reference_policy),
    ]
    return "\n  ".join(lines)


def log_start_report(config, use_reference_policy: bool) -> None:
    """Log :func:`start_report` once (INFO, ``capo_verl`` logger); nothing for a config without ``algorithm`` or
    ``actor_rollout_ref`` (a partial config checked by a test)."""
    if select(config, "algorithm.adv_estimator") is MISSING or select(config, "actor_rollout_ref.actor") is MISSING:
        return
    logger.info("%s", start_report(config, use_reference_policy))
    warning = thresholds_warning(config, format_value(select(config, "algorithm.adv_estimator")))
    if warning:
        logger.warning("capo-verl: %s", warning)
