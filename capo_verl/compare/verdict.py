"""A study's co-primary endpoints and verdict rule, read from its plan file (``capo-verl compare --plan PATH``).

A study's protocol is data, kept beside its results (e.g. ``benchmarks/results/compare_pilot2_cpu/plan.yaml``); this
module holds only the generic parts: the plan file's schema (:class:`StudyPlan`, :func:`load_plan`), reading one
endpoint's Student-t interval over seeds against its margin (:func:`read_endpoint`), and applying the plan's verdict
rule to the readings (:func:`apply_verdict`). A plan file::

    study: pilot 2                       # a name for the reports
    methods: [grpo, capo]                # the first is the base of every difference
    seeds: [0, 1, 2]
    steps: 30
    validation: {questions: 256, samples: 8}
    level: 0.95                          # the t-intervals' coverage
    entropy_last_steps: 5                # the stability measure averages the last this many logged steps
    endpoints:                           # co-primary, in this order
      calibration:
        measure: auc_mean                # one of MEASURES
        label: sampled validation AUC-mean at the last pass
        margin: 0.03
        unit: ""                         # printed after the margin
        above: "{m} better calibrated"   # {m}: the method, {base}: the first method
        below: "{base} better calibrated"
      ...
    verdict:
      contradicts_if_any:                # checked first
        - {endpoint: calibration, reading: [below 0, inside the margin]}
        - {endpoint: accuracy, high_below: -0.05}     # the interval's high end lies below this
      supports_if_all:
        - {endpoint: calibration, reading: [above 0]}
        - {endpoint: accuracy, reading: [above 0, inside the margin, no decision]}

Readings (:func:`capo_verl.compare.statistics.read_interval`): ``above 0``, ``below 0``, ``inside the margin``,
``no decision``, and :data:`NOT_MEASURED` where the endpoint has no value; a condition on a reading never holds
for an endpoint that was not measured. The verdict is ``contradicts`` when any of its conditions holds, else
``supports`` when all of its conditions hold, else ``no decision``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

from capo_verl.compare.statistics import read_interval, seeds_for_half_width

#: the reading of an endpoint with no value (e.g. no ``actor/entropy`` logged)
NOT_MEASURED = "not measured"
#: every reading an endpoint can have
READINGS = ("above 0", "below 0", "inside the margin", "no decision", NOT_MEASURED)


#: what an endpoint can measure: name -> the path of its difference record in a seeds summary
#: (:func:`capo_verl.compare.seeds.write_seeds_summary`), ``"{name}"`` standing for the difference ``"m - base"``
MEASURES = {
    "auc_mean": ("differences", "{name}", "auc_mean", "last"),
    "accuracy": ("differences", "{name}", "accuracy", "last"),
    "auc_mean_both_mixed": ("differences", "{name}", "auc_mean", "both_mixed"),
    "entropy": ("secondary", "entropy", "rows", "entropy", "differences", "{name}"),
}


def difference_record(summary: dict, measure: str, name: str) -> dict | None:
    """The record of ``measure``'s difference ``name`` (e.g. ``"capo - grpo"``) in a seeds summary: its
    ``"per_seed"`` differences, ``"t_interval"`` and ``"hierarchical_bootstrap"``; None where it is absent (a
    secondary measure without its files).

    Raises:
        KeyError: ``measure`` is not a key of :data:`MEASURES`.
    """
    if measure not in MEASURES:
        raise KeyError(f"unknown measure {measure!r}: one of {sorted(MEASURES)}")
    node = summary
    for part in MEASURES[measure]:
        part = part.format(name=name)
        if not isinstance(node, dict) or part not in node:
            return None
        node = node[part]
    return node if isinstance(node, dict) else None


class PlanError(ValueError):
    """A plan file that cannot be read: the message names the file and the key."""


@dataclass(frozen=True)
class Endpoint:
    """One co-primary endpoint: its key, what it measures (a key of :data:`MEASURES`), its label, margin (in its
    unit), the unit's text, and the words of each reading; ``{m}`` is the method, ``{base}`` the first method."""

    key: str
    measure: str
    label: str
    margin: float
    unit: str
    above: str
    below: str


