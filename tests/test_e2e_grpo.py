"""A plain GRPO run of verl's trainer, with capo-verl installed: nothing of capo-verl gets in its way.

The plugin is loaded by every ``import verl`` in the environment, so a run that uses none of capo-verl's estimators
or losses gets its patches too. Here verl's trainer (harness: tests/conftest.py) runs GRPO without rollout
log-probs (``rollout.calculate_log_probs=false``), the setting in which capo-verl's additions could break a run that
never asked for them. What it covers that no other test does:

- the run validates, trains and validates again with verl's ``val-core`` metrics; the validation responses carry
  no ``lpm``, so ``val-calib/...`` is skipped (``trainer.val_calib`` left at auto) with one warning for the whole
  run (capo_verl/compat/validation.py), not an error. That warning is a ``capo_verl`` log record emitted in verl's
  TaskRunner, where vLLM's import sets the root logger to ERROR: it reaches the console through capo-verl's own
  handler (capo_verl/logs.py), once; no capo-verl warning line is printed twice by one process;
- no reference model and no KL term are added for GRPO;
- the ``capo/*`` batch calibration metrics are logged for verl's own estimator from the actor's log-probs, without
  the mask metrics, which belong to CAPO.
"""

from __future__ import annotations

import collections
import math
import re

import pytest

from capo_verl.data import GSM8K_CALC_SOURCE

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

SKIPPED_WARNING = "capo-verl: val-calib/* calibration metrics skipped for this run"
#: a capo_verl log line as capo_verl/logs.py prints it, after Ray's "(ActorName pid=N) " prefix if any
CAPO_LOG_LINE = re.compile(r"^(\([^)]*pid=\d+[^)]*\) )?(DEBUG|INFO|WARNING|ERROR|CRITICAL) capo_verl[\w.]*: ")
ANSI = re.compile(r"\x1b\[[0-9;]*m")  # Ray colours its "(ActorName pid=N)" prefix


def test_grpo_without_rollout_log_probs_trains_and_validates_without_val_calib(run_verl, tmp_path):
    run = run_verl(
        tmp_path / "grpo_no_logprobs",
        [
            "algorithm.adv_estimator=grpo",
            "actor_rollout_ref.rollout.calculate_log_probs=false",
            "trainer.total_training_steps=1",
            "trainer.val_before_train=true",
            "trainer.test_freq=1",
        ],
    )
    run.assert_ok()
    steps = run.steps
    assert sorted(steps) == [0, 1], sorted(steps)  # validation before training (step 0), then step 1 + validation
    for step in (0, 1):
        assert f"val-core/{GSM8K_CALC_SOURCE}/acc/mean@4" in steps[step], sorted(steps[step])
        assert not any(k.startswith("val-calib/") for k in steps[step]), sorted(steps[step])
    # two validation passes, one warning
    assert run.log.count(SKIPPED_WARNING) == 1, [ln for ln in run.log.splitlines() if "val-calib" in ln]
    lines = [ANSI.sub("", ln) for ln in run.log.splitlines()]
    (line,) = [ln for ln in lines if SKIPPED_WARNING in ln]
    # emitted in verl's TaskRunner (TaskRunnerV1 for the v1 trainer), printed by capo-verl's handler
    assert re.match(rf"^\(TaskRunner\w* pid=\d+\) WARNING capo_verl: {re.escape(SKIPPED_WARNING)}", line), line
    capo_lines = [ln for ln in lines if (m := CAPO_LOG_LINE.match(ln)) and m.group(2) == "WARNING"]
    repeated = [ln for ln, n in collections.Counter(capo_lines).items() if n > 1]
    assert not repeated, repeated  # one process, one line: never printed by both the root logger and capo-verl's

    data = steps[1]
    assert math.isfinite(data["actor/pg_loss"]) and data["actor/grad_norm"] > 0
    assert "timing_s/ref" not in data, sorted(k for k in data if k.startswith("timing_s"))
    assert not any(k.startswith(("actor/kl", "critic/kl")) for k in data), [k for k in data if "kl" in k]
    for key in (
        "capo/auc_mean",
        "capo/mixed_group_frac",
        "capo/lpm_correct_mean",
        "capo/lpm_incorrect_mean",
        "capo/adv_abs_mean",
    ):
        assert key in data and math.isfinite(data[key]), (key, sorted(k for k in data if k.startswith("capo/")))
    assert not [k for k in data if k.startswith(("capo/mask_frac", "capo/ref_ppl"))]
    assert not any(k.startswith("training/rollout_probs_diff") for k in data)  # no rollout log-probs to compare
