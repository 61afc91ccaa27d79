"""``capo-verl mask-thresholds``: CAPO's noise-mask thresholds ``ref_high`` / ``ref_low`` by the paper's quartile rule.

The paper masks correct responses whose reference perplexity exceeds ``ref-high`` (likely lucky guesses) and
incorrect ones whose reference perplexity is below ``ref-low`` (likely near-misses), and sets the two "at the upper
and lower quartiles of the reference model's PPL distribution" (section 4, "Denoising via Reference-Model-Based
Masking"); its appendix (experimental settings) says "over correct and incorrect responses". Two readings:

- ``per-outcome`` (the default): ``ref_high`` = the upper quartile of PPL_ref over the **correct** responses,
  ``ref_low`` = the lower quartile over the **incorrect** ones. Each rule then masks a quarter of its own outcome,
  whatever the model's accuracy. (The appendix's "lower and upper quartiles ..., respectively" read word for word
  would set ``ref_high`` to the correct responses' lower quartile and mask three quarters of them; the section-4
  text and the masks' purpose say upper for ``ref_high``.)
- ``whole``: both quartiles of the whole PPL_ref distribution (correct and incorrect together), section 4's words.
  How much of each outcome it masks depends on the accuracy: at 10% accuracy the quartiles are nearly those of the
  incorrect responses.

Both are computed and written; ``--rule`` picks the one printed as Hydra overrides. What the command does:

1. Draws ``K`` responses to each of ``N`` prompts of a training parquet, the prompts sampled with
   ``numpy.random.default_rng(seed)``, through ``capo-verl eval generate`` (verl's chat formatting, vLLM, the
   rollout's temperature and response length, seeded per question) -- or reads an existing pool (``--pool``, the
   format ``capo-verl eval generate --save-token-ids`` writes, as the teacher-forced pool of ``capo-verl compare``).
2. Grades every response again with the project's reward (:func:`capo_verl.reward.compute_score`), so a pool drawn
   under an older reward is graded by the current one.
3. Scores each response's reference perplexity PPL_ref = exp(-mean token log-prob) with the reference model by
   teacher forcing in float32 (:func:`capo_verl.evaluation.teacher_forced.score_pool`). In training, verl computes
   the same quantity from ``ref_log_prob`` in the actor's precision (bf16 or float32 on the CPU configs, by the
   CPU): values agree to about 1% of PPL in bf16, well inside the intervals below.
4. Writes the quartiles, 95% bootstrap intervals (questions resampled with replacement, as the responses of one
   question are not independent), the masked fractions at the chosen values, and the overrides to paste, to
   ``--out`` (JSON), and prints them.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shlex
import subprocess
import sys
from pathlib import Path

import numpy as np

from capo_verl import commands, outputs

#: the two readings of the paper's rule (module docstring)
RULES = ("per-outcome", "whole")


def thresholds(ref_ppl: np.ndarray, correct: np.ndarray, rule: str = "per-outcome") -> tuple[float, float]:
    """``(ref_high, ref_low)`` by one reading of the paper's quartile rule (module docstring).

    Args:
        ref_ppl: ``(n,)`` float64 reference perplexity of each response (>= 1 for a real model).
        correct: ``(n,)`` bool correctness of each response.
        rule: ``per-outcome`` (upper quartile of the correct responses' PPL, lower quartile of the incorrect ones')
            or ``whole`` (upper and lower quartiles of all responses' PPL).

    Returns:
        ``(ref_high, ref_low)`` in perplexity units (numpy's linear-interpolation quantiles); NaN for a side with no
        response of its outcome (``per-outcome``).

    Raises:
        ValueError: an unknown rule, or inputs of different lengths.
    """
    ref_ppl = np.asarray(ref_ppl, dtype=np.float64).reshape(-1)
    correct = np.asarray(correct, dtype=bool).reshape(-1)
    if len(ref_ppl) != len(correct):
        raise ValueError(f"ref_ppl ({len(ref_ppl)}) and correct ({len(correct)}) must have one entry per response")
    if rule == "whole":
        return float(np.quantile(ref_ppl, 0.75)), float(np.quantile(ref_ppl, 0.25))
    if rule != "per-outcome":
        raise ValueError(f"rule={rule!r}: expected one of {', '.join(RULES)}")
    high = float(np.quantile(ref_ppl[correct], 0.75)) if correct.any() else math.nan
    low = float(np.quantile(ref_ppl[~correct], 0.25)) if (~correct).any() else math.nan
    return high, low


def masked_fractions(ref_ppl: np.ndarray, correct: np.ndarray, ref_high: float, ref_low: float) -> dict:
    """The shares CAPO's mask (paper Eq. 18) drops at ``(ref_high, ref_low)``: correct responses with
    PPL_ref > ref_high, incorrect ones with PPL_ref < ref_low, and all responses. NaN where an outcome is absent."""
    ref_ppl = np.asarray(ref_ppl, dtype=np.float64)
    correct = np.asarray(correct, dtype=bool)
    drop_c, drop_i = ref_ppl[correct] > ref_high, ref_ppl[~correct] < ref_low

    def share(x):
        return float(x.mean()) if len(x) else math.nan

    return {
        "correct": share(drop_c),
        "incorrect": share(drop_i),
        "all": (int(drop_c.sum()) + int(drop_i.sum())) / len(ref_ppl),
    }


def bootstrap_thresholds(
    ref_ppl: np.ndarray, correct: np.ndarray, question_ids: np.ndarray, rule: str, *, n_boot: int = 2000, seed: int = 0
) -> dict:
    """95% percentile-bootstrap intervals of :func:`thresholds`, resampling questions with replacement.

    Args:
        ref_ppl, correct: ``(n,)`` as :func:`thresholds`. question_ids: ``(n,)`` hashable question of each response.
        rule: as :func:`thresholds`. n_boot: resamples. seed: ``numpy.random.default_rng`` seed.

    Returns:
        ``{"ref_high": [lo, hi], "ref_low": [lo, hi]}``; a side's resamples without a response of its outcome are
        left out (``[nan, nan]`` when all are).
    """
    ref_ppl = np.asarray(ref_ppl, dtype=np.float64)
    correct = np.asarray(correct, dtype=bool)
    _, group = np.unique(np.asarray(question_ids), return_inverse=True)
    members = [np.flatnonzero(group == g) for g in range(group.max() + 1)]
    rng = np.random.default_rng(seed)
    draws = np.empty((n_boot, 2))
    for b in range(n_boot):
        idx = np.concatenate([members[g] for g in rng.integers(0, len(members), len(members))])
        draws[b] = thresholds(ref_ppl[idx], correct[idx], rule)

    def interval(col):
        x = draws[:, col][np.isfinite(draws[:, col])]
        return [float(np.quantile(x, 0.025)), float(np.quantile(x, 0.975))] if len(x) else [math.nan, math.nan]

    return {"ref_high": interval(0), "ref_low": interval(1)}


def sample_prompts(data: Path, n: int, seed: int, out: Path) -> Path:
    """Write ``n`` rows of the verl parquet ``data``, drawn without replacement by ``default_rng(seed)``, to ``out``.

    Raises:
        FileNotFoundError: no such file. ValueError: ``n`` exceeds the rows; ``data`` is not a parquet file
            (:func:`capo_verl.inputs.check_data_file`).
    """
    import pandas as pd

    from capo_verl import inputs

    if not os.path.lexists(data):
        raise FileNotFoundError(
            f"--data {data}: no such file (write the CPU training data with `capo-verl prepare-data`"
            " or the launch scripts)"
        )
    inputs.check_data_file(data, "--data")  # a loop, a folder, a sparse file, not parquet: refused before reading
    rows = pd.read_parquet(data)
    if not 1 <= n <= len(rows):
        raise ValueError(f"-n {n}: must lie in [1, {len(rows)}] (the rows of {data})")
    pick = np.random.default_rng(seed).choice(len(rows), size=n, replace=False)
    out.parent.mkdir(parents=True, exist_ok=True)
    rows.iloc[np.sort(pick)].reset_index(drop=True).to_parquet(out)
    return out


def regrade(pool: list[dict]) -> np.ndarray:
    """``(n,)`` bool: each pool response graded again with :func:`capo_verl.reward.compute_score`.

    Raises:
        ValueError: a line without ``response`` or ``ground_truth`` (names the line).
    """
    from capo_verl.reward import compute_score

    for r in pool:
        if not isinstance(r.get("response"), str) or r.get("ground_truth") is None:
            raise ValueError(
                f"pool line {r['_line']}: needs `response` and `ground_truth` to be graded again (as `capo-verl eval "
                "generate` writes them)"
            )
    return np.array([compute_score(r["data_source"], r["response"], r["ground_truth"])["score"] > 0.5 for r in pool])


def build_parser() -> argparse.ArgumentParser:
    """The parser of ``capo-verl mask-thresholds``."""
    p = commands.parser(
        "mask-thresholds",
        "CAPO's ref_high / ref_low from the reference model's perplexity quartiles (paper section 4), "
        "with bootstrap intervals and the Hydra overrides to paste.",
    )
    p.add_argument("--model", required=True, help="the reference (base) model: a checkpoint folder, a hub id, smollm2")
    p.add_argument("--data", type=Path, required=True, help="the TRAINING parquet (verl schema) the prompts come from")
    p.add_argument("--pool", type=Path, help="score this existing pool (eval generate JSONL) instead of generating")
    p.add_argument("-n", type=commands.positive_int, default=128, help="prompts to sample from --data (default 128)")
    commands.add_option(p, "-k", default=8, why="per prompt, enough for the quartiles over 128 prompts")
    commands.add_option(p, "--seed", help="prompt sampling and generation seed (default 0)")
    commands.add_option(p, "--temperature", help="the rollout's temperature, > 0 (default 1.0)")
    commands.add_option(p, "--max-new-tokens", default=48, why="the CPU configs' data.max_response_length")
    commands.add_option(p, "--dtype", help="generation dtype, as eval generate's --dtype (default auto)")
    p.add_argument("--rule", choices=RULES, default="per-outcome", help="which reading prints as overrides")
    p.add_argument(
        "--n-boot", type=commands.positive_int, default=2000, help="bootstrap resamples over questions (default 2000)"
    )
    commands.add_option(
        p, "--batch-size", default=16, why="the committed thresholds were scored so; it changes only float rounding"
    )
    p.add_argument("--out", type=Path, required=True, help="output .json; the pool and prompts are written beside it")
    return p


def _fmt(x: float) -> str:
    return f"{x:.3g}" if math.isfinite(x) else "nan"


def draw_pool(args: argparse.Namespace, prompts_path: Path, pool_path: Path) -> None:
    """Step 1 (module docstring): ``-n`` prompts of ``--data`` to ``prompts_path``, ``-k`` responses to each by
    ``capo-verl eval generate`` to ``pool_path`` (which resumes a pool that a stopped run left).

    Raises:
        FileNotFoundError, ValueError: as :func:`sample_prompts`.
        RunFailed: ``capo-verl eval generate`` failed (its own error is printed above this one).
    """
    sample_prompts(args.data, args.n, args.seed, prompts_path)
    cmd = [
        sys.executable, "-m", "capo_verl.cli", "eval", "generate", "--model", args.model, "--data", str(prompts_path),
        "-k", str(args.k), "--temperature", str(args.temperature), "--max-new-tokens", str(args.max_new_tokens),
        "--seed", str(args.seed), "--dtype", args.dtype, "--save-token-ids", "--no-progress", "--out", str(pool_path),
    ]  # fmt: skip
    print(f"[mask-thresholds] capo-verl {shlex.join(cmd[3:])}", file=sys.stderr, flush=True)
    if subprocess.run(cmd, stdin=subprocess.DEVNULL).returncode != 0:
        raise commands.RunFailed(f"`capo-verl {shlex.join(cmd[3:])}` failed (its error is printed above)")


def check_arguments(args: argparse.Namespace) -> outputs.Outputs:
    """Every check that needs no model and no pool, before anything is written.

    Returns:
        The run's :class:`~capo_verl.outputs.Outputs`: ``--out`` first; without ``--pool`` then ``OUT.prompts.parquet``
        (written whole) and ``OUT.pool.jsonl`` with its ``.meta.json`` (appended and locked by ``eval generate``).

    Raises:
        UsageError: an ``--out`` that cannot be written or is not ``.json``.
        capo_verl.outputs.InputIsOutput: an output that is ``--data``, ``--pool`` or a file of the ``--model`` folder.
        ValueError: a ``--model`` that cannot load (:func:`capo_verl.evaluation.cli.check_model`) or a ``--dtype``
            that generation would refuse (:func:`capo_verl.evaluation.cli.check_dtype`).
    """
    from capo_verl.evaluation.cli import check_dtype, check_model

    outs = outputs.Outputs("mask-thresholds")
    outs.input("--data", args.data)
    outs.input("--pool", args.pool)
    if Path(args.model).expanduser().exists():
        outs.input("--model", args.model)
    out = outs.file("--out", args.out, suffix=".json")
    if args.pool is None:
        outs.file("--out", out.path.with_suffix(".prompts.parquet"))
        pool = out.path.with_suffix(".pool.jsonl")
        outs.append("--out", pool, lock=False)  # `eval generate` locks it
        outs.append("--out", Path(f"{pool}.meta.json"), lock=False)
    check_model(args.model)
    check_dtype(args.dtype)
    outs.check()
    return outs


def run(args: argparse.Namespace, argv: list[str]) -> dict:
    """Execute parsed arguments (module docstring, steps 1-4); returns the written result.

    Every argument is checked before anything is written (:func:`check_arguments`). ``--out`` and the prompts file
    are written whole at the end (:class:`capo_verl.outputs.Outputs`): a run that fails or is stopped leaves them as
    they were; the pool is ``eval generate``'s, which a later run resumes.

    Raises:
        UsageError, ValueError: as :func:`check_arguments`; a pool without a correct or without an incorrect response
            (the per-outcome rule needs both: sample more prompts, or more responses per prompt).
        FileNotFoundError: no data file or pool.
        RunFailed: ``capo-verl eval generate`` failed.
        capo_verl.outputs.OutputLocked: another process writes ``--out``.
    """
    from capo_verl.evaluation import teacher_forced as TF

    outs = check_arguments(args)
    out = outs.outputs[0]
    with outs.writing():
        if args.pool is None:
            prompts, pool_out = outs.outputs[1], outs.outputs[2]
            draw_pool(args, prompts.stage, pool_out.path)
            prompts_read, prompts_final, pool_path = prompts.stage, prompts.path, pool_out.path
        else:
            prompts_read = prompts_final = args.data
            pool_path = args.pool
        pool = TF.read_pool(pool_path)
        correct = regrade(pool)
        if correct.all() or not correct.any():
            raise ValueError(
                f"{pool_path}: {int(correct.sum())} of {len(pool)} responses are correct; the quartile rule needs "
                "correct and incorrect responses: sample more prompts (-n) or responses per prompt (-k)"
            )
        lpm = TF.score_pool(args.model, pool, data=[str(prompts_read)], dtype="float32", batch_size=args.batch_size)
        result = _result(args, argv, pool, correct, np.exp(-lpm), pool_path)
        result["prompts"] = str(prompts_final)
        out.stage.write_text(json.dumps(result, indent=2) + "\n")
    _print_result(result)
    print(f"wrote {out.path}", file=sys.stderr)
    return result


def _result(args: argparse.Namespace, argv: list[str], pool: list[dict], correct, ref_ppl, pool_path: Path) -> dict:
    """What ``--out`` holds (module docstring, step 4)."""
    from capo_verl.evaluation import teacher_forced as TF

    keys = TF.question_keys(pool)
    result: dict = {
        "command": "capo-verl mask-thresholds " + shlex.join(argv),
        "model": args.model,
        "data": str(args.data),
        "pool": str(pool_path),
        "settings": {
            k: getattr(args, k) for k in ("n", "k", "seed", "temperature", "max_new_tokens", "dtype", "n_boot")
        },
        "n_responses": len(pool),
        "n_questions": int(len(np.unique(keys))),
        "n_correct": int(correct.sum()),
        "ref_ppl_quantiles": {
            outcome: {f"q{q}": float(np.quantile(ref_ppl[sel], q / 100)) for q in (10, 25, 50, 75, 90)}
            for outcome, sel in (("correct", correct), ("incorrect", ~correct), ("all", np.ones_like(correct)))
        },
        "rule": args.rule,
        "rules": {},
    }
    for rule in RULES:
        high, low = thresholds(ref_ppl, correct, rule)
        result["rules"][rule] = {
            "ref_high": high,
            "ref_low": low,
            "ci95": bootstrap_thresholds(ref_ppl, correct, keys, rule, n_boot=args.n_boot, seed=args.seed),
            "masked_fraction": masked_fractions(ref_ppl, correct, high, low),
        }
    chosen = result["rules"][args.rule]
    result["overrides"] = (
        f"algorithm.capo.ref_high={chosen['ref_high']:.3g} algorithm.capo.ref_low={chosen['ref_low']:.3g}"
    )
    return result


def _print_result(result: dict) -> None:
    """Each rule's thresholds with their intervals and masked shares, the counts, and the overrides to paste."""
    for rule, r in result["rules"].items():
        ci, m = r["ci95"], r["masked_fraction"]
        print(
            f"{rule}{' (chosen)' if rule == result['rule'] else ''}: ref_high {_fmt(r['ref_high'])} "
            f"[{_fmt(ci['ref_high'][0])}, {_fmt(ci['ref_high'][1])}], ref_low {_fmt(r['ref_low'])} "
            f"[{_fmt(ci['ref_low'][0])}, {_fmt(ci['ref_low'][1])}]; masks {m['correct']:.1%} of correct, "
            f"{m['incorrect']:.1%} of incorrect responses"
        )
    print(f"{result['n_correct']} of {result['n_responses']} responses correct, {result['n_questions']} questions")
    print(f"overrides: {result['overrides']}")


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``capo-verl mask-thresholds``; returns the exit status (:func:`capo_verl.commands.main`)."""
    argv = list(sys.argv[1:] if argv is None else argv)

    def execute(args: argparse.Namespace) -> int:
        run(args, argv)
        return 0

    return commands.main(build_parser(), execute, argv)
