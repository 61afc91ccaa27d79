"""capo_verl.cpu.shm: a run removes the /dev/shm segments its processes made, and nothing another program made."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import time
from pathlib import Path

from capo_verl.cpu import shm


def test_cleanup_run_removes_the_runs_segments_only(tmp_path, segments):
    ledger = str(tmp_path / "run.shm")
    other = segments()
    ours = [segments(ledger), segments(ledger)]
    assert all(os.path.basename(p).startswith("psm_") for p in [other, *ours])
    assert shm.recorded(ledger) == ours
    shm.record(ours[0], ledger)  # recorded twice: removed once
    shm.record(str(tmp_path / "not-in-dev-shm"), ledger)  # never removed: not a segment's path
    assert all(os.path.exists(p) for p in [other, *ours])

    assert shm.cleanup_run(ledger) == ours
    assert not any(os.path.exists(p) for p in ours)
    assert os.path.exists(other)
    assert not os.path.exists(ledger)
    assert shm.cleanup_run(ledger) == []  # idempotent


def test_a_process_that_imports_verl_removes_its_runs_segments_and_no_other(segments):
    """``import verl`` outside a run and outside Ray owns a run: at its exit it removes what the processes it started
    recorded, and leaves a segment that another program made and closed meanwhile (same user, same name pattern)."""
    code = (
        "import os, sys, verl\n"
        "from capo_verl.cpu import shm\n"
        "print(os.environ[shm.RUN_ENV], flush=True)\n"
        "sys.stdin.read()\n"
    )
    env = {k: v for k, v in os.environ.items() if k not in (shm.RUN_ENV, "RAY_RAYLET_PID")}
    proc = subprocess.Popen(
        [sys.executable, "-c", code], env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    ledger = proc.stdout.readline().strip()
    ours = segments(ledger)  # a process of its run (as vLLM's, killed before it unlinks its ring buffer)
    other = segments()  # another program, while the verl process runs
    assert os.path.exists(ours) and os.path.exists(other)
    proc.communicate("", timeout=60)
    assert proc.returncode == 0
    assert not os.path.exists(ours)
    assert os.path.exists(other)
    assert not os.path.exists(ledger)


def test_outside_a_run_nothing_is_recorded(tmp_path, monkeypatch):
    monkeypatch.delenv(shm.RUN_ENV, raising=False)
    shm.record(str(tmp_path / "x"))  # no ledger: nothing written anywhere
    assert list(tmp_path.iterdir()) == []
    assert shm.new_ledger(str(tmp_path)).startswith(str(tmp_path / "capo-verl-run-"))
    assert list(tmp_path.iterdir()) == []  # the ledger file is made by the first record


#: a process that makes a loky-named POSIX semaphore and ends without unlinking it (as vLLM's CPU worker, killed at
#: the end of a Ray run, leaves joblib's loky semaphore); in its run when it has one; prints the semaphore's path
LEAVE_LOKY_SEMAPHORE = """
import os, secrets
from _multiprocessing import SemLock
from capo_verl.cpu import shm
name = f"/loky-{os.getpid()}-{secrets.token_hex(4)}"  # loky's own naming (joblib/externals/loky/backend)
SemLock(1, 1, 1, name, False)  # semaphore, value 1, max 1, not unlinked
if os.environ.get(shm.RUN_ENV):
    shm.record_created()  # capo-verl loads in this process after the semaphore was made: only its pid is recorded
print(shm.SHM_DIR + "/sem" + name.replace("/", "."), flush=True)
os._exit(0)  # no finalizer: the semaphore stays, as after SIGKILL
"""


def _leave_loky_semaphore(ledger: str | None) -> str:
    env = {k: v for k, v in os.environ.items() if k not in (shm.RUN_ENV, "RAY_RAYLET_PID")}
    if ledger:
        env[shm.RUN_ENV] = ledger
    out = subprocess.run(
        [sys.executable, "-c", LEAVE_LOKY_SEMAPHORE], env=env, capture_output=True, text=True, check=True
    )
    return out.stdout.strip()


def test_cleanup_run_removes_the_loky_semaphores_of_the_runs_processes_only(tmp_path):
    """A loky semaphore made before capo-verl loaded in its process is not recorded by path; it is the run's by the
    pid in its name. Another program's semaphore of the same pattern stays."""
    ledger = str(tmp_path / "run.shm")
    made = []
    try:
        ours = _leave_loky_semaphore(ledger)
        other = _leave_loky_semaphore(None)
        seen_by_launcher = _leave_loky_semaphore(None)  # a run process that never loads capo-verl
        made += [ours, other, seen_by_launcher]
        assert all(os.path.exists(p) for p in made), made
        assert shm.recorded(ledger) == []  # nothing recorded by path
        [pid] = shm.recorded_pids(ledger)
        assert os.path.basename(ours).startswith(f"sem.loky-{pid}-")
        launcher_pid = int(os.path.basename(seen_by_launcher).split("-")[1])

        assert shm.cleanup_run(ledger, pids={launcher_pid}) == [ours, seen_by_launcher]
        assert not os.path.exists(ours) and not os.path.exists(seen_by_launcher)
        assert os.path.exists(other)
        assert not os.path.exists(ledger)
    finally:
        for path in made:
            if os.path.exists(path):
                os.unlink(path)


