"""The SimKO paper-run configs compose with verl 0.9.1's ppo_trainer, pass verl's validate_config (with capo-verl's
SimKO checks), carry the authors' hyperparameters on the shared paper base, and the launch scripts' --dry-run works."""

from __future__ import annotations

import shlex
import subprocess
from pathlib import Path

import pytest
import verl  # noqa: F401  loads the capo-verl plugin, as verl's launcher does
from verl.trainer.ppo.utils import need_reference_policy
from verl.utils.config import omega_conf_to_dataclass

pytestmark = [
    pytest.mark.filterwarnings("ignore:Disabled critic as algorithm.adv_estimator:UserWarning"),
    pytest.mark.usefixtures("config_env"),
]

REPO = Path(__file__).resolve().parents[1]
CONFIG_DIR = REPO / "configs"
SIZES = {"1.5b": ("Qwen/Qwen2.5-Math-1.5B", 600, 1), "7b": ("Qwen/Qwen2.5-Math-7B", 400, 2)}


@pytest.mark.parametrize("size", sorted(SIZES))
def test_simko_config_composes_validates_and_has_the_authors_values(configs, size):
    model, steps, tp = SIZES[size]
    cfg = configs.compose(f"simko_qwen2.5_math_{size}")
    actor = cfg.actor_rollout_ref.actor
    assert actor.policy_loss.loss_mode == "simko"
    assert dict(actor.policy_loss.simko) == {"top_k": 3, "alpha": 0.01, "entropy_quantile": 0.8, "top1_penalty": 1.1}
    assert cfg.algorithm.adv_estimator == "grpo" and cfg.algorithm.norm_adv_by_std_in_grpo is True
    assert cfg.actor_rollout_ref.model.path == model and cfg.trainer.total_training_steps == steps
    assert cfg.actor_rollout_ref.rollout.tensor_model_parallel_size == tp
    assert cfg.trainer.experiment_name == f"simko_qwen2.5_math_{size}"
    # the shared paper base
    assert cfg.data.train_batch_size == 128 and actor.ppo_mini_batch_size == 64
    assert actor.optim.lr == pytest.approx(1e-6) and actor.entropy_coeff == 0 and actor.clip_ratio == 0.2
    assert actor.use_kl_loss is False and cfg.algorithm.use_kl_in_reward is False
    assert actor.loss_agg_mode == "seq-mean-token-mean" and actor.strategy in ("fsdp", "fsdp2")
    assert cfg.actor_rollout_ref.model.use_remove_padding is True
    assert need_reference_policy(cfg) is False
    # the actor dataclass verl builds in the worker carries the validated SimKO parameters
    assert omega_conf_to_dataclass(actor).policy_loss.simko["top_k"] == 3


def test_simko_keys_override_without_plus_and_are_checked(configs):
    cfg = configs.compose("simko_qwen2.5_math_7b", ["actor_rollout_ref.actor.policy_loss.simko.alpha=0.05"])
    assert cfg.actor_rollout_ref.actor.policy_loss.simko.alpha == 0.05
    with pytest.raises(ValueError, match=r"actor_rollout_ref\.actor\.policy_loss\.simko\.entropy_quantile"):
        configs.compose("simko_qwen2.5_math_7b", ["actor_rollout_ref.actor.policy_loss.simko.entropy_quantile=1.5"])
    with pytest.raises(ValueError, match=r"actor_rollout_ref\.actor\.strategy fsdp or fsdp2"):
        configs.compose("simko_qwen2.5_math_1.5b", ["actor_rollout_ref.actor.strategy=megatron"])


@pytest.mark.parametrize("size", sorted(SIZES))
def test_simko_script_dry_run(configs, tmp_path, stand_in_python, size):
    """The script's --dry-run with a stand-in Python (tests/conftest.py); its printed command composed here."""
    model, steps, _ = SIZES[size]
    env = configs.script_env(
        PYTHON=str(stand_in_python), CAPO_DATA_DIR=str(tmp_path), CAPO_CKPT_DIR="/ckpt/capo", NNODES="2"
    )
    top_k = "actor_rollout_ref.actor.policy_loss.simko.top_k=5"
    script = REPO / "scripts" / f"run_simko_qwen2.5_math_{size}.sh"
    proc = subprocess.run(
        ["bash", str(script), "--dry-run", top_k], env=env, capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = proc.stdout.splitlines()
    [cmd] = [shlex.split(lines[i + 1]) for i, ln in enumerate(lines) if ln.startswith("# command (dry run")]
    assert cmd[1:5] == [
        "-m",
        "verl.trainer.main_ppo",
        f"--config-path={CONFIG_DIR}",
        f"--config-name=simko_qwen2.5_math_{size}",
    ]
    assert cmd[-1] == top_k
    cfg = configs.compose(f"simko_qwen2.5_math_{size}", cmd[5:])
    assert cfg.actor_rollout_ref.actor.policy_loss.loss_mode == "simko"
    assert cfg.actor_rollout_ref.actor.policy_loss.simko.top_k == 5
    assert cfg.actor_rollout_ref.model.path == model
    assert cfg.trainer.default_local_dir == f"/ckpt/capo/capo/simko_qwen2.5_math_{size}"
    assert cfg.trainer.total_training_steps == steps and cfg.trainer.nnodes == 2
