"""Power of the main GRPO-vs-CAPO run, from pilot 2's committed files.

For each of pilot 2's three co-primary endpoints (CAPO - GRPO, paired by seed: the sampled validation AUC-mean and
accuracy at step 30, ``actor/entropy`` over steps 26-30), the between-seed variance of the per-seed difference is
split into what the validation's question sampling explains and the rest (training):

- ``var_q``: the variance of a seed's difference over a paired bootstrap of its 256 validation questions (both
  methods resampled with the same question indices), averaged over the seeds;
- ``var_w``: the part of ``var_q`` that the 8 samples per question bring: a bootstrap of each question's samples
  (each method's own, independently) with the questions fixed, averaged over the seeds;
- ``var_t = max(0, V - var_q)``, with ``V`` the sample variance (ddof 1) of the three per-seed differences: training.

Entropy is a training metric: its whole ``V`` is training. For a validation of ``Q`` questions x ``k`` samples the
question part is projected as ``(var_q - var_w) * 256 / Q + var_w * (256 / Q) * (8 / k)`` (a mean over ``Q``
questions; a per-question value's sampling noise falls as ``1 / k``), and the t half-width over ``n`` seed pairs as
``t(0.975, n - 1) * sqrt(var_t + projected var_q) / sqrt(n)``. With three seeds, ``V`` and so ``var_t`` rest on two
degrees of freedom: the table also gives the half-width with ``var_t`` doubled.

Unit hours are projected from pilot 2's own timings: the mean step time, the step-30 validation pass and the step-0
pass (what verl's trainer spent besides its steps and its step-30 pass, less 60 s of start-up), both scaled by the
number of responses, and the held-out generation; the teacher-forced scoring time is an input (``--tf-s-per-2048``,
pilot 2's STATUS.md: 238 s for 2,048 responses in float32).

The question bootstrap holds all of a question's noise, including a part that every seed shares (all seeds validate
on the same questions), which does not enter the spread between seeds: ``var_t`` is, if anything, too low.

    .venv/bin/python benchmarks/power_main.py benchmarks/results/compare_pilot2_cpu/pilot \\
        > benchmarks/results/compare_main_cpu/power.md
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

import numpy as np

from capo_verl.compare.report import read_metrics, read_validation_pass, series
from capo_verl.compare.statistics import t_quantile

METHODS = ("grpo", "capo")
ENTROPY_LAST_STEPS = 5


def per_question(path: Path) -> tuple[np.ndarray, np.ndarray, list[str]]:
    """``(lpm (Q, k) float64, correct (Q, k) bool, questions)`` of a validation dump with k samples per question."""
    vp = read_validation_pass(path)
    k = {len(x) for x in vp.lpm}
    if len(k) != 1:
        raise ValueError(f"{path}: unequal samples per question {sorted(k)}")
    return np.stack(vp.lpm), np.stack(vp.correct), list(vp.questions)


def question_auc(lpm: np.ndarray, correct: np.ndarray) -> np.ndarray:
    """``(..., Q)`` ROC-AUC of lpm vs correctness per question over its last axis's samples (ties count 1/2); NaN
    for a question with one outcome. ``lpm``, ``correct``: ``(..., Q, k)``."""
    greater = (lpm[..., :, None] > lpm[..., None, :]) + 0.5 * (lpm[..., :, None] == lpm[..., None, :])
    pair = correct[..., :, None] & ~correct[..., None, :]
    n_pairs = pair.sum((-1, -2))
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(n_pairs > 0, (greater * pair).sum((-1, -2)) / n_pairs, np.nan)


def endpoint_values(lpm: np.ndarray, correct: np.ndarray) -> dict[str, np.ndarray]:
    """Per question ``(..., Q)``: ``auc_mean`` (AUC, NaN if not mixed) and ``accuracy``."""
    return {"auc_mean": question_auc(lpm, correct), "accuracy": correct.mean(-1)}


def nanmean(x: np.ndarray) -> np.ndarray:
    with np.errstate(invalid="ignore"):
        return np.nanmean(x, axis=-1)


def seed_split(pilot: Path, seed: int, n_boot: int, rng: np.random.Generator) -> dict:
    """One seed's CAPO - GRPO difference per endpoint, with its question-bootstrap and sample-bootstrap variances."""
    data = {m: per_question(pilot / f"seed{seed}" / m / "val_generations" / "30.jsonl") for m in METHODS}
    if data["grpo"][2] != data["capo"][2]:
        raise ValueError(f"seed {seed}: the two methods validated other questions")
    values = {m: endpoint_values(*data[m][:2]) for m in METHODS}
    n_q, k = data["grpo"][0].shape
    idx = rng.integers(0, n_q, (n_boot, n_q))  # paired: the same questions for both methods
    out = {}
    for key in ("auc_mean", "accuracy"):
        a, b = values["capo"][key], values["grpo"][key]
        diff = float(nanmean(a) - nanmean(b))
        boot_q = nanmean(a[idx]) - nanmean(b[idx])
        out[key] = {"diff": diff, "var_q": float(np.nanvar(boot_q, ddof=1))}
    # samples within each question, each method on its own: (n_boot, Q, k) draws of the sample indices
    within = {}
    for m in METHODS:
        lpm, correct, _ = data[m]
        draw = rng.integers(0, k, (n_boot, n_q, k))
        rows = np.arange(n_q)[None, :, None]
        within[m] = endpoint_values(lpm[rows, draw], correct[rows, draw])
    for key in ("auc_mean", "accuracy"):
        boot_w = nanmean(within["capo"][key]) - nanmean(within["grpo"][key])
        out[key]["var_w"] = float(np.nanvar(boot_w, ddof=1))
    entropy = {}
    for m in METHODS:
        _, ys = series(read_metrics(pilot / f"seed{seed}" / m / "metrics.jsonl"), "actor/entropy")
        entropy[m] = float(np.mean(ys[-ENTROPY_LAST_STEPS:]))
    out["entropy"] = {"diff": entropy["capo"] - entropy["grpo"], "var_q": 0.0, "var_w": 0.0}
    out["n_questions"], out["k"] = n_q, k
    return out


