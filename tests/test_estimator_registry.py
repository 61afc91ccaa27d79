"""Each estimator declares its registration next to its function (capo_verl/estimators/registry.py), and
capo_verl/compat/advantage.py registers exactly what was declared with the real verl, through one wrapper."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import verl  # noqa: F401  (loads the capo-verl plugin: registers the estimators)
from omegaconf import OmegaConf
from verl import DataProto
from verl.trainer.ppo import core_algos, ray_trainer

from capo_verl.compat.advantage import estimator_needs_reference_policy, pop_step_metrics
from capo_verl.compat.methods import check_method_configs
from capo_verl.estimators import CapoConfig, CdeConfig, CodapoConfig, registry
from capo_verl.estimators.capo import compute_capo_outcome_advantage
from capo_verl.estimators.cde import compute_cde_outcome_advantage
from capo_verl.estimators.codapo import compute_codapo_outcome_advantage
from capo_verl.estimators.grpo_mask import compute_grpo_mask_outcome_advantage


def test_each_module_declares_its_estimator():
    declared = {
        name: (spec.fn, spec.batch_keys, spec.section, spec.config_class, spec.needs_training_step)
        for name, spec in registry.ESTIMATORS.items()
    }
    assert declared == {
        "capo": (
            compute_capo_outcome_advantage,
            ("old_log_probs", "rollout_log_probs", "ref_log_prob"),
            "capo",
            CapoConfig,
            False,
        ),
        "grpo_mask": (compute_grpo_mask_outcome_advantage, ("ref_log_prob",), "capo", CapoConfig, False),
        "codapo": (
            compute_codapo_outcome_advantage,
            ("old_log_probs", "rollout_log_probs"),
            "codapo",
            CodapoConfig,
            False,
        ),
        "cde": (compute_cde_outcome_advantage, ("old_log_probs", "rollout_log_probs"), "cde", CdeConfig, True),
    }
    assert registry.config_sections() == {"capo": CapoConfig, "codapo": CodapoConfig, "cde": CdeConfig}


@pytest.mark.parametrize("name", ["capo", "grpo_mask", "codapo", "cde"])
def test_verl_holds_what_each_estimator_declared(name):
    spec = registry.ESTIMATORS[name]
    registered = core_algos.get_adv_estimator_fn(name)
    assert registered.__wrapped__ is spec.fn and registered.spec is spec
    mask_on = OmegaConf.create({"adv_estimator": name, "capo": {"use_mask": True}})
    mask_off = OmegaConf.create({"adv_estimator": name, "capo": {"use_mask": False}})
    reads_the_mask = name in ("capo", "grpo_mask")
    assert estimator_needs_reference_policy(OmegaConf.create({"algorithm": mask_on})) == reads_the_mask
    assert not estimator_needs_reference_policy(OmegaConf.create({"algorithm": mask_off}))


def test_a_second_declaration_of_a_name_or_a_section_is_refused():
    with pytest.raises(ValueError, match=r"'capo'.*\bcapo_verl\.estimators\.capo\b"):
        registry.register_estimator("capo", batch_keys=(), section="capo", config_class=CapoConfig)(lambda **kw: None)
    with pytest.raises(ValueError, match=r"algorithm\.capo\b.*\bCapoConfig\b.*\bCdeConfig\b"):
        registry.register_estimator("capo_other", batch_keys=(), section="capo", config_class=CdeConfig)(
            lambda **kw: None
        )
    assert "capo_other" not in registry.ESTIMATORS


def test_a_new_estimator_is_one_declaration():
    """Declared in one place after verl is imported, it is registered with verl at once, gets the batch tensor it
    names (and verl's keywords, and no other batch tensor) through verl's real ``compute_advantage``, and its
    section is checked in verl's ``validate_config`` hook."""
    seen = {}

    @registry.register_estimator("capo_probe", batch_keys=("old_log_probs",), section="cde", config_class=CdeConfig)
    def compute_probe(token_level_rewards, response_mask, index=None, config=None, old_log_probs=None, **kwargs):
        seen.update(kwargs, old_log_probs=old_log_probs, index=index)
        return torch.zeros_like(token_level_rewards), torch.zeros_like(token_level_rewards)

    try:
        assert core_algos.get_adv_estimator_fn("capo_probe").__wrapped__ is compute_probe
        old = torch.full((4, 3), -0.5)
        tensors = {"token_level_rewards": torch.zeros(4, 3), "response_mask": torch.ones(4, 3), "old_log_probs": old}
        data = DataProto.from_dict(
            tensors={**tensors, "ref_log_prob": torch.zeros(4, 3)},
            non_tensors={"uid": np.array(["a", "a", "b", "b"], dtype=object)},
        )
        ray_trainer.compute_advantage(data, adv_estimator="capo_probe", config=OmegaConf.create({}))
        assert torch.equal(seen.pop("old_log_probs"), old)
        assert list(seen.pop("index")) == ["a", "a", "b", "b"]
        assert seen == {}  # ref_log_prob is in the batch, not declared: not passed
        assert "advantages" in data.batch.keys()
        with pytest.raises(ValueError, match=r"algorithm\.cde"):
            check_method_configs(OmegaConf.create({"algorithm": {"adv_estimator": "capo_probe", "cde": {"w0": -1}}}))
    finally:
        registry.ESTIMATORS.pop("capo_probe", None)  # its name and section may be declared again
        core_algos.ADV_ESTIMATOR_REGISTRY.pop("capo_probe", None)
        pop_step_metrics()
