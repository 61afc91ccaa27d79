"""Every registered estimator, and verl's ``grpo``, through verl's ``compute_advantage`` on CUDA against CPU float64.

As the trainer calls it: ``verl.trainer.ppo.ray_trainer.compute_advantage`` (the legacy trainer calls it, the v1
trainer imports it by name), wrapped by ``capo_verl.compat.advantage`` at ``import verl`` through the plugin's entry
point, on a ``DataProto`` with verl's keys at the advantage step. Batch: 128 prompts x 8 responses = 1,024
responses x 4,096 tokens (4.2M tokens), 0/1 outcome rewards, mixed and one-outcome groups, 15% of the responses
truncated, rows shuffled as verl's ``balance_batch`` does; reference perplexities spread across CAPO's noise-mask
thresholds, so the mask drops responses on both sides.

The CUDA run gets float32 inputs; the reference gets the same float32 values as float64 on the CPU, so any
difference is the device's and float32's, not the data's. verl's ``grpo`` computes in the inputs' dtype (float64 for
the reference); capo-verl's estimators accumulate in float32 by design (``capo_verl/estimators/common.py``), so for
them the reference is the CPU's float32 arithmetic on float64 inputs.

Tolerances:

- advantages: ``1e-4`` absolute. Every estimator reduces per response over at most 4,096 float32 log-probs
  (relative rounding about ``sqrt(4096) x 6e-8 = 4e-6``) and per group over 8 responses, then divides by a group
  std (``norm_adv_by_std_in_grpo``) or sums pairwise logistic terms of CAPO's order-1 size; the resulting errors
  are ~1e-5 at most: an NVIDIA H200 run gave 3e-5 for ``cde``, below 2e-6 for the others. 1e-4 is 3x that and
  still far below any advantage that matters (they are order 1).
- which responses are masked (zero advantage) and the sign of every response's advantage: exactly equal. A flip
  needs a per-response mean within float32 rounding (~1e-6 relative) of a mask threshold or of the group mean;
  with this data's continuous spread that has a probability of order 1e-3 per batch, and the H200 run had none.
- the step metrics capo-verl records (``capo/*`` calibration metrics, ``codapo/*``, ``cde/*``): ``1e-3``
  absolute; they are batch means of the same float32 per-response statistics.
"""

from __future__ import annotations

import uuid

import numpy as np
import pytest
import torch

pytestmark = pytest.mark.gpu

DEVICE = "cuda"
N_PROMPTS, N_RESPONSES, RESPONSE_LENGTH = 128, 8, 4096  # 1,024 responses x 4,096 tokens
ADV_ATOL = 1e-4
METRIC_ATOL = 1e-3
CAPO = {"tau": 0.6, "ref_high": 2.5, "ref_low": 1.05, "use_mask": True, "normalize": "none", "reward_threshold": 0.5}


def advantage_batch(n_prompts: int, n_responses: int, length: int, seed: int = 1) -> dict:
    """verl's batch at the advantage step, float64 on the CPU: ``token_level_rewards`` (0/1 at the last valid
    token), ``response_mask`` (int64, right padding), ``old_log_probs`` / ``rollout_log_probs`` / ``ref_log_prob``
    (nats, <= 0), ``uid`` (object array, one uuid per prompt repeated ``n_responses`` times), rows shuffled."""
    g = torch.Generator().manual_seed(seed)
    bs = n_prompts * n_responses

    def rand(*shape):
        return torch.rand(*shape, generator=g, dtype=torch.float64)

    lengths = (length / 16 + rand(bs) * (length - length / 16)).long().clamp(1, length)
    lengths = torch.where(rand(bs) < 0.15, torch.full_like(lengths, length), lengths)
    mask = (torch.arange(length)[None, :] < lengths[:, None]).to(torch.int64)
    p = rand(n_prompts)
    p = torch.where(rand(n_prompts) < 0.2, (p > 0.5).double(), p)  # some all-correct / all-wrong groups
    correct = rand(bs) < p.repeat_interleave(n_responses)
    rewards = torch.zeros(bs, length, dtype=torch.float64)
    rewards[torch.arange(bs), lengths - 1] = correct.double()
    # per-response mean log-probs mu (behaviour) and nu (reference): reference PPL from ~1.005 to ~3.3, across
    # CAPO's mask thresholds (1.05 and 2.5)
    mu = -(0.05 + 1.45 * rand(bs))
    old = mu[:, None] * (1.0 + 0.5 * torch.randn(bs, length, generator=g, dtype=torch.float64)).clamp(min=0.0)
    rollout = (old + 0.01 * torch.randn(bs, length, generator=g, dtype=torch.float64)).clamp(max=0.0)
    nu = -(0.005 + 1.2 * rand(bs) ** 2)
    ref = nu[:, None] * (1.0 + 0.3 * torch.randn(bs, length, generator=g, dtype=torch.float64)).clamp(min=0.0)
    perm = torch.randperm(bs, generator=g)
    uids = np.repeat(
        np.array([str(uuid.UUID(int=seed * 2**64 + i)) for i in range(n_prompts)], dtype=object), n_responses
    )
    return {
        "token_level_rewards": rewards[perm],
        "response_mask": mask[perm],
        "old_log_probs": old[perm],
        "rollout_log_probs": rollout[perm],
        "ref_log_prob": ref[perm],
        "uid": uids[perm.numpy()],
    }


