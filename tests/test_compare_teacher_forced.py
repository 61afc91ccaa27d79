"""``capo-verl compare --teacher-forced``'s bookkeeping without training: which checkpoints are scored, that a
scored step is not scored again, and that pruning keeps exactly the Hugging Face weights of a finished run (the
whole path runs on the tiny model in ``tests/test_compare_seeds_e2e.py``)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from unittest import mock

import pytest

from capo_verl.compare import teacher_forced as TF


def _checkpoint(run: Path, step: int, *, hf: bool = True) -> Path:
    actor = run / "ckpt" / f"global_step_{step}" / "actor"
    actor.mkdir(parents=True)
    for name in ("model_world_size_1_rank_0.pt", "optim_world_size_1_rank_0.pt", "extra_state_world_size_1_rank_0.pt"):
        (actor / name).write_bytes(b"x" * 100)
    (actor.parent / "data.pt").write_bytes(b"y" * 10)
    if hf:
        (actor / "huggingface").mkdir()
        (actor / "huggingface" / "model.safetensors").write_bytes(b"w")
        (actor / "huggingface" / "config.json").write_text("{}")
    (run / "ckpt" / "latest_checkpointed_iteration.txt").write_text(str(step))
    return actor


def test_checkpoints_with_hf_weights_are_found_in_step_order(tmp_path):
    run = tmp_path / "capo"
    for step in (20, 10, 30):
        _checkpoint(run, step, hf=step != 20)
    assert list(TF.checkpoints_with_hf(run)) == [10, 30]
    assert TF.checkpoints_with_hf(run)[30] == run / "ckpt" / "global_step_30" / "actor" / "huggingface"


def test_a_run_without_hf_weights_is_refused_with_the_keys_to_set(tmp_path):
    run = tmp_path / "capo"
    _checkpoint(run, 10, hf=False)
    with pytest.raises(FileNotFoundError, match="save_contents with hf_model and trainer.save_freq"):
        TF.score_run(run, tmp_path / "teacher_forced", tmp_path / "val.parquet", tokenizer=tmp_path)


def test_pruning_keeps_the_hf_weights_of_a_finished_run_and_refuses_an_unfinished_one(tmp_path):
    run = tmp_path / "capo"
    for step in (10, 20):
        _checkpoint(run, step)
    with pytest.raises(RuntimeError, match="not finished"):
        TF.prune_to_hf(run)
    assert len(list(run.rglob("*.pt"))) == 8  # nothing deleted
    (run / "done.json").write_text("{}")
    assert TF.prune_to_hf(run) == 2 * (3 * 100 + 10)
    assert list(run.rglob("*.pt")) == []
    assert sorted(str(p.relative_to(run)) for p in run.rglob("*.safetensors")) == [
        "ckpt/global_step_10/actor/huggingface/model.safetensors",
        "ckpt/global_step_20/actor/huggingface/model.safetensors",
    ]
    assert (run / "ckpt" / "latest_checkpointed_iteration.txt").read_text() == "20"


def test_a_scored_step_is_not_scored_again_and_a_new_one_is_written_complete(tmp_path):
    """score(): one ``capo-verl eval teacher-forced`` call per missing step; its output is renamed from the partial
    name only after the call returned, with ``lpm_file`` pointing at the renamed array."""
    folder = tmp_path / "tf"
    folder.mkdir()
    (folder / "step10.json").write_text("{}")
    calls = []

    def fake_eval(*args):
        calls.append(args)
        out = Path(args[args.index("--out") + 1])
        label = args[args.index("--model") + 1].split("=", 1)[0]
        out.write_text(json.dumps({"models": {label: {"lpm_file": str(out.with_suffix(".0.npy"))}}}))
        out.with_name(out.stem + ".0.npy").write_bytes(b"npy")

    models = {10: tmp_path / "m10", 20: tmp_path / "m20"}
    with mock.patch.object(TF, "_eval", fake_eval):
        TF.score(tmp_path / "pool.jsonl", tmp_path / "val.parquet", models, folder, tokenizer=tmp_path / "tok")
    assert len(calls) == 1 and f"step20={tmp_path / 'm20'}" in calls[0]
    assert calls[0][calls[0].index("--dtype") + 1] == "float32"
    assert json.loads((folder / "step20.json").read_text())["models"]["step20"]["lpm_file"] == "step20.0.npy"
    assert (folder / "step20.0.npy").read_bytes() == b"npy"
    assert sorted(p.name for p in folder.iterdir()) == ["step10.json", "step20.0.npy", "step20.json"]


def _fake_eval(calls: list):
    """``capo-verl eval teacher-forced`` as :func:`TF.score` calls it: records the call, writes its two outputs."""

    def fake(*args):
        calls.append(args)
        out = Path(args[args.index("--out") + 1])
        label = args[args.index("--model") + 1].split("=", 1)[0]
        out.write_text(json.dumps({"models": {label: {}}}))
        out.with_name(out.stem + ".0.npy").write_bytes(b"npy")

    return fake


def test_a_scored_run_is_marked_and_then_needs_no_checkpoint(tmp_path):
    """A finished run copied elsewhere without ``ckpt/`` (its committed small outputs) is not scored again."""
    run = tmp_path / "capo"
    for step in (15, 30):
        _checkpoint(run, step)
    (run / "done.json").write_text("{}")
    calls: list = []
    with mock.patch.object(TF, "_eval", _fake_eval(calls)):
        TF.score_run(run, tmp_path / "teacher_forced", tmp_path / "val.parquet", tokenizer=tmp_path)
        assert len(calls) == 2
        assert json.loads((run / "teacher_forced" / TF.SCORED).read_text()) == {"steps": [15, 30]}
        assert list(run.rglob("*.pt")) == []  # pruned after scoring
        shutil.rmtree(run / "ckpt")
        TF.score_run(run, tmp_path / "teacher_forced", tmp_path / "val.parquet", tokenizer=tmp_path)
    assert len(calls) == 2


def test_a_finished_run_without_checkpoints_or_scores_names_the_way_out(tmp_path):
    run = tmp_path / "grpo"
    run.mkdir()
    (run / "done.json").write_text("{}")
    with pytest.raises(FileNotFoundError, match=r"grpo\b.*\bckpt/.*delete the folder"):
        TF.score_run(run, tmp_path / "teacher_forced", tmp_path / "val.parquet", tokenizer=tmp_path)
