"""``scripts/slurm/capo_ray.slurm``, the batch script of a multi-node run, run here with SLURM's variables set and
``scontrol``, ``srun``, ``hostname`` and ``ray`` replaced by small scripts that record their arguments.

The stand-in ``srun`` records its options and the variables the recipe reads, then runs the command it was given
(so the recipe itself runs, with ``--dry-run``: it composes and validates the config and starts nothing); the
stand-in ``ray`` records ``ray start`` and answers ``ray status`` in Ray 2.60's format, listing one active node per
``ray start`` it recorded (the output of a real ``ray status`` is quoted in the helper below).
"""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "scripts" / "slurm" / "capo_ray.slurm"
RECIPE = "scripts/run_capo_qwen2.5_math_1.5b.sh"

FAKES = {
    "scontrol": """#!/bin/bash
[ "$1 $2" = "show hostnames" ] || exit 3
printf '%s\\n' gpu01 gpu02
""",
    "hostname": """#!/bin/bash
echo "10.1.2.3 fe80::1"
""",
    # options first (all --opt=value), then the command, which runs
    "srun": """#!/bin/bash
python3 - "$@" <<'PY' >> "$FAKE_LOG"
import json, os, sys
env = {k: os.environ.get(k) for k in ("NNODES", "N_GPUS_PER_NODE", "RAY_ADDRESS")}
print(json.dumps({"tool": "srun", "args": sys.argv[1:], "env": env}))
PY
while [ "$#" -gt 0 ] && [[ "$1" == --* ]]; do shift; done
exec "$@"
""",
    # ray status: the "Active:" block of a real `ray status` (Ray 2.60), one node per recorded `ray start`
    "ray": """#!/bin/bash
if [ "$1" = start ]; then
    if [ -n "${FAKE_RAY_LOSE_WORKERS:-}" ] && [[ " $* " != *" --head "* ]]; then exit 0; fi
    python3 -c 'import json, sys; print(json.dumps({"tool": "ray", "args": sys.argv[1:]}))' "$@" >> "$FAKE_LOG"
    exit 0
fi
[ "$1" = status ] || exit 3
started=$(grep -c '"tool": "ray"' "$FAKE_LOG" || true)
[ "$started" -gt 0 ] || exit 1
echo "======== Autoscaler status: 2026-12-07 18:08:43.347754 ========"
echo "Node status"
echo "---------------------------------------------------------------"
echo "Active:"
for i in $(seq "$started"); do echo " 1 node_d5a002f9de4ab6775987215d1093d6caf26b27638${i}"; done
echo "Pending:"
echo " (no pending nodes)"
echo "Recent failures:"
echo " (no failures)"
""",
}


def run_batch(tmp_path: Path, *args: str, **env_overrides: str) -> tuple[subprocess.CompletedProcess, list[dict]]:
    """Run the batch script as ``sbatch`` would on the first node of a 2-node job (``gpu[01-02]``, 4 H100s and 16
    CPUs per node), with the stand-ins first on PATH; returns the process and the recorded calls."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    for name, text in FAKES.items():
        (bin_dir / name).write_text(text)
        (bin_dir / name).chmod(stat.S_IRWXU)
    # PYTHON: the environment's Python, with the stand-in `ray` next to it (the script runs that one)
    (bin_dir / "python").write_text(f'#!/bin/bash\nexec "{sys.executable}" "$@"\n')
    (bin_dir / "python").chmod(stat.S_IRWXU)
    log = tmp_path / "calls.jsonl"
    log.write_text("")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "RAY_", "CAPO_"))}
    env.pop("NNODES", None)
    env.pop("N_GPUS_PER_NODE", None)
    env.update(
        PATH=f"{bin_dir}:{env['PATH']}",
        PYTHON=str(bin_dir / "python"),
        FAKE_LOG=str(log),
        SLURM_JOB_NODELIST="gpu[01-02]",
        SLURM_JOB_NUM_NODES="2",
        SLURM_NNODES="2",
        SLURM_GPUS_PER_NODE="h100:4",
        SLURM_CPUS_PER_TASK="16",
        SLURM_SUBMIT_DIR=str(REPO),
        CAPO_DATA_DIR=str(tmp_path / "data"),
        CAPO_CKPT_DIR=str(tmp_path / "ckpt"),
        CAPO_RAY_POLL_S="0.2",
    )
    env.update(env_overrides)
    proc = subprocess.run(
        ["bash", str(SCRIPT), *args], env=env, capture_output=True, text=True, timeout=600, cwd=tmp_path
    )
    calls = [json.loads(line) for line in log.read_text().splitlines()]
    return proc, calls


def test_batch_script_starts_ray_on_every_node_and_the_recipe_on_the_head_with_the_cluster_size(tmp_path):
    proc, calls = run_batch(tmp_path, RECIPE, "--dry-run", "trainer.total_training_steps=3")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr

    starts = [call["args"] for call in calls if call["tool"] == "ray"]
    head = ["start", "--head", "--node-ip-address=10.1.2.3", "--port=6379", "--num-cpus=16", "--num-gpus=4", "--block"]
    worker = ["start", "--address=10.1.2.3:6379", "--num-cpus=16", "--num-gpus=4", "--block"]
    assert starts == [head, worker]
    steps = [call for call in calls if call["tool"] == "srun"]
    assert [step["args"][:3] for step in steps[1:3]] == [
        ["--nodes=1", "--ntasks=1", "--nodelist=gpu01"],
        ["--nodes=1", "--ntasks=1", "--nodelist=gpu02"],
    ]
    launch = steps[-1]
    assert launch["args"] == [
        "--overlap", "--nodes=1", "--ntasks=1", "--nodelist=gpu01",
        "bash", str(REPO / RECIPE), "--dry-run", "trainer.total_training_steps=3",
    ]  # fmt: skip
    assert launch["env"] == {"NNODES": "2", "N_GPUS_PER_NODE": "4", "RAY_ADDRESS": "10.1.2.3:6379"}
    # the recipe's own dry run: the command it would start, with the cluster size, on the Ray cluster started here
    command = next(line for line in proc.stdout.splitlines() if "verl.trainer.main_ppo" in line)
    assert "trainer.nnodes=2" in command and "trainer.n_gpus_per_node=4" in command
    assert "RAY_ADDRESS=10.1.2.3:6379" in proc.stdout


def test_batch_script_stops_when_a_node_does_not_join_ray(tmp_path):
    proc, calls = run_batch(tmp_path, RECIPE, "--dry-run", FAKE_RAY_LOSE_WORKERS="1", CAPO_RAY_WAIT_S="2")
    assert proc.returncode == 1
    assert "CAPO_RAY_WAIT_S" in proc.stderr and "1 of 2" in proc.stderr
    assert not any(call["tool"] == "srun" and "--overlap" in call["args"] for call in calls)  # no recipe started


def test_batch_script_refuses_a_job_without_gpus_per_node(tmp_path):
    proc, calls = run_batch(tmp_path, RECIPE, SLURM_GPUS_PER_NODE="")
    assert proc.returncode == 2
    assert "--gpus-per-node" in proc.stderr and "N_GPUS_PER_NODE" in proc.stderr
    assert calls == []
