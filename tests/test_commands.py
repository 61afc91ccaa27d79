"""Every ``capo-verl`` command is written one way (capo_verl/commands.py): a mistake is one line
``capo-verl <command>: error: ...`` and exit status 2, a failed run one line and status 1, never a traceback; a shared
option has one default everywhere or says why not; outputs are checked before the work, and nothing is left behind.

The mistakes go through each command's ``main`` in this process (what the console script runs); one per command also
as a subprocess, as a user meets it. None of them loads a model.
"""

from __future__ import annotations

import argparse
import json
import subprocess

import pytest

from capo_verl import cli, commands, data, demo, mask_thresholds
from capo_verl.cpu import models
from capo_verl.evaluation import cli as eval_cli
from capo_verl.evaluation import teacher_forced_cli


def one_error(capsys, prog: str, kind: str = "error") -> str:
    """The message of the single stderr line ``<prog>: <kind>: ...``; nothing else on stderr but log lines."""
    err = capsys.readouterr().err
    assert "Traceback" not in err, err
    lines = [line for line in err.splitlines() if not line.startswith(("INFO ", "WARNING ", "[mask-thresholds] "))]
    assert len(lines) == 1 and lines[0].startswith(f"{prog}: {kind}: "), err
    return lines[0].removeprefix(f"{prog}: {kind}: ")


def names(message: str, *parts: str) -> bool:
    """Whether ``message`` names each of ``parts`` (an option, a value, a file, a fix): what a refusal test asserts,
    leaving the sentence around them free to change."""
    return all(part in message for part in parts)


# ------------------------------------------------------------------------------------------------------- the helper


def test_the_helper_maps_what_a_run_raises_to_one_line_and_a_status(capsys):
    parser = commands.parser("toy", "a toy command")
    parser.add_argument("--n", type=commands.positive_int, default=1)

    def raising(exc):
        def run(args):
            raise exc

        return run

    assert commands.main(parser, lambda args: None, []) == 0
    assert commands.main(parser, lambda args: 3, []) == 3
    cases = [
        (commands.UsageError("bad\n  value"), 2, "error", "bad value"),
        (ValueError("a library's refusal"), 2, "error", "a library's refusal"),
        (FileNotFoundError(2, "No such file or directory", "/x/y"), 2, "error", "/x/y: No such file or directory"),
        (ImportError("no vllm"), 2, "error", "no vllm"),
        (commands.RunFailed("the child failed"), 1, "failed", "the child failed"),
        (subprocess.CalledProcessError(3, ["a", "b c"]), 1, "failed", "`a 'b c'` exited with status 3"),
        (PermissionError(13, "Permission denied", "/out/f"), 1, "failed", "/out/f: Permission denied"),
    ]
    for exc, status, kind, message in cases:
        assert commands.main(parser, raising(exc), []) == status
        assert one_error(capsys, "capo-verl toy", kind) == message
    assert commands.main(parser, raising(KeyboardInterrupt()), []) == commands.INTERRUPTED
    assert capsys.readouterr().err == "capo-verl toy: stopped\n"
    with pytest.raises(ZeroDivisionError):  # a bug keeps its traceback
        commands.main(parser, raising(ZeroDivisionError()), [])
    assert commands.main(parser, lambda args: 0, ["--n", "0"]) == 2
    assert names(one_error(capsys, "capo-verl toy"), "--n", ">= 1", "0")
    assert commands.main(parser, lambda args: 0, ["extra"]) == 2
    assert names(one_error(capsys, "capo-verl toy"), "extra")
    assert commands.main(parser, lambda args: 1, ["--help"]) == 0
    assert "a toy command" in capsys.readouterr().out


def test_a_shared_option_with_another_default_must_say_why():
    p = argparse.ArgumentParser()
    with pytest.raises(TypeError, match=r"--dtype.*'float32'.*'auto'"):
        commands.add_option(p, "--dtype", default="float32")
    action = commands.add_option(p, "--dtype", default="float32", why="a reason")
    assert action.default == "float32" and action.help.endswith("(default float32: a reason)")
    assert "(default auto" not in action.help


