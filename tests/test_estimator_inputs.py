"""What a verl user calling capo-verl's estimators from Python gets for a wrong input: one error saying what is
wrong and how to call it, never a silently wrong advantage.

Before: a NaN reward counted as incorrect and got a negative advantage; NaN in ``ref_log_prob`` was refused with
``use_mask=false``, where it is not used; numpy inputs failed with ``AttributeError: 'str' object has no attribute
'type'``; and calling the registered function (``core_algos.get_adv_estimator_fn("capo")``) told the user to
install capo-verl in every Ray process, though it was installed.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
import verl  # noqa: F401  loads the capo-verl plugin (registers the estimators), as verl's launcher does
from omegaconf import OmegaConf

from capo_verl.estimators import pop_step_metrics
from capo_verl.estimators.capo import compute_capo_outcome_advantage
from capo_verl.estimators.grpo_mask import compute_grpo_mask_outcome_advantage


def batch(bs: int = 4, T: int = 3):
    """Two groups of two, one correct and one incorrect response each, every token valid."""
    rewards = torch.zeros(bs, T)
    rewards[::2, -1] = 1.0
    return {
        "token_level_rewards": rewards,
        "response_mask": torch.ones(bs, T),
        "index": np.array(["a", "a", "b", "b"][:bs], dtype=object),
        "old_log_probs": -torch.rand(bs, T) - 0.1,
        "ref_log_prob": -torch.rand(bs, T) - 0.1,
    }


def config(**capo):
    return OmegaConf.create({"capo": {"use_mask": False, **capo}})


def test_a_nan_reward_is_refused_naming_the_responses():
    inputs = batch()
    inputs["token_level_rewards"][1, -1] = float("nan")
    with pytest.raises(
        ValueError,
        match=r"^capo: token_level_rewards\b.*\bNaN\b.*\b1 response.*\[1\].*\['a'\].*\breward function\b",
    ):
        compute_capo_outcome_advantage(**inputs, config=config())
    with pytest.raises(ValueError, match=r"^grpo_mask: token_level_rewards\b.*\bNaN\b.*\b1 response"):
        compute_grpo_mask_outcome_advantage(**inputs, config=config())


def test_nan_in_ref_log_prob_is_refused_only_where_the_mask_reads_it():
    inputs = batch()
    inputs["ref_log_prob"][2, 0] = float("nan")
    with pytest.raises(ValueError, match=r"^ref_log_prob\b.*\bNaN\b.*\b1 response.*\[2\]"):
        compute_capo_outcome_advantage(**inputs, config=config(use_mask=True, ref_low=1.0, ref_high=20.0))
    pop_step_metrics()
    adv, _ = compute_capo_outcome_advantage(**inputs, config=config())
    clean = batch()
    clean.update(old_log_probs=inputs["old_log_probs"], ref_log_prob=None)
    expected, _ = compute_capo_outcome_advantage(**clean, config=config())
    assert torch.equal(adv, expected) and torch.isfinite(adv).all()
    assert not any("ref_ppl" in key for key in pop_step_metrics())  # left out of the metrics, not logged as NaN
    compute_capo_outcome_advantage(**batch(), config=config())
    assert any("ref_ppl" in key for key in pop_step_metrics())  # a finite one is reported


@pytest.mark.parametrize("key", ["token_level_rewards", "response_mask", "old_log_probs", "ref_log_prob"])
def test_numpy_arrays_are_refused_with_the_expected_type(key):
    inputs = batch()
    inputs[key] = inputs[key].numpy()
    with pytest.raises(
        TypeError,
        match=rf"^capo: {key}\b.*\btorch\.Tensor\b.*\bnumpy\.ndarray\b.*\b{key}=torch\.as_tensor\({key}\)",
    ):
        compute_capo_outcome_advantage(**inputs, config=config())


def test_the_registered_function_called_directly_says_how_to_call_it():
    from verl.trainer.ppo import core_algos

    inputs = batch()
    fn = core_algos.get_adv_estimator_fn("capo")
    with pytest.raises(RuntimeError) as info:
        fn(
            token_level_rewards=inputs["token_level_rewards"],
            response_mask=inputs["response_mask"],
            index=inputs["index"],
            config=config(),
        )
    message = str(info.value)
    assert "'capo'" in message and "batch=" in message and "ray_trainer.compute_advantage" in message, message
    assert "capo_verl.estimators.capo.compute_capo_outcome_advantage(token_level_rewards=" in message
    assert "every Ray process" not in message
