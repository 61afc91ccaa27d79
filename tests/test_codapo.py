"""The ``codapo`` estimator against hand computations, against an independent transcription of the authors' code
(tmlr-group/CoDaPO ``compute_codapo_advantage``) through verl's real ``compute_advantage`` (legacy and v1 call
sites), and its limits, switches and errors."""

from __future__ import annotations

import math
from collections import defaultdict

import numpy as np
import pytest
import torch
import verl  # noqa: F401  (loads the capo-verl plugin: registers the estimators)
from omegaconf import OmegaConf
from verl.trainer.ppo import ray_trainer
from verl.trainer.ppo.v1 import utils as v1_utils

from capo_verl.compat.advantage import pop_step_metrics
from capo_verl.estimators.codapo import CodapoConfig, compute_codapo_outcome_advantage


def codapo(rew, mask, index, lp, **cfg):
    norm = cfg.pop("norm_adv_by_std_in_grpo", True)
    config = {"codapo": cfg, "norm_adv_by_std_in_grpo": norm}
    adv, ret = compute_codapo_outcome_advantage(rew, mask, np.asarray(index, dtype=object), config, old_log_probs=lp)
    assert adv is ret and adv.dtype == torch.float32
    return adv


def test_hand_computed_two_interleaved_groups(constant_batch, seq):
    # group a: R = 1, 1, 0, 0; lpm -0.1, -0.3, -0.5, -0.7 -> p = 1/2, 4p(1-p) = 1, c = exp(-0.4)
    # group b: R = 1, 0, 0;    lpm -1, -2, -3           -> p = 1/3, 4p(1-p) = 8/9, c = exp(-2)
    index = ["a", "b", "a", "b", "a", "b", "a"]
    rewards = [1, 1, 1, 0, 0, 0, 0]
    lpms = [-0.1, -1.0, -0.3, -2.0, -0.5, -3.0, -0.7]
    rew, mask, lp = constant_batch(lpms, rewards)
    got = seq(codapo(rew, mask, index, lp), mask)

    std = math.sqrt(1 / 3)  # unbiased std of (1, 1, 0, 0) and of (1, 0, 0): both sqrt(1/3)
    w_a = math.exp(-0.4) * 1.0 + 0.1
    w_b = math.exp(-2.0) * 8 / 9 + 0.1
    a_a = lambda r: (r - 0.5) / (std + 1e-6) * w_a  # noqa: E731
    a_b = lambda r: (r - 1 / 3) / (std + 1e-6) * w_b  # noqa: E731
    expected = [a_a(1), a_b(1), a_a(1), a_b(0), a_a(0), a_b(0), a_a(0)]
    np.testing.assert_allclose(got, expected, rtol=1e-6)

    metrics = pop_step_metrics()
    assert metrics["codapo/weight_mean"] == pytest.approx((w_a + w_b) / 2, rel=1e-6)
    assert metrics["codapo/weight_max"] == pytest.approx(w_a, rel=1e-6)
    assert metrics["codapo/confidence_mean"] == pytest.approx((math.exp(-0.4) + math.exp(-2)) / 2, rel=1e-6)
    assert metrics["codapo/difficulty_weight_mean"] == pytest.approx((1 + 8 / 9) / 2, rel=1e-6)
    # the capo/* calibration metrics of the batch: group a ranks both right answers above both wrong ones
    assert metrics["capo/auc_mean"] == pytest.approx(1.0) and metrics["capo/mixed_group_frac"] == 1.0


def test_without_std_normalisation_it_is_dr_grpo_times_the_weight(constant_batch, seq):
    index, rewards, lpms = ["q"] * 4, [1, 0, 0, 0], [-0.2, -0.4, -0.6, -0.8]
    rew, mask, lp = constant_batch(lpms, rewards)
    got = seq(codapo(rew, mask, index, lp, norm_adv_by_std_in_grpo=False), mask)
    w = math.exp(-0.5) * 4 * 0.25 * 0.75 + 0.1
    np.testing.assert_allclose(got, [(1 - 0.25) * w, -0.25 * w, -0.25 * w, -0.25 * w], rtol=1e-6)


def test_groups_all_right_or_all_wrong_give_zero(constant_batch, seq):
    index = ["right"] * 3 + ["wrong"] * 4 + ["lone"]
    rew, mask, lp = constant_batch([-0.1] * 8, [1, 1, 1, 0, 0, 0, 0, 1])
    for norm in (True, False):
        adv = codapo(rew, mask, index, lp, norm_adv_by_std_in_grpo=norm)
        if norm:
            assert torch.all(adv[:7] == 0)
            # a lone response: GRPO's mean 0 and std 1 (as verl), weight = offset since 4p(1-p) = 0
            np.testing.assert_allclose(seq(adv, mask)[7], 1 / (1 + 1e-6) * 0.1, rtol=1e-6)
        else:
            assert torch.all(adv[:7] == 0)


def test_weight_offset_and_threshold_come_from_the_config(constant_batch, seq):
    index, rewards, lpms = ["q"] * 4, [0.7, 0.7, 0.2, 0.2], [-0.2, -0.4, -0.6, -0.8]
    rew, mask, lp = constant_batch(lpms, rewards)
    # rewards 0.7 count as correct with the default threshold 0.5 (the authors' code counts only R == 1.0)
    a = seq(codapo(rew, mask, index, lp), mask)
    w = math.exp(-0.5) * 1.0 + 0.1
    std = float(torch.tensor(rewards).std())
    np.testing.assert_allclose(a, (np.array(rewards) - 0.45) / (std + 1e-6) * w, rtol=1e-5)
    # with a threshold above 0.7 no response is correct: p = 0, weight = offset
    b = seq(codapo(rew, mask, index, lp, reward_threshold=0.8, weight_offset=0.25), mask)
    np.testing.assert_allclose(b, (np.array(rewards) - 0.45) / (std + 1e-6) * 0.25, rtol=1e-5)


