"""capo inside the real verl 0.9.1: compute_advantage, the plugin entry point, the reference gate, metrics."""

import logging
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import torch
import verl  # noqa: F401  (loads the capo-verl plugin)
from hydra import compose, initialize_config_module
from omegaconf import OmegaConf
from verl import DataProto
from verl.trainer.ppo import core_algos, ray_trainer
from verl.trainer.ppo.v1 import utils as v1_utils

from capo_verl.compat.advantage import pop_step_metrics
from capo_verl.estimators import CapoConfig, compute_capo_outcome_advantage

PY = sys.executable


def make_dataproto(seed=0, n_groups=5, with_ref=True):
    """Ragged (G = 2..7) groups, shuffled through the batch, +-1 rewards, variable lengths with padding."""
    rng = np.random.default_rng(seed)
    sizes = rng.integers(2, 8, n_groups)
    uids = np.concatenate([[f"uid-{g}"] * s for g, s in enumerate(sizes)])
    bs, T = len(uids), 12
    perm = rng.permutation(bs)
    uids = uids[perm]
    lengths = torch.from_numpy(rng.integers(1, T + 1, bs))
    response_mask = (torch.arange(T).unsqueeze(0) < lengths.unsqueeze(1)).to(torch.int64)
    old_log_probs = torch.from_numpy(rng.normal(-1.0, 0.6, (bs, T))).float() * response_mask
    ref_log_prob = torch.from_numpy(rng.normal(-0.4, 0.3, (bs, T))).float() * response_mask
    correct = torch.from_numpy(rng.random(bs) < 0.5)
    rewards = torch.zeros(bs, T)
    rewards[torch.arange(bs), lengths - 1] = torch.where(correct, 1.0, -1.0)
    batch = {
        "token_level_rewards": rewards,
        "response_mask": response_mask,
        "old_log_probs": old_log_probs,
        "rollout_log_probs": old_log_probs + 0.01,
    }
    if with_ref:
        batch["ref_log_prob"] = ref_log_prob
    return DataProto.from_dict(tensors=batch, non_tensors={"uid": np.array(uids, dtype=object)})


def algo_config(**capo):
    return OmegaConf.create({"adv_estimator": "capo", "gamma": 1.0, "lam": 1.0, "capo": capo})


def test_capo_through_verl_compute_advantage_matches_direct_call():
    data = make_dataproto()
    cfg = algo_config(tau=0.5, ref_high=1.5, ref_low=1.5)
    expected, _ = compute_capo_outcome_advantage(
        data.batch["token_level_rewards"],
        data.batch["response_mask"],
        data.non_tensor_batch["uid"],
        cfg,
        old_log_probs=data.batch["old_log_probs"],
        ref_log_prob=data.batch["ref_log_prob"],
    )
    # the mask is active on this batch, on both sides
    pop_step_metrics()
    out = ray_trainer.compute_advantage(data, adv_estimator="capo", config=cfg)
    metrics = pop_step_metrics()
    assert 0 < metrics["capo/mask_frac_correct"] < 1 and 0 < metrics["capo/mask_frac_incorrect"] < 1
    assert torch.equal(out.batch["advantages"], expected)
    assert torch.equal(out.batch["returns"], expected)
    # the v1 trainer's entry point (imports compute_advantage by name) takes the same path
    data2 = make_dataproto()
    out2 = v1_utils.compute_advantage_for_multi_trajectories(
        data2, batch_keys=[], adv_estimator="capo", config=cfg, num_repeat=4
    )
    assert torch.equal(out2.batch["advantages"], expected)
    # +-1 rewards: correct >= 0 >= incorrect, 0 on padding
    adv, mask = out.batch["advantages"], out.batch["response_mask"].bool()
    R = data.batch["token_level_rewards"].sum(-1)
    assert (adv[R > 0] >= 0).all() and (adv[R < 0] <= 0).all() and (adv[~mask] == 0).all()


def test_capo_without_mask_needs_no_ref_and_uses_rollout_log_probs_when_old_absent(caplog):
    data = make_dataproto(with_ref=False)
    cfg = algo_config(use_mask=False)
    a = ray_trainer.compute_advantage(data, adv_estimator="capo", config=cfg).batch["advantages"].clone()
    data.batch.pop("old_log_probs")
    with caplog.at_level(logging.WARNING, logger="capo_verl"):
        b = ray_trainer.compute_advantage(data, adv_estimator="capo", config=cfg).batch["advantages"]
    assert not torch.equal(a, b)  # rollout_log_probs differ from old_log_probs
    direct, _ = compute_capo_outcome_advantage(
        data.batch["token_level_rewards"],
        data.batch["response_mask"],
        data.non_tensor_batch["uid"],
        cfg,
        old_log_probs=data.batch["rollout_log_probs"],
    )
    assert torch.equal(b, direct)


def test_capo_mask_on_without_ref_log_prob_fails_clearly():
    with pytest.raises(ValueError, match="ref_log_prob"):
        ray_trainer.compute_advantage(make_dataproto(with_ref=False), adv_estimator="capo", config=algo_config())


