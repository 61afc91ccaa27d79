"""The co-primary endpoints of a comparison across seeds and the verdict rule, as pilot 2 fixed them before any of its
units (docs/results/pilot2.md, "Co-primary endpoints" and "Verdict rule").

Each endpoint is a difference ``method - base`` paired by seed, read from its 95% Student-t interval ``I`` over seeds
(:func:`capo_verl.compare.statistics.read_interval`) against its own margin:

1. *calibration*: the sampled validation AUC-mean at the last pass, margin 0.03;
2. *stability*: ``actor/entropy``, the mean of the last :data:`capo_verl.compare.seeds.ENTROPY_LAST_STEPS` logged
   steps (steps 26-30 of a 30-step run), margin 0.1 nats;
3. *accuracy*: the sampled validation accuracy (mean@k) at the last pass, margin 0.05.

Verdict: *supports* (the paper's claim, at this scale) when calibration reads above 0, accuracy does not read below
0 and stability does not read above 0 (higher entropy); *contradicts* when calibration reads below 0 or inside its
margin, or when the accuracy interval lies below -0.05; *no decision* otherwise. Each endpoint also reports the
half-width its interval reached and the seeds ``n`` at which ``t(0.975, n - 1) * sd / sqrt(n)`` would reach its
margin at the measured between-seed ``sd`` (:func:`capo_verl.compare.statistics.seeds_for_half_width`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from capo_verl.compare.seeds import ENTROPY_LAST_STEPS
from capo_verl.compare.statistics import read_interval, seeds_for_half_width


@dataclass(frozen=True)
class Endpoint:
    """One co-primary endpoint: its key, label, margin (in its unit) and the words for each reading; ``{m}`` is the
    method, ``{base}`` the first method, ``{margin}`` the margin with its unit."""

    key: str
    label: str
    margin: float
    unit: str
    above: str
    below: str


ENDPOINTS = (
    Endpoint(
        "calibration",
        "sampled validation AUC-mean at the last pass",
        0.03,
        "",
        "{m} better calibrated",
        "{base} better calibrated",
    ),
    Endpoint(
        "stability",
        f"actor/entropy, mean of the last {ENTROPY_LAST_STEPS} logged steps (nats)",
        0.1,
        " nats",
        "{m} higher entropy",
        "{m} lower entropy",
    ),
    Endpoint(
        "accuracy",
        "sampled validation accuracy (mean@k) at the last pass",
        0.05,
        "",
        "{m} more accurate",
        "{m} less accurate",
    ),
)
#: the reading of an endpoint with no value (e.g. no ``actor/entropy`` logged)
NOT_MEASURED = "not measured"


def read_endpoint(t_interval: dict | None, endpoint: Endpoint, *, m: str, base: str, level: float = 0.95) -> dict:
    """The plan's reading of one endpoint from its t-interval over seeds.

    Args:
        t_interval: :func:`capo_verl.compare.statistics.seed_t_interval` of ``m - base`` (``mean``, ``low``,
            ``high``, ``sd``), or None where the endpoint was not measured.
        endpoint: one of :data:`ENDPOINTS`. m, base: the two methods' names. level: the interval's coverage.

    Returns:
        ``{"reading"}`` (``"above 0"``, ``"below 0"``, ``"inside the margin"``, ``"no decision"`` or
        :data:`NOT_MEASURED`), ``"words"`` (the plan's sentence, e.g. ``"capo better calibrated"``), ``"margin"``,
        and where measured ``"mean"``, ``"low"``, ``"high"``, ``"half_width"``, between-seed ``"sd"`` and
        ``"seeds_needed"`` (None with one seed).
    """
    if t_interval is None:
        return {"reading": NOT_MEASURED, "words": NOT_MEASURED, "margin": endpoint.margin}
    low, high = t_interval["low"], t_interval["high"]
    reading = read_interval(low, high, margin=endpoint.margin)
    words = {
        "above 0": endpoint.above.format(m=m, base=base),
        "below 0": endpoint.below.format(m=m, base=base),
        "inside the margin": f"no difference as large as {endpoint.margin:g}{endpoint.unit}",
        "no decision": "no decision",
    }[reading]
    sd = t_interval["sd"]
    return {
        "reading": reading,
        "words": words,
        "margin": endpoint.margin,
        "mean": t_interval["mean"],
        "low": low,
        "high": high,
        "half_width": (high - low) / 2.0,
        "sd": sd,
        "seeds_needed": None if math.isnan(sd) else seeds_for_half_width(sd, endpoint.margin, level=level),
    }


def verdict(readings: dict) -> dict:
    """The verdict rule over the three readings of :func:`read_endpoint`.

    Args:
        readings: ``{"calibration", "stability", "accuracy"}`` -> the dict of :func:`read_endpoint`.

    Returns:
        ``{"verdict": "supports" | "contradicts" | "no decision", "because": [reasons]}``.

    Raises:
        KeyError: an endpoint is missing from ``readings``.
    """
    cal, ent, acc = readings["calibration"], readings["stability"], readings["accuracy"]
    against = []
    if cal["reading"] in ("below 0", "inside the margin"):
        against.append(f"calibration reads {cal['words']}")
    if acc["reading"] != NOT_MEASURED and acc["high"] < -acc["margin"]:
        against.append(f"the accuracy interval lies below -{acc['margin']:g}")
    if against:
        return {"verdict": "contradicts", "because": against}
    if cal["reading"] == "above 0" and acc["reading"] not in ("below 0", NOT_MEASURED):
        if ent["reading"] not in ("above 0", NOT_MEASURED):
            return {
                "verdict": "supports",
                "because": [
                    f"calibration reads {cal['words']}",
                    f"accuracy: {acc['words']}",
                    f"entropy: {ent['words']}",
                ],
            }
    return {
        "verdict": "no decision",
        "because": [f"{key}: {r['words']}" for key, r in readings.items()],
    }


def co_primary(summary: dict) -> dict:
    """``{"m - base": {"endpoints": {key: read_endpoint(...)}, "verdict": verdict(...)}}`` for every method after the
    first, from a summary of :func:`capo_verl.compare.seeds.write_seeds_summary` (its ``differences`` and its
    secondary ``entropy`` block)."""
    base, level = summary["methods"][0], summary["level"]
    entropy = summary.get("secondary", {}).get("entropy")
    result = {}
    for m in summary["methods"][1:]:
        name = f"{m} - {base}"
        diff = summary["differences"][name]
        ent = entropy["rows"]["entropy"]["differences"][name] if entropy else None
        intervals = {
            "calibration": diff["auc_mean"]["last"]["t_interval"],
            "stability": ent["t_interval"] if ent and "t_interval" in ent else None,
            "accuracy": diff["accuracy"]["last"]["t_interval"],
        }
        readings = {e.key: read_endpoint(intervals[e.key], e, m=m, base=base, level=level) for e in ENDPOINTS}
        result[name] = {"endpoints": readings, "verdict": verdict(readings)}
    return result
