"""End to end on CPU: ``python -m verl.trainer.main_ppo`` with ``actor_rollout_ref.actor.policy_loss.loss_mode=simko``.

Same setting as tests/test_e2e_cpu.py (v1 trainer, Ray, FSDP2, TransferQueue, ``hf`` rollout, a tiny random Qwen2
model, GSM8K one-step calculations, a parity reward that makes about half of the groups mixed), 2 steps. It shows
that the ``simko`` loss is found in the actor worker, that the engine's top-K tensors reach it (the loss raises
without them), and that its diagnostics come back in verl's metrics, with the paper configs' packed layout
(``use_remove_padding``) and token-budget micro-batches (``use_dynamic_bsz``). About 1-2 minutes on 2 cores.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import psutil
import pytest

from capo_verl.models import tiny_model_checkpoint, write_gsm8k_calc_parquet

REPO = Path(__file__).resolve().parents[1]
RUN_TIMEOUT_S = 290

pytestmark = pytest.mark.timeout(RUN_TIMEOUT_S + 30)

REWARD_SOURCE = '''
def parity_reward(data_source, solution_str, ground_truth, extra_info=None, **kwargs):
    """1.0 for responses whose characters' code points sum to an even number: half of random text."""
    return float(sum(map(ord, solution_str)) % 2 == 0)
'''


def _run_verl(tmp_path: Path, overrides: list[str]):
    model = tiny_model_checkpoint(tmp_path / "tiny_qwen2", init_std=0.5, seed=0)
    train, val = write_gsm8k_calc_parquet(tmp_path / "data", n_train=16, n_val=4, seed=0)
    reward = tmp_path / "parity_reward.py"
    reward.write_text(REWARD_SOURCE)
    workdir = tmp_path / "run"
    workdir.mkdir()
    metrics = workdir / "metrics.jsonl"
    cmd = [
        sys.executable, "-m", "verl.trainer.main_ppo",
        f"--config-path={REPO / 'configs'}", "--config-name=cpu_base",
        "hydra.searchpath=[pkg://verl.trainer.config]",
        f"actor_rollout_ref.model.path={model}",
        f"data.train_files={train}", f"data.val_files={val}",
        "data.train_batch_size=4", "data.max_prompt_length=96", "data.max_response_length=16",
        "actor_rollout_ref.rollout.n=4",
        "actor_rollout_ref.actor.optim.lr=1e-3",
        "actor_rollout_ref.actor.ppo_mini_batch_size=4", "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=8",
        "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=16",
        "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=16",
        f"reward.custom_reward_function.path={reward}", "reward.custom_reward_function.name=parity_reward",
        "trainer.total_training_steps=2", "trainer.val_before_train=false", "trainer.test_freq=-1",
        "trainer.save_freq=-1", "trainer.resume_mode=disable", "trainer.logger=[console,file]",
        "trainer.project_name=capo_e2e", "trainer.experiment_name=simko",
        f"trainer.default_local_dir={workdir / 'ckpt'}",
        *overrides,
    ]
    env = dict(os.environ)
    env.update(
        OMP_NUM_THREADS=str(len(os.sched_getaffinity(0))),
        TQ_NUM_THREADS=str(min(8, psutil.cpu_count(logical=False) or 1)),
        TOKENIZERS_PARALLELISM="false",
        RAY_DEDUP_LOGS="0",
        VERL_FILE_LOGGER_PATH=str(metrics),
        HYDRA_FULL_ERROR="1",
    )
    log_path = workdir / "console.log"
    with open(log_path, "w") as log:
        proc = subprocess.run(cmd, cwd=workdir, env=env, stdout=log, stderr=subprocess.STDOUT, timeout=RUN_TIMEOUT_S)
    records = [json.loads(line) for line in metrics.read_text().splitlines()] if metrics.exists() else []
    steps: dict[int, dict] = {}
    for record in records:
        steps.setdefault(int(record["step"]), {}).update(record["data"])
    return proc.returncode, log_path.read_text(), steps


def test_simko_trains_through_verl_main_ppo_on_cpu(tmp_path):
    rc, log, steps = _run_verl(
        tmp_path,
        [
            "algorithm.adv_estimator=grpo", "algorithm.norm_adv_by_std_in_grpo=false",
            "actor_rollout_ref.actor.policy_loss.loss_mode=simko",
            "+actor_rollout_ref.actor.policy_loss.simko.top_k=3",
            "+actor_rollout_ref.actor.policy_loss.simko.alpha=0.1",
            "+actor_rollout_ref.actor.policy_loss.simko.entropy_quantile=0.5",
            "actor_rollout_ref.actor.loss_agg_mode=seq-mean-token-mean",
            # the paper configs' layout: packed sequences, micro-batches by token budget (several per update)
            "actor_rollout_ref.model.use_remove_padding=true",
            "actor_rollout_ref.actor.use_dynamic_bsz=true", "actor_rollout_ref.actor.ppo_max_token_len_per_gpu=400",
            "actor_rollout_ref.rollout.log_prob_use_dynamic_bsz=true",
            "actor_rollout_ref.rollout.log_prob_max_token_len_per_gpu=400",
        ],
    )
    assert rc == 0, log[-4000:]
    assert sorted(steps) == [1, 2], sorted(steps)
    for step, data in steps.items():
        simko = {k: v for k, v in data.items() if k.startswith("actor/simko/")}
        for key in ("forking_frac", "smoothed_frac", "penalized_frac", "top1_frac", "top1_prob_mean",
                    "topk_prob_mass_mean", "entropy_threshold_mean"):
            value = simko.get(f"actor/simko/{key}")
            assert value is not None and math.isfinite(value), (step, key, simko)
        # the 0.5 quantile of each response's entropies: at most half of the tokens are above it
        assert 0.2 < simko["actor/simko/forking_frac"] <= 0.5, simko
        assert simko["actor/simko/smoothed_frac"] + simko["actor/simko/penalized_frac"] <= simko[
            "actor/simko/forking_frac"] + 1e-6
        assert 0.0 < simko["actor/simko/top1_prob_mean"] <= simko["actor/simko/topk_prob_mass_mean"] <= 1.0
        assert math.isfinite(data["actor/pg_loss"]) and math.isfinite(data["actor/grad_norm"])
        assert data["training/rollout_probs_diff_max"] < 0.05  # the rollout still follows the actor
    # a mixed group in one of the two steps gives smoothed tokens (correct responses with A > 0)
    assert any(data["actor/simko/smoothed_frac"] > 0 for data in steps.values()), steps


def test_simko_with_an_uncovered_strategy_stops_before_training(tmp_path):
    """Asking for SimKO with fused kernels stops in verl's validate_config with the key and the fix."""
    rc, log, steps = _run_verl(
        tmp_path,
        ["actor_rollout_ref.actor.policy_loss.loss_mode=simko", "actor_rollout_ref.model.use_fused_kernels=true"],
    )
    assert rc != 0
    assert "set actor_rollout_ref.model.use_fused_kernels=false" in log, log[-4000:]
    assert not steps