def test_a_loky_semaphore_still_mapped_is_left(tmp_path):
    """A live process that maps a semaphore named by a pid of the run (a pid reused by another program) keeps it."""
    ledger = str(tmp_path / "run.shm")
    code = (
        "import os, sys\n"
        "from _multiprocessing import SemLock\n"
        "name = f'/loky-{os.getpid()}-live'\n"
        "s = SemLock(1, 1, 1, name, False)\n"
        "print('/dev/shm/sem' + name.replace('/', '.'), flush=True)\n"
        "sys.stdin.read()\n"
    )
    proc = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    path = proc.stdout.readline().strip()
    try:
        shm.record_pid(proc.pid, ledger)
        assert os.path.exists(path)
        assert shm.cleanup_run(ledger) == []
        assert os.path.exists(path)
    finally:
        proc.communicate("", timeout=30)
        if os.path.exists(path):
            os.unlink(path)


#: a process outside any run that checks a run's config, as a launch script's ``--dry-run`` does: it owns a run
#: (``_own_run_at_exit``), and the checks note the checkpoint folder beside its ledger; prints the note's path
NOTE_A_CHECKPOINT_FOLDER = """
import os
from omegaconf import OmegaConf
from capo_verl.cpu import shm
from capo_verl.cpu.defaults import record_checkpoint_folder
shm._own_run_at_exit()
record_checkpoint_folder(OmegaConf.create({"trainer": {"default_local_dir": "/somewhere/ckpt"}}))
note = shm.checkpoint_note(os.environ[shm.RUN_ENV])
assert open(note).read() == "/somewhere/ckpt"
print(note, flush=True)
"""


def test_a_process_that_owned_its_run_leaves_no_checkpoint_note(tmp_path):
    env = {k: v for k, v in os.environ.items() if k not in (shm.RUN_ENV, "RAY_RAYLET_PID")}
    env["TMPDIR"] = str(tmp_path)
    proc = subprocess.run(
        [sys.executable, "-c", NOTE_A_CHECKPOINT_FOLDER], env=env, capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.strip().startswith(str(tmp_path / "capo-verl-run-"))
    assert list(tmp_path.iterdir()) == []


def _dead_pid() -> int:
    proc = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    return int(proc.stdout)


def test_leftovers_of_dead_runs_are_removed_and_live_runs_are_left_alone(tmp_path):
    """A run whose owner was SIGKILLed leaves its ledger, its note and its segments (vLLM's ring buffers): the next
    run's owner removes them. A ledger whose owner lives, or that a live process still carries (the owner died,
    one of its workers did not), is not touched."""
    from multiprocessing import shared_memory

    def segment() -> str:
        seg = shared_memory.SharedMemory(create=True, size=64)
        seg.close()  # not unlinked, as by a killed process
        return os.path.join(shm.SHM_DIR, seg.name)

    dead, live, orphaned = (
        tmp_path / f"capo-verl-run-{pid}-0123abcd.shm" for pid in (_dead_pid(), os.getpid(), _dead_pid())
    )
    segs = {}
    for ledger in (dead, live, orphaned):
        segs[ledger] = segment()
        shm.record(segs[ledger], str(ledger))
        Path(shm.checkpoint_note(str(ledger))).write_text("/somewhere/ckpt")
    env = {**os.environ, shm.RUN_ENV: str(orphaned)}
    worker = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], env=env)
    try:
        time.sleep(0.5)
        removed = shm.cleanup_dead_runs(str(tmp_path))
    finally:
        worker.kill()
        worker.wait()
    try:
        assert removed == [segs[dead]]
        assert not os.path.exists(segs[dead]) and not dead.exists()
        assert not os.path.exists(shm.checkpoint_note(str(dead)))
        for ledger in (live, orphaned):
            assert os.path.exists(segs[ledger]) and ledger.exists()
            assert os.path.exists(shm.checkpoint_note(str(ledger)))
        assert shm.cleanup_dead_runs(str(tmp_path)) == [segs[orphaned]]  # its last process has ended
    finally:
        for path in segs.values():
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)
