"""capo_verl.cpu.launch against a stand-in run: signals stop all of its processes, and only its /dev/shm segments go.

The stand-in does what a verl run does to the launcher: it makes a ``/dev/shm`` segment that nobody unlinks (a killed
vLLM process's ring buffer), starts a process that leaves its session (as Ray's agents do), and, when asked, ignores
SIGTERM. The real trainer is stopped and resumed in tests/test_stop_resume.py.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from capo_verl.cpu import shm
from capo_verl.cpu.launch import launch_command, run_processes

STAND_IN = """
import signal, subprocess, sys, time
from multiprocessing import resource_tracker, shared_memory
from capo_verl.cpu import shm
shm.record_created()
segment = shared_memory.SharedMemory(create=True, size=4096)
resource_tracker.unregister(segment._name, "shared_memory")
segment.close()
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"], start_new_session=True)
if "ignore-term" in sys.argv:
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
print("/dev/shm/" + segment.name, child.pid, flush=True)
if "exit" in sys.argv:
    sys.exit(3)
time.sleep(600)
"""


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def _ledger_of(pid: int) -> str:
    """The run ledger a process inherited (from its environment, read from ``/proc``; again for up to 5 s while the
    kernel shows none of it, as a process that has just started may)."""
    deadline = time.monotonic() + 5
    while True:
        with open(f"/proc/{pid}/environ", "rb") as f:
            env = dict(item.split(b"=", 1) for item in f.read().split(b"\0") if b"=" in item)
        if shm.RUN_ENV.encode() in env or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    assert shm.RUN_ENV.encode() in env, (pid, _alive(pid), sorted(key.decode() for key in env))
    return env[shm.RUN_ENV.encode()].decode()


@pytest.fixture
def start(tmp_path):
    """``start(*stand_in_args, grace=5) -> (launcher Popen, segment path, orphan pid)``; killed at teardown."""
    procs, paths = [], []

    def run(*args, grace=5.0):
        env = {k: v for k, v in os.environ.items() if k != shm.RUN_ENV}
        cmd = launch_command([sys.executable, "-c", STAND_IN, *args], grace_s=grace)
        # its own process group, as a terminal's foreground job: the test signals the group like Ctrl-C does
        proc = subprocess.Popen(
            cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True, env=env
        )
        procs.append(proc)
        segment, orphan = proc.stdout.readline().split()
        paths.append(segment)
        return proc, segment, int(orphan)

    yield run
    for proc in procs:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    for path in paths:
        if os.path.exists(path):
            os.unlink(path)


@pytest.mark.parametrize(("sig", "rc"), [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_a_signal_stops_every_process_of_the_run_and_removes_its_segments_only(start, segments, sig, rc):
    proc, segment, orphan = start()
    other = segments()  # made and closed by another program while the run runs
    assert os.path.exists(segment) and _alive(orphan)
    assert orphan in run_processes(_ledger_of(orphan))
    t0 = time.monotonic()
    os.killpg(proc.pid, sig)
    _, err = proc.communicate(timeout=30)
    elapsed = time.monotonic() - t0
    assert proc.returncode == rc, err
    assert elapsed < 10, elapsed  # SIGTERM to the stand-in ends it; its orphan gets SIGTERM at once
    assert not _alive(orphan)
    assert not os.path.exists(segment)
    assert os.path.exists(other)
    assert f"{signal.Signals(sig).name}: stopping the run" in err
    assert "no checkpoint was written" in err and "resume_mode" not in err  # the stand-in saves none


def test_the_resume_hint_names_the_last_checkpoint_only_when_one_exists(tmp_path):
    from capo_verl.cpu.launch import resume_hint
    from capo_verl.cpu.shm import checkpoint_note

    ledger = str(tmp_path / "ledger")
    assert "no checkpoint was written" in resume_hint(ledger)  # no note: the trainer never started
    folder = tmp_path / "ckpt"
    folder.mkdir()
    Path(checkpoint_note(ledger)).write_text(str(folder))
    assert "no checkpoint was written" in resume_hint(ledger)
    assert not os.path.exists(checkpoint_note(ledger))  # the note is removed
    (folder / "global_step_2").mkdir()
    (folder / "latest_checkpointed_iteration.txt").write_text("2")
    Path(checkpoint_note(ledger)).write_text(str(folder))
    hint = resume_hint(ledger)
    assert str(folder / "global_step_2") in hint and hint.endswith("trainer.resume_mode=auto")


def test_a_command_that_ignores_sigterm_is_killed_after_the_grace_period(start):
    proc, segment, orphan = start("ignore-term", grace=2.0)
    t0 = time.monotonic()
    os.killpg(proc.pid, signal.SIGINT)
    proc.communicate(timeout=30)
    elapsed = time.monotonic() - t0
    assert proc.returncode == 130
    assert 2.0 <= elapsed < 2.0 + 5.0 + 5.0, elapsed  # grace, then SIGTERM (ignored) and SIGKILL 5 s later
    assert not _alive(orphan) and not os.path.exists(segment)


def test_a_second_ctrl_c_kills_the_run_at_once(start):
    proc, segment, orphan = start("ignore-term", grace=60.0)
    t0 = time.monotonic()
    os.killpg(proc.pid, signal.SIGINT)
    time.sleep(1.0)
    assert proc.poll() is None  # still in its grace period
    os.killpg(proc.pid, signal.SIGINT)
    _, err = proc.communicate(timeout=30)
    assert proc.returncode == 130
    assert time.monotonic() - t0 < 15.0  # far inside the 60 s grace period it cut short (5.3 s seen on a busy CPU)
    assert not _alive(orphan) and not os.path.exists(segment)


def test_after_a_normal_exit_the_runs_leftovers_go_and_its_status_is_kept(start):
    proc, segment, orphan = start("exit")
    _, err = proc.communicate(timeout=30)
    assert proc.returncode == 3
    assert not _alive(orphan) and not os.path.exists(segment)
    assert "stopping" not in err


def test_launch_needs_a_command():
    out = subprocess.run([sys.executable, "-m", "capo_verl.cpu.launch", "--"], capture_output=True, text=True)
    assert out.returncode == 2
    assert "no command" in out.stderr


def test_the_launchers_former_name_runs_the_same_launcher():
    """``python -m capo_verl.launch`` (its name before it moved into the CPU port) and ``import capo_verl.launch``."""
    out = subprocess.run([sys.executable, "-m", "capo_verl.launch", "--"], capture_output=True, text=True)
    assert out.returncode == 2
    assert "no command" in out.stderr and "python -m capo_verl.cpu.launch" in out.stderr
    import capo_verl.cpu.launch
    import capo_verl.launch

    assert capo_verl.launch is capo_verl.cpu.launch


#: a program that trains through run_launched, as capo-verl compare does; prints the stand-in's orphan pid
COMPARE_LIKE = """
import sys
from capo_verl.cpu.launch import run_launched
try:
    run_launched([sys.executable, "-c", sys.argv[1]], grace_s=5.0)