def test_missing_uid_fails_clearly():
    data = make_dataproto()
    data.non_tensor_batch.pop("uid")
    with pytest.raises(ValueError, match="uid"):
        ray_trainer.compute_advantage(data, adv_estimator="capo", config=algo_config())


@pytest.mark.parametrize("estimator", ["grpo", "rloo", "reinforce_plus_plus", "grpo_vectorized", "opo", "remax"])
def test_other_estimators_unchanged(estimator):
    original = ray_trainer.compute_advantage.__wrapped__
    assert original.__module__ == "verl.trainer.ppo.ray_trainer"
    cfg = OmegaConf.create({"adv_estimator": estimator, "gamma": 1.0, "lam": 1.0})
    data = make_dataproto()
    if estimator == "remax":
        data.batch["reward_baselines"] = torch.zeros(len(data))
    got = ray_trainer.compute_advantage(data.select(deepcopy=True), adv_estimator=estimator, config=cfg)
    want = original(data.select(deepcopy=True), adv_estimator=estimator, config=cfg)
    assert torch.equal(got.batch["advantages"], want.batch["advantages"])
    assert torch.equal(got.batch["returns"], want.batch["returns"])


def test_grpo_mask_is_grpo_times_mask():
    data = make_dataproto()
    cfg = OmegaConf.create(
        {"adv_estimator": "grpo_mask", "norm_adv_by_std_in_grpo": False, "capo": {"ref_high": 1.5, "ref_low": 1.5}}
    )
    got = ray_trainer.compute_advantage(data.select(deepcopy=True), adv_estimator="grpo_mask", config=cfg)
    grpo, _ = core_algos.compute_grpo_outcome_advantage(
        data.batch["token_level_rewards"],
        data.batch["response_mask"],
        data.non_tensor_batch["uid"],
        norm_adv_by_std_in_grpo=False,
    )
    ref_ppl = torch.exp(-(data.batch["ref_log_prob"].sum(-1) / data.batch["response_mask"].sum(-1)))
    correct = data.batch["token_level_rewards"].sum(-1) > 0.5
    keep = torch.where(correct, ref_ppl <= 1.5, ref_ppl >= 1.5)
    assert (~keep).any()
    torch.testing.assert_close(got.batch["advantages"], grpo * keep.unsqueeze(-1))


# --- the plugin entry point -------------------------------------------------------------------------------------
CHECK_REGISTERED = textwrap.dedent(
    """
    import verl
    from verl.trainer.ppo import core_algos
    import verl.trainer.ppo.v1.utils as v1_utils
    import verl.trainer.main_ppo as main_ppo
    names = [n for n in ("capo", "grpo_mask", "codapo", "cde") if n in core_algos.ADV_ESTIMATOR_REGISTRY]
    print(",".join(names) or "-",
          getattr(v1_utils.compute_advantage, "__wrapped_by_capo_verl__", False),
          getattr(main_ppo.validate_config, "__capo_verl__", False),
          main_ppo.need_reference_policy.__module__)
    """
)


def run_fresh(code, **env):
    out = subprocess.run(
        [PY, "-c", code], capture_output=True, text=True, timeout=300, env={**os.environ, **env}, cwd="/"
    )
    assert out.returncode == 0, out.stderr[-3000:]
    return out.stdout.strip().splitlines()[-1]


def test_entry_point_registers_capo_in_a_fresh_process():
    """Nothing of capo_verl is imported by the code: `import verl` loads the entry point, which registers the four
    estimators, wraps compute_advantage and hooks the validate_config that main_ppo binds."""
    assert run_fresh(CHECK_REGISTERED) == "capo,grpo_mask,codapo,cde True True verl.trainer.ppo.utils"


def test_without_the_plugin_capo_is_not_registered():
    # negative control: the check above can fail
    assert run_fresh(CHECK_REGISTERED, VERL_USE_EXTERNAL_PLUGINS="none") == "- False False verl.trainer.ppo.utils"


def test_entry_point_registers_capo_inside_a_ray_actor():
    code = textwrap.dedent(
        """
        import ray
        ray.init(num_cpus=1, include_dashboard=False, log_to_driver=False)

        @ray.remote(num_cpus=0)
        class Probe:
            def check(self):
                import os, verl
                from verl.trainer.ppo import core_algos, ray_trainer
                return os.getpid(), "capo" in core_algos.ADV_ESTIMATOR_REGISTRY, hasattr(
                    ray_trainer.compute_advantage, "__wrapped_by_capo_verl__")

        import os
        pid, registered, patched = ray.get(Probe.remote().check.remote())
        ray.shutdown()
        print(pid != os.getpid(), registered, patched)
        """
    )
    assert run_fresh(code) == "True True True"


# --- the reference policy gate ---------------------------------------------------------------------------------
def compose_verl(*overrides):
    with initialize_config_module(config_module="verl.trainer.config", version_base=None):
        return compose("ppo_trainer", overrides=["actor_rollout_ref.rollout.name=vllm", *overrides])


