"""The baselines that need verl's trainer to be tested: CDE's step schedule across a resume, and SimKO's loss
through verl's FSDP engine, in one run of two launches (harness: tests/conftest.py).

One configuration trains with ``algorithm.adv_estimator=cde`` and ``policy_loss.loss_mode=simko`` (an advantage
estimator and a policy loss: independent parts of verl's step) for 2 steps and saves a checkpoint; a second
process resumes from it and trains step 3. What it covers that no other test does:

- CDE reads the trainer's step: its bonus weight is ``w0`` up to ``w_zero_after_step`` and 0 after it, also in a
  process that resumed from a checkpoint (an estimator counting its own calls would restart at ``w0``);
- SimKO's loss is found in verl's actor worker, the FSDP engine's top-K tensors reach it (the loss raises without
  them), with the paper configs' packed layout (``use_remove_padding``) and token-budget micro-batches
  (``use_dynamic_bsz``), and its diagnostics come back in verl's step metrics.

Covered elsewhere, without a trainer run: CoDaPO (and every estimator) through verl's ``compute_advantage`` at
both call sites and the v1 trainer's ``_compute_advantage`` (tests/test_codapo.py, tests/test_cde.py,
tests/test_estimators_layout.py); GSPO is verl's own loss (its configs in tests/test_configs.py); SimKO's gradient
through the engine, in-process (tests/test_simko_engine.py).
"""

from __future__ import annotations

import math

import pytest

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1200)]

CDE_SIMKO = [
    "algorithm.adv_estimator=cde", "algorithm.norm_adv_by_std_in_grpo=true",
    "+algorithm.cde.w0=1.0", "+algorithm.cde.w_zero_after_step=2",
    "actor_rollout_ref.actor.policy_loss.loss_mode=simko",
    "+actor_rollout_ref.actor.policy_loss.simko.top_k=3",
    "+actor_rollout_ref.actor.policy_loss.simko.alpha=0.1",
    "+actor_rollout_ref.actor.policy_loss.simko.entropy_quantile=0.5",
    "actor_rollout_ref.actor.loss_agg_mode=seq-mean-token-mean",
    # the paper configs' layout: packed sequences, micro-batches by token budget (several per update)
    "actor_rollout_ref.model.use_remove_padding=true",
    "actor_rollout_ref.actor.use_dynamic_bsz=true", "actor_rollout_ref.actor.ppo_max_token_len_per_gpu=400",
    "actor_rollout_ref.rollout.log_prob_use_dynamic_bsz=true",
    "actor_rollout_ref.rollout.log_prob_max_token_len_per_gpu=400",
    "trainer.test_freq=-1",  # validation: tests/test_e2e_capo.py
]

SIMKO_METRICS = ("forking_frac", "smoothed_frac", "penalized_frac", "top1_frac", "top1_prob_mean",
                 "topk_prob_mass_mean", "entropy_threshold_mean")


def check_simko(step: int, data: dict) -> None:
    simko = {k.removeprefix("actor/simko/"): v for k, v in data.items() if k.startswith("actor/simko/")}
    for key in SIMKO_METRICS:
        assert key in simko and math.isfinite(simko[key]), (step, key, simko)
    # the 0.5 quantile of each response's entropies: at most half of the tokens are above it
    assert 0.2 < simko["forking_frac"] <= 0.5, (step, simko)
    assert simko["smoothed_frac"] + simko["penalized_frac"] <= simko["forking_frac"] + 1e-6, (step, simko)
    assert 0.0 < simko["top1_prob_mean"] <= simko["topk_prob_mass_mean"] <= 1.0, (step, simko)


def check_cde(step: int, data: dict, w: float) -> None:
    assert data["cde/w"] == w, (step, data["cde/w"])
    assert 0.0 <= data["cde/bonus_cap_frac"] <= 1.0
    if w:
        assert data["cde/bonus_mean"] > 0
        assert 0.0 < data["cde/shaped_bonus_mean"] <= 1.0 / 3.0 + 1e-6  # w * min(1/kappa, B), w = 1, kappa = 3
    for key in ("capo/auc_mean", "capo/mixed_group_frac", "capo/adv_abs_mean"):
        assert key in data and math.isfinite(data[key]), (step, key)
    assert math.isfinite(data["actor/pg_loss"]) and data["actor/grad_norm"] > 0


def test_cde_schedule_continues_across_a_resume_and_simko_trains_through_the_fsdp_engine(run_verl, tmp_path):
    first = run_verl(tmp_path / "cde_simko", [*CDE_SIMKO, "trainer.save_freq=2"])
    first.assert_ok()
    assert sorted(first.steps) == [1, 2], sorted(first.steps)
    for step, data in first.steps.items():
        check_cde(step, data, w=1.0)  # steps 1 and 2 <= w_zero_after_step
        check_simko(step, data)
    # a mixed group in one of the two steps gives smoothed tokens (correct responses with A > 0)
    assert any(data["actor/simko/smoothed_frac"] > 0 for data in first.steps.values()), first.steps
    ckpt = tmp_path / "cde_simko" / "ckpt"
    assert (ckpt / "latest_checkpointed_iteration.txt").read_text().strip() == "2"

    # A new process resumes from global_step_2 and trains step 3, where the bonus is off.
    resumed = run_verl(tmp_path / "cde_simko_resumed", [
        *CDE_SIMKO, "trainer.total_training_steps=3", "trainer.resume_mode=auto", f"trainer.default_local_dir={ckpt}",
    ])
    resumed.assert_ok()
    trained = sorted(step for step, data in resumed.steps.items() if "actor/pg_loss" in data)
    assert trained == [3], sorted(resumed.steps)
    check_cde(3, resumed.steps[3], w=0.0)
    check_simko(3, resumed.steps[3])
