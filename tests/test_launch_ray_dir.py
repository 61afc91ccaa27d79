"""capo_verl.cpu.launch gives each run a Ray temp folder of its own (``RAY_TMPDIR``) and removes it when the run ends
well or is stopped, keeps it after a failure (Ray's logs), and touches no other folder; with ``RAY_ADDRESS`` or
``RAY_TMPDIR`` set it changes nothing. A stand-in command writes where Ray would (``$RAY_TMPDIR/ray/session_*``)."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from capo_verl.cpu import shm
from capo_verl.cpu.launch import RAY_DIR_PREFIX, launch_command

STAND_IN = """
import os, sys, time
tmp = os.environ.get("RAY_TMPDIR")
if tmp:
    session = os.path.join(tmp, "ray", "session_2026-11-26_00-00-00_000000_1", "logs")
    os.makedirs(session)
    open(os.path.join(session, "raylet.out"), "w").write("log\\n")
print(tmp or "-", flush=True)
if sys.argv[1] == "wait":
    time.sleep(600)
sys.exit(int(sys.argv[1]))
"""


def _start(tmp_path: Path, arg: str, **env_extra: str) -> tuple[subprocess.Popen, str]:
    env = {k: v for k, v in os.environ.items() if k not in (shm.RUN_ENV, "RAY_ADDRESS", "RAY_TMPDIR")}
    env.update(TMPDIR=str(tmp_path), **env_extra)
    proc = subprocess.Popen(
        launch_command([sys.executable, "-c", STAND_IN, arg], grace_s=5),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        start_new_session=True,
    )
    return proc, proc.stdout.readline().strip()


@pytest.fixture
def tmp_path():
    """A short TMPDIR (pytest's own is too long for Ray's socket paths: the launcher would use /tmp instead)."""
    path = Path(tempfile.mkdtemp(prefix="crd", dir="/tmp"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def neighbours(tmp_path):
    """Another run's Ray folder and a shared ``ray`` folder in the same TMPDIR: never touched."""
    other = tmp_path / f"{RAY_DIR_PREFIX}other" / "ray" / "session_x"
    other.mkdir(parents=True)
    (tmp_path / "ray" / "session_latest").mkdir(parents=True)
    yield
    assert other.is_dir() and (tmp_path / "ray" / "session_latest").is_dir()


def test_a_run_that_ends_well_removes_its_own_ray_folder(tmp_path, neighbours):
    proc, ray_tmp = _start(tmp_path, "0")
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    assert Path(ray_tmp).parent == tmp_path and Path(ray_tmp).name.startswith(RAY_DIR_PREFIX)
    assert not os.path.exists(ray_tmp)


def test_a_tmpdir_too_long_for_rays_sockets_gives_a_folder_in_tmp(tmp_path):
    long = tmp_path / ("x" * 60)
    long.mkdir()
    proc, ray_tmp = _start(long, "0")
    proc.communicate(timeout=60)
    assert proc.returncode == 0
    assert Path(ray_tmp).parent == Path("/tmp") and not os.path.exists(ray_tmp)


def test_a_failed_run_keeps_its_ray_folder_and_says_where(tmp_path, neighbours):
    proc, ray_tmp = _start(tmp_path, "3")
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 3
    assert os.path.isfile(os.path.join(ray_tmp, "ray", "session_2026-11-26_00-00-00_000000_1", "logs", "raylet.out"))
    [line] = [ln for ln in err.splitlines() if str(ray_tmp) in ln]  # one line says where, and that it is kept
    assert "Ray" in line and "delete" in line, err


def test_a_stopped_run_removes_its_ray_folder(tmp_path, neighbours):
    proc, ray_tmp = _start(tmp_path, "wait")
    os.killpg(proc.pid, signal.SIGTERM)
    proc.communicate(timeout=60)
    assert proc.returncode == 143
    assert not os.path.exists(ray_tmp)


@pytest.mark.parametrize("variable", ["RAY_ADDRESS", "RAY_TMPDIR"])
def test_an_existing_cluster_or_the_users_folder_is_left_alone(tmp_path, variable):
    mine = tmp_path / "my_ray"
    mine.mkdir()
    value = "auto" if variable == "RAY_ADDRESS" else str(mine)
    proc, ray_tmp = _start(tmp_path, "0", **{variable: value})
    proc.communicate(timeout=60)
    assert proc.returncode == 0
    assert ray_tmp == ("-" if variable == "RAY_ADDRESS" else str(mine))
    assert mine.is_dir() and not [p for p in tmp_path.iterdir() if p.name.startswith(RAY_DIR_PREFIX)]
    if variable == "RAY_TMPDIR":
        assert (mine / "ray").is_dir()  # written by the run, kept: the folder is the user's
