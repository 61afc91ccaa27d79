"""``capo-verl compare`` through its command line: refusals (exit 2, one line, before anything is written or
trained), the output folder's safety, reuse of finished methods, ``--plot-only`` on the committed runs, and the
config lookup of an installed wheel. The command line runs in this process through ``main`` (one verl import for
all), the console script as a subprocess. No test here trains: finished runs are built from the committed logs
(benchmarks/results/compare_cpu), and a command that gets as far as training fails its test."""

from __future__ import annotations

import contextlib
import io
import json
import logging
import os
import shutil
import subprocess
import sys
from pathlib import Path
from unittest import mock

import pytest

from capo_verl.compare import MARKER, RUN_MARKER, build_parser, cli, make_plan, paired_difference, prepare_out
from capo_verl.compare.report import validation_passes
from capo_verl.compare.running import run_method

REPO = Path(__file__).resolve().parents[1]
COMMITTED = REPO / "benchmarks" / "results" / "compare_cpu"
PILOT2_PLAN = REPO / "benchmarks" / "results" / "compare_pilot2_cpu" / "plan.yaml"
CHECK_TIMEOUT_S = 240  # composing verl's config takes 10-30 s on 2 busy cores; training would take minutes

pytestmark = pytest.mark.filterwarnings("ignore:Disabled critic")


