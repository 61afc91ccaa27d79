"""``capo-verl eval teacher-forced``: the command line of :mod:`capo_verl.evaluation.teacher_forced` (options,
``--model LABEL=PATH`` parsing, the run that scores the pool with every model and writes ``--out`` and its lpm files).

    capo-verl eval teacher-forced --pool runs/base.jsonl --benchmarks gsm8k math500 \\
        --model ckpt/step_0 ckpt/step_100 ckpt/step_200 --out runs/teacher_forced.json

The library never imports this module; ``capo-verl eval`` (:mod:`capo_verl.evaluation.cli`) adds it as a sub-command.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
from pathlib import Path
from typing import Any

import numpy as np

from capo_verl import commands, outputs
from capo_verl.evaluation.score import parse_labelled
from capo_verl.evaluation.teacher_forced import (
    ScoreInfo,
    problems_for,
    question_keys,
    read_pool,
    resolve_device,
    resolve_model_path,
    score_pool,
    teacher_forced_metrics,
    torch_dtype,
)

COMMAND = "eval teacher-forced"
DESCRIPTION = (
    "Score a fixed pool of responses with each checkpoint by teacher forcing (mean token log-prob, nats) and report "
    "the AUC-mean of that lpm against the pool's fixed correctness: how each checkpoint ranks the SAME responses, not "
    "its own samples."
)


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
    run_ = p.add_argument_group("forward pass (transformers)")
    commands.add_option(run_, "--batch-size")
    commands.add_option(
        run_,
        "--dtype",
        default="float32",
        why="checkpoints are compared on lpm differences that bfloat16 rounding would blur",
        help="weight dtype: float32, bfloat16 or float16",
    )
    commands.add_option(
        run_,
        "--device",
        help="where the model runs: auto (a CUDA GPU when there is one, else cpu), cpu, cuda or cuda:N (default auto)",
        metavar="{auto,cpu,cuda,cuda:N}",
    )
    commands.add_option(run_, "--threads", help="CPU threads for torch (default: torch's choice)")
    return p


def build_parser() -> argparse.ArgumentParser:
    """The standalone parser, ``prog="capo-verl eval teacher-forced"``."""
    return add_arguments(commands.parser(COMMAND, DESCRIPTION))


def _finite_or_none(d: dict) -> dict:
    return {k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in d.items()}


def check_arguments(args: argparse.Namespace) -> tuple[dict[str, str], outputs.Outputs, list[dict]]:
    """Every check that needs no model: options, ``--out`` and its lpm files against every input, the pool, the
    checkpoints' folders and the prompts. Writes nothing.

    Returns:
        ``(models, outs, pool)``: ``{label: path}``; the run's :class:`~capo_verl.outputs.Outputs`, whose outputs are
        ``--out`` and then one ``OUT_STEM.N.npy`` per model, in ``models`` order; the pool's records.

    Raises:
        UsageError: ``--threads`` outside the usable cores; an ``--out`` that is not ``.json`` or cannot be written.
        capo_verl.outputs.InputIsOutput: ``--out`` or an lpm file is the pool, a data file, a checkpoint or the
            tokenizer (or a file inside one of their folders).
        ValueError, FileNotFoundError: a bad ``--dtype`` or ``--device``, pool, checkpoint or data
            (:func:`~capo_verl.evaluation.teacher_forced.read_pool`, ...).
    """
    if args.threads is not None:
        cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
        if not 1 <= args.threads <= cores:
            raise commands.UsageError(f"--threads must lie in [1, {cores}] (the usable cores), got {args.threads}")
    torch_dtype(args.dtype)
    resolve_device(args.device)
    models = parse_labelled(args.model, what="--model", default_label=str)
    outs = outputs.Outputs(COMMAND)
    outs.input("--pool", args.pool)
    outs.input("--data", *args.data)
    outs.input("--tokenizer", args.tokenizer)
    outs.input("--model", *(path for path in models.values() if os.path.exists(os.path.expanduser(path))))
    out = outs.file("--out", args.out, suffix=".json")
    for n in range(len(models)):
        outs.file("--out", out.path.with_name(f"{out.path.stem}.{n}.npy"))
    outs.check()
    pool = read_pool(args.pool)
    for path in models.values():  # refuse a missing checkpoint before the first one is scored
        resolve_model_path(path)
    problems_for(pool, args.data, args.benchmarks)  # and a pool question missing from the data
    return models, outs, pool


def _model_entry(path: str, lpm: np.ndarray, lpm_file: Path, pool_columns: tuple, info: ScoreInfo) -> dict:
    """One model's part of ``--out``: its metrics over all and per data source, its lpm file, tokens and timings."""
    correct, keys, sources = pool_columns
    return {
        "model": path,
        "metrics": _finite_or_none(teacher_forced_metrics(lpm, correct, keys)),
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


def run(args: argparse.Namespace) -> int:
    """Execute parsed arguments: score the pool with every model, write ``--out`` and the lpm files; returns 0.

    ``--out`` holds ``{"pool", "n_responses", "n_questions", "pool_metrics" (the pool's own sampling-time lpm, when
    every line has a finite one), "settings", "models": {label: {"model", "metrics", "by_data_source", "lpm_file",
    "tokens", "wall_s"}}}``; ``lpm_file`` is a ``(n,)`` float64 ``.npy`` (nats) aligned with the pool's lines.
    Non-finite floats are written as null. Everything :func:`check_arguments` checks is checked before the first
    model loads. ``--out`` and the lpm files are written whole, together, once every model is scored
    (:class:`capo_verl.outputs.Outputs`: temporary siblings moved in at the end, under a lock): a run stopped or
    failed part way leaves the files of the previous run as they were.

    Raises:
        UsageError, ValueError, FileNotFoundError: as :func:`check_arguments` and
            :func:`~capo_verl.evaluation.teacher_forced.score_pool`.
        capo_verl.outputs.OutputLocked: another process writes ``--out``.
    """
    import torch

    models, outs, pool = check_arguments(args)
    out, lpm_files = outs.outputs[0], outs.outputs[1:]
    if args.threads is not None:
        torch.set_num_threads(args.threads)
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
    with outs.writing():  # locked; every file moved in once all models are scored
        for (label, path), lpm_file in zip(models.items(), lpm_files, strict=True):
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
            np.save(lpm_file.stage, lpm)
            entry = result["models"][label] = _model_entry(path, lpm, lpm_file.path, (correct, keys, sources), info)
            metrics = entry["metrics"]
            print(
                f"{label}: AUC-mean {_fmt(metrics['auc_mean'])} ({metrics['n_mixed_questions']} mixed "
                f"questions), lpm correct {_fmt(metrics['lpm_correct_mean'])} / incorrect "
                f"{_fmt(metrics['lpm_incorrect_mean'])} nats, "
                f"{info.response_tokens / max(info.forward_s, 1e-9):.0f} response tokens/s",
                file=sys.stderr,
            )
        out.stage.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {out.path}", file=sys.stderr)
    return 0


def _fmt(x: float | None) -> str:
    return "nan" if x is None else f"{x:.4f}"


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``capo-verl eval teacher-forced``; returns the exit status (:func:`capo_verl.commands.main`)."""
    return commands.main(build_parser(), run, argv)


if __name__ == "__main__":
    sys.exit(main())
