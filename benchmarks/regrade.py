"""Re-grade every committed CPU result with the current reward (``capo_verl.reward.compute_score``).

The CPU studies up to 2026-11-26 were graded by a reward that evaluated the extracted answer, so an answer that
copies the question's expression (``12 + 5`` for 17) scored 1.0. The current reward requires a plain-number answer
for a plain-number gold (docs/reproducing.md, "Reward"). This script reads the committed response files, grades
each response again, and reports per file (a run's validation pass, its held-out generations, a response pool):

- ``n``: responses; ``acc_old``: accuracy as committed; ``acc_new``: accuracy under the current reward;
- ``echo_share``: among the responses that were correct as committed, the share the current reward scores 0
  (an expression, or anything but a plain number, in place of a plain-number gold); NaN where none was correct;
- ``new_only``: responses the current reward pays and the old one did not (expected 0);
- ``old_only``: responses the old one paid and the current reward does not.

    .venv/bin/python benchmarks/regrade.py                      # writes benchmarks/results/regrade/
    .venv/bin/python benchmarks/regrade.py --out /tmp/regrade   # elsewhere

``--study DIR`` (repeatable; a folder under benchmarks/results) re-grades other studies, ``--val-step N`` keeps only
the validation dumps of step N and ``--name NAME`` writes ``NAME.json`` and ``NAME.md`` (the changed grades per file)
in place of ``regrade.json`` and ``README.md``; e.g. the main run's step-30 passes and held-out generations under the
value rule (capo_verl/reward.py, module docstring, point 3)::

    .venv/bin/python benchmarks/regrade.py --study compare_main_cpu/units --val-step 30 --name main_step30_value_rule

File formats read: verl validation dumps (``val_generations/<step>.jsonl``: ``output``, ``gts``, ``score``) and
``capo-verl eval generate`` / teacher-forced pool files (``response``, ``ground_truth``, ``correct``).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from capo_verl.reward import compute_score
from capo_verl.stored import COMPRESSED, plain_name, read_text, stored

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "benchmarks" / "results"
#: the studies whose responses are re-graded, with a label for the report
STUDIES = {
    "compare_cpu": "exploratory comparison (one seed, 2026-11-24)",
    "compare_decisive_cpu/pilot": "decisive comparison, pilot 1 (three seeds)",
    "cpu_vllm_2026-11-24": "eval generate before/after (base model)",
}


def _rows(path: Path) -> list[tuple[str, str, bool, str]]:
    """``(response, gold, correct_as_committed, data_source)`` for each line of a response file."""
    out = []
    for line in read_text(path).split("\n"):
        if not line.strip():
            continue
        r = json.loads(line)
        if "output" in r:  # verl validation dump
            out.append((r["output"], str(r["gts"]), float(r["score"]) > 0.5, r.get("data_source", "val")))
        else:
            out.append((r["response"], str(r["ground_truth"]), bool(r["correct"]), r.get("data_source", "eval")))
    return out


def regrade_file(path: Path, pool: ThreadPoolExecutor) -> dict:
    """Grade one response file again; the counts of the module docstring."""
    rows = _rows(path)
    graded = list(pool.map(lambda r: compute_score(r[3], r[0], r[1]), rows))
    new = [g["score"] > 0.5 for g in graded]
    old = [r[2] for r in rows]
    n_old = sum(old)
    echoes = sum(o and not w for o, w in zip(old, new, strict=True))
    return {
        "file": str(plain_name(path).relative_to(RESULTS)),
        "n": len(rows),
        "acc_old": n_old / len(rows) if rows else math.nan,
        "acc_new": sum(new) / len(rows) if rows else math.nan,
        "echo_share": echoes / n_old if n_old else math.nan,
        "new_only": sum(w and not o for o, w in zip(old, new, strict=True)),
        "old_only": echoes,
        "changed": [  # the first ten changed grades: gold, the answer graded now, paid now
            {"gold": r[1], "pred": g["pred"], "paid_now": w}
            for r, g, o, w in zip(rows, graded, old, new, strict=True)
            if o != w
        ][:10],
    }


def response_files(study: Path, val_step: int | None = None) -> list[Path]:
    """Every response file of a study, plain or compressed (``.jsonl.xz``, ``.jsonl.gz``), by the name of its plain
    form; with ``val_step``, of the validation dumps only those of that step (``val_generations/<val_step>.jsonl``)."""

    def found(pattern: str, where=study.rglob) -> list[Path]:
        plain = {plain_name(p) for s in ("", *COMPRESSED) for p in where(pattern + s)}
        return [stored(p) for p in plain]

    def order(p: Path) -> tuple[str, int]:
        return str(p.parent), int(p.name.split(".")[0])

    files = sorted(found("val_generations/*.jsonl"), key=order)
    if val_step is not None:
        files = [p for p in files if order(p)[1] == val_step]
    files += sorted(found("eval_generations.jsonl")) + sorted(found("pool.jsonl"))
    files += sorted(found("eval_generate_*.jsonl", study.glob))
    return files


def _fmt(x: float) -> str:
    return "n/a" if isinstance(x, float) and math.isnan(x) else f"{x:.3f}"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=RESULTS / "regrade", help="output folder")
    parser.add_argument("--study", action="append", help="a study folder under benchmarks/results (repeatable)")
    parser.add_argument("--val-step", type=int, help="only the validation dumps of this step")
    parser.add_argument("--name", help="write NAME.json and NAME.md (changed grades per file)")
    args = parser.parse_args(argv)
    studies = args.study or list(STUDIES)
    for study in studies:
        if not (RESULTS / study).is_dir():
            parser.error(f"--study {study}: no folder benchmarks/results/{study}")
    report: dict[str, list[dict]] = {}
    with ThreadPoolExecutor(max_workers=4) as pool:
        for study in studies:
            report[study] = [regrade_file(p, pool) for p in response_files(RESULTS / study, args.val_step)]
            for row in report[study]:
                print(
                    f"{row['file']}: n={row['n']} acc {_fmt(row['acc_old'])} -> {_fmt(row['acc_new'])}, "
                    f"echo share of correct {_fmt(row['echo_share'])}",
                    flush=True,
                )
    args.out.mkdir(parents=True, exist_ok=True)
    if args.name:
        _write_changes(args.out, args.name, report, argv if argv is not None else sys.argv[1:])
        return
    (args.out / "regrade.json").write_text(json.dumps(report, indent=1) + "\n")
    lines = [
        "# Committed CPU results, re-graded with the solving-only reward",
        "",
        "Made by `.venv/bin/python benchmarks/regrade.py` (the script's docstring says what each column is). The",
        "reward these runs trained and were scored with paid for an expression that evaluates to a plain-number gold",
        "(`12 + 5` for 17); the current reward does not ([reward](../../../docs/reproducing.md#reward)).",
        "`echo share` is the share of the committed correct answers that the current reward scores 0.",
        "",
    ]
    for study, rows in report.items():
        lines += [
            f"## {STUDIES[study]}: `{study}`",
            "",
            "| file | n | accuracy as committed | accuracy now | echo share |",
            "|---|---:|---:|---:|---:|",
        ]
        lines += [
            f"| `{r['file'][len(study) + 1 :]}` | {r['n']} | {_fmt(r['acc_old'])} | {_fmt(r['acc_new'])} | "
            f"{_fmt(r['echo_share'])} |"
            for r in rows
        ]
        lines.append("")
    (args.out / "README.md").write_text("\n".join(lines))
    print(f"wrote {args.out / 'regrade.json'} and {args.out / 'README.md'}")


def _write_changes(out: Path, name: str, report: dict[str, list[dict]], argv: list[str]) -> None:
    """``NAME.json`` (the rows of :func:`regrade_file`) and ``NAME.md`` (per file: responses, accuracy as committed and
    now, grades changed each way), with the command that made them."""
    command = " ".join([".venv/bin/python benchmarks/regrade.py", *argv])
    (out / f"{name}.json").write_text(json.dumps({"command": command, "files": report}, indent=1) + "\n")
    rows = [r for rs in report.values() for r in rs]
    lines = [
        f"# Committed responses re-graded with the current reward: `{name}`",
        "",
        f"Made by `{command}` (the script's docstring says what each column is). `paid now only`: responses the",
        "committed grade scored 0 and the current reward pays; `paid before only`: the reverse.",
        "",
        "| file | n | accuracy as committed | accuracy now | paid now only | paid before only |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    lines += [
        f"| `{r['file']}` | {r['n']} | {_fmt(r['acc_old'])} | {_fmt(r['acc_new'])} | {r['new_only']} | "
        f"{r['old_only']} |"
        for r in rows
    ]
    changed = sum(r["new_only"] + r["old_only"] for r in rows)
    lines += ["", f"{changed} of {sum(r['n'] for r in rows)} grades change.", ""]
    (out / f"{name}.md").write_text("\n".join(lines))
    print(f"wrote {out / (name + '.json')} and {out / (name + '.md')}")


if __name__ == "__main__":
    main()