def test_outputs_are_checked_without_leaving_anything_behind(tmp_path):
    deep = tmp_path / "a" / "b" / "c"
    assert commands.check_out_dir(deep) == deep and not (tmp_path / "a").exists()
    assert commands.check_out_file(deep / "x.json", suffix=".json") == deep / "x.json"
    assert not (tmp_path / "a").exists() and list(tmp_path.iterdir()) == []
    (tmp_path / "f").write_text("mine")
    with pytest.raises(commands.UsageError, match=r"--out .*/f\b.*file"):
        commands.check_out_dir(tmp_path / "f")
    with pytest.raises(commands.UsageError, match=r"--out .*/f/x\b.*/f\b.*file"):
        commands.check_out_dir(tmp_path / "f" / "x")
    with pytest.raises(commands.UsageError, match=r"--out .*/f/x\.json\b.*/f\b.*file"):
        commands.check_out_file(tmp_path / "f" / "x.json")
    with pytest.raises(commands.UsageError, match=r"--out .*/f\b.*exists.*--overwrite"):
        commands.check_out_file(tmp_path / "f", overwrite=False)
    with pytest.raises(commands.UsageError, match=r"--out .*/y\.txt\b.*\.json"):
        commands.check_out_file(tmp_path / "y.txt", suffix=".json")
    with pytest.raises(commands.UsageError, match=r"--cache-dir /proc/capo_x\b"):
        commands.check_out_dir("/proc/capo_x", "--cache-dir")
    assert (tmp_path / "f").read_text() == "mine" and sorted(p.name for p in tmp_path.iterdir()) == ["f"]


def _parsers() -> dict[str, argparse.ArgumentParser]:
    parsers = {
        "prepare-data": data.build_parser(),
        "mask-thresholds": mask_thresholds.build_parser(),
        "smollm2": models.build_parser(),
        "demo": demo.build_parser(),
        "eval teacher-forced": teacher_forced_cli.build_parser(),
    }
    [sub] = [a for a in eval_cli.build_parser()._actions if isinstance(a, argparse._SubParsersAction)]
    parsers.update({f"eval {name}": p for name, p in sub.choices.items()})
    return parsers


def test_every_shared_option_has_the_shared_default_or_says_why():
    seen = set()
    for command, parser in _parsers().items():
        for action in parser._actions:
            names = [n for n in action.option_strings if n in commands.SHARED_OPTIONS]
            if not names:
                continue
            shared = commands.SHARED_OPTIONS[names[0]]
            seen.add(names[0])
            if action.default != shared.default:
                assert f"(default {action.default}: " in action.help, (command, names[0], action.help)
    assert seen == set(commands.SHARED_OPTIONS)  # every shared option is used by some command


# ------------------------------------------------------------------------------ each command: one line, status 2


def test_capo_verl_names_an_unknown_command(capsys):
    assert cli.main(["nosuch"]) == 2
    assert names(one_error(capsys, "capo-verl"), "'nosuch'", *cli.COMMANDS, "capo-verl --help")


def test_capo_verl_help_lists_every_command_with_a_space_before_its_help(capsys):
    assert cli.main(["--help"]) == 0
    text = capsys.readouterr().out
    for name in cli.COMMANDS:
        [line] = [line for line in text.splitlines() if line.startswith(f"  {name} ")]
        assert line.split(maxsplit=1)[0] == name
    assert "teacher-forced" in text


@pytest.mark.parametrize("tau", ["-1", "0", "inf", "nan", "1e-45", "x"])
def test_demo_refuses_a_tau_capo_cannot_use(tau, capsys):
    assert demo.main(["--tau", tau]) == 2
    assert names(one_error(capsys, "capo-verl demo"), "--tau", repr(tau), "> 0")


def test_prepare_data_refusals_write_nothing(tmp_path, capsys):
    afile = tmp_path / "afile"
    afile.write_text("mine")
    cases = [
        (
            ["--out-dir", str(afile), "--no-train", "--benchmarks", "aime24"],
            ["--out-dir", str(afile), "file"],
        ),
        (
            ["--out-dir", str(tmp_path / "o"), "--no-train", "--no-benchmarks"],
            ["--no-train", "--no-benchmarks", "--benchmarks"],
        ),
        (["--out-dir", str(tmp_path / "o"), "--train-size", "0"], ["--train-size", ">= 1", "0"]),
        (["--out-dir", str(tmp_path / "o"), "--val-size", "-3"], ["--val-size", ">= 1", "-3"]),
        (["--out-dir", str(tmp_path / "o"), "--no-train", "--benchmarks", "nope"], ["benchmark", "'nope'"]),
    ]
    for argv, parts in cases:
        assert data.main(argv) == 2
        assert names(one_error(capsys, "capo-verl prepare-data"), *parts), (argv, parts)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["afile"] and afile.read_text() == "mine"


