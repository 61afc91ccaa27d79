"""``capo-verl compare`` in-process: the bootstrap against hand computations, every method's config through verl's
checks, the config lookup from outside a checkout, and the rules of the output folder. Nothing here trains; the
command line is tested in tests/test_compare_cli.py."""

from __future__ import annotations

import functools
import json
import re
import shutil
from pathlib import Path

import numpy as np
import pytest

from capo_verl.compare import (
    METHODS,
    RUN_MARKER,
    UsageError,
    ValidationPass,
    bootstrap_ci,
    config,
    paired_difference,
    pass_summary,
    run_method,
)
from capo_verl.compare.outdir import check_method_dir, differences, require_same
from capo_verl.compare.statistics import hierarchical_bootstrap_diff, seed_t_interval, t_quantile

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
    with pytest.raises(ValueError, match="n_boot must be >= 1"):
        bootstrap_ci(lambda i: 0.5, 5, n_boot=0)


def _pass(step, lpms, corrects):
    return ValidationPass(
        step,
        [f"q{i}" for i in range(len(lpms))],
        [np.asarray(v, float) for v in lpms],
        [np.asarray(c, bool) for c in corrects],
    )


def test_pass_summary_auc_mean_and_accuracy_by_hand():
    vp = _pass(0, [[-1.0, -2.0, -3.0], [-1.0, -0.5, -2.0, -0.1], [-1.0, -1.0]], [[1, 0, 1], [1, 0, 0, 1], [1, 1]])
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


# ----------------------------------------------------------------------- across seeds: t quantile, t-interval,
# two-level bootstrap


def test_t_quantile_hand_values_closed_forms_and_scipy():
    assert t_quantile(0.975, 2) == pytest.approx(4.302653, abs=5e-7)  # the textbook table values
    assert t_quantile(0.975, 1) == pytest.approx(12.706205, abs=5e-7)
    assert t_quantile(0.995, 4) == pytest.approx(4.604095, abs=5e-7)
    assert t_quantile(0.975, 30) == pytest.approx(2.042272, abs=5e-7)
    assert t_quantile(0.5, 3) == 0.0 and t_quantile(0.025, 2) == -t_quantile(0.975, 2)
    for p in (0.6, 0.9, 0.975, 0.999):  # df = 1: Cauchy; df = 2: t = (2p - 1) / sqrt(2p(1 - p))
        assert t_quantile(p, 1) == pytest.approx(np.tan(np.pi * (p - 0.5)), rel=1e-13)
        assert t_quantile(p, 2) == pytest.approx((2 * p - 1) / np.sqrt(2 * p * (1 - p)), rel=1e-13)
    for bad_p in (0.0, 1.0, -0.1, float("nan")):
        with pytest.raises(ValueError, match="p must lie in"):
            t_quantile(bad_p, 3)
    for bad_df in (0, 2.5, True):
        with pytest.raises(ValueError, match=rf"\bdf\b.*>= 1\b.*\b{bad_df!r}$"):
            t_quantile(0.9, bad_df)
    from scipy import stats  # declared in the dev extra: a missing scipy fails here instead of skipping

    for df in (1, 2, 3, 4, 5, 8, 9, 19, 30, 101):
        for p in (0.0005, 0.01, 0.1, 0.4, 0.6, 0.9, 0.95, 0.975, 0.995, 0.9995):
            assert t_quantile(p, df) == pytest.approx(stats.t.ppf(p, df), rel=1e-11)


def test_seed_t_interval_by_hand():
    # per-seed differences 1, 2, 3: mean 2, sd 1, half-width t_{0.975,2} / sqrt(3) = 4.302653 / 1.7320508
    r = seed_t_interval([3.0, 5.0, 7.0], [2.0, 3.0, 4.0])
    assert (r["n_seeds"], r["mean"], r["sd"]) == (3, 2.0, 1.0)
    assert (r["low"], r["high"]) == pytest.approx((2 - 2.484138, 2 + 2.484138), abs=1e-6)
    # per seed and question: each seed's difference is the mean over its questions; NaN = undefined question
    a = np.array([[1.0, 2.0, np.nan], [3.0, 3.0, 3.0], [6.0, np.nan, 4.0]])
    b = np.array([[0.0, 0.0, 1.0], [1.0, 2.0, 3.0], [np.nan, 4.0, 2.0]])  # d = 1.5 - 1/3, 3 - 2, 5 - 3
    r = seed_t_interval(a, b, level=0.9)
    d = np.array([1.5 - 1 / 3, 1.0, 2.0])
    half = t_quantile(0.95, 2) * d.std(ddof=1) / np.sqrt(3)
    assert r["mean"] == pytest.approx(d.mean()) and (r["low"], r["high"]) == pytest.approx(
        (d.mean() - half, d.mean() + half)
    )
    one = seed_t_interval([[1.0, 2.0]], [[0.0, 0.0]])
    assert one["n_seeds"] == 1 and one["mean"] == 1.5 and np.isnan([one["sd"], one["low"], one["high"]]).all()
    with pytest.raises(ValueError, match="same shape"):
        seed_t_interval([1.0, 2.0], [1.0, 2.0, 3.0])
    with pytest.raises(ValueError, match="b has no defined .* at seed index 1"):
        seed_t_interval([[1.0], [2.0]], [[1.0], [np.nan]])
    with pytest.raises(ValueError, match="infinite"):
        seed_t_interval([1.0, np.inf], [1.0, 2.0])
    with pytest.raises(ValueError, match="level must lie in"):
        seed_t_interval([1.0, 2.0], [0.0, 0.0], level=1.0)


def test_hierarchical_bootstrap_with_one_question_per_seed_is_the_bootstrap_over_seeds():
    rng = np.random.default_rng(5)
    a, b = rng.normal(size=6), rng.normal(size=6)
    r = hierarchical_bootstrap_diff(a, b, n_boot=500, seed=11)
    # the documented draws: default_rng(seed).integers(0, S, (n_boot, S)) for the seeds
    idx = np.random.default_rng(11).integers(0, 6, (500, 6))
    means = (a - b)[idx].mean(axis=1)
    assert (r["low"], r["high"]) == pytest.approx((np.quantile(means, 0.025), np.quantile(means, 0.975)), abs=1e-12)
    assert r["mean"] == pytest.approx((a - b).mean()) and (r["n_seeds"], r["n_questions"]) == (6, 1)
    assert hierarchical_bootstrap_diff(a[:, None], b[:, None], n_boot=500, seed=11) == r


def test_hierarchical_bootstrap_collapses_without_spread():
    rng = np.random.default_rng(0)
    b = rng.normal(size=(4, 30))
    r = hierarchical_bootstrap_diff(b + 0.25, b, n_boot=300)  # every paired difference is 0.25
    assert (r["mean"], r["low"], r["high"]) == pytest.approx((0.25, 0.25, 0.25), abs=1e-12)
    r = hierarchical_bootstrap_diff(np.ones((3, 5)), np.zeros((3, 5)), n_boot=50)
    assert (r["mean"], r["low"], r["high"]) == (1.0, 1.0, 1.0)


def test_hierarchical_bootstrap_hand_worked_two_seed_cases():
    # two seeds, one question each, differences 0 and 1: a replicate's mean is 0, 1/2, 1 with probability 1/4,
    # 1/2, 1/4; the 30% and 70% quantiles are both 1/2, the 2.5% and 97.5% ones 0 and 1
    r = hierarchical_bootstrap_diff([0.0, 1.0], [0.0, 0.0], n_boot=4000, seed=1, level=0.4)
    assert (r["mean"], r["low"], r["high"]) == (0.5, 0.5, 0.5)
    r = hierarchical_bootstrap_diff([0.0, 1.0], [0.0, 0.0], n_boot=4000, seed=1)
    assert (r["low"], r["high"]) == (0.0, 1.0)
    # two seeds, two questions: seed 0 differences (0, 0), seed 1 (0, 2). Seed 1's mean over its two drawn
    # questions is 0, 1, 2 with probability 1/4, 1/2, 1/4. A replicate draws seed 1 twice with probability 1/4;
    # then its mean is Binomial(4, 1/2) / 2, so P(2) = 1/4 * 1/16 = 1/64 < 2.5% and P(>= 1.5) = 1/4 * 5/16 = 5/64:
    # the 97.5% quantile is 1.5. A bootstrap over seeds only (per-seed means 0 and 1) could not exceed 1.
    a = np.array([[0.0, 0.0], [0.0, 2.0]])
    r = hierarchical_bootstrap_diff(a, np.zeros((2, 2)), n_boot=20000, seed=2)
    assert (r["mean"], r["low"], r["high"]) == (0.5, 0.0, 1.5)
    # the question draws do not depend on the chunking (one replicate at a time here)
    assert hierarchical_bootstrap_diff(a, np.zeros((2, 2)), n_boot=300, seed=3, max_cells=4) == (
        hierarchical_bootstrap_diff(a, np.zeros((2, 2)), n_boot=300, seed=3)
    )


