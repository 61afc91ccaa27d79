"""The tables of docs/results/nomask.md, printed from the committed summaries and units (after ``readings.sh``):

    .venv/bin/python benchmarks/results/compare_nomask_cpu/tables.py

1. the co-primary table and the verdict line: no-mask CAPO - GRPO by ``plan.yaml`` (``units/seeds_summary.json``);
2. the three readings, each a difference paired by seed over the same seeds, mean and 95% Student-t interval:
   no-mask CAPO - GRPO (``units/``), no-mask CAPO - masked CAPO (``mask_reading/``) and masked CAPO - GRPO
   (``main_reading/``), for the sampled AUC-mean and accuracy at step 30, the entropy of steps 26-30 and the
   teacher-forced AUC-mean of the shared pool at step 30;
3. the same four measures per method, means over the seeds;
4. the three readings of what the mechanism predicts: the share of steps whose grad norm exceeded the clip and the
   mean sequence advantage of correct and of incorrect responses over the 30 steps;
5. what the mechanism predicts, per method: the share of a step's incorrect responses with a nonzero advantage over
   the last 10 steps (no unit logs it: the lower and the upper bound of ``benchmarks/unit_facts.py``, each a range
   over the units), the mean sequence advantage of correct and
   of incorrect responses over the 30 steps, the clipped steps, the training reward and the response length.

tests/test_results_pages.py checks the page's co-primary table, verdict line and both readings tables against the
summaries.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[2]
sys.path.insert(0, str(REPO / "benchmarks"))

from unit_facts import NONZERO, _span, unit_facts  # noqa: E402

from capo_verl.compare.verdict import difference_record, load_plan  # noqa: E402

MAIN_UNITS = REPO / "benchmarks" / "results" / "compare_main_cpu" / "units"
NAMES = {"grpo": "GRPO", "capo": "masked CAPO", "capo_no_mask": "no-mask CAPO"}
#: label -> (summary, its pair): the three readings of the page
READINGS = {
    "no-mask CAPO - GRPO (the plan's verdict)": (HERE / "units" / "seeds_summary.json", "capo_no_mask - grpo"),
    "no-mask CAPO - masked CAPO (what the mask does)": (
        HERE / "mask_reading" / "seeds_summary.json",
        "capo_no_mask - capo",
    ),
    "masked CAPO - GRPO (the main run, these seeds)": (HERE / "main_reading" / "seeds_summary.json", "capo - grpo"),
}
COLUMNS = (
    "sampled AUC-mean, step 30",
    "accuracy (mean@16), step 30",
    "entropy, steps 26-30 (nats)",
    "teacher-forced AUC-mean, step 30",
)

#: (secondary reading, its row, the column's title): the mechanism's measures in a seeds summary
MECHANISM = (
    ("grad_clipped", "share of steps", "share of steps whose grad norm exceeded the clip"),
    ("advantage_by_outcome", "correct responses", "mean advantage, correct responses"),
    ("advantage_by_outcome", "incorrect responses", "mean advantage, incorrect responses"),
)


def secondary_record(summary: dict, name: str, row: str, pair: str) -> dict:
    """The difference record of ``pair`` in row ``row`` of the seeds summary's secondary reading ``name``."""
    return summary["secondary"][name]["rows"][row]["differences"][pair]


def tf_record(summary: dict, pair: str) -> dict:
    """The teacher-forced AUC-mean's step-30 difference record of ``pair`` in a seeds summary."""
    return secondary_record(summary, "teacher_forced_auc_mean", "step 30", pair)


def records(summary: dict, pair: str) -> list[dict]:
    """The four measures' difference records of ``pair``, in :data:`COLUMNS`' order."""
    out = [difference_record(summary, m, pair) for m in ("auc_mean", "accuracy", "entropy")] + [
        tf_record(summary, pair)
    ]
    if any(r is None for r in out):
        raise KeyError(f"{pair}: a measure of {COLUMNS} is missing from the summary; run readings.sh again")
    return out


def interval(record: dict) -> str:
    """A difference record's Student-t interval as ``mean [low, high]``, signed, three decimals."""
    t = record["t_interval"]
    return f"{t['mean']:+.3f} [{t['low']:+.3f}, {t['high']:+.3f}]"


def seeds_text(seeds: list[int]) -> str:
    """``3-12`` for consecutive seeds, else the seeds listed."""
    return f"{seeds[0]}-{seeds[-1]}" if seeds == list(range(seeds[0], seeds[-1] + 1)) else ", ".join(map(str, seeds))


