"""Registration of the ``hf`` rollout backend (:mod:`capo_verl.rollout`) with verl 0.9.1.

verl resolves a rollout backend by ``actor_rollout_ref.rollout.name`` in two registries:

- trainer side, ``verl/workers/rollout/replica.py``: ``RolloutReplicaRegistry.register(name, loader)`` (public);
  the loader returns the ``RolloutReplica`` subclass (:class:`capo_verl.rollout.replica.HFReplica`).
- worker side, ``verl/workers/rollout/base.py``: the private dict ``_ROLLOUT_REGISTRY[(name, "async")]`` maps to
  the dotted path of the ``BaseRollout`` subclass that ``get_rollout_class`` imports
  (:class:`capo_verl.rollout.adapter.HFServerAdapter`).

Both are filled right after verl executes the defining module, in every process that loads the plugin.
"""

from __future__ import annotations

from types import ModuleType

from . import after_import

ROLLOUT_NAME = "hf"
ADAPTER_PATH = "capo_verl.rollout.adapter.HFServerAdapter"


def _load_replica():
    from capo_verl.rollout.replica import HFReplica

    return HFReplica


def _register_replica(module: ModuleType) -> None:
    """``verl/workers/rollout/replica.py``: ``RolloutReplicaRegistry.register("hf", loader)``."""
    module.RolloutReplicaRegistry.register(ROLLOUT_NAME, _load_replica)


def _register_adapter(module: ModuleType) -> None:
    """``verl/workers/rollout/base.py``: ``_ROLLOUT_REGISTRY[("hf", "async")] = <adapter path>``."""
    registry = module._ROLLOUT_REGISTRY
    existing = registry.get((ROLLOUT_NAME, "async"))
    if existing is not None and existing != ADAPTER_PATH:
        raise RuntimeError(
            f"verl already maps rollout ({ROLLOUT_NAME!r}, 'async') to {existing}; capo-verl's hf rollout "
            f"({ADAPTER_PATH}) would replace it"
        )
    registry[(ROLLOUT_NAME, "async")] = ADAPTER_PATH


def install() -> None:
    """Register the ``hf`` rollout in both of verl's rollout registries."""
    after_import("verl.workers.rollout.replica", _register_replica)
    after_import("verl.workers.rollout.base", _register_adapter)
