"""capo_verl.compat.shm: a run removes the /dev/shm segments its processes made, and nothing another program made."""

from __future__ import annotations

import os
import subprocess
import sys

from capo_verl.compat import shm


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
        "from capo_verl.compat import shm\n"
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
