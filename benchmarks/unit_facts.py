"""What each unit of a study did, beside its seeds summary: the per-unit facts a result page quotes.

For every seed folder of a ``capo-verl compare --seeds`` output (or its committed copy) in which each method has
finished (``seed<k>/<method>/done.json``), one row per unit:

- ``trainer min``: the unit's minutes in verl's trainer (``done.json`` ``wall_s``: its steps and the validation
  passes made inside it);
- ``mixed first / last``: the validation questions with both a correct and an incorrect sample at the first and the
  last pass (``seed<k>/summary.json``), the questions a pass's AUC-mean averages over;
- ``training reward`` and ``response tokens``: the means of ``critic/score/mean`` (the share of the step's
  responses the reward paid) and of ``response_length/mean`` over the first and the last ``--ends`` logged steps;
- ``clipped``: the steps whose ``actor/grad_norm`` exceeded the unit's ``actor_rollout_ref.actor.optim.clip_grad``
  (``capo_verl.compare.seeds.grad_clip_counts``), of the steps logged;
- for a CAPO unit, ``capo/mask_frac_incorrect`` and ``capo/mask_frac_correct`` (the shares of each outcome's
  responses the reference-perplexity mask dropped, ``capo_verl.metrics.capo_step_metrics``) over steps 1 to
  ``--early`` and over the last ``--late`` steps, as min-max ranges; a step without a response of that outcome logs
  no fraction;
- ``nonzero adv. incorrect``: the share of the step's incorrect responses whose advantage is nonzero, as bounds
  (:func:`nonzero_incorrect_bounds`), averaged over all steps and over the last ``--late`` steps. No unit logs this
  share; the bounds follow from what every unit logs, ``critic/score/mean`` and ``capo/mixed_group_frac`` (and, for a
  masked CAPO unit, ``capo/mask_frac_incorrect``).

A last row gives each column's range over the units of a method.

    .venv/bin/python benchmarks/unit_facts.py benchmarks/results/compare_main_cpu/units --methods grpo capo
"""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path

import numpy as np

from capo_verl.compare.report import read_metrics, series
from capo_verl.compare.seeds import grad_clip_counts

ENDS = {"reward": "critic/score/mean", "tokens": "response_length/mean"}
MASK_KEYS = ("capo/mask_frac_incorrect", "capo/mask_frac_correct")
NONZERO = "nonzero adv. incorrect"


def nonzero_incorrect_bounds(
    n_correct: int, n_mixed: int, group_size: int, n_groups: int, mask_frac_incorrect: float | None = None
) -> tuple[float, float] | None:
    """Bounds on the share of a training batch's incorrect responses whose advantage is nonzero, from its counts.

    GRPO, GSPO and CAPO (Eq. 14) give a response a nonzero advantage only in a mixed group (both outcomes): in a
    group whose responses are all correct or all incorrect the group-relative advantage and every pairwise term
    vanish. CAPO's noise mask (Eq. 18) sets a dropped response's advantage to 0. The batch has ``n_groups`` groups of
    ``group_size`` responses, ``n_correct`` correct ones and ``n_mixed`` mixed groups; which groups hold the correct
    responses is not logged. Every split with ``A`` all-correct groups leaves ``c = n_correct - group_size * A``
    correct responses in the mixed groups, with ``n_mixed <= c <= (group_size - 1) * n_mixed``, and so
    ``group_size * n_mixed - c`` incorrect ones there; the bounds are the least and the most of these over the
    possible ``A``, divided by the batch's incorrect responses. With the mask, a share ``mask_frac_incorrect`` of the
    incorrect responses is dropped, wherever it lies: the bounds become ``max(0, lo - f)`` and ``min(hi, 1 - f)``.

    Args:
        n_correct, n_mixed: counts of the batch (``critic/score/mean`` times its responses;
            ``capo/mixed_group_frac`` times ``n_groups``).
        group_size, n_groups: ``actor_rollout_ref.rollout.n`` and ``data.train_batch_size``.
        mask_frac_incorrect: ``capo/mask_frac_incorrect`` of a masked CAPO step, else None.

    Returns:
        ``(lo, hi)``, shares in [0, 1]; None for a batch without an incorrect response. ``capo/mixed_group_frac``
        leaves out a response without a valid token and ``critic/score/mean`` does not; a batch with one can give
        counts no split has (ValueError below).

    Raises:
        ValueError: no split of the batch into groups has these counts.
    """
    n_incorrect = group_size * n_groups - n_correct
    if n_incorrect == 0 and n_mixed == 0:
        return None
    in_mixed = [
        group_size * n_mixed - c
        for a in range(n_groups - n_mixed + 1)
        if n_mixed <= (c := n_correct - group_size * a) <= (group_size - 1) * n_mixed
    ]
    if n_incorrect <= 0 or not in_mixed:
        raise ValueError(
            f"no batch of {n_groups} groups of {group_size} responses has {n_correct} correct responses and "
            f"{n_mixed} mixed groups; the unit's batch is not data.train_batch_size x actor_rollout_ref.rollout.n"
        )
    lo, hi = min(in_mixed) / n_incorrect, max(in_mixed) / n_incorrect
    if mask_frac_incorrect is not None:
        lo, hi = max(0.0, lo - mask_frac_incorrect), min(hi, 1.0 - mask_frac_incorrect)
    return lo, hi


