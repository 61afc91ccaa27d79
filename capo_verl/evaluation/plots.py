"""PNG plots of the evaluation (matplotlib, Agg backend: no display needed).

- :func:`plot_precision_coverage`: the paper's Figure 4, one panel per data source plus "all", one curve
  per run; responses pooled and ranked by lpm, x = coverage (fraction answered), y = precision.
- :func:`plot_accuracy_vs_auc`: the paper's Figure 1a, x = AUC-mean (calibration), y = mean@k accuracy;
  one colour per run, one marker per data source, a large star for the run's average over data sources
  (or its single data source).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from pathlib import Path

import numpy as np

from capo_verl.evaluation import metrics as M

_MARKERS = "osD^vP<>Xph*"


def _pyplot():
    import matplotlib

    matplotlib.use("Agg", force=False)
    import matplotlib.pyplot as plt

    return plt


def plot_precision_coverage(cols: Mapping[str, Mapping[str, np.ndarray]], path, levels=None) -> Path:
    """Precision-coverage curves, one panel per data source and one for all responses of each run.

    Args:
        cols: ``{label: columns}`` as returned by :func:`capo_verl.evaluation.score.read_generations`.
        path: PNG to write.
        levels: coverages marked on the curves (default 0.1 ... 1.0).

    Returns:
        ``Path(path)``.
    """
    plt = _pyplot()
    levels = np.asarray(levels if levels is not None else [round(0.1 * i, 1) for i in range(1, 11)])
    sources = sorted({s for c in cols.values() for s in c["data_source"].tolist()})
    panels = [*sources, "all"] if len(sources) > 1 else sources
    ncol = min(4, len(panels))
    nrow = math.ceil(len(panels) / ncol)
    fig, axes = plt.subplots(nrow, ncol, figsize=(4.2 * ncol, 3.6 * nrow), squeeze=False)
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for ax, panel in zip(axes.flat, panels):
        top = 0.0
        for i, (label, c) in enumerate(cols.items()):
            sel = np.ones(len(c["lpm"]), bool) if panel == "all" else c["data_source"] == panel
            if not sel.any():
                continue
            cov, prec = M.precision_coverage_curve(c["lpm"][sel], c["correct"][sel])
            at = M.precision_at_coverage(c["lpm"][sel], c["correct"][sel], levels)
            area = float(prec.mean())
            top = max(top, float(prec.max()))
            color = colors[i % len(colors)]
            ax.plot(
                np.r_[0.0, cov],
                np.r_[prec[0], prec],
                color=color,
                lw=1.6,
                drawstyle="steps-pre",
                label=f"{label}: n={int(sel.sum())}, area {100 * area:.1f}%",
            )
            ax.plot(levels, at, "o", color=color, ms=3.5)
        ax.set_title(panel, fontsize=10)
        ax.set_xlim(0, 1)
        ymax = min(1.02, 1.1 * top + 0.03)  # low-accuracy models stay readable
        ax.set_ylim(-0.03 * ymax, ymax)
        ax.set_xlabel("coverage (fraction answered)")
        ax.set_ylabel("precision (accuracy of answered)")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8, loc="upper right")
    for ax in list(axes.flat)[len(panels) :]:
        ax.set_visible(False)
    fig.suptitle("Precision-coverage: answer only the most confident responses (by lpm)", fontsize=11)
    fig.tight_layout()
    path = Path(path)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def plot_accuracy_vs_auc(results: Mapping[str, Mapping[str, dict]], path) -> Path:
    """Accuracy (mean@k) against calibration (AUC-mean), one point per run and data source.

    Args:
        results: ``{label: score_generations(...)}`` (the content of ``metrics.json``).
        path: PNG to write.

    Returns:
        ``Path(path)``. Data sources without a question with both outcomes have no AUC and are left out
        (noted in the legend).
    """
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(6.4, 4.8))
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    sources = sorted({s for r in results.values() for s in r if s not in ("all", "macro_avg")})
    marker = {s: _MARKERS[i % len(_MARKERS)] for i, s in enumerate(sources)}
    skipped = set()
    for s in sources:  # legend entries for the data sources (grey)
        ax.scatter([], [], marker=marker[s], color="0.5", label=s)
    for i, (label, r) in enumerate(results.items()):
        color = colors[i % len(colors)]
        for s in sources:
            m = r.get(s)
            if m is None:
                continue
            if math.isnan(m["auc_mean"]):
                skipped.add(s)
                continue
            ax.scatter(m["auc_mean"], 100 * m["mean_acc"], marker=marker[s], color=color, s=36, alpha=0.8)
        avg = r.get("macro_avg") or r.get(sources[0] if len(sources) == 1 else "all")
        if avg is not None and not math.isnan(avg["auc_mean"]):
            ax.scatter(
                avg["auc_mean"],
                100 * avg["mean_acc"],
                marker="*",
                color=color,
                s=260,
                edgecolor="k",
                zorder=3,
                label=f"{label}: average" if "macro_avg" in r else label,
            )
            ax.annotate(
                label, (avg["auc_mean"], 100 * avg["mean_acc"]), textcoords="offset points", xytext=(7, 6), fontsize=9
            )
    ax.axvline(0.5, color="0.6", ls="--", lw=1)
    ax.text(0.5, 1.0, " random ranking", transform=ax.get_xaxis_transform(), va="top", fontsize=8, color="0.4")
    ax.set_xlabel("AUC-mean (lpm vs correctness; higher = better calibrated)")
    ax.set_ylabel("mean@k accuracy (%)")
    ax.set_title("Accuracy vs calibration (star: average over data sources)", fontsize=10)
    ax.grid(alpha=0.3)
    handles, labels_ = ax.get_legend_handles_labels()
    if skipped:
        labels_ = [f"{l} (no AUC: no mixed question)" if l in skipped else l for l in labels_]
    ax.legend(handles, labels_, fontsize=8, loc="best")
    fig.tight_layout()
    path = Path(path)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path
