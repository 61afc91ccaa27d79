"""The prepared command for a GPU machine (tests/gpu/run_on_device.sh) and its parts, on the CPU.

- Without CUDA the command stops at once: one line naming CUDA, a non-zero exit status, nothing written.
- Its actor-update check (tests/gpu/actor_update_check.py) really runs verl's FSDP engine on the CPU (gloo, world
  size 1), as on a GPU machine: with an ``nvidia-smi`` on PATH that answers as a driver's does, which makes verl's
  platform detection pick CUDA unless the check asks for its CPU platform (``VERL_PLATFORM=cpu``). CAPO's
  advantages through verl's ``compute_advantage`` from the engine's own ``old_log_probs`` and ``ref_log_prob``,
  verl's vanilla loss then SimKO's, each with backward and an AdamW step; the loss and grad norm are finite, and two
  runs in one process agree exactly. Its comparison holds a run against itself and flags a difference above a
  tolerance.
- The record (tests/gpu/device_record.py) reads pytest's junit xml with the tests' measured differences, the stages'
  exit statuses and the comparison; the git blob hashes it records are git's.
- The stand-in for Ray (tests/gpu/ray_standin.py) takes the imports verl makes and refuses every call.
"""

from __future__ import annotations

import copy
import json
import os
import shutil
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
GPU = REPO / "tests" / "gpu"


def _load(name: str):
    import importlib.util

    spec = importlib.util.spec_from_file_location(f"capo_gpu_{name}", GPU / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_run_on_device_without_cuda_stops_at_once_with_one_line(tmp_path):
    out = tmp_path / "out"
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": "", "PYTHON": sys.executable}
    start = time.monotonic()
    subprocess.run([sys.executable, "-c", "import torch"], env=env, check=True, timeout=120)
    torch_import = time.monotonic() - start  # the check's own floor, slow on a busy machine
    start = time.monotonic()
    run = subprocess.run(
        ["bash", str(GPU / "run_on_device.sh"), str(out)], env=env, capture_output=True, text=True, timeout=60
    )
    seconds = time.monotonic() - start
    lines = (run.stdout + run.stderr).strip().splitlines()
    assert run.returncode != 0, run
    assert len(lines) == 1, lines
    assert "CUDA" in lines[0], lines
    assert seconds < 2 * torch_import + 5, f"{seconds:.1f} s (import torch: {torch_import:.1f} s): it should stop first"
    assert not out.exists()


FAKE_NVIDIA_SMI = """#!/bin/sh
# a GPU machine's nvidia-smi as verl's platform detection sees it: output, exit status 0
echo "NVIDIA-SMI 570.86.15    Driver Version: 570.86.15    CUDA Version: 12.8"
echo "GPU 0: NVIDIA H100 80GB HBM3 (UUID: GPU-00000000-0000-0000-0000-000000000000)"
exit 0
"""


def gpu_host_env(folder: Path) -> dict:
    """This process's environment as a GPU machine's looks to verl: an ``nvidia-smi`` that exits 0 first on PATH;
    no ``CUDA_VISIBLE_DEVICES`` nor ``VERL_PLATFORM`` set."""
    folder.mkdir(parents=True, exist_ok=True)
    smi = folder / "nvidia-smi"
    smi.write_text(FAKE_NVIDIA_SMI)
    smi.chmod(0o755)
    env = {k: v for k, v in os.environ.items() if k not in ("CUDA_VISIBLE_DEVICES", "VERL_PLATFORM")}
    env["PATH"] = os.pathsep.join([str(folder), env.get("PATH", "")])
    return env


@pytest.fixture(scope="module")
def cpu_run(tmp_path_factory):
    """One CPU process of the check, as the CPU reference stage runs on a GPU machine (an ``nvidia-smi`` on PATH):
    two runs (``--repeat 2``) of the actor update on shared inputs."""
    folder = tmp_path_factory.mktemp("actor_update")
    result = folder / "cpu.json"
    env = gpu_host_env(folder / "bin")
    run = subprocess.run(
        [sys.executable, str(GPU / "actor_update_check.py"), "run", "--device", "cpu", "--inputs",
         str(folder / "inputs"), "--json", str(result), "--repeat", "2"],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-6000:]
    return folder, json.loads(result.read_text())


def test_cpu_reference_runs_on_the_cpu_where_verl_would_pick_cuda(cpu_run):
    folder, record = cpu_run
    # the fake nvidia-smi makes verl's own detection pick CUDA with CUDA hidden, as on a GPU machine ...
    probe = (
        "from verl.plugin.platform.platform_cuda import PlatformCUDA;"
        "print(PlatformCUDA().is_platform_available(use_smi_check=True))"
    )
    env = {**gpu_host_env(folder / "bin"), "CUDA_VISIBLE_DEVICES": ""}
    run = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, text=True, timeout=120)
    assert run.returncode == 0 and run.stdout.strip().splitlines()[-1] == "True", run.stderr[-3000:]
    # ... and the CPU reference still ran on the CPU and wrote its record and the inputs the CUDA stage reads
    assert record["device"] == "cpu" and record["backend"] == "gloo"
    assert (folder / "inputs" / "batch.pt").is_file() and (folder / "inputs" / "thresholds.json").is_file()


