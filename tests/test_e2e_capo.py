"""CAPO end to end: ``python -m verl.trainer.main_ppo`` with ``algorithm.adv_estimator=capo`` on the CPU profile.

The one trainer run of CAPO itself (the ``capo_run`` fixture of tests/conftest.py: 2 steps, a validation pass and a
checkpoint at step 2). What it covers that no other test does:

- the plugin loads inside Ray's TaskRunner and workers: verl trains with ``adv_estimator=capo`` and the noise mask
  switches the reference pass on, without any KL term;
- ``capo/*`` batch metrics (mask included) come back in verl's step metrics;
- a real validation pass through verl's ``_validate`` logs ``val-calib/<source>/...`` next to ``val-core``, and
  the logged AUC-mean is the per-question AUC of the dumped validation responses (``trainer.validation_data_dir``,
  read with ``capo-verl compare``'s reader): the rollout's log-probs reach the metric, grouped by question;
- verl's vLLM rollout generates with the actor's weights: it starts from random weights (``load_format: dummy``)
  and only the trainer's weight syncs can make its token probabilities follow the actor's;
- nothing is left in ``/dev/shm`` after the run.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from sklearn.metrics import roc_auc_score

from capo_verl.compare.report import read_validation_pass
from capo_verl.data import GSM8K_CALC_SOURCE

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

SOURCE = GSM8K_CALC_SOURCE


def test_capo_trains_with_the_reference_pass_and_no_kl(capo_run):
    capo_run.assert_ok()
    steps = capo_run.steps
    assert sorted(steps) == [1, 2], sorted(steps)
    for step, data in steps.items():
        assert "timing_s/ref" in data, sorted(k for k in data if k.startswith("timing_s"))  # the mask's ref pass
        assert not any(k.startswith("actor/kl") for k in data), [k for k in data if "kl" in k]
        assert "critic/kl" not in data and "critic/kl_coeff" not in data
        assert data["actor/loss"] == pytest.approx(data["actor/pg_loss"], abs=1e-6)
        assert data["critic/rewards/mean"] == pytest.approx(data["critic/score/mean"], abs=1e-6)
        assert math.isfinite(data["actor/pg_loss"])
        for key in (
            "capo/mixed_group_frac",
            "capo/lpm_correct_mean",
            "capo/lpm_incorrect_mean",
            "capo/adv_abs_mean",
            "capo/mask_frac_correct",
            "capo/mask_frac_incorrect",
            "capo/ref_ppl_correct_q75",
            "capo/ref_ppl_incorrect_q25",
        ):
            assert key in data and math.isfinite(data[key]), (step, key, sorted(k for k in data if "capo" in k))
        # AUC-mean is defined only over mixed groups: left out of a step that has none (capo_step_metrics)
        if data["capo/mixed_group_frac"] > 0:
            assert 0.0 <= data["capo/auc_mean"] <= 1.0 and data["capo/adv_abs_mean"] > 0, (step, data)
            assert data["actor/grad_norm"] > 0, (step, data)
        else:  # every advantage is 0: no pair of a correct and an incorrect response in any group
            assert "capo/auc_mean" not in data and data["capo/adv_abs_mean"] == 0, (step, data)
    # the parity reward mixes most groups of 4: a run without one mixed group would test nothing of CAPO
    assert any(data["capo/mixed_group_frac"] > 0 for data in steps.values()), steps
    # the reference pass reaches the estimator: the mask acts on both sides
    assert any(data["capo/mask_frac_correct"] > 0 for data in steps.values()), steps
    assert any(data["capo/mask_frac_incorrect"] > 0 for data in steps.values()), steps
    assert (capo_run.workdir / "ckpt" / "latest_checkpointed_iteration.txt").read_text().strip() == "2"


def test_the_rollout_generates_with_the_actors_weights(capo_run):
    """verl recomputes every rollout token's probability with the actor and logs how the two agree.

    vLLM starts from random weights (``load_format: dummy``, near-uniform next-token probabilities of ~1/384): a
    rollout that was never synced gives a correlation near 0 with the actor's probabilities and a mean absolute
    difference near the actor's mean token probability (~0.3 here). Synced, they differ by bf16 rounding only:
    measured correlation 0.991-0.994 and mean difference 0.021-0.024 at both steps. (A rollout one update behind
    the actor would not stand out: one step at this learning rate moves the probabilities less than the rounding
    of vLLM's bf16 kernels, whose largest difference reached 0.29-0.37. The sync itself, and that a second sync
    moves vLLM with new weights, is tested against a real engine in tests/test_vllm_cpu.py.)
    """
    capo_run.assert_ok()
    for step, data in capo_run.steps.items():
        rollout = {k: v for k, v in data.items() if k.startswith("training/rollout_")}
        assert data["training/rollout_probs_diff_valid"] == 1, rollout
        assert data["training/rollout_actor_probs_pearson_corr"] > 0.95, (step, rollout)
        assert data["training/rollout_probs_diff_mean"] < 0.1, (step, rollout)


def test_validation_logs_val_calib_that_matches_the_dumped_responses(capo_run):
    capo_run.assert_ok()
    val = capo_run.steps[2]
    assert f"val-core/{SOURCE}/acc/mean@4" in val, sorted(k for k in val if k.startswith("val"))
    assert not any("/lpm/" in k for k in val)  # lpm is not put through verl's mean@/maj@ statistics
    # verl's dump of the pass, read the way ``capo-verl compare`` reads it: grouped by prompt text
    dump = read_validation_pass(capo_run.workdir / "val_generations" / "2.jsonl")
    assert len(dump.questions) == 4 and all(len(lpm) == 4 for lpm in dump.lpm)
    lpm_all = np.concatenate(dump.lpm)
    assert np.isfinite(lpm_all).all() and (lpm_all < 0).all()
    mixed = [(c, lpm) for c, lpm in zip(dump.correct, dump.lpm) if 0 < c.sum() < len(c)]
    assert mixed, dump  # the parity reward mixes most groups of 4
    expected_auc = np.mean([roc_auc_score(c, lpm) for c, lpm in mixed])
    assert val[f"val-calib/{SOURCE}/auc_mean"] == pytest.approx(expected_auc, abs=1e-9)
    assert val[f"val-calib/{SOURCE}/mixed_group_frac"] == pytest.approx(len(mixed) / len(dump.questions))
    correct = np.concatenate([lpm[c] for c, lpm in zip(dump.correct, dump.lpm)])
    assert val[f"val-calib/{SOURCE}/lpm_correct_mean"] == pytest.approx(correct.mean(), rel=1e-6)


def test_nothing_is_left_in_dev_shm(capo_run):
    """The finished run removed what its processes made in /dev/shm, and not a segment that another program made
    and closed while it ran (same user, Python's default psm_* name)."""
    capo_run.assert_ok()
    assert capo_run.shm_left == []
    assert capo_run.other_segment_kept is True
