"""Worker-side half of the ``hf`` rollout: what verl's hybrid trainer worker holds as ``self.rollout``.

verl's ``ActorRolloutRefWorker`` (``verl/workers/engine_workers.py``) builds it through
``get_rollout_class(name, "async")`` (registered in :mod:`capo_verl.compat.rollout`) and, in hybrid mode with the
``naive`` checkpoint backend, syncs weights after every update as::

    await rollout.resume(tags=["weights"])                      # if rollout.free_cache_engine
    await rollout.update_weights(actor.engine.get_per_tensor_param(), peft_config=..., global_steps=...)
    await rollout.resume(tags=["kv_cache"])                     # if rollout.free_cache_engine

``get_per_tensor_param()`` yields full (all-gathered) HF-named tensors; every FSDP rank must consume it (it is a
collective). The replica leader (rollout rank 0) casts them to the rollout dtype, moves them to host memory and
sends them to its server actor in one call; the other ranks only drain the generator.
"""

from __future__ import annotations

import os
import time
from typing import Any, Optional

import ray
import torch
from verl.workers.rollout.base import BaseRollout

from .replica import server_actor_name


class HFServerAdapter(BaseRollout):
    """Client of the replica's :class:`~capo_verl.rollout.server.HFRolloutServer` inside a trainer worker.

    Args:
        config: ``RolloutConfig``.
        model_config: ``HFModelConfig``.
        device_mesh: the rollout device mesh verl builds (unused: no model parallelism).
        replica_rank: replica index; -1 derives it from the ``RANK`` env var like verl's vLLM adapter.
    """

    def __init__(self, config, model_config, device_mesh, replica_rank: int = -1):
        super().__init__(config, model_config, device_mesh)
        rank = int(os.environ["RANK"])
        rollout_world_size = (
            self.config.tensor_model_parallel_size
            * self.config.data_parallel_size
            * self.config.pipeline_model_parallel_size
        )
        self.replica_rank = rank // rollout_world_size if replica_rank == -1 else replica_rank
        self.rollout_rank = rank % rollout_world_size
        self.is_leader = self.rollout_rank == 0
        self.server_handle: Optional[ray.actor.ActorHandle] = None
        from verl.utils.torch_dtypes import PrecisionType

        self.dtype = PrecisionType.to_dtype(self.config.dtype)
        self.last_sync: dict[str, Any] = {}

    def _server(self) -> ray.actor.ActorHandle:
        # The server is launched after the worker is built, so look it up lazily.
        if self.server_handle is None:
            self.server_handle = ray.get_actor(server_actor_name(self.replica_rank))
        return self.server_handle

    async def resume(self, tags: list[str]):
        """Bring weights (``"weights"``) back to the device before a sync; ``"kv_cache"`` is a no-op."""
        if self.is_leader and self.config.free_cache_engine:
            await self._server().wake_up.remote(tags=tags)

    async def release(self):
        """Offload the server's weights (see ``HFRolloutServer.sleep``)."""
        if self.is_leader and self.config.free_cache_engine:
            await self._server().sleep.remote()

    @torch.no_grad()
    async def update_weights(
        self,
        weights,
        wire_format: str = "named_tensors",
        global_steps: Optional[int] = None,
        peft_config: Any = None,
        base_sync_done: bool = True,
        **kwargs,
    ):
        """Send the actor's full weights to the server (leader) or drain the collective generator (others).

        Args:
            weights: (async) iterator of ``(hf_name, full_tensor)``.
            wire_format: only ``"named_tensors"``.
            global_steps: trainer step of these weights.
            peft_config: must be None (LoRA adapters are not supported; ``model.lora.merge=True`` is).

        Raises:
            NotImplementedError: another wire format, or a LoRA adapter sync.
        """
        if wire_format != "named_tensors":
            raise NotImplementedError(
                f"the hf rollout takes wire_format='named_tensors' only, got {wire_format!r}; "
                "use actor_rollout_ref.rollout.checkpoint_engine.backend=naive"
            )
        if peft_config is not None:
            raise NotImplementedError(
                "the hf rollout cannot load LoRA adapters; set actor_rollout_ref.model.lora.merge=True "
                "to sync merged weights"
            )
        t0 = time.time()
        state: dict[str, torch.Tensor] = {}
        if hasattr(weights, "__aiter__"):
            async for name, tensor in weights:
                if self.is_leader:
                    state[name] = self._to_host(tensor)
        else:
            for name, tensor in weights:
                if self.is_leader:
                    state[name] = self._to_host(tensor)
        if self.is_leader:
            result = await self._server().update_weights.remote(state, global_steps=global_steps)
            self.last_sync = {**result, "total_seconds": time.time() - t0}

    def _to_host(self, tensor: torch.Tensor) -> torch.Tensor:
        if hasattr(tensor, "full_tensor"):  # a DTensor that the engine did not gather
            tensor = tensor.full_tensor()
        dtype = self.dtype if tensor.is_floating_point() else tensor.dtype
        return tensor.detach().to(device="cpu", dtype=dtype).contiguous()
