"""The end of a run says what it did: one summary block and a curves PNG beside the checkpoints.

Two patches, in verl's TaskRunner (where the trainer runs):

1. ``verl/utils/tracking.py``: ``Tracking.log(self, data, step, backend=None)`` also keeps each step's numbers in
   this process (:data:`HISTORY`), whatever loggers ``trainer.logger`` names.
2. ``verl/trainer/ppo/v1/trainer_base.py``: ``PPOTrainer.fit(self, agent_loop_manager)``: when it returns normally,
   :func:`summary` is printed (stdout, which Ray forwards to the driver's console) and :func:`write_curves` writes
   ``<trainer.default_local_dir>/curves.png``. A failed run prints neither. Either way the training-data
   iterator's worker processes are stopped first (:func:`stop_dataloader_workers`).

The block: the steps done and the time; validation accuracy and ``val-calib`` AUC-mean, first pass against last;
the estimator's own numbers over the run (CAPO and grpo_mask: the mean share of incorrect responses the noise mask
drops, ``capo/mask_frac_incorrect``; every estimator: verl's clip fraction ``actor/pg_clipfrac``); the last
checkpoint and the exact command that resumes from it (only when a checkpoint exists); the metrics file (verl's
``file`` logger) and the curves.

The command comes from the driver: :func:`remember_command` (called in verl's ``validate_config`` hook, in
``verl.trainer.main_ppo``'s process before Ray starts) puts it in :data:`COMMAND_ENV`, which Ray's local workers
inherit.
"""

from __future__ import annotations

import functools
import math
import os
import shlex
import sys
import time
from pathlib import Path

from .patching import after_import, patch

#: the environment variable that carries the trainer's command line from the driver to the TaskRunner
COMMAND_ENV = "CAPO_VERL_TRAINER_COMMAND"
#: ``[(step, {metric: value})]`` logged by verl's ``Tracking.log`` in this process
HISTORY: list[tuple[int, dict[str, float]]] = []
#: the curves: (file key or prefix, title, y label); a key ending in ``/`` plots every metric under it
CURVES = (
    ("critic/rewards/mean", "reward (critic/rewards/mean)", "reward"),
    ("val-core/", "validation accuracy (val-core)", "accuracy"),
    ("val-calib/", "validation AUC-mean (val-calib)", "AUC-mean"),
    ("actor/entropy", "entropy (actor/entropy)", "nats"),
    ("capo/mask_frac_incorrect", "share of incorrect the mask drops", "share"),
    ("actor/grad_norm", "grad norm (actor/grad_norm)", "norm"),
)


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


def _first_last(key: str) -> str:
    lines = series(key)
    if key == "val-core/" and any("/acc/" in name for name in lines):
        lines = {name: v for name, v in lines.items() if "/acc/" in name}
    if not lines:
        return "not logged"
    parts = []
    for name, (xs, ys) in sorted(lines.items()):
        parts.append(f"{name}: {ys[0]:.4f} (step {xs[0]}) -> {ys[-1]:.4f} (step {xs[-1]})")
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


def metrics_file(config) -> str | None:
    """Where verl's ``file`` logger wrote (``verl/utils/tracking.py``: ``VERL_FILE_LOGGER_PATH``, else
    ``$VERL_FILE_LOGGER_ROOT/<project>/<experiment>.jsonl``), or None when ``trainer.logger`` lacks ``file``."""
    loggers = config.trainer.get("logger", [])
    loggers = [loggers] if isinstance(loggers, str) else list(loggers or [])
    if "file" not in loggers:
        return None
    path = os.getenv("VERL_FILE_LOGGER_PATH")
    if path is None:
        root = os.path.expanduser(os.getenv("VERL_FILE_LOGGER_ROOT", "."))
        path = os.path.join(root, config.trainer.project_name, f"{config.trainer.experiment_name}.jsonl")
    return os.path.abspath(path)


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


def summary(config, elapsed_s: float, steps_done: int, curves: Path | str | None) -> str:
    """The block (module docstring) for a trainer whose ``fit`` returned after ``elapsed_s`` seconds."""
    estimator = str(config.algorithm.adv_estimator)
    lines = [
        "capo-verl: run summary",
        f"steps: {steps_done} of {config.trainer.total_training_steps or 'all'} in {elapsed_s:.0f} s",
        f"validation accuracy: {_first_last('val-core/')}",
        f"val-calib AUC-mean: {_first_last('val-calib/')}",
    ]
    if estimator in ("capo", "grpo_mask"):
        share = _mean("capo/mask_frac_incorrect")
        lines.append(f"{estimator} mask, share of incorrect responses dropped (capo/mask_frac_incorrect): {share}")
    lines.append(f"clip fraction (actor/pg_clipfrac): {_mean('actor/pg_clipfrac')}")
    checkpoint = last_checkpoint(config.trainer.default_local_dir)
    if checkpoint is not None:
        lines.append(f"last checkpoint: {checkpoint}")
        lines.append(f"resume: {resume_command(os.environ.get(COMMAND_ENV))}")
    else:
        lines.append("last checkpoint: none written (trainer.save_freq)")
    path = metrics_file(config)
    lines.append(f"metrics file: {path}" if path else "metrics file: none (add file to trainer.logger)")
    lines.append(f"curves: {curves}" if curves else "curves: not written")
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


@patch("verl.utils.tracking", {"Tracking.log": ("self", "data", "step")})
def _patch_tracking(tracking) -> None:
    """``verl/utils/tracking.py``: ``Tracking.log`` also appends ``(step, numbers)`` to :data:`HISTORY`."""
    original = tracking.Tracking.log

    @functools.wraps(original)
    def log(self, data, step, *args, **kwargs):
        HISTORY.append((int(step), _numbers(data)))
        return original(self, data, step, *args, **kwargs)

    tracking.Tracking.log = log


@patch("verl.trainer.ppo.v1.trainer_base", {"PPOTrainer.fit": ("self", "agent_loop_manager")})
def _patch_fit(trainer_base) -> None:
    """``verl/trainer/ppo/v1/trainer_base.py``: after ``PPOTrainer.fit`` returns, print :func:`summary` and write
    the curves (:func:`write_curves`)."""
    original = trainer_base.PPOTrainer.fit

    @functools.wraps(original)
    def fit(self, agent_loop_manager, *args, **kwargs):
        t0 = time.monotonic()
        try:
            result = original(self, agent_loop_manager, *args, **kwargs)
        finally:
            stop_dataloader_workers(self)
        elapsed = time.monotonic() - t0
        curves = write_curves(self.config.trainer.default_local_dir)
        steps_done = len({step for step, data in HISTORY if "timing_s/step" in data})  # trained in this run
        print(summary(self.config, elapsed, steps_done, curves), flush=True)
        return result

    trainer_base.PPOTrainer.fit = fit


def install() -> None:
    """Register the patches (applied when verl executes each module)."""
    after_import("verl.utils.tracking", _patch_tracking)
    after_import("verl.trainer.ppo.v1.trainer_base", _patch_fit)