def test_hierarchical_bootstrap_matches_a_loop_over_replicates_with_undefined_questions():
    rng = np.random.default_rng(9)
    S, Q, B = 3, 4, 400
    a, b = rng.normal(size=(S, Q)), rng.normal(size=(S, Q))
    a[0, :3] = np.nan  # seed 0 has one defined question for a: some replicates have none and are dropped
    b[2, 1] = np.nan
    r = hierarchical_bootstrap_diff(a, b, n_boot=B, seed=4, max_cells=30)
    # the documented draws, one replicate at a time
    g = np.random.default_rng(4)
    seeds = g.integers(0, S, (B, S))
    stats = []
    for rep in range(B):
        q = np.floor(g.random((S, Q)) * Q).astype(int)
        d = []
        for j, s in enumerate(seeds[rep]):
            x, y = a[s, q[j]], b[s, q[j]]
            x, y = x[~np.isnan(x)], y[~np.isnan(y)]
            d.append(x.mean() - y.mean() if x.size and y.size else np.nan)
        stats.append(np.mean(d))
    stats = np.array(stats)
    stats = stats[np.isfinite(stats)]
    assert 0 < stats.size < B
    assert (r["low"], r["high"]) == pytest.approx((np.quantile(stats, 0.025), np.quantile(stats, 0.975)), abs=1e-12)
    assert r["mean"] == pytest.approx(seed_t_interval(a, b)["mean"], abs=1e-15)


def test_hierarchical_bootstrap_errors():
    with pytest.raises(ValueError, match="n_boot must be >= 1"):
        hierarchical_bootstrap_diff([1.0, 2.0], [0.0, 0.0], n_boot=0)
    with pytest.raises(ValueError, match="max_cells must be >= 1"):
        hierarchical_bootstrap_diff([1.0, 2.0], [0.0, 0.0], max_cells=0)
    with pytest.raises(ValueError, match="level must lie in"):
        hierarchical_bootstrap_diff([1.0, 2.0], [0.0, 0.0], level=0.0)
    with pytest.raises(ValueError, match="same shape"):
        hierarchical_bootstrap_diff(np.zeros((2, 3)), np.zeros((2, 4)))
    with pytest.raises(ValueError, match="no values"):
        hierarchical_bootstrap_diff(np.zeros((0, 3)), np.zeros((0, 3)))
    with pytest.raises(ValueError, match="a has no defined .* at seed index 0"):
        hierarchical_bootstrap_diff([[np.nan, np.nan], [1.0, 2.0]], np.zeros((2, 2)))


@pytest.mark.filterwarnings("ignore:Disabled critic")
def test_every_method_passes_verls_checks_on_the_default_config():
    from omegaconf import OmegaConf

    config_dir = config.find_config_dir(config.DEFAULT_CONFIG)
    composed = {
        name: config.checked_config(name, config.DEFAULT_CONFIG, config_dir, list(method.overrides))
        for name, method in METHODS.items()
    }
    assert composed["grpo"].algorithm.adv_estimator == "grpo"
    assert composed["grpo"].algorithm.norm_adv_by_std_in_grpo is False
    assert composed["gspo"].actor_rollout_ref.actor.policy_loss.loss_mode == "gspo"
    assert composed["simko"].actor_rollout_ref.actor.policy_loss.loss_mode == "simko"
    assert OmegaConf.select(composed["capo_no_mask"], "algorithm.capo.use_mask") is False
    # the validation the comparison needs: >= 64 problems x 8 samples, sampled at temperature 1
    val = composed["capo"].actor_rollout_ref.rollout.val_kwargs
    assert val.n >= config.MIN_VAL_SAMPLES and val.do_sample and val.temperature == 1.0
    # what a method's run would be refused for, before it trains
    with pytest.raises(UsageError, match=r"^grpo: .*trainer\.total_training_steps=0\b.*>= 1\b"):
        config.checked_config("grpo", config.DEFAULT_CONFIG, config_dir, ["trainer.total_training_steps=0"])
    with pytest.raises(UsageError, match=r"^grpo: .*\bverl config\b.*\btrainer\.no_such_key\b"):
        config.checked_config("grpo", config.DEFAULT_CONFIG, config_dir, ["trainer.no_such_key=1"])


def test_config_lookup_outside_a_checkout_finds_the_config_or_names_the_flags(tmp_path, monkeypatch):
    # an installation whose configs/ is missing: a clear error naming --config-dir and --config
    monkeypatch.setattr(config, "CONFIG_DIR", tmp_path / "site-packages" / "capo_verl" / "compare" / "configs")
    with pytest.raises(UsageError, match=r"'compare_smollm2_135m_cpu'.*--config-dir DIR.*--config\b"):
        config.find_config_dir(config.DEFAULT_CONFIG)
    with pytest.raises(UsageError, match="not found in --config-dir"):
        config.find_config_dir(config.DEFAULT_CONFIG, tmp_path)
    # an installation with its package data: found there
    shipped = tmp_path / "site-packages" / "capo_verl" / "compare" / "configs"
    shipped.mkdir(parents=True)
    for name in ("compare_smollm2_135m_cpu.yaml", "cpu_base.yaml"):
        shutil.copy(REPO / "configs" / name, shipped / name)
    assert config.find_config_dir(config.DEFAULT_CONFIG) == shipped.resolve()


def test_differences_name_nested_keys_and_absent_ones():
    old = {"config": "a", "composed": {"trainer": {"steps": 3, "freq": 1}}, "overrides": ["x=1"]}
    new = {"config": "a", "composed": {"trainer": {"steps": 4}, "data": {"n": 1}}, "overrides": ["x=1"]}
    assert differences(old, new) == [
        ("composed.data", "<absent>", {"n": 1}),
        ("composed.trainer.freq", 1, "<absent>"),
        ("composed.trainer.steps", 3, 4),
    ]
    assert differences(old, old) == []
    require_same(old, json.loads(json.dumps(old)), "same")
    with pytest.raises(
        UsageError,
        match=r"^x with .*\bcomposed\.data\b.*\bcomposed\.trainer\.freq\b.*\bcomposed\.trainer\.steps: 3 -> 4\b"
        r".*\banother --out\b",
    ):
        require_same(old, new, "x with")


def test_method_folders_compare_did_not_make_are_never_deleted(tmp_path):
    settings = {"config": "c", "method": "grpo"}
    assert check_method_dir(tmp_path / "grpo", settings, None) == "new"
    # a folder of the user's with the method's name: refused, and run_method does not touch it either
    user = tmp_path / "grpo"
    user.mkdir()
    (user / "notes.txt").write_text("mine")
    with pytest.raises(UsageError, match="not made by capo-verl compare"):
        check_method_dir(user, settings, None)
    with pytest.raises(RuntimeError, match="not made by capo-verl compare"):
        run_method("grpo", tmp_path, "c", tmp_path, [], settings=settings)
    assert (user / "notes.txt").read_text() == "mine" and sorted(p.name for p in user.iterdir()) == ["notes.txt"]
    # an unfinished run compare made: may be trained again
    (user / RUN_MARKER).write_text(json.dumps({"method": "grpo", "settings": settings}))
    assert check_method_dir(user, settings, None) == "retrain"
    # finished: reused with the same settings only; the evaluation's k must match too
    (user / "done.json").write_text(json.dumps({"method": "grpo", "settings": settings}))
    (user / "ckpt").mkdir()  # its checkpoints, which the held-out generations are made from
    assert check_method_dir(user, settings, 8) == "done"
    with pytest.raises(UsageError, match=r"method: 'grpo' -> 'capo'"):
        check_method_dir(user, {**settings, "method": "capo"}, None)
    (user / "eval_done").write_text(json.dumps({"k": 4}))
    with pytest.raises(UsageError, match=r"eval_k: 4 -> 8; use --eval-k 4"):
        check_method_dir(user, settings, 8)
    assert check_method_dir(user, settings, None) == "done"
    # finished under an older compare that recorded no settings: cannot be checked, so refused
    (user / "done.json").write_text(json.dumps({"method": "grpo", "wall_s": 1.0, "command": "..."}))
    with pytest.raises(UsageError, match="did not record its settings"):
        check_method_dir(user, settings, None)


