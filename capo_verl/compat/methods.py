"""The methods' config check in verl's ``validate_config``.

Each estimator declares its name, batch keys, config section and needs next to its function
(:func:`capo_verl.estimators.registry.register_estimator`); :data:`ESTIMATORS` is that table, registered with verl by
:func:`capo_verl.compat.advantage.register_estimators`.

**Config check** (:func:`check_method_configs`): verl's ``validate_config`` (``verl/utils/config.py``; called by
``verl.trainer.main_ppo.main`` and ``main_ppo_v0`` before Ray starts and before any model loads, and by the
repository's ``scripts/_common.sh --dry-run``) first runs this check, one hook for every method:

- ``algorithm.capo.*`` (read by ``capo`` and ``grpo_mask``), ``algorithm.codapo.*``, ``algorithm.cde.*``: parsed
  by :class:`~capo_verl.estimators.CapoConfig`, :class:`~capo_verl.estimators.CodapoConfig`,
  :class:`~capo_verl.estimators.CdeConfig` whenever the section is present or the selected estimator reads it
  (unknown keys, wrong types, out-of-range values, CoDaPO's resampling keys (``compat/codapo_sampling.py``));
- an ablation of ``configs/ablation/`` that changes a section the run's estimator does not read
  (:func:`check_ablation`), and a method key typed on the command line that the run does not read
  (:func:`check_typed_keys`);
- the estimator's own check, declared with it (``EstimatorSpec.check_config``): CAPO's ``ref_low`` > ``ref_high``,
  ``algorithm.cde.w_zero_after_step`` with ``trainer.use_v1=false`` (the legacy trainer never hands the training
  step to the advantage step, so the schedule would fail at the first update, after rollouts);
- ``actor_rollout_ref.actor.policy_loss.loss_mode=simko``: :func:`capo_verl.compat.simko.check_simko_setup`
  (SimKO's keys, ``top_k`` against a local model's vocabulary, setups the SimKO plumbing does not cover).
- values read only later in the run (:func:`check_start_values`), each parsed by the function its use site
  calls, so that the two cannot disagree: ``trainer.val_calib`` (first validation pass;
  :func:`capo_verl.compat.validation.parse_val_calib`), ``reward.custom_reward_function.reward_kwargs.timeout_s``
  when the reward is capo-verl's (first reward call; :func:`capo_verl.reward.check_timeout`; any other
  ``reward_kwargs`` key, which ``compute_score`` would ignore, is refused), the environment
  variable ``CAPO_REWARD_PROCS`` (first math-verify call; :func:`capo_verl.reward.reward_procs`).
  The launcher's environment is what Ray hands to its workers, so checking it there checks theirs. (On a host
  without an accelerator the CPU port's hook runs before these:
  :func:`capo_verl.cpu.defaults._patch_validate_config`.)

- ``algorithm.adv_estimator`` not registered (:func:`check_estimator`, listing the registered names), a group
  estimator with ``actor_rollout_ref.rollout.n`` < 2 (:func:`check_group_size`);
- the verl keys a run needs, read late or silently (:func:`capo_verl.compat.run_checks.check_run_config`:
  steps, epochs, save/test frequency, resume mode, data files, batch divisibility).

Every refusal is one ValueError line naming the key, the value, what is allowed and a fix that works when
appended to the command line. ``python -m verl.trainer.main_ppo_v0`` runs the legacy
trainer whatever ``trainer.use_v1`` says; the check cannot see that.

:func:`capo_verl.compat.install` (called by :mod:`capo_verl.plugin`, the ``verl.plugins`` entry point loaded at every
``import verl``) calls :func:`hook_validate_config`, which applies its patch right after verl executes
``verl/utils/config.py`` (:func:`capo_verl.compat.after_import`).
"""

from __future__ import annotations

import difflib
import functools
from pathlib import Path

import capo_verl.estimators  # noqa: F401  imports every estimator module, so each has declared itself
from capo_verl import reward as capo_reward
from capo_verl.estimators.capo import check_mask_thresholds
from capo_verl.estimators.registry import ESTIMATORS, EstimatorSpec, config_sections

