"""Matrix-multiply throughput of this CPU in float32 and bfloat16, at the shapes of SmolLM2-135M's MLP (hidden 576,
intermediate 1536) for a decode batch (32 rows) and a training micro-batch (32 x 112 = 3584 rows), with the CPU's
bf16-related instruction flags. On a CPU without bf16 instructions (avx512_bf16, amx_bf16) torch computes bf16
matmuls by conversion, and float32 is the faster precision for every pass of a CPU run.

    python benchmarks/matmul_dtype.py            # prints one line per (dtype, rows): ms per call and GFLOP/s
"""

from __future__ import annotations

import os
import time

import torch


def gflops(dtype: torch.dtype, rows: int, *, reps: int) -> tuple[float, float]:
    """``(ms per call, GFLOP/s)`` of ``linear((rows, 576), (1536, 576))`` in ``dtype``, median of 5 timings."""
    a, w = torch.randn(rows, 576, dtype=dtype), torch.randn(1536, 576, dtype=dtype)
    for _ in range(3):
        torch.nn.functional.linear(a, w)
    times = []
    for _ in range(5):
        t = time.perf_counter()
        for _ in range(reps):
            torch.nn.functional.linear(a, w)
        times.append((time.perf_counter() - t) / reps)
    dt = sorted(times)[2]
    return dt * 1e3, 2 * rows * 576 * 1536 / dt / 1e9


def main() -> None:
    flags = (
        open("/proc/cpuinfo").read().split("flags", 2)[1].split("\n")[0].split()
        if os.path.exists("/proc/cpuinfo")
        else []
    )
    wanted = ("avx2", "avx512f", "avx512_bf16", "amx_bf16", "amx_tile")
    print(
        f"torch {torch.__version__}, {torch.get_num_threads()} threads; cpu flags: "
        + ", ".join(f"{f} {'yes' if f in flags else 'no'}" for f in wanted)
    )
    for rows, reps in ((32, 200), (3584, 5)):
        for dtype in (torch.float32, torch.bfloat16):
            ms, g = gflops(dtype, rows, reps=reps)
            print(f"{str(dtype):15s} rows {rows:5d}: {ms:8.3f} ms  {g:7.1f} GFLOP/s")


if __name__ == "__main__":
    main()