#: a stand-in for verl's trainer: trains steps (last checkpoint + 1)..total under resume_mode=auto, logging one metrics
#: line per step (verl's file logger: truncated at start) and checkpointing after each; exits 1 after step
#: $STAND_IN_STOP_AFTER, as a stopped or failed run. As verl 0.9.1 (tests/test_stop_resume.py), from a checkpoint of
#: the last step it trains and logs nothing; with trainer.val_only it logs a validation of the loaded step and returns.
STAND_IN_TRAINER = r"""
import json, os, sys
args = dict(a.lstrip("+").split("=", 1) for a in sys.argv[1:] if "=" in a)
ckpt, total = args["trainer.default_local_dir"], int(args["trainer.total_training_steps"])
os.makedirs(ckpt, exist_ok=True)
tracker = os.path.join(ckpt, "latest_checkpointed_iteration.txt")
start = int(open(tracker).read()) if args["trainer.resume_mode"] == "auto" and os.path.exists(tracker) else 0
with open(os.environ["VERL_FILE_LOGGER_PATH"], "w") as f:
    if args.get("trainer.val_only") == "true":  # validate the loaded step, then return
        f.write(json.dumps({"step": start, "data": {"val": start}}) + "\n")
        sys.exit(0)
    for step in range(start + 1, total + 1):
        f.write(json.dumps({"step": step, "data": {"start": start}}) + "\n")
        with open(tracker, "w") as t:
            t.write(str(step))
        if step == int(os.environ.get("STAND_IN_STOP_AFTER", 0)):
            sys.exit(1)
"""


def test_a_stopped_method_resumes_from_its_last_checkpoint_and_keeps_every_steps_metrics(tmp_path, monkeypatch):
    import sys
    from unittest import mock

    from capo_verl.compare import running
    from capo_verl.compare.report import read_metrics

    real_train_command = running.train_command

    def stand_in(method, config_name, config_dir, run_dir, overrides):
        full = real_train_command(method, config_name, config_dir, run_dir, overrides)
        return [sys.executable, "-c", STAND_IN_TRAINER, *(a for a in full if "=" in a and not a.startswith("--"))]

    settings = {"config": "c", "method": "grpo"}
    with mock.patch.object(running, "train_command", side_effect=stand_in):
        monkeypatch.setenv("STAND_IN_STOP_AFTER", "2")
        with pytest.raises(RuntimeError, match=r"^grpo: .*\btrainer\b.*\bexited\b.*\b1\b.*\blog\b"):
            run_method("grpo", tmp_path, "c", tmp_path, ["trainer.total_training_steps=4"], settings=settings)
        run = tmp_path / "grpo"
        assert check_method_dir(run, settings, None) == "resume"
        assert check_method_dir(run, {**settings, "method": "other"}, None) == "retrain"  # other settings
        monkeypatch.delenv("STAND_IN_STOP_AFTER")
        assert run_method("grpo", tmp_path, "c", tmp_path, ["trainer.total_training_steps=4"], settings=settings) == run

    steps = read_metrics(run / "metrics.jsonl")
    assert {s: d["start"] for s, d in steps.items()} == {1: 0, 2: 0, 3: 2, 4: 2}  # no step lost, none trained twice
    done = json.loads((run / "done.json").read_text())
    assert [(a["start_step"], a["returncode"]) for a in done["attempts"]] == [(0, 1), (2, 0)]
    assert done["wall_s"] == pytest.approx(sum(a["wall_s"] for a in done["attempts"]))
    assert not (run / running.ATTEMPT_METRICS).exists()

    # an unfinished run without a checkpoint is trained again from the start
    shutil.rmtree(run)
    monkeypatch.setenv("STAND_IN_STOP_AFTER", "1")
    with mock.patch.object(running, "train_command", side_effect=stand_in):
        with pytest.raises(RuntimeError):
            run_method("grpo", tmp_path, "c", tmp_path, ["trainer.total_training_steps=4"], settings=settings)
    (run / "ckpt" / "latest_checkpointed_iteration.txt").unlink()
    assert check_method_dir(run, settings, None) == "retrain"


def test_a_method_stopped_after_its_last_checkpoint_runs_only_its_validation(tmp_path, monkeypatch):
    """A run stopped between its last step's checkpoint and the validation after it: the resumed attempt validates
    the last step (trainer.val_only), which a plain resume would not, and trains nothing."""
    import sys
    from unittest import mock

    from capo_verl.compare import running
    from capo_verl.compare.report import read_metrics

    real_train_command = running.train_command

    def stand_in(method, config_name, config_dir, run_dir, overrides):
        full = real_train_command(method, config_name, config_dir, run_dir, overrides)
        return [sys.executable, "-c", STAND_IN_TRAINER, *(a for a in full if "=" in a and not a.startswith("--"))]

    settings = {"config": "c", "method": "grpo", "composed": {"trainer": {"total_training_steps": 3}}}
    assert running.final_step(settings) == 3
    assert running.final_step({"composed": {"trainer": {"total_training_steps": None}}}) is None
    with mock.patch.object(running, "train_command", side_effect=stand_in):
        monkeypatch.setenv("STAND_IN_STOP_AFTER", "3")  # the last step's checkpoint is written, then it stops
        with pytest.raises(RuntimeError):
            run_method("grpo", tmp_path, "c", tmp_path, ["trainer.total_training_steps=3"], settings=settings)
        monkeypatch.delenv("STAND_IN_STOP_AFTER")
        run = run_method("grpo", tmp_path, "c", tmp_path, ["trainer.total_training_steps=3"], settings=settings)

    steps = read_metrics(run / "metrics.jsonl")
    assert sorted(steps) == [1, 2, 3]  # no step 4
    assert steps[3] == {"start": 0, "val": 3}
    done = json.loads((run / "done.json").read_text())
    assert [(a["start_step"], a.get("val_only", False)) for a in done["attempts"]] == [(0, False), (3, True)]
    assert "++trainer.val_only=true" not in done["command"]  # the run's training command


def _dump(path: Path, rows: list[tuple[str, float, bool]]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps({"input": q, "lpm": lpm, "acc": float(c)}) + "\n" for q, lpm, c in rows))


def test_two_step0_passes_are_compared_response_by_response(tmp_path):
    """Seed 0: capo's step-0 pass shares 2 of 3 responses of question a and, as multisets, 2 of 3 of question b
    (p p q vs p q q) with grpo's: 4 / 6; seed 1: the same responses: 1. AUC-mean and accuracy of each pass by hand."""
    from capo_verl.compare.seeds import pass_agreement, step0_agreement, write_seeds_summary

    def dump(path, rows):  # (question, output, lpm, correct)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(
            "".join(json.dumps({"input": q, "output": o, "lpm": lp, "acc": float(c)}) + "\n" for q, o, lp, c in rows)
        )

    grpo = [("a", "x", -1.0, True), ("a", "y", -2.0, False), ("a", "z", -3.0, False)]
    grpo += [("b", "p", -1.0, True), ("b", "p", -1.0, True), ("b", "q", -2.0, True)]
    capo = [("a", "w", -0.5, False), ("a", "x", -1.0, True), ("a", "y", -2.0, False)]  # AUC of a: (0 + 1) / 2
    capo += [("b", "q", -2.0, True), ("b", "p", -1.0, True), ("b", "q", -2.0, True)]
    for k, (g, c) in {0: (grpo, capo), 1: (grpo, grpo)}.items():
        for m, rows in (("grpo", g), ("capo", c)):
            for step in (0, 30):
                dump(tmp_path / f"seed{k}" / m / "val_generations" / f"{step}.jsonl", rows)
    result = step0_agreement(tmp_path, ["grpo", "capo"], [0, 1])
    assert result["capo - grpo"] == pytest.approx([4 / 6, 1.0])
    # any two passes: seed 0's step-30 passes, and a pass of other questions
    runs = tmp_path / "seed0"
    assert pass_agreement(runs / "grpo/val_generations/30.jsonl", runs / "capo/val_generations/30.jsonl") == 4 / 6
    dump(tmp_path / "other.jsonl", [("c", "x", -1.0, True)])
    with pytest.raises(ValueError, match="validated other questions"):
        pass_agreement(runs / "grpo/val_generations/30.jsonl", tmp_path / "other.jsonl")
    per = write_seeds_summary(tmp_path, ["grpo", "capo"], [0, 1], n_boot=50)["per_seed"]  # first pass = step 0
    assert {"base": per["grpo"]["auc_mean"]["first"], "method": per["capo"]["auc_mean"]["first"]} == {
        "base": [1.0, 1.0],
        "method": [0.5, 1.0],
    }  # b is not mixed
    assert per["grpo"]["accuracy"]["first"] == per["capo"]["accuracy"]["first"] == pytest.approx([2 / 3, 2 / 3])
    md = (tmp_path / "seeds_summary.md").read_text()
    assert "| capo - grpo | 0 | 66.7% | 1.000, 0.500 | 0.667, 0.667 |" in md
    # without the response texts (an older dump) or a step-0 pass there is nothing to compare
    _dump(tmp_path / "seed1" / "capo" / "val_generations" / "0.jsonl", [("a", -1.0, True)])
    assert step0_agreement(tmp_path, ["grpo", "capo"], [0, 1]) is None
    (tmp_path / "seed1" / "capo" / "val_generations" / "0.jsonl").unlink()
    assert step0_agreement(tmp_path, ["grpo", "capo"], [0, 1]) is None