@dataclass(frozen=True)
class Condition:
    """One condition of the verdict rule: ``endpoint``'s reading is among ``reading``, or (``high_below``) its
    interval's high end lies below that value."""

    endpoint: str
    reading: tuple[str, ...] = ()
    high_below: float | None = None

    def holds(self, r: dict) -> bool:
        """Whether the condition holds for the reading ``r`` of :func:`read_endpoint`."""
        if r["reading"] == NOT_MEASURED:
            return False
        if self.high_below is not None:
            return r["high"] < self.high_below
        return r["reading"] in self.reading

    def describe(self) -> str:
        """The condition in words, for the reports."""
        if self.high_below is not None:
            return f"the {self.endpoint} interval lies below {self.high_below:g}"
        return f"{self.endpoint} reads {' or '.join(self.reading)}"


@dataclass(frozen=True)
class StudyPlan:
    """A study's protocol as its plan file fixes it (see the module doc).

    Attributes:
        path: the plan file. study: its name. methods: the methods, the first the base of every difference.
        seeds: the training seeds. steps: training steps per unit. validation: ``{"questions", "samples"}``.
        level: the coverage of the t-intervals. entropy_last_steps: the stability measure's window.
        endpoints: the co-primary endpoints, in order. contradicts_if_any, supports_if_all: the verdict rule.
    """

    path: Path
    study: str
    methods: tuple[str, ...]
    seeds: tuple[int, ...]
    steps: int
    validation: dict
    level: float
    entropy_last_steps: int
    endpoints: tuple[Endpoint, ...]
    contradicts_if_any: tuple[Condition, ...]
    supports_if_all: tuple[Condition, ...]


_TOP_KEYS = {"study", "methods", "seeds", "steps", "validation", "level", "entropy_last_steps", "endpoints", "verdict"}
_ENDPOINT_KEYS = {"measure", "label", "margin", "unit", "above", "below"}


