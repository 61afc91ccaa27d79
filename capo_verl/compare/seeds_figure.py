"""``seeds_curves.png`` of ``capo-verl compare --seeds``: every seed's curve (thin) and their mean (bold) per
method: sampled validation AUC-mean and accuracy, teacher-forced AUC-mean, entropy (the values:
:mod:`capo_verl.compare.seeds`)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from capo_verl.compare.report import read_metrics, series, validation_passes
from capo_verl.compare.statistics import nanmean


def seeds_curves(out: Path, methods: list[str], seeds: list[int], tf: dict | None) -> Path:
    """``<out>/seeds_curves.png``: per method, every seed's curve (thin) and their mean over seeds (bold) of the
    sampled validation AUC-mean and accuracy, the teacher-forced AUC-mean (``tf``: the values of
    :func:`capo_verl.compare.seeds.teacher_forced_values`, None when not scored) and ``actor/entropy``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, 2, figsize=(10, 7))
    panels = {
        "sampled validation AUC-mean": axes[0, 0],
        "validation accuracy (mean@k)": axes[0, 1],
        "teacher-forced AUC-mean (fixed pool)": axes[1, 0],
        "actor/entropy (nats)": axes[1, 1],
    }
    for i, m in enumerate(methods):
        color = f"C{i}"
        curves: dict[str, list] = {name: [] for name in panels}
        for k in seeds:
            run = out / f"seed{k}" / m
            passes = validation_passes(run)
            per_q = [vp.per_question() for vp in passes]
            steps = [vp.step for vp in passes]
            curves["sampled validation AUC-mean"].append((steps, [nanmean(q[1]) for q in per_q]))
            curves["validation accuracy (mean@k)"].append((steps, [float(np.mean(q[0])) for q in per_q]))
            if tf is not None:
                ys = [nanmean(tf["values"][m][st][seeds.index(k)]) for st in tf["steps"]]
                curves["teacher-forced AUC-mean (fixed pool)"].append((tf["steps"], ys))
            curves["actor/entropy (nats)"].append(series(read_metrics(run / "metrics.jsonl"), "actor/entropy"))
        for name, ax in panels.items():
            runs = [(xs, ys) for xs, ys in curves[name] if xs]
            for xs, ys in runs:
                ax.plot(xs, ys, color=color, lw=0.7, alpha=0.35, marker=_marker(xs), ms=3)
            if runs and all(xs == runs[0][0] for xs, _ in runs):
                mean = np.mean([ys for _, ys in runs], axis=0)
                ax.plot(runs[0][0], mean, color=color, lw=2.2, label=m, marker=_marker(runs[0][0]), ms=5)
    for name, ax in panels.items():
        ax.set_title(name, fontsize=10)
        ax.set_xlabel("training step")
        ax.grid(alpha=0.3)
        if ax.lines:
            ax.legend(fontsize=8)
    fig.suptitle(f"{len(seeds)} training seed(s): each seed thin, the mean over seeds bold", fontsize=10)
    fig.tight_layout()
    path = out / "seeds_curves.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def _marker(xs) -> str | None:
    """A dot on every measured step where there are few (validation and teacher-forced scoring at a few steps), so
    that a straight line between two of them is not read as measured in between."""
    return "o" if len(xs) <= 10 else None
