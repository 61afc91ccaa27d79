"""The small vocabulary of capo-verl's start checks, shared by :mod:`capo_verl.compat.run_checks` and
:mod:`capo_verl.compat.resume`: a key's value in a composed config (:func:`select`, :data:`MISSING`), a value as
written on a Hydra command line (:func:`format_value`, :func:`override`) and a check's one-line refusal
(:class:`Refusal`)."""

from __future__ import annotations

import logging
from dataclasses import dataclass

from omegaconf.errors import OmegaConfBaseException

__all__ = ["MISSING", "Refusal", "format_value", "override", "select"]

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
