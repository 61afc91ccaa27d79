"""The checkpoint stamp (capo_verl/compat/checkpoint_stamp.py): verl's save writes ``global_step_<N>/capo_verl.json``,
and the ``resume_state`` start check (capo_verl/compat/resume.py) refuses a resume with another estimator, policy
loss mode or model architecture than the stamp's. Step folders are laid out as verl 0.9.1 writes them (as in
tests/test_resume_checks.py); the writer runs verl's real ``PPOTrainer._save_checkpoint`` on a stand-in trainer.

Fast: no trainer, Ray or worker starts.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from types import SimpleNamespace

import pytest
from omegaconf import OmegaConf

from capo_verl.compat import resume
from capo_verl.compat.checkpoint_stamp import write_stamp
from capo_verl.compat.run_checks import RULES, Context, launch_script_files, run_rules

REPO = Path(__file__).resolve().parents[1]


def model(folder: Path, layers: int = 2, vocab: int = 256) -> Path:
    """A local model folder: a tiny Qwen2 ``config.json`` as transformers writes it."""
    from transformers import Qwen2Config

    arch = {"architectures": ["Qwen2ForCausalLM"], "num_attention_heads": 2}
    Qwen2Config(hidden_size=64, num_hidden_layers=layers, vocab_size=vocab, **arch).save_pretrained(folder)
    return folder


def config(folder: Path, model_path, estimator="capo", loss="vanilla", mode="auto", resume_from_path=None):
    return OmegaConf.create(
        {
            "algorithm": {"adv_estimator": estimator},
            "trainer": {
                "resume_mode": mode,
                "resume_from_path": resume_from_path,
                "default_local_dir": str(folder),
                "nnodes": 1,
                "n_gpus_per_node": 1,
            },
            "actor_rollout_ref": {
                "model": {"path": str(model_path)},
                "actor": {"policy_loss": {"loss_mode": loss}, "checkpoint": {"load_contents": None}},
            },
        }
    )


def save(folder: Path, step: int, cfg=None) -> Path:
    """A whole checkpoint of ``step`` as verl writes it (contents not read), stamped by ``cfg`` when given."""
    actor = folder / f"global_step_{step}" / "actor"
    actor.mkdir(parents=True)
    for kind in ("model", "optim", "extra_state"):
        (actor / f"{kind}_world_size_1_rank_0.pt").write_bytes(b"x")
    (folder / f"global_step_{step}" / "data.pt").write_bytes(b"x")
    (folder / resume.TRACKER).write_text(str(step))
    if cfg is not None:
        assert write_stamp(cfg, step) == str(folder / f"global_step_{step}" / resume.STAMP)
    return folder / f"global_step_{step}"


def refused(cfg) -> str:
    [rule] = [r for r in RULES if r.name == "resume_state"]
    with launch_script_files(), pytest.raises(ValueError) as info:
        run_rules([rule], cfg, Context())
    message = str(info.value)
    assert "\n" not in message and "Traceback" not in message
    return message


def passes(cfg) -> None:
    assert resume.resume_refusal(cfg, Context()) is None


@pytest.mark.parametrize(
    ("change", "key", "kept"),
    [
        ({"estimator": "grpo"}, "algorithm.adv_estimator", "algorithm.adv_estimator=capo"),
        ({"loss": "gspo"}, "actor_rollout_ref.actor.policy_loss.loss_mode", "policy_loss.loss_mode=vanilla"),
    ],
)
def test_a_resume_with_another_method_is_refused_naming_the_key_and_both_fixes(tmp_path, change, key, kept):
    ckpt, qwen = tmp_path / "ckpt", model(tmp_path / "qwen")
    save(ckpt, 2, config(ckpt, qwen))
    message = refused(config(ckpt, qwen, **change))
    assert message.startswith(f"trainer.default_local_dir={ckpt} ") and "global_step_2" in message
    assert key in message and kept in message and f"trainer.default_local_dir={ckpt}_new" in message
    step = str(ckpt / "global_step_2")
    message = refused(config(ckpt, qwen, mode="resume_path", resume_from_path=step, **change))
    assert message.startswith(f"trainer.resume_from_path={step} ") and key in message
    passes(config(ckpt, qwen))  # the neighbour: the same method and model
    passes(config(ckpt, qwen, mode="resume_path", resume_from_path=step))


def test_a_resume_with_another_architecture_is_refused_naming_the_field(tmp_path):
    ckpt, qwen = tmp_path / "ckpt", model(tmp_path / "qwen")
    save(ckpt, 3, config(ckpt, qwen))
    message = refused(config(ckpt, model(tmp_path / "deeper", layers=4)))
    assert "num_hidden_layers" in message and "actor_rollout_ref.model.path" in message
    assert f"actor_rollout_ref.model.path={qwen}" in message  # the fix: the stamp's model
    passes(config(ckpt, model(tmp_path / "copy")))  # another folder, the same architecture


def test_a_hub_id_compares_the_method_only(tmp_path):
    ckpt = tmp_path / "ckpt"
    save(ckpt, 1, config(ckpt, model(tmp_path / "qwen")))
    passes(config(ckpt, "Qwen/Qwen2.5-Math-1.5B"))
    assert "algorithm.adv_estimator" in refused(config(ckpt, "Qwen/Qwen2.5-Math-1.5B", estimator="grpo"))


def test_a_step_without_a_stamp_resumes(tmp_path, caplog):
    ckpt = tmp_path / "ckpt"
    save(ckpt, 4)
    caplog.set_level(logging.INFO, logger="capo_verl")
    passes(config(ckpt, model(tmp_path / "qwen"), estimator="grpo"))
    assert any("global_step_4" in r.getMessage() for r in caplog.records)


def test_a_stamp_that_cannot_be_written_is_one_warning_and_a_remote_folder_is_skipped(tmp_path, caplog):
    (tmp_path / "file").write_text("not a folder")
    caplog.set_level(logging.WARNING, logger="capo_verl")
    assert write_stamp(config(tmp_path / "file", "Qwen/Qwen2.5-Math-1.5B"), 1) is None
    [record] = caplog.records
    assert resume.STAMP in record.getMessage() and "\n" not in record.getMessage()
    assert write_stamp(config("hdfs://nn/ckpt", "Qwen/Qwen2.5-Math-1.5B"), 1) is None


def composed(ckpt: Path, qwen: Path, *overrides: str):
    from hydra import compose, initialize_config_dir

    with initialize_config_dir(config_dir=str(REPO / "configs"), version_base=None):
        return compose(
            config_name="capo_qwen2.5_math_1.5b",
            overrides=[
                f"trainer.default_local_dir={ckpt}",
                f"actor_rollout_ref.model.path={qwen}",
                "trainer.nnodes=1",
                "trainer.n_gpus_per_node=1",
                "trainer.resume_mode=auto",
                *overrides,
            ],
        )


def test_verls_save_writes_the_stamp_that_the_resume_check_reads(tmp_path):
    """verl's real ``PPOTrainer._save_checkpoint`` (wrapped by the patch, installed with verl) on a stand-in
    trainer whose workers write the actor's files; then the composed config resumes, and with grpo is refused."""
    from verl.trainer.ppo import ray_trainer
    from verl.trainer.ppo.v1 import trainer_base

    for cls, module in ((trainer_base.PPOTrainer, trainer_base), (ray_trainer.RayPPOTrainer, ray_trainer)):
        assert cls._save_checkpoint.__wrapped__.__module__ == module.__name__, "the patch is installed with verl"
    ckpt, qwen = tmp_path / "ckpt", model(tmp_path / "qwen")
    cfg = composed(ckpt, qwen)

    def save_checkpoint(local_path, remote_path, step, max_ckpt_to_keep=None):
        Path(local_path).mkdir(parents=True)
        for kind in ("model", "optim", "extra_state"):
            (Path(local_path) / f"{kind}_world_size_1_rank_0.pt").write_bytes(b"x")

    trainer = SimpleNamespace(
        config=cfg,
        global_steps=5,
        use_critic=False,
        trainer_mode="sync",
        actor_rollout_wg=SimpleNamespace(save_checkpoint=save_checkpoint),
        train_dataloader=SimpleNamespace(state_dict=lambda: {}),
        checkpoint_callback=SimpleNamespace(on_save=lambda **kwargs: None),
    )
    trainer_base.PPOTrainer._save_checkpoint(trainer)
    stamp = json.loads((ckpt / "global_step_5" / resume.STAMP).read_text())
    assert stamp["algorithm.adv_estimator"] == "capo" and stamp["actor_rollout_ref.model.path"] == str(qwen)
    assert stamp["model"]["num_hidden_layers"] == 2 and stamp["model"]["architectures"] == ["Qwen2ForCausalLM"]
    assert (ckpt / resume.TRACKER).read_text() == "5"
    passes(cfg)
    assert "algorithm.adv_estimator=capo" in refused(composed(ckpt, qwen, "algorithm.adv_estimator=grpo"))
