"""The ``cde`` estimator against hand computations and an independent implementation of CDE's Eqs. 1-2 through
verl's real ``compute_advantage`` (legacy and v1 call sites); w = 0 is verl's GRPO; the step schedule comes from
verl's trainer (``PPOTrainer._compute_advantage`` on a real TransferQueue), not from counting calls."""

from __future__ import annotations

import math
from types import SimpleNamespace

import numpy as np
import pytest
import torch
import verl  # noqa: F401  (loads the capo-verl plugin: registers the estimators)
from omegaconf import OmegaConf
from verl.trainer.ppo import ray_trainer
from verl.trainer.ppo.v1 import utils as v1_utils

from capo_verl.compat.advantage import pop_step_metrics
from capo_verl.estimators.cde import CdeConfig, cde_bonus_weight, compute_cde_outcome_advantage


def cde(rew, mask, index, lp, step=None, norm=True, **cfg):
    config = {"cde": cfg, "norm_adv_by_std_in_grpo": norm}
    adv, ret = compute_cde_outcome_advantage(
        rew, mask, np.asarray(index, dtype=object), config, old_log_probs=lp, global_step=step
    )
    assert adv is ret and adv.dtype == torch.float32
    return adv


def test_hand_computed_group_with_padding_and_a_second_group(constant_batch, seq):
    # group q: correct, correct, wrong, wrong with lpm -0.1, -0.6, -0.2, -0.9 -> B = 0.1, 0.6, 0.2, 0.9
    #   min(1/3, B) = 0.1, 1/3, 0.2, 1/3 -> R~ = 1.1, 4/3, -0.8, -2/3 (w = 1)
    # group r (interleaved, 0/1 rewards of 1 and 0): lpm -2, -0.05 -> R~ = 1 + 1/3, -1 + 0.05
    index = ["q", "r", "q", "q", "r", "q"]
    rewards = [1, 1, 1, 0, 0, 0]
    lpms = [-0.1, -2.0, -0.6, -0.2, -0.05, -0.9]
    rew, mask, lp = constant_batch(lpms, rewards, lengths=[6, 2, 4, 5, 3, 1])
    got = seq(cde(rew, mask, index, lp, w0=1.0), mask)

    rq = np.array([1.1, 4 / 3, -0.8, -2 / 3])
    aq = (rq - rq.mean()) / (rq.std(ddof=1) + 1e-6)
    rr = np.array([4 / 3, -0.95])
    ar = (rr - rr.mean()) / (rr.std(ddof=1) + 1e-6)
    np.testing.assert_allclose(got, [aq[0], ar[0], aq[1], aq[2], ar[1], aq[3]], rtol=1e-5)

    m = pop_step_metrics()
    assert m["cde/w"] == 1.0
    assert m["cde/bonus_mean"] == pytest.approx(np.mean([0.1, 2.0, 0.6, 0.2, 0.05, 0.9]), rel=1e-6)
    assert m["cde/bonus_correct_mean"] == pytest.approx(np.mean([0.1, 2.0, 0.6]), rel=1e-6)
    assert m["cde/bonus_cap_frac"] == pytest.approx(3 / 6)  # B = 2.0, 0.6, 0.9 exceed 1/3
    assert m["cde/shaped_bonus_mean"] == pytest.approx(np.mean([0.1, 1 / 3, 1 / 3, 0.2, 0.05, 1 / 3]), rel=1e-6)
    assert m["capo/mixed_group_frac"] == 1.0 and m["capo/auc_mean"] == pytest.approx((3 / 4 + 0) / 2)


def test_kappa_alpha_and_no_std(constant_batch, seq):
    index, rewards, lpms = ["q"] * 3, [1, 0, 0], [-0.3, -0.4, -1.2]
    rew, mask, lp = constant_batch(lpms, rewards, lengths=[6, 6, 6])
    got = seq(cde(rew, mask, index, lp, norm=False, w0=0.5, kappa=2.0, alpha=0.5), mask)
    # alpha B = 0.15, 0.2, 0.6 ; |R| / kappa = 0.5 -> bonus 0.15, 0.2, 0.5 (x w = 0.5)
    r = np.array([1 + 0.075, -1 + 0.1, -1 + 0.25])
    np.testing.assert_allclose(got, r - r.mean(), rtol=1e-6)


