"""Step time of the comparison's setting (``configs/compare_smollm2_135m_cpu.yaml``) under settings that leave the
method's math unchanged, from verl's ``timing_s/*`` metrics.

Each variant is one run of verl's trainer (under ``capo_verl.cpu.launch``) on SmolLM2-135M-Instruct with the compare
config, ``--prompts`` x 8 samples per step, no validation and no checkpoint; the first step is a warm-up and is
dropped. Variants (``--variants``, in this order by default):

  base      the compare config, with ``--prompts`` prompts per step and one on-policy update per step
  micro     every micro-batch holds the whole step (actor update, old log-prob and reference passes)
  bypass    ``micro`` + verl's ``algorithm.rollout_correction.bypass_mode``: the rollout's log-probs (vLLM, bf16)
            stand in for the actor's ``old_log_prob`` pass. Not the same numbers: CAPO's lpm and the PPO ratio's
            denominator then come from vLLM's kernels, and verl logs no ``actor/entropy``
  packed    ``actor_rollout_ref.model.use_remove_padding=true``: the actor and reference passes on packed sequences
            (no pad tokens computed); the same log-probs up to kernel rounding
  fp32      the actor's and the reference's FSDP mixed precision in float32 (param, reduce, buffer) instead of bf16
            parameters; vLLM still generates in bf16
  f32       ``fp32`` + vLLM generating in float32 (``actor_rollout_ref.rollout.dtype=float32``): every pass in
            float32, for a CPU without bf16 instructions (no avx512_bf16 / amx_bf16), where bf16 matmuls are slower

    python benchmarks/compare_step_time.py --method capo --steps 5 --prompts 8 --json out.json

Prints, per variant, the median over the measured steps of ``timing_s/step`` and of its parts, and the 1-minute
load before and after the run (the runs are sequential, so a shared machine's load can differ between them).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

PARTS = ("gen", "old_log_prob", "ref", "adv", "update_actor", "update_weights")


def variant_overrides(name: str, responses: int) -> list[str]:
    micro = [
        f"actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu={responses}",
        f"actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu={responses}",
        f"actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu={responses}",
    ]
    fp32 = [f"actor_rollout_ref.{role}.fsdp_config.mixed_precision.param_dtype=fp32" for role in ("actor", "ref")]
    return {
        "base": [],
        "micro": micro,
        "bypass": [*micro, "algorithm.rollout_correction.bypass_mode=true"],
        "packed": ["actor_rollout_ref.model.use_remove_padding=true"],
        "fp32": fp32,
        "f32": [*fp32, "actor_rollout_ref.rollout.dtype=float32"],
    }[name]


def run_variant(name: str, args, workdir: Path) -> dict:
    from capo_verl.compare.methods import METHODS
    from capo_verl.compare.running import main_ppo_command, train_env
    from capo_verl.cpu.launch import launch_command
    from capo_verl.cpu.models import SMOLLM2_NAME, cache_dir, smollm2_checkpoint
    from capo_verl.data import write_gsm8k_calc_parquet

    smollm2_checkpoint(verbose=False)
    data = Path.home() / "data" / "capo" / "compare"
    write_gsm8k_calc_parquet(data, n_train=1024, n_val=64, n_test=64, seed=0)
    responses = args.prompts * 8
    run_dir = workdir / name
    run_dir.mkdir(parents=True, exist_ok=True)
    overrides = [
        *METHODS[args.method].overrides,
        f"actor_rollout_ref.model.path={cache_dir() / SMOLLM2_NAME}",
        f"data.train_files={data / 'gsm8k_calc_train.parquet'}",
        f"data.val_files={data / 'gsm8k_calc_val.parquet'}",
        f"data.train_batch_size={args.prompts}",
        f"actor_rollout_ref.actor.ppo_mini_batch_size={args.prompts}",
        f"trainer.total_training_steps={args.steps}",
        "trainer.val_before_train=false",
        "trainer.test_freq=-1",
        "trainer.save_freq=-1",
        "++trainer.logger=[console,file]",
        f"trainer.default_local_dir={run_dir / 'ckpt'}",
        *variant_overrides(name, responses),
    ]
    cmd = launch_command(main_ppo_command(REPO / "configs", "compare_smollm2_135m_cpu", overrides))
    metrics = run_dir / "metrics.jsonl"
    load0 = os.getloadavg()[0]
    t0 = time.time()
    with open(run_dir / "console.log", "w") as log:
        rc = subprocess.run(
            cmd, env=train_env(metrics), stdout=log, stderr=subprocess.STDOUT, timeout=args.timeout
        ).returncode
    wall = time.time() - t0
    if rc != 0:
        raise RuntimeError(f"{name}: exit {rc}; log {run_dir / 'console.log'}")
    steps: dict[int, dict] = {}
    for line in metrics.read_text().splitlines():
        record = json.loads(line)
        steps.setdefault(int(record["step"]), {}).update(record["data"])
    measured = [steps[s] for s in sorted(steps) if s > 1]
    result = {"wall_s": wall, "load_before": load0, "load_after": os.getloadavg()[0], "steps": len(measured)}
    for key in ("step", *PARTS):
        values = [m[f"timing_s/{key}"] for m in measured if f"timing_s/{key}" in m]
        result[key] = statistics.median(values) if values else None
    result["command"] = cmd
    return result


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--method", default="capo", choices=["capo", "grpo"])
    p.add_argument("--variants", nargs="+", default=["base", "micro", "bypass"])
    p.add_argument("--steps", type=int, default=5, help="steps per run; the first is a warm-up")
    p.add_argument("--prompts", type=int, default=8, help="prompts per step (8 samples each)")
    p.add_argument("--timeout", type=float, default=1200)
    p.add_argument("--workdir", default=None)
    p.add_argument("--json", default=None)
    args = p.parse_args()
    workdir = Path(args.workdir or tempfile.mkdtemp(prefix="capo_compare_step_"))
    results = {}
    for name in args.variants:
        results[name] = r = run_variant(name, args, workdir)
        parts = "  ".join(f"{k} {r[k]:.2f}" for k in PARTS if r[k] is not None)
        print(
            f"{name:7s} step {r['step']:.2f} s (median of {r['steps']})  {parts}  "
            f"load {r['load_before']:.1f} -> {r['load_after']:.1f}  (logs {workdir / name})",
            flush=True,
        )
    if args.json:
        Path(args.json).write_text(json.dumps({"args": vars(args), "results": results}, indent=1) + "\n")


if __name__ == "__main__":
    main()
