"""The ``resume_state`` start check (capo_verl/compat/resume.py) on checkpoint folders laid out as verl 0.9.1 writes
them (``verl/trainer/ppo/v1/trainer_base.py::_save_checkpoint``, ``FSDPCheckpointManager.save_checkpoint``):
``global_step_<N>/actor/{model,optim,extra_state}_world_size_<W>_rank_<R>.pt``, ``global_step_<N>/data.pt`` and
``latest_checkpointed_iteration.txt``. Each refusal has a neighbour that passes.

Fast: no trainer starts.
"""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from capo_verl.compat import resume
from capo_verl.compat.run_checks import RULES, Context, launch_script_files, run_rules


def config(folder: Path, mode: str = "auto", resume_from_path=None, gpus: int = 1):
    return OmegaConf.create(
        {
            "trainer": {
                "resume_mode": mode,
                "resume_from_path": resume_from_path,
                "default_local_dir": str(folder),
                "nnodes": 1,
                "n_gpus_per_node": gpus,
            },
            "actor_rollout_ref": {
                "actor": {"checkpoint": {"save_contents": ["model", "optimizer", "extra"], "load_contents": None}}
            },
        }
    )


def save(folder: Path, step: int, world: int = 1, *, tracker: bool = True, data: bool = True) -> Path:
    """A checkpoint of ``step`` as verl writes it (file contents are not read by the check)."""
    actor = folder / f"global_step_{step}" / "actor"
    (actor / "huggingface").mkdir(parents=True)
    (actor / "huggingface" / "config.json").write_text("{}")
    (actor / "fsdp_config.json").write_text(f'{{"FSDP_version": 2, "world_size": {world}}}')
    for rank in range(world):
        for kind in ("model", "optim", "extra_state"):
            (actor / f"{kind}_world_size_{world}_rank_{rank}.pt").write_bytes(b"x")
    if data:
        (folder / f"global_step_{step}" / "data.pt").write_bytes(b"x")
    if tracker:
        (folder / resume.TRACKER).write_text(str(step))
    return folder / f"global_step_{step}"


def refused(cfg) -> str:
    """The rule as the engine runs it where files are checked: the ValueError's one line."""
    [rule] = [r for r in RULES if r.name == "resume_state"]
    with launch_script_files(), pytest.raises(ValueError) as info:
        run_rules([rule], cfg, Context())
    message = str(info.value)
    assert "\n" not in message
    return message


def passes(cfg) -> None:
    assert resume.resume_refusal(cfg, Context()) is None


# --- B: a new run into a folder that holds another run's checkpoints ----------------------------------------------
def test_a_new_run_into_a_folder_with_checkpoints_is_refused_naming_the_folder_and_both_choices(tmp_path):
    ckpt = tmp_path / "ckpt"
    save(ckpt, 1)
    message = refused(config(ckpt, "disable"))
    assert message.startswith(f"trainer.default_local_dir={ckpt} ")
    assert "global_step_1" in message
    assert "trainer.resume_mode=auto" in message and f"trainer.default_local_dir={ckpt}_new" in message


@pytest.mark.parametrize("left", ["tracker", "step_folder"])
def test_either_trace_of_a_run_is_enough_to_refuse(tmp_path, left):
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    if left == "tracker":
        (ckpt / resume.TRACKER).write_text("3")
    else:
        (ckpt / "global_step_3").mkdir()
    assert refused(config(ckpt, "disable")).startswith("trainer.default_local_dir=")


@pytest.mark.parametrize("state", ["missing", "empty", "other_files"])
def test_a_new_run_into_a_fresh_or_empty_folder_passes(tmp_path, state):
    ckpt = tmp_path / "ckpt"
    if state != "missing":
        ckpt.mkdir()
    if state == "other_files":
        (ckpt / "notes.txt").write_text("mine")
        (ckpt / "global_step_x").mkdir()  # not a step verl writes
    passes(config(ckpt, "disable"))


# --- C: what verl would resume from ------------------------------------------------------------------------------
def test_a_whole_last_checkpoint_resumes_and_says_which_step(tmp_path, caplog):
    ckpt = tmp_path / "ckpt"
    save(ckpt, 2)
    caplog.set_level(logging.INFO, logger="capo_verl")
    passes(config(ckpt))
    assert any("global_step_2" in r.getMessage() and "step 2" in r.getMessage() for r in caplog.records)
    passes(config(tmp_path / "new"))  # auto with no checkpoint: a new run from the model


