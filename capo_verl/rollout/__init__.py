"""``hf`` rollout backend for verl 0.9.1: transformers generation in Ray actors, in hybrid mode.

Select it with ``actor_rollout_ref.rollout.name=hf`` (registered by :mod:`capo_verl.compat.rollout` when verl
loads the capo plugin). It needs no vLLM/SGLang. It runs on CPU (tested end to end); on a CUDA machine the
server uses the GPU of its replica's trainer worker and offloads its weights between rollouts (written for a
single GPU, not yet exercised on one).

- :mod:`.sampling` - batched decoding with per-request sampling parameters and per-token log-probs.
- :mod:`.server`   - the Ray actor that batches concurrent ``generate`` requests (one per replica).
- :mod:`.replica`  - trainer-side ``RolloutReplica`` that launches the server next to the trainer worker.
- :mod:`.adapter`  - worker-side ``BaseRollout`` that pushes the actor's weights to the server after updates.

Modules that import Ray/verl are not imported here, so ``capo_verl.rollout.sampling`` stays light.
"""