def _count(value: float, total: int, key: str, run: Path, step: int) -> int:
    count = round(value * total)
    if abs(value * total - count) > 1e-3:
        raise ValueError(f"{run}: step {step} logged {key} = {value}, not a count out of {total}")
    return count


def nonzero_incorrect_steps(run: Path, metrics: dict[int, dict], done: dict) -> dict[int, tuple[float, float]]:
    """``{step: (lo, hi)}`` of :func:`nonzero_incorrect_bounds` for each step of a unit that logged
    ``critic/score/mean`` and ``capo/mixed_group_frac`` and had an incorrect response; the batch's shape is read
    from the unit's ``done.json`` settings (``done``, as read). Raises ValueError as
    :func:`nonzero_incorrect_bounds` does, or where a logged share is not a count of that batch."""
    composed = done["settings"]["composed"]
    n, groups = composed["actor_rollout_ref"]["rollout"]["n"], composed["data"]["train_batch_size"]
    out = {}
    for step, d in sorted(metrics.items()):
        if d.get("critic/score/mean") is None or d.get("capo/mixed_group_frac") is None:
            continue
        bounds = nonzero_incorrect_bounds(
            _count(d["critic/score/mean"], n * groups, "critic/score/mean", run, step),
            _count(d["capo/mixed_group_frac"], groups, "capo/mixed_group_frac", run, step),
            n,
            groups,
            d.get("capo/mask_frac_incorrect"),
        )
        if bounds is not None:
            out[step] = bounds
    return out


def _ends(metrics: dict[int, dict], key: str, ends: int, run: Path) -> tuple[float, float]:
    _, ys = series(metrics, key)
    if not ys:
        raise ValueError(
            f"{run}: metrics.jsonl logged no {key}; these facts need units trained by capo-verl compare with "
            "verl 0.9.1, which logs it every step"
        )
    return float(np.mean(ys[:ends])), float(np.mean(ys[-ends:]))


def finished_seeds(out: Path, methods: list[str]) -> list[int]:
    """The seeds ``k`` of ``out/seed<k>/`` in which every method has its ``done.json``, ascending."""
    seeds = [int(m.group(1)) for p in out.glob("seed*") if (m := re.fullmatch(r"seed(\d+)", p.name))]
    return sorted(k for k in seeds if all((out / f"seed{k}" / m / "done.json").exists() for m in methods))


def unit_facts(out: Path, methods: list[str], *, early: int = 2, late: int = 10, ends: int = 5) -> list[dict]:
    """One dict per unit (seed-major, then ``methods``' order): ``seed``, ``method``, ``trainer_min``,
    ``mixed_first``, ``mixed_last``, ``reward`` and ``tokens`` (each ``(first, last)``: the means of
    ``critic/score/mean`` and of ``response_length/mean`` over the first and the last ``ends`` logged steps),
    ``clipped``, ``steps``, and for each mask key logged by the unit
    ``"<key> early"`` / ``"<key> late"`` as ``(min, max)`` over steps 1 to ``early`` and over the last ``late`` steps
    (by step number; absent where no such step logged the key), and ``"nonzero adv. incorrect all"`` / ``"... late"``
    as the means of the lower and of the upper bounds of :func:`nonzero_incorrect_steps` over all steps and the last
    ``late`` steps (absent for a unit that logged no ``capo/mixed_group_frac``).

    Raises:
        FileNotFoundError: no seed folder in which every method has finished, or a seed without its
            ``summary.json``.
        ValueError: a unit logged no ``actor/grad_norm``, no ``critic/score/mean`` or no ``response_length/mean``,
            or counts no batch can have (:func:`nonzero_incorrect_bounds`).
    """
    seeds = finished_seeds(out, methods)
    if not seeds:
        raise FileNotFoundError(
            f"{out}: no seed<k>/ folder in which {', '.join(methods)} all have a done.json; train the units "
            "(capo-verl compare --seeds) or pass --methods the units that ran"
        )
    counts = grad_clip_counts(out, methods, seeds)
    if counts is None:
        raise ValueError(
            f"{out}: a unit of {', '.join(methods)} logged no actor/grad_norm in its metrics.jsonl; these facts need "
            "units trained by capo-verl compare with verl 0.9.1, which logs it every step"
        )
    rows = []
    for i, k in enumerate(seeds):
        summary_path = out / f"seed{k}" / "summary.json"
        if not summary_path.exists():
            raise FileNotFoundError(
                f"{summary_path} is missing; write it with capo-verl compare --plot-only --seeds {k} "
                f"--methods {' '.join(methods)} --out {out}"
            )
        summary = json.loads(summary_path.read_text())
        for m in methods:
            run = out / f"seed{k}" / m
            metrics = read_metrics(run / "metrics.jsonl")
            done = json.loads((run / "done.json").read_text())
            steps, _ = series(metrics, "actor/grad_norm")
            clipped, logged = (int(c) for c in counts[m][i])
            passes = summary["methods"][m]["passes"]
            row = {
                "seed": k,
                "method": m,
                "trainer_min": done["wall_s"] / 60.0,
                "mixed_first": passes[0]["n_mixed"],
                "mixed_last": passes[-1]["n_mixed"],
                **{name: _ends(metrics, key, ends, run) for name, key in ENDS.items()},
                "clipped": clipped,
                "steps": logged,
            }
            for key in MASK_KEYS:
                xs, ys = (np.asarray(v) for v in series(metrics, key))
                for when, sel in (("early", xs <= early), ("late", xs > max(steps) - late)):
                    if sel.any():
                        row[f"{key} {when}"] = (float(ys[sel].min()), float(ys[sel].max()))
            bounds = nonzero_incorrect_steps(run, metrics, done)
            for when, chosen in (("all", list(bounds)), ("late", [s for s in bounds if s > max(steps) - late])):
                if chosen:
                    row[f"{NONZERO} {when}"] = tuple(float(np.mean([bounds[s][j] for s in chosen])) for j in (0, 1))
            rows.append(row)
    return rows