def test_actor_update_runs_verls_engine_on_the_cpu(cpu_run):
    _, record = cpu_run
    assert record["device"] == "cpu" and record["backend"] == "gloo"
    assert record["problems"] == []  # finite, SimKO's branch taken, the mask on both sides, two runs identical
    assert len(record["runs"]) == 2
    for update in record["runs"][0]["updates"].values():
        assert update["finite"]
        assert update["grad_norm"] > 0 and abs(update["loss"]) < 10
        assert update["micro_batches"] >= 2  # dynamic batch size: gradient accumulation over micro-batches
        assert 0 < update["capo_metrics"]["capo/mask_frac_correct"] < 1
        assert 0 < update["capo_metrics"]["capo/mask_frac_incorrect"] < 1
        assert any(a != 0 for a in update["advantages"])
    updates = record["runs"][0]["updates"]
    assert updates["simko"]["metrics"]["simko/forking_frac"] > 0
    assert updates["simko"]["update_effect"] > 0  # update 1's AdamW step moved the actor's log-probs
    assert updates["simko"]["ref_log_prob"] == updates["vanilla"]["ref_log_prob"]  # the reference did not move
    assert updates["simko"]["old_log_probs"] != updates["vanilla"]["old_log_probs"]
    first, second = record["runs"]
    for mode in ("vanilla", "simko"):
        for key in ("loss", "grad_norm", "old_log_probs", "advantages"):
            assert first["updates"][mode][key] == second["updates"][mode][key], (mode, key)


def test_comparison_holds_a_run_against_itself_and_flags_a_difference(cpu_run):
    check = _load("actor_update_check")
    _, record = cpu_run
    same = check.compare_records(record, record)
    assert same["ok"] and all(row["ok"] for row in same["rows"])
    assert {row["measured"] for row in same["rows"] if row["measured"] is not None} == {0.0}
    quantities = {(row["update"], row["quantity"]) for row in same["rows"]}
    for mode in ("vanilla", "simko"):
        assert {(mode, q) for q in check.TOLERANCES} <= quantities

    off = copy.deepcopy(record)
    update = off["runs"][0]["updates"]["simko"]
    update["grad_norm"] *= 1 + 3 * check.TOLERANCES["grad_norm"][1]
    update["zero_advantage"] = update["zero_advantage"][1:]
    result = check.compare_records(record, off)
    failed = {(row["update"], row["quantity"]) for row in result["rows"] if not row["ok"]}
    assert not result["ok"] and failed == {("simko", "grad_norm"), ("simko", "zero_advantage")}
    off["inputs_sha256"] = "0" * 64
    assert not check.compare_records(record, off)["ok"]


