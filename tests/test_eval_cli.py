"""`capo-verl eval generate`: user errors stop the command with one line and exit code 2, before any model loads.

The subprocess tests run the installed command line as a user does (no traceback may reach stderr); the
in-process ones go through the same ``main`` for the remaining checks. None of them loads a model.
"""

import json
import re

import pytest
import torch

from capo_verl import data
from capo_verl.evaluation.cli import check_model, main

PREFIX = "capo-verl eval generate: error: "


@pytest.fixture
def run_cli(run_capo_verl):
    """``capo-verl eval generate ARGS`` in a subprocess."""
    return lambda *args, env=None: run_capo_verl("eval", "generate", *args, env=env)


@pytest.fixture
def error_line(refusal):
    """The one stderr line with the error prefix (exit status 2 and no traceback checked)."""
    return lambda proc: "capo-verl eval generate: error: " + refusal(proc, "capo-verl eval generate")


@pytest.fixture
def toy_data(tmp_path):
    path = tmp_path / "toy.jsonl"
    path.write_text(
        json.dumps(
            {
                "data_source": "toy",
                "prompt": [{"role": "user", "content": "1+1?"}],
                "reward_model": {"ground_truth": "2"},
                "extra_info": {"index": 0},
            }
        )
        + "\n"
    )
    return path


def test_unknown_benchmark_lists_the_known_names(tmp_path, run_cli, error_line):
    proc = run_cli("--model", "smollm2", "--benchmarks", "gsm8k", "gsm9k", "--out", str(tmp_path / "g.jsonl"))
    known = ", ".join(data.BENCHMARKS)
    line = error_line(proc)
    assert line.startswith(PREFIX) and "'gsm9k'" in line and "--benchmarks" in line
    assert known in line and f"paper (= {' '.join(data.DEFAULT_BENCHMARKS)})" in line  # the names to choose from
    assert "gsm8k" in known and not (tmp_path / "g.jsonl").exists()


def test_missing_model_path(tmp_path, toy_data, run_cli, error_line):
    missing = tmp_path / "no_such_checkpoint"
    proc = run_cli("--model", str(missing), "--data", str(toy_data), "--out", str(tmp_path / "g.jsonl"))
    line = error_line(proc)
    assert line.startswith(f"{PREFIX}--model {str(missing)!r}: ")
    assert "(smollm2)" in line and "(owner/name)" in line  # what --model may be instead
    assert not (tmp_path / "g.jsonl").exists()


def test_hub_id_that_cannot_load_is_one_line(tmp_path, toy_data, run_cli, error_line):
    """An owner/name that is not local passes the check and goes to vLLM; offline, its (multi-line) error becomes
    one line."""
    proc = run_cli(
        "--model",
        "no-such-owner/no-such-model",
        "--data",
        str(toy_data),
        "-k",
        "1",
        "--out",
        str(tmp_path / "g.jsonl"),
        env={"HF_HUB_OFFLINE": "1"},
    )
    line = error_line(proc)
    assert line.startswith(PREFIX) and "--model 'no-such-owner/no-such-model'" in line, line
    assert not (tmp_path / "g.jsonl").exists()


@pytest.mark.parametrize(
    "extra, named",
    [  # the option, the value given, and the bound or the choices
        (["--threads", "0"], r"--threads\b.*>= 1\b.*\b0$"),
        (["--chunk", "-1"], r"--chunk\b.*>= 1\b.*-1$"),
        (["--dtype", "bf16"], r"--dtype 'bf16'.*\bauto, float32, bfloat16 or float16\b"),
        (["--device", "gpu"], r"--device 'gpu'.*\bauto, cpu or cuda\b.*\bCUDA_VISIBLE_DEVICES\b"),
    ],
)
def test_option_errors(tmp_path, capsys, toy_data, extra, named):
    args = ["generate", "--model", "smollm2", "--data", str(toy_data), "--out", str(tmp_path / "g.jsonl"), *extra]
    assert main(args) == 2
    [line] = capsys.readouterr().err.splitlines()
    assert line.startswith(PREFIX) and re.search(named, line), line


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without a CUDA GPU")
def test_cuda_device_without_gpu(tmp_path, capsys, toy_data):
    args = [
        "generate",
        "--model",
        "smollm2",
        "--data",
        str(toy_data),
        "--out",
        str(tmp_path / "g.jsonl"),
        "--device",
        "cuda",
    ]
    assert main(args) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"{PREFIX}--device cuda") and re.search(r"\bvllm-cpu\b.*\bcpu\b.*pip install", err), err


def test_model_check(tmp_path):
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    with pytest.raises(ValueError, match=r"--model .*\bckpt\b.*\bconfig\.json\b.*--gguf-file"):
        check_model(str(ckpt))
    (ckpt / "config.json").write_text("{}")
    with pytest.raises(ValueError, match=r"--model .*\bckpt\b.*\bconfig\.json\b.*\bmodel\.safetensors\b"):
        check_model(str(ckpt))  # config.json without weights (tests/test_eval_checkpoint.py: verl checkpoints)
    (ckpt / "model.safetensors").write_bytes(b"weights")
    check_model(str(ckpt))  # a checkpoint folder
    with pytest.raises(ValueError, match=r"--gguf-file 'm\.gguf'.*--model\b.*\bckpt$"):
        check_model(str(ckpt), "m.gguf")
    (ckpt / "m.gguf").write_bytes(b"GGUF")
    check_model(str(ckpt), "m.gguf")  # a GGUF inside a folder
    check_model(str(ckpt / "m.gguf"))  # a GGUF file
    with pytest.raises(ValueError, match=r"--model .*\bconfig\.json\b.*\.gguf\b"):
        check_model(str(ckpt / "config.json"))
    check_model("smollm2")
    with pytest.raises(ValueError, match=r"--gguf-file\b.*--model smollm2\b.*\bleave it out\b"):
        check_model("smollm2", "m.gguf")
    check_model("Qwen/Qwen2.5-Math-1.5B")  # a hub id: left to transformers / vLLM
    for bad in ("smolm2", "./not_here", "/abs/not_here", "a/b/c", "owner/name.gguf"):
        with pytest.raises(ValueError, match=rf"--model {re.escape(repr(bad))}.*\(smollm2\).*\(owner/name\)"):
            check_model(bad)
