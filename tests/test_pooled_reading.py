"""benchmarks/pooled_reading.py: the seeds of two studies pooled and read against a plan's margins, checked by hand
(numpy, scipy's t quantile) on pilot 2's committed summary and a second summary made from it."""

from __future__ import annotations

import copy
import dataclasses
import json
from pathlib import Path

import numpy as np
import pytest
from scipy import stats

from capo_verl.compare.verdict import load_plan

REPO = Path(__file__).resolve().parents[1]
PILOT2 = REPO / "benchmarks" / "results" / "compare_pilot2_cpu"


@pytest.fixture(scope="module")
def pr(load_benchmark):
    return load_benchmark("pooled_reading")


def _other_study(summary: dict, seeds: list[int], shift: float) -> dict:
    """pilot 2's summary as if its seeds were ``seeds`` and every calibration difference ``shift`` larger."""
    other = copy.deepcopy(summary)
    other["seeds"] = seeds
    record = other["differences"]["capo - grpo"]["auc_mean"]["last"]
    record["per_seed"] = [x + shift for x in record["per_seed"]]
    return other


def test_pooled_interval_and_reading_by_hand(pr):
    summary = json.loads((PILOT2 / "pilot" / "seeds_summary.json").read_text())
    plan = load_plan(PILOT2 / "plan.yaml")
    other = _other_study(summary, [3, 4, 5], 0.1)
    r = pr.pooled([summary, other], plan)
    assert r["pair"] == "capo - grpo" and r["seeds"] == [0, 1, 2, 3, 4, 5]
    auc = summary["differences"]["capo - grpo"]["auc_mean"]["last"]["per_seed"]
    d = np.array(auc + [x + 0.1 for x in auc])
    half = stats.t.ppf(0.975, 5) * d.std(ddof=1) / np.sqrt(6)
    cal = r["endpoints"]["calibration"]
    assert cal["per_seed"] == pytest.approx(d.tolist(), abs=1e-15)
    assert (cal["mean"], cal["low"], cal["high"]) == pytest.approx((d.mean(), d.mean() - half, d.mean() + half))
    assert cal["sd"] == pytest.approx(d.std(ddof=1))
    # pilot 2's calibration differences -0.054, +0.022, +0.018 and the same + 0.1: mean +0.045, sd 0.062
    assert cal["words"] == "no decision" and cal["low"] < 0 < cal["high"]
    ent = summary["secondary"]["entropy"]["rows"]["entropy"]["differences"]["capo - grpo"]["per_seed"]
    assert r["endpoints"]["stability"]["per_seed"] == ent + ent
    assert r["endpoints"]["stability"]["margin"] == 0.1

    # pilot 2's differences + 0.05 six times over (18 seeds): mean +0.045, an interval above 0
    many = [_other_study(summary, [3 * k, 3 * k + 1, 3 * k + 2], 0.05) for k in range(1, 7)]
    cal = pr.pooled(many, plan)["endpoints"]["calibration"]
    assert cal["mean"] == pytest.approx(np.mean(auc) + 0.05) and cal["words"] == "capo better calibrated"

    table = pr.markdown(r, ["a.json", "b.json"])
    assert "over 6 seed pairs (seeds 0, 1, 2, 3, 4, 5)" in table and "secondary, not the verdict" in table
    assert f"| {r['endpoints']['calibration']['mean']:+.3f} |" in table


def test_bad_input_is_named(pr):
    summary = json.loads((PILOT2 / "pilot" / "seeds_summary.json").read_text())
    plan = load_plan(PILOT2 / "plan.yaml")
    with pytest.raises(ValueError, match="two or more"):
        pr.pooled([summary], plan)
    with pytest.raises(ValueError, match="a seed occurs in more than one summary"):
        pr.pooled([summary, summary], plan)
    other = _other_study(summary, [3, 4, 5], 0.0)
    other["methods"] = ["grpo", "cde"]
    with pytest.raises(ValueError, match="summary 1: compares grpo cde"):
        pr.pooled([summary, other], plan)
    other = _other_study(summary, [3, 4, 5], 0.0)
    del other["secondary"]["entropy"]
    with pytest.raises(ValueError, match="summary 1: no 'entropy' record .* --plot-only"):
        pr.pooled([summary, other], plan)
    three = dataclasses.replace(plan, methods=("grpo", "capo", "cde"))
    with pytest.raises(ValueError, match=r"\bone pair\b.*\bgrpo capo cde\b"):
        pr.pooled([summary, _other_study(summary, [3, 4, 5], 0.0)], three)