def test_the_plans_reading_of_an_interval():
    """docs/compare.md, "Reading the primary endpoint": above/below 0 first, then inside [-0.03, 0.03]."""
    from capo_verl.compare.statistics import read_interval

    read = functools.partial(read_interval, margin=0.03)
    assert read(0.001, 0.2) == "above 0"
    assert read(0.005, 0.025) == "above 0"  # excludes 0, even inside the margin
    assert read(-0.2, -0.001) == "below 0"
    assert read(-0.03, 0.03) == read(-0.01, 0.02) == "inside the margin"
    assert read(-0.031, 0.02) == read(-0.01, 0.05) == read(0.0, 0.04) == "no decision"
    assert read(float("nan"), float("nan")) == "no decision"  # one seed: no t-interval
    assert read_interval(-0.05, 0.05, margin=0.05) == "inside the margin"
    with pytest.raises(ValueError, match="low 0.1 > high 0.0"):
        read(0.1, 0.0)
    with pytest.raises(ValueError, match="margin must be > 0"):
        read_interval(0.0, 0.1, margin=0.0)


def test_seeds_for_a_half_width_by_hand():
    """The plan's sizing rule: the smallest n with t_{0.975, n-1} * sd / sqrt(n) <= h (t from tables)."""
    from capo_verl.compare.statistics import seeds_for_half_width

    # sd 0.05, h 0.03: n = 13 gives 2.178813 * 0.05 / sqrt(13) = 0.03021 > h; n = 14 gives 2.160369 * 0.05 /
    # sqrt(14) = 0.02887 <= h
    assert 2.178813 * 0.05 / np.sqrt(13) > 0.03 >= 2.160369 * 0.05 / np.sqrt(14)
    assert seeds_for_half_width(0.05, 0.03) == 14
    # sd 0.03, h 0.03: n = 6 gives 2.570582 / sqrt(6) = 1.0494 > 1; n = 7 gives 2.446912 / sqrt(7) = 0.9248
    assert seeds_for_half_width(0.03, 0.03) == 7
    # 90%: n = 5 gives 2.131847 / sqrt(5) = 0.9534 <= 1, n = 4 gives 2.353363 / 2 > 1
    assert seeds_for_half_width(0.03, 0.03, level=0.9) == 5
    assert seeds_for_half_width(0.0, 0.03) == 2
    assert seeds_for_half_width(float("nan"), 0.03) is None  # one seed: no spread measured
    assert seeds_for_half_width(1.0, 0.03, max_seeds=100) is None
    # large n: close to the normal approximation (1.96 / 0.03)^2 = 4268.3, a little above it
    assert 4269 <= seeds_for_half_width(1.0, 0.03) <= 4275
    with pytest.raises(ValueError, match="half_width must be > 0"):
        seeds_for_half_width(0.1, 0.0)
    with pytest.raises(ValueError, match="sd must be >= 0"):
        seeds_for_half_width(-0.1, 0.03)


def _dump_passes(out, passes: dict) -> None:
    """Validation dumps ``<out>/seed<k>/<method>/val_generations/<step>.jsonl`` of two questions "a" and "b" from
    ``{(seed, method, step): (question a's samples, question b's samples)}``, samples as ``(lpm, correct)``."""
    for (k, m, step), (qa, qb) in passes.items():
        _dump(
            out / f"seed{k}" / m / "val_generations" / f"{step}.jsonl",
            [("a", *s) for s in qa] + [("b", *s) for s in qb],
        )


def test_seeds_summary_pairs_methods_by_seed_and_question(tmp_path):
    """Two seeds, two methods, two questions of 3 samples each, validated at steps 0 and 30; every number by hand."""
    from capo_verl.compare.seeds import write_seeds_summary

    # per question: samples (lpm, correct). AUC of q with lpm ranking: all correct above all incorrect = 1.0
    up = [(-1.0, True), (-2.0, False), (-3.0, False)]  # AUC 1.0, accuracy 1/3
    down = [(-3.0, True), (-2.0, False), (-1.0, False)]  # AUC 0.0, accuracy 1/3
    half = [(-1.0, True), (-2.0, False), (-1.0, False)]  # AUC (1 + 0.5) / 2 = 0.75, accuracy 1/3
    solved = [(-1.0, True), (-2.0, True), (-3.0, True)]  # not mixed: AUC undefined, accuracy 1
    passes = {  # (seed, method, step) -> (question a, question b)
        (0, "grpo", 0): (up, half), (0, "grpo", 30): (down, half),
        (0, "capo", 0): (up, half), (0, "capo", 30): (up, up),
        (1, "grpo", 0): (half, solved), (1, "grpo", 30): (half, down),
        (1, "capo", 0): (half, solved), (1, "capo", 30): (up, solved),
    }  # fmt: skip
    _dump_passes(tmp_path, passes)
    summary = write_seeds_summary(
        tmp_path, ["grpo", "capo"], [0, 1], plan=_toy_plan(tmp_path, questions=2, samples=3, steps=30), n_boot=200
    )

    # AUC-mean per seed (mean over mixed questions): seed 0 grpo 0 -> (0 + .75)/2, capo (1 + .75)/2 -> (1 + 1)/2;
    # seed 1 grpo .75 -> (.75 + 0)/2, capo .75 -> 1.0 (b not mixed)
    per = summary["per_seed"]
    assert per["grpo"]["auc_mean"]["first"] == pytest.approx([0.875, 0.75])
    assert per["grpo"]["auc_mean"]["last"] == pytest.approx([0.375, 0.375])
    assert per["capo"]["auc_mean"]["last"] == pytest.approx([1.0, 1.0])
    last = summary["differences"]["capo - grpo"]["auc_mean"]["last"]
    assert last["per_seed"] == pytest.approx([0.625, 0.625])
    assert last["t_interval"]["mean"] == pytest.approx(0.625) and last["t_interval"]["sd"] == pytest.approx(0.0)
    # change, per question: seed 0: capo (0, .25) - grpo (-1, 0) -> means .125 - (-.5); seed 1: capo (.25, nan) ->
    # .25, grpo (0, nan: b not mixed at step 0) -> 0
    change = summary["differences"]["capo - grpo"]["auc_mean"]["change"]
    assert change["per_seed"] == pytest.approx([0.625, 0.25])
    t = change["t_interval"]
    half_width = 12.706204736 * np.std([0.625, 0.25], ddof=1) / np.sqrt(2)  # t_{0.975, 1}
    assert (t["low"], t["high"]) == pytest.approx((0.4375 - half_width, 0.4375 + half_width))
    # accuracy: every question 1/3 except `solved` (1): seed 1 capo last (1/3 + 1)/2 vs grpo last 1/3
    acc = summary["differences"]["capo - grpo"]["accuracy"]["last"]
    assert acc["per_seed"] == pytest.approx([0.0, 1 / 3])
    # the calibration endpoint (AUC-mean at the last pass): [0.625, 0.625] lies above 0; sd 0 reaches any
    # half-width with the fewest seeds the t-interval has (2)
    cal = summary["co_primary"]["capo - grpo"]["endpoints"]["calibration"]
    assert {k: cal[k] for k in ("reading", "words", "half_width", "sd", "seeds_needed", "margin")} == {
        "reading": "above 0",
        "words": "capo better calibrated",
        "half_width": 0.0,
        "sd": 0.0,
        "seeds_needed": 2,
        "margin": 0.03,
    }
    # the questions mixed under both methods at the last pass: seed 0 a and b (capo 1, 1; grpo 0, .75), seed 1 a
    # only (capo 1, grpo .75): per seed 1 - .375 and 1 - .75
    both = summary["differences"]["capo - grpo"]["auc_mean"]["both_mixed"]
    assert both["per_seed"] == pytest.approx([0.625, 0.25]) and both["n_questions"] == [2, 1]
    md = (tmp_path / "seeds_summary.md").read_text()
    assert "capo - grpo, at the last pass | +0.625 |" in md
    assert "questions mixed under both methods (2, 1 per seed) | +0.438 |" in md
    assert (
        "| capo - grpo | sampled validation AUC-mean at the last pass | +0.625 | [+0.625, +0.625] | capo better "
        "calibrated (margin 0.03) | 0.000 | 0.000 | 2 |" in md
    )
    assert json.loads((tmp_path / "seeds_summary.json").read_text())["steps"]["capo"] == [[0, 30], [0, 30]]


