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
  is defined at both passes of that method). A secondary endpoint: where a seed's method has no question mixed at
  both of its passes (a policy that ends almost deterministic), it is ``{"undefined": reason}`` and the summary goes on.

Each comes with the mean over seeds, a Student-t interval over seeds
(:func:`capo_verl.compare.statistics.seed_t_interval`: seeds are the units; the questions' sampling noise enters
through the spread between seeds) and a two-level bootstrap interval
(:func:`capo_verl.compare.statistics.hierarchical_bootstrap_diff`: seeds, then questions within each seed).

Secondary measures, each where its files exist, with the same two intervals (per seed and question where the
measure is per question; entropy has one value per seed, so its bootstrap resamples seeds only):

- teacher-forced AUC-mean at every scored checkpoint step (``compare --teacher-forced``: the per-question AUC of each
  checkpoint's lpm of the fixed base-model pool against the pool's correctness;
  :mod:`capo_verl.compare.teacher_forced`). Every run shares the step-0 scores, so the difference at a step is also
  the difference of the changes from step 0;
- held-out unbiased pass@k (k = 1, 2, 4, ... up to the samples per problem; pass@1 is mean@k) of the final
  checkpoints, per question, from ``eval_generations.jsonl`` (:func:`capo_verl.evaluation.metrics.per_group_pass_at_k`);
  beside them, not among the plan's endpoints, the held-out AUC-mean of lpm vs correctness and the accuracy of
  perplexity-consistency inference-time scaling (paper Algorithm 1, :func:`capo_verl.evaluation.metrics.its_credit`);
- ``actor/entropy``, the mean over the last :data:`ENTROPY_LAST_STEPS` logged steps (or the plan's
  ``entropy_last_steps``), one value per seed;
- the share of steps whose ``actor/grad_norm`` exceeded the run's ``actor.grad_clip``, one value per seed;
- the mean over steps of ``capo/adv_mean_correct`` and ``capo/adv_mean_incorrect``, one value per seed;
- the AUC-mean at the last pass over the questions mixed under both methods of a seed
  (``differences[...]["auc_mean"]["both_mixed"]``).

The two step-0 passes of a seed (every method validates the same base weights with the same rollout seeds) are
compared as a measure of the engine's pass-to-pass noise (:func:`step0_agreement`).

A study's co-primary endpoints, margins and verdict rule come from its plan file (``compare --plan``,
:mod:`capo_verl.compare.verdict`) and are read into ``summary["co_primary"]``; without a plan the summary reads none.

