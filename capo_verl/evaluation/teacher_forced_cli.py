"""``capo-verl eval teacher-forced``: the command line of :mod:`capo_verl.evaluation.teacher_forced` (options,
``--model LABEL=PATH`` parsing, the run that scores the pool with every model and writes ``--out`` and its lpm files).

    capo-verl eval teacher-forced --pool runs/base.jsonl --benchmarks gsm8k math500 \\
        --model ckpt/step_0 ckpt/step_100 ckpt/step_200 --out runs/teacher_forced.json
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import os
import re
import sys
from pathlib import Path
from typing import Any

import numpy as np

from capo_verl.evaluation.score import parse_labelled
from capo_verl.evaluation.teacher_forced import (
    PROG,
    ScoreInfo,
    _problems_for,
    _torch_dtype,
    question_keys,
    read_pool,
    resolve_model_path,
    score_pool,
    teacher_forced_metrics,
)

logger = logging.getLogger("capo_verl.evaluation")


def add_arguments(p: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """Add the options of ``capo-verl eval teacher-forced`` to ``p`` (e.g. a subparser); returns ``p``."""
    p.add_argument("--pool", required=True, metavar="FILE", help="pool .jsonl (from `capo-verl eval generate`)")
    p.add_argument(
        "--model",
        required=True,
        nargs="+",
        metavar="PATH",
        help="checkpoint folder(s) to score the pool with (or `smollm2`); each one is scored; LABEL=PATH names it",
    )
    p.add_argument("--out", required=True, metavar="FILE.json", help="output JSON; per-model lpm go to FILE.N.npy")
    src = p.add_argument_group("prompts (as `capo-verl eval generate` built them)")
    src.add_argument("--data", nargs="+", default=[], metavar="FILE", help="verl-schema .parquet/.jsonl/.json files")
    src.add_argument(
        "--benchmarks",
        nargs="+",
        default=[],
        metavar="NAME",
        help="shipped benchmarks (default, with no --data: the pool's data sources)",
    )
    src.add_argument("--tokenizer", default=None, help="tokenizer folder for every model (default: each model's own)")
    run = p.add_argument_group("forward pass")
    run.add_argument("--batch-size", type=int, default=8, help="responses per forward pass (default 8)")
    run.add_argument("--dtype", default="float32", help="weight dtype: float32 (default), bfloat16, float16")
    run.add_argument("--device", default="cpu", help="cpu (default), cuda, cuda:N or auto")
    run.add_argument("--threads", type=int, default=None, help="CPU threads for torch (default: torch's choice)")
    return p


def build_parser() -> argparse.ArgumentParser:
    """The standalone parser, ``prog="capo-verl eval teacher-forced"``."""
    p = argparse.ArgumentParser(
        prog=PROG,
        description="Score a fixed pool of responses with each checkpoint by teacher forcing (mean token "
        "log-prob, nats) and report the AUC-mean of that lpm against the pool's fixed correctness: how each "
        "checkpoint ranks the SAME responses, not its own samples.",
    )
    return add_arguments(p)


def _finite_or_none(d: dict) -> dict:
    return {k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in d.items()}


def run(args: argparse.Namespace) -> int:
    """Execute parsed arguments: score the pool with every model, write ``--out`` and the lpm files; returns 0.

    ``--out`` holds ``{"pool", "n_responses", "n_questions", "pool_metrics" (the pool's own sampling-time lpm, when
    every line has a finite one), "settings", "models": {label: {"model", "metrics", "by_data_source", "lpm_file",
    "tokens", "wall_s"}}}``; ``lpm_file`` is a ``(n,)`` float64 ``.npy`` (nats) aligned with the pool's lines.
    Non-finite floats are written as null.

    Raises:
        ValueError, FileNotFoundError: as :func:`score_pool`, or bad options.
    """
    import torch

    if args.batch_size < 1:
        raise ValueError(f"--batch-size must be >= 1, got {args.batch_size}")
    if args.threads is not None:
        cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
        if not 1 <= args.threads <= cores:
            raise ValueError(f"--threads must lie in [1, {cores}] (the usable cores), got {args.threads}")
        torch.set_num_threads(args.threads)
    _torch_dtype(args.dtype)
    models = parse_labelled(args.model, what="--model", default_label=str)
    out = Path(args.out)
    if out.suffix != ".json":
        raise ValueError(f"--out {out}: expected a .json file name")
    pool = read_pool(args.pool)
    for path in models.values():  # refuse a missing checkpoint before the first one is scored
        resolve_model_path(path)
    _problems_for(pool, args.data, args.benchmarks)  # and a pool question missing from the data
    keys = question_keys(pool)
    correct = np.array([r["correct"] for r in pool], dtype=bool)
    sources = np.array([r["data_source"] for r in pool], dtype=object)
    result: dict[str, Any] = {
        "pool": str(args.pool),
        "n_responses": len(pool),
        "n_questions": int(len(np.unique(keys))),
        "settings": {
            "dtype": str(args.dtype),
            "device": args.device,
            "batch_size": args.batch_size,
            "data": [str(d) for d in args.data],
            "benchmarks": list(args.benchmarks),
            "tokenizer": args.tokenizer,
        },
    }
    own = [r.get("lpm") for r in pool]
    if all(isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) for v in own):
        result["pool_metrics"] = _finite_or_none(teacher_forced_metrics(own, correct, keys))
    result["models"] = {}
    out.parent.mkdir(parents=True, exist_ok=True)
    for n, (label, path) in enumerate(models.items()):
        info = ScoreInfo(model=path)
        lpm = score_pool(
            path,
            pool,
            data=args.data,
            benchmarks=args.benchmarks,
            tokenizer=args.tokenizer,
            dtype=args.dtype,
            batch_size=args.batch_size,
            device=args.device,
            info=info,
        )
        lpm_file = out.with_name(f"{out.stem}.{n}.npy")
        np.save(lpm_file, lpm)
        metrics = teacher_forced_metrics(lpm, correct, keys)
        entry = {
            "model": path,
            "metrics": _finite_or_none(metrics),
            "by_data_source": {
                s: _finite_or_none(teacher_forced_metrics(lpm[sources == s], correct[sources == s], keys[sources == s]))
                for s in sorted(set(sources))
            },
            "lpm_file": str(lpm_file),
            "tokens": {
                "prompt": info.prompt_tokens,
                "response": info.response_tokens,
                "from_token_ids": info.from_token_ids,
                "retokenized": info.retokenized,
                "retokenized_count_mismatch": info.retokenized_count_mismatch,
            },
            "wall_s": {"load": round(info.load_s, 3), "forward": round(info.forward_s, 3)},
        }
        result["models"][label] = entry
        out.write_text(json.dumps(result, indent=2) + "\n")  # after each model: a kill keeps the finished ones
        auc = metrics["auc_mean"]
        print(
            f"{label}: AUC-mean {auc:.4f} ({metrics['n_mixed_questions']} mixed questions), lpm correct "
            f"{metrics['lpm_correct_mean']:.4f} / incorrect {metrics['lpm_incorrect_mean']:.4f} nats, "
            f"{info.response_tokens / max(info.forward_s, 1e-9):.0f} response tokens/s",
            file=sys.stderr,
        )
    print(f"wrote {out}", file=sys.stderr)
    return 0


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``capo-verl eval teacher-forced``; returns the exit code.

    A usage or input error (``ValueError``, ``FileNotFoundError``, ``ImportError``) prints one line
    ``capo-verl eval teacher-forced: error: ...`` to stderr and returns 2, without a traceback; argparse's own
    usage errors exit with 2 as well.
    """
    args = build_parser().parse_args(argv)
    log = logging.getLogger("capo_verl.evaluation")
    if not log.handlers:
        handler = logging.StreamHandler()
        handler.setFormatter(logging.Formatter("%(levelname)s %(name)s: %(message)s"))
        log.addHandler(handler)
        log.setLevel(logging.INFO)
        log.propagate = False
    try:
        return run(args)
    except (ValueError, FileNotFoundError, ImportError) as e:
        message = re.sub(r"\s*\n\s*", " ", str(e).strip())
        print(f"{PROG}: error: {message}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
