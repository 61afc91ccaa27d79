"""The CUDA tier (``pytest -m gpu``): the plugin's device math checked on a GPU against CPU float64.

What it checks (one module each): every registered estimator and verl's ``grpo`` through verl's own
``compute_advantage`` with capo-verl's compat wrapper, at 1,024 responses x 4,096 tokens
(``test_estimators_cuda.py``); SimKO's and the vanilla policy loss, forward and backward, float32 and bf16, and the
top-K sets CUDA and the CPU choose (``test_simko_cuda.py``); teacher-forced scoring (``test_teacher_forced_cuda.py``);
verl's platform and the methods' patches alone installed (``test_platform_cuda.py``). The tolerances are stated and
justified in each module. Timings: ``benchmarks/gpu_tier.py``.

When the tier is collected:

- only when it is asked for: a ``-m`` expression that selects a test *because* it is marked ``gpu`` (``-m gpu``,
  ``-m "gpu and not slow"``; not ``-m "not slow"``, which a gpu-only test also satisfies), or a path into this
  folder on the command line. A plain ``pytest`` and CI's ``-m "not slow"`` / ``-m slow`` never collect it;
- then, on a machine without CUDA, the run stops before any test module is imported, with one error naming the
  missing CUDA (``pytest.UsageError``: ``ERROR: ...``, exit status 4): the tier neither passes nor skips there.
"""

from __future__ import annotations

from pathlib import Path

import pytest

TIER = Path(__file__).resolve().parent


def _selects(markexpr: str, marks: set[str]) -> bool:
    """Whether the ``-m`` expression selects a test carrying exactly ``marks``."""
    from _pytest.mark.expression import Expression  # what pytest's own -m evaluates

    return Expression.compile(markexpr).evaluate(lambda name, **kwargs: name in marks)


def _selects_gpu(markexpr: str) -> bool:
    """True when the ``-m`` expression selects a test marked only ``gpu`` and not an unmarked test."""
    return _selects(markexpr, {"gpu"}) and not _selects(markexpr, set())


def tier_requested(config: pytest.Config) -> bool:
    """``-m`` selects ``gpu``, or a command-line path points into ``tests/gpu``."""
    markexpr = config.getoption("markexpr", default="") or ""
    if markexpr and _selects_gpu(markexpr):
        return True
    base = Path(config.invocation_params.dir)
    for arg in config.args:
        path = (base / arg.split("::")[0]).resolve()
        if path == TIER or TIER in path.parents:
            return not markexpr or _selects(markexpr, {"gpu"})
    return False


def cuda_missing_message() -> str | None:
    """None when CUDA is usable; else the one-line error the tier stops with."""
    import torch

    if torch.cuda.is_available():
        return None
    build = torch.version.cuda
    why = (
        f"torch {torch.__version__} is a CPU-only build"
        if build is None
        else f"torch {torch.__version__} (CUDA {build}) finds no CUDA device (driver, CUDA_VISIBLE_DEVICES?)"
    )
    return (
        f"the GPU tier (pytest -m gpu) needs CUDA: torch.cuda.is_available() is False ({why}). Run it on a node with "
        "an NVIDIA GPU and a CUDA build of torch (pip install -e '.[gpu,dev]'); on a CPU machine run "
        '`pytest -m "not slow"` and `pytest -m slow` instead'
    )


def _require_cuda() -> None:
    """``pytest.UsageError``: pytest prints ``ERROR: <message>`` once and exits with status 4 (usage error)."""
    message = cuda_missing_message()
    if message is not None:
        raise pytest.UsageError(message)


def pytest_sessionstart(session: pytest.Session) -> None:
    """A path into this folder on the command line loads this conftest before the session: require CUDA now."""
    if tier_requested(session.config):
        _require_cuda()


def pytest_collectstart(collector: pytest.Collector) -> None:
    """Before a module of this folder is imported (and before the test modules after ``gpu/`` are): require CUDA.

    pytest loads this conftest while it collects the folder; its first module then reaches this hook, which runs
    outside pytest's collection call, so the error ends the session at once instead of becoming a collection
    error.
    """
    path = Path(collector.path).resolve()
    if (path == TIER or TIER in path.parents) and tier_requested(collector.config):
        _require_cuda()


def pytest_ignore_collect(collection_path: Path, config: pytest.Config):
    """Called for each entry of this folder: leave the whole tier out unless it was asked for."""
    return None if tier_requested(config) else True
