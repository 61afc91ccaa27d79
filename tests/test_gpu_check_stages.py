"""The stages of the prepared GPU check (tests/gpu/run_on_device.sh), on the CPU, in seconds.

- ``--plan`` prints each stage as the script runs it (the same ``limited`` call: name, time limit, kill grace,
  command) and runs nothing. The limits with their kill grace add up to at most :data:`BUDGET_S`, so that a stage
  that hangs still leaves ``record.json`` within the 600 s a GPU machine gives one command; tests/gpu/README.md's
  stage table gives each stage's limit as the script has it.
- ``KIT=none`` (verl and capo-verl installed already) plans no kit stage and needs no kit folder; a kit folder
  without wheels stops the kit stage with one line naming the fix.
- ``device_record.py env`` records the source and the machine without CUDA too.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
GPU = REPO / "tests" / "gpu"
SCRIPT = GPU / "run_on_device.sh"
BUDGET_S = 540  # a GPU machine's 600 s for one command, less a minute for the transfers and the record's files
STAGES = ("cuda_check", "env", "kit", "preflight", "pytest_gpu", "actor_update_cpu", "actor_update_cuda",
          "actor_update_compare", "gpu_tier", "record")  # fmt: skip


def plan(tmp_path: Path, **env: str) -> tuple[list[dict], str]:
    """``run_on_device.sh --plan OUT``'s stages (name, limit_s, kill_after_s, command) and its whole output."""
    full = {k: v for k, v in os.environ.items() if k != "KIT"}
    full.update(env, PYTHON=sys.executable)
    run = subprocess.run(
        ["bash", str(SCRIPT), "--plan", str(tmp_path / "out")], env=full, capture_output=True, text=True, timeout=60
    )
    assert run.returncode == 0, run.stdout + run.stderr
    assert run.stderr == "", run.stderr
    stages = []
    for line in run.stdout.splitlines():
        if line.startswith("#"):
            continue
        name, limit, kill_after, command = line.split("\t")
        stages.append({"name": name, "limit_s": int(limit), "kill_after_s": int(kill_after), "command": command})
    assert not (tmp_path / "out").exists()  # --plan runs nothing and writes nothing
    return stages, run.stdout


def test_plan_lists_every_stage_and_their_limits_add_up_to_at_most_540_s(tmp_path):
    stages, out = plan(tmp_path, KIT=str(tmp_path / "kit"))
    assert tuple(s["name"] for s in stages) == STAGES
    assert all(s["limit_s"] > 0 and s["kill_after_s"] >= 0 for s in stages)
    total = sum(s["limit_s"] + s["kill_after_s"] for s in stages)
    assert total <= BUDGET_S, {s["name"]: s["limit_s"] for s in stages}
    assert f"at most {total} s" in out  # the script's own sum agrees
    kit = next(s for s in stages if s["name"] == "kit")
    assert str(tmp_path / "kit") in kit["command"]
    cpu = next(s for s in stages if s["name"] == "actor_update_cpu")
    assert "--device cpu" in cpu["command"]


def test_readme_gives_each_stages_limit_as_the_script_has_it(tmp_path):
    stages, _ = plan(tmp_path)
    readme = (GPU / "README.md").read_text()
    total = sum(s["limit_s"] + s["kill_after_s"] for s in stages)
    assert f"add up to {total} s" in readme, f"tests/gpu/README.md: the limits' sum is {total} s"
    for stage in stages:
        row = re.search(rf"^\| `{stage['name']}` \| (\d+) s \|", readme, re.MULTILINE)
        assert row, f"tests/gpu/README.md: no stage-table row for {stage['name']!r}"
        assert int(row.group(1)) == stage["limit_s"], stage["name"]


def test_kit_none_plans_no_kit_stage_and_needs_no_kit(tmp_path):
    with_kit, _ = plan(tmp_path, KIT=str(tmp_path / "missing"))
    stages, _ = plan(tmp_path, KIT="none")
    names = [s["name"] for s in stages]
    assert names == [n for n in STAGES if n != "kit"]
    assert not any("lay_kit" in s["command"] or "missing" in s["command"] for s in stages)
    # the other stages run the same commands under the same limits
    assert [s for s in with_kit if s["name"] != "kit"] == stages


def test_kit_stage_without_wheels_stops_with_one_line_naming_the_fix(tmp_path):
    (tmp_path / "kit" / "whl").mkdir(parents=True)
    run = subprocess.run(
        ["bash", str(GPU / "lay_kit.sh"), str(tmp_path / "kit"), str(tmp_path / "site"), sys.executable],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert run.returncode == 2, run
    lines = run.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in run.stderr, run.stderr
    assert "prepare_kit.sh" in lines[0] and "KIT=none" in lines[0]
    assert not (tmp_path / "site").exists()


def test_env_stage_records_the_source_and_the_machine_without_cuda(tmp_path):
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": ""}
    run = subprocess.run(
        [sys.executable, str(GPU / "device_record.py"), "env", str(tmp_path), "--repo", str(REPO)],
        env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr[-3000:]
    info = json.loads((tmp_path / "env.json").read_text())
    assert info["executable"] == sys.executable and info["gpu"] is None and info["gpu_count"] == 0
    assert "torch" in info and "nvidia_smi_query" in info
    blobs = (tmp_path / "source_blobs.txt").read_text().splitlines()
    assert any(line.endswith("  tests/gpu/run_on_device.sh") for line in blobs)
    assert (tmp_path / "env.txt").read_text().strip()
