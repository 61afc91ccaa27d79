"""A run whose Ray work cannot be placed says so, instead of waiting in silence.

verl's trainer asks Ray for its workers as actors and placement groups (``verl/single_controller/ray/base.py``:
``ray.get([pg.ready() for pg in pgs])``; the TaskRunner, the agent-loop and reward workers). When the local cluster's
logical resources (``ray_kwargs.ray_init.num_cpus`` / ``num_gpus``) cannot hold them, Ray keeps them pending and
verl waits without a word: a local cluster too small, or on a GPU cluster fewer nodes or GPUs than ``trainer.nnodes``
x ``trainer.n_gpus_per_node`` (``NNODES``, ``N_GPUS_PER_NODE`` with the launch scripts). On every host, while
``verl.trainer.main_ppo.run_ppo`` runs in the driver, a daemon thread asks Ray's
control store (``ray._private.state``: no dashboard needed) every :data:`POLL_S` s for actors pending creation and
placement groups pending; when one has been waiting :data:`REPORT_AFTER_S` s, it logs one line (``capo_verl``
logger, WARNING) that names them, what the pending placement groups ask for, what the cluster has, and the keys
that set it; again every :data:`REPORT_AFTER_S` s while they wait. It changes nothing of the run.
"""

from __future__ import annotations

import functools
import logging
import threading
import time
from types import ModuleType

from capo_verl.compat.patching import after_import, patch

logger = logging.getLogger("capo_verl")

#: seconds between two looks at Ray's pending work
POLL_S = 5.0
#: seconds a piece of work waits before it is reported (and between two reports)
REPORT_AFTER_S = 60.0

FIX = (
    "verl asks for trainer.nnodes x trainer.n_gpus_per_node worker bundles (NNODES x N_GPUS_PER_NODE with the launch "
    "scripts: check them against the nodes and GPUs the cluster has), actor_rollout_ref.rollout.agent.num_workers "
    "agent-loop workers and reward.num_workers reward workers; a local cluster's logical resources are "
    "ray_kwargs.ray_init.num_cpus and num_gpus"
)


def pending_work() -> dict[str, str]:
    """``{id: description}`` of the actors pending creation and the placement groups pending in the connected Ray
    cluster (empty when Ray is not initialized)."""
    import ray

    if not ray.is_initialized():
        return {}
    from ray._private import state

    pending = {}
    for actor_id, actor in state.actors().items():
        if actor.get("State") in ("PENDING_CREATION", "DEPENDENCIES_UNREADY"):
            pending[f"actor:{actor_id}"] = f"actor {actor.get('ActorClassName', '?').rsplit('.', 1)[-1]}"
    for pg_id, pg in ray.util.placement_group_table().items():
        if pg.get("state") in ("PENDING", "RESCHEDULING"):
            bundles = list((pg.get("bundles") or {}).values())
            how = (pg.get("stats") or {}).get("scheduling_state", "").lower()
            pending[f"pg:{pg_id}"] = f"placement group of {len(bundles)} bundle(s) {_resources(bundles[:1])}" + (
                f" ({how})" if how else ""
            )
    return pending


def _resources(items) -> str:
    return ", ".join(
        "{" + ", ".join(f"{k}: {v:g}" for k, v in sorted(item.items()) if not k.startswith("node:")) + "}"
        for item in items
    )


def report(waiting: dict[str, str], waited_s: float) -> str:
    """The line for the pending work ``waiting`` (:func:`pending_work`), the oldest of it pending ``waited_s`` s."""
    import ray

    keep = ("CPU", "GPU")
    total = {k: v for k, v in ray.cluster_resources().items() if k in keep}
    free = {k: ray.available_resources().get(k, 0.0) for k in total}
    what = "; ".join(sorted(set(waiting.values())))
    return (
        f"capo-verl: verl's run has waited {waited_s:.0f} s for Ray to place its workers: {what}; the cluster has "
        f"{_resources([total])} in all, {_resources([free])} free. {FIX}"
    )


class Watch:
    """The thread of the module docstring, for one ``run_ppo`` call."""

    def __init__(self, poll_s: float = POLL_S, report_after_s: float = REPORT_AFTER_S):
        self.poll_s, self.report_after_s = poll_s, report_after_s
        self.stop = threading.Event()
        self.first_seen: dict[str, float] = {}
        self.last_report = 0.0
        self.thread = threading.Thread(target=self._run, name="capo-verl-ray-wait", daemon=True)

    def _run(self) -> None:
        while not self.stop.wait(self.poll_s):
            try:
                self.look()
            except Exception as exc:  # Ray shutting down, or a Ray without these calls: nothing to report
                logger.debug("Ray's pending work not read: %s", exc)

    def look(self, now: float | None = None) -> str | None:
        """One look; returns the line it logged, if any."""
        now = time.monotonic() if now is None else now
        pending = pending_work()
        self.first_seen = {key: self.first_seen.get(key, now) for key in pending}
        if not pending:
            return None
        waited = now - min(self.first_seen.values())
        if waited < self.report_after_s or now - self.last_report < self.report_after_s:
            return None
        self.last_report = now
        line = report(pending, waited)
        logger.warning("%s", line)
        return line


@patch("verl.trainer.main_ppo", {"run_ppo": ("config", "task_runner_class")})
def _watch_run_ppo(main_ppo: ModuleType) -> None:
    """``verl/trainer/main_ppo.py``: while ``run_ppo`` runs, a :class:`Watch` reports Ray work left waiting."""
    original = main_ppo.run_ppo

    @functools.wraps(original)
    def run_ppo(config, *args, **kwargs):
        watch = Watch()
        watch.thread.start()
        try:
            return original(config, *args, **kwargs)
        finally:
            watch.stop.set()
            watch.thread.join(timeout=30)  # no look at Ray once run_ppo has returned (the caller may shut Ray down)

    main_ppo.run_ppo = run_ppo


def install() -> None:
    """Register the patch (applied when verl executes ``verl/trainer/main_ppo.py``)."""
    after_import("verl.trainer.main_ppo", _watch_run_ppo)
