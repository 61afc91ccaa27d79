"""Teacher-forced calibration inside ``capo-verl compare --teacher-forced K``.

Once per output folder, ``capo-verl eval generate`` draws a pool from the base model: ``K`` responses to each
validation question (temperature 1.0, seed 0, in the training rollout's precision, token ids kept), with their fixed
correctness, in ``<out>/teacher_forced/pool.jsonl``; ``capo-verl eval teacher-forced`` scores it with the base model
(``<out>/teacher_forced/step0.json``). After a method's training, every checkpoint with Hugging Face weights scores
the same pool (``<out>[/seed<k>]/<method>/teacher_forced/step<N>.json``, the lpm of every pool line in
``step<N>.0.npy``), in float32 (:mod:`capo_verl.evaluation.teacher_forced`: one forward pass, no sampling). Then the
finished run's checkpoints are pruned to their Hugging Face weights: a finished run is never resumed, so its model,
optimizer and data-loader states are no longer needed. ``<run>/teacher_forced/scored.json`` marks a run whose
checkpoints have all been scored: such a run is not scored again, and needs no checkpoint (a finished unit copied
to another machine without ``ckpt/``).

What it measures: how each checkpoint ranks the SAME responses (the base model's), not its own samples. Each step
is skipped when its output exists, so a stopped comparison goes on where it stopped.
"""

from __future__ import annotations

import json
import logging
import shlex
import subprocess
import sys
from pathlib import Path

from capo_verl.outputs import write_atomic

logger = logging.getLogger("capo_verl.compare")

#: folder of the pool and the base model's scores, at the top of ``--out`` (shared by every seed and method)
POOL_DIR = "teacher_forced"
#: marks a run whose checkpoints were all scored (the steps, in ``<run>/teacher_forced/``)
SCORED = "scored.json"
#: scoring precision: the plan's float32, so that no bf16 rounding enters the comparison between checkpoints
SCORE_DTYPE = "float32"


def _eval(*args: str) -> None:
    cmd = [sys.executable, "-m", "capo_verl.cli", "eval", *args]
    logger.info("%s", shlex.join(cmd[2:]))
    subprocess.run(cmd, check=True, stdin=subprocess.DEVNULL)


def checkpoints_with_hf(run_dir: Path) -> dict[int, Path]:
    """``{step: <run>/ckpt/global_step_<step>/actor/huggingface}`` for every checkpoint holding Hugging Face
    weights (``*.safetensors``), by step."""
    found = {}
    for step_dir in (run_dir / "ckpt").glob("global_step_*"):
        hf = step_dir / "actor" / "huggingface"
        if any(hf.glob("*.safetensors")):
            found[int(step_dir.name.rsplit("_", 1)[1])] = hf
    return dict(sorted(found.items()))


def make_pool(out: Path, val_data: Path, base_model: Path, *, k: int, max_new_tokens: int, dtype: str) -> Path:
    """Draw the pool (unless ``pool.jsonl`` is complete) and score it with the base model (unless ``step0.json``
    exists); returns ``<out>/teacher_forced``. ``dtype``: vLLM's weight precision for the pool (compare passes
    ``actor_rollout_ref.rollout.dtype``); the scoring is float32 whatever it is.

    ``capo-verl eval generate`` resumes a stopped pool itself (its ``.meta.json`` records the settings); its
    completion is marked by ``pool.done``.

    Raises:
        subprocess.CalledProcessError: ``capo-verl eval`` failed.
    """
    folder = out / POOL_DIR
    folder.mkdir(exist_ok=True)
    pool = folder / "pool.jsonl"
    if not (folder / "pool.done").exists():
        _eval(
            "generate", "--model", str(base_model), "--data", str(val_data), "-k", str(k),
            "--max-new-tokens", str(max_new_tokens), "--temperature", "1.0", "--seed", "0",
            "--dtype", dtype, "--save-token-ids", "--no-progress", "--out", str(pool),
        )  # fmt: skip
        write_atomic(folder / "pool.done", json.dumps({"k": k, "data": str(val_data)}) + "\n")
    if not (folder / "step0.json").exists():
        score(pool, val_data, {0: base_model}, folder, tokenizer=base_model)
    return folder


