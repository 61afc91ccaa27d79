"""End to end on CPU: ``algorithm.adv_estimator=codapo`` and ``=cde`` through ``python -m verl.trainer.main_ppo``
(v1 trainer, Ray, FSDP2, TransferQueue, ``hf`` rollout), with the tiny model, data, reward and checks of
``tests/test_e2e_cpu.py``; and CDE's bonus schedule across a resume from a checkpoint.

Each run takes 1-3 minutes on 2 cores.
"""

from __future__ import annotations

import importlib.util
import math
from pathlib import Path

import pytest

_spec = importlib.util.spec_from_file_location("_capo_e2e_cpu", Path(__file__).with_name("test_e2e_cpu.py"))
e2e = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(e2e)

inputs = e2e.inputs  # the module-scoped fixture: tiny random Qwen2, GSM8K calculation parquet, parity reward

pytestmark = pytest.mark.timeout(2 * e2e.RUN_TIMEOUT_S + 60)

CAPO_METRICS = ("capo/auc_mean", "capo/mixed_group_frac", "capo/lpm_correct_mean", "capo/lpm_incorrect_mean",
                "capo/adv_abs_mean")


def _check_calibration_metrics(step, data):
    for key in CAPO_METRICS:
        assert key in data and math.isfinite(data[key]), (step, key, sorted(k for k in data if "/" in k))
    assert 0.0 <= data["capo/auc_mean"] <= 1.0


def test_codapo_trains_through_verl_main_ppo_on_cpu(inputs, tmp_path):
    rc, log, records = e2e.run_verl(
        inputs,
        tmp_path / "codapo",
        ["algorithm.adv_estimator=codapo", "algorithm.norm_adv_by_std_in_grpo=true", "+algorithm.codapo.weight_offset=0.1"],
    )
    steps = e2e._check_common(rc, log, records, expect_reference=False)  # CoDaPO needs no reference model
    for step, data in steps.items():
        _check_calibration_metrics(step, data)
        for key in ("codapo/weight_mean", "codapo/weight_max", "codapo/confidence_mean", "codapo/difficulty_weight_mean"):
            assert key in data and math.isfinite(data[key]), (step, key)
        # weight = c * 4p(1-p) + 0.1 with c = exp(mean lpm) in (0, 1] and 4p(1-p) in [0, 1]
        assert 0.1 <= data["codapo/weight_mean"] <= data["codapo/weight_max"] <= 1.1
        assert 0.0 < data["codapo/confidence_mean"] <= 1.0


def test_cde_trains_and_its_schedule_continues_across_a_resume(inputs, tmp_path):
    schedule = ["algorithm.adv_estimator=cde", "algorithm.norm_adv_by_std_in_grpo=true",
                "+algorithm.cde.w0=1.0", "+algorithm.cde.w_zero_after_step=2"]
    first = tmp_path / "cde"
    rc, log, records = e2e.run_verl(inputs, first, [*schedule, "trainer.save_freq=2"])
    steps = e2e._check_common(rc, log, records, expect_reference=False)
    for step, data in steps.items():
        _check_calibration_metrics(step, data)
        assert data["cde/w"] == 1.0, (step, data["cde/w"])  # steps 1 and 2 <= w_zero_after_step
        assert data["cde/bonus_mean"] > 0 and 0.0 <= data["cde/bonus_cap_frac"] <= 1.0
        assert 0.0 < data["cde/shaped_bonus_mean"] <= 1.0 / 3.0 + 1e-6  # w * min(1/kappa, B) with w = 1, kappa = 3
    assert (first / "ckpt" / "global_step_2" / "actor").is_dir()

    # A new process resumes from global_step_2 and trains step 3: the bonus is off there. An estimator that counted
    # its own calls would be at its first call in this process and use w0 again.
    rc, log, records = e2e.run_verl(
        inputs,
        tmp_path / "cde_resumed",
        [*schedule, "trainer.total_training_steps=3", "trainer.resume_mode=auto", "trainer.test_freq=-1",
         f"trainer.default_local_dir={first / 'ckpt'}"],
    )
    assert rc == 0, e2e._tail(log)
    resumed = e2e._steps(records)
    assert sorted(k for k, v in resumed.items() if "actor/pg_loss" in v) == [3], sorted(resumed)
    assert resumed[3]["cde/w"] == 0.0
    _check_calibration_metrics(3, resumed[3])
    assert math.isfinite(resumed[3]["actor/pg_loss"])
