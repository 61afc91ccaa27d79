"""Estimator time and peak CUDA memory through verl's compute_advantage, against verl's grpo and grpo_vectorized.

The timing half of the CUDA tier (``pytest -m gpu`` checks the numbers; this measures them). On one CUDA device,
for each shape ``prompts x responses x tokens`` (default 128 x 8 x 4,096 = 1,024 x 4,096 and
512 x 16 x 8,192 = 8,192 x 8,192 response tokens), every registered capo-verl estimator (capo, grpo_mask, codapo,
cde) and verl's ``grpo`` / ``grpo_vectorized`` run through ``verl.trainer.ppo.ray_trainer.compute_advantage`` as the
trainer calls it (capo-verl's compat wrapper included) on a float32 batch already on the device: 0/1 outcome
rewards, right-padded masks (15% truncated), old / rollout / reference log-probs, shuffled rows.

Reported per estimator: median wall time of ``--reps`` calls after one warm-up (``torch.cuda.synchronize`` around
each), peak CUDA memory allocated during one call above what was allocated before it (MiB; the inputs are not
counted, the (bs, T) output is), and the time ratios to ``grpo`` and ``grpo_vectorized``.

    python benchmarks/gpu_tier.py                      # both shapes
    python benchmarks/gpu_tier.py --shapes 128x8x4096  # one shape
    python benchmarks/gpu_tier.py --json out.json      # also write the numbers

Needs CUDA: without it the script stops at once with an error (exit status 2).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
import uuid

DEFAULT_SHAPES = "128x8x4096,512x16x8192"
VERL_BASELINES = ("grpo", "grpo_vectorized")
CAPO = {"tau": 0.6, "ref_high": 2.5, "ref_low": 1.05, "use_mask": True, "normalize": "none", "reward_threshold": 0.5}


def parse_shapes(text: str) -> list[tuple[int, int, int]]:
    shapes = []
    for item in text.split(","):
        parts = item.strip().lower().split("x")
        if len(parts) != 3 or not all(p.isdigit() and int(p) > 0 for p in parts):
            raise SystemExit(f"--shapes: {item!r} is not prompts x responses x tokens, e.g. --shapes 128x8x4096")
        shapes.append(tuple(int(p) for p in parts))
    return shapes


def make_batch(n_prompts: int, n_responses: int, length: int, device: str, seed: int = 1) -> dict:
    """verl's batch at the advantage step, float32 on ``device`` (see the module docstring)."""
    import numpy as np
    import torch

    g = torch.Generator(device=device).manual_seed(seed)
    bs = n_prompts * n_responses

    def rand(*shape):
        return torch.rand(*shape, generator=g, device=device)

    def randn(*shape):
        return torch.randn(*shape, generator=g, device=device)

    lengths = (length / 16 + rand(bs) * (length - length / 16)).long().clamp(1, length)
    lengths = torch.where(rand(bs) < 0.15, torch.full_like(lengths, length), lengths)
    mask = (torch.arange(length, device=device)[None, :] < lengths[:, None]).to(torch.int64)
    p = rand(n_prompts)
    p = torch.where(rand(n_prompts) < 0.2, (p > 0.5).float(), p)
    correct = rand(bs) < p.repeat_interleave(n_responses)
    rewards = torch.zeros(bs, length, device=device)
    rewards[torch.arange(bs, device=device), lengths - 1] = correct.float()
    mu = -(0.05 + 1.45 * rand(bs))
    old = mu[:, None] * (1.0 + 0.5 * randn(bs, length)).clamp_(min=0.0)
    rollout = (old + 0.01 * randn(bs, length)).clamp_(max=0.0)
    nu = -(0.005 + 1.2 * rand(bs) ** 2)
    ref = nu[:, None] * (1.0 + 0.3 * randn(bs, length)).clamp_(min=0.0)
    perm = torch.randperm(bs, generator=g, device=device)
    uids = np.repeat(np.array([str(uuid.UUID(int=i)) for i in range(n_prompts)], dtype=object), n_responses)
    return {
        "token_level_rewards": rewards[perm],
        "response_mask": mask[perm],
        "old_log_probs": old[perm],
        "rollout_log_probs": rollout[perm],
        "ref_log_prob": ref[perm],
        "uid": uids[perm.cpu().numpy()],
    }


