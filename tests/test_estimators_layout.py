"""What the estimators share (capo_verl/estimators/common.py) and how verl calls them (capo_verl/compat/advantage.py):
every registered name is batch-aware in verl's registry, GRPO's group statistics equal verl's (to the last bit but
for a rare rounding of the std), and a group whose outcomes are all equal gets exactly 0 in every estimator, through
verl's real ``compute_advantage``."""

from __future__ import annotations

import zlib

import numpy as np
import pytest
import torch
import verl  # noqa: F401  (loads the capo-verl plugin: registers the estimators)
from omegaconf import OmegaConf
from verl import DataProto
from verl.trainer.ppo import core_algos, ray_trainer

from capo_verl.compat.advantage import ESTIMATORS, pop_step_metrics
from capo_verl.estimators.common import group_ids, grpo_group_advantages


def test_every_estimator_is_registered_with_its_declaration():
    assert set(ESTIMATORS) == {"capo", "grpo_mask", "codapo", "cde"}
    for name, spec in ESTIMATORS.items():
        registered = core_algos.get_adv_estimator_fn(name)
        assert registered.__wrapped__ is spec.fn and registered.spec is spec
    # registering again (a second plugin load in the same process) changes nothing
    from capo_verl.compat.advantage import _register_declared

    before = dict(core_algos.ADV_ESTIMATOR_REGISTRY)
    _register_declared(core_algos)
    assert core_algos.ADV_ESTIMATOR_REGISTRY == before


def _random_groups(rng, kind):
    sizes = rng.integers(1, 10, rng.integers(1, 12))  # ragged, with lone responses
    uids = np.concatenate([[f"u{g}"] * s for g, s in enumerate(sizes)])
    uids = np.array(uids[rng.permutation(len(uids))], dtype=object)  # interleaved
    bs = len(uids)
    if kind == "binary":
        scores = rng.integers(0, 2, bs).astype(np.float32)
    elif kind == "pm1_shaped":
        scores = np.where(rng.random(bs) < 0.5, 1.0, -1.0).astype(np.float32) + 0.3 * rng.random(bs).astype(np.float32)
    else:
        scores = rng.normal(size=bs).astype(np.float32)
    return uids, torch.from_numpy(scores)


@pytest.mark.parametrize("norm_by_std", [True, False])
@pytest.mark.parametrize("kind", ["binary", "pm1_shaped", "normal"])
def test_grpo_group_advantages_is_bitwise_verls_grpo(kind, norm_by_std):
    """Verl's GRPO in every group (constant 0/1 groups included: verl's mean of 0s or 1s is exact), bit for bit but
    for torch's batched ``std``, which can round its last bit differently from verl's per-group call (1 in ~6,000
    random groups, e.g. a group of two at -0.840 and -0.838, differs by 6e-8)."""
    rng = np.random.default_rng(zlib.crc32(f"{kind}-{norm_by_std}".encode()))  # hash() of a str varies per process
    mismatched = 0
    for _ in range(30):
        uids, scores = _random_groups(rng, kind)
        bs, T = len(uids), 4
        rewards = torch.zeros(bs, T)
        rewards[:, -1] = scores
        expected, _ = core_algos.compute_grpo_outcome_advantage(
            rewards, torch.ones(bs, T, dtype=torch.int64), uids, norm_adv_by_std_in_grpo=norm_by_std
        )
        gid, n_groups = group_ids(uids, bs)
        got = grpo_group_advantages(rewards.sum(-1), torch.from_numpy(gid), n_groups, norm_by_std)
        assert got.dtype == torch.float32
        torch.testing.assert_close(got, expected[:, 0], rtol=2.0**-22, atol=0.0)  # within two float32 roundings
        mismatched += int((got != expected[:, 0]).sum())
    assert mismatched <= 2  # of about 1,500 responses: bit-equal but for the rare std rounding


def test_grpo_group_advantages_by_hand():
    # group a: R = (1, 0, 0) -> mean 1/3, std (unbiased) sqrt(1/3); group b: lone response R = 1 -> mean 0, std 1
    scores = torch.tensor([1.0, 0.0, 1.0, 0.0])
    gid = torch.tensor([0, 0, 1, 0])
    std_a = (1 / 3) ** 0.5
    expected = [(1 - 1 / 3) / (std_a + 1e-6), -1 / 3 / (std_a + 1e-6), 1 / (1 + 1e-6), -1 / 3 / (std_a + 1e-6)]
    torch.testing.assert_close(grpo_group_advantages(scores, gid, 2), torch.tensor(expected), rtol=1e-6, atol=0)
    torch.testing.assert_close(
        grpo_group_advantages(scores, gid, 2, norm_by_std=False), torch.tensor([2 / 3, -1 / 3, 1.0, -1 / 3])
    )