# --- against the authors' code, transcribed independently, through verl's compute_advantage ----------------------
def authors_codapo(rewards, mask, log_probs, index, norm_by_std=True, weight_offset=0.1, threshold=0.5):
    """tmlr-group/CoDaPO compute_codapo_advantage, loop for loop (Python floats), with `R > threshold` as correct."""
    scores = rewards.sum(-1).double()
    bs = len(scores)
    resp_lp = {}
    for i in range(bs):
        n = mask[i].sum().item()
        resp_lp[i] = (log_probs[i].double() * mask[i]).sum().item() / n if n > 0 else 0.0
    members = defaultdict(list)
    for i in range(bs):
        members[index[i]].append(i)
    out = np.zeros(bs)
    for rows in members.values():
        s = torch.stack([scores[i] for i in rows])
        mean, std = (torch.tensor(0.0), torch.tensor(1.0)) if len(rows) == 1 else (s.mean(), s.std())
        acc = sum(float(scores[i]) > threshold for i in rows) / len(rows)
        d = 1 - acc
        d_weight = 1 - 4 * (d - 0.5) ** 2
        c = math.exp(sum(resp_lp[i] for i in rows) / len(rows))
        weight = c * d_weight + weight_offset
        for i in rows:
            a = (scores[i] - mean) / (std + 1e-6) if norm_by_std else scores[i] - mean
            out[i] = float(a) * weight
    return out


#: the old log-probs of the random batches (tests/conftest.py's make_random_dataproto): mean, std, clamped at 0 (a
#: log-prob is <= 0: the estimators refuse a response whose mean is above it)
OLD = (-0.8, 0.5, True)


@pytest.mark.parametrize("norm_by_std", [True, False])
@pytest.mark.parametrize("reward_kind", ["binary", "pm1"])
def test_matches_authors_code_through_both_verl_call_sites(random_dataproto, norm_by_std, reward_kind, seq):
    for seed in range(8):
        data = random_dataproto(seed, reward_kind, old_log_probs=OLD)
        cfg = OmegaConf.create(
            {
                "adv_estimator": "codapo",
                "gamma": 1.0,
                "lam": 1.0,
                "norm_adv_by_std_in_grpo": norm_by_std,
                "codapo": {"weight_offset": 0.1, "reward_threshold": 0.5},
            }
        )
        b = data.batch
        expected = authors_codapo(
            b["token_level_rewards"], b["response_mask"], b["old_log_probs"], data.non_tensor_batch["uid"], norm_by_std
        )
        # two separate batches (DataProto.select() without keys shares its TensorDict)
        legacy = ray_trainer.compute_advantage(data, adv_estimator="codapo", config=cfg)
        v1 = v1_utils.compute_advantage_for_multi_trajectories(
            random_dataproto(seed, reward_kind, old_log_probs=OLD),
            batch_keys=[],
            adv_estimator="codapo",
            config=cfg,
            num_repeat=4,
        )
        assert legacy.batch is not v1.batch
        for out in (legacy, v1):
            got = seq(out.batch["advantages"], b["response_mask"])
            np.testing.assert_allclose(got, expected, rtol=2e-5, atol=1e-6)
            assert torch.equal(out.batch["returns"], out.batch["advantages"])
        assert torch.equal(legacy.batch["advantages"], v1.batch["advantages"])
        metrics = pop_step_metrics()
        assert "codapo/weight_mean" in metrics and "capo/mixed_group_frac" in metrics


def test_uses_rollout_log_probs_only_without_old_log_probs(random_dataproto, seq):
    data = random_dataproto(3)
    cfg = OmegaConf.create({"adv_estimator": "codapo", "gamma": 1.0, "lam": 1.0})
    a = ray_trainer.compute_advantage(random_dataproto(3), adv_estimator="codapo", config=cfg).batch["advantages"]
    data.batch.pop("old_log_probs")
    b = ray_trainer.compute_advantage(data, adv_estimator="codapo", config=cfg)
    expected = authors_codapo(
        data.batch["token_level_rewards"],
        data.batch["response_mask"],
        data.batch["rollout_log_probs"],
        data.non_tensor_batch["uid"],
    )
    np.testing.assert_allclose(seq(b.batch["advantages"], data.batch["response_mask"]), expected, rtol=2e-5, atol=1e-6)
    assert not torch.equal(a, b.batch["advantages"])


# --- errors name the key and the fix (bad values of a composed config: tests/test_method_configs.py) ------------
def test_a_number_given_as_text_is_refused():
    """A YAML/Hydra value is parsed as a number already; a dict from code can still hold the text "0.1"."""
    with pytest.raises(ValueError, match=r"algorithm\.codapo\.weight_offset\b.*'0\.1'"):
        CodapoConfig.from_algorithm_config({"codapo": {"weight_offset": "0.1"}})


def test_missing_inputs_raise_named_errors(constant_batch):
    rew, mask, lp = constant_batch([-0.1, -0.2], [1, 0])
    idx = np.array(["q", "q"], dtype=object)
    with pytest.raises(ValueError, match="codapo needs the group id.*uid"):
        compute_codapo_outcome_advantage(rew, mask, None, None, old_log_probs=lp)
    with pytest.raises(ValueError, match="codapo needs per-token log-probs.*old_log_probs"):
        compute_codapo_outcome_advantage(rew, mask, idx, None)
    bad = lp.clone()
    bad[0, 1] = float("nan")
    with pytest.raises(ValueError, match="old_log_probs has NaN or inf"):
        compute_codapo_outcome_advantage(rew, mask, idx, None, old_log_probs=bad)