@pytest.mark.parametrize("text", ["abc", "", "7\n\x00"])
def test_a_tracker_that_is_not_a_step_number_is_refused(tmp_path, text):
    ckpt = tmp_path / "ckpt"
    save(ckpt, 6)
    (ckpt / resume.TRACKER).write_text(text)
    message = refused(config(ckpt))
    assert message.startswith(f"trainer.default_local_dir={ckpt} ")
    assert resume.TRACKER in message
    assert f"trainer.resume_from_path={ckpt / 'global_step_6'}" in message  # the last whole step
    (ckpt / resume.TRACKER).write_text("6\n")  # verl's int() takes surrounding whitespace
    passes(config(ckpt))


def test_a_tracker_naming_a_step_that_is_not_there_is_refused(tmp_path):
    ckpt = tmp_path / "ckpt"
    save(ckpt, 6)
    (ckpt / resume.TRACKER).write_text("7")
    message = refused(config(ckpt))
    assert "step 7" in message and "global_step_7" in message
    assert f"trainer.resume_from_path={ckpt / 'global_step_6'}" in message
    (ckpt / resume.TRACKER).write_text("6")
    passes(config(ckpt))


@pytest.mark.parametrize(
    "missing", ["actor/model_world_size_1_rank_0.pt", "actor/optim_world_size_1_rank_0.pt", "data.pt", "actor"]
)
def test_a_last_checkpoint_that_is_not_whole_is_refused_naming_the_last_whole_one(tmp_path, missing):
    import shutil

    ckpt = tmp_path / "ckpt"
    save(ckpt, 2)
    last = save(ckpt, 4)
    target = last / missing
    shutil.rmtree(target) if target.is_dir() else target.unlink()
    message = refused(config(ckpt))
    assert "global_step_4" in message and missing.split("/")[-1] in message
    assert f"trainer.resume_from_path={ckpt / 'global_step_2'}" in message
    assert "trainer.default_local_dir=" in message.partition("; ")[2]  # the other choice
    passes(config(ckpt, "resume_path", str(ckpt / "global_step_2")))  # the fix it gives passes


def test_a_checkpoint_of_another_world_size_is_refused(tmp_path):
    ckpt = tmp_path / "ckpt"
    save(ckpt, 1, world=2)
    message = refused(config(ckpt, gpus=1))
    assert "trainer.n_gpus_per_node" in message
    passes(config(ckpt, gpus=2))


def test_step_folders_without_a_tracker_are_refused_with_auto(tmp_path):
    ckpt = tmp_path / "ckpt"
    save(ckpt, 3, tracker=False)
    message = refused(config(ckpt))
    assert resume.TRACKER in message and f"trainer.resume_from_path={ckpt / 'global_step_3'}" in message


def test_resume_from_path_with_a_trailing_slash_is_refused(tmp_path):
    ckpt = tmp_path / "ckpt"
    step = save(ckpt, 6)
    message = refused(config(ckpt, "resume_path", f"{step}/"))
    assert message.startswith(f"trainer.resume_from_path={step}/ ")
    assert message.endswith(f"set trainer.resume_from_path={step}")
    passes(config(ckpt, "resume_path", str(step)))


def test_resume_from_path_to_a_step_that_is_not_whole_is_refused(tmp_path):
    ckpt = tmp_path / "ckpt"
    save(ckpt, 1)
    step = save(ckpt, 2, data=False)
    message = refused(config(ckpt, "resume_path", str(step)))
    assert message.startswith(f"trainer.resume_from_path={step} ") and "data.pt" in message
    assert f"trainer.resume_from_path={ckpt / 'global_step_1'}" in message


def test_the_rule_runs_only_where_files_are_checked(tmp_path):
    ckpt = tmp_path / "ckpt"
    save(ckpt, 1)
    [rule] = [r for r in RULES if r.name == "resume_state"]
    assert rule.here_only
    run_rules([rule], config(ckpt, "disable"), Context())  # a config only composed: nothing read, nothing refused