def test_staircase_schedule_follows_the_step_passed_in(constant_batch):
    assert [cde_bonus_weight(t, 0.7, 3) for t in (1, 3, 4, 100)] == [0.7, 0.7, 0.0, 0.0]
    assert cde_bonus_weight(10**6, 0.7, None) == 0.7
    index, rewards, lpms = ["q"] * 4, [1, 1, 0, 0], [-0.1, -0.6, -0.2, -0.9]
    rew, mask, lp = constant_batch(lpms, rewards, lengths=[6] * 4)
    on = cde(rew, mask, index, lp, step=3, w0=1.0, w_zero_after_step=3)
    assert pop_step_metrics()["cde/w"] == 1.0
    off = cde(rew, mask, index, lp, step=4, w0=1.0, w_zero_after_step=3)
    assert pop_step_metrics()["cde/w"] == 0.0
    assert torch.equal(on, cde(rew, mask, index, lp, w0=1.0))  # same as a constant weight before the drop
    assert torch.equal(off, cde(rew, mask, index, lp, w0=0.0))  # and as no bonus after it
    assert not torch.equal(on, off)


def test_a_schedule_without_the_step_is_an_error(constant_batch):
    rew, mask, lp = constant_batch([-0.1, -0.2], [1, 0], lengths=[6, 6])
    with pytest.raises(ValueError, match=r"\bcde\b.*algorithm\.cde\.w_zero_after_step=3\b.*\bv1 trainer\b"):
        cde(rew, mask, ["q", "q"], lp, w0=1.0, w_zero_after_step=3)


# --- independent implementation, random ragged shuffled batches, both verl call sites --------------------------
def reference_cde(rewards, mask, log_probs, index, w, kappa=3.0, alpha=1.0, norm_by_std=True, threshold=0.5):
    """Eqs. 1-2 of arXiv 2509.09675 per response and per group, float64, plain loops."""
    bs = rewards.shape[0]
    shaped = np.zeros(bs)
    for i in range(bs):
        n = int(mask[i].sum())
        lpm = float((log_probs[i].double() * mask[i]).sum()) / n if n else 0.0
        r = 1.0 if float(rewards[i].sum()) > threshold else -1.0
        shaped[i] = r + w * min(abs(r) / kappa, alpha * -lpm)
    out = np.zeros(bs)
    for uid in set(index):
        rows = [i for i in range(bs) if index[i] == uid]
        x = shaped[rows]
        mean, std = (0.0, 1.0) if len(rows) == 1 else (x.mean(), x.std(ddof=1))
        out[rows] = (x - mean) / (std + 1e-6) if norm_by_std else x - mean
    return out


#: the old log-probs of the random batches (tests/conftest.py's make_random_dataproto): mean, std, clamped at 0
OLD = (-0.5, 0.4, True)


def algo(norm_by_std=True, **cde_cfg):
    return OmegaConf.create(
        {"adv_estimator": "cde", "gamma": 1.0, "lam": 1.0, "norm_adv_by_std_in_grpo": norm_by_std, "cde": cde_cfg}
    )


@pytest.mark.parametrize("norm_by_std", [True, False])
@pytest.mark.parametrize("step, w", [(2, 0.8), (3, 0.0)])
def test_matches_the_paper_equations_through_both_verl_call_sites(random_dataproto, norm_by_std, step, w, seq):
    cfg = algo(norm_by_std, w0=0.8, w_zero_after_step=2)
    for seed in range(8):
        # the legacy trainer's way of passing the step: data.meta_info["global_steps"]
        data = random_dataproto(seed, step=step, old_log_probs=OLD)
        b = data.batch
        expected = reference_cde(
            b["token_level_rewards"],
            b["response_mask"],
            b["old_log_probs"],
            list(data.non_tensor_batch["uid"]),
            w,
            norm_by_std=norm_by_std,
        )
        legacy = ray_trainer.compute_advantage(data, adv_estimator="cde", config=cfg)
        v1 = v1_utils.compute_advantage_for_multi_trajectories(
            random_dataproto(seed, step=step, old_log_probs=OLD),
            batch_keys=[],
            adv_estimator="cde",
            config=cfg,
            num_repeat=4,
        )
        for out in (legacy, v1):
            np.testing.assert_allclose(seq(out.batch["advantages"], b["response_mask"]), expected, rtol=2e-5, atol=2e-6)
        assert torch.equal(legacy.batch["advantages"], v1.batch["advantages"])
        assert pop_step_metrics()["cde/w"] == w


