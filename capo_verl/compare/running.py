"""Running ``capo-verl compare``'s child processes: verl's trainer for each method, then ``capo-verl eval`` on the
final checkpoints."""

from __future__ import annotations

import json
import logging
import os
import shlex
import shutil
import subprocess
import sys
import time
from pathlib import Path

from capo_verl.compare.methods import METHODS
from capo_verl.compare.outdir import RUN_MARKER
from capo_verl.compare.report import SHARED_STEP0, validation_dump
from capo_verl.cpu.launch import run_launched

logger = logging.getLogger("capo_verl.compare")


def train_env(metrics_path: Path) -> dict[str, str]:
    """Environment of a ``verl.trainer.main_ppo`` child process: this one's, plus verl's file logger writing to
    ``metrics_path``, CPU thread counts (``OMP_NUM_THREADS``, ``TQ_NUM_THREADS``) unless already set, and full
    Hydra errors."""
    import psutil

    env = dict(os.environ)
    env.setdefault("OMP_NUM_THREADS", str(len(os.sched_getaffinity(0))))
    env.setdefault("TQ_NUM_THREADS", str(min(8, psutil.cpu_count(logical=False) or 1)))
    env.setdefault("TOKENIZERS_PARALLELISM", "false")
    env.update(VERL_FILE_LOGGER_PATH=str(metrics_path), HYDRA_FULL_ERROR="1", PYTHONUNBUFFERED="1")
    return env


def main_ppo_command(config_dir: Path, config_name: str, overrides: list[str]) -> list[str]:
    """``python -m verl.trainer.main_ppo`` (this interpreter) with the config ``<config_dir>/<config_name>.yaml``
    and the Hydra ``overrides``.

    The command names verl's config package as Hydra's search path, so that any config of ``configs/`` can be the
    primary one: ``cpu_base.yaml`` cannot say it itself, since Hydra refuses ``hydra.searchpath`` in a config that
    another one includes ("only supported from the primary config")."""
    return [
        sys.executable,
        "-m",
        "verl.trainer.main_ppo",
        f"--config-path={config_dir}",
        f"--config-name={config_name}",
        "hydra.searchpath=[pkg://verl.trainer.config]",
    ] + list(overrides)


def code_version() -> dict:
    """``{"capo_verl": version, "commit": git HEAD of capo-verl's checkout or None, "modified": whether tracked files
    differ from it (None outside a checkout)}``: the code a run ran, recorded in its ``done.json``."""
    from capo_verl import __version__

    root = Path(__file__).resolve().parents[2]
    commit = modified = None
    if (root / ".git").exists():
        git = ["git", "-C", str(root)]
        head = subprocess.run([*git, "rev-parse", "HEAD"], capture_output=True, text=True)
        if head.returncode == 0:
            commit = head.stdout.strip()
            status = subprocess.run(
                [*git, "status", "--porcelain", "--untracked-files=no"], capture_output=True, text=True
            )
            modified = bool(status.stdout.strip())
    return {"capo_verl": __version__, "commit": commit, "modified": modified}


def read_by(method: str, override: str) -> bool:
    """Whether the run of ``method`` reads the shared ``override``: a method's own keys (``algorithm.<section>.*``
    of an estimator's section, SimKO's ``actor_rollout_ref.actor.policy_loss.simko.*``) go only to the methods that
    read them, as verl's start refuses a typed key that the run does not read
    (:func:`capo_verl.compat.methods.check_typed_keys`): the keys of the method's section that its own overrides
    leave unread (``algorithm.capo.ref_high`` with ``capo_no_mask``) included; every other key goes to every
    method."""
    from capo_verl.compat.methods import SIMKO_SECTION
    from capo_verl.estimators.registry import ESTIMATORS, config_sections

    own = {o.lstrip("+").partition("=")[0]: o.partition("=")[2] for o in METHODS[method].overrides}
    key = override.lstrip("+").partition("=")[0]
    parts = key.split(".")
    if key.startswith("algorithm.") and len(parts) >= 3 and parts[1] in config_sections():
        estimator = ESTIMATORS.get(own.get("algorithm.adv_estimator", ""))
        if estimator is None or estimator.section != parts[1]:
            return False
        if estimator.unread_keys is None:
            return True
        from hydra.core.override_parser.overrides_parser import OverridesParser

        parser = OverridesParser.create()
        section = {}
        for typed in METHODS[method].overrides:  # the method's own keys of the section, as Hydra reads them
            parsed = parser.parse_override(typed)
            if parsed.key_or_group.startswith(f"algorithm.{parts[1]}."):
                section[parsed.key_or_group.rpartition(".")[2]] = parsed.value()
        return parts[2] not in estimator.unread_keys(estimator.config_class(**section))
    if key.startswith(SIMKO_SECTION):
        return own.get("actor_rollout_ref.actor.policy_loss.loss_mode") == "simko"
    return True


