"""``capo-verl compare`` end to end (SLOW: trains; about 10-15 min on 2 cores): a CI-sized run (tiny random model,
2 steps x 2 methods) through verl's trainer, the held-out evaluation and the report, then a second run into the same
folder that reuses both methods, and ``--plot-only``. The checks that stop before training are in
tests/test_compare_cli.py."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from capo_verl import compare
from capo_verl.models import tiny_model_checkpoint

REWARD_SOURCE = '''
def parity_reward(data_source, solution_str, ground_truth, extra_info=None, **kwargs):
    """1.0 for responses whose characters' code points sum to an even number: half of random text."""
    return float(sum(map(ord, solution_str)) % 2 == 0)
'''


@pytest.mark.timeout(900)
def test_compare_cli_two_methods_two_steps_tiny_model(tmp_path):
    """CI-sized `capo-verl compare`: grpo and capo, 2 steps each, tiny random model; logs, plots, summary, eval."""
    model = tiny_model_checkpoint(tmp_path / "tiny_qwen2", init_std=0.5, seed=0)
    reward = tmp_path / "parity_reward.py"
    reward.write_text(REWARD_SOURCE)
    out = tmp_path / "cmp"
    cmd = [
        sys.executable, "-m", "capo_verl.cli", "compare", "--methods", "grpo", "capo", "--steps", "2",
        "--out", str(out), "--data-dir", str(tmp_path / "data"), "--eval-k", "2", "--n-boot", "200",
        f"actor_rollout_ref.model.path={model}",
        f"reward.custom_reward_function.path={reward}", "reward.custom_reward_function.name=parity_reward",
        "data.max_response_length=16", "trainer.test_freq=2",
        "actor_rollout_ref.actor.optim.lr=1e-3",
        "algorithm.capo.ref_high=1e6", "algorithm.capo.ref_low=1.0",
    ]
    env = dict(os.environ, RAY_DEDUP_LOGS="0")
    proc = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=880)
    logs = "\n".join(p.read_text()[-3000:] for p in out.glob("*/train.log"))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:] + logs

    for m in ("grpo", "capo"):
        steps = compare.read_metrics(out / m / "metrics.jsonl")
        assert {1, 2} <= set(steps), sorted(steps)
        # capo/* calibration metrics for both methods; the mask only for capo
        assert "capo/mixed_group_frac" in steps[1] and "capo/lpm_correct_mean" in steps[1]
        assert ("capo/mask_frac_correct" in steps[1]) == (m == "capo")
        assert json.loads((out / m / "done.json").read_text())["method"] == m
        passes = compare.validation_passes(out / m)
        assert [p.step for p in passes] == [0, 2]
        assert len(passes[0].questions) == 64 and all(len(c) == 8 for c in passes[0].correct)
        assert (out / m / "eval_generations.jsonl").exists()
    summary = json.loads((out / "summary.json").read_text())
    assert set(summary["methods"]) == {"grpo", "capo"}
    assert "capo - grpo" in summary["differences"]
    for name in ("val_auc_mean.png", "val_accuracy.png", "train_auc_mean.png", "entropy.png"):
        assert (out / name).stat().st_size > 5000, name
    md = (out / "summary.md").read_text()
    assert "| capo | 2 |" in md and "capo - grpo" in md
    assert (out / "eval_report" / "metrics.json").exists() and "Held-out evaluation" in md
    # the folder is marked as compare's; each finished method records the settings it ran with
    marker = json.loads((out / compare.MARKER).read_text())
    assert "++trainer.total_training_steps=2" in marker["settings"]["overrides"]
    done = json.loads((out / "capo" / "done.json").read_text())
    assert done["settings"]["composed"]["algorithm"]["adv_estimator"] == "capo"
    assert json.loads((out / "capo" / "eval_done").read_text())["k"] == 2

    # resume: both runs are done, so nothing is trained again; --plot-only redraws from the logs
    again = subprocess.run(cmd + ["--no-eval"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert again.returncode == 0, again.stderr[-3000:]
    assert again.stdout.count("not trained again") == 2
    # with other settings the folder is refused before anything runs
    other = subprocess.run([*cmd, "--steps", "3"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert other.returncode == 2 and "composed.trainer.total_training_steps: 2 -> 3" in other.stderr
    (out / "entropy.png").unlink()
    plot = subprocess.run([sys.executable, "-m", "capo_verl.cli", "compare", "--plot-only", "--out", str(out),
                           "--methods", "grpo", "capo"], capture_output=True, text=True, timeout=300)
    assert plot.returncode == 0, plot.stderr[-3000:]
    assert (out / "entropy.png").exists()