def test_seeds_summary_with_no_question_mixed_at_both_passes_of_a_seed(tmp_path):
    """A method whose last pass is mixed only on questions that were not mixed at step 0 (a policy that ends almost
    deterministic, as GRPO seed 1 of the pilot): the change from the first pass has no defined question for that
    seed, so that secondary difference is reported undefined; the primary endpoint is still read, by hand."""
    from capo_verl.compare.seeds import write_seeds_summary

    up = [(-1.0, True), (-2.0, False), (-3.0, False)]  # AUC 1.0
    down = [(-3.0, True), (-2.0, False), (-1.0, False)]  # AUC 0.0
    solved = [(-1.0, True), (-2.0, True), (-3.0, True)]  # not mixed
    passes = {  # (seed, method, step) -> (question a, question b)
        (0, "grpo", 0): (up, down), (0, "grpo", 30): (down, up),
        (0, "capo", 0): (up, down), (0, "capo", 30): (up, up),
        (1, "grpo", 0): (up, solved), (1, "grpo", 30): (solved, up),  # a mixed only at 0, b only at 30
        (1, "capo", 0): (up, solved), (1, "capo", 30): (down, solved),
    }  # fmt: skip
    _dump_passes(tmp_path, passes)
    summary = write_seeds_summary(
        tmp_path, ["grpo", "capo"], [0, 1], plan=_toy_plan(tmp_path, questions=2, samples=3, steps=30), n_boot=50
    )

    change = summary["differences"]["capo - grpo"]["auc_mean"]["change"]
    assert change == {"undefined": "no defined value for grpo, seed 1"}
    # at the last pass: seed 0 capo 1.0 - grpo 0.5 = 0.5; seed 1 capo 0.0 - grpo 1.0 = -1.0
    last = summary["differences"]["capo - grpo"]["auc_mean"]["last"]
    assert last["per_seed"] == pytest.approx([0.5, -1.0])
    half_width = 12.706204736 * np.std([0.5, -1.0], ddof=1) / np.sqrt(2)  # t_{0.975, 1}
    t = last["t_interval"]
    assert (t["low"], t["high"]) == pytest.approx((-0.25 - half_width, -0.25 + half_width))
    assert summary["co_primary"]["capo - grpo"]["endpoints"]["calibration"]["reading"] == "no decision"
    # accuracy has no undefined question: its change is defined
    assert "t_interval" in summary["differences"]["capo - grpo"]["accuracy"]["change"]
    md = (tmp_path / "seeds_summary.md").read_text()
    assert "| capo - grpo, change from the first pass | n/a: no defined value for grpo, seed 1 |" in md


def test_defined_difference_reports_only_missing_seeds_and_raises_on_other_faults():
    """A seed with no defined value makes a secondary difference undefined, naming the method and seed; any other
    fault of the values (an infinite value, unequal shapes) is an error, not an undefined row."""
    from capo_verl.compare.seeds import _defined_difference

    kw = {"names": ("capo", "grpo"), "seeds": [3, 4], "level": 0.95, "n_boot": 20}
    a, b = np.array([[0.5, np.nan], [np.nan, np.nan]]), np.array([[0.25, 0.5], [0.75, 1.0]])
    assert _defined_difference(a, b, **kw) == {"undefined": "no defined value for capo, seed 4"}
    d = _defined_difference(np.array([[0.5, np.nan], [1.0, 0.0]]), b, **kw)
    assert d["per_seed"] == pytest.approx([0.5 - 0.375, 0.5 - 0.875])
    with pytest.raises(ValueError, match="infinite"):
        _defined_difference(np.array([[0.5, np.inf], [1.0, 0.0]]), b, **kw)
    with pytest.raises(ValueError):
        _defined_difference(np.array([0.5, 1.0]), b, **kw)


def test_seeds_summary_secondary_measures_by_hand(tmp_path):
    """Teacher-forced AUC-mean per scored step, held-out unbiased pass@k, AUC-mean and perplexity-consistency ITS, and
    the last steps' entropy, paired by seed; two seeds, two methods; every number by hand."""
    from capo_verl.compare.seeds import grad_clip_counts, write_seeds_summary

    up = [(-1.0, True), (-2.0, False), (-3.0, False)]
    for k in (0, 1):
        for m in ("grpo", "capo"):
            for step in (0, 10):
                _dump(tmp_path / f"seed{k}" / m / "val_generations" / f"{step}.jsonl", [("a", *s) for s in up])
    # the pool: question a (correct T F F), question b (T T F); the base model ranks both perfectly (AUC 1, 1)
    tf = tmp_path / "teacher_forced"
    tf.mkdir()
    pool = [("a", True), ("a", False), ("a", False), ("b", True), ("b", True), ("b", False)]
    (tf / "pool.jsonl").write_text(
        "".join(
            json.dumps({"data_source": "d", "question_id": q, "correct": c, "response": "x"}) + "\n" for q, c in pool
        )
    )
    (tf / "step0.json").write_text("{}")
    np.save(tf / "step0.0.npy", np.array([-1.0, -2.0, -3.0, -1.0, -2.0, -3.0]))
    scores = {
        (0, "grpo"): [-3.0, -2.0, -1.0, -1.0, -2.0, -3.0],  # a: 0, b: 1 -> 0.5
        (0, "capo"): [-1.0, -2.0, -3.0, -2.0, -1.0, -1.5],  # a: 1, b: (0 + 1) / 2 -> 0.75
        (1, "grpo"): [-1.0] * 6,  # ties: 0.5, 0.5 -> 0.5
        (1, "capo"): [-1.0, -2.0, -3.0, -1.0, -2.0, -3.0],  # 1, 1 -> 1.0
    }
    # held-out: 2 questions x 4 samples; grpo c = (1, 0), capo c = (2, 1) in both seeds
    held = {"grpo": (1, 0), "capo": (2, 1)}
    for (k, m), lpm in scores.items():
        run = tmp_path / f"seed{k}" / m
        (run / "teacher_forced").mkdir()
        np.save(run / "teacher_forced" / "step10.0.npy", np.array(lpm))
        np.save(run / "teacher_forced" / "step20.partial.0.npy", np.array(lpm))  # a stopped scoring: not a step
        # lpm: grpo ranks its correct sample first (lpm -1, -2, -3, -4), capo last (-4, -3, -2, -1); every correct
        # response answers "5", every incorrect one "7"
        lines = [
            {
                "data_source": "t",
                "question_id": q,
                "sample_index": j,
                "correct": j < held[m][q],
                "answer": "5" if j < held[m][q] else "7",
                "lpm": -1.0 - j if m == "grpo" else -4.0 + j,
            }
            for q in (0, 1)
            for j in range(4)
        ]
        (run / "eval_generations.jsonl").write_text("".join(json.dumps(r) + "\n" for r in lines))
        entropy = [float(s) for s in range(1, 8)] if m == "grpo" else [2.0] * 7  # last 5: mean(3..7) = 5, and 2
        # grad norms against grad_clip 1.0: grpo 2 of 7 above it (1.0 itself is not), capo 5 of 7
        # (a non-finite norm is a step verl skipped, not a clipped one)
        grad = [0.5, 1.0, 1.5, 0.2, 3.0, float("nan"), 0.1] if m == "grpo" else [1.1, 2.0, 0.5, 1.5, 1.2, 0.3, 4.0]
        adv = (0.5, -0.25) if m == "grpo" else (1.0 + k, -0.5)  # (correct, incorrect), the same every step
        (run / "metrics.jsonl").write_text(
            "".join(
                json.dumps(
                    {
                        "step": s + 1,
                        "data": {
                            "actor/entropy": e,
                            "actor/grad_norm": g,
                            "capo/adv_mean_correct": adv[0],
                            "capo/adv_mean_incorrect": adv[1],
                        },
                    }
                )
                + "\n"
                for s, (e, g) in enumerate(zip(entropy, grad))
            )
        )
        composed = {"actor_rollout_ref": {"actor": {"optim": {"clip_grad": 1.0}}}}
        (run / "done.json").write_text(json.dumps({"settings": {"composed": composed}}))
    summary = write_seeds_summary(
        tmp_path, ["grpo", "capo"], [0, 1], plan=_toy_plan(tmp_path, questions=1, samples=3, steps=10), n_boot=200
    )
    sec = summary["secondary"]

    tf_rows = sec["teacher_forced_auc_mean"]["rows"]
    assert list(tf_rows) == ["step 10"] and sec["teacher_forced_auc_mean"]["step0"] == pytest.approx(1.0)
    assert tf_rows["step 10"]["per_seed"] == {"grpo": [0.5, 0.5], "capo": [0.75, 1.0]}
    diff = tf_rows["step 10"]["differences"]["capo - grpo"]
    assert diff["per_seed"] == pytest.approx([0.25, 0.5]) and diff["t_interval"]["mean"] == pytest.approx(0.375)

    # pass@k = 1 - C(n - c, k) / C(n, k), n = 4: c = 1 -> 1/4, 1/2, 1; c = 2 -> 1/2, 5/6, 1; c = 1 -> .., c = 0 -> 0
    pk = sec["heldout_pass_at_k"]["rows"]
    assert list(pk) == ["pass@1", "pass@2", "pass@4"]
    assert pk["pass@1"]["per_seed"]["grpo"] == pytest.approx([0.125, 0.125])
    assert pk["pass@2"]["per_seed"]["capo"] == pytest.approx([(5 / 6 + 0.5) / 2] * 2)
    assert pk["pass@2"]["differences"]["capo - grpo"]["t_interval"]["mean"] == pytest.approx(2 / 3 - 1 / 4)
    assert pk["pass@4"]["per_seed"] == {"grpo": [0.5, 0.5], "capo": [1.0, 1.0]}

    # held-out AUC-mean: grpo's question 0 is its only mixed one, ranked right (1); capo ranks both wrong (0).
    # ITS, perplexity consistency: grpo question 0 C("5") = e^-1 = 0.368 > C("7") = e^-2 + e^-3 + e^-4 = 0.203: right;
    # question 1 only "7": wrong -> 0.5. capo question 0 C("5") = e^-4 + e^-3 < C("7") = e^-2 + e^-1; question 1
    # C("5") = e^-4 < e^-3 + e^-2 + e^-1: both wrong -> 0
    cal = sec["heldout_calibration_its"]["rows"]
    assert cal["AUC-mean"]["per_seed"] == {"grpo": [1.0, 1.0], "capo": [0.0, 0.0]}
    assert cal["AUC-mean"]["differences"]["capo - grpo"]["t_interval"]["mean"] == pytest.approx(-1.0)
    its = cal["ITS accuracy, perplexity consistency"]
    assert its["per_seed"] == {"grpo": [0.5, 0.5], "capo": [0.0, 0.0]}
    assert its["differences"]["capo - grpo"]["per_seed"] == pytest.approx([-0.5, -0.5])

    clipped = sec["grad_clipped"]["rows"]["share of steps"]
    assert clipped["per_seed"] == {"grpo": [2 / 7, 2 / 7], "capo": [5 / 7, 5 / 7]}
    assert clipped["differences"]["capo - grpo"]["t_interval"]["mean"] == pytest.approx(3 / 7)
    counts = grad_clip_counts(tmp_path, ["grpo", "capo"], [0, 1])  # [clipped, logged]: the NaN step is logged
    assert {m: c.tolist() for m, c in counts.items()} == {"grpo": [[2, 7], [2, 7]], "capo": [[5, 7], [5, 7]]}
    by_outcome = sec["advantage_by_outcome"]["rows"]
    assert by_outcome["correct responses"]["per_seed"] == {"grpo": [0.5, 0.5], "capo": [1.0, 2.0]}
    assert by_outcome["incorrect responses"]["differences"]["capo - grpo"]["per_seed"] == pytest.approx([-0.25] * 2)

    ent = sec["entropy"]["rows"]["entropy"]
    assert ent["per_seed"] == {"grpo": [5.0, 5.0], "capo": [2.0, 2.0]}
    assert ent["differences"]["capo - grpo"]["t_interval"]["mean"] == pytest.approx(-3.0)

    md = (tmp_path / "seeds_summary.md").read_text()
    assert "## teacher-forced AUC-mean (fixed base-model pool, 2 questions)" in md
    assert "| step 10 | 0.500 | 0.875 | capo - grpo | +0.375 |" in md
    assert (tmp_path / "seeds_curves.png").stat().st_size > 10_000

    # the co-primary endpoints: both methods rank question a perfectly at every pass (AUC-mean difference 0 in both
    # seeds: the interval [0, 0] lies inside 0.03), the same accuracy (inside 0.05), entropy 2 - 5 = -3 nats in both
    # seeds (below 0); calibration with no difference as large as its margin contradicts the claim
    co = summary["co_primary"]["capo - grpo"]
    assert {k: r["words"] for k, r in co["endpoints"].items()} == {
        "calibration": "no difference as large as 0.03",
        "stability": "capo lower entropy",
        "accuracy": "no difference as large as 0.05",
    }
    assert co["endpoints"]["stability"]["mean"] == pytest.approx(-3.0)
    assert co["verdict"] == {"verdict": "contradicts", "because": ["calibration reads no difference as large as 0.03"]}
    assert "| capo - grpo | actor/entropy, mean of the last 5 logged steps (nats) | -3.000 | [-3.000, -3.000] | " in md
    assert "**Verdict, capo - grpo: contradicts** (calibration reads no difference as large as 0.03)." in md