def run_cli(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    """``capo-verl compare ARGS``: its ``main`` in this process (what ``python -m capo_verl.compare`` runs). A run
    that gets as far as training or evaluating a method that has not finished fails the test (as a subprocess:
    conftest's ``run_capo_verl``)."""

    def run_method_if_done(method, out, *rest, **kwargs):
        if not (out / method / "done.json").exists():
            pytest.fail(f"compare {' '.join(args)} would train {method}: it should have stopped before")
        return run_method(method, out, *rest, **kwargs)

    def no_evaluation(*_args, **_kwargs):
        pytest.fail(f"compare {' '.join(args)} would run the held-out evaluation")

    out, err = io.StringIO(), io.StringIO()
    before = os.getcwd()
    os.chdir(cwd)
    try:
        with (
            mock.patch.object(cli, "run_method", run_method_if_done),
            mock.patch.object(cli, "evaluate", no_evaluation),
            mock.patch.object(cli, "generate_heldout", no_evaluation),
            contextlib.redirect_stdout(out),
            contextlib.redirect_stderr(err),
        ):
            try:
                code = cli.main(list(args))
            except SystemExit as exc:  # argparse: --help
                code = exc.code or 0
    finally:
        os.chdir(before)
    return subprocess.CompletedProcess(["capo-verl", "compare", *args], code, out.getvalue(), err.getvalue())


def refusal(proc: subprocess.CompletedProcess) -> str:
    """The one-line refusal of a command that exited 2 (asserted), without its prefix."""
    assert proc.returncode == 2, (proc.returncode, proc.stdout[-2000:], proc.stderr[-3000:])
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("capo-verl compare: error: "), proc.stderr[-3000:]
    return lines[0].removeprefix("capo-verl compare: error: ")


def snapshot(folder: Path) -> dict[str, tuple]:
    """Every file and folder under ``folder`` with its content and modification time."""
    return {
        str(p.relative_to(folder)): (p.read_bytes() if p.is_file() else None, p.stat().st_mtime_ns)
        for p in sorted(folder.rglob("*"))
    }


def base_args(tmp_path: Path, out: Path, *extra: str) -> list[str]:
    """grpo and capo, 3 steps, no held-out evaluation; data under tmp_path; a model path that is never loaded."""
    return [
        "--out",
        str(out),
        "--data-dir",
        str(tmp_path / "data"),
        "--methods",
        "grpo",
        "capo",
        "--steps",
        "3",
        "--no-eval",
        *extra,
        f"actor_rollout_ref.model.path={tmp_path / 'model'}",
    ]


@pytest.mark.parametrize(
    "args, message",
    [
        (["--steps", "0"], "argument --steps: must be >= 1, got 0"),
        (["--steps", "-1", "--no-eval"], "argument --steps: must be >= 1, got -1"),
        (["--methods", "grpo", "grpo"], "--methods lists grpo more than once"),
        (["--methods", "grpo", "nope"], "argument --methods: invalid choice: 'nope'"),
        (["--n-boot", "0"], "argument --n-boot: must be >= 1, got 0"),
        (["--seeds", "0-1,0"], "--seeds lists a seed more than once: 0,1,0"),
        (["--seeds=-1"], "argument --seeds: '-1': give seeds as 0,1,2 or 0-2 (integers >= 0)"),
        (["--seeds", "3-1"], "argument --seeds: '3-1': range 3-1 runs backwards"),
        (["--eval-k", "0"], "argument --eval-k: must be >= 1, got 0"),
        (["--config", "nope"], "config 'nope' not found in the configs shipped with capo-verl"),
        (
            ["trainer.no_such_key=1"],
            "the shared config: the overrides do not give a valid verl config: Could not "
            "override 'trainer.no_such_key'",
        ),
        (
            ["algorithm.adv_estimator=nope"],
            "method grpo: the overrides do not give a valid verl config: algorithm.adv_estimator=nope: not a "
            "registered advantage estimator",
        ),
        (
            ["trainer.total_training_steps=0"],
            "method grpo: the overrides do not give a valid verl config: trainer.total_training_steps=0: must be an "
            "integer >= 1",
        ),
        (
            ["actor_rollout_ref.rollout.val_kwargs.do_sample=false"],
            "actor_rollout_ref.rollout.val_kwargs.do_sample",  # refused before anything is written, naming the key
        ),
        (["--seeds", "0-2000"], "argument --seeds: '0-2000': more than 100 seeds; each trains every method"),
        (["--val-questions", "most"], "argument --val-questions: not an integer: 'most'"),
        (
            ["--share-step0"],
            "--share-step0 validates the base model once per seed for every method: it needs --seeds K",
        ),
        (["--seeds", "0", "--step0-only"], "--step0-only makes each seed's shared step-0 pass: add --share-step0"),
        (
            ["--seeds", "0", "--share-step0", "--step0-only", "--prepare-only"],
            "--prepare-only and --step0-only: give one of them",
        ),
        (["--plan", str(PILOT2_PLAN)], "--plan reads a comparison across seeds; add --seeds (the plan's: 0,1,2)"),
        (["--plan", str(PILOT2_PLAN), "--seeds", "1,5"], "--seeds: seed 5 is not among the plan's seeds (0,1,2)"),
        (
            ["--plan", str(PILOT2_PLAN), "--seeds", "0", "--methods", "capo", "grpo"],
            "--methods capo grpo: the plan compares --methods grpo capo",
        ),
        (["--plan", str(PILOT2_PLAN), "--seeds", "0", "--steps", "3"], "--steps 3: the plan trains --steps 30"),
        (["--plan", "nope.yaml", "--seeds", "0"], "nope.yaml: cannot be read"),
        (["--teacher-forced", "0"], "argument --teacher-forced: must be >= 1, got 0"),
        (
            ["actor_rollout_ref.actor.checkpoint.save_contents=[model,optimizer]", "--teacher-forced", "8"],
            "--teacher-forced scores Hugging Face weights, but actor_rollout_ref.actor.checkpoint.save_contents is "
            "['model', 'optimizer']; add hf_model",
        ),
        (
            ["trainer.save_freq=0", "--teacher-forced", "8"],
            "--teacher-forced needs checkpoints: trainer.save_freq is 0; set >= 1",
        ),
        (  # overrides on both sides of an option are all read (the model path stands before it)
            ["--teacher-forced", "8", "trainer.save_freq=0"],
            "--teacher-forced needs checkpoints: trainer.save_freq is 0; set >= 1",
        ),
    ],
)
def test_a_bad_argument_exits_2_before_anything_is_written(tmp_path, args, message):
    out = tmp_path / "cmp"
    proc = run_cli(
        "--out",
        str(out),
        "--data-dir",
        str(tmp_path / "data"),
        f"actor_rollout_ref.model.path={tmp_path / 'model'}",
        *args,
        cwd=tmp_path,
    )
    assert message in refusal(proc)
    assert sorted(p.name for p in tmp_path.iterdir()) == []  # no output folder, no data


def test_the_capo_verl_console_script_runs_compare(tmp_path, run_capo_verl):
    script = (str(Path(sys.executable).parent / "capo-verl"), "compare")

    def run_cli(*args, cwd):
        return run_capo_verl(*args, cwd=cwd, program=script, timeout=CHECK_TIMEOUT_S)

    assert "argument --steps: must be >= 1, got 0" in refusal(
        run_cli("--out", str(tmp_path / "cmp"), "--steps", "0", cwd=tmp_path)
    )
    helped = run_cli("--help", cwd=tmp_path)
    assert helped.returncode == 0 and "--reuse-out" in helped.stdout and "--config-dir" in helped.stdout


def test_a_folder_compare_did_not_make_is_refused_and_left_untouched(tmp_path):
    user = tmp_path / "mine"
    (user / "grpo").mkdir(parents=True)
    (user / "notes.txt").write_text("my notes")
    (user / "grpo" / "model.bin").write_bytes(b"\0" * 64)
    before = snapshot(user)

    message = refusal(run_cli(*base_args(tmp_path, user), cwd=tmp_path))
    assert f"--out {user} " in message and "not empty" in message and MARKER in message
    assert "--reuse-out" in message
    assert snapshot(user) == before

    # --reuse-out adopts the folder, but never a method folder compare did not make: still refused, untouched
    message = refusal(run_cli(*base_args(tmp_path, user, "--reuse-out"), cwd=tmp_path))
    assert f"{user / 'grpo'} exists" in message and RUN_MARKER in message
    assert snapshot(user) == before  # not even the marker: nothing is written unless every check passes

    # nor one holding a file compare would overwrite
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "summary.md").write_text("my summary")
    message = refusal(run_cli(*base_args(tmp_path, tmp_path / "other", "--reuse-out"), cwd=tmp_path))
    assert "--reuse-out" in message and "summary.md" in message and "overwrite" in message
    assert (tmp_path / "other" / "summary.md").read_text() == "my summary"
    assert not (tmp_path / "data").exists()


