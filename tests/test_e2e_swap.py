"""The swap of the design, as a new user makes it: verl's own ``ppo_trainer`` config (``python -m
verl.trainer.main_ppo``, no capo-verl config and no capo-verl launcher) with the keys of verl's GRPO examples and
``algorithm.adv_estimator=capo``; only the data, the model, the sizes, ``trainer.device=cpu`` and the logger changed
(``tests/swap_setup.py``). One step on the tiny model must train and write its checkpoint;
the log shows the val-calib-off line, the KL line and the summary, no traceback, and no silent stretch over 120 s
(vLLM's server start on 2 cores busy with another launch was silent for 75 s).
"""

from __future__ import annotations

import importlib.util
import json
import math
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import pytest

_spec = importlib.util.spec_from_file_location("swap_setup", Path(__file__).with_name("swap_setup.py"))
swap_setup = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(swap_setup)

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

RUN_TIMEOUT_S = 720


def run_timed(cmd: list[str], cwd: Path, env: dict[str, str], timeout: float) -> tuple[int, list[tuple[float, str]]]:
    """Run ``cmd`` in its own session; its output lines with the time each arrived."""
    proc = subprocess.Popen(
        cmd, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
        start_new_session=True, text=True, errors="replace",
    )  # fmt: skip
    lines: list[tuple[float, str]] = []

    def read():
        for line in proc.stdout:
            lines.append((time.monotonic(), line.rstrip("\n")))

    reader = threading.Thread(target=read, daemon=True)
    t0 = time.monotonic()
    lines.append((t0, "<start>"))
    reader.start()
    try:
        rc = proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, 9)
        proc.wait()
        rc = -9
    reader.join(timeout=30)
    lines.append((time.monotonic(), "<end>"))
    return rc, lines


def test_swap_on_verls_own_config_trains_and_says_what_it_did(e2e_inputs, tmp_path):
    workdir = tmp_path / "swap"
    workdir.mkdir()
    metrics = workdir / "metrics.jsonl"
    ray_dir = tempfile.mkdtemp(prefix="capo-ray-")  # short: Ray's socket paths must stay under 108 bytes
    env = dict(os.environ, VERL_FILE_LOGGER_PATH=str(metrics), RAY_TMPDIR=ray_dir, HYDRA_FULL_ERROR="1")
    env.pop("RAY_ADDRESS", None)
    cmd = [sys.executable, "-m", "verl.trainer.main_ppo", *swap_setup.swap_overrides(e2e_inputs, workdir)]
    t0 = time.monotonic()
    try:
        rc, lines = run_timed(cmd, workdir, env, RUN_TIMEOUT_S)
    finally:
        shutil.rmtree(ray_dir, ignore_errors=True)
    log = "\n".join(text for _, text in lines)
    (workdir / "console.log").write_text(log)
    tail = log[-6000:]
    print(f"swap: exit {rc} in {time.monotonic() - t0:.0f} s; log {workdir / 'console.log'}")
    assert rc == 0, tail
    assert (workdir / "ckpt" / "global_step_1").is_dir(), tail
    assert (workdir / "ckpt" / "latest_checkpointed_iteration.txt").read_text().strip() == "1"
    steps = [json.loads(line) for line in metrics.read_text().splitlines() if line.strip()]
    trained = [s["data"] for s in steps if "actor/pg_loss" in s["data"]]
    assert len(trained) == 1 and math.isfinite(trained[0]["actor/pg_loss"]), steps
    assert "timing_s/ref" in trained[0] and any(k.startswith("actor/kl") for k in trained[0])  # the KL loss is on
    assert "capo/mixed_group_frac" in trained[0]
    assert re.search(r"val-calib: off \(.*val_kwargs\.n=1", log), tail  # verl's default validation: off, and why
    assert "KL in loss: on (actor_rollout_ref.actor.use_kl_loss=true" in log, tail
    assert "  steps: 1 of 1 in " in log, tail
    assert "capo-verl: run summary" in log and "last checkpoint: " in log and "trainer.resume_mode=auto" in log, tail
    assert (workdir / "ckpt" / "curves.png").stat().st_size > 1000
    assert "Traceback" not in log, log[log.index("Traceback") - 2000 : log.index("Traceback") + 3000]
    gaps = [(b[0] - a[0], a[1][:200]) for a, b in zip(lines, lines[1:], strict=False)]
    longest = max(gaps)
    assert longest[0] <= 120, f"silent for {longest[0]:.0f} s after: {longest[1]}"
