"""How much of a validation AUC-mean is sampling noise: two validation passes of the same model, batched differently.

`capo-verl compare` starts every method from the same model, so the step-0 validation passes of all methods measure
the same thing; any difference between them is sampling noise of the validation itself. This script runs verl's
trainer twice in validation-only mode (``trainer.val_only=true``) on the compare setting (SmolLM2-135M-Instruct,
the 64 validation problems x 8 samples at temperature 1.0 of ``configs/compare_smollm2_135m_cpu.yaml``, the CPU
profile's vLLM rollout), once with ``rollout.max_num_seqs=512`` (vLLM decodes a burst as one batch) and once with
``max_num_seqs=24`` (the same requests in other batches), and prints for each pass AUC-mean and accuracy with their
95% bootstrap intervals, the paired difference, and how many of the responses are the same in both.

On CPU, ``capo_verl.cpu.vllm_cpu`` gives every vLLM request its own seed (``request_seed``: rollout seed, replica
rank, trainer step, prompt tokens, occurrence of the prompt at that step), so the two passes draw with the same
random numbers whatever the batching, and differ only where float rounding of the batched forward pass (bfloat16)
tips a sampled token: a difference of AUC-mean between them is then rounding, not sampling. Responses are compared
per question as multisets, since the 8 samples of a question may reach the server in another order. Both passes
prefill whole prompts (the CPU profile's ``rollout.enable_chunked_prefill: false``).

    python benchmarks/validation_noise.py                       # about 8 minutes on 2 idle cores
    python benchmarks/validation_noise.py --json out.json       # also write the figures to a file
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

from capo_verl.compare.report import dump_lines

REPO = Path(__file__).resolve().parents[1]


def validation_pass(workdir: Path, name: str, max_num_seqs: int, data_dir: Path, model: Path, timeout: int) -> Path:
    """Run verl's trainer in validation-only mode; return the dump ``<workdir>/<name>/0.jsonl``."""
    from capo_verl.compare.running import main_ppo_command, train_env

    out = workdir / name
    out.mkdir(parents=True, exist_ok=True)
    cmd = main_ppo_command(
        REPO / "configs",
        "compare_smollm2_135m_cpu",
        [
            f"data.train_files={data_dir / 'gsm8k_calc_train.parquet'}",
            f"data.val_files={data_dir / 'gsm8k_calc_val.parquet'}",
            f"actor_rollout_ref.model.path={model}",
            f"actor_rollout_ref.rollout.max_num_seqs={max_num_seqs}",
            "trainer.val_before_train=true",
            "++trainer.val_only=true",
            "trainer.logger=[console,file]",
            f"trainer.experiment_name={name}",
            f"trainer.default_local_dir={out / 'ckpt'}",
            f"++trainer.validation_data_dir={out}",
        ],
    )
    with open(out / "console.log", "w") as log:
        proc = subprocess.run(
            cmd,
            cwd=out,
            env=train_env(out / "metrics.jsonl"),
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            timeout=timeout,
        )
    if proc.returncode != 0:
        raise RuntimeError(f"verl exited with {proc.returncode}; see {out / 'console.log'}")
    return out / "0.jsonl"


def responses(path: Path) -> dict[str, Counter]:
    """``{question: Counter(response texts)}`` of a validation dump."""
    out: dict[str, Counter] = {}
    for line in dump_lines(path):
        if line.strip():
            row = json.loads(line)
            out.setdefault(str(row["input"]), Counter())[str(row["output"])] += 1
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workdir", default=None)
    parser.add_argument("--timeout", type=int, default=1800)
    parser.add_argument("--json", default=None, help="also write the figures to this file")
    args = parser.parse_args(argv)

    from capo_verl.compare import MIN_VAL_QUESTIONS, paired_difference, pass_summary, read_validation_pass
    from capo_verl.cpu.models import smollm2_checkpoint
    from capo_verl.data import write_gsm8k_calc_parquet

    workdir = Path(args.workdir or tempfile.mkdtemp(prefix="capo_validation_noise_")).resolve()
    data_dir = workdir / "data"
    write_gsm8k_calc_parquet(data_dir, n_train=1024, n_val=MIN_VAL_QUESTIONS, n_test=64, seed=0)  # as compare
    model = smollm2_checkpoint()
    os.environ.setdefault("RAY_memory_monitor_refresh_ms", "0")

    dumps, runs = {}, {}
    for name, max_num_seqs in (("one_batch", 512), ("batches_of_24", 24)):
        print(f"[validation_noise] validation pass '{name}' (rollout.max_num_seqs={max_num_seqs}) ...", flush=True)
        load0, t0 = os.getloadavg()[0], time.time()
        try:
            dumps[name] = validation_pass(workdir, name, max_num_seqs, data_dir, model, args.timeout)
        except RuntimeError as exc:  # e.g. vLLM's engine failing to start on an overloaded machine: once more
            print(f"[validation_noise] '{name}': {exc}; trying once more", flush=True)
            dumps[name] = validation_pass(workdir, f"{name}_attempt2", max_num_seqs, data_dir, model, args.timeout)
        runs[name] = {
            "max_num_seqs": max_num_seqs,
            "wall_s": time.time() - t0,
            "load1_start_end": [load0, os.getloadavg()[0]],
        }
        print(
            f"[validation_noise] '{name}' done in {runs[name]['wall_s']:.0f} s, 1-min load "
            f"{load0:.1f} -> {os.getloadavg()[0]:.1f}",
            flush=True,
        )

    passes = {name: read_validation_pass(path) for name, path in dumps.items()}
    print(
        f"\nSmolLM2-135M-Instruct, the same weights validated twice on {MIN_VAL_QUESTIONS} problems x 8 samples "
        f"(T = 1.0), batched differently (logs in {workdir}):"
    )
    summaries = {}
    for name, vp in passes.items():
        s = summaries[name] = pass_summary(vp)
        print(
            f"  {name:14s}: AUC-mean {s['auc_mean']:.3f} [{s['auc_mean_ci'][0]:.3f}, {s['auc_mean_ci'][1]:.3f}] "
            f"over {s['n_mixed']} mixed questions, accuracy {100 * s['accuracy']:.1f}% "
            f"[{100 * s['accuracy_ci'][0]:.1f}, {100 * s['accuracy_ci'][1]:.1f}]"
        )
    a, b = passes.values()
    d = paired_difference(a, b)
    print(
        f"  difference     : AUC-mean {d['auc_mean_diff']:+.3f} [{d['auc_mean_diff_ci'][0]:+.3f}, "
        f"{d['auc_mean_diff_ci'][1]:+.3f}], accuracy {100 * d['accuracy_diff']:+.1f} points"
    )
    ra, rb = (responses(p) for p in dumps.values())
    same = sum(sum((ra[q] & rb.get(q, Counter())).values()) for q in ra)
    total = sum(sum(c.values()) for c in ra.values())
    print(f"  responses drawn in both passes: {same} of {total} ({100 * same / total:.1f}%)")
    distinct = [len(c) for c in ra.values()]
    print(
        f"  distinct responses per question (pass one): {sum(distinct) / len(distinct):.1f} of 8 on average "
        "(1 everywhere would mean the samples of a prompt share one seed)"
    )
    if args.json:
        Path(args.json).write_text(
            json.dumps(
                {
                    "passes": summaries,
                    "runs": runs,
                    "difference": d,
                    "same_responses": same,
                    "responses": total,
                    "distinct_per_question_mean": sum(distinct) / len(distinct),
                    "cores": len(os.sched_getaffinity(0)),
                },
                indent=2,
                default=float,
            )
            + "\n"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