def finished_runs(tmp_path: Path, out: Path, args: list[str]) -> dict:
    """``out`` as compare leaves it after training grpo and capo with ``args``: marker, and per method the
    committed logs with ``.capo-verl-run.json`` and ``done.json`` recording the settings. Returns the settings."""
    plan = make_plan(build_parser().parse_args(args))
    prepare_out(out, plan.settings, plan.method_settings, eval_k=None)
    for method, settings in plan.method_settings.items():
        run = out / method
        shutil.copytree(COMMITTED / method, run, ignore=shutil.ignore_patterns("done.json", "eval_*"))
        (run / RUN_MARKER).write_text(json.dumps({"method": method, "settings": settings}))
        (run / "done.json").write_text(
            json.dumps({"method": method, "wall_s": 60.0, "command": "python -m verl...", "settings": settings})
        )
    return plan.method_settings


def test_finished_methods_are_reused_only_with_the_same_settings(tmp_path, caplog):
    out = tmp_path / "cmp"
    settings = finished_runs(tmp_path, out, base_args(tmp_path, out))
    before = snapshot(out)

    # other shared settings: refused, naming the differing keys, and nothing recorded over the old results
    message = refusal(run_cli(*base_args(tmp_path, out, "--steps", "4"), cwd=tmp_path))
    assert f"--out {out} " in message and "other settings" in message
    assert "composed.trainer.total_training_steps: 3 -> 4" in message
    assert snapshot(out) == before and not (out / "compare.json").exists()

    # a finished method whose recorded settings differ from this run's (e.g. another version's METHODS entry)
    done = out / "grpo" / "done.json"
    record = json.loads(done.read_text())
    record["settings"]["composed"]["algorithm"]["norm_adv_by_std_in_grpo"] = True
    done.write_text(json.dumps(record))
    message = refusal(run_cli(*base_args(tmp_path, out), cwd=tmp_path))
    assert message.startswith("grpo: ") and f"{out / 'grpo'} " in message and "other settings" in message
    assert "composed.algorithm.norm_adv_by_std_in_grpo: True -> False" in message
    assert not (out / "compare.json").exists()
    record["settings"] = settings["grpo"]
    done.write_text(json.dumps(record))

    # a held-out evaluation recorded with another k (checked before training; --no-eval skips it)
    (out / "grpo" / "eval_done").write_text(json.dumps({"k": 4, "command": "..."}))
    args = [a for a in base_args(tmp_path, out, "--eval-k", "8") if a != "--no-eval"]
    assert "grpo: evaluated in" in (message := refusal(run_cli(*args, cwd=tmp_path)))
    assert "eval_k: 4 -> 8; use --eval-k 4" in message

    # the same settings: nothing trained again, the report drawn with the requested resamples
    with caplog.at_level(logging.INFO, logger="capo_verl.compare"):
        proc = run_cli(*base_args(tmp_path, out, "--n-boot", "300"), cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert caplog.text.count("not trained again") == 2  # progress: the capo_verl logger (stderr), not stdout
    summary = json.loads((out / "summary.json").read_text())
    assert summary["n_boot"] == 300 and "capo - grpo" in summary["differences"]
    assert "settings" not in summary["methods"]["grpo"]["run"]
    assert "(300 resamples)" in (out / "summary.md").read_text()
    recorded = json.loads((out / "compare.json").read_text())
    assert recorded["methods"] == ["grpo", "capo"] and "++trainer.total_training_steps=3" in recorded["overrides"]


def test_plot_only_redraws_committed_runs_with_the_requested_resamples(tmp_path):
    out = tmp_path / "compare_cpu"
    shutil.copytree(COMMITTED, out)
    for name in ("summary.md", "summary.json", "val_auc_mean.png"):
        (out / name).unlink()
    (out / "notes.md").write_text("mine")
    (out / "summary.md").write_text("the user's own summary")
    # the committed folder has no compare marker: --plot-only refuses to write its summary files there
    message = refusal(run_cli("--plot-only", "--methods", "grpo", "capo", "--out", str(out), cwd=tmp_path))
    assert message.startswith(f"--plot-only: {out}") and "capo-verl compare" in message and MARKER in message
    assert "add --reuse-out" in message and (out / "summary.md").read_text() == "the user's own summary"
    proc = run_cli(
        "--plot-only", "--reuse-out", "--methods", "grpo", "capo", "--n-boot", "300", "--out", str(out), cwd=tmp_path
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert (out / "notes.md").read_text() == "mine"
    md = (out / "summary.md").read_text()
    assert "(300 resamples)" in md and "2000 resamples" not in md and md in proc.stdout
    summary = json.loads((out / "summary.json").read_text())
    assert summary["n_boot"] == 300
    # the difference in the summary is the paired bootstrap of the last common validation step, 300 resamples
    grpo, capo = (validation_passes(out / m)[-1] for m in ("grpo", "capo"))
    expected = paired_difference(capo, grpo, n_boot=300)
    got = summary["differences"]["capo - grpo"]
    assert got["step"] == capo.step == 20
    assert got["auc_mean_diff"] == pytest.approx(expected["auc_mean_diff"])
    assert got["auc_mean_diff_ci"] == pytest.approx(list(expected["auc_mean_diff_ci"]))
    assert (out / "val_auc_mean.png").stat().st_size > 5000
    assert not (out / MARKER).exists()  # --plot-only writes the report only

    message = refusal(
        run_cli("--plot-only", "--reuse-out", "--methods", "grpo", "simko", "--out", str(out), cwd=tmp_path)
    )
    assert message.startswith(f"--plot-only: {out / 'simko'}: no metrics.jsonl")


def test_an_installed_wheel_finds_its_default_config_outside_the_checkout(tmp_path):
    """Build the wheel from a copy of the sources, install it elsewhere, and compose the default config there."""
    src = tmp_path / "src"
    src.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(REPO / name, src / name)
    shutil.copytree(REPO / "configs", src / "configs")
    shutil.copytree(
        REPO / "capo_verl", src / "capo_verl", symlinks=True, ignore=shutil.ignore_patterns("__pycache__", "*.egg-info")
    )
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check", "-q"]
    subprocess.run(
        [*pip, "wheel", str(src), "--no-deps", "--no-build-isolation", "--no-index", "-w", str(tmp_path / "wheel")],
        check=True,
        cwd=tmp_path,
        timeout=300,
    )
    site = tmp_path / "site"
    (wheel,) = (tmp_path / "wheel").glob("capo_verl-*.whl")
    subprocess.run(
        [*pip, "install", "--no-deps", "--no-index", "--target", str(site), str(wheel)], check=True, timeout=300
    )
    assert not (site / "capo_verl" / "compare" / "configs").is_symlink()

    code = (
        "import capo_verl.compare.config as c; d = c.find_config_dir(c.DEFAULT_CONFIG); "
        "cfg = c.checked_config('grpo', c.DEFAULT_CONFIG, d, ['++algorithm.adv_estimator=grpo']); "
        "print(c.__file__); print(d); print(cfg.trainer.device, cfg.algorithm.adv_estimator)"
    )
    env = dict(os.environ, PYTHONPATH=str(site))
    proc = subprocess.run(
        [sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=CHECK_TIMEOUT_S
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    module, folder, composed = proc.stdout.strip().splitlines()[-3:]
    assert Path(module).is_relative_to(site) and Path(folder) == (site / "capo_verl" / "compare" / "configs")
    assert composed == "cpu grpo"  # cpu_base.yaml and verl's ppo_trainer (hydra searchpath) were found too


def test_a_training_seed_sets_the_data_order_and_the_rollout_seeds_of_every_method(tmp_path):
    """Seed k of --seeds: every method's composed config has data.seed = k and actor_rollout_ref.rollout.seed = k
    (paired across methods), and nothing else differs from the seedless plan."""
    from capo_verl.compare.cli import seed_overrides, seed_plan
    from capo_verl.compare.outdir import differences

    args = build_parser().parse_args(base_args(tmp_path, tmp_path / "cmp", "--seeds", "3,5"))
    assert args.seeds == [3, 5]
    plain = make_plan(args)
    for k in args.seeds:
        plan = make_plan(args, seed_overrides(k))
        # what main() uses instead of composing every method's config again per seed: the same plan
        assert seed_plan(plain, args, k) == plan
        for method, settings in plan.method_settings.items():
            composed = settings["composed"]
            assert composed["data"]["seed"] == k and composed["actor_rollout_ref"]["rollout"]["seed"] == k
            other = plain.method_settings[method]["composed"]
            changed = {path for path, _, _ in differences(other, composed)}
            assert changed == {"data.seed", "actor_rollout_ref.rollout.seed"}, changed


def _hf_checkpoint(run: Path, step: int) -> Path:
    hf = run / "ckpt" / f"global_step_{step}" / "actor" / "huggingface"
    hf.mkdir(parents=True)
    (hf / "model.safetensors").write_bytes(b"w")
    return hf


def test_held_out_generations_are_made_once_from_the_final_weights_and_then_need_no_checkpoint(tmp_path):
    from capo_verl.compare import generate_heldout, running

    run = tmp_path / "capo"
    _hf_checkpoint(run, 15)
    final = _hf_checkpoint(run, 30)
    (run / "done.json").write_text("{}")
    calls = []
    with mock.patch.object(running.subprocess, "run", lambda cmd, **kw: calls.append(cmd)):
        target = generate_heldout(run, tmp_path / "test.parquet", k=8, max_new_tokens=48, dtype="float32")
        assert target == run / "eval_generations.jsonl" and len(calls) == 1
        cmd = calls[0]
        assert cmd[cmd.index("--model") + 1] == str(final) and cmd[cmd.index("-k") + 1] == "8"
        assert cmd[cmd.index("--dtype") + 1] == "float32" and cmd[cmd.index("--out") + 1] == str(target)
        assert json.loads((run / "eval_done").read_text())["k"] == 8
        shutil.rmtree(run / "ckpt")  # copied elsewhere without its checkpoints: nothing to make again
        assert generate_heldout(run, tmp_path / "test.parquet", k=8, max_new_tokens=48) == target
        assert len(calls) == 1
        (run / "eval_done").unlink()
        with pytest.raises(FileNotFoundError, match=r"\(eval_done\).*\bdelete the folder\b"):
            generate_heldout(run, tmp_path / "test.parquet", k=8, max_new_tokens=48)


def test_each_method_is_scored_and_evaluated_before_the_next_one_trains(tmp_path):
    """What needs a run's checkpoints (teacher-forced scores, held-out generations) is made right after the run, so
    that a stopped comparison never leaves a finished run that needs its checkpoints later."""
    out = tmp_path / "cmp"
    events = []

    def fake_run_method(method, folder, *args, **kwargs):
        events.append(("train", folder.name, method))
        (folder / method).mkdir(parents=True, exist_ok=True)
        return folder / method

    def record(name):
        return lambda run_dir, *args, **kwargs: events.append((name, run_dir.parent.name, run_dir.name))

    def fake_evaluate(folder, methods, *args, **kwargs):
        events.append(("evaluate", folder.name, tuple(methods)))
        return folder / "eval_report"

    args = [a for a in base_args(tmp_path, out, "--seeds", "0,1", "--teacher-forced", "2") if a != "--no-eval"]
    composed = []
    checked_config = cli.checked_config

    def counted_checked_config(label, *a, **kw):
        composed.append(label)
        return checked_config(label, *a, **kw)

    with (
        mock.patch.object(cli, "checked_config", counted_checked_config),
        mock.patch.object(cli, "run_method", fake_run_method),
        mock.patch.object(cli.teacher_forced, "make_pool", lambda out, *a, **kw: out / "teacher_forced"),
        mock.patch.object(cli.teacher_forced, "score_run", record("score")),
        mock.patch.object(
            cli,
            "generate_heldout",
            lambda run, *a, **kw: events.append(("heldout", run.parent.name, run.name, kw["seed"])),
        ),
        mock.patch.object(cli, "evaluate", fake_evaluate),
        mock.patch.object(cli, "write_report", lambda *a, **kw: None),
        mock.patch.object(cli, "write_seeds_summary", lambda out, *a, **kw: (out / "seeds_summary.md").write_text("")),
        contextlib.redirect_stdout(io.StringIO()),
    ):
        assert cli.main(args) == 0
    expected = []
    for k in ("seed0", "seed1"):
        for m in ("grpo", "capo"):
            expected += [("train", k, m), ("score", k, m), ("heldout", k, m, int(k[-1]))]  # seeded by the seed
        expected.append(("evaluate", k, ("grpo", "capo")))
    assert events == expected
    # each config composed and checked once, whatever the number of seeds
    assert composed == ["the shared config", "method grpo", "method capo"]


def test_a_finished_method_without_checkpoints_needs_what_they_would_make(tmp_path):
    """A finished method copied without ``ckpt/`` goes on only if it holds the teacher-forced scores and held-out
    generations this run makes from checkpoints; otherwise compare stops before anything is written or trained."""
    out = tmp_path / "cmp"
    args = base_args(tmp_path, out, "--teacher-forced", "2")
    finished_runs(tmp_path, out, args)
    before = snapshot(out)
    message = refusal(run_cli(*args, cwd=tmp_path))
    assert message.startswith("grpo: ") and "(ckpt/)" in message and "teacher-forced" in message, message
    assert f"delete {out / 'grpo'} " in message  # the way out
    for method in ("grpo", "capo"):
        (out / method / "teacher_forced").mkdir()
        (out / method / "teacher_forced" / "scored.json").write_text('{"steps": [3]}')
    evaluated = [a for a in args if a != "--no-eval"]
    message = refusal(run_cli(*evaluated, cwd=tmp_path))
    assert "without its held-out generations (eval_done)" in message and "teacher-forced" not in message
    files = {k: v for k, v in snapshot(out).items() if v[0] is not None and "teacher_forced" not in k}
    assert files == {k: v for k, v in before.items() if v[0] is not None}  # nothing written


def test_prepare_only_writes_the_data_and_the_pool_and_trains_nothing(tmp_path):
    """``--prepare-only``: the data and the teacher-forced pool every unit of a study shares, made once; no method
    trains, and a second call with the same settings is accepted (the folder is compare's)."""
    out = tmp_path / "cmp"
    pools = []

    def fake_pool(folder, val_data, *args, **kwargs):
        pools.append((folder, val_data.name, kwargs["k"]))
        return folder / "teacher_forced"

    args = base_args(tmp_path, out, "--seeds", "3", "--teacher-forced", "2", "--val-questions", "all", "--prepare-only")
    with mock.patch.object(cli.teacher_forced, "make_pool", fake_pool):
        for _ in range(2):
            proc = run_cli(*args, cwd=tmp_path)
            assert proc.returncode == 0, proc.stderr[-3000:]
    assert pools == [(out, "gsm8k_calc_val.parquet", 2)] * 2
    assert "nothing trained" in proc.stdout and not (out / "seed3" / "grpo").exists()
    import pandas as pd

    val = pd.read_parquet(tmp_path / "data" / "gsm8k_calc_val.parquet")
    held_out = pd.read_parquet(tmp_path / "data" / "gsm8k_calc_test.parquet")
    train = pd.read_parquet(tmp_path / "data" / "gsm8k_calc_train.parquet")
    assert (len(val), len(held_out), len(train)) == (580, 64, 1024)
    questions = {frame: {p[0]["content"] for p in df.prompt} for frame, df in (("val", val), ("test", held_out))}
    assert not questions["val"] & questions["test"]
    expressions = {e["problem"] for e in train.extra_info}
    assert not {e["problem"] for e in val.extra_info} & expressions  # no validation calculation was trained on


def test_share_step0_validates_the_base_model_once_per_seed_and_every_method_takes_that_pass(tmp_path):
    """``--share-step0``: per seed, first the step-0 pass in ``seed<k>/step0`` (the first method's config with
    ``trainer.val_only=true``, recorded as such, without the teacher-forced pool it does not score); then every
    method trains with ``trainer.val_before_train=false`` last (so no shared override undoes it) and holds that pass,
    marked. ``--step0-only`` stops after the passes; a second call takes them as they are."""
    from capo_verl.compare.running import SHARED_STEP0, STEP0_OVERRIDES

    out = tmp_path / "cmp"
    calls = []

    def fake_run_method(method, folder, config, config_dir, overrides, *, settings, name=None):
        calls.append((folder.name, name or method, method, list(overrides), settings))
        run = folder / (name or method)
        if (run / "done.json").exists():
            return run
        (run / "val_generations").mkdir(parents=True, exist_ok=True)
        (run / ".capo-verl-run.json").write_text(json.dumps({"method": method, "settings": settings}))
        if name == "step0":
            dump = '{"input": "q", "output": "1", "lpm": -1.0, "acc": 1}\n'
            (run / "val_generations" / "0.jsonl").write_text(dump)
        (run / "done.json").write_text(json.dumps({"settings": settings}))
        return run

    args = base_args(tmp_path, out, "--seeds", "0,1", "--share-step0", "--teacher-forced", "2")
    patches = (
        mock.patch.object(cli, "run_method", fake_run_method),
        mock.patch.object(cli.teacher_forced, "make_pool", lambda folder, *a, **kw: folder / "teacher_forced"),
        mock.patch.object(cli.teacher_forced, "score_run", lambda *a, **kw: None),
        mock.patch.object(cli, "write_report", lambda *a, **kw: None),
        mock.patch.object(cli, "write_seeds_summary", lambda out, *a, **kw: (out / "seeds_summary.md").write_text("")),
    )
    with contextlib.ExitStack() as stack:
        for patch in patches:
            stack.enter_context(patch)
        stack.enter_context(contextlib.redirect_stdout(io.StringIO()))
        assert cli.main([*args, "--step0-only"]) == 0
        assert [c[:3] for c in calls] == [("seed0", "step0", "grpo"), ("seed1", "step0", "grpo")]
        assert not (out / "seed0" / "grpo").exists()
        calls.clear()
        assert cli.main(args) == 0
    runs = (("step0", "grpo"), ("grpo", "grpo"), ("capo", "capo"))
    assert [c[:3] for c in calls] == [(k, run, m) for k in ("seed0", "seed1") for run, m in runs]
    by_run = {(c[0], c[1]): c for c in calls}
    step0 = by_run["seed0", "step0"]
    assert step0[3][-2:] == list(STEP0_OVERRIDES)
    assert step0[4]["step0"] is True and "teacher_forced" not in step0[4]
    assert step0[4]["method_overrides"][-2:] == list(STEP0_OVERRIDES)
    assert step0[4]["composed"]["trainer"]["val_only"] is True
    assert step0[4]["composed"]["data"]["seed"] == 0 and by_run["seed1", "step0"][4]["composed"]["data"]["seed"] == 1
    for k in ("seed0", "seed1"):
        for m in ("grpo", "capo"):
            _, _, _, overrides, settings = by_run[k, m]
            assert overrides[-1] == "++trainer.val_before_train=false"
            assert settings["method_overrides"][-1] == "++trainer.val_before_train=false"
            assert settings["teacher_forced"] == 2
            dumps = out / k / m / "val_generations"
            assert (dumps / "0.jsonl").read_bytes() == (out / k / "step0" / "val_generations" / "0.jsonl").read_bytes()
            assert json.loads((dumps / SHARED_STEP0).read_text())["from"] == "step0/val_generations/0.jsonl"
