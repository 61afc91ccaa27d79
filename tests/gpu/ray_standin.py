"""A stand-in for Ray on a GPU machine that has no Ray: NOT Ray. ``lay_kit.sh`` (``run_on_device.sh``'s kit stage)
copies it to ``<site>/ray/__init__.py`` of its own target folder; nothing else imports it.

verl 0.9.1 imports ``ray`` and ``ray.*`` at module level in the chain of ``verl.trainer.ppo.ray_trainer`` (where
``compute_advantage`` lives) and of ``verl.single_controller``: ``@ray.remote`` on classes, ``ray.ObjectRef`` and
``ray.actor.ActorHandle`` in annotations, ``from ray.util.placement_group import ...``. The CUDA tier and the actor
update check call none of Ray. Here ``ray.remote`` and ``ray.method`` are decorators that return their argument,
``ray.is_initialized()`` is False, any ``ray.<submodule>`` imports, and every other name of any of these modules is
a placeholder class: ``isinstance`` against it is False, and calling or instantiating it raises ``RuntimeError``.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
import types

STANDIN = True
__version__ = "0.0.0+capo-verl-standin"
__path__: list[str] = []  # a package: ``import ray.util.queue`` goes to the finder below


def _refusal(qualname: str):
    def refuse(*args, **kwargs):
        raise RuntimeError(f"{qualname}: this is capo-verl's stand-in for Ray (tests/gpu/ray_standin.py), not Ray")

    return refuse


class _PlaceholderType(type):
    """The type of the placeholders: an attribute of a placeholder is a placeholder too (``ray.actor.ActorHandle``
    when ``ray.actor`` was reached as an attribute, not imported)."""

    def __getattr__(cls, name: str):
        if name.startswith("__"):
            raise AttributeError(name)
        value = _placeholder(f"{cls.__module__}.{cls.__qualname__}.{name}")
        setattr(cls, name, value)
        return value


def _placeholder(qualname: str) -> type:
    module, _, name = qualname.rpartition(".")
    return _PlaceholderType(
        name,
        (),
        {
            "__module__": module,
            "__qualname__": name,
            "__init__": _refusal(qualname),
            "__class_getitem__": classmethod(lambda cls, item: cls),
        },
    )


def _decorator(fn_or_none=None, *args, **kwargs):
    """``@ray.remote``, ``@ray.remote(num_cpus=1)``, ``@ray.method(...)``: the decorated object, unchanged."""
    if callable(fn_or_none) and not args and not kwargs:
        return fn_or_none
    return lambda fn: fn


def is_initialized() -> bool:
    return False


remote = _decorator
method = _decorator


class _StandinModule(types.ModuleType):
    def __getattr__(self, name: str):
        if name.startswith("__"):
            raise AttributeError(name)
        value = _placeholder(f"{self.__name__}.{name}")
        setattr(self, name, value)
        return value


class _Finder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, fullname, path=None, target=None):
        if fullname.startswith(__name__ + "."):
            return importlib.machinery.ModuleSpec(fullname, self, is_package=True)
        return None

    def create_module(self, spec):
        module = _StandinModule(spec.name)
        module.__path__ = []
        return module

    def exec_module(self, module):
        pass


def __getattr__(name: str):
    if name.startswith("__"):
        raise AttributeError(name)
    value = _placeholder(f"{__name__}.{name}")
    globals()[name] = value
    return value


if not any(isinstance(finder, _Finder) for finder in sys.meta_path):
    sys.meta_path.insert(0, _Finder())
