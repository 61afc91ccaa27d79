"""The end of a run says what it did: one summary block and a curves PNG beside the checkpoints.

Two patches, in verl's TaskRunner (where the trainer runs):

1. ``verl/utils/tracking.py``: ``Tracking.log(self, data, step, backend=None)`` also keeps each step's numbers in
   this process (:data:`HISTORY`), whatever loggers ``trainer.logger`` names. ``FileLogger.__init__(self,
   project_name, experiment_name)``, in a resumed run, keeps the metrics file's lines of the steps up to the
   checkpoint it resumed from and appends after them (verl opens the file with ``"wb"``, which dropped every earlier
   step): :func:`keep_earlier_metrics`.
2. ``verl/trainer/ppo/v1/trainer_base.py``: ``PPOTrainer.fit(self, agent_loop_manager)``: in a resumed run the
   earlier steps' numbers are first read back from the metrics file into :data:`HISTORY`
   (:func:`earlier_history`), so that the summary and the curves cover steps 1..N. When ``fit`` returns normally,
   :func:`write_curves` writes ``<trainer.default_local_dir>/curves.png`` and :func:`summary` is printed (stdout,
   which Ray forwards to the driver's console). Both are best-effort: a failure to write either is one warning
   line, and the run's exit status stays verl's. A failed run prints neither. Either way the training-data
   iterator's worker processes are stopped first (:func:`stop_dataloader_workers`).

The block: the steps done and the time; validation accuracy and ``val-calib`` AUC-mean, first pass against last, with
the questions (mixed questions) each rests on, "too few" under :data:`MIN_QUESTIONS` (:data:`MIN_MIXED`);
the estimator's own numbers over the run (its declared ``summary_metrics``: CAPO's and grpo_mask's noise-mask share,
``capo/mask_frac_incorrect``; every estimator: verl's clip fraction ``actor/pg_clipfrac``); the last
checkpoint and the exact command that resumes from it (only when a checkpoint exists); the metrics file (verl's
``file`` logger) and the curves.

The command comes from the driver: :func:`remember_command` (called in verl's ``validate_config`` hook, in
``verl.trainer.main_ppo``'s process before Ray starts) puts it in :data:`COMMAND_ENV`, which Ray's local workers
inherit.
"""

from __future__ import annotations

import functools
import json
import logging
import math
import os
import shlex
import sys
import time
from pathlib import Path

from .patching import after_import, patch

logger = logging.getLogger("capo_verl")

#: the environment variable that carries the trainer's command line from the driver to the TaskRunner
COMMAND_ENV = "CAPO_VERL_TRAINER_COMMAND"
#: ``[(step, {metric: value})]`` logged by verl's ``Tracking.log`` in this process
HISTORY: list[tuple[int, dict[str, float]]] = []
#: the step this process's trainer resumed from (verl's ``global_steps`` when ``fit`` starts; 0: from the model)
RESUMED = {"step": 0}
#: the curves: (file key or prefix, title, y label); a key ending in ``/`` plots every metric under it
CURVES = (
    ("critic/rewards/mean", "reward (critic/rewards/mean)", "reward"),
    ("val-core/", "validation accuracy (val-core)", "accuracy"),
    ("val-calib/", "validation AUC-mean (val-calib)", "AUC-mean"),
    ("actor/entropy", "entropy (actor/entropy)", "nats"),
    ("capo/mask_frac_incorrect", "share of incorrect the mask drops", "share"),
    ("actor/grad_norm", "grad norm (actor/grad_norm)", "norm"),
)
#: a validation accuracy over fewer questions is "too few": its standard error, up to 0.5/sqrt(n), is over 0.05
MIN_QUESTIONS = 100
#: an AUC-mean over fewer mixed questions is "too few", as in capo-verl compare (compare.statistics: not loaded here)
MIN_MIXED = 20
#: the page of a run long enough to read such changes from (in capo-verl's repository)
LONGER_RUN = "docs/results/main.md"


