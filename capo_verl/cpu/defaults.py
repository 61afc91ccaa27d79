"""The CPU port's values for verl's own config: the keys whose verl default cannot work, or works only very slowly,
on a host without an accelerator, set to a value that works, one log line per key.

``verl/utils/config.py``: verl's ``validate_config`` (called by ``verl.trainer.main_ppo.main`` before ``run_ppo``
starts Ray, and by the launch scripts' ``--dry-run``) first applies :data:`SETTINGS` to the composed config when
``trainer.device`` is ``cpu``, so ``python -m verl.trainer.main_ppo trainer.device=cpu ...`` on verl's own
``ppo_trainer`` config starts instead of waiting for resources Ray never has. For each setting:

- the config's value works on a CPU: nothing changes (a capo-verl CPU config, ``configs/cpu_base.yaml``, already
  has these values);
- the value was typed on the command line (``sys.argv`` in verl's process; the launch script's overrides in a
  ``--dry-run``): it wins, or, where it cannot work on a CPU (:attr:`CpuSetting.refuse_typed`), the run is refused
  with a ValueError naming the key and the value that works;
- else the key gets the value that works and one INFO line (``capo_verl.cpu.defaults``) says
  ``CPU port: KEY: OLD -> NEW (WHY)``.

``docs/cpu.md`` (section "What the CPU port sets in verl's own config") lists the same keys with the same reasons;
``tests/test_cpu_defaults.py`` checks the list against :data:`SETTINGS`.
"""

from __future__ import annotations

import functools
import logging
import os
from collections.abc import Callable
from dataclasses import dataclass
from types import ModuleType

from capo_verl.compat.patching import after_import, patch
from capo_verl.compat.run_checks import MISSING, _overridden, format_value, override, select

from . import precision
from .vllm_cpu import sync_timeout_s

logger = logging.getLogger("capo_verl.cpu.defaults")

#: what a setting's value is when the key is absent from the config (``enable_sleep_mode`` is a field of verl's
#: ``RolloutConfig`` dataclass, default True, not in the YAML)
ABSENT = MISSING


def _ranks(config) -> int:
    nnodes = select(config, "trainer.nnodes")
    per_node = select(config, "trainer.n_gpus_per_node")
    nnodes = nnodes if isinstance(nnodes, int) and nnodes >= 1 else 1
    per_node = per_node if isinstance(per_node, int) and per_node >= 1 else 1
    return nnodes * per_node


def _fsdp_dtype(config) -> str:
    return {"bfloat16": "bf16", "float32": "fp32"}[precision.cpu_compute_dtype().dtype]


@dataclass(frozen=True)
class CpuSetting:
    """One key the CPU port sets.

    Attributes:
        key: the dotted config key.
        works: ``works(value, config)``: whether the key's current value (:data:`ABSENT` when the config lacks the
            key) works on a CPU.
        value: ``value(config)``: the value that works.
        why: the reason, for the log line, the refusal and ``docs/cpu.md``.
        refuse_typed: a value typed on the command line that does not work is refused (True), or wins (False:
            it works, only slowly).
    """

    key: str
    works: Callable[[object, object], bool]
    value: Callable[[object], object]
    why: str
    refuse_typed: bool = False


