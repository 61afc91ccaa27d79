"""The compute dtype of the CPU configs, chosen by the CPU: bfloat16 where it has bf16 instructions, float32 elsewhere.

Why: torch multiplies bf16 matrices fast only on a CPU with bf16 instructions (x86 ``avx512_bf16`` or
``amx_bf16``). Elsewhere it converts, and a bf16 matmul at SmolLM2-135M's shapes ran at 19.3 GFLOP/s against 126.0
in float32 on an AVX2-only AMD EPYC (``benchmarks/results/compare_step_2026-11-25/matmul_dtype.txt``); the CPU main
job took 41 min there in bf16 (``benchmarks/results/cpu_avx2_2026-11-25/``). float32 is correct on every CPU, so a
CPU whose flags are unknown (no ``flags`` line in ``/proc/cpuinfo``: not Linux on x86) gets float32 too.

Where it applies: ``configs/cpu_base.yaml`` sets the vLLM rollout's ``dtype`` and the actor's and reference's FSDP
``mixed_precision.param_dtype`` to ``${capo_cpu_dtype:torch}`` / ``${capo_cpu_dtype:fsdp}``, an OmegaConf resolver
that :func:`register_resolver` installs (:func:`capo_verl.cpu.install` does, at ``import verl``). The main job, the
GRPO twin and ``capo-verl compare``'s default config extend that profile; ``capo-verl eval generate --dtype auto``
asks :func:`cpu_compute_dtype` directly.

Overrides, the first that is set wins:

1. a value given for the key itself (``actor_rollout_ref.rollout.dtype=bfloat16``, ``eval generate --dtype``):
   it replaces the resolver, per key;
2. the environment variable :data:`ENV_VAR` (``CAPO_VERL_CPU_DTYPE=float32`` or ``bfloat16``), for every key at once;
3. the CPU's flags.

This module imports neither verl nor torch (OmegaConf only inside :func:`register_resolver`).
"""

from __future__ import annotations

import functools
import logging
import os
from collections.abc import Iterable
from typing import NamedTuple

__all__ = [
    "BF16_FLAGS",
    "DTYPES",
    "ENV_VAR",
    "RESOLVER",
    "DtypeChoice",
    "choose_cpu_dtype",
    "cpu_compute_dtype",
    "cpu_flags",
    "register_resolver",
]

logger = logging.getLogger("capo_verl.cpu.precision")

#: CPU flags (``/proc/cpuinfo``) that make bf16 matmuls fast: either one is enough.
BF16_FLAGS = ("avx512_bf16", "amx_bf16")

#: The environment variable that sets the compute dtype of every CPU-config key that has no value of its own.
ENV_VAR = "CAPO_VERL_CPU_DTYPE"

#: The dtypes the choice can give, by their torch names.
DTYPES = ("bfloat16", "float32")

#: The OmegaConf resolver name used in ``configs/cpu_base.yaml``.
RESOLVER = "capo_cpu_dtype"

#: How each dtype is spelled where a config key wants it: ``torch`` (vLLM's ``dtype``, torch names) or ``fsdp``
#: (verl's ``fsdp_config.mixed_precision``, ``PrecisionType`` names).
_SPELLINGS = {"torch": {"bfloat16": "bfloat16", "float32": "float32"}, "fsdp": {"bfloat16": "bf16", "float32": "fp32"}}

#: the end of every reason: how to choose otherwise
_HINT = f"set {ENV_VAR}=float32 or bfloat16 to choose"

_ENV_ALIASES = {"bfloat16": "bfloat16", "bf16": "bfloat16", "float32": "float32", "fp32": "float32"}


class DtypeChoice(NamedTuple):
    """The chosen compute dtype (``bfloat16`` or ``float32``) and why, in words for a log line."""

    dtype: str
    reason: str


def cpu_flags(path: str = "/proc/cpuinfo") -> frozenset[str] | None:
    """The flags of the first CPU listed in ``path`` (x86 Linux: its ``flags`` line), or None where there is none.

    None means "unknown" (no such file, or no ``flags`` line: another OS or architecture), not "no flags".
    """
    try:
        with open(path) as f:
            for line in f:
                key, _, value = line.partition(":")
                if key.strip() == "flags":
                    return frozenset(value.split())
    except OSError:
        return None
    return None