def remember_command() -> None:
    """In ``python -m verl.trainer.main_ppo``'s process, put its command line in :data:`COMMAND_ENV` (nothing
    elsewhere, e.g. a ``--dry-run``)."""
    spec = getattr(sys.modules.get("__main__"), "__spec__", None)
    if getattr(spec, "name", None) in ("verl.trainer.main_ppo", "verl.trainer.main_ppo_v0"):
        os.environ[COMMAND_ENV] = shlex.join([sys.executable, "-m", spec.name, *sys.argv[1:]])


def _numbers(data: dict) -> dict[str, float]:
    out = {}
    for key, value in data.items():
        try:
            number = float(value)
        except (TypeError, ValueError):
            continue
        if math.isfinite(number):
            out[key] = number
    return out


def series(key: str) -> dict[str, tuple[list[int], list[float]]]:
    """``{metric: (steps, values)}`` from :data:`HISTORY` for ``key`` (a key ending in ``/``: every metric under it
    whose name holds ``auc_mean`` for val-calib, ``/acc/mean@`` or ``/reward/mean@`` for val-core)."""
    found: dict[str, tuple[list[int], list[float]]] = {}
    for step, data in HISTORY:
        for name, value in data.items():
            if key.endswith("/"):
                if not name.startswith(key):
                    continue
                if key == "val-calib/" and not name.endswith("/auc_mean"):
                    continue
                if key == "val-core/" and "/acc/mean@" not in name and "/reward/mean@" not in name:
                    continue
            elif name != key:
                continue
            xs, ys = found.setdefault(name, ([], []))
            xs.append(step)
            ys.append(value)
    return found


def _at(metric: str, step: int) -> int | None:
    """``metric`` as logged at ``step`` (:data:`HISTORY`), or None."""
    return next((int(data[metric]) for s, data in HISTORY if s == step and metric in data), None)


def _first_last(key: str) -> str:
    lines = series(key)
    if key == "val-core/" and any("/acc/" in name for name in lines):
        lines = {name: v for name, v in lines.items() if "/acc/" in name}
    if not lines:
        return "not logged"
    parts = []
    for name, (xs, ys) in sorted(lines.items()):  # val-core/<ds>/acc/mean@k, val-calib/<ds>/auc_mean
        ds = "val-calib/" + name.split("/", 1)[1].rsplit("/", 1 if key == "val-calib/" else 2)[0]
        n, first, last = _at(f"{ds}/n_questions", xs[-1]), _at(f"{ds}/n_mixed", xs[0]), _at(f"{ds}/n_mixed", xs[-1])
        counts, fewest, floor, unit = f"on {n} questions", n, MIN_QUESTIONS, "questions"
        if key == "val-calib/":
            counts, floor, unit = f"on {first} -> {last} mixed questions of {n}", MIN_MIXED, "mixed questions"
            fewest = None if None in (first, last) else min(first, last)
        if fewest is None or fewest < floor:
            few = f": too few to mean anything (under {floor} {unit}); a longer run: {LONGER_RUN}"
            counts = f"(the number of {unit} is not logged: {ds}/n_*)" if fewest is None else counts + few
        parts.append(f"{name}: {ys[0]:.4f} (step {xs[0]}) -> {ys[-1]:.4f} (step {xs[-1]}) {counts}")
    return "; ".join(parts)


def _mean(key: str) -> str:
    lines = series(key).get(key)
    if not lines:
        return "not logged"
    return f"{sum(lines[1]) / len(lines[1]):.4f} over {len(lines[1])} steps"


def last_checkpoint(folder: str | os.PathLike) -> Path | None:
    """``<folder>/global_step_<N>`` named by verl's ``latest_checkpointed_iteration.txt`` when it exists, else None."""
    marker = Path(folder) / "latest_checkpointed_iteration.txt"
    try:
        step = int(marker.read_text().strip())
    except (OSError, ValueError):
        return None
    path = Path(folder) / f"global_step_{step}"
    return path if path.is_dir() else None


