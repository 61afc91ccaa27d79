"""What each unit of a study did, beside its seeds summary: the per-unit facts a result page quotes.

For every seed folder of a ``capo-verl compare --seeds`` output (or its committed copy) in which each method has
finished (``seed<k>/<method>/done.json``), one row per unit:

- ``trainer min``: the unit's minutes in verl's trainer (``done.json`` ``wall_s``: its steps and the validation
  passes made inside it);
- ``mixed first / last``: the validation questions with both a correct and an incorrect sample at the first and the
  last pass (``seed<k>/summary.json``), the questions a pass's AUC-mean averages over;
- ``clipped``: the steps whose ``actor/grad_norm`` exceeded the unit's ``actor_rollout_ref.actor.optim.clip_grad``
  (``capo_verl.compare.seeds.grad_clip_counts``), of the steps logged;
- for a CAPO unit, ``capo/mask_frac_incorrect`` and ``capo/mask_frac_correct`` (the shares of each outcome's
  responses the reference-perplexity mask dropped, ``capo_verl.metrics.capo_step_metrics``) over steps 1 to
  ``--early`` and over the last ``--late`` steps, as min-max ranges; a step without a response of that outcome logs
  no fraction.

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

MASK_KEYS = ("capo/mask_frac_incorrect", "capo/mask_frac_correct")


def finished_seeds(out: Path, methods: list[str]) -> list[int]:
    """The seeds ``k`` of ``out/seed<k>/`` in which every method has its ``done.json``, ascending."""
    seeds = [int(m.group(1)) for p in out.glob("seed*") if (m := re.fullmatch(r"seed(\d+)", p.name))]
    return sorted(k for k in seeds if all((out / f"seed{k}" / m / "done.json").exists() for m in methods))


def unit_facts(out: Path, methods: list[str], *, early: int = 2, late: int = 10) -> list[dict]:
    """One dict per unit (seed-major, then ``methods``' order): ``seed``, ``method``, ``trainer_min``,
    ``mixed_first``, ``mixed_last``, ``clipped``, ``steps``, and for each mask key logged by the unit
    ``"<key> early"`` / ``"<key> late"`` as ``(min, max)`` over steps 1 to ``early`` and over the last ``late`` steps
    (by step number; absent where no such step logged the key).

    Raises:
        FileNotFoundError: no seed folder in which every method has finished, or a seed without its
            ``summary.json``.
        ValueError: a unit logged no ``actor/grad_norm``.
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
            steps, _ = series(metrics, "actor/grad_norm")
            clipped, logged = (int(c) for c in counts[m][i])
            passes = summary["methods"][m]["passes"]
            row = {
                "seed": k,
                "method": m,
                "trainer_min": json.loads((run / "done.json").read_text())["wall_s"] / 60.0,
                "mixed_first": passes[0]["n_mixed"],
                "mixed_last": passes[-1]["n_mixed"],
                "clipped": clipped,
                "steps": logged,
            }
            for key in MASK_KEYS:
                xs, ys = (np.asarray(v) for v in series(metrics, key))
                for when, sel in (("early", xs <= early), ("late", xs > max(steps) - late)):
                    if sel.any():
                        row[f"{key} {when}"] = (float(ys[sel].min()), float(ys[sel].max()))
            rows.append(row)
    return rows


def _range(pairs) -> str:
    return f"{min(p[0] for p in pairs):.2f}-{max(p[1] for p in pairs):.2f}"


def markdown(rows: list[dict], *, early: int = 2, late: int = 10) -> str:
    """The rows as a table, then one row per method with each column's range over its units."""
    mask_cols = [
        (key, when) for key in MASK_KEYS for when in ("early", "late") if any(f"{key} {when}" in r for r in rows)
    ]
    steps_word = {"early": f"steps 1-{early}", "late": f"last {late} steps"}
    head = ["seed", "method", "trainer min", "mixed first / last", "clipped"] + [
        f"`{key.split('/')[1]}`, {steps_word[when]}" for key, when in mask_cols
    ]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        cells = [
            str(r["seed"]),
            r["method"],
            f"{r['trainer_min']:.1f}",
            f"{r['mixed_first']} / {r['mixed_last']}",
            f"{r['clipped']} of {r['steps']}",
        ]
        cells += [_range([r[f"{k} {w}"]]) if f"{k} {w}" in r else "" for k, w in mask_cols]
        lines.append("| " + " | ".join(cells) + " |")
    for m in dict.fromkeys(r["method"] for r in rows):
        mine = [r for r in rows if r["method"] == m]
        cells = [
            "all",
            m,
            f"{min(r['trainer_min'] for r in mine):.1f}-{max(r['trainer_min'] for r in mine):.1f}",
            f"{min(r['mixed_first'] for r in mine)}-{max(r['mixed_first'] for r in mine)} / "
            f"{min(r['mixed_last'] for r in mine)}-{max(r['mixed_last'] for r in mine)}",
            f"{min(r['clipped'] for r in mine)}-{max(r['clipped'] for r in mine)}",
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
    ap.add_argument("--late", type=int, default=10, help="the last steps of the late mask range (default 10)")
    args = ap.parse_args(argv)
    print(
        markdown(
            unit_facts(args.out, args.methods, early=args.early, late=args.late), early=args.early, late=args.late
        ),
        end="",
    )


if __name__ == "__main__":
    main()