def test_smollm2_refuses_a_cache_folder_it_cannot_write_before_converting(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(models, "gguf_path", lambda: tmp_path / "source.gguf")  # the package is not what is tested
    monkeypatch.setattr(models, "smollm2_checkpoint", lambda *a, **k: pytest.fail("converted before the check"))
    assert models.main(["--cache-dir", "/proc/capo_x"]) == 2
    assert names(one_error(capsys, "capo-verl smollm2"), "--cache-dir /proc/capo_x")
    (tmp_path / "afile").write_text("")
    assert models.main(["--cache-dir", str(tmp_path / "afile" / "c")]) == 2
    assert names(one_error(capsys, "capo-verl smollm2"), "--cache-dir", str(tmp_path / "afile"), "file")
    assert models.main(["--no-such-option"]) == 2
    assert names(one_error(capsys, "capo-verl smollm2"), "--no-such-option")


@pytest.fixture
def prompts(tmp_path):
    """A verl parquet of two prompts."""
    import pandas as pd

    rows = [
        {
            "data_source": "toy",
            "prompt": [{"role": "user", "content": f"{i}+1?"}],
            "reward_model": {"ground_truth": "2"},
        }
        for i in range(2)
    ]
    path = tmp_path / "train.parquet"
    pd.DataFrame(rows).to_parquet(path)
    return path


def test_mask_thresholds_refuses_a_missing_model_and_leaves_no_prompts_file(tmp_path, prompts, capsys):
    out = tmp_path / "mt" / "out.json"
    argv = ["--model", str(tmp_path / "no_model"), "--data", str(prompts), "--out", str(out)]
    assert mask_thresholds.main(argv) == 2
    assert names(one_error(capsys, "capo-verl mask-thresholds"), str(tmp_path / "no_model"))
    assert not (tmp_path / "mt").exists()


@pytest.mark.parametrize(
    "extra, parts",
    [
        (["--temperature", "-1"], ["--temperature", "> 0", "-1"]),
        (["-k", "0"], ["-k", ">= 1", "0"]),
        (["--out", "x.txt"], ["--out x.txt", ".json"]),
    ],
)
def test_mask_thresholds_option_errors(extra, parts, tmp_path, prompts, capsys):
    argv = ["--model", "smollm2", "--data", str(prompts), "--out", str(tmp_path / "o.json"), *extra]
    assert mask_thresholds.main(argv) == 2
    assert names(one_error(capsys, "capo-verl mask-thresholds"), *parts)


def test_mask_thresholds_refuses_an_unwritable_out_before_scoring_the_pool(tmp_path, prompts, capsys, monkeypatch):
    from capo_verl.evaluation import teacher_forced

    monkeypatch.setattr(teacher_forced, "score_pool", lambda *a, **k: pytest.fail("scored before the check"))
    (tmp_path / "afile").write_text("")
    out = tmp_path / "afile" / "o.json"
    argv = ["--model", "smollm2", "--data", str(prompts), "--pool", str(tmp_path / "p.jsonl"), "--out", str(out)]
    assert mask_thresholds.main(argv) == 2
    assert names(one_error(capsys, "capo-verl mask-thresholds"), f"--out {out}", f"{out.parent} is a file")


def test_mask_thresholds_a_failed_generation_is_one_line_exit_1_and_leaves_no_prompts(
    tmp_path, prompts, capsys, monkeypatch
):
    monkeypatch.setattr(subprocess, "run", lambda *a, **k: subprocess.CompletedProcess(a, 1))
    out = tmp_path / "out.json"
    argv = ["--model", "no-owner/no-model", "--data", str(prompts), "-n", "2", "--out", str(out)]
    assert mask_thresholds.main(argv) == 1
    message = one_error(capsys, "capo-verl mask-thresholds", "failed")
    assert names(message, "capo-verl eval generate --model no-owner/no-model")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["train.parquet"]


def test_eval_generate_refuses_a_user_file_before_vllm_loads(tmp_path, capsys, monkeypatch):
    from capo_verl.evaluation import vllm_backend

    monkeypatch.setattr(vllm_backend, "vllm_device", lambda *a: pytest.fail("vLLM looked up before the check"))
    mine = tmp_path / "notes.jsonl"
    mine.write_text("my notes\n")
    argv = ["generate", "--model", "smollm2", "--benchmarks", "gsm8k", "--out", str(mine)]
    assert eval_cli.main(argv) == 2
    assert names(one_error(capsys, "capo-verl eval generate"), str(mine), "notes.jsonl.meta.json", "--overwrite")
    assert mine.read_text() == "my notes\n"
    assert eval_cli.main([*argv[:-1], str(tmp_path / "notes.jsonl" / "g.jsonl")]) == 2
    assert names(one_error(capsys, "capo-verl eval generate"), f"{mine} is a file")
    assert eval_cli.main(["generate", "--model", "smollm2", "--out", "g.jsonl", "--temperature", "0"]) == 2
    assert names(one_error(capsys, "capo-verl eval generate"), "--temperature", "> 0", "0")


GENERATION = {
    "data_source": "toy",
    "question_id": 0,
    "sample_index": 0,
    "response": "2",
    "answer": "2",
    "correct": True,
    "lpm": -0.5,
    "num_tokens": 1,
}


def test_eval_score_writes_only_into_a_folder_it_made(tmp_path, capsys):
    from capo_verl.evaluation.score import MARKER

    gen = tmp_path / "g.jsonl"
    gen.write_text("".join(json.dumps({**GENERATION, "sample_index": j, "correct": j == 0}) + "\n" for j in range(2)))
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "report.md").write_text("my report")
    assert eval_cli.main(["score", str(gen), "--out", str(mine), "--no-plots"]) == 2
    assert names(one_error(capsys, "capo-verl eval score"), f"--out {mine}", MARKER, "--overwrite")
    assert sorted(p.name for p in mine.iterdir()) == ["report.md"] and (mine / "report.md").read_text() == "my report"
    made = tmp_path / "made"
    for _ in range(2):  # a folder it made: written again
        assert eval_cli.main(["score", str(gen), "--out", str(made), "--no-plots"]) == 0
    assert (made / MARKER).is_file() and (made / "metrics.json").is_file()
    assert eval_cli.main(["score", str(gen), "--out", str(mine), "--no-plots", "--overwrite"]) == 0
    assert (mine / "report.md").read_text() != "my report"
    legacy = tmp_path / "legacy"  # made by eval score before the marker: its metrics.json tells
    legacy.mkdir()
    (legacy / "metrics.json").write_text((made / "metrics.json").read_text())
    assert eval_cli.main(["score", str(gen), "--out", str(legacy), "--no-plots"]) == 0