def resume_command(command: str | None) -> str:
    """The run's command with ``trainer.resume_mode=auto`` appended (a later override wins in Hydra)."""
    if not command:
        return "the run's command with trainer.resume_mode=auto"
    return f"{command} trainer.resume_mode=auto"


def file_logger_path(project_name: str, experiment_name: str) -> str:
    """The file verl's ``FileLogger`` writes (``verl/utils/tracking.py``): ``VERL_FILE_LOGGER_PATH``, else
    ``$VERL_FILE_LOGGER_ROOT/<project>/<experiment>.jsonl`` (root default: the working folder), made absolute."""
    path = os.getenv("VERL_FILE_LOGGER_PATH")
    if path is None:
        root = os.path.expanduser(os.getenv("VERL_FILE_LOGGER_ROOT", "."))
        path = os.path.join(root, str(project_name), f"{experiment_name}.jsonl")
    return os.path.abspath(path)


def metrics_file(config) -> str | None:
    """Where verl's ``file`` logger wrote (:func:`file_logger_path`), or None when ``trainer.logger`` lacks
    ``file``."""
    loggers = config.trainer.get("logger", [])
    loggers = [loggers] if isinstance(loggers, str) else list(loggers or [])
    if "file" not in loggers:
        return None
    return file_logger_path(config.trainer.project_name, config.trainer.experiment_name)


def earlier_lines(data: bytes, up_to_step: int) -> tuple[list[tuple[int, dict, bytes]], int]:
    """The lines of a metrics file (verl's ``FileLogger``: one ``{"step": int, "data": {...}}`` JSON object a line)
    of steps <= ``up_to_step``.

    Returns:
        ``([(step, data, line bytes without its newline)], dropped)``: the lines kept, in order, and how many were
        not (of later steps, which the resumed run trains again, or not a whole JSON line: a run killed mid-write).
    """
    kept, dropped = [], 0
    for line in data.splitlines():
        if not line.strip():
            continue
        try:
            record = json.loads(line)
            step, values = int(record["step"]), record["data"]
        except (ValueError, TypeError, KeyError):
            dropped += 1
            continue
        if step <= up_to_step and isinstance(values, dict):
            kept.append((step, values, line))
        else:
            dropped += 1
    return kept, dropped


def keep_earlier_metrics(file_logger, project_name: str, experiment_name: str, resumed_step: int) -> int:
    """Open verl's metrics file for a run resumed from ``resumed_step``: its lines of steps up to that step kept
    (rewritten whole, :func:`capo_verl.outputs.write_atomic`, when a line goes), the resumed run's appended.

    Sets what ``verl.utils.tracking.FileLogger.__init__`` sets (``project_name``, ``experiment_name``, ``filepath``,
    ``fp``, opened unbuffered for appending).

    Returns:
        The number of earlier steps kept.

    Raises:
        OSError: the file cannot be read, rewritten or opened (verl's own logger fails there too).
    """
    from capo_verl.outputs import write_atomic

    file_logger.project_name, file_logger.experiment_name = project_name, experiment_name
    path = file_logger_path(project_name, experiment_name)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    try:
        data = Path(path).read_bytes()
    except FileNotFoundError:
        data = b""
    kept, dropped = earlier_lines(data, resumed_step)
    if dropped:
        write_atomic(path, b"".join(line + b"\n" for _, _, line in kept))
    elif data and not data.endswith(b"\n"):
        with open(path, "ab") as f:
            f.write(b"\n")
    file_logger.filepath = path
    steps = len({step for step, _, _ in kept})
    print(
        f"Creating file logger at {path} (resumed from step {resumed_step}: the lines of {steps} earlier step(s) kept)"
    )
    file_logger.fp = open(path, "ab", buffering=0)
    return steps