def timings(pilot: Path, seeds: list[int]) -> dict:
    """Pilot 2's per-unit timings (s): mean step, step-30 validation pass, held-out generation, whole run."""
    steps, tests, heldout, walls, rest = [], [], [], [], []
    for seed in seeds:
        for m in METHODS:
            run = pilot / f"seed{seed}" / m
            metrics = read_metrics(run / "metrics.jsonl")
            unit_steps = series(metrics, "timing_s/step")[1]
            unit_tests = series(metrics, "timing_s/testing")[1]
            steps += unit_steps
            tests += unit_tests
            heldout.append(json.loads((run / "eval_generations.jsonl.meta.json").read_text())["wall_s"])
            walls.append(json.loads((run / "done.json").read_text())["wall_s"])
            # what verl's trainer spent besides its steps and its step-30 pass: start-up and the step-0 pass
            rest.append(walls[-1] - sum(unit_steps) - sum(unit_tests))
    return {
        "step_s": float(np.mean(steps)),
        "val30_s": float(np.mean(tests)),
        "heldout_s": float(np.mean(heldout)),
        "run_s": float(np.mean(walls)),
        "rest_s": float(np.mean(rest)),
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("pilot", type=Path, help="pilot 2's unit files (benchmarks/results/compare_pilot2_cpu/pilot)")
    p.add_argument("--seeds", default="0,1,2")
    p.add_argument("--n-boot", type=int, default=2000)
    p.add_argument("--questions", default="256,580", help="candidate validation sizes (questions)")
    p.add_argument("--samples", default="8,16,32", help="candidate samples per question")
    p.add_argument("--pairs", default="3,4,5,6,7,8,9,10", help="candidate numbers of new seed pairs")
    p.add_argument("--tf-responses", type=int, default=580 * 8, help="teacher-forced pool of the main run")
    p.add_argument("--tf-s-per-2048", type=float, default=238.0, help="teacher-forced scoring, s per 2,048 responses")
    args = p.parse_args(argv)
    seeds = [int(s) for s in args.seeds.split(",")]
    rng = np.random.default_rng(0)
    splits = [seed_split(args.pilot, s, args.n_boot, rng) for s in seeds]
    q0, k0 = splits[0]["n_questions"], splits[0]["k"]

    print("# Power of the main run, from pilot 2's committed files\n")
    print(f"`benchmarks/power_main.py {args.pilot}` ({args.n_boot} bootstrap resamples, numpy seed 0); pilot 2: "
          f"{len(seeds)} seeds, {q0} validation questions x {k0} samples at step 30.\n")  # fmt: skip
    print("## The split of each endpoint's between-seed variance\n")
    print("| endpoint | per-seed CAPO - GRPO | sd between seeds | question-sampling se per seed | of which samples | "
          "training sd (the rest) |")  # fmt: skip
    print("|---|---|---|---|---|---|")
    parts = {}
    for key, label in (("auc_mean", "calibration (AUC-mean)"), ("accuracy", "accuracy"), ("entropy", "entropy")):
        diffs = np.array([s[key]["diff"] for s in splits])
        v = float(diffs.var(ddof=1))
        var_q = float(np.mean([s[key]["var_q"] for s in splits]))
        var_w = float(np.mean([s[key]["var_w"] for s in splits]))
        var_t = max(0.0, v - var_q)
        parts[key] = (var_q, var_w, var_t)
        ses = ", ".join(f"{math.sqrt(s[key]['var_q']):.3f}" for s in splits)
        ses_w = ", ".join(f"{math.sqrt(s[key]['var_w']):.3f}" for s in splits)
        print(f"| {label} | {', '.join(f'{d:+.3f}' for d in diffs)} | {math.sqrt(v):.3f} | {ses} | {ses_w} | "
              f"{math.sqrt(var_t):.3f} |")  # fmt: skip

    qs = [int(x) for x in args.questions.split(",")]
    ks = [int(x) for x in args.samples.split(",")]
    ns = [int(x) for x in args.pairs.split(",")]
    t = timings(args.pilot, seeds)
    print("\n## Projected 95% t half-width over n new seed pairs\n")
    print("Each cell: the half-width at the estimated training variance, then (in brackets) with it doubled. Margins: "
          "calibration 0.03 (the main run's target half-width: 0.02), entropy 0.1 nats, accuracy 0.05.\n")  # fmt: skip
    header = "| endpoint | questions x samples | " + " | ".join(f"n = {n}" for n in ns) + " |"
    print(header)
    print("|---|---|" + "---|" * len(ns))
    for key, label in (("auc_mean", "calibration"), ("accuracy", "accuracy"), ("entropy", "entropy")):
        var_q, var_w, var_t = parts[key]
        for q in qs:
            for k in ks:
                if key == "entropy" and (q, k) != (qs[0], ks[0]):
                    continue
                proj_q = (var_q - var_w) * q0 / q + var_w * (q0 / q) * (k0 / k)
                cells = []
                for n in ns:
                    tq = t_quantile(0.975, n - 1)
                    cells.append(f"{tq * math.sqrt(var_t + proj_q) / math.sqrt(n):.3f} "
                                 f"({tq * math.sqrt(2 * var_t + proj_q) / math.sqrt(n):.3f})")  # fmt: skip
                size = "any (a training metric)" if key == "entropy" else f"{q} x {k}"
                print(f"| {label} | {size} | " + " | ".join(cells) + " |")

    print("\n## Projected hours of units\n")
    step0 = t["rest_s"] - 60.0  # 60 s of start-up a unit
    print(f"Pilot 2's timings (six units): {t['step_s']:.1f} s a step, {t['val30_s']:.0f} s for the step-30 "
          f"validation pass of {q0} x {k0}, {t['heldout_s']:.0f} s of held-out generation, {t['run_s'] / 60:.1f} min a "
          f"run in verl's trainer, of which {t['rest_s']:.0f} s were neither a step nor the step-30 pass: 60 s of "
          f"start-up taken as such, the rest, {step0:.0f} s, is the step-0 pass ({step0 / t['val30_s']:.1f} x the "
          "step-30 pass: the base model's responses are longer). Both passes are scaled by the number of responses. "
          f"Teacher-forced scoring of {args.tf_responses} responses at step 30 only: "
          f"{args.tf_s_per_2048 * args.tf_responses / 2048 / 60:.1f} min a unit. A seed pair: two units and one "
          "step-0 pass (shared); the first seed validates step 0 under both methods, one pass more.\n")  # fmt: skip
    print("| questions x samples | one unit, no step-0 pass (min) | step-0 pass (min) | one seed pair (min) | " +
          " | ".join(f"n = {n} (h)" for n in ns) + " |")  # fmt: skip
    print("|---|---|---|---|" + "---|" * len(ns))
    for q in qs:
        for k in ks:
            scale = (q * k) / (q0 * k0)
            unit = 60 + 30 * t["step_s"] + t["val30_s"] * scale + t["heldout_s"]
            unit += args.tf_s_per_2048 * args.tf_responses / 2048
            pass0 = step0 * scale
            pair = 2 * unit + pass0
            print(f"| {q} x {k} | {unit / 60:.0f} | {pass0 / 60:.0f} | {pair / 60:.0f} | " +
                  " | ".join(f"{(n * pair + pass0) / 3600:.1f}" for n in ns) + " |")  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
