"""Every command that writes, run the way that lost data before (issue 65, section 1): an output that is one of its
inputs is refused, ``--overwrite`` or not, and a run that fails at its start, or part way, leaves every existing file
byte-identical and nothing new beside it. The commands run in this process (what the console script runs); none loads
a model: where a run must get past its checks, the model's work is replaced by a stand-in."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from capo_verl import data, mask_thresholds
from capo_verl.compare import cli as compare_cli
from capo_verl.evaluation import cli as eval_cli
from capo_verl.evaluation import teacher_forced_cli
from capo_verl.stored import stored

REPO = Path(__file__).resolve().parents[1]
COMMITTED_COMPARE = REPO / "benchmarks" / "results" / "compare_cpu"


def tree(folder: Path) -> dict[str, bytes]:
    """``{relative path: bytes}`` of every file under ``folder``, hidden ones included (symlinks as their target)."""
    out = {}
    for path in sorted(folder.rglob("*")):
        if path.is_symlink():
            out[str(path.relative_to(folder))] = f"-> {os.readlink(path)}".encode()
        elif path.is_file():
            out[str(path.relative_to(folder))] = path.read_bytes()
    return out


def refused(capsys, prog: str) -> str:
    """The one error line of a refusal (exit status checked by the caller), without traceback."""
    err = capsys.readouterr().err
    assert "Traceback" not in err, err
    lines = [line for line in err.splitlines() if line.startswith(f"{prog}: ")]
    assert len(lines) == 1, err
    return lines[0]


LINE = {"data_source": "toy", "response": "2", "answer": "2", "num_tokens": 1, "ground_truth": "2"}


def generations(path: Path, n: int = 3, k: int = 2) -> Path:
    path.write_text(
        "".join(
            json.dumps({**LINE, "question_id": q, "sample_index": j, "correct": j == 0, "lpm": -0.5 - j}) + "\n"
            for q in range(n)
            for j in range(k)
        )
    )
    return path


def verl_rows(path: Path, n: int = 2) -> Path:
    rows = [
        {
            "data_source": "toy",
            "prompt": [{"role": "user", "content": f"{i}+1?"}],
            "reward_model": {"ground_truth": str(i + 1)},
            "extra_info": {"index": i},
        }
        for i in range(n)
    ]
    if path.suffix == ".parquet":
        pd.DataFrame(rows).to_parquet(path)
    else:
        path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


# ------------------------------------------------------------------------------------------------ eval generate


def test_eval_generate_refuses_to_write_over_its_problems_file_even_with_overwrite(tmp_path, capsys, monkeypatch):
    from capo_verl.evaluation import vllm_backend

    monkeypatch.setattr(vllm_backend, "vllm_device", lambda *a: pytest.fail("vLLM looked up before the check"))
    problems = verl_rows(tmp_path / "X.jsonl")
    before = tree(tmp_path)
    (tmp_path / "link.jsonl").symlink_to(problems)
    for out in (problems, tmp_path / "sub" / ".." / "X.jsonl", tmp_path / "link.jsonl"):
        argv = ["generate", "--model", "smollm2", "--data", str(problems), "--out", str(out), "--overwrite"]
        assert eval_cli.main(argv) == 2
        assert "is the input --data" in refused(capsys, "capo-verl eval generate")
    (tmp_path / "link.jsonl").unlink()
    assert tree(tmp_path) == before


def test_eval_generate_refuses_to_write_over_a_benchmark_file_it_reads_even_with_overwrite(capsys, monkeypatch):
    from capo_verl.evaluation import vllm_backend

    monkeypatch.setattr(vllm_backend, "vllm_device", lambda *a: pytest.fail("vLLM looked up before the check"))
    shipped = data.SHIPPED_BENCHMARKS_DIR / data.BENCHMARKS["gsm8k"].file
    before = shipped.read_bytes()
    for names, overwrite in ((["gsm8k"], ["--overwrite"]), (["aime24", "gsm8k"], []), (["paper", "gsm8k"], [])):
        argv = ["generate", "--model", "smollm2", "--device", "cuda", "-k", "2", "--benchmarks", *names]
        assert eval_cli.main([*argv, "--out", str(shipped), *overwrite]) == 2
        line = refused(capsys, "capo-verl eval generate")
        assert "--benchmarks" in line and str(shipped) in line, line
    assert shipped.read_bytes() == before


def test_eval_generate_that_fails_at_its_start_leaves_its_output_as_it_was(tmp_path, capsys, monkeypatch):
    from capo_verl.evaluation import vllm_backend

    problems = verl_rows(tmp_path / "problems.jsonl")
    out = generations(tmp_path / "g.jsonl")
    (tmp_path / "g.jsonl.meta.json").write_text(json.dumps({"model": "smollm2", "k": 2}))
    before = tree(tmp_path)
    for bad in (["--model", str(tmp_path / "no_model")], ["--model", "smollm2", "--dtype", "float33"]):
        assert eval_cli.main(["generate", *bad, "--data", str(problems), "--out", str(out), "--overwrite"]) == 2
        refused(capsys, "capo-verl eval generate")
        assert tree(tmp_path) == before
    # past every check, the engine fails to load: --overwrite has not yet removed the old file
    monkeypatch.setattr(vllm_backend, "vllm_device", lambda *a: "cpu")

    def no_engine(*args, **kwargs):
        raise OSError("no weights in the checkpoint")

    monkeypatch.setattr(vllm_backend, "VLLMBackend", no_engine)
    argv = ["generate", "--model", "smollm2", "--data", str(problems), "--out", str(out), "--overwrite", "-k", "2"]
    assert eval_cli.main(argv) == 2
    assert "cannot load --model" in refused(capsys, "capo-verl eval generate")
    assert tree(tmp_path) == before


# ------------------------------------------------------------------------------------------------ eval score


def test_eval_score_refuses_a_report_folder_that_owns_a_generation_file(tmp_path, capsys):
    report = tmp_path / "report"
    report.mkdir()
    gen = generations(report / "metrics.json")  # a generation file at a name the report writes
    before = tree(tmp_path)
    for out in (report, tmp_path / "alias"):
        if out.name == "alias":
            out.symlink_to(report)
            before = tree(tmp_path)
        assert eval_cli.main(["score", str(gen), "--out", str(out), "--overwrite", "--no-plots"]) == 2
        assert "is the input --generations" in refused(capsys, "capo-verl eval score")
        assert tree(tmp_path) == before


@pytest.mark.parametrize("where", ["lock", "staging", "old", "journal"])
def test_eval_score_refuses_an_input_at_a_path_its_output_machinery_writes(tmp_path, capsys, where):
    """C1-06, C1-07: a generation file at the name of --out's lock file, or inside its staging folder, was truncated
    or removed by the run; now it is refused before anything is written."""
    from capo_verl import outputs

    w = tmp_path / "w"
    w.mkdir()
    out = w / "rep"
    spot = {
        "lock": outputs.lock_path(out),
        "staging": outputs.staging_path(out) / "gen.jsonl",
        "old": outputs.old_path(out) / "gen.jsonl",
        "journal": outputs.journal_path(out),
    }[where]
    spot.parent.mkdir(exist_ok=True)
    gen = generations(spot)
    before = tree(tmp_path)
    assert eval_cli.main(["score", "--no-plots", str(gen), "--out", str(out)]) == 2
    line = refused(capsys, "capo-verl eval score")
    assert str(gen) in line and f"--out {out}" in line, line
    assert tree(tmp_path) == before and not out.exists()


def test_eval_score_that_fails_leaves_its_old_report_byte_identical(tmp_path, capsys, monkeypatch):
    gen = generations(tmp_path / "g.jsonl")
    out = tmp_path / "report"
    assert eval_cli.main(["score", str(gen), "--out", str(out), "--no-plots"]) == 0
    (out / "notes.md").write_text("the user's notes")
    capsys.readouterr()
    before = tree(tmp_path)
    bad = tmp_path / "bad.jsonl"
    bad.write_text(gen.read_text() + '{"data_source": "toy", "question_id": 9, \n')
    before = tree(tmp_path)
    assert eval_cli.main(["score", str(bad), "--out", str(out), "--no-plots"]) == 2
    assert "bad.jsonl:7: not a JSON line" in refused(capsys, "capo-verl eval score")
    assert tree(tmp_path) == before
    # part way: the report cannot be written after metrics.json was; the old folder is kept whole
    from capo_verl.evaluation import score

    def disk_full(*args, **kwargs):
        raise OSError(28, "No space left on device", str(out / "report.md"))

    monkeypatch.setattr(score, "write_report", disk_full)
    assert eval_cli.main(["score", str(generations(tmp_path / "g2.jsonl", n=4)), "--out", str(out)]) == 2
    refused(capsys, "capo-verl eval score")
    after = tree(tmp_path)
    assert after.pop("g2.jsonl") and after == before


# ------------------------------------------------------------------------------------------------ teacher-forced


def test_eval_teacher_forced_refuses_an_out_that_is_its_pool_or_data(tmp_path, capsys):
    pool = generations(tmp_path / "pool.jsonl")
    rows = verl_rows(tmp_path / "rows.json")
    (tmp_path / "tf.json").symlink_to(pool)
    before = tree(tmp_path)
    for out, what in ((tmp_path / "tf.json", "--pool"), (rows, "--data")):
        argv = ["teacher-forced", "--pool", str(pool), "--data", str(rows), "--model", "smollm2", "--out", str(out)]
        assert eval_cli.main(argv) == 2
        assert f"is the input {what}" in refused(capsys, "capo-verl eval teacher-forced")
        assert tree(tmp_path) == before


def test_eval_teacher_forced_that_fails_part_way_leaves_the_old_scores(tmp_path, capsys, monkeypatch):
    pool = generations(tmp_path / "pool.jsonl")
    rows = verl_rows(tmp_path / "rows.jsonl", n=3)
    (tmp_path / "tf.json").write_text('{"old": true}\n')
    np.save(tmp_path / "tf.0.npy", np.zeros(6))
    before = tree(tmp_path)
    argv = ["teacher-forced", "--pool", str(pool), "--data", str(rows), "--out", str(tmp_path / "tf.json")]
    assert eval_cli.main([*argv, "--model", str(tmp_path / "no_model")]) == 2  # at its start
    refused(capsys, "capo-verl eval teacher-forced")
    assert tree(tmp_path) == before
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "config.json").write_text("{}")
    before = tree(tmp_path)
    scored = []

    def score_pool(path, pool, **kwargs):  # the first model scores, the second fails to load
        scored.append(path)
        if len(scored) == 2:
            raise ValueError(f"cannot load {path}")
        return np.full(len(pool), -0.5)

    monkeypatch.setattr(teacher_forced_cli, "score_pool", score_pool)
    model = str(tmp_path / "m")
    assert eval_cli.main([*argv, "--model", f"a={model}", f"b={model}"]) == 2
    assert "cannot load" in refused(capsys, "capo-verl eval teacher-forced") and len(scored) == 2
    assert tree(tmp_path) == before  # before: the first model's json and npy were already written over the old ones


# ------------------------------------------------------------------------------------------------ mask-thresholds


def test_mask_thresholds_refuses_outputs_that_are_its_inputs(tmp_path, capsys):
    prompts = verl_rows(tmp_path / "T.prompts.parquet")
    pool = generations(tmp_path / "P.jsonl")
    before = tree(tmp_path)
    cases = [
        (["--data", str(prompts), "--out", str(tmp_path / "T.json")], "is the input --data"),  # T.prompts.parquet
        (["--data", str(prompts), "--pool", str(pool), "--out", str(tmp_path / "P.json")], None),  # no overlap
    ]
    for argv, message in cases[:1]:
        assert mask_thresholds.main(["--model", "smollm2", *argv]) == 2
        assert message in refused(capsys, "capo-verl mask-thresholds")
        assert tree(tmp_path) == before
    (tmp_path / "out.json").symlink_to(pool)
    argv = ["--model", "smollm2", "--data", str(prompts), "--pool", str(pool), "--out", str(tmp_path / "out.json")]
    assert mask_thresholds.main(argv) == 2
    assert "is the input --pool" in refused(capsys, "capo-verl mask-thresholds")
    (tmp_path / "out.json").unlink()
    assert tree(tmp_path) == before


def test_mask_thresholds_with_a_bad_dtype_leaves_the_prompts_of_the_last_run(tmp_path, capsys, monkeypatch):
    train = verl_rows(tmp_path / "train.parquet", n=4)
    (tmp_path / "T.json").write_text('{"old": true}\n')
    verl_rows(tmp_path / "T.prompts.parquet", n=1)
    before = tree(tmp_path)
    argv = ["--model", "smollm2", "--data", str(train), "-n", "2", "--out", str(tmp_path / "T.json")]
    monkeypatch.setattr(subprocess, "run", lambda *a, **k: pytest.fail("generation started before every check"))
    assert mask_thresholds.main([*argv, "--dtype", "float33"]) == 2
    assert "--dtype 'float33'" in refused(capsys, "capo-verl mask-thresholds")
    assert tree(tmp_path) == before
    # part way: the pool is drawn (by a stand-in for eval generate), then scoring fails: T.json and the prompts stay
    from capo_verl.evaluation import teacher_forced

    def generate(cmd, **kwargs):
        out = Path(cmd[cmd.index("--out") + 1])
        out.write_text(
            "".join(
                json.dumps({**LINE, "question_id": q, "sample_index": 0, "response": str(q + 1), "correct": True})
                + "\n"
                for q in range(2)
            )
        )
        return subprocess.CompletedProcess(cmd, 0)

    def score_pool(*args, **kwargs):
        raise ValueError("the reference model cannot load")

    monkeypatch.setattr(subprocess, "run", generate)
    monkeypatch.setattr(teacher_forced, "score_pool", score_pool)
    assert mask_thresholds.main(argv) == 2
    assert "cannot load" in refused(capsys, "capo-verl mask-thresholds")
    after = tree(tmp_path)
    assert after.pop("T.pool.jsonl") and after == before  # the drawn pool stays, for the next run to resume


# ------------------------------------------------------------------------------------------------ prepare-data


def test_prepare_data_refuses_an_out_dir_that_is_or_owns_its_input(tmp_path, capsys):
    bench = tmp_path / "bench"
    shutil.copytree(data.SHIPPED_BENCHMARKS_DIR, bench)
    out = tmp_path / "out"
    out.mkdir()
    source = out / "deepscaler_train.parquet"
    shutil.copy(data.RESOURCES / "train" / "deepscaler_sub1209.parquet", source)
    before = tree(tmp_path)
    cases = [
        (["--no-train", "--benchmarks", "gsm8k", "--benchmarks-dir", str(bench), "--out-dir", str(bench)], "--bench"),
        (["--train-source", str(source), "--train-size", "8", "--val-size", "2", "--no-benchmarks"], "--train"),
    ]
    for argv, what in cases:
        if "--out-dir" not in argv:
            argv = [*argv, "--out-dir", str(out)]
        assert data.main(argv) == 2
        assert f"the input {what}" in refused(capsys, "capo-verl prepare-data")
        assert tree(tmp_path) == before


def test_prepare_data_that_fails_leaves_the_data_folder_byte_identical(tmp_path, capsys):
    out = tmp_path / "data"
    assert data.main(["--no-train", "--benchmarks", "gsm8k,aime24", "--out-dir", str(out)]) == 0
    (out / "gsm8k_calc_train.parquet").write_text("another command's file")
    capsys.readouterr()
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"problem": "1+1", "answer": "2"}\n{"problem": \n')
    before = tree(tmp_path)
    assert data.main(["--train-source", str(bad), "--benchmarks", "gsm8k", "--out-dir", str(out)]) == 2
    assert "bad.jsonl:2: not a JSON line" in refused(capsys, "capo-verl prepare-data")
    assert tree(tmp_path) == before
    assert data.main(["--no-train", "--benchmarks", "aime24", "--out-dir", str(out)]) == 0  # a rerun: others kept
    assert (out / "gsm8k_calc_train.parquet").read_text() == "another command's file"
    assert {"gsm8k.parquet", "aime24.parquet"} <= set(json.loads((out / "manifest.json").read_text())["files"])


# ------------------------------------------------------------------------------------------------ compare reports


def test_compare_reports_leave_their_inputs_and_old_files_as_they_were(tmp_path, capsys):
    out = tmp_path / "compare_cpu"
    shutil.copytree(COMMITTED_COMPARE, out)
    metrics = stored(out / "grpo" / "metrics.jsonl")  # a committed unit keeps its logs compressed
    before_input = metrics.read_bytes()
    # a method without logs: refused before any report file is written
    before = tree(tmp_path)
    argv = ["--plot-only", "--reuse-out", "--methods", "grpo", "simko", "--out", str(out)]
    assert compare_cli.main(argv) == 2
    assert "simko" in refused(capsys, "capo-verl compare")
    assert tree(tmp_path) == before
    # summary.json a symlink to one of the inputs: the report replaces the link, never the input behind it
    (out / "summary.json").unlink()
    (out / "summary.json").symlink_to(metrics)
    assert compare_cli.main(["--plot-only", "--reuse-out", "--methods", "grpo", "capo", "--out", str(out)]) == 0
    assert metrics.read_bytes() == before_input
    assert not (out / "summary.json").is_symlink() and json.loads((out / "summary.json").read_text())["methods"]