from .codapo_sampling import check_resample_setup, resample_config
from .patching import after_import, patch
from .run_checks import MISSING, batch_problem, check_run_config, format_value, select
from .run_summary import remember_command
from .simko import check_simko_setup, loss_mode_of
from .start_report import log_start_report
from .validation import REQUIRED, parse_val_calib, val_calib_mode

__all__ = [
    "ESTIMATORS",
    "EstimatorSpec",
    "VERL_GROUP_ESTIMATORS",
    "check_estimator",
    "check_group_size",
    "check_mask_thresholds",  # CAPO's check_config, declared in capo_verl.estimators.capo
    "check_method_configs",
    "check_start_values",
    "hook_validate_config",
    "registered_estimators",
]


def _get(node, key: str):
    return node.get(key, None) if node is not None and hasattr(node, "get") else None


def is_capo_reward(custom_reward_function) -> bool:
    """True if ``reward.custom_reward_function`` names capo-verl's reward (:func:`capo_verl.reward.compute_score`):
    ``path`` is ``pkg://capo_verl.reward`` or the file of that module, and ``name`` is ``compute_score`` (or unset,
    verl's default)."""
    path = _get(custom_reward_function, "path")
    name = _get(custom_reward_function, "name")
    if not isinstance(path, str) or name not in (None, "compute_score"):
        return False
    if path.startswith("pkg://"):
        return path[len("pkg://") :] == capo_reward.__name__
    return Path(path).expanduser().resolve() == Path(capo_reward.__file__).resolve()


def check_start_values(config) -> None:
    """Check, before the run starts, the values that the run itself reads only later (module docstring, point 2).

    Args:
        config: the composed trainer config (OmegaConf ``DictConfig``); the environment is ``os.environ``.

    Raises:
        ValueError: ``trainer.val_calib`` is not true/false/auto/null; capo-verl's reward has a ``timeout_s``
            that is not a finite number > 0, or a ``reward_kwargs`` key other than ``timeout_s``;
            ``CAPO_REWARD_PROCS`` is not an integer >= 1. One line naming the key or variable, the value and the
            allowed range.
    """
    parse_val_calib(_get(_get(config, "trainer"), "val_calib"))
    custom = _get(_get(config, "reward"), "custom_reward_function")
    if is_capo_reward(custom):
        kwargs = _get(custom, "reward_kwargs")
        for key in kwargs or ():
            if key != "timeout_s":  # compute_score's **kwargs would take it and ignore it
                raise ValueError(
                    f"reward.custom_reward_function.reward_kwargs.{key}: capo_verl.reward.compute_score takes only "
                    "timeout_s; remove this key (a misspelt timeout_s would be ignored)"
                )
        if kwargs is not None and "timeout_s" in kwargs:
            capo_reward.check_timeout(kwargs["timeout_s"])
    capo_reward.reward_procs()


#: verl's own estimators that compare the responses to one prompt (a group of ``actor_rollout_ref.rollout.n``):
#: with one response per prompt, verl's group statistics fall back to mean 0 and std 1 (``core_algos.py``), and the
#: method loses its baseline without a word.
VERL_GROUP_ESTIMATORS = (
    "grpo",
    "grpo_vectorized",
    "grpo_passk",
    "gdpo",
    "rloo",
    "rloo_vectorized",
    "opo",
    "gpg",
    "reinforce_plus_plus_baseline",
)

#: Hints tried, in order, for ``actor_rollout_ref.rollout.n`` (the first whose batch sizes split is suggested).
_GROUP_SIZES = (4, 8, 2, 16, 3, 5, 6, 7, 12, 32)


def registered_estimators() -> list[str]:
    """The names ``algorithm.adv_estimator`` takes: verl 0.9.1's ``ADV_ESTIMATOR_REGISTRY`` (with capo-verl's)."""
    from verl.trainer.ppo import core_algos  # registers capo-verl's estimators too (advantage.register_estimators)

    return sorted(core_algos.ADV_ESTIMATOR_REGISTRY)


