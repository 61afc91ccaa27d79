"""A pooled reading of several studies' co-primary endpoints: a secondary reading, labelled so, never the verdict.

Each study's ``seeds_summary.json`` (``capo-verl compare --seeds``) holds, per co-primary endpoint, one CAPO - GRPO
difference per training seed (``per_seed`` of the record that ``capo_verl.compare.verdict.difference_record``
finds for the endpoint's measure). This script puts the seeds of all the studies together, computes the 95%
Student-t interval over them (``capo_verl.compare.statistics.seed_t_interval``) and reads it against the margins and
words of one plan file (``capo_verl.compare.verdict.read_endpoint``).

The studies must compare the same methods over distinct training seeds. Their validations may differ (pilot 2:
256 questions x 8 samples; the main run: 580 x 16), so a seed's difference is measured with a different noise in
each: the pooled interval treats the seeds as exchangeable, which they are not. That is why the main run's plan
keeps pilot 2's units out of its primary analysis and allows a pooled reading only as a secondary one.

    .venv/bin/python benchmarks/pooled_reading.py --plan benchmarks/results/compare_main_cpu/plan.yaml \\
        benchmarks/results/compare_main_cpu/units/seeds_summary.json \\
        benchmarks/results/compare_pilot2_cpu/pilot/seeds_summary.json
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from capo_verl.compare.statistics import seed_t_interval
from capo_verl.compare.verdict import difference_record, load_plan, read_endpoint


def pooled(summaries: list[dict], plan) -> dict:
    """The pooled reading of every co-primary endpoint of ``plan`` over the seeds of ``summaries``.

    Args:
        summaries: seeds summaries (``seeds_summary.json``) comparing the plan's methods, over distinct seeds.
        plan: a :class:`capo_verl.compare.verdict.StudyPlan`.

    Returns:
        ``{"pair": "m - base", "seeds": [...], "endpoints": {key: {"per_seed": [...], **read_endpoint(...)}}}``,
        the seeds and differences in the order of ``summaries``.

    Raises:
        ValueError: a plan of more than two methods, fewer than two summaries, a summary compares other methods,
            a seed occurs twice, or a summary lacks an endpoint's record (the message names the summary's
            position, the measure and the fix).
    """
    if len(summaries) < 2:
        raise ValueError(f"a pooled reading needs two or more seeds summaries, got {len(summaries)}")
    if len(plan.methods) != 2:
        raise ValueError(f"a pooled reading reads one pair of methods; the plan compares {' '.join(plan.methods)}")
    base, m = plan.methods
    pair = f"{m} - {base}"
    seeds = []
    for i, s in enumerate(summaries):
        if tuple(s["methods"]) != plan.methods:
            raise ValueError(f"summary {i}: compares {' '.join(s['methods'])}, the plan {' '.join(plan.methods)}")
        seeds += s["seeds"]
    if len(set(seeds)) != len(seeds):
        raise ValueError(f"a seed occurs in more than one summary: {sorted(seeds)}")
    endpoints = {}
    for e in plan.endpoints:
        per_seed = []
        for i, s in enumerate(summaries):
            record = difference_record(s, e.measure, pair)
            if record is None:
                raise ValueError(
                    f"summary {i}: no {e.measure!r} record for {pair!r}; write that study's summary again with "
                    "`capo-verl compare --plot-only --plan PLAN --seeds ... --methods ...` from units that logged it"
                )
            per_seed += record["per_seed"]
        t = seed_t_interval(per_seed, [0.0] * len(per_seed), level=plan.level)
        endpoints[e.key] = {"per_seed": per_seed, **read_endpoint(t, e, m=m, base=base, level=plan.level)}
    return {"pair": pair, "seeds": seeds, "endpoints": endpoints}


def markdown(result: dict, names: list[str]) -> str:
    """A table of :func:`pooled`'s result, one row per endpoint, under a line naming the summaries pooled."""
    lines = [
        f"Pooled reading (secondary, not the verdict) of {result['pair']} over {len(result['seeds'])} seed pairs "
        f"(seeds {', '.join(map(str, result['seeds']))}) from {', '.join(f'`{n}`' for n in names)}:",
        "",
        "| endpoint | mean | 95% t-interval | reading | half-width | sd over seeds |",
        "|---|---|---|---|---|---|",
    ]
    for key, r in result["endpoints"].items():
        lines.append(
            f"| {key}: {r['label']} (margin {r['margin']:g}) | {r['mean']:+.3f} | [{r['low']:+.3f}, {r['high']:+.3f}] "
            f"| {r['words']} | {r['half_width']:.3f} | {r['sd']:.3f} |"
        )
    return "\n".join(lines) + "\n"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("summaries", type=Path, nargs="+", help="seeds_summary.json of each study")
    p.add_argument("--plan", type=Path, required=True, help="the plan file whose endpoints and margins are read")
    args = p.parse_args()
    result = pooled([json.loads(s.read_text()) for s in args.summaries], load_plan(args.plan))
    print(markdown(result, [str(s) for s in args.summaries]), end="")


if __name__ == "__main__":
    main()
