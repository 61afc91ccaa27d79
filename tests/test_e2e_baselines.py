"""The baselines that need verl's trainer to be tested: CDE's step schedule across a resume, and SimKO's loss
through verl's FSDP engine, in two trainer launches of their own (harness: tests/conftest.py).

The first launch trains steps 1 and 2 with ``algorithm.adv_estimator=cde`` and ``policy_loss.loss_mode=simko`` and
saves a checkpoint at step 2; the second resumes it in a new process and trains steps 3 and 4. An advantage
estimator and a policy loss are independent parts of verl's step; a checkpoint holds weights, optimizer and data
position, not the estimator. What it covers that no other test does:

- CDE reads the trainer's step, restored from the checkpoint: its bonus weight is ``w0`` at steps 1 to 3
  (``<= w_zero_after_step``) and 0 at step 4. An estimator that counted its own calls would be at its first and
  second call in the resumed process, with ``w0`` at both;
- SimKO's loss is found in verl's actor worker, the FSDP engine's top-K tensors reach it (the loss raises without
  them), with the paper configs' packed layout (``use_remove_padding``) and token-budget micro-batches
  (``use_dynamic_bsz``), and its diagnostics come back in verl's step metrics.

Covered elsewhere, without a trainer launch of their own: CoDaPO (and every estimator) through verl's
``compute_advantage`` at both call sites and the v1 trainer's ``_compute_advantage`` (tests/test_codapo.py,
tests/test_cde.py, tests/test_estimators_layout.py); GSPO is verl's own loss (its configs: tests/test_configs.py);
SimKO's gradient through the engine, in-process (tests/test_simko_engine.py); the SimKO setups refused in verl's
validate_config (tests/test_simko_engine.py), which main_ppo calls (tests/test_verl_integration.py).
"""

from __future__ import annotations

import math

import pytest

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1200)]

CDE_SIMKO = [
    "algorithm.adv_estimator=cde",
    "algorithm.norm_adv_by_std_in_grpo=true",
    "+algorithm.cde.w0=1.0",
    "+algorithm.cde.w_zero_after_step=3",
    "actor_rollout_ref.actor.policy_loss.loss_mode=simko",
    "+actor_rollout_ref.actor.policy_loss.simko.top_k=3",
    "+actor_rollout_ref.actor.policy_loss.simko.alpha=0.1",
    "+actor_rollout_ref.actor.policy_loss.simko.entropy_quantile=0.5",
    "actor_rollout_ref.actor.loss_agg_mode=seq-mean-token-mean",
    # the paper configs' layout: packed sequences, micro-batches by token budget (several per update)
    "actor_rollout_ref.model.use_remove_padding=true",
    "actor_rollout_ref.actor.use_dynamic_bsz=true",
    "actor_rollout_ref.actor.ppo_max_token_len_per_gpu=400",
    "actor_rollout_ref.rollout.log_prob_use_dynamic_bsz=true",
    "actor_rollout_ref.rollout.log_prob_max_token_len_per_gpu=400",
    "trainer.test_freq=-1",  # validation: tests/test_e2e_capo.py
]
#: the first launch: steps 1 and 2, a checkpoint at step 2
FIRST = ["trainer.total_training_steps=2", "trainer.save_freq=2", "trainer.resume_mode=disable"]
#: the second launch: resumes that checkpoint, steps 3 and 4
RESUMED = ["trainer.total_training_steps=4", "trainer.save_freq=-1", "trainer.resume_mode=auto"]

SIMKO_METRICS = (
    "forking_frac",
    "smoothed_frac",
    "penalized_frac",
    "top1_frac",
    "top1_prob_mean",
    "topk_prob_mass_mean",
    "entropy_threshold_mean",
)


def check_simko(step: int, data: dict) -> None:
    simko = {k.removeprefix("actor/simko/"): v for k, v in data.items() if k.startswith("actor/simko/")}
    for key in SIMKO_METRICS:
        assert key in simko and math.isfinite(simko[key]), (step, key, simko)
    # the 0.5 quantile of each response's entropies: at most half of the tokens are above it
    assert 0.2 < simko["forking_frac"] <= 0.5, (step, simko)
    assert simko["smoothed_frac"] + simko["penalized_frac"] <= simko["forking_frac"] + 1e-6, (step, simko)
    assert 0.0 < simko["top1_prob_mean"] <= simko["topk_prob_mass_mean"] <= 1.0, (step, simko)


def test_cde_schedule_continues_across_a_resume_and_simko_trains_through_the_fsdp_engine(run_verl, tmp_path):
    ckpt = f"trainer.default_local_dir={tmp_path / 'ckpt'}"  # shared by both launches
    first = run_verl(tmp_path / "cde_simko", [*CDE_SIMKO, *FIRST, ckpt])
    first.assert_ok()
    assert (tmp_path / "ckpt" / "latest_checkpointed_iteration.txt").read_text().strip() == "2"
    run = run_verl(tmp_path / "cde_simko_resumed", [*CDE_SIMKO, *RESUMED, ckpt])
    run.assert_ok()
    assert sorted(s for s, d in first.steps.items() if "actor/pg_loss" in d) == [1, 2], sorted(first.steps)
    assert sorted(s for s, d in run.steps.items() if "actor/pg_loss" in d) == [3, 4], sorted(run.steps)
    steps = {**first.steps, **run.steps}
    for step, w in ((1, 1.0), (2, 1.0), (3, 1.0), (4, 0.0)):
        data = steps[step]
        assert data["cde/w"] == w, (step, data["cde/w"])
        assert 0.0 <= data["cde/bonus_cap_frac"] <= 1.0
        if w:
            assert data["cde/bonus_mean"] > 0
            assert 0.0 < data["cde/shaped_bonus_mean"] <= 1.0 / 3.0 + 1e-6  # w * min(1/kappa, B), w = 1, kappa = 3
        for key in ("capo/mixed_group_frac", "capo/adv_abs_mean"):
            assert key in data and math.isfinite(data[key]), (step, key)
        # AUC-mean is defined on mixed groups only: logged when the step has one, left out when it has none
        # (4 groups of 4 from the tiny model: a step without a mixed group happens)
        if data["capo/mixed_group_frac"] > 0:
            assert 0.0 <= data["capo/auc_mean"] <= 1.0, (step, data["capo/auc_mean"])
        else:
            assert "capo/auc_mean" not in data, (step, data["capo/auc_mean"])
        assert math.isfinite(data["actor/pg_loss"]) and data["actor/grad_norm"] > 0
        check_simko(step, data)
    # a mixed group gives smoothed tokens (correct responses with A > 0). The parity reward is right for about half
    # of the responses, so a group of 4 is mixed with probability ~7/8 and a step of 4 groups has none with
    # probability ~2e-4: 4 steps without one mean the reward or the grouping broke, not bad luck
    mixed = [step for step in sorted(steps) if steps[step]["capo/mixed_group_frac"] > 0]
    assert mixed, f"no step with a mixed group: SimKO's smoothing is untested; {steps}"
    assert any(steps[step]["actor/simko/smoothed_frac"] > 0 for step in mixed), steps