def load_plan(path: str | Path) -> StudyPlan:
    """Read and check a plan file (YAML, see the module doc).

    Raises:
        PlanError: the file is missing or not YAML, a key is missing, unknown or of the wrong type, a margin is not
            > 0, a measure or reading is unknown, or the verdict rule names an endpoint the plan does not have. The
            message names the file and the key.
    """
    import yaml

    path = Path(path).expanduser().resolve()

    def fail(key: str, what: str) -> PlanError:
        return PlanError(f"plan file {path}: {key}: {what}")

    try:
        raw = yaml.safe_load(path.read_text())
    except OSError as exc:
        raise PlanError(f"plan file {path}: cannot be read ({exc.strerror or exc})") from None
    except yaml.YAMLError as exc:
        raise PlanError(f"plan file {path}: not YAML ({str(exc).splitlines()[0]})") from None
    if not isinstance(raw, dict):
        raise fail("(top level)", "expected a mapping of the keys " + ", ".join(sorted(_TOP_KEYS)))
    _known(raw, _TOP_KEYS, "(top level)", fail)
    for key in _TOP_KEYS:
        if key not in raw:
            raise fail(key, "missing")

    def number(key, value, *, integer=False, positive=True) -> float:
        ok = isinstance(value, int) if integer else isinstance(value, (int, float))
        if isinstance(value, bool) or not ok or not math.isfinite(value) or (positive and value <= 0):
            kind = "an integer" if integer else "a number"
            raise fail(key, f"expected {kind}{' > 0' if positive else ''}, got {value!r}")
        return value

    methods = raw["methods"]
    if not (isinstance(methods, list) and len(methods) >= 2 and all(isinstance(m, str) for m in methods)):
        raise fail("methods", f"expected a list of two or more method names, got {methods!r}")
    if len(set(methods)) != len(methods):
        raise fail("methods", f"a method is listed twice: {methods!r}")
    seeds = raw["seeds"]
    if not (
        isinstance(seeds, list)
        and seeds
        and all(isinstance(k, int) and not isinstance(k, bool) and k >= 0 for k in seeds)
        and len(set(seeds)) == len(seeds)
    ):
        raise fail("seeds", f"expected a list of distinct integers >= 0, got {seeds!r}")
    validation = raw["validation"]
    if not isinstance(validation, dict) or set(validation) != {"questions", "samples"}:
        raise fail("validation", f"expected {{questions: N, samples: K}}, got {validation!r}")
    for key in ("questions", "samples"):
        number(f"validation.{key}", validation[key], integer=True)
    level = number("level", raw["level"])
    if not level < 1:
        raise fail("level", f"expected a coverage in (0, 1), got {level!r}")

    endpoints_raw = raw["endpoints"]
    if not isinstance(endpoints_raw, dict) or not endpoints_raw:
        raise fail("endpoints", "expected a mapping of endpoint names to their measure, label, margin and words")
    endpoints = []
    for key, e in endpoints_raw.items():
        where = f"endpoints.{key}"
        if not isinstance(e, dict):
            raise fail(where, f"expected a mapping of {', '.join(sorted(_ENDPOINT_KEYS))}")
        _known(e, _ENDPOINT_KEYS, where, fail)
        for k in _ENDPOINT_KEYS - {"unit"}:
            if k not in e:
                raise fail(f"{where}.{k}", "missing")
        if not isinstance(e["measure"], str) or e["measure"] not in MEASURES:
            raise fail(f"{where}.measure", f"{e['measure']!r} is not one of {', '.join(MEASURES)}")
        for k in ("label", "above", "below", "unit"):
            if not isinstance(e.get(k, ""), str):
                raise fail(f"{where}.{k}", f"expected text, got {e[k]!r}")
        for k in ("above", "below"):
            try:
                e[k].format(m="m", base="base")
            except (KeyError, IndexError, ValueError) as exc:
                raise fail(f"{where}.{k}", f"{e[k]!r}: only {{m}} and {{base}} may stand in braces ({exc})") from None
        margin = number(f"{where}.margin", e["margin"])
        endpoints.append(
            Endpoint(str(key), e["measure"], e["label"], float(margin), e.get("unit", ""), e["above"], e["below"])
        )

    rule = raw["verdict"]
    if not isinstance(rule, dict):
        raise fail("verdict", "expected contradicts_if_any and supports_if_all")
    _known(rule, {"contradicts_if_any", "supports_if_all"}, "verdict", fail)
    names = {e.key for e in endpoints}
    conditions = {}
    for part in ("contradicts_if_any", "supports_if_all"):
        items = rule.get(part)
        if not isinstance(items, list) or not items:
            raise fail(f"verdict.{part}", "expected a list of conditions {endpoint: NAME, reading: [...]}")
        parsed = []
        for i, c in enumerate(items):
            where = f"verdict.{part}[{i}]"
            if not isinstance(c, dict) or not isinstance(c.get("endpoint"), str) or c["endpoint"] not in names:
                raise fail(where, f"expected {{endpoint: one of {', '.join(sorted(names))}, reading: [...]}}")
            _known(c, {"endpoint", "reading", "high_below"}, where, fail)
            if ("reading" in c) == ("high_below" in c):
                raise fail(where, "give either reading: [...] or high_below: VALUE")
            if "high_below" in c:
                value = number(f"{where}.high_below", c["high_below"], positive=False)
                parsed.append(Condition(c["endpoint"], high_below=float(value)))
                continue
            readings = c["reading"]
            if not isinstance(readings, list) or not readings or any(r not in READINGS[:-1] for r in readings):
                raise fail(f"{where}.reading", f"expected a list of {', '.join(READINGS[:-1])}, got {readings!r}")
            parsed.append(Condition(c["endpoint"], reading=tuple(readings)))
        conditions[part] = tuple(parsed)

    return StudyPlan(
        path=path,
        study=str(raw["study"]),
        methods=tuple(methods),
        seeds=tuple(seeds),
        steps=int(number("steps", raw["steps"], integer=True)),
        validation=dict(validation),
        level=float(level),
        entropy_last_steps=int(number("entropy_last_steps", raw["entropy_last_steps"], integer=True)),
        endpoints=tuple(endpoints),
        contradicts_if_any=conditions["contradicts_if_any"],
        supports_if_all=conditions["supports_if_all"],
    )


def _known(raw: dict, known: set[str], where: str, fail) -> None:
    unknown = sorted(set(raw) - known)
    if unknown:
        raise fail(where, f"unknown key {unknown[0]!r}; the keys are {', '.join(sorted(known))}")


