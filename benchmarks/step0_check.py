"""Two step-0 validation passes of the same base weights, compared: a seed's pass made apart
(``capo-verl compare --share-step0``, ``<seed>/step0``) against one a training run made before its first step.

    python benchmarks/step0_check.py benchmarks/results/compare_main_cpu/units/seed3/step0 \\
        benchmarks/results/compare_main_cpu/units/failed/seed3_grpo_attempt1

Each argument is a run folder holding ``val_generations/0.jsonl`` (or ``.jsonl.xz`` / ``.gz``). Prints the share of
identical responses (:func:`capo_verl.compare.seeds.pass_agreement`, both ways), the largest difference of a
response's mean token log-prob (lpm, nats) between the two passes, matched by question, response text and reward, and
each pass's accuracy (mean@k) and AUC-mean (:func:`capo_verl.compare.statistics.pass_summary`). The main run's plan
shares the step-0 pass only if the responses are identical
(``benchmarks/results/compare_main_cpu/README.md``, item 2).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np

from capo_verl.compare.report import dump_lines, read_validation_pass, validation_dump
from capo_verl.compare.seeds import pass_agreement
from capo_verl.compare.statistics import pass_summary


def _matched(path: Path) -> dict[tuple, list[float]]:
    """``{(question, response, reward): sorted lpm of the responses with that text}`` of a dump."""
    out: dict[tuple, list[float]] = {}
    for line in dump_lines(path):
        if line.strip():
            row = json.loads(line)
            out.setdefault((row["input"], row["output"], row["score"]), []).append(float(row["lpm"]))
    return {k: sorted(v) for k, v in out.items()}


def compare(a: Path, b: Path) -> dict:
    """The comparison of the step-0 passes of run folders ``a`` and ``b`` (see the module doc).

    Returns:
        ``{"identical_a_in_b", "identical_b_in_a": fractions in [0, 1], "lpm_max_abs_diff": nats over the responses
        both passes made (None if none), "a"/"b": {"n_samples", "accuracy", "auc_mean", "n_mixed"}}``.

    Raises:
        FileNotFoundError: a folder has no step-0 dump.
        ValueError: the passes validated other questions.
    """
    dumps = [validation_dump(Path(run) / "val_generations", 0) for run in (a, b)]
    for dump in dumps:
        if not dump.exists():
            raise FileNotFoundError(
                f"{dump}: no step-0 validation pass (val_generations/0.jsonl[.xz|.gz]). A seed's pass is made by "
                "`capo-verl compare --share-step0 --step0-only` (for the main run: SEED=k METHOD=step0 bash "
                "benchmarks/results/compare_main_cpu/run_main.sh); a training run makes one with "
                "trainer.val_before_train=true"
            )
    ma, mb = (_matched(d) for d in dumps)
    diffs = [
        abs(x - y) for key in ma.keys() & mb.keys() if len(ma[key]) == len(mb[key]) for x, y in zip(ma[key], mb[key])
    ]
    result = {
        "identical_a_in_b": pass_agreement(*dumps),
        "identical_b_in_a": pass_agreement(*dumps[::-1]),
        "lpm_max_abs_diff": float(np.max(diffs)) if diffs else None,
    }
    for name, dump in zip("ab", dumps):
        s = pass_summary(read_validation_pass(dump), n_boot=1)
        result[name] = {k: s[k] for k in ("n_samples", "accuracy", "auc_mean", "n_mixed")}
    return result


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("a", type=Path, help="a run folder with val_generations/0.jsonl[.xz|.gz] (e.g. <seed>/step0)")
    p.add_argument("b", type=Path, help="another, with a pass of the same weights")
    args = p.parse_args(argv)
    try:
        print(json.dumps(compare(args.a, args.b), indent=1))
    except (FileNotFoundError, ValueError) as exc:
        p.exit(2, f"step0_check: error: {exc}\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