# --- constant groups: exactly 0, in every estimator, through verl's compute_advantage --------------------------------
SIZES = (2, 3, 5, 7, 8, 16, 33)
OUTCOMES = (1.0, 0.0, 0.7, -1.0)  # right, wrong, a partial credit that is not a dyadic fraction, wrong on a +-1 scale


def constant_groups_batch(seed: int, lpm_range=(-2.0, -0.5)):
    """One group per (size, outcome) with every response's reward equal, plus one mixed group; all interleaved.

    Per-token log-probs are random in ``lpm_range`` (below -1/3: every CDE bonus is at its cap |R|/kappa, so CDE's
    shaped rewards are equal inside a group too); lengths and padding vary.
    """
    rng = np.random.default_rng(seed)
    uids, rewards = [], []
    for size in SIZES:
        for r in OUTCOMES:
            uids += [f"g{size}_{r}"] * size
            rewards += [r] * size
    uids += ["mixed"] * 4
    rewards += [1.0, 0.0, 1.0, 0.0]
    perm = rng.permutation(len(uids))
    uids, rewards = np.array(uids, dtype=object)[perm], np.array(rewards, dtype=np.float32)[perm]
    bs, T = len(uids), 9
    lengths = torch.from_numpy(rng.integers(1, T + 1, bs))
    mask = (torch.arange(T) < lengths.unsqueeze(1)).to(torch.int64)
    token_rewards = torch.zeros(bs, T)
    token_rewards[torch.arange(bs), lengths - 1] = torch.from_numpy(rewards)
    old = torch.from_numpy(rng.uniform(*lpm_range, (bs, T))).float() * mask
    ref = torch.from_numpy(rng.uniform(-1.2, -0.01, (bs, T))).float() * mask  # PPL_ref 1.01..3.3: mask active
    data = DataProto.from_dict(
        tensors={
            "token_level_rewards": token_rewards,
            "response_mask": mask,
            "old_log_probs": old,
            "ref_log_prob": ref,
        },
        non_tensors={"uid": uids},
    )
    return data, uids != "mixed"


@pytest.mark.parametrize("norm_by_std", [True, False])
@pytest.mark.parametrize("estimator", ["capo", "grpo_mask", "codapo", "cde"])
def test_constant_groups_get_exactly_zero(estimator, norm_by_std):
    config = OmegaConf.create(
        {
            "adv_estimator": estimator,
            "gamma": 1.0,
            "lam": 1.0,
            "norm_adv_by_std_in_grpo": norm_by_std,
            "capo": {"ref_high": 2.0, "ref_low": 1.5},
            "cde": {"w0": 1.0},
        }
    )
    for seed in range(3):
        data, constant = constant_groups_batch(seed)
        out = ray_trainer.compute_advantage(data, adv_estimator=estimator, config=config)
        adv = out.batch["advantages"]
        assert torch.equal(adv[torch.from_numpy(constant)], torch.zeros_like(adv[torch.from_numpy(constant)]))
        assert adv[torch.from_numpy(~constant)].abs().sum() > 0  # the mixed group still learns
    pop_step_metrics()


def test_verls_own_grpo_is_not_zero_on_a_constant_partial_credit_group():
    """The control for the test above: verl 0.9.1's float32 group mean of seven rewards 0.7 is off by one rounding,
    which its std of ~1e-8 turns into a uniform advantage of ~0.06."""
    rewards = torch.zeros(7, 3)
    rewards[:, -1] = 0.7
    adv, _ = core_algos.compute_grpo_outcome_advantage(rewards, torch.ones(7, 3), np.array(["q"] * 7, dtype=object))
    assert adv[:, -1].abs().min() > 0.01
    gid, n = group_ids(np.array(["q"] * 7, dtype=object), 7)
    assert torch.equal(grpo_group_advantages(rewards.sum(-1), torch.from_numpy(gid), n), torch.zeros(7))