def read_endpoint(t_interval: dict | None, endpoint: Endpoint, *, m: str, base: str, level: float = 0.95) -> dict:
    """The reading of one endpoint from its t-interval over seeds, against the endpoint's margin.

    Args:
        t_interval: :func:`capo_verl.compare.statistics.seed_t_interval` of ``m - base`` (``mean``, ``low``,
            ``high``, ``sd``), or None where the endpoint was not measured.
        endpoint: the plan's :class:`Endpoint`. m, base: the two methods' names. level: the interval's coverage.

    Returns:
        ``{"reading"}`` (one of :data:`READINGS`), ``"words"`` (the plan's sentence, e.g. ``"capo better
        calibrated"``), ``"label"``, ``"margin"``, and where measured ``"mean"``, ``"low"``, ``"high"``,
        ``"half_width"``, between-seed ``"sd"`` and ``"seeds_needed"`` for a half-width of the margin (None with
        one seed).
    """
    if t_interval is None:
        return {"reading": NOT_MEASURED, "words": NOT_MEASURED, "label": endpoint.label, "margin": endpoint.margin}
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
        "label": endpoint.label,
        "margin": endpoint.margin,
        "mean": t_interval["mean"],
        "low": low,
        "high": high,
        "half_width": (high - low) / 2.0,
        "sd": sd,
        "seeds_needed": None if math.isnan(sd) else seeds_for_half_width(sd, endpoint.margin, level=level),
    }


def apply_verdict(readings: dict, plan: StudyPlan) -> dict:
    """The plan's verdict rule over the readings of :func:`read_endpoint`.

    Args:
        readings: endpoint key -> the dict of :func:`read_endpoint`, for every endpoint of ``plan``.

    Returns:
        ``{"verdict": "supports" | "contradicts" | "no decision", "because": [reasons]}``: the conditions that
        held (contradicts), every endpoint's words (supports, no decision).

    Raises:
        KeyError: an endpoint of the rule is missing from ``readings``.
    """
    against = [c for c in plan.contradicts_if_any if c.holds(readings[c.endpoint])]
    if against:
        return {
            "verdict": "contradicts",
            "because": [
                f"{c.endpoint} reads {readings[c.endpoint]['words']}" if c.reading else c.describe() for c in against
            ],
        }
    because = [f"{key}: {r['words']}" for key, r in readings.items()]
    if all(c.holds(readings[c.endpoint]) for c in plan.supports_if_all):
        return {"verdict": "supports", "because": because}
    return {"verdict": "no decision", "because": because}


def co_primary(summary: dict, plan: StudyPlan) -> dict:
    """``{"m - base": {"endpoints": {key: read_endpoint(...)}, "verdict": apply_verdict(...)}}`` for every method
    after the first, from a summary of :func:`capo_verl.compare.seeds.write_seeds_summary`.

    Raises:
        PlanError: the summary's methods, validation questions, samples per question or last steps are not the
            plan's.
    """
    if tuple(summary["methods"]) != plan.methods:
        raise PlanError(
            f"plan file {plan.path}: methods: the plan compares {' '.join(plan.methods)}, the summary "
            f"{' '.join(summary['methods'])}; run compare with --methods {' '.join(plan.methods)}"
        )
    found = {
        "validation.questions": summary["n_questions"],
        "validation.samples": summary.get("samples"),
        "steps": sorted({last for runs in summary["steps"].values() for _, last in runs}),
    }
    wanted = {
        "validation.questions": plan.validation["questions"],
        "validation.samples": plan.validation["samples"],
        "steps": [plan.steps],
    }
    for key, value in found.items():
        if value is not None and value != wanted[key]:
            raise PlanError(f"plan file {plan.path}: {key}: the plan has {wanted[key]}, the units {value}")
    base, level = plan.methods[0], plan.level
    result = {}
    for m in plan.methods[1:]:
        name = f"{m} - {base}"
        readings = {
            e.key: read_endpoint(
                (difference_record(summary, e.measure, name) or {}).get("t_interval"), e, m=m, base=base, level=level
            )
            for e in plan.endpoints
        }
        result[name] = {"endpoints": readings, "verdict": apply_verdict(readings, plan)}
    return result