def test_eval_teacher_forced_checks_its_out_and_device_before_anything(tmp_path, capsys):
    (tmp_path / "afile").write_text("")
    pool = tmp_path / "pool.jsonl"
    pool.write_text(json.dumps({**GENERATION}) + "\n")
    base = ["teacher-forced", "--pool", str(pool), "--model", "smollm2"]
    out = tmp_path / "afile" / "tf.json"
    assert eval_cli.main([*base, "--out", str(out)]) == 2
    assert names(one_error(capsys, "capo-verl eval teacher-forced"), f"--out {out}", f"{out.parent} is a file")
    new = tmp_path / "new" / "tf.json"
    assert eval_cli.main([*base, "--out", str(new), "--device", "tpu"]) == 2
    assert names(one_error(capsys, "capo-verl eval teacher-forced"), "'tpu'", "cpu", "cuda")
    assert not (tmp_path / "new").exists()
    assert eval_cli.main([*base, "--out", str(new), "--batch-size", "0"]) == 2
    assert names(one_error(capsys, "capo-verl eval teacher-forced"), "--batch-size", ">= 1", "0")
    assert eval_cli.main(["teacher-forced"]) == 2
    assert names(one_error(capsys, "capo-verl eval teacher-forced"), "--pool")
    assert eval_cli.main([]) == 2
    assert names(one_error(capsys, "capo-verl eval"), "generate", "score", "teacher-forced")


@pytest.mark.parametrize(
    "argv, prog, parts",
    [
        (["nosuch"], "capo-verl", ["'nosuch'"]),
        (["prepare-data", "--train-size", "0"], "capo-verl prepare-data", ["--train-size", "0"]),
        (["demo", "--tau", "nan"], "capo-verl demo", ["--tau", "'nan'"]),
        (["mask-thresholds", "--model", "m"], "capo-verl mask-thresholds", ["--data"]),
        (["smollm2", "--bogus"], "capo-verl smollm2", ["--bogus"]),
        (["eval", "score", "--out"], "capo-verl eval score", ["--out"]),
        (["eval", "teacher-forced", "--pool"], "capo-verl eval teacher-forced", ["--pool"]),
    ],
)
def test_as_a_user_runs_it(argv, prog, parts, run_capo_verl, refusal):
    assert names(refusal(run_capo_verl(*argv), prog), *parts)


def test_eval_generate_refuses_a_file_of_other_settings_before_vllm_loads(tmp_path, capsys, monkeypatch):
    from capo_verl.evaluation import vllm_backend

    monkeypatch.setattr(vllm_backend, "vllm_device", lambda *a: pytest.fail("vLLM looked up before the check"))
    out = tmp_path / "g.jsonl"
    out.write_text(json.dumps(GENERATION) + "\n")
    settings = {"model": "smollm2", "backend": "vllm", "dtype": "bfloat16", "k": 2, "temperature": 1.0}
    settings.update(top_p=1.0, max_new_tokens=3046, seed=0)
    (tmp_path / "g.jsonl.meta.json").write_text(json.dumps(settings))
    assert eval_cli.main(["generate", "--model", "smollm2", "--benchmarks", "gsm8k", "-k", "3", "--out", str(out)]) == 2
    assert names(one_error(capsys, "capo-verl eval generate"), str(out), "k", "2", "3", "--overwrite")
