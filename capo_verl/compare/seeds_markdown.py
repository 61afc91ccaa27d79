"""``seeds_summary.md`` of ``capo-verl compare --seeds``: the summary that
:func:`capo_verl.compare.seeds.write_seeds_summary` computes, as Markdown."""

from __future__ import annotations

import math

import numpy as np

from capo_verl.compare.statistics import MEASURES
from capo_verl.compare.verdict import StudyPlan

#: the rows of each measure's difference table: key in the summary -> text
_ROWS = (
    ("last", "at the last pass"),
    ("change", "change from the first pass"),
    ("both_mixed", "at the last pass, questions mixed under both methods"),
)


def _fmt(x, signed: bool = True) -> str:
    if x is None or not math.isfinite(x):
        return "n/a"
    return f"{x:+.3f}" if signed else f"{x:.3f}"


def seeds_markdown(summary: dict, plan: StudyPlan | None = None) -> str:
    """``seeds_summary.md``: the summary dict of :func:`capo_verl.compare.seeds.write_seeds_summary` as Markdown,
    with the co-primary endpoints and verdict of ``plan`` (its plan file) where given."""
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
    lines += _co_primary_lines(summary, plan, pct)
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
            for what, text in _ROWS:
                if what not in entry[measure]:
                    continue
                e = entry[measure][what]
                if "n_questions" in e:
                    text += f" ({', '.join(map(str, e['n_questions']))} per seed)"
                if "undefined" in e:
                    lines.append(f"| {name}, {text} | n/a: {e['undefined']} | | | |")
                    continue
                t, hb = e["t_interval"], e["hierarchical_bootstrap"]
                lines.append(
                    f"| {name}, {text} | {_fmt(t['mean'])} | [{_fmt(t['low'])}, {_fmt(t['high'])}] | "
                    f"[{_fmt(hb['low'])}, {_fmt(hb['high'])}] | {', '.join(_fmt(v) for v in e['per_seed'])} |"
                )
        lines.append("")
    lines += _step0_lines(summary)
    lines += _secondary_lines(summary)
    return "\n".join(lines)


def _co_primary_lines(summary: dict, plan: StudyPlan | None, pct: str) -> list[str]:
    """The co-primary endpoints and the verdict by the plan's rule (:mod:`capo_verl.compare.verdict`)."""
    if plan is None or not summary.get("co_primary"):
        return []
    rule = "; ".join(c.describe() for c in plan.contradicts_if_any)
    supports = "; ".join(c.describe() for c in plan.supports_if_all)
    lines = [
        f"## Co-primary endpoints and verdict ({pct} t-interval over seeds)",
        "",
        f"The endpoints, margins and verdict rule of {plan.study}'s plan file (`{plan.path.name}`): the verdict "
        f"*contradicts* the paper's claim when any of these holds: {rule}; else it *supports* it when all of these "
        f"hold: {supports}; else *no decision*.",
        "",
        "| difference | endpoint | mean | t-interval | reading | half-width | sd over seeds | seeds for the margin |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for name, entry in summary["co_primary"].items():
        for r in entry["endpoints"].values():
            if "mean" not in r:
                lines.append(f"| {name} | {r['label']} | n/a | | {r['words']} | | | |")
                continue
            needed = r["seeds_needed"] if r["seeds_needed"] is not None else "n/a"
            lines.append(
                f"| {name} | {r['label']} | {_fmt(r['mean'])} | [{_fmt(r['low'])}, {_fmt(r['high'])}] | "
                f"{r['words']} (margin {r['margin']:g}) | {_fmt(r['half_width'], False)} | {_fmt(r['sd'], False)} | "
                f"{needed} |"
            )
    lines.append("")
    for name, entry in summary["co_primary"].items():
        v = entry["verdict"]
        lines.append(f"**Verdict, {name}: {v['verdict']}** ({'; '.join(v['because'])}).")
    lines.append("")
    return lines


def _step0_lines(summary: dict) -> list[str]:
    """The agreement of the step-0 passes of each seed (:func:`capo_verl.compare.seeds.step0_agreement`)."""
    seeds, methods = summary["seeds"], summary["methods"]
    lines: list[str] = []
    agreement = summary.get("step0_agreement")
    if agreement:
        lines += [
            "## Two step-0 validation passes of the same weights",
            "",
            "Every method of a seed validates the base model at step 0 with the same rollout seeds: the passes differ "
            "only by the engine's numerics. Identical: the share of responses the first method's pass also produced "
            "for the same question.",
            "",
            "| pair | seed | identical responses | AUC-mean (first method, this method) | accuracy (first, this) |",
            "|---|---|---|---|---|",
        ]
        per = summary["per_seed"]  # the first pass is the step-0 pass these files hold
        for m in methods[1:]:
            name = f"{m} - {methods[0]}"
            for i, k in enumerate(seeds):
                fractions = agreement[name]
                auc, acc = ([_fmt(per[r][measure]["first"][i], False) for r in (methods[0], m)] for measure in MEASURES)
                same = "shared" if fractions[i] is None else f"{100 * fractions[i]:.1f}%"
                lines.append(f"| {name} | {k} | {same} | {', '.join(auc)} | {', '.join(acc)} |")
        lines.append("")
    return lines


def _secondary_lines(summary: dict) -> list[str]:
    """A table per secondary measure: each method's mean over seeds and each difference with its intervals."""
    methods = summary["methods"]
    lines: list[str] = []
    for block in summary.get("secondary", {}).values():
        lines += [f"## {block['label']}", ""]
        if "step0" in block:
            lines += [f"Step 0 (the base model, shared by every run): {_fmt(block['step0'], False)}.", ""]
        lines += [
            "| | " + " | ".join(f"{m}: mean over seeds" for m in methods) + " | difference | mean | t-interval | "
            "bootstrap interval | per seed |",
            "|---|" + "---|" * (len(methods) + 5),
        ]
        for row, entry in block["rows"].items():
            means = [_fmt(float(np.mean(entry["per_seed"][m])), False) for m in methods]
            for name, e in entry["differences"].items():
                if "undefined" in e:
                    lines.append(f"| {row} | {' | '.join(means)} | {name} | n/a: {e['undefined']} | | | |")
                    continue
                t, hb = e["t_interval"], e["hierarchical_bootstrap"]
                lines.append(
                    f"| {row} | {' | '.join(means)} | {name} | {_fmt(t['mean'])} | [{_fmt(t['low'])}, "
                    f"{_fmt(t['high'])}] | [{_fmt(hb['low'])}, {_fmt(hb['high'])}] | "
                    f"{', '.join(_fmt(v) for v in e['per_seed'])} |"
                )
        lines.append("")
    return lines