def train_command(method: str, config_name: str, config_dir: Path, run_dir: Path, overrides: list[str]) -> list[str]:
    """The ``python -m verl.trainer.main_ppo`` command of one method: its overrides (:data:`METHODS`), its run's
    paths, then those of ``overrides`` (shared by every method) that it reads (:func:`read_by`).
    ``trainer.resume_mode=auto``: the run's checkpoint folder is its own, so a first attempt starts from the model
    and a resumed one from the last complete checkpoint."""
    return main_ppo_command(
        config_dir,
        config_name,
        [
            *METHODS[method].overrides,
            f"++trainer.experiment_name={method}",
            "++trainer.logger=[console,file]",
            f"++trainer.default_local_dir={run_dir / 'ckpt'}",
            f"++trainer.validation_data_dir={run_dir / 'val_generations'}",
            *(o for o in overrides if read_by(method, o)),
            "++trainer.resume_mode=auto",
        ],
    )


#: one line per training attempt of a method: the step it started from, its wall time (s) and exit status
ATTEMPTS = "attempts.jsonl"
#: verl's file logger truncates its file at start: each attempt writes here, then is appended to metrics.jsonl
ATTEMPT_METRICS = "metrics.attempt.jsonl"


def _merge_attempt_metrics(run_dir: Path) -> None:
    """Append the last attempt's metric lines to ``metrics.jsonl`` (a resumed attempt's lines for a step replace the
    earlier ones when read: :func:`capo_verl.compare.report.read_metrics` merges lines per step, later last)."""
    attempt = run_dir / ATTEMPT_METRICS
    if attempt.exists():
        with open(run_dir / "metrics.jsonl", "ab") as merged:
            merged.write(attempt.read_bytes())
        attempt.unlink()


def final_step(settings: dict) -> int | None:
    """The run's ``trainer.total_training_steps`` from its recorded composed config (``settings["composed"]``), or
    None where it is not recorded as an integer (verl then derives it from ``trainer.total_epochs``)."""
    steps = settings.get("composed", {}).get("trainer", {}).get("total_training_steps")
    return steps if isinstance(steps, int) and not isinstance(steps, bool) else None


#: the first method's trainer made into the seed's step-0 pass: it validates the loaded weights (the base model's)
#: and trains nothing (verl 0.9.1 ``RayPPOTrainer.fit`` returns after that validation with ``val_only``;
#: tests/test_step0_pass.py); also what is left of a run stopped after its last checkpoint (:func:`run_method`)
STEP0_OVERRIDES = ("++trainer.val_before_train=true", "++trainer.val_only=true")