PILOT2 = REPO / "benchmarks" / "results" / "compare_pilot2_cpu"


def _pilot2_plan():
    """Pilot 2's plan file (margins 0.03, 0.1 nats, 0.05; its verdict rule)."""
    from capo_verl.compare.verdict import load_plan

    return load_plan(PILOT2 / "plan.yaml")


def _toy_plan(folder: Path, *, questions: int, samples: int, steps: int):
    """Pilot 2's plan (its endpoints, margins and rule) for a toy study of that validation size and step budget."""
    import yaml

    from capo_verl.compare.verdict import load_plan

    raw = yaml.safe_load((PILOT2 / "plan.yaml").read_text())
    raw.update(validation={"questions": questions, "samples": samples}, steps=steps)
    path = folder / "toy_plan.yaml"
    path.write_text(yaml.safe_dump(raw))
    return load_plan(path)


def _interval(low: float, high: float, sd: float = 0.03) -> dict:
    return {"mean": (low + high) / 2, "low": low, "high": high, "sd": sd}


def test_co_primary_readings_and_the_verdict_rule_by_hand():
    """docs/results/pilot2.md: each endpoint read against its own margin (0.03, 0.1 nats, 0.05); the verdict
    supports the claim only with calibration better, accuracy not lower and entropy not higher, contradicts it with
    calibration worse or inside its margin or accuracy clearly lower (interval below -0.05), else no decision."""
    from capo_verl.compare.verdict import NOT_MEASURED, apply_verdict, read_endpoint

    plan = _pilot2_plan()
    cal, ent, acc = plan.endpoints

    def read(c, e, a) -> str:
        readings = {
            "calibration": read_endpoint(c, cal, m="capo", base="grpo"),
            "stability": read_endpoint(e, ent, m="capo", base="grpo"),
            "accuracy": read_endpoint(a, acc, m="capo", base="grpo"),
        }
        return apply_verdict(readings, plan)["verdict"]

    better, undecided = _interval(0.01, 0.08), _interval(-0.02, 0.05)
    assert read(better, _interval(-0.05, 0.08), _interval(-0.07, 0.02)) == "supports"  # accuracy: no decision
    assert read(better, _interval(-0.3, -0.2), _interval(0.01, 0.02)) == "supports"  # lower entropy, more accurate
    assert read(better, _interval(0.01, 0.2), undecided) == "no decision"  # higher entropy
    assert read(better, None, undecided) == "no decision"  # entropy not measured
    assert read(better, _interval(-0.05, 0.05), _interval(-0.04, -0.01)) == "no decision"  # less accurate, not clearly
    assert read(better, _interval(-0.05, 0.05), _interval(-0.09, -0.051)) == "contradicts"  # clearly less accurate
    assert read(_interval(-0.03, 0.03), _interval(-0.05, 0.05), undecided) == "contradicts"  # inside 0.03
    assert read(_interval(-0.2, -0.01), _interval(-0.05, 0.05), undecided) == "contradicts"  # grpo better
    assert read(undecided, _interval(-0.05, 0.05), undecided) == "no decision"

    r = read_endpoint(_interval(-0.02, 0.05, sd=0.03), cal, m="capo", base="grpo")
    # half-width 0.035; n = 7 is the first with t_{0.975, n-1} * 0.03 / sqrt(n) <= 0.03 (2.446912 / sqrt(7) = 0.925)
    assert r["words"] == "no decision" and r["half_width"] == pytest.approx(0.035) and r["seeds_needed"] == 7
    # the entropy margin 0.1 nats: [-0.1, 0.1] is inside it; sd 0.1 needs the same 7 seeds
    r = read_endpoint(_interval(-0.1, 0.1, sd=0.1), ent, m="capo", base="grpo")
    assert (r["words"], r["seeds_needed"]) == ("no difference as large as 0.1 nats", 7)
    assert read_endpoint(_interval(-0.2, -0.06), acc, m="capo", base="grpo")["words"] == "capo less accurate"
    assert read_endpoint(_interval(-0.2, -0.06), cal, m="capo", base="grpo")["words"] == "grpo better calibrated"
    one_seed = {"mean": 0.1, "low": float("nan"), "high": float("nan"), "sd": float("nan")}
    assert read_endpoint(one_seed, cal, m="capo", base="grpo")["seeds_needed"] is None
    assert read_endpoint(None, ent, m="capo", base="grpo")["reading"] == NOT_MEASURED


