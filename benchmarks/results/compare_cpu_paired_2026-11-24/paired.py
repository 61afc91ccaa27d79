"""Paired bootstrap figures of docs/compare.md that `capo-verl compare` does not print, recomputed from the committed
outputs in benchmarks/results/compare_cpu/ (validation dumps and held-out generations):

1. each method's validation change from step 0 to step 20, against its own step-0 pass and against the mean of the
   four step-0 passes (the same starting weights), AUC-mean and accuracy mean@8;
2. on the held-out set, each method minus CAPO: ITS accuracy (perplexity consistency), precision-coverage area,
   AUC-mean and mean@4.

Percentile bootstrap over questions (each resample draws the 64 questions with replacement and evaluates every
compared quantity on the same draw), 10,000 resamples, numpy default_rng(0), 95% intervals.

    .venv/bin/python benchmarks/results/compare_cpu_paired_2026-11-24/paired.py > \
        benchmarks/results/compare_cpu_paired_2026-11-24/paired.txt
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from capo_verl.compare.report import dump_lines, read_validation_pass
from capo_verl.evaluation import metrics as M

RUNS = Path(__file__).resolve().parents[1] / "compare_cpu"
METHODS = ("grpo", "capo", "grpo_mask", "gspo")
N_BOOT = int(__import__("os").environ.get("PAIRED_N_BOOT", "10000"))


def ci(stats) -> str:
    stats = np.asarray(stats, dtype=np.float64)
    stats = stats[np.isfinite(stats)]
    lo, hi = np.quantile(stats, [0.025, 0.975])
    return f"[{lo:+.3f}, {hi:+.3f}]"


def nanmean(x):
    x = x[np.isfinite(x)]
    return float(x.mean()) if x.size else float("nan")


def validation() -> None:
    per = {}
    for m in METHODS:
        passes = {}
        for step in (0, 20):
            vp = read_validation_pass(RUNS / m / "val_generations" / f"{step}.jsonl")
            acc, auc = vp.per_question()
            passes[step] = (vp.questions, acc, auc)
        per[m] = passes
    questions = per[METHODS[0]][0][0]
    for m in METHODS:
        for step in (0, 20):
            assert per[m][step][0] == questions, (m, step)
    acc0 = np.stack([per[m][0][1] for m in METHODS])  # (4, Q)
    auc0 = np.stack([per[m][0][2] for m in METHODS])
    q = len(questions)
    rng = np.random.default_rng(0)
    draws = [rng.integers(0, q, q) for _ in range(N_BOOT)]
    full = np.arange(q)

    def base_auc(idx):
        return float(np.mean([nanmean(auc0[j, idx]) for j in range(len(METHODS))]))

    def base_acc(idx):
        return float(acc0[:, idx].mean())

    print(f"mean of the four step-0 passes: AUC-mean {base_auc(full):.3f}, accuracy {100 * base_acc(full):.1f}%")
    print(
        "method | AUC-mean vs own step 0 | AUC-mean vs mean of four step 0 | accuracy vs own (points) | "
        "accuracy vs four"
    )
    for j, m in enumerate(METHODS):
        acc20, auc20 = per[m][20][1], per[m][20][2]
        own_acc, own_auc = acc0[j], auc0[j]

        def d_auc_own(i, auc20=auc20, own_auc=own_auc):
            return nanmean(auc20[i]) - nanmean(own_auc[i])

        def d_auc_four(i, auc20=auc20):
            return nanmean(auc20[i]) - base_auc(i)

        def d_acc_own(i, acc20=acc20, own_acc=own_acc):
            return 100 * (acc20[i].mean() - own_acc[i].mean())

        def d_acc_four(i, acc20=acc20):
            return 100 * (acc20[i].mean() - base_acc(i))

        cells = []
        for fn, fmt in (
            (d_auc_own, "{:+.3f}"),
            (d_auc_four, "{:+.3f}"),
            (d_acc_own, "{:+.1f}"),
            (d_acc_four, "{:+.1f}"),
        ):
            stats = [fn(i) for i in draws]
            lo, hi = np.quantile(np.asarray(stats)[np.isfinite(stats)], [0.025, 0.975])
            cells.append(f"{fmt.format(fn(full))} [{fmt.format(lo)}, {fmt.format(hi)}]")
        print(f"{m} | " + " | ".join(cells))


def held_out() -> None:
    runs = {}
    for m in METHODS:
        rows = [json.loads(line) for line in dump_lines(RUNS / m / "eval_generations.jsonl") if line.strip()]
        qids = sorted({(r["data_source"], str(r["question_id"])) for r in rows})
        by_q = {key: [] for key in qids}
        for r in rows:
            by_q[(r["data_source"], str(r["question_id"]))].append(r)
        runs[m] = (qids, by_q)
    qids = runs["capo"][0]
    for m in METHODS:
        assert runs[m][0] == qids, m
    q = len(qids)

    def arrays(m, idx):
        by_q = runs[m][1]
        group, answer, correct, lpm = [], [], [], []
        for pos, i in enumerate(idx):
            for r in by_q[qids[i]]:
                group.append(pos)
                answer.append(r["answer"] or "")
                correct.append(bool(r["correct"]))
                lpm.append(float(r["lpm"]))
        return np.array(group), np.array(answer, dtype=object), np.array(correct), np.array(lpm)

    def stats(m, idx):
        g, a, c, lp = arrays(m, idx)
        return (
            100 * M.its_accuracy(g, a, lp, c, "ppl_consistency"),
            M.precision_coverage_area(lp, c),
            M.auc_mean(lp, c, g)[0],
            100 * M.mean_at_k(c, g)[0],
        )

    rng = np.random.default_rng(0)
    draws = [rng.integers(0, q, q) for _ in range(N_BOOT)]
    full = np.arange(q)
    point = {m: stats(m, full) for m in METHODS}
    boot = {m: np.array([stats(m, i) for i in draws]) for m in METHODS}
    print("held out: method | ITS ppl consistency, area, AUC-mean, mean@4")
    for m in METHODS:
        print(f"{m} | " + " | ".join(f"{v:.3f}" for v in point[m]))
    print("difference | ITS: perplexity consistency (points) | precision-coverage area | AUC-mean | mean@4 (points)")
    for m in ("grpo", "grpo_mask", "gspo"):
        cells = []
        for k, fmt in enumerate(("{:+.1f}", "{:+.3f}", "{:+.3f}", "{:+.1f}")):
            d = boot[m][:, k] - boot["capo"][:, k]
            d = d[np.isfinite(d)]
            lo, hi = np.quantile(d, [0.025, 0.975])
            cells.append(f"{fmt.format(point[m][k] - point['capo'][k])} [{fmt.format(lo)}, {fmt.format(hi)}]")
        print(f"{m} - capo | " + " | ".join(cells))


if __name__ == "__main__":
    print(f"{N_BOOT} resamples, numpy default_rng(0), 95% percentile intervals over questions")
    validation()
    held_out()
