"""The seed's step-0 pass made apart (``capo-verl compare --share-step0``: verl's trainer with
``trainer.val_only=true``, :data:`capo_verl.compare.running.STEP0_OVERRIDES`) is the pass a training run makes
before its first step: the same responses with the same scores, and each response's mean token log-prob (lpm) the
same to float32 rounding, with sampled validation (temperature 1.0, 4 samples per question) on the tiny model
through verl 0.9.1's trainer and vLLM. Not byte for byte: the dump's order of questions and its uids differ, the
lpm differs in the sixth digit (the batch's layout), and so do verl's bootstrapped best@k / worst@k."""

from __future__ import annotations

import json

import numpy as np
import pytest

from capo_verl.compare.running import STEP0_OVERRIDES

pytestmark = pytest.mark.slow


def _records(path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_the_step0_pass_made_apart_equals_a_training_runs_own(run_verl, tmp_path):
    common = ["algorithm.adv_estimator=grpo", "trainer.test_freq=-1", "actor_rollout_ref.rollout.seed=3"]
    trained = run_verl(
        tmp_path / "trained",
        [*common, "trainer.total_training_steps=1", "trainer.val_before_train=true",
         f"trainer.validation_data_dir={tmp_path / 'trained_val'}"],
    )  # fmt: skip
    trained.assert_ok()
    assert sorted(trained.steps) == [0, 1]  # validated, then trained a step
    apart = run_verl(
        tmp_path / "apart",
        [*common, f"trainer.validation_data_dir={tmp_path / 'apart_val'}", *(o.lstrip("+") for o in STEP0_OVERRIDES)],
    )
    apart.assert_ok()
    assert sorted(apart.steps) == [0] and not any(k.startswith("actor/") for k in apart.steps[0])  # trained nothing

    def key(record):
        return record["input"], record["output"], record["score"], record["acc"]

    ours, theirs = (sorted(_records(tmp_path / f"{run}_val" / "0.jsonl"), key=key) for run in ("apart", "trained"))
    assert len(ours) == 4 * 4  # conftest's 4 validation questions x 4 samples
    assert len({r["output"] for r in ours}) > 4  # sampled: not one greedy answer per question
    assert [key(r) for r in ours] == [key(r) for r in theirs]
    assert np.allclose([r["lpm"] for r in ours], [r["lpm"] for r in theirs], rtol=0, atol=1e-5)
    for metric in ("val-core/gsm8k_calc/acc/mean@4", "val-calib/gsm8k_calc/auc_mean"):
        assert apart.steps[0][metric] == trained.steps[0][metric], metric
