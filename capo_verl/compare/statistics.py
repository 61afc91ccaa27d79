"""Statistics of ``capo-verl compare``: per-question AUC-mean and accuracy of a validation pass, with percentile
bootstrap intervals over questions; the difference of two methods resamples the same questions for both (paired)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from capo_verl.metrics import auc_mean

#: AUC-mean over fewer mixed questions than this is reported as "too few to judge"
MIN_MIXED_QUESTIONS = 20


def bootstrap_ci(
    values_fn, n_questions: int, *, n_boot: int = 2000, seed: int = 0, level: float = 0.95
) -> tuple[float, float]:
    """Percentile bootstrap interval of a statistic of questions.

    Args:
        values_fn: ``f(idx) -> float``, the statistic on the questions ``idx`` (an int array of length
            ``n_questions``, drawn with replacement; repeated questions count repeatedly). NaN results (e.g. no
            mixed question in the draw) are dropped.
        n_questions: number of questions to resample.
        n_boot: number of resamples. seed: numpy seed. level: coverage (0.95: 2.5% and 97.5% quantiles).

    Returns:
        ``(low, high)``; ``(nan, nan)`` when every resample is NaN.

    Raises:
        ValueError: ``n_boot < 1``.
    """
    if n_boot < 1:
        raise ValueError(f"n_boot must be >= 1, got {n_boot}")
    rng = np.random.default_rng(seed)
    stats = np.array([values_fn(rng.integers(0, n_questions, n_questions)) for _ in range(n_boot)], dtype=np.float64)
    stats = stats[np.isfinite(stats)]
    if stats.size == 0:
        return float("nan"), float("nan")
    alpha = (1.0 - level) / 2.0
    return float(np.quantile(stats, alpha)), float(np.quantile(stats, 1.0 - alpha))


@dataclass
class ValidationPass:
    """One validation pass of one method, as question-level arrays.

    Attributes:
        questions: ``(Q,)`` question keys (prompt text), sorted.
        lpm: list of Q ``(k_q,)`` float64 arrays, mean token log-prob (nats) of each sample.
        correct: list of Q ``(k_q,)`` bool arrays.
    """

    step: int
    questions: list[str]
    lpm: list[np.ndarray]
    correct: list[np.ndarray]

    def per_question(self) -> tuple[np.ndarray, np.ndarray]:
        """``(acc (Q,), auc (Q,))``: per-question accuracy, and per-question ROC-AUC (NaN unless mixed)."""
        acc = np.array([c.mean() for c in self.correct])
        auc = np.full(len(self.questions), np.nan)
        for q, (lp, c) in enumerate(zip(self.lpm, self.correct)):
            if c.any() and not c.all():
                auc[q] = auc_mean(lp, c, np.zeros(len(c), dtype=np.int64))[0]
        return acc, auc


def pass_summary(vp: ValidationPass, *, n_boot: int = 2000, seed: int = 0) -> dict:
    """AUC-mean and accuracy (mean@k) of one validation pass with 95% bootstrap intervals over questions."""
    acc, auc = vp.per_question()
    mixed = np.isfinite(auc)
    n_mixed = int(mixed.sum())

    def auc_of(idx):
        a = auc[idx]
        a = a[np.isfinite(a)]
        return float(a.mean()) if a.size else float("nan")

    out = {
        "step": vp.step,
        "n_questions": len(vp.questions),
        "n_samples": int(sum(len(c) for c in vp.correct)),
        "n_mixed": n_mixed,
        "accuracy": float(acc.mean()),
        "accuracy_ci": bootstrap_ci(lambda i: acc[i].mean(), len(acc), n_boot=n_boot, seed=seed),
        "auc_mean": float(auc[mixed].mean()) if n_mixed else None,
        "auc_mean_ci": bootstrap_ci(auc_of, len(auc), n_boot=n_boot, seed=seed) if n_mixed else None,
        "auc_judgeable": n_mixed >= MIN_MIXED_QUESTIONS,
    }
    return out


def paired_difference(a: ValidationPass, b: ValidationPass, *, n_boot: int = 2000, seed: int = 0) -> dict:
    """``a - b`` of AUC-mean and accuracy over the questions both passes share, with a paired bootstrap interval.

    Each resample draws questions once and evaluates both methods on them (AUC-mean of each over its own mixed
    questions among the drawn ones).

    Raises:
        ValueError: the passes share no question.
    """
    common = sorted(set(a.questions) & set(b.questions))
    if not common:
        raise ValueError("the two validation passes share no question")
    ia = [a.questions.index(q) for q in common]
    ib = [b.questions.index(q) for q in common]
    acc_a, auc_a = (x[ia] for x in a.per_question())
    acc_b, auc_b = (x[ib] for x in b.per_question())

    def auc_diff(idx):
        x, y = auc_a[idx], auc_b[idx]
        x, y = x[np.isfinite(x)], y[np.isfinite(y)]
        return float(x.mean() - y.mean()) if x.size and y.size else float("nan")

    both = np.isfinite(auc_a).any() and np.isfinite(auc_b).any()
    full = np.arange(len(common))
    return {
        "n_questions": len(common),
        "accuracy_diff": float(acc_a.mean() - acc_b.mean()),
        "accuracy_diff_ci": bootstrap_ci(
            lambda i: acc_a[i].mean() - acc_b[i].mean(), len(common), n_boot=n_boot, seed=seed
        ),
        "auc_mean_diff": auc_diff(full) if both else None,
        "auc_mean_diff_ci": bootstrap_ci(auc_diff, len(common), n_boot=n_boot, seed=seed) if both else None,
    }
