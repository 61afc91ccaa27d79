"""The paper's recipes as shipped, trained on the CPU: ``scripts/run_capo_qwen2.5_math_1.5b.sh`` and the GRPO
recipe's ``scripts/run_grpo_qwen2.5_math_1.5b.sh`` run themselves for 2 steps each, with only

- the device: ``trainer.device=cpu``, one rank (``N_GPUS_PER_NODE=1``), ``fsdp2`` for the actor and the reference;
- the sizes: the tiny model, 16 prompts of the test data (``CAPO_DATA_DIR``, ``CAPO_VAL_SETS``), 4 prompts x 4
  responses a step, responses of 16 tokens, 4 validation samples, 2 steps, a checkpoint at step 2;
- the logger: ``[console,file]`` (no wandb).

Every other key of the recipe stays, ``use_remove_padding``, gradient checkpointing, ``use_dynamic_bsz`` with
``ppo_max_token_len_per_gpu`` and the reference's ``param_offload`` included (:data:`KEPT` checks that they reach the
run). No recipe key is left out: :data:`NOT_EXERCISED` is empty (``docs/reproducing.md``, "not exercised off a
GPU", says what a CPU run cannot show).
"""

from __future__ import annotations

import json
import math
import os
import re
import subprocess
from pathlib import Path

import pytest
from omegaconf import OmegaConf

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1500)]

REPO = Path(__file__).resolve().parents[1]
RUN_TIMEOUT_S = 600

#: recipe keys a CPU run cannot exercise, with the reason (none: every key runs)
NOT_EXERCISED: dict[str, str] = {}

#: recipe keys that must reach the run as the recipe sets them
KEPT = {
    "actor_rollout_ref.model.use_remove_padding": True,
    "actor_rollout_ref.model.enable_gradient_checkpointing": True,
    "actor_rollout_ref.actor.use_dynamic_bsz": True,
    "actor_rollout_ref.actor.ppo_max_token_len_per_gpu": 16384,
    "actor_rollout_ref.ref.fsdp_config.param_offload": True,
}

CHANGED = (
    "trainer.device=cpu",
    "actor_rollout_ref.actor.strategy=fsdp2",
    "actor_rollout_ref.ref.strategy=fsdp2",
    "data.train_batch_size=4",
    "data.max_prompt_length=96",
    "data.max_response_length=16",
    "actor_rollout_ref.rollout.n=4",
    "actor_rollout_ref.rollout.val_kwargs.n=4",
    "actor_rollout_ref.actor.ppo_mini_batch_size=4",
    "trainer.total_training_steps=2",
    "trainer.save_freq=2",
    "trainer.test_freq=2",
    "trainer.logger=[console,file]",
)


@pytest.fixture(scope="module")
def recipe_inputs(e2e_inputs, tmp_path_factory):
    data = tmp_path_factory.mktemp("recipe_data")
    (data / "deepscaler_train.parquet").write_bytes(e2e_inputs.train.read_bytes())
    (data / "gsm8k_val.parquet").write_bytes(e2e_inputs.val.read_bytes())
    return data, e2e_inputs.model


def recipe_env(data: Path, model: Path, workdir: Path) -> dict[str, str]:
    env = dict(
        os.environ,
        CAPO_DATA_DIR=str(data),
        CAPO_VAL_SETS="gsm8k_val",
        CAPO_CKPT_DIR=str(workdir / "ckpt"),
        CAPO_MODEL_1_5B=str(model),
        N_GPUS_PER_NODE="1",
        NNODES="1",
        VERL_FILE_LOGGER_PATH=str(workdir / "metrics.jsonl"),
    )
    for key in ("RAY_ADDRESS", "RAY_TMPDIR"):
        env.pop(key, None)
    return env


def dry_run_config(script: str, data: Path, model: Path, workdir: Path):
    proc = subprocess.run(
        ["bash", str(REPO / "scripts" / script), "--dry-run", *CHANGED],
        env=recipe_env(data, model, workdir), capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = proc.stdout.split("checked with verl's validate_config):", 1)[1].splitlines()
    start = next(i for i, line in enumerate(lines) if re.match(r"^[a-z_]+:", line))  # after verl's own print
    return OmegaConf.create("\n".join(lines[start:]))


def run_recipe(script: str, data: Path, model: Path, workdir: Path) -> tuple[int, str, list[dict]]:
    workdir.mkdir(parents=True)
    metrics = workdir / "metrics.jsonl"
    env = recipe_env(data, model, workdir)
    proc = subprocess.run(
        ["bash", str(REPO / "scripts" / script), *CHANGED],
        cwd=workdir, env=env, capture_output=True, text=True, timeout=RUN_TIMEOUT_S, errors="replace",
    )  # fmt: skip
    log = proc.stdout + proc.stderr
    (workdir / "console.log").write_text(log)
    steps = [json.loads(x) for x in metrics.read_text().splitlines() if x.strip()] if metrics.exists() else []
    return proc.returncode, log, steps


@pytest.mark.parametrize(
    "script, estimator",
    [("run_capo_qwen2.5_math_1.5b.sh", "capo"), ("run_grpo_qwen2.5_math_1.5b.sh", "grpo")],
)
def test_recipe_trains_two_steps_on_the_cpu_with_only_device_size_and_logger_changed(
    recipe_inputs, tmp_path, script, estimator
):
    assert NOT_EXERCISED == {}  # every recipe key runs here; a key that could not would be named with its reason
    data, model = recipe_inputs
    rc, log, records = run_recipe(script, data, model, tmp_path / estimator)
    assert rc == 0, log[-6000:]
    resolved = dry_run_config(script, data, model, tmp_path / "dry")  # the config the run used, as --dry-run prints it
    for key, value in KEPT.items():
        assert OmegaConf.select(resolved, key) == value, key
    trained = {r["step"]: r["data"] for r in records if "actor/pg_loss" in r["data"]}
    assert sorted(trained) == [1, 2], sorted(trained)
    for step, metrics in trained.items():
        capo = {k: v for k, v in metrics.items() if k.startswith("capo/")}
        assert capo and all(math.isfinite(v) for v in capo.values()), (step, capo)
        assert not any(k.startswith("actor/kl") for k in metrics), [k for k in metrics if "kl" in k]
        if estimator == "capo":
            assert "timing_s/ref" in metrics, sorted(k for k in metrics if k.startswith("timing_s"))
    ckpt = next((tmp_path / estimator / "ckpt").rglob("latest_checkpointed_iteration.txt"))
    assert ckpt.read_text().strip() == "2" and (ckpt.parent / "global_step_2").is_dir()
