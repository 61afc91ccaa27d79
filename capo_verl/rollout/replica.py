"""Trainer-side replica of the ``hf`` rollout: launches one :class:`HFRolloutServer` actor per replica.

verl creates one replica per ``tensor_model_parallel_size * data_parallel_size * pipeline_model_parallel_size``
trainer ranks (``verl/workers/rollout/llm_server.py``: ``LLMServerManager._initialize_llm_servers``) and calls
``init_hybrid(worker_group)``, which calls :meth:`HFReplica.launch_servers`. The base class
(``verl/workers/rollout/replica.py``: ``RolloutReplica``) forwards ``wake_up``, ``sleep``,
``abort_all_requests``, ``resume_generation``, the KV-cache and profiling methods to ``self.servers``.
"""

from __future__ import annotations

import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy
from verl.plugin.platform import get_platform
from verl.utils.device import get_resource_name
from verl.workers.rollout.replica import RolloutMode, RolloutReplica

from .server import HFRolloutServer

SERVER_NAME_PREFIX = "hf_"


def server_actor_name(replica_rank: int, name_suffix: str = "", kind: str = "") -> str:
    """Ray actor name of a replica's server (the worker-side adapter looks it up by this name)."""
    kind = f"{kind}_" if kind else ""
    return f"{SERVER_NAME_PREFIX}server_{kind}{replica_rank}_0{name_suffix}"


class HFReplica(RolloutReplica):
    """One transformers generation server, colocated (hybrid) with the replica's trainer worker.

    Only hybrid mode is supported (``actor_rollout_ref.hybrid_engine=True``, trainer modes ``sync`` and
    ``colocate_async``): weights reach the server through the trainer worker's ``update_weights``.
    """

    async def launch_servers(self):
        if self.rollout_mode != RolloutMode.HYBRID:
            raise NotImplementedError(
                f"the hf rollout runs in hybrid mode only (got {self.rollout_mode}); keep "
                "actor_rollout_ref.hybrid_engine=True and trainer.v1.trainer_mode=sync, or use rollout.name=vllm"
            )
        if self.world_size != 1:
            raise ValueError(
                "the hf rollout has no model parallelism: set actor_rollout_ref.rollout.tensor_model_parallel_size=1 "
                "(and data_parallel_size=1, pipeline_model_parallel_size=1); got a replica world size of "
                f"{self.world_size}"
            )
        if len(self.workers) != 1:
            raise RuntimeError(f"hf replica {self.replica_rank}: expected 1 trainer worker, got {len(self.workers)}")

        resource = get_resource_name()
        node_id, device_id = await self.workers[0].__ray_call__.remote(
            lambda self, resource=resource: (
                ray.get_runtime_context().get_node_id(),
                (ray.get_runtime_context().get_accelerator_ids().get(resource) or [None])[0],
            )
        )
        platform = get_platform()
        on_cpu = platform.device_name == "cpu"
        env_vars = {} if on_cpu else {var: "1" for var in platform.ray_noset_envvars()}
        if self.is_reward_model:
            kind = "reward"
        elif self.is_teacher_model:
            kind = "teacher"
        else:
            kind = ""
        name = server_actor_name(self.replica_rank, self.name_suffix, kind)
        server = (
            ray.remote(HFRolloutServer)
            .options(
                scheduling_strategy=NodeAffinitySchedulingStrategy(node_id=node_id, soft=False),
                runtime_env={"env_vars": env_vars},
                name=name,
                max_concurrency=self.max_concurrency,
            )
            .remote(
                config=self.config,
                model_config=self.model_config,
                rollout_mode=self.rollout_mode,
                replica_rank=self.replica_rank,
                device_id=None if on_cpu else device_id,
            )
        )
        await server.get_stats.remote()  # surfaces construction errors (bad config, model load) here
        self.servers = [server]
        self._server_handle = server
        self._server_address = f"hf://{name}@{node_id[:12]}"