def score(pool: Path, val_data: Path, models: dict[int, Path], folder: Path, *, tokenizer: Path) -> None:
    """``capo-verl eval teacher-forced`` of ``pool`` with each model, one call per step: ``<folder>/step<N>.json``
    and ``step<N>.0.npy`` (written to a temporary name first, so an existing file is always complete).

    Raises:
        subprocess.CalledProcessError: the scoring failed.
    """
    folder.mkdir(parents=True, exist_ok=True)
    for step, model in models.items():
        target = folder / f"step{step}.json"
        if target.exists():
            continue
        partial = folder / f"step{step}.partial.json"
        _eval(
            "teacher-forced", "--pool", str(pool), "--data", str(val_data), "--model", f"step{step}={model}",
            "--tokenizer", str(tokenizer), "--dtype", SCORE_DTYPE, "--batch-size", "16", "--out", str(partial),
        )  # fmt: skip
        record = json.loads(partial.read_text())
        npy = folder / f"step{step}.0.npy"
        Path(folder / f"step{step}.partial.0.npy").replace(npy)
        record["models"][f"step{step}"]["lpm_file"] = npy.name
        write_atomic(target, json.dumps(record, indent=2) + "\n")  # whole: an existing step<N>.json is never torn
        partial.unlink()


def score_run(run_dir: Path, pool_dir: Path, val_data: Path, *, tokenizer: Path) -> None:
    """Score the pool with every checkpoint of a finished run (``<run>/teacher_forced/``), mark it scored
    (:data:`SCORED`, the steps), then prune the run's checkpoints to their Hugging Face weights
    (:func:`prune_to_hf`). A run marked scored is left as it is, with or without its checkpoints.

    Raises:
        FileNotFoundError: the run is not marked scored and has no checkpoint with Hugging Face weights.
        subprocess.CalledProcessError: the scoring failed.
    """
    marker = run_dir / POOL_DIR / SCORED
    if marker.exists():
        logger.info("%s: teacher-forced scores complete (%s), not scored again", run_dir.name, marker)
        return
    models = checkpoints_with_hf(run_dir)
    if not models and (run_dir / "done.json").exists() and not (run_dir / "ckpt").exists():
        raise FileNotFoundError(
            f"{run_dir}: finished without its checkpoints (ckpt/) and not marked scored ({POOL_DIR}/{SCORED}): its "
            "teacher-forced scores cannot be made; delete the folder to train it again"
        )
    if not models:
        raise FileNotFoundError(
            f"{run_dir / 'ckpt'}: no checkpoint with Hugging Face weights to score; --teacher-forced needs "
            "actor_rollout_ref.actor.checkpoint.save_contents with hf_model and trainer.save_freq"
        )
    score(pool_dir / "pool.jsonl", val_data, models, run_dir / POOL_DIR, tokenizer=tokenizer)
    write_atomic(marker, json.dumps({"steps": list(models)}) + "\n")
    prune_to_hf(run_dir)


def prune_to_hf(run_dir: Path) -> int:
    """Delete the sharded model, optimizer and extra states (``*.pt``) of a FINISHED run's checkpoints, keeping
    each one's ``actor/huggingface`` folder; returns the bytes freed.

    Raises:
        RuntimeError: the run has not finished (no ``done.json``): its checkpoints are what it resumes from.
    """
    if not (run_dir / "done.json").exists():
        raise RuntimeError(f"{run_dir}: not finished (no done.json); its checkpoints are kept for resuming")
    freed = 0
    for pt in (run_dir / "ckpt").glob("global_step_*/**/*.pt"):
        freed += pt.stat().st_size
        pt.unlink()
    return freed