def test_an_endpoint_reads_its_measures_record_and_a_missing_one_is_not_measured():
    """Each measure's record is where capo_verl.compare.seeds writes it; pilot 2's summary without its entropy rows
    reads the stability endpoint "not measured" and its other endpoints as before."""
    import copy

    from capo_verl.compare.verdict import MEASURES, NOT_MEASURED, co_primary, difference_record

    summary = json.loads((PILOT2 / "pilot" / "seeds_summary.json").read_text())
    pair = "capo - grpo"
    assert difference_record(summary, "auc_mean", pair) is summary["differences"][pair]["auc_mean"]["last"]
    assert difference_record(summary, "accuracy", pair) is summary["differences"][pair]["accuracy"]["last"]
    entropy = summary["secondary"]["entropy"]["rows"]["entropy"]["differences"][pair]
    assert difference_record(summary, "entropy", pair) is entropy
    assert difference_record(summary, "auc_mean_both_mixed", pair) is None  # pilot 2 did not record it
    assert difference_record(summary, "auc_mean", "cde - grpo") is None
    with pytest.raises(KeyError, match="unknown measure 'pass_at_k'"):
        difference_record(summary, "pass_at_k", pair)
    assert set(MEASURES) == {"auc_mean", "accuracy", "auc_mean_both_mixed", "entropy"}

    plan = _pilot2_plan()
    assert co_primary(summary, plan)[pair]["endpoints"]["stability"]["mean"] == entropy["t_interval"]["mean"]
    stripped = copy.deepcopy(summary)
    del stripped["secondary"]["entropy"]
    r = co_primary(stripped, plan)[pair]
    assert r["endpoints"]["stability"]["reading"] == NOT_MEASURED
    assert r["endpoints"]["calibration"] == co_primary(summary, plan)[pair]["endpoints"]["calibration"]


def _assert_same_leaves(old: dict, new: dict, keys) -> None:
    """Every leaf of ``keys`` equal in both: floats to 1e-12 (NaN equal to NaN), anything else exactly."""
    for key in keys:
        if isinstance(old[key], float):
            assert new[key] == pytest.approx(old[key], rel=1e-12, abs=1e-12, nan_ok=True), key
        else:
            assert new[key] == old[key], key


def _leaves(x, path=""):
    """``{dotted path: leaf}`` of a JSON record (lists indexed)."""
    if isinstance(x, dict):
        return {k: v for key, value in x.items() for k, v in _leaves(value, f"{path}.{key}").items()}
    if isinstance(x, list):
        return {k: v for i, value in enumerate(x) for k, v in _leaves(value, f"{path}[{i}]").items()}
    return {path: x}


def test_pilot2_summary_regenerates_from_its_plan_file(tmp_path):
    """Pilot 2's seeds_summary.json, written at its code commit with the endpoints inside the package, regenerates
    from the committed unit files and its plan file with the same numbers, readings and verdict; the only keys it
    lost are pilot 1's primary reading (a study's protocol, no longer in the package), and every key it gained is a
    new secondary measure, the plan's name, each endpoint's label or the samples per question."""
    from capo_verl.compare.seeds import write_seeds_summary

    out = tmp_path / "pilot"
    shutil.copytree(PILOT2 / "pilot", out)
    committed = json.loads((PILOT2 / "pilot" / "seeds_summary.json").read_text())
    write_seeds_summary(out, ["grpo", "capo"], [0, 1, 2], plan=_pilot2_plan(), n_boot=committed["n_boot"])
    regenerated = json.loads((out / "seeds_summary.json").read_text())

    old, new = _leaves(committed), _leaves(regenerated)
    assert {k.split("[")[0].split(".")[1] for k in set(old) - set(new)} == {"primary"}
    gained = {k for k in set(new) - set(old)}
    assert all(
        k.startswith((".plan.", ".secondary.grad_clipped.", ".differences.capo - grpo.auc_mean.both_mixed."))
        or k.endswith(".label")
        or k == ".samples"
        for k in gained
    ), sorted(gained)[:5]
    _assert_same_leaves(old, new, set(old) & set(new))
    co = regenerated["co_primary"]["capo - grpo"]
    assert co["verdict"]["verdict"] == "no decision"
    assert co["endpoints"]["calibration"]["mean"] == pytest.approx(-0.005, abs=5e-4)
    assert co["endpoints"]["calibration"]["seeds_needed"] == 11
    md = (out / "seeds_summary.md").read_text()
    assert "**Verdict, capo - grpo: no decision**" in md and "pilot 2's plan file (`plan.yaml`)" in md
    # the units must be the plan's: 256 questions x 8 samples, 30 steps
    from capo_verl.compare.verdict import PlanError

    with pytest.raises(PlanError, match=r"\bvalidation\.samples: .*\b16\b.*\b8\b"):
        write_seeds_summary(
            out, ["grpo", "capo"], [0, 1, 2], plan=_toy_plan(tmp_path, questions=256, samples=16, steps=30)
        )


MAIN = REPO / "benchmarks" / "results" / "compare_main_cpu"


def test_main_run_summary_regenerates_from_its_plan_file(tmp_path):
    """The main run's committed seeds_summary.json (one pair's while units come in, the study's at the verdict)
    regenerates from the committed unit files and the main run's plan file with the same numbers and readings; its
    units are the plan's (580 questions x 16 samples, 30 steps, shared step-0 pass) and its seeds among the plan's."""
    from capo_verl.compare.seeds import write_seeds_summary
    from capo_verl.compare.verdict import load_plan

    units = MAIN / "units"
    committed = json.loads((units / "seeds_summary.json").read_text())
    plan = load_plan(MAIN / "plan.yaml")
    seeds = committed["seeds"]
    assert set(seeds) <= set(plan.seeds) and committed["methods"] == list(plan.methods) == ["grpo", "capo"]
    assert (committed["n_questions"], committed["samples"]) == (580, 16)
    assert committed["steps"] == {m: [[0, 30]] * len(seeds) for m in plan.methods}
    out = tmp_path / "units"
    shutil.copytree(units / "teacher_forced", out / "teacher_forced")
    for k in seeds:  # each method's step-0 pass is the seed's, kept once in step0/
        for m in (*plan.methods, "step0"):
            shutil.copytree(units / f"seed{k}" / m, out / f"seed{k}" / m)
    write_seeds_summary(out, list(plan.methods), seeds, plan=plan, n_boot=committed["n_boot"])
    regenerated = json.loads((out / "seeds_summary.json").read_text())

    old, new = _leaves(committed), _leaves(regenerated)
    assert set(old) == set(new)
    _assert_same_leaves(old, new, old)
    assert committed["plan"]["study"] == "the main run"
    co = regenerated["co_primary"]["capo - grpo"]
    assert set(co["endpoints"]) == {"calibration", "stability", "accuracy"}
    # each seed's difference is the one its own report (seed<k>/summary.json, written by the unit's call) gives
    differences = regenerated["differences"]["capo - grpo"]
    assert [len(differences[m]["last"]["per_seed"]) for m in ("auc_mean", "accuracy")] == [len(seeds)] * 2
    for i, k in enumerate(seeds):
        report = json.loads((units / f"seed{k}" / "summary.json").read_text())["methods"]
        last = {m: report[m]["passes"][-1] for m in plan.methods}
        assert {p["step"] for p in last.values()} == {30}
        for measure in ("auc_mean", "accuracy"):
            diff = differences[measure]["last"]["per_seed"][i]
            assert diff == pytest.approx(last["capo"][measure] - last["grpo"][measure], abs=1e-12), (measure, k)
    assert (out / "seeds_summary.md").read_text() == (units / "seeds_summary.md").read_text()


