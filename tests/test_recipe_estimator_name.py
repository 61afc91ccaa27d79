"""A recipe of ``configs/`` names its run after its method (``trainer.experiment_name`` from ``capo_run.method`` in
configs/base.yaml), so another estimator typed on its command line would train under the recipe's name: the CAPO
recipe with ``algorithm.adv_estimator=grpo`` trained GRPO as ``capo_qwen2.5_math_1.5b``. That is refused at the
start (capo_verl/compat/methods.py, ``check_ablation``) unless the run is renamed too; the neighbours pass. Checked as
a launch script's ``--dry-run`` checks (:func:`capo_verl.cpu.launch.checked_config`): nothing is started or loaded.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from capo_verl.cpu import launch

pytestmark = pytest.mark.filterwarnings("ignore:Disabled critic as algorithm.adv_estimator:UserWarning")

REPO = Path(__file__).resolve().parents[1]
CAPO = "capo_qwen2.5_math_1.5b"
#: a short run of the recipe on the test's data
RUN = ("trainer.total_training_steps=2",)


@pytest.fixture(scope="module")
def run_files(tmp_path_factory):
    """``(data overrides, checkpoint folder)``: real GSM8K rows as train and validation files."""
    from capo_verl.data import write_gsm8k_calc_parquet

    root = tmp_path_factory.mktemp("recipe_estimator")
    train, val = write_gsm8k_calc_parquet(root / "data", n_train=256, n_val=8)
    return (f"data.train_files={train}", f"data.val_files=[{val}]"), root / "ckpt"


@pytest.fixture(autouse=True)
def gpu_driver(monkeypatch):
    """Checked as on a GPU driver of one node (torch reports CUDA, no Ray cluster)."""
    import torch

    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)


def check(run_files, config: str, *overrides: str, config_dir: str = str(REPO / "configs")):
    data, ckpt = run_files
    cmd = ["python3", "-m", "verl.trainer.main_ppo", f"--config-path={config_dir}", f"--config-name={config}"]
    return launch.checked_config([*cmd, *data, f"trainer.default_local_dir={ckpt}", *RUN, *overrides])


def refusal(run_files, config: str, *overrides: str) -> str:
    with pytest.raises(ValueError) as info:
        check(run_files, config, *overrides)
    message = str(info.value)
    assert "\n" not in message and "Traceback" not in message, message
    return message


@pytest.mark.parametrize(("recipe", "typed"), [(CAPO, "grpo"), ("grpo_qwen2.5_math_1.5b", "capo")])
def test_another_estimator_typed_on_a_recipe_is_refused_and_both_fixes_pass(run_files, recipe, typed):
    message = refusal(run_files, recipe, f"algorithm.adv_estimator={typed}")
    method = recipe.partition("_")[0]
    assert message.startswith(f"algorithm.adv_estimator={typed}:"), message
    assert f"capo_run.method={method}" in message and recipe in message, message  # the recipe and its run name
    assert f"scripts/run_{typed}_qwen2.5_math_1.5b.sh" in message, message
    assert (REPO / "scripts" / f"run_{typed}_qwen2.5_math_1.5b.sh").is_file()
    [rename] = [w for w in message.split() if w.startswith("trainer.experiment_name=")]
    cfg = check(run_files, recipe, f"algorithm.adv_estimator={typed}", rename)
    assert cfg.algorithm.adv_estimator == typed and cfg.trainer.experiment_name == rename.partition("=")[2]
    assert check(run_files, f"{typed}_qwen2.5_math_1.5b").algorithm.adv_estimator == typed  # the other recipe


@pytest.mark.parametrize(
    ("recipe", "typed"),
    [
        (CAPO, "algorithm.adv_estimator=capo"),  # the recipe's own estimator typed again
        (CAPO, "++algorithm.adv_estimator=capo"),
        ("gspo_qwen2.5_math_1.5b", "algorithm.adv_estimator=grpo"),  # a loss-mode method over verl's estimator
        ("simko_qwen2.5_math_1.5b", "algorithm.adv_estimator=grpo"),
    ],
)
def test_the_recipes_own_estimator_typed_passes(run_files, recipe, typed):
    cfg = check(run_files, recipe, typed)
    assert cfg.trainer.experiment_name == recipe


@pytest.mark.parametrize("typed", ["grpo", "capo", "rloo"])
def test_verls_own_config_takes_any_estimator(run_files, typed):
    import verl

    config_dir = os.path.join(os.path.dirname(verl.__file__), "trainer", "config")
    overrides = (  # verl's GRPO example on one node of 8 GPUs, as in tests/test_valid_verl_configs.py
        "actor_rollout_ref.model.path=Qwen/Qwen2.5-Math-1.5B",
        "actor_rollout_ref.rollout.name=vllm",
        "actor_rollout_ref.rollout.n=4",
        "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=4",
        "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=4",
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=4",
        "data.train_batch_size=32",
        "actor_rollout_ref.actor.ppo_mini_batch_size=16",
        "trainer.nnodes=1",
        "trainer.n_gpus_per_node=8",
        "trainer.logger=[console]",
    )
    cfg = check(run_files, "ppo_trainer", f"algorithm.adv_estimator={typed}", *overrides, config_dir=config_dir)
    assert cfg.algorithm.adv_estimator == typed
