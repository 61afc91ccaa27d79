"""The methods of ``capo-verl compare``: each is a set of Hydra overrides on top of the shared base config."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Method:
    """A method of the comparison: Hydra overrides applied on top of the shared base config.

    ``++key=value`` adds or replaces, so a method works on any verl config.
    """

    description: str
    overrides: tuple[str, ...]


#: method name -> the paper run it stands for. Every method keeps the base config's loss aggregation, clip,
#: learning rate, batch and data; only what is listed changes.
METHODS: dict[str, Method] = {
    "grpo": Method(
        "Dr. GRPO: verl's grpo estimator, A_i = R_i - mean(R) (no std), PPO-clip (configs/grpo_*.yaml)",
        ("++algorithm.adv_estimator=grpo", "++algorithm.norm_adv_by_std_in_grpo=false"),
    ),
    "capo": Method(
        "CAPO: capo estimator (Eq. 14, tau from algorithm.capo.tau) with the reference-PPL noise mask",
        ("++algorithm.adv_estimator=capo", "++algorithm.capo.use_mask=true"),
    ),
    "capo_no_mask": Method(
        "CAPO without the noise mask (ablation no_mask): no reference model",
        ("++algorithm.adv_estimator=capo", "++algorithm.capo.use_mask=false"),
    ),
    "grpo_mask": Method(
        "Dr. GRPO advantages x CAPO's noise mask (ablation grpo_mask)",
        (
            "++algorithm.adv_estimator=grpo_mask",
            "++algorithm.norm_adv_by_std_in_grpo=false",
            "++algorithm.capo.use_mask=true",
        ),
    ),
    "gspo": Method(
        "GSPO: verl's gspo loss mode, clip 3e-4/4e-4, (R_i - mean)/std advantages (configs/gspo_*.yaml)",
        (
            "++algorithm.adv_estimator=grpo",
            "++algorithm.norm_adv_by_std_in_grpo=true",
            "++actor_rollout_ref.actor.policy_loss.loss_mode=gspo",
            "++actor_rollout_ref.actor.clip_ratio_low=3e-4",
            "++actor_rollout_ref.actor.clip_ratio_high=4e-4",
        ),
    ),
    "codapo": Method(
        "CoDaPO: codapo estimator (confidence- and difficulty-weighted GRPO advantage)",
        ("++algorithm.adv_estimator=codapo", "++algorithm.norm_adv_by_std_in_grpo=true"),
    ),
    "cde": Method(
        "CDE: cde estimator (GRPO advantage of the perplexity-bonus-shaped reward)",
        ("++algorithm.adv_estimator=cde", "++algorithm.norm_adv_by_std_in_grpo=true"),
    ),
    "simko": Method(
        "SimKO: grpo estimator with the simko policy loss (top-K smoothing, top-1 penalty)",
        (
            "++algorithm.adv_estimator=grpo",
            "++algorithm.norm_adv_by_std_in_grpo=true",
            "++actor_rollout_ref.actor.policy_loss.loss_mode=simko",
        ),
    ),
}