def choose_cpu_dtype(flags: Iterable[str] | None, override: str | None = None) -> DtypeChoice:
    """Choose the compute dtype for a CPU with ``flags``.

    Args:
        flags: the CPU's flags (:func:`cpu_flags`), or None when they are unknown.
        override: the value of :data:`ENV_VAR` (None or ``""``: not set); ``bfloat16``/``bf16`` or
            ``float32``/``fp32``, any case.

    Returns:
        ``bfloat16`` when ``override`` says so, or when it is unset and ``flags`` hold one of :data:`BF16_FLAGS`;
        ``float32`` otherwise. The reason names the override or the flags that decided.

    Raises:
        ValueError: ``override`` is set to anything else.
    """
    if override is not None and override.strip() != "":
        dtype = _ENV_ALIASES.get(override.strip().lower())
        if dtype is None:
            raise ValueError(
                f"{ENV_VAR}={override!r} is not a CPU compute dtype; use {ENV_VAR}=float32 or {ENV_VAR}=bfloat16, "
                f"or unset it to choose by the CPU"
            )
        return DtypeChoice(dtype, f"set by {ENV_VAR}={override.strip()}")
    if flags is None:
        return DtypeChoice("float32", f"the CPU's flags are unknown (no flags line in /proc/cpuinfo); {_HINT}")
    found = [f for f in BF16_FLAGS if f in set(flags)]
    if found:
        return DtypeChoice("bfloat16", f"this CPU has {' and '.join(found)}; {_HINT}")
    return DtypeChoice(
        "float32",
        f"this CPU has neither {' nor '.join(BF16_FLAGS)}, and bf16 matmuls without them ran 6.8-8.9x slower "
        f"than float32 at SmolLM2's shapes on an AVX2-only CPU; {_HINT}",
    )


@functools.lru_cache(maxsize=1)
def cpu_compute_dtype() -> DtypeChoice:
    """:func:`choose_cpu_dtype` for this machine's CPU and :data:`ENV_VAR`, once per process.

    Raises:
        ValueError: :data:`ENV_VAR` holds an unknown value.
    """
    return choose_cpu_dtype(cpu_flags(), os.environ.get(ENV_VAR))


def _resolve(spelling: str = "torch") -> str:
    """The resolver: this CPU's compute dtype, spelled for ``spelling`` (``torch`` or ``fsdp``)."""
    if spelling not in _SPELLINGS:
        raise ValueError(
            f"${{{RESOLVER}:{spelling}}}: unknown spelling {spelling!r}; use ${{{RESOLVER}:torch}} (bfloat16, "
            f"float32) or ${{{RESOLVER}:fsdp}} (bf16, fp32)"
        )
    return _SPELLINGS[spelling][cpu_compute_dtype().dtype]


def register_resolver() -> None:
    """Register the ``capo_cpu_dtype`` OmegaConf resolver (idempotent), used by ``configs/cpu_base.yaml``."""
    from omegaconf import OmegaConf

    if not OmegaConf.has_resolver(RESOLVER):
        OmegaConf.register_new_resolver(RESOLVER, _resolve)


def resolve_in_place(config) -> list[str]:
    """Replace every ``${capo_cpu_dtype:...}`` value in ``config`` by its value, and log the choice once.

    Called on the composed trainer config before verl's checks (the CPU port's hook,
    :func:`capo_verl.cpu.defaults._patch_validate_config`), in the process that starts the run, so the run's other
    processes receive plain values and the choice is logged once.

    Args:
        config: an OmegaConf ``DictConfig`` (changed in place).

    Returns:
        the dotted keys that were resolved (empty when the config uses the resolver nowhere: every key was given
        explicitly, or the config is not a CPU config).

    Raises:
        ValueError: :data:`ENV_VAR` holds an unknown value.
    """
    from omegaconf import DictConfig, OmegaConf

    register_resolver()
    marker = "${" + RESOLVER + ":"
    resolved: list[str] = []

    def walk(node: DictConfig, prefix: str) -> None:
        for key in list(node.keys()):
            dotted = f"{prefix}{key}"
            if OmegaConf.is_interpolation(node, key):
                if marker in str(node._get_node(key)._value()):
                    node[key] = node[key]  # the resolved value replaces the interpolation
                    resolved.append(dotted)
            else:
                child = node._get_node(key)
                if isinstance(child, DictConfig) and not child._is_none() and not child._is_missing():
                    walk(child, dotted + ".")

    walk(config, "")
    if resolved:
        choice = cpu_compute_dtype()
        given = [f"{k}={OmegaConf.select(config, k)}" for k in _KEYS if k not in resolved]
        logger.info(
            "compute dtype %s for %s: %s%s",
            choice.dtype,
            ", ".join(resolved),
            choice.reason,
            f" (given explicitly: {', '.join(given)})" if given else "",
        )
    return resolved


#: The keys ``configs/cpu_base.yaml`` sets through the resolver (a log line names those given explicitly).
_KEYS = (
    "actor_rollout_ref.rollout.dtype",
    "actor_rollout_ref.actor.fsdp_config.mixed_precision.param_dtype",
    "actor_rollout_ref.ref.fsdp_config.mixed_precision.param_dtype",
)