def check_estimator(config) -> str | None:
    """``algorithm.adv_estimator`` as a name; ValueError, listing the registered names, if it is not one.

    verl itself reads the name only when it computes the first advantage, after the model, the rollout and the
    validation pass (``ValueError: Unknown advantage estimator simply: <name>``)."""
    name = _get(_get(config, "algorithm"), "adv_estimator")
    name = getattr(name, "value", name)
    if name is None:
        return None
    known = registered_estimators()
    if name not in known:
        guess = difflib.get_close_matches(str(name).lower(), known, n=1, cutoff=0.5)
        ours = [n for n in known if n in ESTIMATORS]
        verls = [n for n in known if n not in ESTIMATORS]
        raise ValueError(
            f"algorithm.adv_estimator={name}: not a registered advantage estimator; capo-verl's: {', '.join(ours)}; "
            f"verl's: {', '.join(verls)}; set e.g. algorithm.adv_estimator={guess[0] if guess else (ours or known)[0]}"
        )
    return name


def check_group_size(config, name: str | None) -> None:
    """A group estimator (capo-verl's, or one of :data:`VERL_GROUP_ESTIMATORS`) needs ``actor_rollout_ref.rollout.n``
    >= 2 in a run that trains (a ``trainer.val_only`` run computes no advantage); ValueError saying why (the
    estimator's declared :attr:`~capo_verl.estimators.registry.EstimatorSpec.group_reason`, else that it loses its
    baseline), with an ``n`` whose batch sizes split (:func:`~.run_checks.batch_problem`)."""
    if name not in ESTIMATORS and name not in VERL_GROUP_ESTIMATORS or select(config, "trainer.val_only") is True:
        return
    n = select(config, "actor_rollout_ref.rollout.n")
    if n is MISSING or isinstance(n, int) and not isinstance(n, bool) and n >= 2:
        return
    why = getattr(ESTIMATORS.get(name), "group_reason", None)  # declared with the estimator; None: the generic one
    if why is None:
        why = (
            f"{name} compares each response with the other responses to its prompt; with one there are none, and "
            "verl's group statistics fall back to mean 0 and std 1: the run would train without the method's baseline"
        )
    fix = next((g for g in _GROUP_SIZES if batch_problem(config, n=g) is None), 4)
    raise ValueError(
        f"actor_rollout_ref.rollout.n={format_value(n)}: algorithm.adv_estimator={name} needs an integer >= 2 "
        f"(responses per prompt): {why}; set actor_rollout_ref.rollout.n={fix}"
    )


