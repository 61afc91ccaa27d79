"""Adding an estimator is one decorated function: a toy estimator, declared in a module outside capo-verl with
``@register_estimator`` (docs/compat.md, "Advantage estimators"), trains a step of verl's trainer on the tiny model.

The module is imported in every process of the run by verl's own ``VERL_USE_EXTERNAL_MODULES``, before capo-verl's
plugin loads; nothing else is registered by hand. The step's metrics show that verl called it, with the batch tensor
it declared, the key of its own config section, and the reference pass off (it asks for none).
"""

from __future__ import annotations

import math
import os

import pytest

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

TOY_MODULE = "capo_toy_estimator"

#: the toy: a response's advantage is ``scale`` times its reward minus its group's mean reward
TOY_SOURCE = """
from dataclasses import dataclass

import numpy as np
import torch

from capo_verl.estimators.common import read_config_section, record_step_metrics
from capo_verl.estimators.registry import register_estimator


@dataclass(frozen=True)
class ToyConfig:
    scale: float = 1.0

    @classmethod
    def from_algorithm_config(cls, config):
        return read_config_section(cls, config, "toy")


@register_estimator("toy", batch_keys=("old_log_probs",), section="toy", config_class=ToyConfig)
def compute_toy_outcome_advantage(token_level_rewards, response_mask, index=None, config=None, old_log_probs=None,
                                  **kwargs):
    toy = ToyConfig.from_algorithm_config(config)
    scores = token_level_rewards.sum(-1)
    _, group = np.unique(np.asarray(index, dtype=str), return_inverse=True)
    group = torch.as_tensor(group)
    means = torch.zeros(int(group.max()) + 1).index_add_(0, group, scores) / torch.bincount(group)
    advantages = (toy.scale * (scores - means[group]))[:, None] * response_mask
    record_step_metrics({
        "toy/old_log_probs_shape_ok": float(old_log_probs is not None and old_log_probs.shape == response_mask.shape),
        "toy/scale": toy.scale,
        "toy/adv_abs_max": float(advantages.abs().max()),
    })
    return advantages, advantages
"""


def test_toy_estimator_declared_outside_capo_verl_trains_a_step(run_verl, tmp_path):
    (tmp_path / f"{TOY_MODULE}.py").write_text(TOY_SOURCE)
    path = os.pathsep.join(p for p in (str(tmp_path), os.environ.get("PYTHONPATH")) if p)
    run = run_verl(
        tmp_path / "toy",
        ["algorithm.adv_estimator=toy", "+algorithm.toy.scale=2.0", "trainer.total_training_steps=1"],
        env={"PYTHONPATH": path, "VERL_USE_EXTERNAL_MODULES": TOY_MODULE},
    )
    run.assert_ok()
    step = run.steps[1]
    assert step["toy/old_log_probs_shape_ok"] == 1.0, sorted(step)
    assert step["toy/scale"] == 2.0
    assert math.isfinite(step["actor/pg_loss"]) and math.isfinite(step["toy/adv_abs_max"])
    # capo-verl's batch calibration metrics are logged for it too; no reference pass was asked for
    assert "capo/auc_mean" in step or "capo/mixed_group_frac" in step, sorted(step)
    assert not any(key.startswith("timing_s/ref") for key in step), sorted(step)