def test_record_reads_the_junit_differences_the_stages_and_the_comparison(tmp_path):
    record_mod = _load("device_record")
    tests = tmp_path / "t"
    tests.mkdir()
    (tests / "test_tier.py").write_text(
        textwrap.dedent(
            """
            def test_close(record_property):
                record_property("measured:grad_rel", 2.5e-5)
                record_property("tolerance:grad_rel", 1e-4)

            def test_off(record_property):
                record_property("measured:loss_rel", 0.5)
                record_property("tolerance:loss_rel", 1e-3)
                assert False, "loss differs"
            """
        )
    )
    out = tmp_path / "out"
    out.mkdir()
    subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:xdist", "--rootdir", str(tests),
         "-c", os.devnull, f"--junitxml={out / 'pytest_gpu.xml'}", str(tests)],
        cwd=tests, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    (out / "stages.tsv").write_text("kit\t0\t12\npytest_gpu\t1\t40\n")
    (out / "actor_update_compare.json").write_text(json.dumps({"ok": True, "rows": [], "update_effect": 0.5}))
    (out / "source_blobs.txt").write_text("")
    record = record_mod.build(out, REPO)
    assert json.loads((out / "record.json").read_text()) == record
    assert record["ok"] is False  # a stage failed
    assert [s["exit_status"] for s in record["stages"]] == [0, 1]
    tier = record["cuda_tier"]
    assert tier["counts"] == {"passed": 1, "failed": 1}
    assert [t.split("::")[-1] for t in tier["failed"]] == ["test_off"]
    close = next(t for t in tier["tests"] if t["id"].endswith("test_close"))
    assert close["differences"]["grad_rel"] == {"measured": 2.5e-5, "tolerance": 1e-4, "fraction_of_tolerance": 0.25}
    assert record["actor_update"]["ok"] is True
    assert "test_off" in record_mod.summary(record)


def test_recorded_blob_hashes_are_gits(tmp_path):
    record_mod = _load("device_record")  # the tests run in a git checkout (CI's is a fresh clone)
    blobs = record_mod.source_blobs(REPO)
    assert "pyproject.toml" in blobs and "tests/gpu/run_on_device.sh" in blobs
    assert not any("/results/" in path or "__pycache__" in path for path in blobs)
    for path in ("pyproject.toml", "tests/gpu/actor_update_check.py"):
        git = subprocess.run(["git", "hash-object", path], cwd=REPO, capture_output=True, text=True, check=True)
        assert blobs[path] == git.stdout.strip(), path


def test_ray_standin_takes_verls_imports_and_refuses_every_call(tmp_path):
    (tmp_path / "ray").mkdir()
    shutil.copy(GPU / "ray_standin.py", tmp_path / "ray" / "__init__.py")
    code = textwrap.dedent(
        """
        import ray
        assert ray.STANDIN and not ray.is_initialized()
        from ray.util.placement_group import PlacementGroup, placement_group
        from ray.actor import ActorHandle
        import ray.util.collective as collective

        @ray.remote
        class A:
            pass

        @ray.remote(num_cpus=1)
        def f():
            return 1

        assert A.__name__ == "A" and f() == 1
        hint: list[ray.actor.ActorHandle] = []
        assert not isinstance(1, ray.ObjectRef) and ray.ObjectRef[int] is ray.ObjectRef
        for call in (lambda: ray.init(), lambda: placement_group([]), lambda: collective.allreduce(1)):
            try:
                call()
            except RuntimeError as e:
                assert "stand-in for Ray" in str(e)
            else:
                raise AssertionError("a call did not raise")
        print("ok")
        """
    )
    env = {**os.environ, "PYTHONPATH": str(tmp_path)}
    run = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)
    assert run.returncode == 0 and run.stdout.strip() == "ok", run.stderr