def _range(pairs, fmt: str = ".2f") -> str:
    """``min(lo)-max(hi)`` of ``(lo, hi)`` pairs."""
    return f"{min(p[0] for p in pairs):{fmt}}-{max(p[1] for p in pairs):{fmt}}"


def _span(values, fmt: str) -> str:
    """``min-max`` of the values."""
    return _range([(v, v) for v in values], fmt)


def markdown(rows: list[dict], *, early: int = 2, late: int = 10, ends: int = 5) -> str:
    """The rows as a table, then one row per method with each column's range over its units."""
    mask_cols = [
        (key, when) for key in MASK_KEYS for when in ("early", "late") if any(f"{key} {when}" in r for r in rows)
    ]
    mask_cols += [(NONZERO, when) for when in ("all", "late") if any(f"{NONZERO} {when}" in r for r in rows)]
    steps_word = {"early": f"steps 1-{early}", "late": f"last {late} steps", "all": "all steps"}
    head = [
        "seed",
        "method",
        "trainer min",
        "mixed first / last",
        f"training reward, first {ends} / last {ends} steps",
        f"response tokens, first {ends} / last {ends} steps",
        "clipped",
    ] + [
        (f"{key} (mean bounds)" if key == NONZERO else f"`{key.split('/')[1]}`") + f", {steps_word[when]}"
        for key, when in mask_cols
    ]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        cells = [
            str(r["seed"]),
            r["method"],
            f"{r['trainer_min']:.1f}",
            f"{r['mixed_first']} / {r['mixed_last']}",
            f"{r['reward'][0]:.2f} / {r['reward'][1]:.2f}",
            f"{r['tokens'][0]:.1f} / {r['tokens'][1]:.1f}",
            f"{r['clipped']} of {r['steps']}",
        ]
        cells += [_range([r[f"{k} {w}"]]) if f"{k} {w}" in r else "" for k, w in mask_cols]
        lines.append("| " + " | ".join(cells) + " |")
    for m in dict.fromkeys(r["method"] for r in rows):
        mine = [r for r in rows if r["method"] == m]
        cells = [
            "all",
            m,
            _span([r["trainer_min"] for r in mine], ".1f"),
            " / ".join(_span([r[f"mixed_{w}"] for r in mine], "d") for w in ("first", "last")),
            " / ".join(_span([r["reward"][j] for r in mine], ".2f") for j in (0, 1)),
            " / ".join(_span([r["tokens"][j] for r in mine], ".1f") for j in (0, 1)),
            _span([r["clipped"] for r in mine], "d"),
        ]
        cells += [
            _range([r[f"{k} {w}"] for r in mine]) if all(f"{k} {w}" in r for r in mine) else "" for k, w in mask_cols
        ]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out", type=Path, help="a capo-verl compare --seeds folder, or its committed units/")
    ap.add_argument("--methods", nargs="+", required=True)
    ap.add_argument("--early", type=int, default=2, help="the first steps of the early mask range (default 2)")
    ap.add_argument("--late", type=int, default=10, help="the last steps of the late columns (default 10)")
    ap.add_argument(
        "--ends", type=int, default=5, help="the first and last steps of the reward and length means (default 5)"
    )
    args = ap.parse_args(argv)
    print(
        markdown(
            unit_facts(args.out, args.methods, early=args.early, late=args.late, ends=args.ends),
            early=args.early,
            late=args.late,
            ends=args.ends,
        ),
        end="",
    )


if __name__ == "__main__":
    main()