#: Every key the CPU port sets, in the order it sets them (``docs/cpu.md`` lists the same).
SETTINGS: tuple[CpuSetting, ...] = (
    CpuSetting(
        "ray_kwargs.ray_init.num_cpus",
        lambda v, c: isinstance(v, int) and v >= 3 * _ranks(c) + 4,
        lambda c: max(16, 3 * _ranks(c) + 4),
        "logical CPUs for Ray's scheduler, not cores: verl's default null gives Ray the core count, while "
        "TransferQueue's storage, the agent loop, the reward workers and the rollout server each hold one and the "
        "trainer's placement group asks for 3 per rank; with too few the run waits forever in silence",
    ),
    CpuSetting(
        "ray_kwargs.ray_init.num_gpus",
        lambda v, c: isinstance(v, int) and v >= _ranks(c),
        _ranks,
        "verl places each trainer rank on one Ray GPU; on a CPU these are logical (nothing runs on them), and "
        "without them verl stops with 'Total available GPUs 0 is less than total desired GPUs'",
        refuse_typed=True,
    ),
    CpuSetting(
        "transfer_queue.backend.SimpleStorage.num_data_storage_units",
        lambda v, c: v == 1,
        lambda c: 1,
        "verl's 8 TransferQueue storage actors each hold a Ray CPU; one is enough for a single machine",
    ),
    CpuSetting(
        "actor_rollout_ref.rollout.agent.num_workers",
        lambda v, c: v == 1,
        lambda c: 1,
        "verl's 8 agent-loop workers each hold a Ray CPU and a process; one serves a CPU's rollout",
    ),
    CpuSetting(
        "reward.num_workers",
        lambda v, c: v == 1,
        lambda c: 1,
        "verl's 8 reward workers each hold a Ray CPU and a process; one scores a CPU run's responses",
    ),
    CpuSetting(
        "actor_rollout_ref.actor.strategy",
        lambda v, c: v != "fsdp",
        lambda c: "fsdp2",
        "FSDP1 (verl's default strategy fsdp) needs an accelerator device ('Cannot access accelerator device'); "
        "FSDP2 runs over gloo on a CPU",
        refuse_typed=True,
    ),
    CpuSetting(
        "actor_rollout_ref.ref.strategy",
        lambda v, c: v != "fsdp",
        lambda c: "fsdp2",
        "the reference model's engine, as the actor's: FSDP1 needs an accelerator device",
        refuse_typed=True,
    ),
    CpuSetting(
        "actor_rollout_ref.actor.use_torch_compile",
        lambda v, c: v is False,
        lambda c: False,
        "torch.compile of the log-prob kernels costs minutes on a CPU",
    ),
    CpuSetting(
        "actor_rollout_ref.rollout.enable_sleep_mode",
        lambda v, c: v is False,
        lambda c: False,
        "vLLM has no sleep mode on a CPU and refuses to start with it (verl's RolloutConfig default is true; the "
        "key is not in verl's YAML, so on the command line it is +actor_rollout_ref.rollout.enable_sleep_mode)",
        refuse_typed=True,
    ),
    CpuSetting(
        "actor_rollout_ref.rollout.enforce_eager",
        lambda v, c: v is True,
        lambda c: True,
        "vLLM compiles the model at every start without it, about 2.5 minutes on a CPU",
    ),
    CpuSetting(
        "actor_rollout_ref.rollout.enable_chunked_prefill",
        lambda v, c: v is False,
        lambda c: False,
        "after a partial prefill vLLM rewinds a seeded request's generator by an offset that CPU generators lack "
        "('CPU Generator does not use offset': the engine dies), and capo-verl seeds every rollout request on a CPU",
        refuse_typed=True,
    ),
    CpuSetting(
        "actor_rollout_ref.rollout.dtype",
        lambda v, c: v == precision.cpu_compute_dtype().dtype,
        lambda c: precision.cpu_compute_dtype().dtype,
        "the compute dtype by the CPU's flags (capo_verl.cpu.precision): bf16 matmuls without avx512_bf16 or "
        "amx_bf16 ran 6.8-8.9x slower than float32",
    ),
    CpuSetting(
        "actor_rollout_ref.actor.fsdp_config.mixed_precision.param_dtype",
        lambda v, c: (v if v is not ABSENT else "bf16") == _fsdp_dtype(c),
        _fsdp_dtype,
        "the actor's compute dtype by the CPU's flags, as the rollout's (verl's default without the key: bf16)",
    ),
    CpuSetting(
        "actor_rollout_ref.ref.fsdp_config.mixed_precision.param_dtype",
        lambda v, c: (v if v is not ABSENT else "bf16") == _fsdp_dtype(c),
        _fsdp_dtype,
        "the reference pass's compute dtype, as the actor's",
    ),
)


def typed(key: str) -> bool:
    """Whether the command line sets ``key`` (verl's process: ``sys.argv``; a ``--dry-run``: the launch script's
    overrides; :func:`capo_verl.compat.run_checks._overridden`)."""
    return _overridden(key)


def apply(config) -> list[tuple[str, object, object, str]]:
    """Set every key of :data:`SETTINGS` whose value does not work on a CPU and was not typed on the command line,
    logging one line per key; refuse a typed value that cannot work. Only when ``trainer.device`` is ``cpu``.

    Args:
        config: the composed trainer config (OmegaConf ``DictConfig``, struct mode), changed in place.

    Returns:
        ``(key, old, new, why)`` for each key set (old is :data:`ABSENT` where the config lacked the key).

    Raises:
        ValueError: a key of a setting with :attr:`CpuSetting.refuse_typed` was typed with a value that does not
            work on a CPU; the message names the key, the value, why, and the override that works.
    """
    from omegaconf import OmegaConf

    if select(config, "trainer.device") != "cpu":
        return []
    changed = []
    for setting in SETTINGS:
        if _interpolated_by_profile(config, setting.key):
            continue  # ${capo_cpu_dtype:...}: resolved right after, by the same hook
        current = select(config, setting.key)
        if setting.works(current, config):
            continue
        if typed(setting.key):
            if setting.refuse_typed:
                raise ValueError(
                    f"{setting.key}={format_value(current)}: cannot work on a CPU ({setting.why}); set "
                    f"{override(config, setting.key, setting.value(config))}"
                )
            continue
        new = setting.value(config)
        OmegaConf.update(config, setting.key, new, merge=True, force_add=True)
        old = "(absent)" if current is ABSENT else format_value(current)
        logger.info("CPU port: %s: %s -> %s (%s)", setting.key, old, format_value(new), setting.why)
        changed.append((setting.key, current, new, setting.why))
    return changed


