"""capo-verl's advantage estimators, one module per method, pure math on plain tensors (no verl, no Ray).

=============  ==========================  ==========================================================
name           module                      method
=============  ==========================  ==========================================================
``capo``       :mod:`.capo`                CAPO: logistic AUC-surrogate advantages + reference-PPL mask
``grpo_mask``  :mod:`.grpo_mask`           ablation: GRPO's advantage x CAPO's noise mask
``codapo``     :mod:`.codapo`              CoDaPO's confidence- and difficulty-weighted GRPO advantage
``cde``        :mod:`.cde`                 CDE's actor-curiosity (perplexity) bonus on GRPO's reward
=============  ==========================  ==========================================================

:mod:`.common` holds what they share: reading the batch once (group ids, behaviour log-probs, sequence means,
correctness, reference perplexity), GRPO's group statistics, the noise mask, config reading and the per-step metrics
queue. Each module's ``compute_<name>_outcome_advantage`` has verl's estimator signature and declares, next to it,
its name, batch keys, config section and needs (:func:`.registry.register_estimator`, collected in
:data:`.registry.ESTIMATORS`). :mod:`capo_verl.compat.methods` registers them with verl under
``algorithm.adv_estimator=<name>``; the ``verl.plugins`` entry point (:mod:`capo_verl.plugin`) installs it in every
process at ``import verl``. Importing this package registers nothing with verl.
"""

from capo_verl.estimators.capo import CapoConfig, capo_pairwise_advantages, check_tau, compute_capo_outcome_advantage
from capo_verl.estimators.cde import (
    CdeConfig,
    cde_advantages,
    cde_bonus_weight,
    cde_shaped_rewards,
    compute_cde_outcome_advantage,
)
from capo_verl.estimators.codapo import (
    CodapoConfig,
    codapo_advantages,
    codapo_group_weights,
    compute_codapo_outcome_advantage,
)
from capo_verl.estimators.common import (
    group_ids,
    grpo_group_advantages,
    pop_step_metrics,
    record_step_metrics,
    reference_ppl_mask,
)
from capo_verl.estimators.grpo_mask import compute_grpo_mask_outcome_advantage

__all__ = [
    "CapoConfig",
    "CdeConfig",
    "CodapoConfig",
    "capo_pairwise_advantages",
    "cde_advantages",
    "cde_bonus_weight",
    "cde_shaped_rewards",
    "check_tau",
    "codapo_advantages",
    "codapo_group_weights",
    "compute_capo_outcome_advantage",
    "compute_cde_outcome_advantage",
    "compute_codapo_outcome_advantage",
    "compute_grpo_mask_outcome_advantage",
    "group_ids",
    "grpo_group_advantages",
    "pop_step_metrics",
    "record_step_metrics",
    "reference_ppl_mask",
]