@pytest.fixture(scope="module")
def batches():
    """``(cuda, reference)``: float32 on CUDA, and the same values as float64 on the CPU."""
    batch = advantage_batch(N_PROMPTS, N_RESPONSES, RESPONSE_LENGTH)
    cuda, ref = {"uid": batch["uid"]}, {"uid": batch["uid"]}
    for key, value in batch.items():
        if key == "uid":
            continue
        if value.is_floating_point():
            value = value.to(torch.float32)
            ref[key] = value.to(torch.float64)
        else:
            ref[key] = value
        cuda[key] = value.to(DEVICE)
    return cuda, ref


def estimator_names() -> list[str]:
    from capo_verl.compat.methods import ESTIMATORS

    return ["grpo", *ESTIMATORS]


def run_compute_advantage(name: str, batch: dict):
    """verl's compute_advantage as the trainer calls it; returns ``(advantages, returns, step metrics)``."""
    from omegaconf import OmegaConf
    from verl import DataProto
    from verl.trainer.ppo import ray_trainer

    from capo_verl.estimators.common import pop_step_metrics

    assert getattr(ray_trainer.compute_advantage, "__wrapped_by_capo_verl__", False), "capo's wrapper not installed"
    config = OmegaConf.create(
        {"adv_estimator": name, "gamma": 1.0, "lam": 1.0, "norm_adv_by_std_in_grpo": True, "capo": dict(CAPO)}
    )
    tensors = {k: v for k, v in batch.items() if k != "uid"}
    data = DataProto.from_dict(tensors=tensors, non_tensors={"uid": batch["uid"]}, meta_info={"global_steps": 1})
    pop_step_metrics()
    out = ray_trainer.compute_advantage(
        data,
        adv_estimator=name,
        gamma=1.0,
        lam=1.0,
        num_repeat=N_RESPONSES,
        norm_adv_by_std_in_grpo=True,
        config=config,
    )
    return out.batch["advantages"], out.batch["returns"], pop_step_metrics()


def test_every_registered_estimator_is_in_verls_registry():
    import verl  # noqa: F401  (loads the plugin through its entry point, as a run does)
    from verl.trainer.ppo import core_algos

    from capo_verl import compat

    assert compat.patching.INSTALL_ERROR is None
    for name in estimator_names():
        assert name in core_algos.ADV_ESTIMATOR_REGISTRY, name


@pytest.mark.parametrize("name", estimator_names())
def test_estimator_on_cuda_matches_cpu_float64(batches, name, record_property):
    cuda, ref = batches
    adv, returns, metrics = run_compute_advantage(name, cuda)
    adv_ref, _, metrics_ref = run_compute_advantage(name, ref)
    assert adv.device.type == DEVICE and returns.device.type == DEVICE
    assert adv.dtype == torch.float32 and adv.shape == (N_PROMPTS * N_RESPONSES, RESPONSE_LENGTH)
    got = adv.double().cpu()
    mask = ref["response_mask"].bool()
    assert torch.isfinite(got).all()
    assert (got[~mask] == 0).all(), "nonzero advantage on padding"
    diff = (got - adv_ref).abs()
    record_property("measured:advantages_max_abs_diff", diff.max().item())  # junit xml: read by device_record.py
    record_property("tolerance:advantages_max_abs_diff", ADV_ATOL)
    assert diff.max().item() <= ADV_ATOL, f"{name}: max |CUDA - CPU float64| = {diff.max().item():.3g}"
    # outcome estimators give one advantage per response: compare masks and signs per row
    row = torch.where(mask, got, torch.nan).nanmean(-1)
    row_ref = torch.where(mask, adv_ref, torch.nan).nanmean(-1)
    zero, zero_ref = got.abs().amax(-1) == 0, adv_ref.abs().amax(-1) <= 1e-12
    assert torch.equal(zero, zero_ref), f"{name}: {int((zero != zero_ref).sum())} responses masked on one side only"
    clear = row_ref.abs() > ADV_ATOL
    assert torch.equal(row[clear].sign(), row_ref[clear].sign()), f"{name}: an advantage's sign flipped"
    assert set(metrics) == set(metrics_ref)
    worst = max((abs(v - metrics_ref[k]) for k, v in metrics.items() if isinstance(v, float) and not np.isnan(v)),
                default=0.0)  # fmt: skip
    record_property("measured:step_metrics_max_abs_diff", worst)
    record_property("tolerance:step_metrics_max_abs_diff", METRIC_ATOL)
    for key, value in metrics.items():
        if isinstance(value, float) and np.isnan(value):
            assert np.isnan(metrics_ref[key]), key
            continue
        assert abs(value - metrics_ref[key]) <= METRIC_ATOL, f"{key}: {value} vs {metrics_ref[key]}"
    if name in ("capo", "grpo_mask"):  # the noise mask acted on both sides
        assert 0 < metrics["capo/mask_frac_correct"] < 1 and 0 < metrics["capo/mask_frac_incorrect"] < 1