def run_method(
    method: str,
    out: Path,
    config_name: str,
    config_dir: Path,
    overrides: list[str],
    *,
    settings: dict,
    name: str | None = None,
) -> Path:
    """Train one method in ``<out>/<method>`` (``<out>/<name>`` with ``name``: the seed's step-0 pass,
    :data:`STEP0_DIR`); returns that folder.

    A folder with ``done.json`` is reused as it is (its settings are checked by
    :func:`capo_verl.compare.outdir.check_method_dir` beforehand). An unfinished one that compare made (it holds
    ``.capo-verl-run.json``; the training was stopped or failed) resumes from its last complete checkpoint when it
    has one and was made with the same ``settings`` (from a checkpoint of its last step, :func:`final_step`, only
    the validation after that step is run); otherwise it is deleted and trained again. ``settings`` are recorded in
    ``.capo-verl-run.json`` and ``done.json``. The trainer runs under :mod:`capo_verl.cpu.launch`: Ctrl-C stops it
    (checkpoints kept), and running compare again goes on from there.

    Raises:
        RuntimeError: the folder exists unfinished and compare did not make it (it is left untouched), or verl's
            trainer exited non-zero (the log's path and last lines are in the message).
        KeyboardInterrupt: Ctrl-C, after the training has stopped.
    """
    from capo_verl.compare.outdir import check_method_dir, last_checkpoint

    run_dir = out / (name or method)
    done = run_dir / "done.json"
    if done.exists():
        logger.info("%s: finished earlier (%s), not trained again", run_dir.name, done)
        return run_dir
    if run_dir.exists():
        if not (run_dir / RUN_MARKER).is_file():
            raise RuntimeError(f"{run_dir} exists and was not made by capo-verl compare (no {RUN_MARKER}): not touched")
        if check_method_dir(run_dir, settings, None) == "resume":
            _merge_attempt_metrics(run_dir)
            logger.info("%s: resuming from the checkpoint of step %s", run_dir.name, last_checkpoint(run_dir))
        else:
            logger.info(
                "%s: an unfinished run without a checkpoint in %s: deleted, trained again", run_dir.name, run_dir
            )
            shutil.rmtree(run_dir)
    if not run_dir.exists():
        run_dir.mkdir(parents=True)
        (run_dir / RUN_MARKER).write_text(json.dumps({"method": method, "settings": settings}, indent=1) + "\n")
    cmd = train_command(method, config_name, config_dir, run_dir, overrides)
    start_step = last_checkpoint(run_dir)
    run_cmd = cmd
    final = final_step(settings)
    if start_step and final is not None and start_step >= final:
        # stopped after its last checkpoint, before (or during) the validation after the last step: resumed as it
        # is, verl 0.9.1 trains nothing and skips that validation (tests/test_stop_resume.py); validating the
        # loaded step and returning (val_only, as the step-0 pass does) is what is left of the run
        run_cmd = [*cmd, *STEP0_OVERRIDES]
        logger.info("%s: step %s is its last: only its validation is left", run_dir.name, start_step)
    log_path = run_dir / "train.log"
    if name is None:
        logger.info("%s: training (%s); log %s", run_dir.name, METHODS[method].description, log_path)
    else:
        logger.info("%s: validating the base model with %s's config; log %s", run_dir.name, method, log_path)
    t0 = time.time()
    returncode = None  # stays None when the launch raises (Ctrl-C): recorded as such in the attempt
    try:
        with open(log_path, "a") as log:
            # under capo_verl.cpu.launch: Ctrl-C stops every process of the training and removes its /dev/shm segments
            returncode = run_launched(
                run_cmd,
                cwd=run_dir,
                env=train_env(run_dir / ATTEMPT_METRICS),
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
            )
    finally:
        _merge_attempt_metrics(run_dir)
        wall = time.time() - t0
        attempt = {"start_step": start_step, "wall_s": round(wall, 3), "returncode": returncode}
        if run_cmd is not cmd:
            attempt["val_only"] = True
        with open(run_dir / ATTEMPTS, "a") as f:
            f.write(json.dumps(attempt) + "\n")
    if returncode != 0:
        tail = "".join(log_path.read_text(errors="replace").splitlines(keepends=True)[-25:])
        raise RuntimeError(
            f"{run_dir.name}: verl's trainer exited with {returncode} after {wall:.0f} s; log {log_path}; last "
            f"lines:\n{tail}"
        )
    attempts = [json.loads(line) for line in (run_dir / ATTEMPTS).read_text().splitlines()]
    wall = sum(a["wall_s"] for a in attempts)
    record = {
        "method": method,
        "wall_s": wall,
        "attempts": attempts,
        "command": shlex.join(cmd),
        "code": code_version(),
        "settings": settings,
    }
    done.write_text(json.dumps(record, indent=1) + "\n")
    logger.info("%s: done in %.1f min", run_dir.name, wall / 60)
    return run_dir


def final_hf_checkpoint(run_dir: Path) -> Path:
    """``<run>/ckpt/global_step_<last>/actor/huggingface`` (needs ``checkpoint.save_contents`` with hf_model).

    Raises:
        FileNotFoundError: no checkpoint with Hugging Face weights.
    """
    steps = sorted((run_dir / "ckpt").glob("global_step_*"), key=lambda p: int(p.name.rsplit("_", 1)[1]))
    for step in reversed(steps):
        hf = step / "actor" / "huggingface"
        if any(hf.glob("*.safetensors")):
            return hf
    raise FileNotFoundError(
        f"{run_dir / 'ckpt'}: no checkpoint with Hugging Face weights; set "
        "actor_rollout_ref.actor.checkpoint.save_contents=[model,hf_model] and trainer.save_freq (or --no-eval)"
    )


#: ``<out>/seed<k>/step0``: the seed's step-0 pass (``compare --share-step0``), which every method takes
STEP0_DIR = "step0"


def check_step0_source(base_dir: Path, run_dir: Path) -> None:
    """Before a run that skips its own step-0 validation trains (``compare --share-step0``): ``base_dir``, the
    seed's step-0 pass (:data:`STEP0_DIR`), holds its dump, and the run has none of its own unless it took that one.

    Raises:
        RuntimeError: either is not so (nothing has trained yet for this run).
    """
    source = validation_dump(base_dir / "val_generations", 0)
    if not source.exists():
        raise RuntimeError(f"{source}: no step-0 validation pass to share")
    own = validation_dump(run_dir / "val_generations", 0)
    if own.exists() and not (run_dir / "val_generations" / SHARED_STEP0).exists():
        raise RuntimeError(f"{own}: the run validated step 0 itself; it cannot also take {source}")