def co_primary(summary: dict) -> str:
    """The co-primary table of no-mask CAPO - GRPO by ``plan.yaml`` and the verdict line, as markdown."""
    plan = load_plan(HERE / "plan.yaml")
    (pair,) = summary["co_primary"]
    co = summary["co_primary"][pair]
    lines = [
        f"| co-primary endpoint, no-mask CAPO - GRPO | per seed ({seeds_text(summary['seeds'])}) | mean | 95% "
        "t-interval | reading | half-width | sd over seeds | seed pairs for the margin |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for e in plan.endpoints:
        r, c = difference_record(summary, e.measure, pair), co["endpoints"][e.key]
        lines.append(
            f"| {e.key}: {e.label} (margin {e.margin:g}) | {', '.join(f'{x:+.3f}' for x in r['per_seed'])} | "
            f"{c['mean']:+.3f} | [{c['low']:+.3f}, {c['high']:+.3f}] | {c['words']} | {c['half_width']:.3f} | "
            f"{c['sd']:.3f} | {c['seeds_needed']} |"
        )
    return "\n".join(lines) + f"\n\n**Verdict by the plan's rule: {co['verdict']['verdict']}.**\n"


def readings(summaries: dict[str, dict]) -> str:
    """The three readings' table, as markdown; raises ValueError if the summaries cover different seeds."""
    seeds = {label: s["seeds"] for label, s in summaries.items()}
    if len({tuple(v) for v in seeds.values()}) != 1:
        raise ValueError(f"the readings cover different seeds {seeds}; run readings.sh over the seeds done")
    (first,) = {tuple(v) for v in seeds.values()}
    lines = [
        f"| reading, paired by seed ({seeds_text(list(first))}), mean [95% t-interval] | " + " | ".join(COLUMNS) + " |",
        "|---" * (len(COLUMNS) + 1) + "|",
    ]
    for label, (_, pair) in READINGS.items():
        lines.append(f"| {label} | " + " | ".join(interval(r) for r in records(summaries[label], pair)) + " |")
    return "\n".join(lines) + "\n"


def mechanism_readings(summaries: dict[str, dict]) -> str:
    """The three readings of :data:`MECHANISM`'s measures (item 4 above), as markdown."""
    lines = [
        "| reading, paired by seed, mean [95% t-interval] | " + " | ".join(c for *_, c in MECHANISM) + " |",
        "|---" * (len(MECHANISM) + 1) + "|",
    ]
    for label, (_, pair) in READINGS.items():
        cells = [interval(secondary_record(summaries[label], name, row, pair)) for name, row, _ in MECHANISM]
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def per_method(summaries: dict[str, dict]) -> dict[str, list[np.ndarray]]:
    """``{method: [per-seed values of each of COLUMNS' measures]}`` from the summaries that hold the method."""
    out = {}
    for s in summaries.values():
        for m in s["methods"]:
            if m in out:
                continue
            tf = s["secondary"]["teacher_forced_auc_mean"]["rows"]["step 30"]["per_seed"][m]
            ent = s["secondary"]["entropy"]["rows"]["entropy"]["per_seed"][m]
            out[m] = [
                np.asarray(v)
                for v in (s["per_seed"][m]["auc_mean"]["last"], s["per_seed"][m]["accuracy"]["last"], ent, tf)
            ]
    return out


def levels(summaries: dict[str, dict]) -> str:
    """Each method's mean over the seeds of :data:`COLUMNS`' measures, as markdown."""
    values = per_method(summaries)
    lines = ["| method, mean over the seeds | " + " | ".join(COLUMNS) + " |", "|---" * (len(COLUMNS) + 1) + "|"]
    for m in ("grpo", "capo", "capo_no_mask"):
        lines.append(f"| {NAMES[m]} | " + " | ".join(f"{v.mean():.3f}" for v in values[m]) + " |")
    return "\n".join(lines) + "\n"


def mechanism(summaries: dict[str, dict]) -> str:
    """Per method, what the mechanism predicts (item 5 above), ranges over the units of the summaries' seeds.

    Raises:
        ValueError: a method has no unit for some seed of the summaries.
    """
    seeds = next(iter(summaries.values()))["seeds"]
    facts = [
        r
        for folder, methods in ((MAIN_UNITS, ["grpo", "capo"]), (HERE / "units", ["capo_no_mask"]))
        for r in unit_facts(folder, methods)
        if r["seed"] in seeds
    ]
    secondary = {}
    for s in summaries.values():
        adv = s["secondary"]["advantage_by_outcome"]["rows"]
        for m in s["methods"]:
            if m not in secondary:
                secondary[m] = tuple(np.mean(adv[f"{o} responses"]["per_seed"][m]) for o in ("correct", "incorrect"))
    head = [
        "method",
        f"{NONZERO}, last 10 steps: lower bound",
        f"{NONZERO}, last 10 steps: upper bound",
        "mean advantage, correct / incorrect",
        "clipped steps of 30",
        "training reward, first 5 / last 5 steps",
        "response tokens, first 5 / last 5 steps",
    ]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for m in ("grpo", "capo", "capo_no_mask"):
        mine = [r for r in facts if r["method"] == m]
        if sorted(r["seed"] for r in mine) != list(seeds):
            raise ValueError(f"{m}: units of seeds {sorted(r['seed'] for r in mine)}, not {seeds}")
        cells = [
            NAMES[m],
            *(_span([r[f"{NONZERO} late"][j] for r in mine], ".2f") for j in (0, 1)),
            f"{secondary[m][0]:+.3f} / {secondary[m][1]:+.3f}",
            _span([r["clipped"] for r in mine], "d"),
            " / ".join(_span([r["reward"][j] for r in mine], ".2f") for j in (0, 1)),
            " / ".join(_span([r["tokens"][j] for r in mine], ".1f") for j in (0, 1)),
        ]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def main() -> None:
    summaries = {label: json.loads(path.read_text()) for label, (path, _) in READINGS.items()}
    verdict = next(iter(summaries.values()))
    parts = (co_primary(verdict), readings(summaries), levels(summaries), mechanism_readings(summaries))
    for part in (*parts, mechanism(summaries)):
        print(part)


if __name__ == "__main__":
    main()
