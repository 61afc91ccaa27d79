"""A study's result page quotes its summary: the co-primary table and the verdict of ``docs/results/<study>.md`` are
``seeds_summary.json``'s numbers as written by ``capo-verl compare --seeds``, to the page's three decimals.

The table rows are read by their first words, the plan's endpoint keys (``calibration:``, ``stability:``,
``accuracy:``), and their columns are: per-seed differences, mean, 95% t-interval, reading, half-width, sd over
seeds, seed pairs for the margin. What each endpoint measures is the study's plan file's
(``endpoints.<name>.measure``).

A page with several readings (the no-mask run's: against GRPO, against masked CAPO, and the main run's own) quotes
each reading's summary in two tables whose rows are read by their labels (:data:`READINGS`); every summary must cover
the same seeds.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from capo_verl.compare.verdict import difference_record, load_plan

REPO = Path(__file__).resolve().parents[1]

STUDIES = REPO / "benchmarks" / "results"
NOMASK = STUDIES / "compare_nomask_cpu"
# page -> (the summary it quotes, the study's plan file)
PAGES = {
    "pilot2.md": (
        STUDIES / "compare_pilot2_cpu" / "pilot" / "seeds_summary.json",
        STUDIES / "compare_pilot2_cpu" / "plan.yaml",
    ),
    "main.md": (
        STUDIES / "compare_main_cpu" / "units" / "seeds_summary.json",
        STUDIES / "compare_main_cpu" / "plan.yaml",
    ),
    "nomask.md": (NOMASK / "units" / "seeds_summary.json", NOMASK / "plan.yaml"),
}
# page -> {row label: (the summary it quotes, its pair)}: a page's two tables of readings, each row a paired
# difference over the same seeds, "mean [low, high]" of its 95% t-interval (benchmarks/results/compare_nomask_cpu/
# tables.py): first the sampled AUC-mean, accuracy and entropy and the teacher-forced AUC-mean at step 30, then the
# mechanism's measures (MECHANISM)
READINGS = {
    "nomask.md": {
        "no-mask CAPO - GRPO": (NOMASK / "units" / "seeds_summary.json", "capo_no_mask - grpo"),
        "no-mask CAPO - masked CAPO": (NOMASK / "mask_reading" / "seeds_summary.json", "capo_no_mask - capo"),
        "masked CAPO - GRPO": (NOMASK / "main_reading" / "seeds_summary.json", "capo - grpo"),
    },
}
# (secondary reading, row) of the second table's columns
MECHANISM = (
    ("grad_clipped", "share of steps"),
    ("advantage_by_outcome", "correct responses"),
    ("advantage_by_outcome", "incorrect responses"),
)


def _cells(line: str) -> list[str]:
    """A markdown table row's cells after the first (its label), stripped."""
    return [c.strip() for c in line.strip().strip("|").split("|")][1:]


def _table_rows(page: str, endpoints: list[str]) -> dict[str, list[str]]:
    """``{endpoint: cells}`` of the page's co-primary table (cells after the first, stripped): for each of the plan's
    ``endpoints``, the first row whose first cell starts with ``<endpoint>:`` (a later table, such as a pooled
    secondary reading, may name the endpoints too)."""
    starts = re.compile(r"\|\s*(" + "|".join(map(re.escape, endpoints)) + r"):")
    rows = {}
    for line in page.splitlines():
        m = starts.match(line)
        if m and m.group(1) not in rows:
            rows[m.group(1)] = _cells(line)
    return rows


@pytest.mark.parametrize("name", sorted(PAGES))
def test_co_primary_table_and_verdict_quote_the_summary(name):
    page = (REPO / "docs" / "results" / name).read_text()
    summary_path, plan_path = PAGES[name]
    summary, plan = json.loads(summary_path.read_text()), load_plan(plan_path)
    measures = {e.key: e.measure for e in plan.endpoints}
    assert len(summary["co_primary"]) == 1, f"{summary_path}: one co-primary pair, not {sorted(summary['co_primary'])}"
    (pair,) = summary["co_primary"]  # "capo - grpo", or the study's arm against GRPO
    co = summary["co_primary"][pair]
    rows = _table_rows(page, list(measures))
    assert set(rows) == set(co["endpoints"]), f"{name}: co-primary rows {sorted(rows)}"
    for endpoint, cells in rows.items():
        e = co["endpoints"][endpoint]
        per_seed, mean, interval, reading, half_width, sd, needed = cells
        record = difference_record(summary, measures[endpoint], pair)
        assert per_seed == ", ".join(f"{x:+.3f}" for x in record["per_seed"]), (name, endpoint)
        assert mean == f"{e['mean']:+.3f}", (name, endpoint)
        assert interval == f"[{e['low']:+.3f}, {e['high']:+.3f}]", (name, endpoint)
        assert reading == e["words"], (name, endpoint)
        assert (half_width, sd) == (f"{e['half_width']:.3f}", f"{e['sd']:.3f}"), (name, endpoint)
        assert needed == str(e["seeds_needed"]), (name, endpoint)
    assert f"**Verdict by the plan's rule: {co['verdict']['verdict']}.**" in page, name


def _interval(record: dict) -> str:
    t = record["t_interval"]
    return f"{t['mean']:+.3f} [{t['low']:+.3f}, {t['high']:+.3f}]"


@pytest.mark.parametrize("name", sorted(READINGS))
def test_readings_tables_quote_each_summary(name):
    """Each readings row is ``mean [low, high]`` of its summary's 95% t-interval, to three decimals."""
    page = (REPO / "docs" / "results" / name).read_text()
    seeds = set()
    for label, (summary_path, pair) in READINGS[name].items():
        summary = json.loads(summary_path.read_text())
        seeds.add(tuple(summary["seeds"]))
        rows = [line for line in page.splitlines() if line.startswith(f"| {label} (")]
        assert len(rows) == 2, f"{name}: {len(rows)} rows labelled {label!r}, not one in each readings table"
        endpoints, mechanism = map(_cells, rows)
        secondary = summary["secondary"]
        tf = secondary["teacher_forced_auc_mean"]["rows"]["step 30"]["differences"][pair]
        expected = [_interval(difference_record(summary, m, pair)) for m in ("auc_mean", "accuracy", "entropy")]
        assert endpoints == [*expected, _interval(tf)], (name, label)
        expected = [_interval(secondary[k]["rows"][row]["differences"][pair]) for k, row in MECHANISM]
        assert mechanism == expected, (name, label)
    assert len(seeds) == 1, f"{name}: the readings cover different seeds {sorted(seeds)}"
