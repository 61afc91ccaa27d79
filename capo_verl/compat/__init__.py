"""The one place where capo-verl's methods reach into verl internals.

Everything the methods need of verl's private structure lives in this package, one module per concern:

- :mod:`.advantage`  - ``old_log_probs``/``ref_log_prob`` reach batch-aware estimators through verl's own
  ``compute_advantage``; the reference-policy gate; per-step estimator metrics into the trainer's metrics.
- :mod:`.validation` - per-data-source calibration (``val-calib/...``) in the trainer's validation pass.
- :mod:`.methods`    - registration of capo-verl's estimators and the check of every method's keys in verl's
  ``validate_config``.
- :mod:`.simko`      - the ``simko`` policy loss and the actor's top-K log-probs from verl's FSDP engine.
- :mod:`.codapo_sampling` - CoDaPO's resampling (``algorithm.codapo.resample``): every prompt batch trained on two
  steps, the second time only its top questions by weight, in the v1 trainer.
- :mod:`.start_report` - what the run's method will do, printed once at the start (from the resolved config).
- :mod:`.run_summary` - the summary block and the curves PNG at the end of a run.
- :mod:`.run_checks` - the start checks: verl keys a run needs, read late or silently (called by :mod:`.methods`).
- :mod:`.host`       - whether this host needs the CPU port (:func:`.host.cpu_port_needed`).
- :mod:`.attention`  - ``sdpa`` instead of verl's ``flash_attention_2`` default where CUDA has no ``flash_attn``
  (every host without the CPU port, which does the same on CPU).
- :mod:`.patching`   - the patch machinery, shared with the CPU port.

:func:`install` is called once per process by the ``verl.plugins`` entry point (:mod:`capo_verl.plugin`),
i.e. at ``import verl`` in the launcher, the Ray TaskRunner and every worker. It refuses a verl release
that this package was not tested against (:data:`TESTED_VERL_VERSIONS`), installs the methods' patches, and, only
where verl finds no accelerator, the CPU port (:func:`capo_verl.cpu.install`: the ``cpu`` platform and its patches,
vLLM-CPU, ``/dev/shm``). :func:`installed_patches` lists what a process installed.

Patches are applied with :func:`after_import`: right after verl executes the module that *defines* a
name, so every module that later does ``from that.module import name`` binds the patched object.

Every patch is declared with :func:`patch` (listed in :data:`PATCHES`): the module it changes and, for each name it
replaces or wraps, the parameters it was written against. Before the patch runs, :func:`check_targets` compares them
with the installed code and raises an error that names the function and the installed release, so a verl (or vLLM)
upgrade that changed a patched function stops the run instead of being patched wrongly. :func:`after_import` takes
declared patches only.
"""

from __future__ import annotations

import functools
import logging
from types import ModuleType

from . import patching
from .patching import (
    PATCHES,
    TESTED_VERL_VERSIONS,
    Patch,
    after_import,
    around_import,
    check_signature,
    check_targets,
    check_verl_version,
    declared_patch,
    installed_patches,
    installed_release,
    patch,
)

__all__ = [
    "PATCHES",
    "Patch",
    "TESTED_VERL_VERSIONS",
    "after_import",
    "around_import",
    "check_signature",
    "check_targets",
    "check_verl_version",
    "declared_patch",
    "install",
    "installed_patches",
    "installed_release",
    "patch",
    "patching",
]

logger = logging.getLogger("capo_verl")
_installed = False


@patch("verl.utils.config", {"validate_config": ("config", "use_reference_policy", "use_critic")})
def _refuse_validate_config(config_utils: ModuleType) -> None:
    """``verl/utils/config.py``: ``validate_config`` raises :data:`.patching.INSTALL_ERROR`, so a run stops at its
    start.

    verl's plugin loader hides the plugin's exception; without this a run would go on without capo-verl's patches
    and fail later with an error that does not name the cause.
    """
    original = config_utils.validate_config

    @functools.wraps(original)
    def validate_config(*args, **kwargs):
        error = patching.INSTALL_ERROR
        raise RuntimeError(f"capo-verl could not install itself into verl: {error}") from error

    config_utils.validate_config = validate_config


def install() -> None:
    """Install capo-verl into verl in this process (idempotent): the methods' patches always, the CPU port only where
    verl finds no accelerator.

    The methods' patches: the batch-aware estimators' glue and the reference-pass gate (:mod:`.advantage`), CoDaPO's
    resampling (:mod:`.codapo_sampling`), ``val-calib`` (:mod:`.validation`), SimKO's loss and top-K log-probs
    (:mod:`.simko`) and the config check in verl's ``validate_config`` (:func:`.methods.hook_validate_config`). The
    CPU port (:func:`capo_verl.cpu.install`) where :func:`.host.cpu_port_needed` says verl will resolve its ``cpu``
    platform: ``VERL_PLATFORM=cpu``, or no accelerator seen by torch nor claimed by a verl platform.
    Everywhere else, :mod:`.attention`'s patch (``sdpa`` where CUDA has no importable ``flash_attn``).
    :func:`installed_patches` lists what was installed. The estimators are registered by the entry point
    (:func:`.advantage.register_estimators`) in any case.

    Raises:
        RuntimeError: verl's version is untested, or one of the patches no longer fits verl's (or vLLM's) code.
            The error is also kept in :data:`.patching.INSTALL_ERROR`, logged at ERROR level (verl's plugin loader
            swallows plugin exceptions at DEBUG level), and raised again by verl's ``validate_config`` at the start
            of a run (:func:`_refuse_validate_config`).
    """
    global _installed
    if _installed:
        return
    try:
        check_verl_version()
        from . import advantage, attention, codapo_sampling, host, methods, ray_wait, run_summary, simko, validation
        from . import checkpoint_stamp as stamps

        for part in (advantage, codapo_sampling, validation, simko, run_summary, ray_wait, stamps):
            part.install()
        methods.hook_validate_config()
        if host.cpu_port_needed():
            import capo_verl.cpu  # the CPU port's one door; only here, so a GPU node never loads it

            capo_verl.cpu.install()
        else:
            attention.install()
    except Exception as exc:
        patching.INSTALL_ERROR = exc
        logger.error("capo-verl could not install itself into verl: %s", exc, exc_info=True)
        after_import("verl.utils.config", _refuse_validate_config)
        raise
    _installed = True
