"""Speed of the `capo` estimator through verl's compute_advantage, as ratios measured in one run.

Compares, on the same batch:
  capo      - algorithm.adv_estimator=capo with the noise mask on (old_log_probs + ref_log_prob)
  grpo      - verl's own grpo estimator (core_algos.compute_grpo_outcome_advantage)
  floor     - one masked-mean pass over old_log_probs plus writing the (bs, T) output
and prints capo/grpo (goal <= 0.5) and capo/floor (goal <= 2.0), plus the peak extra memory of capo
beyond its inputs (resident-set high-water mark, Linux): no (bs, bs) matrix, no padding to the largest group.
A last line times one ragged batch, 1 group of 1000 responses among 2000 groups of 2 (padded to
(n_groups, G_max, G_max) it needed > 19 GB).

    python benchmarks/capo_speed.py            # both shapes of the goal
    python benchmarks/capo_speed.py --quick    # small shapes, a smoke run
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import torch
import verl  # noqa: F401  (loads the capo-verl plugin)
from omegaconf import OmegaConf
from verl import DataProto
from verl.trainer.ppo.ray_trainer import compute_advantage
from verl.utils.torch_functional import masked_mean

from capo_verl.compat.advantage import pop_step_metrics


def make_batch(bs: int, T: int, G: int, seed: int = 0, sizes: list[int] | None = None) -> DataProto:
    """``bs`` responses in groups of ``G`` (or of the given ``sizes``), shuffled, padded to ``T`` tokens."""
    g = torch.Generator().manual_seed(seed)
    if sizes is not None:
        bs = sum(sizes)
    lengths = torch.randint(T // 4, T + 1, (bs,), generator=g)
    response_mask = (torch.arange(T).unsqueeze(0) < lengths.unsqueeze(1)).to(torch.int64)
    rewards = torch.zeros(bs, T)
    rewards[torch.arange(bs), lengths - 1] = (torch.rand(bs, generator=g) < 0.5).float()
    if sizes is None:
        uids = np.array([f"uid-{i // G}" for i in range(bs)], dtype=object)
    else:
        uids = np.array([f"uid-{k}" for k, s in enumerate(sizes) for _ in range(s)], dtype=object)
    perm = torch.randperm(bs, generator=g)
    return DataProto.from_dict(
        tensors={
            "token_level_rewards": rewards[perm],
            "response_mask": response_mask[perm],
            "old_log_probs": (torch.randn(bs, T, generator=g) * 0.5 - 1.0)[perm],
            "ref_log_prob": (torch.randn(bs, T, generator=g) * 0.3 - 0.5)[perm],
        },
        non_tensors={"uid": uids[perm.numpy()]},
    )


def extra_peak_rss(fn) -> float | None:
    """Bytes by which ``fn()`` raises the process's resident set above its size before the call (the high-water
    mark is reset through /proc/self/clear_refs, Linux >= 4.0; sees torch's CPU allocations); None elsewhere."""

    def status(field: str) -> int:
        with open("/proc/self/status") as f:
            return next(int(line.split()[1]) * 1024 for line in f if line.startswith(field + ":"))

    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        before = status("VmRSS")
    except OSError:
        return None
    fn()
    return status("VmHWM") - before


def best_of(fns: dict, repeats: int) -> dict[str, float]:
    """Fastest of ``repeats`` timings of each function, the functions interleaved so that a busy
    moment of the machine hits all of them alike."""
    best = {}
    for name, fn in fns.items():
        fn()  # warm-up
        best[name] = float("inf")
    for _ in range(repeats):
        for name, fn in fns.items():
            t0 = time.perf_counter()
            fn()
            best[name] = min(best[name], time.perf_counter() - t0)
    return best


def run(bs: int, T: int, G: int, repeats: int) -> None:
    data = make_batch(bs, T, G)
    capo_cfg = OmegaConf.create({"adv_estimator": "capo", "capo": {"use_mask": True}})
    grpo_cfg = OmegaConf.create({"adv_estimator": "grpo"})

    def capo():
        compute_advantage(data, adv_estimator="capo", config=capo_cfg)
        pop_step_metrics()

    def grpo():
        compute_advantage(data, adv_estimator="grpo", config=grpo_cfg)

    def floor():
        lpm = masked_mean(data.batch["old_log_probs"], data.batch["response_mask"], axis=-1)
        return lpm.unsqueeze(-1) * data.batch["response_mask"]

    t = best_of({"capo": capo, "grpo": grpo, "floor": floor}, repeats)
    t_capo, t_grpo, t_floor = t["capo"], t["grpo"], t["floor"]

    peak = extra_peak_rss(capo)
    print(
        f"bs={bs:5d} T={T:5d} G={G:3d} | capo {t_capo * 1e3:8.1f} ms  grpo {t_grpo * 1e3:8.1f} ms  "
        f"floor {t_floor * 1e3:8.1f} ms | capo/grpo {t_capo / t_grpo:5.2f} (goal <= 0.5)  "
        f"capo/floor {t_capo / t_floor:5.2f} (goal <= 2.0) | capo peak extra RSS {_mib(peak)}"
    )


def run_ragged(T: int, repeats: int) -> None:
    """One group of 1000 responses among 2000 groups of 2: time and peak extra memory of capo."""
    sizes = [1000] + [2] * 2000
    data = make_batch(0, T, 0, sizes=sizes)
    capo_cfg = OmegaConf.create({"adv_estimator": "capo", "capo": {"use_mask": True}})

    def capo():
        compute_advantage(data, adv_estimator="capo", config=capo_cfg)
        pop_step_metrics()

    t = best_of({"capo": capo}, repeats)["capo"]
    peak = extra_peak_rss(capo)
    print(
        f"ragged: 1 x 1000 + 2000 x 2 responses, T={T:5d} | capo {t * 1e3:8.1f} ms | "
        f"capo peak extra RSS {_mib(peak)} (pairs: {(1000**2 + 2000 * 4) * 4 / 2**20:.1f} MiB of float32)"
    )


def _mib(n: float | None) -> str:
    return "n/a" if n is None else f"{n / 2**20:.1f} MiB"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="small shapes only")
    parser.add_argument("--repeats", type=int, default=20)
    args = parser.parse_args()
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads")
    shapes = [(256, 512, 8)] if args.quick else [(1024, 3046, 8), (8192, 1024, 64)]
    for bs, T, G in shapes:
        run(bs, T, G, args.repeats)
    run_ragged(64 if args.quick else 512, max(1, args.repeats // 4))


if __name__ == "__main__":
    main()