def _interpolated_by_profile(config, key: str) -> bool:
    from omegaconf import OmegaConf

    parent_key, _, leaf = key.rpartition(".")
    parent = OmegaConf.select(config, parent_key, default=None, throw_on_resolution_failure=False)
    if parent is None or not OmegaConf.is_dict(parent) or leaf not in parent:
        return False
    return OmegaConf.is_interpolation(parent, leaf) and precision.RESOLVER in str(parent._get_node(leaf)._value())


def record_checkpoint_folder(config) -> str | None:
    """In a run started by :mod:`capo_verl.cpu.launch` (its ledger in ``CAPO_VERL_RUN``), write the resolved
    ``trainer.default_local_dir`` to :func:`capo_verl.cpu.shm.checkpoint_note`, so that the launcher can tell whether
    a stopped run left a checkpoint to resume from. Returns the folder written, or None outside such a run.

    Raises:
        OSError: the note cannot be written beside the ledger.
    """
    from .shm import RUN_ENV, checkpoint_note

    ledger = os.environ.get(RUN_ENV)
    folder = select(config, "trainer.default_local_dir")
    if not ledger or not isinstance(folder, str):
        return None
    with open(checkpoint_note(ledger), "w") as note:
        note.write(os.path.abspath(os.path.expanduser(folder)))
    return folder


@patch("verl.utils.config", {"validate_config": ("config", "use_reference_policy", "use_critic")})
def _patch_validate_config(config_utils: ModuleType) -> None:
    """``verl/utils/config.py``: the CPU port's one hook in ``validate_config`` (called by ``verl.trainer.main_ppo``
    before Ray starts, and by the launch scripts' ``--dry-run``). In this order, before what it ran before
    (capo-verl's method checks, verl's own):

    1. :func:`apply`: :data:`SETTINGS` where ``trainer.device`` is ``cpu``;
    2. the ``${capo_cpu_dtype:...}`` values of ``configs/cpu_base.yaml`` resolved in place
       (:func:`capo_verl.cpu.precision.resolve_in_place`: once, in the process that starts the run, with one log
       line), so that every process of the run receives plain values;
    3. ``CAPO_VERL_WEIGHT_SYNC_TIMEOUT_S`` checked (:func:`capo_verl.cpu.vllm_cpu.sync_timeout_s`, read at the first
       weight sync into vLLM-CPU; the launcher's environment is what Ray hands to its workers);

    and after them, the run's checkpoint folder noted for the launcher (:func:`record_checkpoint_folder`). It wraps
    the methods' hook (:func:`install` runs after :func:`capo_verl.compat.methods.hook_validate_config`), so the
    dtype is resolved before anything reads it.

    Raises (from the wrapped function): ValueError: a setting typed that cannot work on a CPU, a bad dtype or
    timeout value.
    """
    original = config_utils.validate_config
    if getattr(original, "__capo_verl_cpu__", False):
        return

    @functools.wraps(original)
    def validate_config(config, use_reference_policy, use_critic):
        apply(config)
        precision.resolve_in_place(config)
        sync_timeout_s()
        result = original(config, use_reference_policy, use_critic)
        record_checkpoint_folder(config)
        return result

    validate_config.__capo_verl_cpu__ = True
    config_utils.validate_config = validate_config


def install() -> None:
    """The ``capo_cpu_dtype`` resolver of ``configs/cpu_base.yaml`` (:func:`capo_verl.cpu.precision.register_resolver`)
    and the hook above, right after verl executes ``verl/utils/config.py``; called by :func:`capo_verl.cpu.install`.

    Raises:
        RuntimeError: (at that import) ``validate_config``'s parameters are not verl 0.9.1's.
    """
    precision.register_resolver()
    after_import("verl.utils.config", _patch_validate_config)