def share_step0(base_dir: Path, run_dir: Path) -> Path:
    """Give a run that did not validate before training (``trainer.val_before_train=false``) the step-0 pass of
    ``base_dir``, the seed's step-0 pass (:data:`STEP0_DIR`): the same base weights, data and rollout seeds. Copies
    ``<base>/val_generations/0.jsonl`` (or its ``.xz`` / ``.gz``, as committed) to the same name under ``<run>`` and
    records where it came from, with its SHA-256, in ``<run>/val_generations/0.shared.json`` (:data:`SHARED_STEP0`);
    nothing to do when both are there. Returns the copied file.

    Raises:
        RuntimeError, FileNotFoundError: as :func:`check_step0_source`.
    """
    import hashlib

    check_step0_source(base_dir, run_dir)
    source = validation_dump(base_dir / "val_generations", 0)
    target = run_dir / "val_generations" / source.name
    marker = target.parent / SHARED_STEP0
    if marker.exists() and (target.exists() or validation_dump(target.parent, 0) == source):
        return target if target.exists() else source  # a committed unit keeps the seed's one copy
    data = source.read_bytes()
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_bytes(data)
    record = {"from": f"{base_dir.name}/val_generations/{source.name}", "sha256": hashlib.sha256(data).hexdigest()}
    marker.write_text(json.dumps(record, indent=1) + "\n")
    logger.info("%s: step-0 validation pass taken from %s", run_dir.name, source)
    return target


def generate_heldout(
    run_dir: Path, eval_data: Path, *, k: int, max_new_tokens: int, dtype: str = "bfloat16", seed: int = 0
) -> Path:
    """``capo-verl eval generate`` of a finished run's final checkpoint on the held-out set, unless its ``eval_done``
    exists; returns ``<run>/eval_generations.jsonl``.

    compare calls it as soon as the run finished (and its checkpoints were scored), so that the run's small outputs
    are complete without its checkpoints: a unit copied to another machine without ``ckpt/`` is never trained again.
    ``dtype``: the weights' precision in vLLM (compare passes the training rollout's,
    ``actor_rollout_ref.rollout.dtype``). ``seed``: the sampling seed (compare passes the training seed).

    Raises:
        FileNotFoundError: no ``eval_done`` and no final checkpoint with Hugging Face weights.
        subprocess.CalledProcessError: ``capo-verl eval generate`` failed.
    """
    target = run_dir / "eval_generations.jsonl"
    if (run_dir / "eval_done").exists():
        return target
    if (run_dir / "done.json").exists() and not (run_dir / "ckpt").exists():
        raise FileNotFoundError(
            f"{run_dir}: finished without its checkpoints (ckpt/) and without its held-out generations (eval_done): "
            "they cannot be made; delete the folder to train it again"
        )
    model = final_hf_checkpoint(run_dir)
    cmd = [
        sys.executable, "-m", "capo_verl.cli", "eval", "generate", "--model", str(model), "--data", str(eval_data),
        "-k", str(k), "--max-new-tokens", str(max_new_tokens), "--temperature", "1.0", "--seed", str(seed),
        "--dtype", dtype, "--no-progress", "--out", str(target),
    ]  # fmt: skip
    logger.info("%s: eval generate on %s (k=%d)", run_dir.name, eval_data.name, k)
    subprocess.run(cmd, check=True, stdin=subprocess.DEVNULL)
    (run_dir / "eval_done").write_text(json.dumps({"k": k, "command": shlex.join(cmd)}, indent=1) + "\n")
    return target


def evaluate(
    out: Path, methods: list[str], eval_data: Path, *, k: int, max_new_tokens: int, dtype: str = "bfloat16"
) -> Path:
    """:func:`generate_heldout` for every method (nothing to do for one whose ``eval_done`` exists), then
    ``capo-verl eval score`` on all of them together (``<out>/eval_report``); returns the report folder.

    Raises:
        FileNotFoundError: a method has neither ``eval_done`` nor a final checkpoint with Hugging Face weights.
        subprocess.CalledProcessError: ``capo-verl eval`` failed.
    """
    files = [
        f"{m}={generate_heldout(out / m, eval_data, k=k, max_new_tokens=max_new_tokens, dtype=dtype)}" for m in methods
    ]
    report = out / "eval_report"
    subprocess.run(
        [sys.executable, "-m", "capo_verl.cli", "eval", "score", "--generations", *files, "--out", str(report)],
        check=True,
        stdin=subprocess.DEVNULL,
    )
    return report
