"""Statistics of ``capo-verl compare``: per-question AUC-mean and accuracy of a validation pass, with percentile
bootstrap intervals over questions; the difference of two methods resamples the same questions for both (paired).
Across training seeds, a paired difference with a two-level bootstrap (seeds, then questions within each seed) and a
Student-t interval over seeds (:func:`hierarchical_bootstrap_diff`, :func:`seed_t_interval`, :func:`t_quantile`),
the reading of an interval against a margin and the sizing rule (:func:`read_interval`,
:func:`seeds_for_half_width`)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from statistics import NormalDist

import numpy as np

from capo_verl.metrics import auc_mean

#: AUC-mean over fewer mixed questions than this is reported as "too few to judge"
MIN_MIXED_QUESTIONS = 20
#: per-question measures of a validation pass: name -> (label, index into ValidationPass.per_question())
MEASURES = {"auc_mean": ("validation AUC-mean", 1), "accuracy": ("validation accuracy (mean@k)", 0)}


def nanmean_rows(x) -> list[float]:
    """Per row of a 2-d float array, the mean of its defined (non-NaN) entries; NaN, without a warning, for a row
    with none."""
    with np.errstate(invalid="ignore"):
        return [float(np.nanmean(row)) if np.isfinite(row).any() else float("nan") for row in np.asarray(x)]


def nanmean(x) -> float:
    """Mean of the defined (non-NaN) entries of a 1-d array; NaN, without a warning, when there is none."""
    return nanmean_rows(np.asarray(x, dtype=np.float64)[None])[0]


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


# ---------------------------------------------------------------------------------------------------------
# Across training seeds: a paired difference of two methods from per-seed, per-question values, with a
# two-level (seeds, then questions) bootstrap interval and a Student-t interval over seeds.
# ---------------------------------------------------------------------------------------------------------


def _check_level(level: float) -> float:
    level = float(level)
    if not 0.0 < level < 1.0:
        raise ValueError(f"level must lie in (0, 1), got {level}")
    return level


def _t_two_sided(theta: float, df: int) -> float:
    """``P(|T| <= t)`` for Student's t with integer ``df`` at ``theta = arctan(t / sqrt(df))``, in [0, 1].

    Abramowitz & Stegun (1964), 26.7.3-26.7.4, exact finite series for integer df (every term >= 0, no
    cancellation): with ``s = sin(theta)``, ``c2 = cos(theta)^2``,

        df even: ``s * (1 + 1/2 c2 + (1*3)/(2*4) c2^2 + ... + (1*3*...*(df-3))/(2*4*...*(df-2)) c2^((df-2)/2))``
        df odd:  ``(2/pi) * (theta + s * cos(theta) * (1 + 2/3 c2 + (2*4)/(3*5) c2^2 + ...
                 + (2*4*...*(df-3))/(3*5*...*(df-2)) c2^((df-3)/2)))``, just ``(2/pi) * theta`` for df = 1.
    """
    s, c = math.sin(theta), math.cos(theta)
    if df % 2 == 0:
        j = np.arange(1, (df - 2) // 2 + 1, dtype=np.float64)
        return s * (1.0 + float(np.cumprod((2 * j - 1) / (2 * j) * c * c).sum()))
    if df == 1:
        return 2.0 / math.pi * theta
    j = np.arange(1, (df - 3) // 2 + 1, dtype=np.float64)
    return 2.0 / math.pi * (theta + s * c * (1.0 + float(np.cumprod(2 * j / (2 * j + 1) * c * c).sum())))


def t_quantile(p: float, df: int) -> float:
    """Quantile of Student's t distribution: the ``t`` with ``P(T <= t) = p`` for ``df`` degrees of freedom.

    numpy only (scipy is not a dependency of this package): the exact finite-series CDF for integer df
    (Abramowitz & Stegun 26.7.3-26.7.4, see :func:`_t_two_sided`) inverted by bisection on
    ``theta = arctan(t / sqrt(df))`` in ``[0, pi/2)`` down to adjacent floats; ``t = sqrt(df) * tan(theta)``.
    Agrees with ``scipy.stats.t.ppf`` to 1e-12 relative for p in [0.0005, 0.9995] (tests/test_compare.py); further
    out in the tails digits go to the rounding of ``2p - 1`` (1e-10 relative at p = 1 - 1e-6). O(df) per CDF
    evaluation, about 55 evaluations.

    Args:
        p: probability in (0, 1). df: integer >= 1.

    Returns:
        float; 0 at ``p = 0.5``, ``-t_quantile(1 - p, df)`` below it (e.g. ``t_quantile(0.975, 2) = 4.302653``).

    Raises:
        ValueError: ``p`` outside (0, 1) or ``df`` not an integer >= 1.
    """
    if isinstance(df, (bool, np.bool_)) or not isinstance(df, (int, np.integer)) or df < 1:
        raise ValueError(f"t_quantile: df must be an integer >= 1, got {df!r}")
    p, df = float(p), int(df)
    if not 0.0 < p < 1.0:
        raise ValueError(f"t_quantile: p must lie in (0, 1), got {p}")
    if p == 0.5:
        return 0.0
    target = abs(2.0 * p - 1.0)  # P(|T| <= t) for the upper tail's t
    lo, hi = 0.0, math.pi / 2.0
    while True:
        mid = 0.5 * (lo + hi)
        if mid <= lo or mid >= hi:
            break
        if _t_two_sided(mid, df) < target:
            lo = mid
        else:
            hi = mid
    t = math.sqrt(df) * math.tan(0.5 * (lo + hi))
    return t if p > 0.5 else -t


def _seed_question_pair(fn: str, a, b) -> tuple[np.ndarray, np.ndarray]:
    """``(S, Q)`` float64 arrays from per-seed (``(S,)``) or per-seed per-question (``(S, Q)``) values, checked."""
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    if a.shape != b.shape or a.ndim not in (1, 2):
        raise ValueError(
            f"{fn}: a and b must have the same shape, (n_seeds,) or (n_seeds, n_questions) (paired by seed and "
            f"question), got {a.shape} and {b.shape}"
        )
    if a.ndim == 1:
        a, b = a[:, None], b[:, None]
    if a.size == 0:
        raise ValueError(f"{fn}: no values (shape {a.shape}); need at least one seed and one question")
    if np.isinf(a).any() or np.isinf(b).any():
        raise ValueError(f"{fn}: a or b holds an infinite value")
    for name, x in (("a", a), ("b", b)):
        empty = np.flatnonzero(np.isnan(x).all(axis=1))
        if empty.size:
            raise ValueError(
                f"{fn}: {name} has no defined (non-NaN) value at seed index {int(empty[0])}; every seed needs "
                "one per method"
            )
    return a, b


def _per_seed_difference(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """``(..., S)``: per seed, a's mean over its defined questions minus b's (NaN where either has none)."""
    fa, fb = np.isfinite(a), np.isfinite(b)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(fa, a, 0.0).sum(-1) / fa.sum(-1) - np.where(fb, b, 0.0).sum(-1) / fb.sum(-1)


def seed_t_interval(a, b, *, level: float = 0.95) -> dict:
    """Mean over seeds of the per-seed difference ``a - b``, with a two-sided Student-t interval over seeds.

    Per seed ``s``, ``d_s = mean_q a[s, q] - mean_q b[s, q]`` (each mean over that method's non-NaN questions);
    the interval is ``mean(d) +- t_{(1+level)/2, S-1} * sd(d) / sqrt(S)`` with ``sd`` the sample standard
    deviation (``ddof=1``). It treats seeds as the independent units: the questions' sampling noise enters only
    through the spread between seeds.

    Args:
        a, b: ``(S,)`` one value per seed, or ``(S, Q)`` per seed and question, paired by seed index (and by
            question). NaN = undefined for that question (e.g. the AUC of a question with one outcome).
        level: coverage in (0, 1).

    Returns:
        ``{"n_seeds", "mean", "sd", "low", "high"}``; ``sd``, ``low``, ``high`` are NaN for a single seed.

    Raises:
        ValueError: shapes differ or are not 1-d/2-d, no value, an infinite value, a seed where a method has
            no defined value, ``level`` outside (0, 1).
    """
    level = _check_level(level)
    a, b = _seed_question_pair("seed_t_interval", a, b)
    d = _per_seed_difference(a, b)
    n = len(d)
    mean = float(d.mean())
    if n < 2:
        return {"n_seeds": n, "mean": mean, "sd": float("nan"), "low": float("nan"), "high": float("nan")}
    sd = float(d.std(ddof=1))
    half = t_quantile(0.5 + level / 2.0, n - 1) * sd / math.sqrt(n)
    return {"n_seeds": n, "mean": mean, "sd": sd, "low": mean - half, "high": mean + half}


def hierarchical_bootstrap_diff(
    a, b, *, n_boot: int = 2000, seed: int = 0, level: float = 0.95, max_cells: int = 2**20
) -> dict:
    """Two-level percentile bootstrap interval of the mean paired difference ``a - b`` over seeds and questions.

    Each replicate draws ``S`` seeds with replacement, then, inside each drawn seed independently, ``Q``
    questions with replacement; both methods are evaluated on the same draws (paired by seed and question).
    The statistic is the mean over the drawn seeds of ``d_s = mean a - mean b`` over that seed's drawn
    questions (each method's mean over its non-NaN draws), the same as :func:`seed_t_interval`'s ``mean`` on
    the original data. So the interval holds both the spread between training seeds and the finite-question
    noise within each. A replicate in which some drawn seed has no defined draw for a method is dropped, as in
    :func:`bootstrap_ci`.

    Randomness: ``numpy.random.default_rng(seed)``; first the ``(n_boot, S)`` seed indices in one
    ``integers(0, S)`` call, then the question indices ``floor(Q * u)`` from ``random()`` draws ``u``, replicate
    after replicate, so the result does not depend on ``max_cells``. With ``Q = 1`` this is exactly the
    percentile bootstrap over seeds of the per-seed differences, with those seed draws.

    Cost: O(n_boot * S * Q) time, vectorised over replicates in chunks of ``max(1, max_cells // (S * Q))``;
    memory about 40 bytes * ``max(max_cells, S * Q)`` (the uniform draws, the indices, the gathered values).

    Args:
        a, b: ``(S, Q)`` per seed and question (or ``(S,)``, one question per seed), paired. NaN = undefined.
        n_boot: number of replicates. seed: numpy seed. level: coverage in (0, 1) (0.95: 2.5% and 97.5%
            quantiles, numpy's default linear interpolation as :func:`bootstrap_ci`).
        max_cells: replicate cells (``chunk * S * Q``) held at once.

    Returns:
        ``{"n_seeds", "n_questions", "mean", "low", "high"}``; ``low``/``high`` NaN when every replicate is
        dropped.

    Raises:
        ValueError: as :func:`seed_t_interval`, or ``n_boot < 1`` or ``max_cells < 1``.
    """
    if n_boot < 1:
        raise ValueError(f"n_boot must be >= 1, got {n_boot}")
    if max_cells < 1:
        raise ValueError(f"max_cells must be >= 1, got {max_cells}")
    level = _check_level(level)
    a, b = _seed_question_pair("hierarchical_bootstrap_diff", a, b)
    n_seeds, n_q = a.shape
    mean = float(_per_seed_difference(a, b).mean())
    complete = not (np.isnan(a).any() or np.isnan(b).any())
    flat_d = (a - b).reshape(-1) if complete else None
    flat_a, flat_b = a.reshape(-1), b.reshape(-1)

    rng = np.random.default_rng(seed)
    seed_idx = rng.integers(0, n_seeds, (n_boot, n_seeds))
    chunk = max(1, max_cells // (n_seeds * n_q))
    stats = np.empty(n_boot, dtype=np.float64)
    for start in range(0, n_boot, chunk):
        stop = min(start + chunk, n_boot)
        q_idx = np.minimum((rng.random((stop - start, n_seeds, n_q)) * n_q).astype(np.int64), n_q - 1)
        cell = seed_idx[start:stop, :, None] * n_q + q_idx  # flat index of each drawn (seed, question)
        if complete:  # every seed has Q defined draws: the mean of per-seed means is the mean of all cells
            stats[start:stop] = flat_d[cell].mean(axis=(1, 2))
        else:
            stats[start:stop] = _per_seed_difference(flat_a[cell], flat_b[cell]).mean(axis=1)
    stats = stats[np.isfinite(stats)]
    out = {"n_seeds": n_seeds, "n_questions": n_q, "mean": mean}
    if stats.size == 0:
        return out | {"low": float("nan"), "high": float("nan")}
    alpha = (1.0 - level) / 2.0
    return out | {"low": float(np.quantile(stats, alpha)), "high": float(np.quantile(stats, 1.0 - alpha))}


def read_interval(low: float, high: float, *, margin: float) -> str:
    """The plan's reading of an interval ``[low, high]`` of a difference (method minus base), in this order:

    - ``"above 0"`` if ``low > 0``; ``"below 0"`` if ``high < 0``;
    - ``"inside the margin"`` if ``-margin <= low`` and ``high <= margin`` (no difference as large as the margin);
    - ``"no decision"`` otherwise, and for an undefined (NaN) interval, e.g. of a single seed.

    Source: docs/compare.md, "Reading the primary endpoint"; a study's margins are in its plan file
    (:mod:`capo_verl.compare.verdict`).

    Raises:
        ValueError: ``margin`` not > 0, or ``low > high``.
    """
    if not margin > 0:
        raise ValueError(f"read_interval: margin must be > 0, got {margin}")
    if not (math.isfinite(low) and math.isfinite(high)):
        return "no decision"
    if low > high:
        raise ValueError(f"read_interval: low {low} > high {high}")
    if low > 0:
        return "above 0"
    if high < 0:
        return "below 0"
    if -margin <= low and high <= margin:
        return "inside the margin"
    return "no decision"


def seeds_for_half_width(sd: float, half_width: float, *, level: float = 0.95, max_seeds: int = 10_000) -> int | None:
    """Smallest number of seeds ``n >= 2`` whose Student-t half-width ``t_{(1+level)/2, n-1} * sd / sqrt(n)``
    (:func:`seed_t_interval`) is at most ``half_width``, for a between-seed standard deviation ``sd`` of the paired
    difference (the plan's sizing rule, docs/compare.md "Sizing").

    Returns:
        int, or None when ``sd`` is NaN (fewer than two seeds measured) or ``max_seeds`` do not reach it.

    Raises:
        ValueError: ``sd < 0``, ``half_width <= 0``, ``level`` outside (0, 1).
    """
    level = _check_level(level)
    if not half_width > 0:
        raise ValueError(f"seeds_for_half_width: half_width must be > 0, got {half_width}")
    if not math.isfinite(sd):
        return None
    if sd < 0:
        raise ValueError(f"seeds_for_half_width: sd must be >= 0, got {sd}")
    q = 0.5 + level / 2.0
    # t_q(n - 1) > z_q, so no n below (z_q * sd / half_width)^2 reaches it: start there
    start = max(2, math.floor((NormalDist().inv_cdf(q) * sd / half_width) ** 2))
    for n in range(start, max_seeds + 1):
        if t_quantile(q, n - 1) * sd / math.sqrt(n) <= half_width:
            return n
    return None
