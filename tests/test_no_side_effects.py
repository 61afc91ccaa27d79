"""Installing capo-verl does not change a verl run that uses none of its estimators or losses.

The plugin is loaded by every ``import verl`` in the environment, so a plain GRPO run gets its patches too. Here
verl's own trainer (``python -m verl.trainer.main_ppo`` with the repository's CPU profile, ``configs/cpu_base.yaml``,
whatever rollout it sets) runs GRPO without rollout log-probs (``rollout.calculate_log_probs=false``): the
validation responses carry no ``lpm``, so capo-verl's ``val-calib/...`` metrics cannot be computed. With
``trainer.val_calib`` left out (auto) the run must validate, train and validate again, with verl's metrics, no
``val-calib/...`` key and one warning for the whole run (capo_verl/compat/validation.py).

The harness is a minimal copy of tests/test_e2e_cpu.py's: a tiny random Qwen2 model built offline, GSM8K one-step
calculations, a parity reward, verl's file logger for the metrics.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from capo_verl.models import GSM8K_CALC_SOURCE, tiny_model_checkpoint, write_gsm8k_calc_parquet

REPO = Path(__file__).resolve().parents[1]
RUN_TIMEOUT_S = 600

REWARD_SOURCE = '''
def parity_reward(data_source, solution_str, ground_truth, extra_info=None, **kwargs):
    """1.0 for responses whose characters' code points sum to an even number: half of random text."""
    return float(sum(map(ord, solution_str)) % 2 == 0)
'''

SKIPPED_WARNING = "capo-verl: val-calib/* calibration metrics skipped for this run"


def run_verl_cpu(workdir: Path, overrides: list[str]) -> tuple[int, str, dict[int, dict]]:
    """Run verl's trainer on ``configs/cpu_base.yaml`` with a tiny model; return (exit code, log, {step: metrics})."""
    workdir.mkdir(parents=True, exist_ok=True)
    # width 128: head_dim 32, which vLLM's CPU attention supports (not 8); any rollout cpu_base sets takes it
    model = tiny_model_checkpoint(workdir / "tiny_qwen2", hidden_size=128, init_std=0.5, seed=0)
    train, val = write_gsm8k_calc_parquet(workdir / "data", n_train=8, n_val=2, seed=0)
    (workdir / "parity_reward.py").write_text(REWARD_SOURCE)
    metrics = workdir / "metrics.jsonl"
    cmd = [
        sys.executable, "-m", "verl.trainer.main_ppo",
        f"--config-path={REPO / 'configs'}", "--config-name=cpu_base",
        "hydra.searchpath=[pkg://verl.trainer.config]",
        f"actor_rollout_ref.model.path={model}", f"data.train_files={train}", f"data.val_files={val}",
        "data.train_batch_size=2", "data.max_prompt_length=96", "data.max_response_length=8",
        "actor_rollout_ref.rollout.n=2", "actor_rollout_ref.rollout.val_kwargs.n=2",
        "actor_rollout_ref.rollout.val_kwargs.temperature=1.0", "actor_rollout_ref.rollout.val_kwargs.do_sample=true",
        "actor_rollout_ref.actor.ppo_mini_batch_size=2", "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=4",
        "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=4",
        f"reward.custom_reward_function.path={workdir / 'parity_reward.py'}",
        "reward.custom_reward_function.name=parity_reward",
        "trainer.total_training_steps=1", "trainer.val_before_train=true", "trainer.test_freq=1",
        "trainer.save_freq=-1", "trainer.resume_mode=disable", "trainer.logger=[console,file]",
        "trainer.project_name=capo_no_side_effects", f"trainer.experiment_name={workdir.name}",
        f"trainer.default_local_dir={workdir / 'ckpt'}",
        *overrides,
    ]
    env = dict(os.environ, TOKENIZERS_PARALLELISM="false", RAY_DEDUP_LOGS="0", HYDRA_FULL_ERROR="1",
               VERL_FILE_LOGGER_PATH=str(metrics))
    log_path = workdir / "console.log"
    with open(log_path, "w") as log:
        proc = subprocess.run(cmd, cwd=workdir, env=env, stdout=log, stderr=subprocess.STDOUT, timeout=RUN_TIMEOUT_S)
    steps: dict[int, dict] = {}
    for line in metrics.read_text().splitlines() if metrics.exists() else []:
        record = json.loads(line)
        steps.setdefault(int(record["step"]), {}).update(record["data"])
    return proc.returncode, log_path.read_text(), steps


@pytest.mark.slow
@pytest.mark.timeout(RUN_TIMEOUT_S + 60)
def test_grpo_without_rollout_log_probs_validates_and_finishes(tmp_path):
    rc, log, steps = run_verl_cpu(
        tmp_path / "grpo_no_logprobs",
        ["algorithm.adv_estimator=grpo", "actor_rollout_ref.rollout.calculate_log_probs=false"],
    )
    assert rc == 0, log[-6000:]
    assert sorted(steps) == [0, 1], sorted(steps)  # validation before training (step 0), then step 1 + validation
    assert "actor/pg_loss" in steps[1]
    for step in (0, 1):
        core = [k for k in steps[step] if k.startswith(f"val-core/{GSM8K_CALC_SOURCE}/") and k.endswith("/mean@2")]
        assert core, sorted(steps[step])
        assert not any(k.startswith("val-calib/") for k in steps[step]), sorted(steps[step])
    # two validation passes, one warning
    assert log.count(SKIPPED_WARNING) == 1, [ln for ln in log.splitlines() if "val-calib" in ln]
