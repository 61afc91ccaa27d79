"""Warnings the CPU port knows to be harmless, printed as one line with a count instead of one each.

``verl/workers/engine/__init__.py`` tries every training engine verl supports at import and warns for each one that
is not installed (torchtitan, veomni, automodel, mindspeed, megatron: 10 lines with their source lines, in the
TaskRunner and in every worker). On a CPU the port trains with FSDP2, so none of them is needed. While that module
executes (:func:`capo_verl.compat.patching.around_import`), its warnings are recorded; those matching :data:`KNOWN`
are counted and logged as one INFO line (``capo_verl.cpu.quiet``), every other warning is issued again as it came.

``verl/utils/distributed.py``: ``set_numa_affinity()`` (called by every engine worker,
``verl/workers/engine_workers.py``) pins the process to the NUMA node of its GPU through NVML, and without a GPU
prints "Warning: Failed to set NUMA affinity" in each worker. On a CPU there is no GPU to pin to: the port makes it
do nothing (:func:`_skip_numa_affinity`), logged at DEBUG.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import re
import warnings
from types import ModuleType

from capo_verl.compat.patching import after_import, around_import, patch

logger = logging.getLogger("capo_verl.cpu.quiet")

#: the module whose import warnings are sorted
MODULE = "verl.workers.engine"
#: (pattern of a harmless warning's message, why it is harmless)
KNOWN = (
    (re.compile(r"^\w+ engine is not available: "), "a training engine the CPU port does not use is not installed"),
)


def sort_warnings(caught: list[warnings.WarningMessage]) -> tuple[dict[str, int], list[warnings.WarningMessage]]:
    """``({why: count} of the known ones, [the others])`` of ``caught``."""
    counts: dict[str, int] = {}
    others = []
    for item in caught:
        message = str(item.message)
        why = next((why for pattern, why in KNOWN if pattern.search(message)), None)
        if why is None:
            others.append(item)
        else:
            counts[why] = counts.get(why, 0) + 1
    return counts, others


@contextlib.contextmanager
def _sorted_warnings():
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        yield
    counts, others = sort_warnings(caught)
    for item in others:  # as they came, through the filters in force
        warnings.warn_explicit(item.message, item.category, item.filename, item.lineno, source=item.source)
    if counts:
        logger.info(
            "%d warnings known to be harmless on a CPU not shown (%s) while importing %s",
            sum(counts.values()),
            "; ".join(f"{n} x {why}" for why, n in counts.items()),
            MODULE,
        )


@patch("verl.utils.distributed", {"set_numa_affinity": ()})
def _skip_numa_affinity(distributed: ModuleType) -> None:
    """``verl/utils/distributed.py``: ``set_numa_affinity`` does nothing on a CPU (module docstring)."""
    original = distributed.set_numa_affinity

    @functools.wraps(original)
    def set_numa_affinity(*args, **kwargs):
        logger.debug("set_numa_affinity skipped: no GPU to pin this process's NUMA node to")

    distributed.set_numa_affinity = set_numa_affinity


def install() -> None:
    """Sort the warnings of :data:`MODULE`'s import and skip verl's GPU NUMA pinning (module docstring); called by
    :func:`capo_verl.cpu.install`.

    Raises:
        RuntimeError: :data:`MODULE` was imported before the CPU port was installed; (at that import)
            ``set_numa_affinity`` is no longer verl 0.9.1's.
    """
    around_import(MODULE, _sorted_warnings)
    after_import("verl.utils.distributed", _skip_numa_affinity)