@pytest.mark.parametrize("norm_by_std", [True, False])
def test_zero_weight_is_verls_grpo_exactly(random_dataproto, norm_by_std):
    for seed in range(8):
        cde_out = ray_trainer.compute_advantage(
            random_dataproto(seed, "signed", old_log_probs=OLD),
            adv_estimator="cde",
            config=algo(norm_by_std, w0=0.0),
        )
        grpo_out = ray_trainer.compute_advantage(
            random_dataproto(seed, "signed", old_log_probs=OLD),
            adv_estimator="grpo",
            norm_adv_by_std_in_grpo=norm_by_std,
            config=OmegaConf.create({"adv_estimator": "grpo", "norm_adv_by_std_in_grpo": norm_by_std}),
        )
        assert torch.equal(cde_out.batch["advantages"], grpo_out.batch["advantages"])
        # 0/1 rewards: CDE maps them to +-1 first, so GRPO's scale-free std-normalised advantage is unchanged
        # (up to the 1e-6 added to the std) and Dr. GRPO's doubles, in every group of two or more responses (a lone
        # response's GRPO advantage is its reward itself: -1 instead of 0 when wrong)
        data = random_dataproto(seed, old_log_probs=OLD)
        uids = data.non_tensor_batch["uid"]
        grouped = torch.from_numpy(np.array([(uids == u).sum() > 1 for u in uids]))
        cde01 = ray_trainer.compute_advantage(data, adv_estimator="cde", config=algo(norm_by_std, w0=0.0))
        cde01 = cde01.batch["advantages"][grouped]
        grpo01 = ray_trainer.compute_advantage(
            random_dataproto(seed, old_log_probs=OLD),
            adv_estimator="grpo",
            norm_adv_by_std_in_grpo=norm_by_std,
            config=OmegaConf.create({"adv_estimator": "grpo"}),
        ).batch["advantages"][grouped]
        torch.testing.assert_close(cde01, grpo01 if norm_by_std else 2 * grpo01, rtol=1e-5, atol=1e-5)


# --- the step comes from verl's v1 trainer ------------------------------------------------------------------------
def test_v1_trainer_passes_its_global_steps(transfer_queue):
    """PPOTrainer._compute_advantage hands the trainer's global_steps to cde: a trainer resumed at step 7 (verl's
    _load_checkpoint sets global_steps from the checkpoint folder) uses w_7, whatever the process saw before."""
    from verl.trainer.ppo.v1.trainer_base import PPOTrainer
    from verl.utils.tensordict_utils import list_of_dict_to_tensordict

    tq = transfer_queue
    rng = np.random.default_rng(0)
    fields, keys = [], []
    for p in range(3):
        for s in range(4):
            n = int(rng.integers(2, 9))
            rm = torch.zeros(n)
            rm[-1] = float(s % 2)
            keys.append(f"p{p}_{s}")
            fields.append(
                {
                    "uid": f"p{p}",
                    "response_mask": torch.ones(n, dtype=torch.int64),
                    "rm_scores": rm,
                    "old_log_probs": torch.from_numpy(rng.normal(-1, 0.5, n)).float().clamp(max=0),
                }
            )
    config = OmegaConf.create(
        {
            "algorithm": {
                "adv_estimator": "cde",
                "use_kl_in_reward": False,
                "gamma": 1.0,
                "lam": 1.0,
                "norm_adv_by_std_in_grpo": True,
                "cde": {"w0": 1.0, "w_zero_after_step": 6},
            },
            "actor_rollout_ref": {"rollout": {"n": 4}},
        }
    )
    seen = {}
    for step in (6, 7, 1):
        batch = tq.kv_batch_put(
            keys=[f"{k}_{step}" for k in keys], partition_id="train", fields=list_of_dict_to_tensordict(fields)
        )
        metrics: dict = {}
        out = PPOTrainer._compute_advantage(SimpleNamespace(config=config, global_steps=step), batch, metrics)
        seen[step] = metrics["cde/w"]
        assert "capo/auc_mean" in metrics and math.isfinite(metrics["capo/adv_abs_mean"])
        tq.kv_clear(keys=out.keys, partition_id=out.partition_id)
    assert seen == {6: 1.0, 7: 0.0, 1: 1.0}


# --- errors name the key and the fix (more bad values of a composed config: tests/test_method_configs.py) -------
@pytest.mark.parametrize(
    "section, match",
    [
        ({"w0": "1"}, "algorithm.cde.w0 must be a finite number"),
        ({"w_zero_after_step": -1}, "algorithm.cde.w_zero_after_step must be a non-negative integer"),
        ({"reward_threshold": None}, "algorithm.cde.reward_threshold must be a finite number"),
    ],
)
def test_bad_config(section, match):
    with pytest.raises(ValueError, match=match):
        CdeConfig.from_algorithm_config({"cde": section})


def test_missing_inputs_raise_named_errors(constant_batch):
    rew, mask, lp = constant_batch([-0.1, -0.2], [1, 0], lengths=[6, 6])
    idx = np.array(["q", "q"], dtype=object)
    with pytest.raises(ValueError, match="cde needs the group id.*uid"):
        compute_cde_outcome_advantage(rew, mask, None, None, old_log_probs=lp)
    with pytest.raises(ValueError, match="cde needs per-token log-probs.*old_log_probs"):
        compute_cde_outcome_advantage(rew, mask, idx, None)
    lp[1, 0] = float("inf")
    with pytest.raises(ValueError, match="old_log_probs has NaN or inf"):
        compute_cde_outcome_advantage(rew, mask, idx, None, old_log_probs=lp)