def earlier_history(config, resumed_step: int) -> list[tuple[int, dict[str, float]]]:
    """``[(step, numbers)]`` of the steps up to ``resumed_step`` in the run's metrics file (:func:`metrics_file`),
    for :data:`HISTORY`; empty when the run has no file logger or the file is not there. A file that cannot be read
    is one warning line (the summary and curves then cover the resumed steps only)."""
    path = metrics_file(config)
    if path is None or not os.path.exists(path):
        return []
    try:
        data = Path(path).read_bytes()
    except OSError as exc:
        logger.warning(
            "capo-verl: %s: the earlier steps' metrics not read (%s); the curves and summary cover the "
            "resumed steps only",
            path,
            exc.strerror or exc,
        )
        return []
    return [(step, _numbers(values)) for step, values, _ in earlier_lines(data, resumed_step)[0]]


def write_curves(folder: str | os.PathLike) -> Path:
    """Write ``<folder>/curves.png`` (:data:`CURVES` against the step, :func:`capo_verl.curves.panels_png`).

    Raises:
        OSError: the folder cannot be made or written.
    """
    from capo_verl.curves import panels_png
    from capo_verl.outputs import write_atomic

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    panels = [(title, ylabel, series(key)) for key, title, ylabel in CURVES]
    path = folder / "curves.png"
    write_atomic(path, panels_png(panels))
    return path


def summary(
    config, elapsed_s: float, steps_done: int, curves: Path | str | None, *, resumed_from: int = 0, curves_problem=None
) -> str:
    """The block (module docstring) for a trainer whose ``fit`` returned after ``elapsed_s`` seconds, having trained
    ``steps_done`` steps, from the checkpoint of step ``resumed_from`` (0: from the model). ``curves``: the curves'
    path, or None with ``curves_problem``, why they were not written."""
    from capo_verl.estimators.registry import ESTIMATORS  # here: the CPU launcher loads this module without torch

    estimator = str(config.algorithm.adv_estimator)
    total = config.trainer.total_training_steps or "all"
    if resumed_from:
        steps = (
            f"steps: {resumed_from + steps_done} of {total} ({steps_done} in this run, resumed from the checkpoint of "
            f"step {resumed_from}) in {elapsed_s:.0f} s"
        )
    else:
        steps = f"steps: {steps_done} of {total} in {elapsed_s:.0f} s"
    lines = [
        "capo-verl: run summary",
        steps,
        f"validation accuracy: {_first_last('val-core/')}",
        f"val-calib AUC-mean: {_first_last('val-calib/')}",
    ]
    spec = ESTIMATORS.get(estimator)
    for label, key in spec.summary_metrics if spec is not None else ():
        lines.append(f"{estimator} {label} ({key}): {_mean(key)}")
    lines.append(f"clip fraction (actor/pg_clipfrac): {_mean('actor/pg_clipfrac')}")
    checkpoint = last_checkpoint(config.trainer.default_local_dir)
    if checkpoint is not None:
        lines.append(f"last checkpoint: {checkpoint}")
        lines.append(f"resume: {resume_command(os.environ.get(COMMAND_ENV))}")
    else:
        lines.append("last checkpoint: none written (trainer.save_freq)")
    path = metrics_file(config)
    lines.append(f"metrics file: {path}" if path else "metrics file: none (add file to trainer.logger)")
    lines.append(
        f"curves: {curves}" if curves else f"curves: not written{f' ({curves_problem})' if curves_problem else ''}"
    )
    return "\n  ".join(lines)


def stop_dataloader_workers(trainer) -> bool:
    """Stop the worker processes of the trainer's running training-data iterator (``train_dataloader_it``, kept by
    ``PPOTrainer._fetch_one_gen_batch`` in ``verl/trainer/ppo/v1/trainer_base.py`` with
    ``data.dataloader_num_workers`` prefetching workers), and drop it.

    Why: at the end of a run the iterator is mid-epoch with live workers; when Ray then ends the TaskRunner, its
    workers die first and torch's SIGCHLD handler in the TaskRunner raises "DataLoader worker (pid ...) is killed by
    signal", a traceback after a run that succeeded. Stopped here, the workers exit cleanly.

    Returns:
        True when an iterator with workers was stopped.
    """
    iterator = getattr(trainer, "train_dataloader_it", None)
    shutdown = getattr(iterator, "_shutdown_workers", None)
    trainer.train_dataloader_it = None
    if shutdown is None:
        return False
    shutdown()
    return True