def check_ablation(config, name: str | None) -> None:
    """An ablation of ``configs/ablation/`` (``ablation=<file>``) changes a method section the run's estimator reads.

    The file names itself (``capo_run.ablation``) and the ``algorithm.<section>`` it changes (``capo_run.changes``;
    ``configs/base.yaml``). ``+ablation=tau0.4`` on the GRPO config set ``algorithm.capo.tau``, which GRPO never reads,
    named the run ``grpo_tau0.4`` and trained plain GRPO. A config without ``capo_run`` (verl's own, the CPU configs)
    is not checked.

    A key the ablation stands for (``capo_run.sets``) typed on the command line as well is refused:
    ``ablation=tau0.4 algorithm.capo.tau=0.9`` named the run ``..._tau0.4`` and trained tau 0.9. So is a typed
    ``algorithm.adv_estimator`` other than ``capo_run.method``, where that names an estimator (not GSPO, SimKO), without
    a typed ``trainer.experiment_name``: the CAPO recipe with ``algorithm.adv_estimator=grpo`` trained GRPO as capo_...

    Raises:
        ValueError: the estimator ``name`` does not read ``algorithm.<changes>``; the message names the ablation, the
            section, the estimators that read it and a fix. Or a typed override of a key in ``capo_run.sets``, or of
            the recipe's estimator (naming the method, the run name and both fixes).
    """
    run = _get(config, "capo_run")
    ablation = _get(run, "ablation")
    stands_for = set(_get(run, "sets") or ())
    typed = _typed_overrides()
    for arg in typed:
        key = arg.partition("=")[0].lstrip("+")
        if key in stands_for:
            raise ValueError(
                f"{arg}: ablation={ablation} sets {key} itself (the run is named after it, "
                f"capo_run.tag={_get(run, 'tag')}), so the run would train another value under the ablation's name; "
                f"remove {arg} from the command line, or drop ablation={ablation} and type the keys you want"
            )
    keys, method = {a.partition("=")[0].lstrip("+") for a in typed}, _get(run, "method")
    renamed = "trainer.experiment_name" in keys
    if "algorithm.adv_estimator" in keys and not renamed and name != method and method in registered_estimators():
        run_name = _get(_get(config, "trainer"), "experiment_name")
        raise ValueError(
            f"algorithm.adv_estimator={name}: the {method} recipe (capo_run.method={method}) would train {name} as "
            f"{run_name}; run the recipe of {name} (bash scripts/run_{name}_qwen2.5_math_{_get(run, 'model_size')}.sh"
            f", where there is one), or also set trainer.experiment_name={run_name}_{name}"
        )
    changes = _get(run, "changes")
    if changes is None or name is None:
        return
    readers = sorted(spec.name for spec in ESTIMATORS.values() if spec.section == changes)
    if name in readers:
        return
    raise ValueError(
        f"ablation={ablation}: it changes algorithm.{changes}, which algorithm.adv_estimator={name} does not read "
        f"(read by {', '.join(readers) or 'no estimator'}), so the run would train {name} under the ablation's "
        f"name; drop ablation={ablation}, or run it on a recipe of {' or '.join(readers) or 'its method'} (e.g. "
        f"bash scripts/run_capo_qwen2.5_math_1.5b.sh ablation={ablation})"
    )


#: the section of SimKO's keys, read only with ``actor_rollout_ref.actor.policy_loss.loss_mode=simko``
SIMKO_SECTION = "actor_rollout_ref.actor.policy_loss.simko."


def _typed_overrides() -> list[str]:
    """The Hydra overrides typed on the command line: a launch script's ``--dry-run``'s, else, in the trainer's own
    process, ``sys.argv``; empty where a config is only composed (:func:`~.run_checks.data_files_checked`)."""
    from . import run_checks

    if not run_checks.data_files_checked():
        return []
    return [a for a in run_checks.command_overrides() if "=" in a and not a.startswith(("-", "~"))]


def check_typed_keys(config, name: str | None) -> None:
    """A key typed on the command line for a method the run does not use is refused: ``algorithm.<section>.*`` of a
    section the estimator ``name`` does not read (``+algorithm.capo.tau=0.4`` on the GRPO config was accepted and
    trained plain GRPO), a key of the estimator's own section that it does not read under the run's values
    (:attr:`~capo_verl.estimators.registry.EstimatorSpec.unread_keys`: ``algorithm.capo.ref_low`` with the mask
    off, ``algorithm.capo.tau`` with grpo_mask), and SimKO's keys without ``loss_mode=simko``. Only the command
    line's keys: a config may carry a section for another run (``configs/compare_smollm2_135m_cpu.yaml`` sets CAPO's
    thresholds for its GRPO run too).

    Raises:
        ValueError: naming the override, the estimators (or the loss mode) that read it, and a fix.
    """
    spec = ESTIMATORS.get(name)
    used = spec.section if spec is not None else None
    unread = None
    for arg in _typed_overrides():
        key = arg.partition("=")[0].lstrip("+")
        section = key.split(".")[1] if key.startswith("algorithm.") and key.count(".") >= 2 else None
        if section is not None and section == used and spec.unread_keys is not None:
            if unread is None:
                unread = spec.unread_keys(spec.config_class.from_algorithm_config(_get(config, "algorithm")))
            field = key.split(".")[2]
            if field in unread:
                why, other = unread[field]
                raise ValueError(
                    f"{arg}: algorithm.adv_estimator={name} does not read {key} in this run, as {why}, so nothing "
                    f"would read it; remove it from the command line, or {other}"
                )
        if section in config_sections() and section != used:
            readers = sorted(spec.name for spec in ESTIMATORS.values() if spec.section == section)
            raise ValueError(
                f"{arg}: algorithm.{section}.* is read only by algorithm.adv_estimator={', '.join(readers)}, and this "
                f"run's estimator is {name}, so nothing would read it; remove it from the command line, or set "
                f"algorithm.adv_estimator={readers[0]}"
            )
        if key.startswith(SIMKO_SECTION):
            mode = loss_mode_of(_get(_get(config, "actor_rollout_ref"), "actor"))
            if mode != "simko":
                raise ValueError(
                    f"{arg}: SimKO's keys are read only with actor_rollout_ref.actor.policy_loss.loss_mode=simko, "
                    f"and this run's loss mode is {mode}, so nothing would read it; remove it from the command "
                    "line, or set actor_rollout_ref.actor.policy_loss.loss_mode=simko"
                )


