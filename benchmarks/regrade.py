"""Re-grade every committed CPU result with the current reward (``capo_verl.reward.compute_score``).

The CPU studies up to 2026-11-26 were graded by a reward that evaluated the extracted answer, so an answer that
copies the question's expression (``12 + 5`` for 17) scored 1.0. The current reward requires a plain-number answer
for a plain-number gold (docs/reproducing.md, "Reward"). This script reads the committed response files, grades
each response again, and reports per file (a run's validation pass, its held-out generations, a response pool):

- ``n``: responses; ``acc_old``: accuracy as committed; ``acc_new``: accuracy under the current reward;
- ``echo_share``: among the responses that were correct as committed, the share the current reward scores 0
  (an expression, or anything but a plain number, in place of a plain-number gold); NaN where none was correct;
- ``new_only``: responses the current reward pays and the old one did not (expected 0).

    .venv/bin/python benchmarks/regrade.py                      # writes benchmarks/results/regrade/
    .venv/bin/python benchmarks/regrade.py --out /tmp/regrade   # elsewhere

File formats read: verl validation dumps (``val_generations/<step>.jsonl``: ``output``, ``gts``, ``score``) and
``capo-verl eval generate`` / teacher-forced pool files (``response``, ``ground_truth``, ``correct``).
"""

from __future__ import annotations

import argparse
import json
import math
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
    new = list(pool.map(lambda r: compute_score(r[3], r[0], r[1])["score"] > 0.5, rows))
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
    }


def response_files(study: Path) -> list[Path]:
    """Every response file of a study, plain or compressed (``.jsonl.xz``, ``.jsonl.gz``), by the name of its plain
    form."""

    def found(pattern: str, where=study.rglob) -> list[Path]:
        plain = {plain_name(p) for s in ("", *COMPRESSED) for p in where(pattern + s)}
        return [stored(p) for p in plain]

    def order(p: Path) -> tuple[str, int]:
        return str(p.parent), int(p.name.split(".")[0])

    files = sorted(found("val_generations/*.jsonl"), key=order)
    files += sorted(found("eval_generations.jsonl")) + sorted(found("pool.jsonl"))
    files += sorted(found("eval_generate_*.jsonl", study.glob))
    return files


def _fmt(x: float) -> str:
    return "n/a" if isinstance(x, float) and math.isnan(x) else f"{x:.3f}"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=RESULTS / "regrade", help="output folder")
    args = parser.parse_args(argv)
    report: dict[str, list[dict]] = {}
    with ThreadPoolExecutor(max_workers=4) as pool:
        for study in STUDIES:
            report[study] = [regrade_file(p, pool) for p in response_files(RESULTS / study)]
            for row in report[study]:
                print(
                    f"{row['file']}: n={row['n']} acc {_fmt(row['acc_old'])} -> {_fmt(row['acc_new'])}, "
                    f"echo share of correct {_fmt(row['echo_share'])}",
                    flush=True,
                )
    args.out.mkdir(parents=True, exist_ok=True)
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


if __name__ == "__main__":
    main()