def _problem(exc: BaseException) -> str:
    """``exc`` as one short line: ``IsADirectoryError: [Errno 21] Is a directory: '...'``."""
    return " ".join(f"{type(exc).__name__}: {exc}".split())[:300]


def finish_outputs(config, elapsed_s: float, resumed_from: int = 0) -> Path | None:
    """At the end of a run whose ``fit`` returned: :func:`write_curves` into ``trainer.default_local_dir``, then the
    :func:`summary` printed. Best-effort: a failure of either is one warning line naming what was not written and
    why, and raises nothing (the run's checkpoints and metrics file are written by then).

    Returns:
        The curves' path, or None when they were not written.
    """
    curves, problem = None, None
    try:
        curves = write_curves(config.trainer.default_local_dir)
    except Exception as exc:  # a folder in the way of curves.png, a full disk, matplotlib: not the run's failure
        problem = _problem(exc)
        where = os.path.join(str(config.trainer.get("default_local_dir", ".")), "curves.png")
        logger.warning("capo-verl: %s not written (%s); the checkpoints and the metrics file are kept", where, problem)
    steps_done = len({s for s, data in HISTORY if "timing_s/step" in data and s > resumed_from})  # in this run
    try:
        block = summary(config, elapsed_s, steps_done, curves, resumed_from=resumed_from, curves_problem=problem)
    except Exception as exc:
        logger.warning("capo-verl: the run summary not printed (%s); the run finished", _problem(exc))
    else:
        print(block, flush=True)
    return curves


@patch(
    "verl.utils.tracking",
    {"Tracking.log": ("self", "data", "step"), "FileLogger.__init__": ("self", "project_name", "experiment_name")},
)
def _patch_tracking(tracking) -> None:
    """``verl/utils/tracking.py``: ``Tracking.log`` also appends ``(step, numbers)`` to :data:`HISTORY`;
    ``FileLogger.__init__`` in a resumed run keeps the earlier steps' lines (:func:`keep_earlier_metrics`)."""
    original = tracking.Tracking.log

    @functools.wraps(original)
    def log(self, data, step, *args, **kwargs):
        HISTORY.append((int(step), _numbers(data)))
        return original(self, data, step, *args, **kwargs)

    tracking.Tracking.log = log
    original_init = tracking.FileLogger.__init__

    @functools.wraps(original_init)
    def __init__(self, project_name, experiment_name, *args, **kwargs):
        if RESUMED["step"] <= 0 or args or kwargs:
            return original_init(self, project_name, experiment_name, *args, **kwargs)
        keep_earlier_metrics(self, project_name, experiment_name, RESUMED["step"])

    tracking.FileLogger.__init__ = __init__


@patch("verl.trainer.ppo.v1.trainer_base", {"PPOTrainer.fit": ("self", "agent_loop_manager")})
def _patch_fit(trainer_base) -> None:
    """``verl/trainer/ppo/v1/trainer_base.py``: after ``PPOTrainer.fit`` returns, print :func:`summary` and write
    the curves (:func:`write_curves`)."""
    original = trainer_base.PPOTrainer.fit

    @functools.wraps(original)
    def fit(self, agent_loop_manager, *args, **kwargs):
        t0 = time.monotonic()
        resumed = getattr(self, "global_steps", 0)  # set by _load_checkpoint before fit
        RESUMED["step"] = resumed if isinstance(resumed, int) and resumed > 0 else 0
        if RESUMED["step"]:
            HISTORY[:0] = earlier_history(self.config, RESUMED["step"])
        try:
            result = original(self, agent_loop_manager, *args, **kwargs)
        finally:
            stop_dataloader_workers(self)
        finish_outputs(self.config, time.monotonic() - t0, RESUMED["step"])
        return result

    trainer_base.PPOTrainer.fit = fit


def install() -> None:
    """Register the patches (applied when verl executes each module)."""
    after_import("verl.utils.tracking", _patch_tracking)
    after_import("verl.trainer.ppo.v1.trainer_base", _patch_fit)
