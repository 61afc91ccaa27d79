"""capo/* metrics reach the step metrics of verl's real v1 trainer (`PPOTrainer._compute_advantage`).

The batch goes through a real TransferQueue on a local Ray instance, exactly as in a training step:
fields stored per sample as jagged tensors, read back, advantages written back.
"""

import math
from types import SimpleNamespace

import numpy as np
import pytest
import torch
import verl  # noqa: F401  (loads the capo-verl plugin)
from omegaconf import OmegaConf


def put_batch(tq, rng, n_prompts=3, n=4, partition="train"):
    from verl.utils.tensordict_utils import list_of_dict_to_tensordict

    keys, fields = [], []
    for p in range(n_prompts):
        for s in range(n):
            length = int(rng.integers(2, 9))
            correct = bool(rng.random() < 0.5) if s > 1 else bool(s)  # every group mixed
            rm = torch.zeros(length)
            rm[-1] = float(correct)
            keys.append(f"prompt{p}_{s}_0")
            fields.append(
                {
                    "uid": f"prompt{p}",
                    "response_mask": torch.ones(length, dtype=torch.int64),
                    "rm_scores": rm,
                    "old_log_probs": torch.from_numpy(rng.normal(-1, 0.5, length)).float(),
                    "ref_log_prob": torch.from_numpy(rng.normal(-0.5, 0.3, length)).float(),
                }
            )
    return tq.kv_batch_put(keys=keys, partition_id=partition, fields=list_of_dict_to_tensordict(fields)), fields


def trainer_stub(adv_estimator, **capo):
    """The one attribute `PPOTrainer._compute_advantage` reads from the trainer: its config."""
    config = OmegaConf.create(
        {
            "algorithm": {
                "adv_estimator": adv_estimator,
                "use_kl_in_reward": False,
                "gamma": 1.0,
                "lam": 1.0,
                "norm_adv_by_std_in_grpo": True,
                "capo": capo,
            },
            "actor_rollout_ref": {"rollout": {"n": 4}},
        }
    )
    return SimpleNamespace(config=config)


def test_capo_metrics_reach_v1_step_metrics(transfer_queue):
    from verl.trainer.ppo.v1.trainer_base import PPOTrainer

    tq = transfer_queue
    rng = np.random.default_rng(0)
    batch, fields = put_batch(tq, rng)
    metrics: dict = {}
    out = PPOTrainer._compute_advantage(trainer_stub("capo", tau=0.6), batch, metrics)

    for key in (
        "capo/auc_mean",
        "capo/mixed_group_frac",
        "capo/lpm_correct_mean",
        "capo/lpm_incorrect_mean",
        "capo/mask_frac_correct",
        "capo/mask_frac_incorrect",
        "capo/ref_ppl_correct_q75",
        "capo/ref_ppl_incorrect_q25",
        "capo/adv_abs_mean",
    ):
        assert key in metrics and math.isfinite(metrics[key]), key
    assert metrics["capo/mixed_group_frac"] == 1.0

    # the advantages written back to TransferQueue are the estimator's, per sample
    adv = tq.kv_batch_get(keys=out.keys, partition_id=out.partition_id, select_fields=["advantages"])["advantages"]
    lpm = np.array([f["old_log_probs"].mean().item() for f in fields])
    correct = np.array([f["rm_scores"].sum().item() > 0.5 for f in fields])
    for i, f in enumerate(fields):
        row = adv[i]
        assert row.shape == f["response_mask"].shape
        assert torch.allclose(row, row[0].expand_as(row))
        assert (row[0] >= 0) if correct[i] else (row[0] <= 0)
    # AUC-mean by hand: per group, the fraction of (correct, incorrect) pairs ranked right
    aucs = []
    for k in range(3):
        s = slice(4 * k, 4 * k + 4)
        pos, neg = lpm[s][correct[s]], lpm[s][~correct[s]]
        aucs.append(np.mean([(p > q) + 0.5 * (p == q) for p in pos for q in neg]))
    assert metrics["capo/auc_mean"] == pytest.approx(np.mean(aucs))


def test_grpo_step_logs_batch_calibration_metrics(transfer_queue):
    """capo/* calibration metrics are logged for verl's own estimators too, from the batch; no mask metrics."""
    from verl.trainer.ppo.v1.trainer_base import PPOTrainer

    batch, fields = put_batch(transfer_queue, np.random.default_rng(1))
    metrics: dict = {}
    PPOTrainer._compute_advantage(trainer_stub("grpo"), batch, metrics)
    lpm = np.array([f["old_log_probs"].mean().item() for f in fields])
    correct = np.array([f["rm_scores"].sum().item() > 0.5 for f in fields])
    aucs = []
    for k in range(3):
        s = slice(4 * k, 4 * k + 4)
        pos, neg = lpm[s][correct[s]], lpm[s][~correct[s]]
        if len(pos) and len(neg):
            aucs.append(np.mean([(p > q) + 0.5 * (p == q) for p in pos for q in neg]))
    assert aucs, "the fixture should have mixed groups"
    assert metrics["capo/auc_mean"] == pytest.approx(np.mean(aucs))
    assert metrics["capo/mixed_group_frac"] == pytest.approx(len(aucs) / 3)
    assert metrics["capo/lpm_correct_mean"] == pytest.approx(lpm[correct].mean(), rel=1e-5)
    assert metrics["capo/adv_abs_mean"] > 0
    assert not [k for k in metrics if k.startswith("capo/mask_frac") or k.startswith("capo/ref_ppl")]
    # the mean advantage of the correct and of the incorrect responses, by hand: GRPO's (R - mean) / (std + 1e-6)
    # per group (sample std, verl's core_algos.compute_grpo_outcome_advantage)
    score = correct.astype(np.float64).reshape(3, 4)
    adv = ((score - score.mean(1, keepdims=True)) / (score.std(1, ddof=1, keepdims=True) + 1e-6)).reshape(-1)
    assert metrics["capo/adv_mean_correct"] == pytest.approx(adv[correct].mean(), rel=1e-5)
    assert metrics["capo/adv_mean_incorrect"] == pytest.approx(adv[~correct].mean(), rel=1e-5)
