"""Warnings the CPU port knows to be harmless: counted, and printed as one line for the whole run, not one each.

On a CPU, verl, vLLM, Ray, transformers and torchdata warn about things that do not apply there or that verl 0.9.1
does itself (:data:`KNOWN_RECORDS`, :data:`KNOWN_WARNINGS`, each with the reason it is harmless). In every process of
a run where the CPU port is installed (verl's processes at ``import verl``; vLLM's engine and worker processes
through the ``vllm.general_plugins`` entry point :func:`capo_verl.cpu.vllm_plugin`), such a warning is not printed.
It is counted in the run's ledger (:mod:`capo_verl.cpu.shm`, a line ``quiet:<reason>``). The run's owner (the
launcher, :mod:`capo_verl.cpu.launch`, or the process that owns the run) prints one line with the counts when the
run ends (:func:`capo_verl.cpu.shm.not_shown_line`). Outside a run, a process logs its own counts at exit (INFO).
Every other warning prints as before.

- Log records: by the module that logs them and the message, with a filter (``logging.Logger.addFilter``) on the
  module's logger, set before its first record: ``logging.getLogger(__name__)``, and the logger named by the
  module's file, which some verl modules use (``logging.getLogger(__file__)``). A record of a child logger is not
  seen by its parent's filter, so each entry names the module itself.
- Python warnings (``warnings.warn``): by message, in a wrapper of ``warnings.showwarning``, which Python calls
  for a warning its filters let through (once per place with its default filters).
- ``verl/utils/distributed.py``: ``set_numa_affinity()`` (called by every engine worker,
  ``verl/workers/engine_workers.py``) pins the process to the NUMA node of its GPU through NVML, and without a GPU
  prints "Warning: Failed to set NUMA affinity" in each worker. On a CPU there is no GPU to pin to: the port makes
  it do nothing (:func:`_skip_numa_affinity`), logged at DEBUG.

A warning printed by C++ code (torch's NUMA binding note in vLLM's worker) or by a vLLM process before it loads its
plugins (its import of Triton) does not pass through Python's logging or warnings here and still prints.
"""

from __future__ import annotations

import atexit
import collections
import functools
import importlib.util
import logging
import os
import re
import warnings
from types import ModuleType

from capo_verl.compat.patching import after_import, patch

from . import shm

logger = logging.getLogger("capo_verl.cpu.quiet")

_TRITON = "Triton has no CPU backend: vLLM runs without it"
_EAGER = "the CPU profile runs vLLM eagerly (actor_rollout_ref.rollout.enforce_eager=true)"

#: (module that logs it, pattern of the message, why it is harmless) of the log records not printed
KNOWN_RECORDS = (
    ("vllm.triton_utils.importing", r"^Triton is installed, but", _TRITON),
    ("vllm.config.vllm", r"^Model Runner V2 requires Triton", _TRITON),
    ("vllm.config.vllm", r"^Enforce eager set, disabling torch\.compile", _EAGER),
    ("vllm.config.vllm", r"^Inductor compilation was disabled by user settings", _EAGER),
    (
        "vllm.engine.arg_utils",
        r"does not officially support disabling chunked prefill",
        "the CPU port turns chunked prefill off: a seeded request cannot be prefilled in chunks on a CPU",
    ),
    (
        "vllm.v1.worker.cpu_worker",
        r"^sleep mode is not supported on CPU",
        "vLLM's CPU worker has no sleep mode: verl's sleep and wake-up around each update do nothing",
    ),
    (
        "vllm.v1.worker.cpu_worker",
        r"is not found in LD_PRELOAD",
        "vLLM's CPU worker suggests preloading tcmalloc and Intel OpenMP for speed",
    ),
    (
        "vllm.entrypoints.serve.lora.api_router",
        r"^LoRA dynamic loading & unloading is enabled",
        "verl turns on vLLM's runtime LoRA updating (VLLM_ALLOW_RUNTIME_LORA_UPDATING) for its LoRA runs",
    ),
    (
        "vllm.config.model",
        r"^Default vLLM sampling parameters have been overridden",
        "verl's requests carry their own sampling parameters",
    ),
    (
        "vllm.v1.engine.input_processor",
        r"^Passing raw prompts to InputProcessor is deprecated",
        "verl 0.9.1 hands vLLM raw prompts (a vLLM deprecation notice)",
    ),
    (
        "verl.workers.rollout.vllm_rollout.vllm_rollout",
        r"^IPC is not supported on your devices",
        "weights reach vLLM through shared memory on a CPU",
    ),
    (
        "verl.utils.tokenizer.continuous_token_wiring",
        r"^No model-specific Continuous Token builder is registered",
        "verl's generic token builder serves a model type without its own (SmolLM2 is llama)",
    ),
    (
        "transformers.utils.import_utils",
        r"requires torchvision \(not installed\)",
        "transformers' image processors for vision models want torchvision, which text models do not need",
    ),
    (
        "ray._private.authentication.authentication_token_setup",
        r"^Token authentication is enabled for this Ray cluster",
        "Ray's note that the run's local cluster uses token authentication",
    ),
)