except KeyboardInterrupt:
    print("stopped", flush=True)
    sys.exit(130)
"""


def _start_compare_like() -> subprocess.Popen:
    """:data:`COMPARE_LIKE` running the stand-in, in a session of its own, outside any run."""
    env = {k: v for k, v in os.environ.items() if k != shm.RUN_ENV}
    return subprocess.Popen(
        [sys.executable, "-c", COMPARE_LIKE, STAND_IN],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
        env=env,
    )


def test_sigterm_to_a_program_running_the_launcher_stops_the_run(tmp_path):
    """``kill PID`` of a program inside run_launched (compare, in the background): the run stops with it."""
    proc = _start_compare_like()
    try:
        segment, orphan = proc.stdout.readline().split()
        launcher = [p for p in run_processes(_ledger_of(int(orphan))) if p != int(orphan)]
        proc.send_signal(signal.SIGTERM)  # this process alone, not its group
        out, err = proc.communicate(timeout=30)
        assert proc.returncode == 130 and out.strip() == "stopped", (out, err)
        assert "SIGTERM: stopping the run" in err
        deadline = time.monotonic() + 10
        while _alive(int(orphan)) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not _alive(int(orphan)) and not any(_alive(p) for p in launcher)
        assert not os.path.exists(segment)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)


def test_a_killed_program_running_the_launcher_takes_the_run_with_it(tmp_path):
    """SIGKILL of the program inside run_launched: the launcher gets SIGTERM from the kernel and stops the run."""
    proc = _start_compare_like()
    try:
        segment, orphan = proc.stdout.readline().split()
        proc.kill()
        proc.wait(timeout=10)
        deadline = time.monotonic() + 30
        while (_alive(int(orphan)) or os.path.exists(segment)) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not _alive(int(orphan)) and not os.path.exists(segment)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
