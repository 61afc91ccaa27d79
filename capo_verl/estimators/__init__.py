"""capo-verl's advantage estimators, one module per method, each registered with verl under its name.

=============  ==========================  ==========================================================
name           module                      method
=============  ==========================  ==========================================================
``capo``       :mod:`.capo`                CAPO: logistic AUC-surrogate advantages + reference-PPL mask
``grpo_mask``  :mod:`.grpo_mask`           ablation: verl's GRPO advantage x CAPO's noise mask
``codapo``     :mod:`.codapo`              CoDaPO's confidence- and difficulty-weighted GRPO advantage
``cde``        :mod:`.cde`                 CDE's actor-curiosity (perplexity) bonus on GRPO's reward
=============  ==========================  ==========================================================

:mod:`.common` holds what they share (masked sequence means, group ids and statistics, the noise mask, config
reading). The math of every method takes plain tensors and imports nothing from verl; each module ends with
its registration (``capo_verl.compat.advantage.register_batch_aware_adv_est``), which is what
``algorithm.adv_estimator=<name>`` selects. Importing this package registers all of them; the ``verl.plugins``
entry point (:mod:`capo_verl.plugin`) does that in every process at ``import verl``.
"""

from capo_verl.estimators import capo, cde, codapo, grpo_mask  # noqa: F401  (registration)
from capo_verl.estimators.capo import CapoConfig, capo_pairwise_advantages, compute_capo_outcome_advantage
from capo_verl.estimators.cde import CdeConfig, cde_advantages, compute_cde_outcome_advantage
from capo_verl.estimators.codapo import CodapoConfig, codapo_advantages, compute_codapo_outcome_advantage
from capo_verl.estimators.common import group_ids, grpo_group_advantages, reference_ppl_mask, sequence_mean
from capo_verl.estimators.grpo_mask import compute_grpo_mask_outcome_advantage

__all__ = [
    "CapoConfig",
    "CdeConfig",
    "CodapoConfig",
    "capo_pairwise_advantages",
    "cde_advantages",
    "codapo_advantages",
    "compute_cde_outcome_advantage",
    "compute_codapo_outcome_advantage",
    "compute_capo_outcome_advantage",
    "compute_grpo_mask_outcome_advantage",
    "group_ids",
    "grpo_group_advantages",
    "reference_ppl_mask",
    "sequence_mean",
]