def measure(name: str, batch: dict, n_responses: int, reps: int) -> dict:
    """Median time (ms) and peak extra CUDA memory (MiB) of verl's compute_advantage for estimator ``name``."""
    import torch
    from omegaconf import OmegaConf
    from verl import DataProto
    from verl.trainer.ppo import ray_trainer

    from capo_verl.estimators.common import pop_step_metrics

    config = OmegaConf.create(
        {"adv_estimator": name, "gamma": 1.0, "lam": 1.0, "norm_adv_by_std_in_grpo": True, "capo": dict(CAPO)}
    )
    tensors = {k: v for k, v in batch.items() if k != "uid"}

    def call():
        data = DataProto.from_dict(
            tensors=dict(tensors), non_tensors={"uid": batch["uid"]}, meta_info={"global_steps": 1}
        )
        out = ray_trainer.compute_advantage(
            data,
            adv_estimator=name,
            gamma=1.0,
            lam=1.0,
            num_repeat=n_responses,
            norm_adv_by_std_in_grpo=True,
            config=config,
        )
        pop_step_metrics()
        return out

    call()  # warm-up
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    before = torch.cuda.memory_allocated()
    out = call()
    torch.cuda.synchronize()
    peak = (torch.cuda.max_memory_allocated() - before) / 2**20
    del out
    times = []
    for _ in range(reps):
        torch.cuda.synchronize()
        start = time.perf_counter()
        call()
        torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
    return {"median_ms": statistics.median(times) * 1e3, "min_ms": min(times) * 1e3, "peak_extra_mib": peak}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--shapes", default=DEFAULT_SHAPES, help=f"prompts x responses x tokens (default {DEFAULT_SHAPES})"
    )
    parser.add_argument("--reps", type=int, default=10, help="timed calls per estimator after one warm-up (default 10)")
    parser.add_argument("--json", default=None, help="also write the numbers to this file")
    args = parser.parse_args(argv)
    shapes = parse_shapes(args.shapes)
    if args.reps < 1:
        parser.error(f"--reps must be >= 1, got {args.reps}")

    import torch

    if not torch.cuda.is_available():
        print(
            f"benchmarks/gpu_tier.py needs CUDA: torch.cuda.is_available() is False (torch {torch.__version__}, "
            f"CUDA build {torch.version.cuda}). Run it on a node with an NVIDIA GPU and a CUDA build of torch.",
            file=sys.stderr,
        )
        return 2
    import verl  # noqa: F401  (loads the capo-verl plugin through its entry point, as a run does)
    from verl.trainer.ppo import ray_trainer

    from capo_verl.compat.methods import ESTIMATORS

    if not getattr(ray_trainer.compute_advantage, "__wrapped_by_capo_verl__", False):
        print("capo-verl's compute_advantage wrapper is not installed (is capo-verl installed?)", file=sys.stderr)
        return 2
    device = torch.cuda.get_device_name(0)
    print(f"device: {device}; torch {torch.__version__} (CUDA {torch.version.cuda}); verl {verl.__version__}")
    results = {"device": device, "torch": torch.__version__, "verl": verl.__version__, "shapes": []}
    names = [*VERL_BASELINES, *ESTIMATORS]
    for n_prompts, n_responses, length in shapes:
        batch = make_batch(n_prompts, n_responses, length, "cuda")
        bs = n_prompts * n_responses
        rows = {name: measure(name, batch, n_responses, args.reps) for name in names}
        del batch
        torch.cuda.empty_cache()
        print(f"\n{bs:,} responses x {length:,} tokens ({n_prompts} prompts x {n_responses}); median of {args.reps}")
        print(f"{'estimator':<16}{'time ms':>10}{'peak+ MiB':>12}{'/ grpo':>9}{'/ grpo_vec':>12}")
        for name, row in rows.items():
            row["vs_grpo"] = row["median_ms"] / rows["grpo"]["median_ms"]
            row["vs_grpo_vectorized"] = row["median_ms"] / rows["grpo_vectorized"]["median_ms"]
            print(
                f"{name:<16}{row['median_ms']:>10.2f}{row['peak_extra_mib']:>12.0f}"
                f"{row['vs_grpo']:>9.3f}{row['vs_grpo_vectorized']:>12.3f}"
            )
        results["shapes"].append({"prompts": n_prompts, "responses": n_responses, "tokens": length, "rows": rows})
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