``seeds_summary.json`` holds the summary; its Markdown, ``seeds_summary.md``, is written by
:mod:`capo_verl.compare.seeds_markdown`, and ``seeds_curves.png`` (every seed's curve, thin, and their mean, bold, per
method: sampled validation AUC-mean and accuracy, teacher-forced AUC-mean, entropy) by
:mod:`capo_verl.compare.seeds_figure`.
"""

from __future__ import annotations

import json
import re
from collections import Counter
from pathlib import Path

import numpy as np

from capo_verl.compare.report import SHARED_STEP0, dump_lines, read_metrics, series, validation_dump, validation_passes
from capo_verl.compare.seeds_figure import seeds_curves
from capo_verl.compare.seeds_markdown import seeds_markdown
from capo_verl.compare.statistics import (
    MEASURES,
    hierarchical_bootstrap_diff,
    nanmean,
    nanmean_rows,
    seed_t_interval,
)
from capo_verl.compare.verdict import StudyPlan, co_primary
from capo_verl.stored import stored

#: ``actor/entropy`` is averaged over this many last logged steps of each run, unless a plan file says otherwise
ENTROPY_LAST_STEPS = 5


def _rows(x) -> np.ndarray:
    """``(S, Q)`` float64: per-seed values ``(S,)`` as one question per seed."""
    x = np.asarray(x, dtype=np.float64)
    return x[:, None] if x.ndim == 1 else x


def _difference(a, b, *, level: float, n_boot: int) -> dict:
    """``a - b`` paired by seed (and question): per-seed values, the t-interval over seeds and the two-level
    bootstrap interval (:mod:`capo_verl.compare.statistics`)."""
    return {
        "per_seed": [x - y for x, y in zip(nanmean_rows(_rows(a)), nanmean_rows(_rows(b)))],
        "t_interval": seed_t_interval(a, b, level=level),
        "hierarchical_bootstrap": hierarchical_bootstrap_diff(a, b, n_boot=n_boot, level=level),
    }


def _defined_difference(a, b, *, names: tuple[str, str], seeds: list[int], level: float, n_boot: int) -> dict:
    """:func:`_difference`, or ``{"undefined": reason}`` where a seed has no defined value (a secondary measure
    that cannot be computed does not stop the summary). ``names`` are the methods of ``a`` and ``b``, ``seeds``
    the seed indices of their rows: the reason names the method and seed with no defined value.

    Raises:
        ValueError: as :func:`_difference` for any other fault of ``a`` and ``b`` (shapes, infinite values).
    """
    missing = [
        f"{name}, seed {k}" for name, x in zip(names, (a, b)) for k, row in zip(seeds, _rows(x)) if np.isnan(row).all()
    ]
    if missing:
        return {"undefined": f"no defined value for {'; '.join(missing)}"}
    return _difference(a, b, level=level, n_boot=n_boot)


def per_question_values(out: Path, methods: list[str], seeds: list[int]) -> dict:
    """``{method: {measure: {"first": (S, Q), "last": (S, Q)}}}`` float64 arrays, seeds in ``seeds`` order, questions
    in the sorted order of the first pass; also ``"steps"``: ``{method: [(first step, last step) per seed]}`` and
    ``"samples"``: the most samples a question has in any pass.

    Raises:
        FileNotFoundError: a seed's method has no validation dump.
        ValueError: the validation questions differ between passes (not the same validation set).
    """
    values: dict = {m: {k: {"first": [], "last": []} for k in MEASURES} for m in methods}
    steps: dict = {m: [] for m in methods}
    questions, samples = None, 0
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
                samples = max(samples, max(len(x) for x in vp.lpm))
                per_q = vp.per_question()
                for measure, (_, i) in MEASURES.items():
                    values[m][measure][which].append(per_q[i])
    for m in methods:
        for measure in MEASURES:
            for which in ("first", "last"):
                values[m][measure][which] = np.asarray(values[m][measure][which], dtype=np.float64)
    return {"values": values, "steps": steps, "n_questions": len(questions or []), "samples": samples}


def write_seeds_summary(
    out: Path,
    methods: list[str],
    seeds: list[int],
    *,
    plan: StudyPlan | None = None,
    level: float = 0.95,
    n_boot: int = 2000,
) -> dict:
    """``<out>/seeds_summary.json``, ``seeds_summary.md`` and ``seeds_curves.png``; returns the summary dict.

    Args:
        out: the folder holding ``seed<k>/<method>/`` for every seed and method.
        methods: the methods, the first the base of every difference. seeds: the training seeds.
        plan: the study's plan file (:func:`capo_verl.compare.verdict.load_plan`): its co-primary endpoints and
            verdict rule are read into ``summary["co_primary"]``, its ``level`` and ``entropy_last_steps`` used.
            None: differences and intervals only, no reading.
        level: the intervals' coverage (the plan's, when given). n_boot: bootstrap resamples.

    Raises:
        FileNotFoundError, ValueError: see :func:`per_question_values`; ValueError also when a seed has no defined
            value of a measure at the last pass for a method (no mixed question at that pass).
        capo_verl.compare.verdict.PlanError: ``methods`` are not the plan's.
    """
    if plan is not None:
        level = plan.level
    last_steps = ENTROPY_LAST_STEPS if plan is None else plan.entropy_last_steps
    data = per_question_values(out, methods, seeds)
    values, base = data["values"], methods[0]
    summary: dict = {
        "seeds": seeds,
        "methods": methods,
        "level": level,
        "n_boot": n_boot,
        "n_questions": data["n_questions"],
        "samples": data["samples"],
        "steps": data["steps"],
        "per_seed": {
            m: {
                measure: {which: nanmean_rows(values[m][measure][which]) for which in ("first", "last")}
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
            entry[measure] = {
                "last": _difference(a_last, b_last, level=level, n_boot=n_boot),
                # secondary: undefined where a seed's method has no question mixed at both of its passes
                "change": _defined_difference(
                    a_change, b_change, names=(m, base), seeds=seeds, level=level, n_boot=n_boot
                ),
            }
        # secondary: the AUC-mean over the questions mixed at the last pass under both methods of the seed
        both = ~np.isnan(values[m]["auc_mean"]["last"]) & ~np.isnan(values[base]["auc_mean"]["last"])
        entry["auc_mean"]["both_mixed"] = _defined_difference(
            np.where(both, values[m]["auc_mean"]["last"], np.nan),
            np.where(both, values[base]["auc_mean"]["last"], np.nan),
            names=(m, base),
            seeds=seeds,
            level=level,
            n_boot=n_boot,
        )
        entry["auc_mean"]["both_mixed"]["n_questions"] = both.sum(axis=1).tolist()
        summary["differences"][f"{m} - {base}"] = entry
    summary["secondary"] = secondary_summary(
        out, methods, seeds, level=level, n_boot=n_boot, entropy_last_steps=last_steps
    )
    summary["step0_agreement"] = step0_agreement(out, methods, seeds)
    if plan is not None:
        summary["plan"] = {"study": plan.study, "file": plan.path.name}
        summary["co_primary"] = co_primary(summary, plan)
    (out / "seeds_summary.json").write_text(json.dumps(summary, indent=1, default=float) + "\n")
    (out / "seeds_summary.md").write_text(seeds_markdown(summary, plan))
    seeds_curves(out, methods, seeds, teacher_forced_values(out, methods, seeds))
    return summary


# ----------------------------------------------------------------------------------------- step-0 agreement


def _texts(path: Path) -> dict[str, Counter] | None:
    """``{question: Counter(response text)}`` of a validation dump, or None when it has no ``output`` texts."""
    by_q: dict[str, Counter] = {}
    for line in dump_lines(path):
        if line.strip():
            row = json.loads(line)
            if "output" not in row:
                return None
            by_q.setdefault(str(row["input"]), Counter())[row["output"]] += 1
    return by_q


def pass_agreement(a: Path, b: Path) -> float | None:
    """Fraction of the responses of validation dump ``a`` (``val_generations/<step>.jsonl``) that dump ``b`` also
    produced for the same question: the multiset overlap of the response texts per question, divided by ``a``'s
    samples, so the order of the samples does not matter. 1.0: the two passes gave the same responses.

    Returns:
        The fraction in [0, 1], or None when a dump has no response texts (``output``).

    Raises:
        ValueError: the two dumps hold other questions (not the same validation set).
    """
    ta, tb = _texts(a), _texts(b)
    if ta is None or tb is None:
        return None
    if set(ta) != set(tb):
        raise ValueError(f"{a} and {b} validated other questions")
    same = sum(sum((ta[q] & tb[q]).values()) for q in ta)
    return same / sum(sum(c.values()) for c in ta.values())


def step0_agreement(out: Path, methods: list[str], seeds: list[int]) -> dict | None:
    """How far two validation passes of the same weights agree: every method of a seed validates step 0 with the
    base model and the same rollout seeds, so their step-0 passes differ only by the engine's numerics (batching,
    rounding). Per seed and method other than the first (``base``): :func:`pass_agreement` of the base's step-0
    pass and the method's. Each pass's AUC-mean and accuracy are the ``first`` values of
    :func:`write_seeds_summary`'s ``per_seed``.

    Returns:
        ``{"m - base": [S] identical fractions in [0, 1], None for a seed whose method took the base's pass
        (``compare --share-step0``: nothing to compare)}``, or None unless every run of every seed has a
        ``val_generations/0.jsonl`` with the response texts (``output``).

    Raises:
        ValueError: two step-0 passes of a seed validated other questions (not the same validation set).
    """
    files = {(k, m): validation_dump(out / f"seed{k}" / m / "val_generations", 0) for k in seeds for m in methods}
    if not all(f.exists() for f in files.values()):
        return None
    result = {}
    for m in methods[1:]:
        result[f"{m} - {methods[0]}"] = fractions = []
        for k in seeds:
            if (out / f"seed{k}" / m / "val_generations" / SHARED_STEP0).exists():
                fractions.append(None)
                continue
            try:
                value = pass_agreement(files[(k, methods[0])], files[(k, m)])
            except ValueError:
                raise ValueError(f"seed {k}: {methods[0]} and {m} validated other questions at step 0") from None
            if value is None:
                return None
            fractions.append(value)
    return result


# ----------------------------------------------------------------------------------------- secondary measures


def teacher_forced_values(out: Path, methods: list[str], seeds: list[int]) -> dict | None:
    """Per-question teacher-forced AUC of every run at every step all runs scored: ``{"steps": [0, ...],
    "n_questions": Q, "values": {method: {step: (S, Q) float64}}}`` (NaN: a question of the pool with one outcome;
    step 0 is the base model's scores, shared by every run). None without ``<out>/teacher_forced/step0.json``.

    Raises:
        ValueError: a score file does not match the pool (length), or holds a non-finite lpm.
    """
    from capo_verl.compare.teacher_forced import POOL_DIR
    from capo_verl.evaluation.teacher_forced import question_keys, read_pool
    from capo_verl.metrics import per_group_auc

    pool_dir = out / POOL_DIR
    if not (pool_dir / "step0.json").exists():
        return None
    pool = read_pool(pool_dir / "pool.jsonl")
    keys = question_keys(pool)
    correct = np.array([r["correct"] for r in pool], dtype=bool)

    def auc(npy: Path) -> np.ndarray:
        lpm = np.load(npy)
        if lpm.shape != correct.shape:
            raise ValueError(f"{npy}: {lpm.shape[0]} scores for a pool of {len(pool)} responses")
        return per_group_auc(lpm, correct, keys)[0]

    scored = [  # step<N>.0.npy; a stopped scoring's step<N>.partial.0.npy is not a score
        {
            int(g[1])
            for p in (out / f"seed{k}" / m / POOL_DIR).glob("step*.0.npy")
            if (g := re.fullmatch(r"step(\d+)\.0\.npy", p.name))
        }
        for k in seeds
        for m in methods
    ]
    steps = [0, *sorted(set.intersection(*scored))] if scored else [0]
    base = auc(pool_dir / "step0.0.npy")
    values = {
        m: {
            step: np.stack(
                [base if step == 0 else auc(out / f"seed{k}" / m / POOL_DIR / f"step{step}.0.npy") for k in seeds]
            )
            for step in steps
        }
        for m in methods
    }
    return {"steps": steps, "n_questions": int(len(base)), "values": values}


def heldout_values(out: Path, methods: list[str], seeds: list[int]) -> dict | None:
    """Per-question values on the held-out set of every run's final checkpoint, questions sorted by key: unbiased
    pass@k (``"values": {method: {k: (S, Q) float64}}``, k = 1, 2, 4, ...), the ROC-AUC of lpm against correctness
    (``"auc"``: ``{method: (S, Q)}``, NaN for a question that is not mixed) and the credit of perplexity-consistency
    inference-time scaling (``"its"``: ``{method: (S, Q)}`` in [0, 1], paper Algorithm 1,
    :func:`capo_verl.evaluation.metrics.its_credit`). None unless every run has its ``eval_generations.jsonl``.

    Raises:
        ValueError: the runs evaluated different questions.
    """
    from capo_verl.evaluation.metrics import its_credit, per_group_auc, per_group_pass_at_k
    from capo_verl.evaluation.teacher_forced import question_keys

    files = {(k, m): stored(out / f"seed{k}" / m / "eval_generations.jsonl") for k in seeds for m in methods}
    if not all(f.exists() for f in files.values()):
        return None
    per_run, questions, n_min = {}, None, None
    for key, path in files.items():
        lines = [json.loads(line) for line in dump_lines(path) if line.strip()]
        group = question_keys(lines)
        qs, counts = np.unique(group, return_counts=True)
        if questions is None:
            questions = qs
        elif not np.array_equal(qs, questions):
            raise ValueError(f"{path}: other held-out questions than {files[next(iter(files))]}")
        n_min = int(counts.min()) if n_min is None else min(n_min, int(counts.min()))
        correct = np.array([r["correct"] for r in lines], dtype=bool)
        lpm = np.array([r["lpm"] for r in lines], dtype=np.float64)
        answer = [r["answer"] for r in lines]
        per_run[key] = {
            "pass": (correct, group),
            "auc": per_group_auc(lpm, correct, group)[0],
            "its": its_credit(group, answer, lpm, correct)[0],
        }
    ks = [2**i for i in range(n_min.bit_length()) if 2**i <= n_min]
    values = {
        m: {kk: np.stack([per_group_pass_at_k(*per_run[(k, m)]["pass"], kk)[0] for k in seeds]) for kk in ks}
        for m in methods
    }
    auc, its = ({m: np.stack([per_run[(k, m)][x] for k in seeds]) for m in methods} for x in ("auc", "its"))
    return {"ks": ks, "n_questions": int(len(questions)), "values": values, "auc": auc, "its": its}


def entropy_values(
    out: Path, methods: list[str], seeds: list[int], last_steps: int = ENTROPY_LAST_STEPS
) -> dict | None:
    """``{method: (S,) float64}``: each run's mean ``actor/entropy`` (nats) over its last ``last_steps`` logged
    steps; None when a run logged none."""
    return _step_metric_values(out, methods, seeds, "actor/entropy", lambda ys, _: float(np.mean(ys[-last_steps:])))


def grad_clip_counts(out: Path, methods: list[str], seeds: list[int]) -> dict | None:
    """``{method: (S, 2) int64}``: each run's steps whose ``actor/grad_norm`` (the norm before clipping,
    ``clip_grad_norm_`` in verl's FSDP engine, ``verl/workers/engine/fsdp/transformer_impl.py``) exceeded the clip
    its recorded config (``done.json``) gave verl's optimizer, ``actor_rollout_ref.actor.optim.clip_grad``, so that
    the update was scaled down, and the steps that logged a norm: ``[clipped, logged]``. A step with a non-finite
    norm, which verl skips, is not counted as clipped. None when a run logged no grad norm or has no record."""

    def count(ys: list[float], run: Path) -> tuple[int, int]:
        actor = json.loads((run / "done.json").read_text())["settings"]["composed"]["actor_rollout_ref"]["actor"]
        clip = float(actor["optim"]["clip_grad"])
        norms = np.asarray(ys, dtype=np.float64)
        return int(np.sum(np.isfinite(norms) & (norms > clip))), norms.size

    if not all((out / f"seed{k}" / m / "done.json").exists() for k in seeds for m in methods):
        return None
    return _step_metric_values(out, methods, seeds, "actor/grad_norm", count, dtype=np.int64)


def grad_clip_values(out: Path, methods: list[str], seeds: list[int]) -> dict | None:
    """``{method: (S,) float64}``: each run's share of steps whose grad norm was clipped, the ratio of
    :func:`grad_clip_counts`' two columns. None where it is None."""
    counts = grad_clip_counts(out, methods, seeds)
    return None if counts is None else {m: c[:, 0] / c[:, 1] for m, c in counts.items()}


def advantage_values(out: Path, methods: list[str], seeds: list[int], outcome: str) -> dict | None:
    """``{method: (S,) float64}``: each run's mean over its steps of ``capo/adv_mean_<outcome>`` (``correct`` or
    ``incorrect``: the mean sequence advantage of the step's responses of that outcome,
    :func:`capo_verl.metrics.capo_step_metrics`); None when a run logged none."""
    return _step_metric_values(out, methods, seeds, f"capo/adv_mean_{outcome}", lambda ys, _: float(np.mean(ys)))


def _step_metric_values(
    out: Path, methods: list[str], seeds: list[int], key: str, reduce, dtype=np.float64
) -> dict | None:
    """``{method: (S, ...) dtype}`` of ``reduce(values of key over the logged steps, run folder)`` per run; None when
    a run logged no ``key``."""
    values = {}
    for m in methods:
        row = []
        for k in seeds:
            run = out / f"seed{k}" / m
            _, ys = series(read_metrics(run / "metrics.jsonl"), key)
            if not ys:
                return None
            row.append(reduce(ys, run))
        values[m] = np.asarray(row, dtype=dtype)
    return values


def secondary_summary(
    out: Path,
    methods: list[str],
    seeds: list[int],
    *,
    level: float,
    n_boot: int,
    entropy_last_steps: int = ENTROPY_LAST_STEPS,
) -> dict:
    """``{measure: {"label", "rows": {row: {"per_seed": {method: [S floats]}, "differences": {"m - base":
    _difference}}}}}`` for the secondary measures whose files exist (see the module doc)."""
    base = methods[0]

    def block(label: str, rows: dict) -> dict:
        return {
            "label": label,
            "rows": {
                row: {
                    "per_seed": {m: nanmean_rows(_rows(by_method[m])) for m in methods},
                    "differences": {
                        f"{m} - {base}": _defined_difference(
                            by_method[m], by_method[base], names=(m, base), seeds=seeds, level=level, n_boot=n_boot
                        )
                        for m in methods[1:]
                    },
                }
                for row, by_method in rows.items()
            },
        }

    out_: dict = {}
    tf = teacher_forced_values(out, methods, seeds)
    if tf is not None and len(tf["steps"]) > 1:
        rows = {f"step {st}": {m: tf["values"][m][st] for m in methods} for st in tf["steps"][1:]}
        out_["teacher_forced_auc_mean"] = block(
            f"teacher-forced AUC-mean (fixed base-model pool, {tf['n_questions']} questions)", rows
        )
        out_["teacher_forced_auc_mean"]["step0"] = nanmean(tf["values"][base][0][0])
    held = heldout_values(out, methods, seeds)
    if held is not None:
        rows = {f"pass@{kk}": {m: held["values"][m][kk] for m in methods} for kk in held["ks"]}
        out_["heldout_pass_at_k"] = block(
            f"held-out pass@k, final checkpoints ({held['n_questions']} questions; pass@1 = mean@k)", rows
        )
        out_["heldout_calibration_its"] = block(
            f"held-out AUC-mean and inference-time scaling, final checkpoints ({held['n_questions']} questions; "
            "reported beside the plan's endpoints)",
            {"AUC-mean": held["auc"], "ITS accuracy, perplexity consistency": held["its"]},
        )
    ent = entropy_values(out, methods, seeds, entropy_last_steps)
    if ent is not None:
        out_["entropy"] = block(f"actor/entropy (nats), mean of the last {entropy_last_steps} steps", {"entropy": ent})
    clipped = grad_clip_values(out, methods, seeds)
    if clipped is not None:
        out_["grad_clipped"] = block(
            "share of steps whose grad norm exceeded actor.optim.clip_grad (the update was scaled down)",
            {"share of steps": clipped},
        )
    adv = {o: advantage_values(out, methods, seeds, o) for o in ("correct", "incorrect")}
    if all(v is not None for v in adv.values()):
        out_["advantage_by_outcome"] = block(
            "mean sequence advantage of the step's correct and incorrect responses, mean over steps",
            {f"{o} responses": v for o, v in adv.items()},
        )
    return out_
