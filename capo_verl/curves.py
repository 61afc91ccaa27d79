"""Line plots of metrics against the training step, shared by ``capo-verl compare``'s figures
(:mod:`capo_verl.compare.report`) and the curves a training run writes beside its checkpoints
(:mod:`capo_verl.compat.run_summary`). Imports matplotlib (Agg backend) only when drawing.
"""

from __future__ import annotations

import io
from collections.abc import Sequence

import numpy as np

__all__ = ["draw_series", "finish_axes", "panels_png", "png_bytes"]


def draw_series(ax, xs: Sequence, ys: Sequence, label: str, lo=None, hi=None, smooth: int = 0) -> None:
    """Draw one series on ``ax``: markers and an optional band ``lo``-``hi``; with ``smooth`` >= 2 and at least that
    many points, the raw values faint and their trailing ``smooth``-step mean bold."""
    if smooth and len(ys) >= smooth:
        line = ax.plot(xs, ys, lw=0.8, alpha=0.35)[0]
        avg = np.convolve(ys, np.ones(smooth) / smooth, mode="valid")
        ax.plot(xs[smooth - 1 :], avg, color=line.get_color(), lw=2, label=f"{label} ({smooth}-step mean)")
        return
    line = ax.plot(xs, ys, marker="o", ms=3, label=label)[0]
    if lo is not None:
        ax.fill_between(xs, lo, hi, color=line.get_color(), alpha=0.15)


def finish_axes(ax, title: str, ylabel: str, drawn: bool, xlabel: str = "training step") -> None:
    """Label ``ax``; a legend when a series was ``drawn``, else a note that the metric was not logged."""
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    if drawn:
        ax.legend(fontsize=7)
    else:
        ax.text(0.5, 0.5, "not logged", ha="center", va="center", transform=ax.transAxes, alpha=0.6)
    ax.grid(alpha=0.3)


def png_bytes(fig, dpi: int = 120) -> bytes:
    """``fig`` as PNG bytes (then closed)."""
    import matplotlib.pyplot as plt

    png = io.BytesIO()
    fig.tight_layout()
    fig.savefig(png, dpi=dpi, format="png")
    plt.close(fig)
    return png.getvalue()


def panels_png(panels: Sequence[tuple[str, str, dict[str, tuple[list, list]]]], ncols: int = 3) -> bytes:
    """One PNG with a panel per ``(title, ylabel, {label: (steps, values)})``.

    Raises:
        ValueError: no panels.
    """
    if not panels:
        raise ValueError("panels_png: no panels to draw")
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    nrows = -(-len(panels) // ncols)
    fig, axes = plt.subplots(nrows, ncols, figsize=(4.2 * ncols, 3.0 * nrows), squeeze=False)
    for ax, (title, ylabel, lines) in zip(axes.flat, panels, strict=False):
        drawn = False
        for label, (xs, ys) in lines.items():
            if xs:
                draw_series(ax, xs, ys, label)
                drawn = True
        finish_axes(ax, title, ylabel, drawn)
    for ax in list(axes.flat)[len(panels) :]:
        ax.set_visible(False)
    return png_bytes(fig)
