"""Across training seeds (``capo-verl compare --seeds``): each method minus the first, paired by seed and question.

Seed ``k`` trained every method in ``<out>/seed<k>/`` with the same data order and rollout seeds
(:func:`capo_verl.compare.cli.seed_overrides`), validating on the same questions. From each method's validation dumps
(``val_generations/<step>.jsonl``) this takes, per seed and question, the per-question AUC of lpm vs correctness (NaN
for a question that is not mixed) and the accuracy, at the first and at the last validation pass. Two differences,
method minus the first method (``base``), paired by seed and question:

- ``last``: at the last pass. A seed's value is the method's AUC-mean (mean over its mixed questions) minus the
  base's; since every method of a seed starts from the same weights, this is also the difference of their changes in
  expectation, with the noise of one pass per method instead of two.
- ``change``: (last - first) of the method minus (last - first) of the base, per question (NaN unless the question
  is defined at both passes of that method).

Each comes with the mean over seeds, a Student-t interval over seeds
(:func:`capo_verl.compare.statistics.seed_t_interval`: seeds are the units; the questions' sampling noise enters
through the spread between seeds) and a two-level bootstrap interval
(:func:`capo_verl.compare.statistics.hierarchical_bootstrap_diff`: seeds, then questions within each seed).
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np

from capo_verl.compare.report import validation_passes
from capo_verl.compare.statistics import hierarchical_bootstrap_diff, seed_t_interval

#: per-question measures: name -> (label, index into ValidationPass.per_question())
MEASURES = {"auc_mean": ("validation AUC-mean", 1), "accuracy": ("validation accuracy (mean@k)", 0)}


def per_question_values(out: Path, methods: list[str], seeds: list[int]) -> dict:
    """``{method: {measure: {"first": (S, Q), "last": (S, Q)}}}`` float64 arrays, seeds in ``seeds`` order, questions
    in the sorted order of the first pass; also ``"steps"``: ``{method: [(first step, last step) per seed]}``.

    Raises:
        FileNotFoundError: a seed's method has no validation dump.
        ValueError: the validation questions differ between passes (not the same validation set).
    """
    values: dict = {m: {k: {"first": [], "last": []} for k in MEASURES} for m in methods}
    steps: dict = {m: [] for m in methods}
    questions = None
    for k in seeds:
        for m in methods:
            run_dir = out / f"seed{k}" / m
            passes = validation_passes(run_dir)
            if not passes:
                raise FileNotFoundError(f"{run_dir}: no validation dump (val_generations/); train seed {k} first")
            steps[m].append((passes[0].step, passes[-1].step))
            for which, vp in (("first", passes[0]), ("last", passes[-1])):
                if questions is None:
                    questions = vp.questions
                elif vp.questions != questions:
                    raise ValueError(f"{run_dir}: step {vp.step} validated other questions than the first pass read")
                per_q = vp.per_question()
                for measure, (_, i) in MEASURES.items():
                    values[m][measure][which].append(per_q[i])
    for m in methods:
        for measure in MEASURES:
            for which in ("first", "last"):
                values[m][measure][which] = np.asarray(values[m][measure][which], dtype=np.float64)
    return {"values": values, "steps": steps, "n_questions": len(questions or [])}


def _nanmean_rows(x: np.ndarray) -> list[float]:
    with np.errstate(invalid="ignore"):
        return [float(np.nanmean(row)) if np.isfinite(row).any() else float("nan") for row in x]


def write_seeds_summary(
    out: Path, methods: list[str], seeds: list[int], *, level: float = 0.95, n_boot: int = 2000
) -> dict:
    """``<out>/seeds_summary.json`` and ``seeds_summary.md``; returns the summary dict.

    Raises:
        FileNotFoundError, ValueError: see :func:`per_question_values`; ValueError also when a seed has no defined
            value of a measure for a method (e.g. no mixed question at a pass).
    """
    data = per_question_values(out, methods, seeds)
    values, base = data["values"], methods[0]
    summary: dict = {
        "seeds": seeds,
        "methods": methods,
        "level": level,
        "n_boot": n_boot,
        "n_questions": data["n_questions"],
        "steps": data["steps"],
        "per_seed": {
            m: {
                measure: {which: _nanmean_rows(values[m][measure][which]) for which in ("first", "last")}
                for measure in MEASURES
            }
            for m in methods
        },
        "differences": {},
    }
    for m in methods[1:]:
        entry = {}
        for measure in MEASURES:
            a_last, b_last = values[m][measure]["last"], values[base][measure]["last"]
            a_change = a_last - values[m][measure]["first"]
            b_change = b_last - values[base][measure]["first"]
            entry[measure] = {}
            for what, (a, b) in (("last", (a_last, b_last)), ("change", (a_change, b_change))):
                entry[measure][what] = {
                    "per_seed": [x - y for x, y in zip(_nanmean_rows(a), _nanmean_rows(b))],
                    "t_interval": seed_t_interval(a, b, level=level),
                    "hierarchical_bootstrap": hierarchical_bootstrap_diff(a, b, n_boot=n_boot, level=level),
                }
        summary["differences"][f"{m} - {base}"] = entry
    (out / "seeds_summary.json").write_text(json.dumps(summary, indent=1, default=float) + "\n")
    (out / "seeds_summary.md").write_text(_markdown(summary))
    return summary


def _fmt(x, signed: bool = True) -> str:
    if x is None or not math.isfinite(x):
        return "n/a"
    return f"{x:+.3f}" if signed else f"{x:.3f}"


def _markdown(summary: dict) -> str:
    seeds, methods = summary["seeds"], summary["methods"]
    pct = f"{100 * summary['level']:.0f}%"
    lines = [
        f"# capo-verl compare across {len(seeds)} training seed(s): {', '.join(map(str, seeds))}",
        "",
        f"{summary['n_questions']} validation questions; per-question values paired by seed and question. Intervals: "
        f"{pct} Student-t over seeds, and {pct} two-level bootstrap (seeds, then questions; {summary['n_boot']} "
        "resamples).",
        "",
    ]
    for measure, (label, _) in MEASURES.items():
        lines += [f"## {label}", "", "| seed | " + " | ".join(f"{m}: first -> last" for m in methods) + " |"]
        lines.append("|---|" + "---|" * len(methods))
        for i, k in enumerate(seeds):
            cells = []
            for m in methods:
                per = summary["per_seed"][m][measure]
                cells.append(f"{_fmt(per['first'][i], False)} -> {_fmt(per['last'][i], False)}")
            lines.append(f"| {k} | " + " | ".join(cells) + " |")
        lines += [
            "",
            "| difference | mean over seeds | t-interval | bootstrap interval | per seed |",
            "|---|---|---|---|---|",
        ]
        for name, entry in summary["differences"].items():
            for what, text in (("last", "at the last pass"), ("change", "change from the first pass")):
                e = entry[measure][what]
                t, hb = e["t_interval"], e["hierarchical_bootstrap"]
                lines.append(
                    f"| {name}, {text} | {_fmt(t['mean'])} | [{_fmt(t['low'])}, {_fmt(t['high'])}] | "
                    f"[{_fmt(hb['low'])}, {_fmt(hb['high'])}] | {', '.join(_fmt(v) for v in e['per_seed'])} |"
                )
        lines.append("")
    return "\n".join(lines)
