"""capo_verl/compat/ray_wait.py: Ray work that cannot be placed is named after a minute, with what the cluster has;
against a real local Ray cluster too small for what it is asked."""

from __future__ import annotations

import time

from capo_verl.compat import ray_wait


def test_a_wait_is_reported_after_a_minute_and_again_each_minute(monkeypatch):
    pending = {"actor:1": "actor WorkerDict"}
    monkeypatch.setattr(ray_wait, "pending_work", lambda: dict(pending))
    monkeypatch.setattr(ray_wait, "report", lambda waiting, waited_s: f"{sorted(waiting.values())} {waited_s:.0f}")
    watch = ray_wait.Watch()
    assert watch.look(now=0.0) is None
    assert watch.look(now=59.0) is None
    assert watch.look(now=60.0) == "['actor WorkerDict'] 60"
    assert watch.look(now=90.0) is None  # not again within the minute
    assert watch.look(now=120.0) == "['actor WorkerDict'] 120"
    pending.clear()
    assert watch.look(now=130.0) is None
    pending["pg:2"] = "placement group of 1 bundle(s) {CPU: 4}"  # a new wait starts its own minute
    assert watch.look(now=140.0) is None
    assert watch.look(now=200.0) == "['placement group of 1 bundle(s) {CPU: 4}'] 60"


def test_a_real_cluster_too_small_names_the_pending_actor_and_placement_group():
    import ray
    from ray.util.placement_group import placement_group, remove_placement_group

    # address="local": a cluster of its own, never one another test or process started
    ray.init(address="local", num_cpus=1, include_dashboard=False, log_to_driver=False)
    try:

        @ray.remote(num_cpus=1)
        class Worker:
            def ping(self):
                return 1

        first = Worker.remote()  # placed before the second is asked for: Ray may place two at once in any order
        assert ray.get(first.ping.remote(), timeout=120) == 1
        second = Worker.remote()
        group = placement_group([{"CPU": 4}])
        deadline = time.monotonic() + 30
        while len(pending := ray_wait.pending_work()) < 2 and time.monotonic() < deadline:
            time.sleep(0.2)
        assert sorted(pending.values()) == ["actor Worker", "placement group of 1 bundle(s) {CPU: 4} (infeasible)"]
        line = ray_wait.report(pending, 61.0)
        assert "waited 61 s" in line and "actor Worker" in line
        assert "{CPU: 1} in all, {CPU: 0} free" in line and "ray_kwargs.ray_init.num_cpus" in line
        ray.kill(second)  # nothing left pending when Ray shuts down
        remove_placement_group(group)
    finally:
        ray.shutdown()
    assert ray_wait.pending_work() == {}  # no cluster, nothing pending