def test_a_plan_file_is_checked_and_each_fault_names_its_key(tmp_path):
    """Every fault of a plan file is one PlanError naming the file and the key; pilot 2's plan reads as written."""
    import yaml

    from capo_verl.compare.verdict import PlanError, load_plan

    plan = _pilot2_plan()
    assert (plan.methods, plan.seeds, plan.steps, plan.level) == (("grpo", "capo"), (0, 1, 2), 30, 0.95)
    assert [(e.key, e.measure, e.margin) for e in plan.endpoints] == [
        ("calibration", "auc_mean", 0.03),
        ("stability", "entropy", 0.1),
        ("accuracy", "accuracy", 0.05),
    ]
    raw = yaml.safe_load((PILOT2 / "plan.yaml").read_text())

    def fault(change) -> str:
        data = json.loads(json.dumps(raw))
        change(data)
        path = tmp_path / "plan.yaml"
        path.write_text(yaml.safe_dump(data))
        with pytest.raises(PlanError) as info:
            load_plan(path)
        assert str(info.value).startswith(f"plan file {path}: ")
        return str(info.value).split(": ", 1)[1]

    assert fault(lambda d: d.pop("steps")) == "steps: missing"
    # each fault names its key (the message's prefix), the bad value and the values allowed, not a fixed sentence
    assert re.match(r"\(top level\): .*\bunknown\b.*'margins'", fault(lambda d: d.update(margins=1)))
    assert re.match(
        r"endpoints\.calibration\.margin: .*> 0\b.*\b0\b",
        fault(lambda d: d["endpoints"]["calibration"].update(margin=0)),
    )
    assert re.match(
        r"endpoints\.accuracy\.measure: .*'acc'.*\bauc_mean\b",
        fault(lambda d: d["endpoints"]["accuracy"].update(measure="acc")),
    )
    assert re.match(
        r"verdict\.supports_if_all\[0\]\.reading: .*\babove 0\b.*\['above'\]",
        fault(lambda d: d["verdict"]["supports_if_all"][0].update(reading=["above"])),
    )
    assert re.match(
        r"verdict\.contradicts_if_any\[1\]: .*\bendpoint\b.*\baccuracy, calibration, stability\b",
        fault(lambda d: d["verdict"]["contradicts_if_any"][1].update(endpoint="speed")),
    )
    assert re.match(r"methods: .*\btwo or more\b.*\['grpo'\]", fault(lambda d: d.update(methods=["grpo"])))
    assert re.match(r"level: .*\(0, 1\).*\b1\.0\b", fault(lambda d: d.update(level=1.0)))
    assert re.match(r"seeds: .*\bdistinct integers\b.*\[3, 3\]", fault(lambda d: d.update(seeds=[3, 3])))
    assert re.match(r"seeds: .*\bdistinct integers\b.*\[True\]", fault(lambda d: d.update(seeds=[True])))
    assert re.match(r"methods: .*\btwice\b.*\['grpo', 'grpo'\]", fault(lambda d: d.update(methods=["grpo", "grpo"])))
    assert re.match(
        r"endpoints\.calibration\.measure: \['auc_mean'\].*\bauc_mean\b",
        fault(lambda d: d["endpoints"]["calibration"].update(measure=["auc_mean"])),
    )
    assert re.match(
        r"endpoints\.calibration\.above: '\{margin\} better'.*\{m\} and \{base\}",
        fault(lambda d: d["endpoints"]["calibration"].update(above="{margin} better")),
    )
    with pytest.raises(PlanError, match="cannot be read"):
        load_plan(tmp_path / "missing.yaml")


def test_a_shared_step0_pass_is_copied_marked_and_left_out_of_the_agreement(tmp_path):
    """``compare --share-step0``: the second method takes the first's step-0 pass byte for byte, marked with its
    source and SHA-256; the step-0 agreement then reports that seed as shared (None), not as 100% identical; a run
    that validated step 0 itself is refused."""
    import hashlib

    from capo_verl.compare.running import SHARED_STEP0, share_step0
    from capo_verl.compare.seeds import step0_agreement

    rows = [{"input": "a", "output": o, "lpm": lp, "acc": c} for o, lp, c in (("x", -1.0, 1.0), ("y", -2.0, 0.0))]
    for k, m in ((0, "grpo"), (0, "capo"), (1, "grpo")):
        path = tmp_path / f"seed{k}" / m / "val_generations" / "0.jsonl"
        path.parent.mkdir(parents=True)
        path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    seed1 = tmp_path / "seed1"
    with pytest.raises(RuntimeError, match=r"\bseed2/grpo/val_generations/.*\bstep-0\b.*\bshare\b"):
        share_step0(tmp_path / "seed2" / "grpo", tmp_path / "seed2" / "capo")
    target = share_step0(seed1 / "grpo", seed1 / "capo")
    source = seed1 / "grpo" / "val_generations" / "0.jsonl"
    assert target.read_bytes() == source.read_bytes()
    record = json.loads((target.parent / SHARED_STEP0).read_text())
    assert record == {"from": "grpo/val_generations/0.jsonl", "sha256": hashlib.sha256(source.read_bytes()).hexdigest()}
    assert share_step0(seed1 / "grpo", seed1 / "capo") == target  # done: nothing to do
    with pytest.raises(RuntimeError, match=r"\bseed0/capo/val_generations/.*\bstep 0\b.*\bseed0/grpo/val_generations/"):
        share_step0(tmp_path / "seed0" / "grpo", tmp_path / "seed0" / "capo")
    assert step0_agreement(tmp_path, ["grpo", "capo"], [0, 1]) == {"capo - grpo": [1.0, None]}


def test_a_compressed_dump_reads_as_the_plain_one(tmp_path):
    """A committed unit keeps its validation dumps as ``<step>.jsonl.xz``: the passes, the step-0 agreement and the
    summary read them as the plain files."""
    from capo_verl.compare.report import validation_passes
    from capo_verl.compare.seeds import step0_agreement
    from capo_verl.stored import plain_name, read_bytes

    src = PILOT2 / "pilot" / "seed0"
    packed = [validation_passes(src / m) for m in ("grpo", "capo")]
    for m in ("grpo", "capo"):
        folder = tmp_path / "seed0" / m / "val_generations"
        folder.mkdir(parents=True)
        dumps = list((src / m / "val_generations").glob("*.jsonl.xz"))
        assert dumps
        for dump in dumps:
            (folder / plain_name(dump).name).write_bytes(read_bytes(dump))
    plain = [validation_passes(tmp_path / "seed0" / m) for m in ("grpo", "capo")]
    for a_passes, b_passes in zip(plain, packed):
        assert [p.step for p in a_passes] == [p.step for p in b_passes] == [0, 30]
        for a, b in zip(a_passes, b_passes):
            assert a.questions == b.questions
            assert all(np.array_equal(x, y) for x, y in zip(a.lpm, b.lpm))
    assert step0_agreement(tmp_path, ["grpo", "capo"], [0]) == {"capo - grpo": [1.0]}


@pytest.mark.parametrize("suffix", ["", ".gz", ".xz"])
def test_a_response_with_a_unicode_line_separator_stays_one_sample(tmp_path, suffix):
    """verl dumps with ``ensure_ascii=False``, so U+2028, U+2029 and U+0085 reach the file unescaped; a JSON line
    ends only at ``\\n`` (``str.splitlines`` cut such a line in two and the summary stopped with a JSONDecodeError)."""
    import gzip
    import lzma

    from capo_verl.compare.report import dump_lines, read_validation_pass

    rows = [
        {"input": "q1", "output": "6 + 32 = 22 +\u20283 = 25.", "score": 0.0, "lpm": -1.5},
        {"input": "q1", "output": "2 + 2 = 4\u2029", "score": 1.0, "lpm": -0.5},
        {"input": "q2", "output": "\x85 10", "score": 1.0, "lpm": -0.25},
        {"input": "q2", "output": "ten\r\nthen 11", "score": 0.0, "lpm": -2.0},
    ]
    text = "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows)
    assert "\u2028" in text and len(text.splitlines()) > len(rows)  # what broke the old reader
    path = tmp_path / f"0.jsonl{suffix}"
    pack = {"": bytes, ".gz": gzip.compress, ".xz": lzma.compress}[suffix]
    path.write_bytes(pack(text.encode()))

    assert [json.loads(line) for line in dump_lines(path) if line.strip()] == rows
    assert dump_lines(str(path)) == dump_lines(path)  # a str path reads the same
    vp = read_validation_pass(path)
    assert vp.questions == ["q1", "q2"]
    assert [list(x) for x in vp.lpm] == [[-1.5, -0.5], [-0.25, -2.0]]
    assert [list(x) for x in vp.correct] == [[False, True], [True, False]]


def test_main_run_seed4_step0_pass_reads_all_its_responses():
    """The main run's seed-4 step-0 dump holds one response with U+2028 (line 1818): all 580 x 16 samples read."""
    from capo_verl.compare.report import read_validation_pass
    from capo_verl.stored import stored

    dump = stored(REPO / "benchmarks/results/compare_main_cpu/units/seed4/step0/val_generations/0.jsonl")
    assert dump.exists()
    vp = read_validation_pass(dump)
    assert len(vp.questions) == 580 and sum(len(x) for x in vp.lpm) == 9280
