"""The swap of the design as a command line (shared by tests/test_cpu_defaults.py and tests/test_e2e_swap.py):
verl's own ``ppo_trainer`` config, the keys of verl's GRPO examples (``examples/grpo_trainer``) and
``algorithm.adv_estimator=capo``; only the data, the model, the sizes, ``trainer.device=cpu`` and the logger changed.
Validation stays at verl's defaults (``val_kwargs.n=1``, greedy)."""

from __future__ import annotations

from pathlib import Path

#: verl's examples/grpo_trainer keys, kept as they are
GRPO_EXAMPLE = (
    "actor_rollout_ref.actor.use_kl_loss=True",
    "actor_rollout_ref.actor.kl_loss_type=low_var_kl",
    "actor_rollout_ref.actor.kl_loss_coef=0.001",
    "actor_rollout_ref.actor.entropy_coeff=0",
    "actor_rollout_ref.rollout.n=5",
    "actor_rollout_ref.model.enable_gradient_checkpointing=True",
    "actor_rollout_ref.model.use_remove_padding=True",
    "actor_rollout_ref.ref.fsdp_config.param_offload=True",
    "actor_rollout_ref.rollout.name=vllm",
    "algorithm.use_kl_in_reward=False",
)


def swap_overrides(inputs, workdir: Path) -> list[str]:
    """The swap: verl's own config, the GRPO-example keys, ``adv_estimator=capo``; only the data, the model, the
    sizes, ``trainer.device=cpu`` and the logger changed."""
    return [
        *GRPO_EXAMPLE,
        "algorithm.adv_estimator=capo",
        f"data.train_files={inputs.train}",
        f"data.val_files={inputs.val}",
        f"actor_rollout_ref.model.path={inputs.model}",
        f"reward.custom_reward_function.path={inputs.reward}",
        "reward.custom_reward_function.name=parity_reward",
        "data.train_batch_size=4",
        "data.max_prompt_length=96",
        "data.max_response_length=16",
        "actor_rollout_ref.actor.ppo_mini_batch_size=4",
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=20",
        "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=20",
        "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=20",
        "actor_rollout_ref.rollout.tensor_model_parallel_size=1",
        "trainer.n_gpus_per_node=1",
        "trainer.nnodes=1",
        "trainer.total_training_steps=1",
        "trainer.save_freq=1",
        "trainer.test_freq=1",
        "trainer.device=cpu",
        "trainer.logger=[console,file]",
        f"trainer.default_local_dir={workdir / 'ckpt'}",
        "trainer.project_name=capo_swap",
        f"trainer.experiment_name={workdir.name}",
    ]
