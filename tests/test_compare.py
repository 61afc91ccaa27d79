"""``capo-verl compare``: the bootstrap against hand computations, the report on synthetic logs, and a CI-sized
run (tiny random model, 2 steps x 2 methods) through verl's trainer, the held-out evaluation and the report."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from capo_verl import compare
from capo_verl.compare import METHODS, ValidationPass, bootstrap_ci, paired_difference, pass_summary
from capo_verl.models import tiny_model_checkpoint

REPO = Path(__file__).resolve().parents[1]


def test_bootstrap_ci_matches_a_hand_computation():
    # the same draws as the function: numpy's default_rng(seed).integers(0, n, n), n_boot times
    x = np.array([0.0, 1.0, 1.0, 0.0, 1.0, 1.0, 1.0, 0.0, 1.0, 1.0])
    low, high = bootstrap_ci(lambda i: x[i].mean(), len(x), n_boot=300, seed=7)
    rng = np.random.default_rng(7)
    means = np.sort([x[rng.integers(0, 10, 10)].mean() for _ in range(300)])
    assert low == pytest.approx(np.quantile(means, 0.025)) and high == pytest.approx(np.quantile(means, 0.975))
    assert low < x.mean() < high
    # a constant statistic has a zero-width interval; an always-undefined one gives NaN
    assert bootstrap_ci(lambda i: 0.5, 5, n_boot=50) == (0.5, 0.5)
    assert all(np.isnan(bootstrap_ci(lambda i: float("nan"), 5, n_boot=50)))


def _pass(step, lpms, corrects):
    return ValidationPass(step, [f"q{i}" for i in range(len(lpms))],
                          [np.asarray(v, float) for v in lpms], [np.asarray(c, bool) for c in corrects])


def test_pass_summary_auc_mean_and_accuracy_by_hand():
    vp = _pass(0, [[-1.0, -2.0, -3.0], [-1.0, -0.5, -2.0, -0.1], [-1.0, -1.0]],
               [[1, 0, 1], [1, 0, 0, 1], [1, 1]])
    s = pass_summary(vp, n_boot=200)
    # q0: correct {-1, -3} vs incorrect {-2}: pairs (-1 > -2) yes, (-3 > -2) no -> 0.5
    # q1: correct {-1, -0.1} vs incorrect {-0.5, -2}: -1>-0.5 no, -1>-2 yes, -0.1>-0.5 yes, -0.1>-2 yes -> 0.75
    assert s["auc_mean"] == pytest.approx((0.5 + 0.75) / 2)
    assert s["n_mixed"] == 2 and not s["auc_judgeable"]
    assert s["accuracy"] == pytest.approx((2 / 3 + 2 / 4 + 1) / 3)
    assert s["n_samples"] == 9


def test_paired_difference_uses_the_same_questions_for_both():
    a = _pass(4, [[-1.0, -2.0]] * 3, [[1, 0]] * 3)  # AUC 1 everywhere, accuracy 0.5
    b = _pass(4, [[-2.0, -1.0]] * 3, [[1, 0]] * 3)  # AUC 0 everywhere, accuracy 0.5
    d = paired_difference(a, b, n_boot=100)
    assert d["auc_mean_diff"] == 1.0 and d["auc_mean_diff_ci"] == (1.0, 1.0)
    assert d["accuracy_diff"] == 0.0 and d["accuracy_diff_ci"] == (0.0, 0.0)
    with pytest.raises(ValueError, match="share no question"):
        paired_difference(a, ValidationPass(4, ["other"], [np.zeros(2)], [np.array([True, False])]))


def test_every_method_maps_to_overrides_that_compose_on_the_base_config():
    from omegaconf import OmegaConf

    for name, method in METHODS.items():
        assert all(o.startswith("++") for o in method.overrides), name
    cfg = compare._composed(compare.DEFAULT_CONFIG, compare.CONFIG_DIR, list(METHODS["grpo"].overrides))
    assert cfg.algorithm.adv_estimator == "grpo" and cfg.algorithm.norm_adv_by_std_in_grpo is False
    cfg = compare._composed(compare.DEFAULT_CONFIG, compare.CONFIG_DIR, list(METHODS["gspo"].overrides))
    assert cfg.actor_rollout_ref.actor.policy_loss.loss_mode == "gspo"
    cfg = compare._composed(compare.DEFAULT_CONFIG, compare.CONFIG_DIR, list(METHODS["capo_no_mask"].overrides))
    assert OmegaConf.select(cfg, "algorithm.capo.use_mask") is False
    # the validation the comparison needs: >= 64 problems x 8 samples, sampled at temperature 1
    val = cfg.actor_rollout_ref.rollout.val_kwargs
    assert val.n >= 8 and val.do_sample and val.temperature == 1.0


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

    # resume: both runs are done, so nothing is trained again; --plot-only redraws from the logs
    again = subprocess.run(cmd + ["--no-eval"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert again.returncode == 0, again.stderr[-3000:]
    assert again.stdout.count("not trained again") == 2
    (out / "entropy.png").unlink()
    plot = subprocess.run([sys.executable, "-m", "capo_verl.cli", "compare", "--plot-only", "--out", str(out),
                           "--methods", "grpo", "capo"], capture_output=True, text=True, timeout=300)
    assert plot.returncode == 0, plot.stderr[-3000:]
    assert (out / "entropy.png").exists()
