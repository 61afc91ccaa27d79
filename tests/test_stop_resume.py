"""Stopping verl's trainer with Ctrl-C or SIGTERM, as a terminal does, and resuming it from its last checkpoint.

Each run is the CPU profile on the tiny model under capo_verl.cpu.launch, as the launch scripts start it
(tests/conftest.py ``start_verl``); the signal goes to the launcher's process group, like a terminal's Ctrl-C to its
foreground job. After the stop nothing of the run may be alive, nothing it made may be left in ``/dev/shm``, and
another program's segment made during the run must still be there.
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import psutil
import pytest

from capo_verl.cpu.launch import run_processes

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1500)]  # up to 3 launches a test, beside another under -n 2

#: the issue's bound: a stopped run is gone within about 30 s
STOP_WITHIN_S = 30.0


def _wait_for(predicate, launch, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        tail = launch.log_path.read_text()[-4000:]
        assert launch.proc.poll() is None, f"the run ended before {what}:\n{tail}"
        assert time.monotonic() < deadline, f"no {what} within {timeout_s:.0f} s:\n{tail}"
        time.sleep(0.25)


def _tracker(ckpt: Path) -> int:
    path = ckpt / "latest_checkpointed_iteration.txt"
    return int(path.read_text()) if path.exists() else 0


def _stop(launch, sig: signal.Signals):
    """Send ``sig`` to the launcher's process group; returns (VerlRun, seconds to the launcher's exit, the run's
    processes that were alive just before the signal)."""
    ledger = launch.run_ledger()
    before = run_processes(ledger)
    assert len(before) >= 5, before  # the driver, Ray's processes, the workers, vLLM's
    t0 = time.monotonic()
    os.killpg(launch.proc.pid, sig)
    run = launch.finish(timeout=120)
    return run, time.monotonic() - t0, before, ledger


def _described(path: str) -> str:
    """Size and age of a segment left behind: a vLLM ring buffer is hundreds of MB, a weight bucket its size."""
    try:
        st = os.stat(path)
    except OSError:
        return "gone"
    return f"{st.st_size} bytes, made {time.time() - st.st_ctime:.0f} s ago"


def _assert_nothing_left(run, before, ledger, other_segment):
    alive = [p for p in before if psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE]
    assert alive == [], [psutil.Process(p).cmdline() for p in alive]
    assert run_processes(ledger) == []
    left = [p for p in run.shm_left if p != other_segment]
    assert left == [], {p: _described(p) for p in left}
    assert not os.path.exists(ledger)
    assert os.path.exists(other_segment)


def test_ctrl_c_stops_the_run_and_it_resumes_from_its_last_checkpoint(start_verl, segments, tmp_path):
    """Ctrl-C once a checkpoint is written: the run is gone within 30 s, nothing left; the same run resumed with
    ``trainer.resume_mode=auto`` for one more step trains that step only, from the checkpoint. A step of the tiny
    model takes under a second on a fast CPU, so the run has steps enough that the signal lands before its last
    one."""
    steps = 20
    common = [
        "algorithm.adv_estimator=grpo",
        f"trainer.total_training_steps={steps}",
        "trainer.save_freq=1",
        "trainer.test_freq=-1",
    ]
    first = start_verl(tmp_path / "first", common)
    ckpt = first.workdir / "ckpt"
    _wait_for(lambda: _tracker(ckpt) >= 1, first, 420, "checkpoint of step 1")
    other = segments()
    run, elapsed, before, ledger = _stop(first, signal.SIGINT)
    assert run.rc == 130, run.tail()
    assert elapsed < STOP_WITHIN_S, elapsed
    assert "SIGINT: stopping the run" in run.log
    _assert_nothing_left(run, before, ledger, other)
    last = _tracker(ckpt)
    assert 1 <= last < steps, run.tail()  # stopped part way, with the checkpoints written so far
    assert (ckpt / f"global_step_{last}").is_dir()

    # resumed for one more step: it trains only the step after the last checkpoint
    again = [*common[:1], f"trainer.total_training_steps={last + 1}", *common[2:]]
    resumed = start_verl(
        tmp_path / "resumed", [*again, f"trainer.default_local_dir={ckpt}", "trainer.resume_mode=auto"]
    ).finish()
    resumed.assert_ok()
    assert sorted(resumed.steps) == [last + 1], sorted(resumed.steps)  # no step trained twice
    assert _tracker(ckpt) == last + 1
    assert resumed.shm_left == []


def test_sigterm_stops_the_run_with_nothing_left(start_verl, segments, tmp_path):
    launch = start_verl(tmp_path / "term", ["algorithm.adv_estimator=grpo", "trainer.total_training_steps=50"])
    _wait_for(lambda: launch.metrics.exists() and launch.metrics.stat().st_size > 0, launch, 420, "first step")
    other = segments()
    run, elapsed, before, ledger = _stop(launch, signal.SIGTERM)
    assert run.rc == 143, run.tail()
    assert elapsed < STOP_WITHIN_S, elapsed
    assert "SIGTERM: stopping the run" in run.log
    _assert_nothing_left(run, before, ledger, other)


def test_a_resumed_run_keeps_every_steps_metrics_refuses_a_rerun_and_validates_only_with_val_only(run_verl, tmp_path):
    """A 1-step run resumed to 2 steps in the same folder: the metrics file holds steps 1 and 2 (verl's file logger
    alone would hold step 2 only), the summary counts both, the curves are drawn. Before that, the first command run
    again (``trainer.resume_mode=disable``) is refused at the start, naming the folder and both choices, and leaves
    the checkpoint of step 1 as it was. After it, the run stopped after its last step's checkpoint is validated with
    ``trainer.val_only=true trainer.val_before_train=true``, as ``capo-verl compare`` resumes such a run
    (``capo_verl/compare/running.py``): verl 0.9.1 validates the loaded step and trains nothing (resumed as it is,
    it would train nothing and log nothing, so the validation after the last step would be missing)."""
    work = tmp_path / "run"
    ckpt = work / "ckpt"
    common = ["algorithm.adv_estimator=grpo", "trainer.save_freq=1", "trainer.test_freq=-1"]
    first = run_verl(work, [*common, "trainer.total_training_steps=1"])
    first.assert_ok()
    assert sorted(first.steps) == [1] and _tracker(ckpt) == 1
    saved = sorted(p.name for p in (ckpt / "global_step_1").rglob("*"))

    again = run_verl(work, [*common, "trainer.total_training_steps=1"])
    assert again.rc != 0, again.tail()  # verl's main_ppo, which prints Hydra's report of its validate_config error
    subject = f"trainer.default_local_dir={ckpt} (with trainer.resume_mode=disable)"
    [line] = [ln for ln in again.log.splitlines() if subject in ln]
    assert "trainer.resume_mode=auto" in line, line
    assert sorted(p.name for p in (ckpt / "global_step_1").rglob("*")) == saved

    resumed = run_verl(work, [*common, "trainer.total_training_steps=2", "trainer.resume_mode=auto"])
    resumed.assert_ok()
    assert sorted(resumed.steps) == [1, 2], sorted(resumed.steps)
    assert "timing_s/step" in resumed.steps[1] and "timing_s/step" in resumed.steps[2]
    assert "steps: 2 of 2 (1 in this run, resumed from the checkpoint of step 1)" in resumed.log, resumed.tail()
    assert (ckpt / "curves.png").stat().st_size > 0 and _tracker(ckpt) == 2

    validated = run_verl(
        tmp_path / "val_only",
        [
            *common,
            "trainer.total_training_steps=2",
            f"trainer.default_local_dir={ckpt}",
            "trainer.resume_mode=auto",
            "trainer.val_only=true",
            "trainer.val_before_train=true",
        ],
    )
    validated.assert_ok()
    assert list(validated.steps) == [2], validated.steps  # the loaded step's validation, logged at that step
    assert any(k.startswith("val-core/") for k in validated.steps[2])
    assert not any(k.startswith(("actor/", "timing_s/")) for k in validated.steps[2])
    assert _tracker(ckpt) == 2
