"""The small vocabulary of capo-verl's start checks, shared by :mod:`capo_verl.compat.run_checks`,
:mod:`capo_verl.compat.preflight` and :mod:`capo_verl.compat.resume`: a key's value in a composed config
(:func:`select`, :data:`MISSING`), a value as written on a Hydra command line (:func:`format_value`,
:func:`override`), a check's one-line refusal (:class:`Refusal`), and where the checks run: the process that
checks a run (:func:`data_files_checked`, :func:`launch_script_files`), its command line, and whether the run goes
to an existing Ray cluster (:func:`on_ray_cluster`)."""

from __future__ import annotations

import contextlib
import logging
import os
import sys
from collections.abc import Iterable
from dataclasses import dataclass

from omegaconf.errors import OmegaConfBaseException

__all__ = [
    "MISSING",
    "Refusal",
    "Refused",
    "command_overrides",
    "data_files_checked",
    "earlier_value",
    "expected_files",
    "format_value",
    "int_or_none",
    "launch_script_files",
    "on_ray_cluster",
    "override",
    "select",
    "unseen_on_cluster",
]

logger = logging.getLogger("capo_verl")


class _Missing:
    def __repr__(self) -> str:
        return "MISSING"


#: :func:`select`'s answer for a key the config does not have.
MISSING = _Missing()


def select(config, key: str):
    """``config``'s value at the dotted ``key`` (interpolations resolved), or :data:`MISSING`."""
    node = config
    for part in key.split("."):
        if node is None or not hasattr(node, "get"):
            return MISSING
        try:
            if part not in node:
                return MISSING
            node = node.get(part)
        except OmegaConfBaseException as exc:  # a mandatory value left unset (???), an unresolvable interpolation
            logger.debug("capo-verl start checks: %s not read (%s); verl's own checks name it", key, exc)
            return MISSING
    return node


def format_value(value) -> str:
    """``value`` written as on a Hydra command line: ``null``, ``true``, ``[a,b]``, plain numbers and strings."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (list, tuple)) or (hasattr(value, "__iter__") and not isinstance(value, (str, bytes))):
        return "[" + ",".join(format_value(v) for v in value) + "]"
    return str(value)


def override(config, key: str, value) -> str:
    """The Hydra override that sets ``key`` to ``value`` on the command line of ``config``: ``key=value`` when the
    composed config has the key, ``+key=value`` when it lacks it (then Hydra refuses an override without ``+``,
    and with it when the key exists: ``Could not append to config``)."""
    plus = "" if select(config, key) is not MISSING else "+"
    return f"{plus}{key}={format_value(value)}"


@dataclass(frozen=True)
class Refusal:
    """A rule's refusal: the parts of its one-line message, ``subject: problem; fix``."""

    #: the key and its value as on the command line (``trainer.total_epochs=0``)
    subject: str
    #: what is wrong with it: what is allowed, and what verl would do with it
    problem: str
    #: the override(s) to paste (``set ...``), or the sentence of the fix
    fix: str

    def message(self) -> str:
        """The one-line message of the ``ValueError``."""
        return f"{self.subject}: {self.problem}; {self.fix}"


class Refused(Exception):
    """Raised by a helper of the rules with its :class:`Refusal`, which :func:`run_rules` raises as the rule's."""

    def __init__(self, refusal: Refusal):
        super().__init__(refusal.message())
        self.refusal = refusal


#: Local data files a launch script writes before a real run, and the data keys' values it passes (set by its
#: ``--dry-run`` through :func:`launch_script_files`; empty in a real run, where the files exist by then).
_EXPECTED: dict[str, object] = {"active": False, "files": frozenset(), "overrides": []}


#: ``python -m`` modules whose process reads the data files right after ``validate_config``.
TRAINER_MODULES = ("verl.trainer.main_ppo", "verl.trainer.main_ppo_v0")


def data_files_checked() -> bool:
    """True in the process of a training run, ``python -m verl.trainer.main_ppo`` (or ``main_ppo_v0``), which reads
    the data files next, and within :func:`launch_script_files` (a launch script's ``--dry-run``); False where a
    config is only composed and validated (the tests, ``capo-verl compare``'s checks before it writes its data).
    Where it is True the file system is checked too: the data, the model folder and the folders the run writes."""
    main = sys.modules.get("__main__")
    spec = getattr(main, "__spec__", None)
    return _EXPECTED["active"] or getattr(spec, "name", None) in TRAINER_MODULES


@contextlib.contextmanager
def launch_script_files(files: Iterable[str] = (), overrides: Iterable[str] = ()):
    """Within the block (a launch script's ``--dry-run``), check the data files, except ``files``: those the script
    writes (or says it lacks) before a real run. ``overrides`` are the command's, read by :func:`earlier_value`."""
    saved = dict(_EXPECTED)
    _EXPECTED.update(active=True, files=frozenset(os.path.abspath(f) for f in files), overrides=list(overrides))
    try:
        yield
    finally:
        _EXPECTED.clear()
        _EXPECTED.update(saved)


def expected_files() -> frozenset:
    """The files :func:`launch_script_files` declared."""
    return _EXPECTED["files"]


def command_overrides() -> list[str]:
    """The command's Hydra overrides: a launch script's ``--dry-run``'s (:func:`launch_script_files`), else this
    process's ``sys.argv[1:]`` (the trainer's command line where :func:`data_files_checked`)."""
    return list(_EXPECTED["overrides"]) if _EXPECTED["active"] else sys.argv[1:]


def earlier_value(key: str) -> str | None:
    """The value an earlier override of the command gave ``key`` when a later one replaced it (a launch script puts
    its own data paths before the user's), or None: from :func:`launch_script_files`'s overrides, else, in the
    trainer's process, its command line."""
    values = [a.partition("=")[2] for a in command_overrides() if a.partition("=")[0].lstrip("+") == key]
    return values[0] if len(values) > 1 else None


def int_or_none(value) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def on_ray_cluster(config) -> bool:
    """Whether the run goes to an existing Ray cluster (``RAY_ADDRESS``, or ``ray_kwargs.ray_init.address``): then
    the driver's machine says nothing about where the run trains, and a path it cannot see may exist on the
    workers' shared file system."""
    address = select(config, "ray_kwargs.ray_init.address")
    return bool(os.environ.get("RAY_ADDRESS")) or (isinstance(address, str) and bool(address.strip()))


def unseen_on_cluster(config, key: str, path: str) -> bool:
    """On a Ray cluster, log a warning that the driver cannot see ``path`` (of ``key``) and return True."""
    if not on_ray_cluster(config):
        return False
    logger.warning(
        "capo-verl: %s=%s is not on this machine; the run goes to a Ray cluster, whose nodes must see it", key, path
    )
    return True