#: (pattern of the message, why it is harmless) of the Python warnings not printed
KNOWN_WARNINGS = (
    (r"^\w+ engine is not available: ", "a training engine the CPU port does not use is not installed"),
    (
        r"^Disabled critic as algorithm\.adv_estimator != gae",
        "verl says it trains without a critic, as every estimator but gae does",
    ),
    (r"'set_vital' is deprecated", "torchdata's dataloader calls a deprecated torch function"),
)

_counts: collections.Counter[str] = collections.Counter()
_installed = False


def known_warning(message: str) -> str | None:
    """Why the Python warning ``message`` is harmless (:data:`KNOWN_WARNINGS`), or None when it is not known."""
    return next((why for pattern, why in KNOWN_WARNINGS if re.search(pattern, message)), None)


def count(why: str) -> None:
    """Count one warning not printed: in the run's ledger (:data:`capo_verl.cpu.shm.RUN_ENV`), or in this process
    outside a run."""
    if os.environ.get(shm.RUN_ENV):
        shm.record(shm.QUIET_PREFIX + why)
    else:
        _counts[why] += 1


class _KnownRecords(logging.Filter):
    """Drops (and counts) the records of one logger whose message matches one of ``patterns``."""

    def __init__(self, patterns: list[tuple[re.Pattern, str]]):
        super().__init__()
        self.patterns = patterns

    def filter(self, record: logging.LogRecord) -> bool:
        try:
            message = record.getMessage()
        except Exception:  # a malformed record is not ours to judge
            return True
        why = next((why for pattern, why in self.patterns if pattern.search(message)), None)
        if why is None:
            return True
        count(why)
        return False


def _showwarning(original):
    @functools.wraps(original)
    def showwarning(message, category, filename, lineno, file=None, line=None):
        why = known_warning(str(message))
        if why is None:
            return original(message, category, filename, lineno, file, line)
        count(why)

    showwarning.__capo_verl_quiet__ = True
    return showwarning


def install_filters() -> None:
    """In this process: the filters on the loggers of :data:`KNOWN_RECORDS` and the wrapper of
    ``warnings.showwarning`` for :data:`KNOWN_WARNINGS`; outside a run, this process's counts logged at its exit.
    Idempotent."""
    global _installed
    if _installed:
        return
    by_module: dict[str, list[tuple[re.Pattern, str]]] = {}
    for module, pattern, why in KNOWN_RECORDS:
        by_module.setdefault(module, []).append((re.compile(pattern), why))
    for module, patterns in by_module.items():
        for name in logger_names(module):
            logging.getLogger(name).addFilter(_KnownRecords(patterns))
    if not getattr(warnings.showwarning, "__capo_verl_quiet__", False):
        warnings.showwarning = _showwarning(warnings.showwarning)
    atexit.register(_log_own_counts)
    _installed = True


def logger_names(module: str) -> list[str]:
    """The names a logger of ``module`` can have: ``module`` (``getLogger(__name__)``) and, when its package is
    installed, the path of its file (``getLogger(__file__)``). Imports nothing: the file is found from the top-level
    package's location."""
    names = [module]
    top, _, rest = module.partition(".")
    try:
        spec = importlib.util.find_spec(top)
    except (ImportError, ValueError):
        spec = None
    if spec is not None and spec.origin and rest:
        path = os.path.join(os.path.dirname(spec.origin), *rest.split(".")) + ".py"
        if os.path.exists(path):
            names.append(path)
    return names


def _log_own_counts() -> None:
    line = shm.not_shown_line(dict(_counts))
    if line:
        logger.info("%s (this process)", line)


@patch("verl.utils.distributed", {"set_numa_affinity": ()})
def _skip_numa_affinity(distributed: ModuleType) -> None:
    """``verl/utils/distributed.py``: ``set_numa_affinity`` does nothing on a CPU (module docstring)."""
    original = distributed.set_numa_affinity

    @functools.wraps(original)
    def set_numa_affinity(*args, **kwargs):
        logger.debug("set_numa_affinity skipped: no GPU to pin this process's NUMA node to")

    distributed.set_numa_affinity = set_numa_affinity


def install() -> None:
    """:func:`install_filters`, and skip verl's GPU NUMA pinning (module docstring); called by
    :func:`capo_verl.cpu.install`.

    Raises:
        RuntimeError: (at that import) ``set_numa_affinity`` is no longer verl 0.9.1's.
    """
    install_filters()
    after_import("verl.utils.distributed", _skip_numa_affinity)