@pytest.mark.parametrize(
    "overrides, needed",
    [
        (["algorithm.adv_estimator=capo"], True),
        (["algorithm.adv_estimator=capo", "+algorithm.capo.use_mask=false"], False),
        (["algorithm.adv_estimator=grpo_mask"], True),
        (["algorithm.adv_estimator=grpo"], False),
        (["algorithm.adv_estimator=grpo", "actor_rollout_ref.actor.use_kl_loss=true"], True),
    ],
)
def test_reference_policy_gate(overrides, needed, caplog):
    from verl.trainer import main_ppo
    from verl.trainer.ppo import utils
    from verl.trainer.ppo.v1 import trainer_base

    config = compose_verl(*overrides)
    with caplog.at_level(logging.WARNING, logger="capo_verl"):
        for module in (utils, main_ppo, ray_trainer, trainer_base):
            assert module.need_reference_policy(config) is needed
    # the gate adds no KL term anywhere
    assert config.actor_rollout_ref.actor.use_kl_loss is ("actor_rollout_ref.actor.use_kl_loss=true" in overrides)
    assert config.algorithm.use_kl_in_reward is False


def test_capo_override_reaches_the_estimator():
    config = compose_verl("algorithm.adv_estimator=capo", "+algorithm.capo.tau=0.5")
    assert CapoConfig.from_algorithm_config(config.algorithm).tau == 0.5
    assert CapoConfig.from_algorithm_config(compose_verl("algorithm.adv_estimator=capo").algorithm) == CapoConfig()


def test_capo_metrics_reach_legacy_trainer_data_metrics():
    """Legacy RayPPOTrainer.fit: compute_advantage(...) then metrics.update(compute_data_metrics(batch=...))."""
    data = make_dataproto()
    bs, T = data.batch["response_mask"].shape
    data.batch["token_level_scores"] = data.batch["token_level_rewards"]
    data.batch["prompts"] = torch.ones(bs, 4, dtype=torch.int64)
    data.batch["responses"] = torch.ones(bs, T, dtype=torch.int64)
    data.batch["attention_mask"] = torch.cat([torch.ones(bs, 4, dtype=torch.int64), data.batch["response_mask"]], 1)
    pop_step_metrics()
    data = ray_trainer.compute_advantage(data, adv_estimator="capo", config=algo_config(ref_high=1.5, ref_low=1.5))
    metrics = ray_trainer.compute_data_metrics(batch=data, use_critic=False)
    assert "critic/advantages/mean" in metrics  # verl's own metrics are still there
    assert {"capo/auc_mean", "capo/mask_frac_correct", "capo/adv_abs_mean"} <= set(metrics)
    assert ray_trainer.compute_data_metrics(batch=data, use_critic=False).keys().isdisjoint({"capo/auc_mean"})


@pytest.mark.parametrize("estimator", ["grpo", "rloo", "grpo_vectorized"])
def test_batch_calibration_metrics_for_verl_estimators(estimator):
    """Every estimator gets capo/* calibration metrics, computed from the batch by hand here; advantages unchanged."""
    cfg = OmegaConf.create({"adv_estimator": estimator, "gamma": 1.0, "lam": 1.0})
    data = make_dataproto(seed=3, n_groups=6)
    pop_step_metrics()
    out = ray_trainer.compute_advantage(data.select(deepcopy=True), adv_estimator=estimator, config=cfg)
    metrics = pop_step_metrics()
    want = ray_trainer.compute_advantage.__wrapped__(data.select(deepcopy=True), adv_estimator=estimator, config=cfg)
    assert torch.equal(out.batch["advantages"], want.batch["advantages"])

    mask = data.batch["response_mask"].numpy().astype(bool)
    lp = data.batch["old_log_probs"].numpy()
    lpm = np.array([lp[i][mask[i]].mean() for i in range(len(mask))])
    correct = data.batch["token_level_rewards"].numpy().sum(-1) > 0.5
    uids = data.non_tensor_batch["uid"]
    aucs = []
    for u in np.unique(uids):
        sel = uids == u
        pos, neg = lpm[sel & correct], lpm[sel & ~correct]
        if len(pos) and len(neg):
            aucs.append(np.mean([(p > q) + 0.5 * (p == q) for p in pos for q in neg]))
    assert metrics["capo/auc_mean"] == pytest.approx(np.mean(aucs))
    assert metrics["capo/mixed_group_frac"] == pytest.approx(len(aucs) / len(np.unique(uids)))
    assert metrics["capo/lpm_incorrect_mean"] == pytest.approx(lpm[~correct].mean(), rel=1e-6)
    adv = out.batch["advantages"].numpy()
    seq_adv = [abs(adv[i][mask[i]].mean()) for i in range(len(mask))]
    assert metrics["capo/adv_abs_mean"] == pytest.approx(np.mean(seq_adv))


def test_batch_calibration_metrics_use_capo_reward_threshold():
    data = make_dataproto(seed=4)
    cfg = OmegaConf.create({"adv_estimator": "grpo", "capo": {"reward_threshold": "high"}})
    with pytest.raises(ValueError, match="algorithm.capo.reward_threshold"):
        ray_trainer.compute_advantage(data, adv_estimator="grpo", config=cfg)