def check_method_configs(config) -> None:
    """Check every capo-verl method's keys in a full trainer config, and the verl keys a run needs right before it
    starts (see the module docstring for what).

    Args:
        config: the composed trainer config (OmegaConf ``DictConfig``), as verl's ``validate_config`` receives it.

    Raises:
        ValueError: an unknown ``algorithm.adv_estimator``, a group estimator with ``rollout.n`` < 2, an invalid
            ``algorithm.capo|codapo|cde.*`` key or value, what the estimator's ``check_config`` refuses
            (``ref_low`` > ``ref_high``, a CDE step schedule on the legacy trainer), a SimKO setup that cannot run,
            a value :func:`~.run_checks.check_run_config` or :func:`check_start_values` refuses; one line naming the
            key, the value, what is allowed and the fix.
    """
    algorithm = _get(config, "algorithm")
    name = check_estimator(config)
    spec = ESTIMATORS.get(name)
    used = spec.section if spec is not None else None
    parsed = {}
    for section, cls in config_sections().items():
        if section == used or _get(algorithm, section) is not None:
            parsed[section] = cls.from_algorithm_config(algorithm)
    if spec is not None and spec.check_config is not None:
        spec.check_config(config, parsed[used])
    check_group_size(config, name)
    check_ablation(config, name)
    check_typed_keys(config, name)
    check_resample_setup(config)
    if _get(_get(config, "actor_rollout_ref"), "actor") is not None:
        check_simko_setup(config)
    check_start_values(config)
    val_calib, reason = val_calib_mode(config)
    check_run_config(
        config,
        steps_per_loader_batch=2 if resample_config(config) is not None else 1,
        val_calib_required=reason if val_calib == REQUIRED else None,
        method_sections=tuple(config_sections()),
    )


@patch("verl.utils.config", {"validate_config": ("config", "use_reference_policy", "use_critic")})
def _patch_validate_config(config_utils) -> None:
    """verl/utils/config.py: ``validate_config`` first runs :func:`check_method_configs`, then verl's own checks, then
    logs what the method will do (:func:`capo_verl.compat.start_report.log_start_report`)."""
    original = config_utils.validate_config
    if getattr(original, "__capo_verl__", False):
        return

    @functools.wraps(original)
    def validate_config(config, use_reference_policy, use_critic):
        check_method_configs(config)
        result = original(config, use_reference_policy, use_critic)
        log_start_report(config, use_reference_policy)
        remember_command()
        return result

    validate_config.__capo_verl__ = True
    config_utils.validate_config = validate_config


def hook_validate_config() -> None:
    """Make verl's ``validate_config`` run :func:`check_method_configs` first, right after verl executes
    ``verl/utils/config.py`` (so ``main_ppo``'s ``from verl.utils.config import validate_config`` binds the hook).

    Raises:
        RuntimeError: (at that import) ``validate_config``'s parameters are not verl 0.9.1's.
    """
    after_import("verl.utils.config", _patch_validate_config)
