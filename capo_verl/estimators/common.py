"""Pieces every capo-verl estimator shares, written once: reading the batch (group ids, behaviour log-probs, masked
sequence means, outcome and correctness, reference perplexity), grouping ragged groups by size, GRPO's group
statistics, the reference-PPL noise mask, reading and checking a config section, and the per-step metrics queue.

Plain tensors in, plain tensors out: nothing here imports verl or Ray. Masked sums accumulate in float32; memory is
O(bs) beyond the inputs, plus one float32 ``(bs, response_length)`` buffer that becomes the estimator's output.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, fields
from types import MappingProxyType

import numpy as np
import pandas as pd
import torch

from capo_verl.metrics import LOG_PROB_TOLERANCE, capo_step_metrics

logger = logging.getLogger("capo_verl")

__all__ = [
    "EstimatorInputError",
    "LOG_PROB_TOLERANCE",
    "check_log_prob_means",
    "check_reference_ppl",
    "BatchView",
    "read_batch",
    "norm_adv_by_std",
    "group_ids",
    "GroupLayout",
    "group_layout",
    "grpo_group_advantages",
    "correct_mask",
    "reference_ppl_mask",
    "noise_mask",
    "behaviour_log_probs",
    "require_ref_log_prob",
    "read_config_section",
    "check_positive",
    "check_number",
    "check_rows",
    "check_groups",
    "check_finite",
    "check_constant",
    "record_step_metrics",
    "pop_step_metrics",
    "queued_step_metrics",
]

#: Rows per block of :func:`row_sweep` on CPU: a block of every input stays in cache across its row sums.
_CPU_ROW_BLOCK = 256


class EstimatorInputError(ValueError):
    """A value no estimator can use (a mask outside {0, 1}, complex or positive log-probs, a reference perplexity
    below 1): the message names the argument, the rows and the range it must lie in."""


def _rows(bad: torch.Tensor, values: torch.Tensor | None = None) -> str:
    rows = bad.nonzero().flatten()[:5].tolist()
    shown = "" if values is None else f" (values {[_shown(values[r].item()) for r in rows]})"
    more = "..." if int(bad.sum()) > 5 else ""
    return f"{int(bad.sum())} response(s), rows {rows}{more}{shown}"


def _shown(value):
    return round(value, 4) if isinstance(value, float) else value


def check_log_prob_means(estimator: str, key: str, means: torch.Tensor, valid: torch.Tensor | None = None) -> None:
    """Refuse a response whose mean token log-prob is NaN, +-inf or above 0 (+ :data:`LOG_PROB_TOLERANCE`): a
    log-probability lies in (-inf, 0]. O(bs), one reduction: the check of the fast path, on the sequence means it
    computes anyway.

    Args:
        estimator: the estimator's name, for the message.
        key: the argument or batch key the means come from (``old_log_probs``, ``lpm`` ...).
        means: ``(bs,)`` real mean token log-prob per response (nats).
        valid: ``(bs,)`` bool, responses with a valid token (others are 0 by definition), or None for all.

    Raises:
        EstimatorInputError: naming ``key``, the rows and the allowed range (NaN or inf, or above 0, where ``valid``);
            also for a complex ``means``.
    """
    if means.is_complex():
        raise EstimatorInputError(f"{estimator}: {key} is complex ({means.dtype}); log-probs are real, in (-inf, 0]")
    bad = ~(torch.isfinite(means) & (means <= LOG_PROB_TOLERANCE))  # NaN and +-inf fail both
    if valid is not None:
        bad &= valid
    if bad.any():
        nonfinite = bad & ~torch.isfinite(means)
        if nonfinite.any():
            raise EstimatorInputError(
                f"{estimator}: {key} is NaN or inf for {_rows(nonfinite, means)}; a mean token log-prob is a finite "
                f"number in (-inf, 0] nats: check the log-prob computation that produced {key}"
            )
        raise EstimatorInputError(
            f"{estimator}: {key} has a mean token log-prob above 0 nats for {_rows(bad, means)}; a log-probability "
            f"lies in (-inf, 0] (up to {LOG_PROB_TOLERANCE:g} of float rounding): is it a probability, a logit or a "
            "negated log-prob?"
        )


def check_reference_ppl(estimator: str, ref_ppl: torch.Tensor, valid: torch.Tensor | None = None) -> None:
    """Refuse a NaN reference perplexity, or one below 1 (beyond float rounding): ``exp(-mean ref_log_prob)`` lies in
    [1, inf) (+inf, an overflowed exp, compares above every threshold and passes). One reduction.

    Args:
        estimator: the estimator's name, for the message.
        ref_ppl: ``(bs,)`` real reference perplexity per response.
        valid: ``(bs,)`` bool, responses with a valid token, or None for all.

    Raises:
        EstimatorInputError: naming ``ref_ppl`` (and ``ref_log_prob``, its source), the rows and the range.
    """
    if ref_ppl.is_complex():
        raise EstimatorInputError(f"{estimator}: ref_ppl is complex ({ref_ppl.dtype}); a perplexity is real, >= 1")
    bad = ~(ref_ppl >= math.exp(-LOG_PROB_TOLERANCE))  # NaN fails it too
    if valid is not None:
        bad &= valid
    if bad.any():
        nan = bad & torch.isnan(ref_ppl)
        if nan.any():
            raise EstimatorInputError(
                f"{estimator}: ref_ppl is NaN for {_rows(nan)}; a perplexity is a number in [1, inf): check the "
                "ref_log_prob it comes from (exp(-mean ref_log_prob))"
            )
        raise EstimatorInputError(
            f"{estimator}: ref_ppl, the reference perplexity exp(-mean ref_log_prob), is below 1 for "
            f"{_rows(bad, ref_ppl)}; a "
            "perplexity lies in [1, inf): ref_log_prob must be the reference model's log-probs (nats, <= 0)"
        )


#: What each per-response argument of the public functions must hold, by its name (:func:`check_rows`).
_ROW_KINDS = {
    "lpm": "real",
    "ref_ppl": "real",
    "scores": "real",
    "outcome": "real",
    "bonus": "real",
    "correct": "bool",
    "valid": "bool",
    "gid": "integer",
}
_KIND_TEXT = {
    "real": "a real tensor (floating point or integer)",
    "bool": "a bool tensor",
    "integer": "an integer tensor (int64: dense group ids, e.g. from group_ids(uid))",
}


def _kind_ok(kind: str, x: torch.Tensor) -> bool:
    if kind == "bool":
        return x.dtype == torch.bool
    if x.is_complex() or x.dtype == torch.bool:
        return False
    return kind == "real" or not x.is_floating_point()


def check_rows(estimator: str, **rows: torch.Tensor) -> int:
    """Refuse per-response arguments that are not one ``(bs,)`` tensor each, all of one length, of the dtype their
    name asks for (:data:`_ROW_KINDS`: ``lpm``, ``ref_ppl``, ``scores`` real; ``correct``, ``valid`` bool; ``gid``
    integer). Reads only shapes and dtypes, no values.

    Args:
        estimator: the function's name, for the message.
        rows: ``{argument name: value}``.

    Returns:
        bs, the common length (the most frequent one; 0 with no argument).

    Raises:
        TypeError: an argument that is not a ``torch.Tensor``, naming it.
        EstimatorInputError: an argument of the wrong dtype (complex, a float ``correct``, a float ``gid`` ...), not
            1-D, or of another length than the others, naming it and what it must be.
    """
    for name, x in rows.items():
        if not isinstance(x, torch.Tensor):
            raise TypeError(
                f"{estimator}: {name} must be a torch.Tensor of shape (bs,), got "
                f"{type(x).__module__}.{type(x).__qualname__}; pass {name}=torch.as_tensor({name})"
            )
        kind = _ROW_KINDS[name]
        if not _kind_ok(kind, x):
            what = f"is complex ({x.dtype})" if x.is_complex() else f"has dtype {x.dtype}"
            raise EstimatorInputError(f"{estimator}: {name} {what}; it must be {_KIND_TEXT[kind]}")
        if x.dim() != 1:
            raise EstimatorInputError(
                f"{estimator}: {name} has shape {tuple(x.shape)}; it must be (bs,), one value per response"
            )
    lengths = [x.shape[0] for x in rows.values()]
    if not lengths:
        return 0
    bs = max(lengths, key=lengths.count)
    odd = [name for name, n in zip(rows, lengths) if n != bs]
    if odd:
        others = [name for name in rows if name not in odd]
        listed = ", ".join(f"{name} ({rows[name].shape[0]})" for name in odd)
        raise EstimatorInputError(
            f"{estimator}: {listed} against {bs} entries of {', '.join(others)}: every argument holds one entry "
            "per response, (bs,)"
        )
    return bs


def check_groups(estimator: str, gid: torch.Tensor, n_groups) -> int:
    """Refuse a group count that is not an integer (>= 1 when there are responses) and a group id outside
    [0, n_groups): one reduction (``aminmax``) over ``gid``, an integer ``(bs,)`` tensor (:func:`check_rows`).

    Returns:
        ``n_groups`` as an int.

    Raises:
        EstimatorInputError: naming ``n_groups`` or ``gid``, the rows and the range.
    """
    if isinstance(n_groups, (bool, np.bool_)) or not isinstance(n_groups, (int, np.integer)) or n_groups < 0:
        raise EstimatorInputError(
            f"{estimator}: n_groups must be an integer >= 0 (the number of groups), got {n_groups!r}"
        )
    n_groups = int(n_groups)
    if gid.numel() == 0:
        return n_groups
    if n_groups == 0:
        raise EstimatorInputError(
            f"{estimator}: n_groups is 0 but there are {gid.numel()} responses; it must be an integer >= 1, the "
            "number of groups (gid lies in [0, n_groups))"
        )
    low, high = torch.aminmax(gid)
    if bool((low < 0) | (high >= n_groups)):
        bad = (gid < 0) | (gid >= n_groups)
        raise EstimatorInputError(
            f"{estimator}: gid must lie in [0, n_groups) = [0, {n_groups}), but {_rows(bad, gid)} lie outside; "
            "dense group ids come from group_ids(uid)"
        )
    return n_groups


def check_finite(estimator: str, key: str, values: torch.Tensor) -> None:
    """Refuse NaN or inf in ``values`` (one reduction), naming ``key`` and the rows.

    Raises:
        EstimatorInputError: naming ``key``, the rows and the range (finite numbers).
    """
    if not bool(torch.isfinite(values).all()):
        raise EstimatorInputError(
            f"{estimator}: {key} is NaN or inf for {_rows(~torch.isfinite(values), values)}; it must be finite"
        )


def check_constant(
    estimator: str, name: str, value, low: float = -math.inf, *, low_open: bool = False, hint: str = ""
) -> float:
    """``value`` as a float when it is a finite real number >= ``low`` (> ``low`` with ``low_open``), else
    :class:`EstimatorInputError` naming ``name`` and that range; ``hint`` is appended (e.g. the paper's value).

    Raises:
        EstimatorInputError: not a real number (a bool, a string, complex ...), NaN, inf, or below the range.
    """
    if isinstance(value, torch.Tensor) and value.numel() == 1 and not value.is_complex():
        value = value.item()
    low_text = "-inf" if low == -math.inf else f"{low:g}"
    allowed = f"{'(' if low_open or low == -math.inf else '['}{low_text}, inf)"
    ok = not isinstance(value, (bool, np.bool_)) and isinstance(value, (int, float, np.integer, np.floating))
    if ok:
        ok = math.isfinite(value) and (value > low if low_open else value >= low)
    if not ok:
        raise EstimatorInputError(
            f"{estimator}: {name} must be a finite number in {allowed}, got {value!r}{'; ' + hint if hint else ''}"
        )
    return float(value)


# --- the per-step metrics queue ------------------------------------------------------------------------------------
#: Metrics recorded by an estimator during the current step; capo_verl.compat moves them into the trainer's metrics.
_STEP_METRICS: dict[str, float] = {}


def record_step_metrics(metrics: Mapping[str, float]) -> None:
    """Queue ``{name: float}`` metrics for the current training step (read back by :func:`pop_step_metrics`)."""
    _STEP_METRICS.update(metrics)


def pop_step_metrics() -> dict[str, float]:
    """Return and clear the metrics queued by :func:`record_step_metrics`."""
    out = dict(_STEP_METRICS)
    _STEP_METRICS.clear()
    return out


def queued_step_metrics() -> Mapping[str, float]:
    """A read-only view of the metrics queued so far in this step (not cleared)."""
    return MappingProxyType(_STEP_METRICS)


# --- reading the batch ---------------------------------------------------------------------------------------------
def row_sweep(response_mask, masked: dict, rewards=None):
    """Everything an estimator reads from the ``(bs, T)`` tensors, in one cache-friendly sweep over row blocks.

    Args:
        response_mask: ``(bs, T)`` 1 on valid tokens.
        masked: ``{batch key: (bs, T) tensor}`` to sum over valid tokens (float32 accumulation).
        rewards: ``(bs, T)`` tensor to sum over all tokens, or None.

    Returns:
        ``(mask_f32, n_valid, sums, reward_sum)``: a float32 copy of the mask (``(bs, T)``, the caller may
        overwrite it), ``(bs,)`` valid-token counts, ``{key: (bs,) float32 masked row sum}``, ``(bs,)`` float32
        or None.

    Raises:
        ValueError: a shape differs from ``response_mask``'s, or NaN/inf at a valid token.
        EstimatorInputError: ``response_mask`` holds a value other than 0 and 1 (checked on each block while it is in
            cache: for an integer mask, the sum of its squares against its sum; else its minimum and maximum, and for
            a floating-point mask its count of nonzeros against its sum).
    """
    shape = response_mask.shape
    for key, x in [*masked.items(), ("token_level_rewards", rewards)]:
        if x is not None and x.shape != shape:
            raise ValueError(f"{key} has shape {tuple(x.shape)} but response_mask {tuple(shape)}")
    bs, device = shape[0], response_mask.device
    mask_f32 = torch.empty(shape, dtype=torch.float32, device=device)
    n_valid = torch.empty(bs, dtype=torch.float32, device=device)
    sums = {key: torch.empty(bs, dtype=torch.float32, device=device) for key in masked}
    reward_sum = None if rewards is None else torch.empty(bs, dtype=torch.float32, device=device)
    block = _CPU_ROW_BLOCK if device.type == "cpu" else max(bs, 1)
    check_mask = response_mask.dtype != torch.bool and response_mask.numel() > 0
    fractional = response_mask.is_floating_point()
    # an integer mask is in {0, 1} iff sum(m * m) == sum(m) (each m (m - 1) >= 0, 0 only at 0 and 1): one dot product
    # of the cached block, exact in float32 while the block has fewer than 2**24 entries; else min, max (and for a
    # float mask, as many nonzeros as its sum)
    by_dot = check_mask and not fractional and min(block, bs) * shape[-1] < 2**24
    n_blocks = -(-bs // block)
    dots = torch.empty(n_blocks, dtype=torch.float32, device=device) if by_dot else None
    mask_ok = torch.ones((), dtype=torch.bool, device=device)
    for k, start in enumerate(range(0, bs, block)):
        rows = slice(start, start + block)
        m = mask_f32[rows]
        m.copy_(response_mask[rows])
        torch.sum(m, -1, out=n_valid[rows])
        if by_dot:
            flat = m.view(-1)
            torch.dot(flat, flat, out=dots[k])
        elif check_mask:
            mask_ok &= (torch.amin(m, -1).min() >= 0) & (torch.amax(m, -1).max() <= 1)
            if fractional:
                mask_ok &= torch.equal(torch.count_nonzero(m, -1).to(torch.float32), n_valid[rows])
        for key, x in masked.items():
            # row-wise dot product with the mask: the fastest masked row sum on CPU (benchmarks/capo_speed.py)
            sums[key][rows] = torch.linalg.vecdot(x[rows].to(torch.float32), m)
        if rewards is not None:
            torch.sum(rewards[rows], -1, dtype=torch.float32, out=reward_sum[rows])
    if by_dot and bs * shape[-1] < 2**24:  # every partial sum an integer below 2**24: the totals compare exactly
        mask_ok = bool(dots.sum() == n_valid.sum())
    elif by_dot:  # each block's sum of squares against its sum
        mask_ok = torch.equal(dots, torch.nn.functional.pad(n_valid, (0, n_blocks * block - bs)).view(-1, block).sum(1))
    if check_mask and not bool(mask_ok):
        _refuse_mask(response_mask)
    for key, x in masked.items():
        if not torch.isfinite(sums[key]).all():
            # NaN * 0 is NaN: re-sum ignoring padding before deciding the input is bad.
            sums[key] = torch.where(mask_f32.bool(), x.to(torch.float32), 0.0).sum(-1)
            bad = ~torch.isfinite(sums[key])
            if bad.any():
                rows_bad = bad.nonzero().flatten()[:5].tolist()
                raise ValueError(
                    f"{key} has NaN or inf at valid tokens of {int(bad.sum())} response(s) (rows {rows_bad}...); "
                    f"check the log-prob computation that produced {key}"
                )
    return mask_f32, n_valid, sums, reward_sum


def _refuse_mask(response_mask: torch.Tensor) -> None:
    """Raise :class:`EstimatorInputError` naming the rows of ``response_mask`` that hold a value other than 0 and 1."""
    bad_values = (response_mask != 0) & (response_mask != 1)
    bad = bad_values.any(-1)
    values = sorted({round(float(v), 4) for v in response_mask[bad_values][:20].tolist()})
    raise EstimatorInputError(
        f"response_mask must hold only 0 and 1 (1 on valid response tokens), but {_rows(bad)} hold {values}; a "
        "weight of 2 would scale the advantages and -1 would flip them: pass the 0/1 mask verl builds "
        "(attention_mask over the response)"
    )


def group_ids(index, bs: int, estimator: str = "capo") -> tuple[np.ndarray, int]:
    """Dense group ids ``(bs,)`` int64 in [0, n_groups) from verl's ``uid`` array (any hashables).

    Hash-based (``pandas.factorize``): O(bs), in order of first appearance.

    Raises:
        ValueError: if ``index`` is None, its length is not ``bs``, or an entry is None/NaN.
    """
    if index is None:
        raise ValueError(
            f"{estimator} needs the group id of every response: non_tensor_batch['uid'] (the `index` argument) is "
            "missing. verl's trainer sets it (one uid per prompt, repeated rollout.n times); when calling "
            "directly pass index=<array of one id per response>"
        )
    index = np.asarray(index)
    if index.shape != (bs,):
        raise ValueError(f"uid/index has shape {index.shape}, expected ({bs},): one group id per response")
    gid, keys = pd.factorize(index)
    if (gid < 0).any():
        rows = np.flatnonzero(gid < 0)[:5].tolist()
        raise ValueError(f"uid/index has None or NaN at rows {rows}; every response needs a uid")
    return gid.astype(np.int64, copy=False), len(keys)


_warned_rollout_log_probs: set[str] = set()


def behaviour_log_probs(old_log_probs, rollout_log_probs, estimator: str):
    """The behaviour policy's per-token log-probs: ``old_log_probs``, else ``rollout_log_probs`` (logged once).

    Returns:
        ``(tensor, batch key)``.

    Raises:
        ValueError: both are None; the message names the keys and the fix.
    """
    if old_log_probs is not None:
        return old_log_probs, "old_log_probs"
    if rollout_log_probs is not None:
        if estimator not in _warned_rollout_log_probs:
            _warned_rollout_log_probs.add(estimator)
            logger.warning("%s: old_log_probs absent from the batch; using rollout_log_probs for lpm", estimator)
        return rollout_log_probs, "rollout_log_probs"
    raise ValueError(
        f"{estimator} needs per-token log-probs of the responses for lpm: the batch has neither 'old_log_probs' nor "
        "'rollout_log_probs'. verl computes old_log_probs in the trainer's old_log_prob step; when calling "
        "directly pass old_log_probs=(bs, response_length) tensor (or set "
        "actor_rollout_ref.rollout.calculate_log_probs=true for rollout_log_probs)"
    )


def require_ref_log_prob(ref_log_prob, estimator: str) -> None:
    """Raise ValueError naming ``ref_log_prob`` and the fix if it is None (the noise mask needs it)."""
    if ref_log_prob is None:
        raise ValueError(
            f"{estimator} with algorithm.capo.use_mask=true needs 'ref_log_prob' (reference-model log-probs) in "
            "the batch, and it is missing. In verl's trainer capo-verl turns the reference pass on by itself; if "
            "you disabled it, configure actor_rollout_ref.ref, or set algorithm.capo.use_mask=false to train "
            "without the noise mask (when calling directly, pass ref_log_prob=(bs, response_length))"
        )


def check_tensors(estimator: str, **tensors) -> None:
    """Refuse a batch input that is not a ``torch.Tensor`` (None stands for an absent key and passes).

    Args:
        estimator: the estimator's name, for the message.
        tensors: ``{batch key: value}``; each a ``(bs, response_length)`` tensor as in verl's ``data.batch``.

    Raises:
        TypeError: naming the key, the type given and the conversion (``torch.as_tensor``).
        EstimatorInputError: a complex tensor, naming the key and what its values must be.
    """
    for key, value in tensors.items():
        if value is not None and not isinstance(value, torch.Tensor):
            raise TypeError(
                f"{estimator}: {key} must be a torch.Tensor of shape (bs, response_length), as in verl's data.batch, "
                f"got {type(value).__module__}.{type(value).__qualname__}; pass {key}=torch.as_tensor({key})"
            )
        if value is not None and value.is_complex():
            allowed = "0 and 1" if key == "response_mask" else "real numbers" if "reward" in key else "(-inf, 0] nats"
            raise EstimatorInputError(
                f"{estimator}: {key} is complex ({value.dtype}); it must be a real tensor, its values {allowed}"
            )


def check_rewards(score: torch.Tensor, index, estimator: str) -> None:
    """Refuse NaN or inf outcomes: compared with the threshold, a NaN would count as incorrect and be pushed down.

    Args:
        score: ``(bs,)`` float32 summed ``token_level_rewards`` per response.
        index: ``(bs,)`` group ids (verl ``uid``) of the responses, named in the message.
        estimator: the estimator's name, for the message.

    Raises:
        ValueError: naming the rows, their uids and how many responses are affected.
    """
    bad = ~torch.isfinite(score)
    if not bad.any():
        return
    rows = bad.nonzero().flatten()[:5].tolist()
    uids = [np.asarray(index)[r] for r in rows]
    raise ValueError(
        f"{estimator}: token_level_rewards sum to NaN or inf for {int(bad.sum())} response(s) (rows {rows}, uids "
        f"{uids}{'...' if int(bad.sum()) > 5 else ''}); a NaN reward would count as incorrect and get a negative "
        "advantage. Check the reward function that scored them (it must return a finite number)"
    )


_warned_unused_ref: set[str] = set()


def optional_ref_sum(ref_log_prob: torch.Tensor, response_mask: torch.Tensor, estimator: str) -> torch.Tensor | None:
    """``(bs,)`` float32 masked sum of ``ref_log_prob`` when the estimator only reports it (noise mask off), or None
    when it has NaN or inf at a valid token: then it is left out of the metrics (warned once), not refused."""
    try:
        return row_sweep(response_mask, {"ref_log_prob": ref_log_prob})[2]["ref_log_prob"]
    except EstimatorInputError:  # the mask, which the advantages read too
        raise
    except ValueError as exc:  # NaN/inf or a shape of a tensor the advantages do not read
        _warn_unused_ref(estimator, exc)
        return None


def _warn_unused_ref(estimator: str, why) -> None:
    if estimator not in _warned_unused_ref:
        _warned_unused_ref.add(estimator)
        logger.warning("%s: ref_log_prob is not used with the noise mask off and is left out (%s)", estimator, why)


@dataclass
class BatchView:
    """What an estimator reads from verl's batch, computed once by :func:`read_batch` (bs responses).

    Attributes:
        gid_np: ``(bs,)`` int64 numpy dense group ids in [0, n_groups) (from ``uid``).
        gid: the same as a torch tensor on the inputs' device.
        n_groups: number of groups (questions).
        n_valid: ``(bs,)`` float32 number of valid response tokens.
        valid: ``(bs,)`` bool, the response has at least one valid token.
        score: ``(bs,)`` float32 outcome R_i, the sum of ``token_level_rewards``.
        correct: ``(bs,)`` bool, ``score > reward_threshold``.
        lpm: ``(bs,)`` float32 mean behaviour log-prob over valid tokens (nats; 0 without valid tokens), or None.
        ref_ppl: ``(bs,)`` float32 reference perplexity ``exp(-mean ref_log_prob)``, or None.
        out: ``(bs, T)`` float32 copy of ``response_mask``, overwritten by :meth:`broadcast`.
    """

    gid_np: np.ndarray
    gid: torch.Tensor
    n_groups: int
    n_valid: torch.Tensor
    valid: torch.Tensor
    score: torch.Tensor
    correct: torch.Tensor
    lpm: torch.Tensor | None
    ref_ppl: torch.Tensor | None
    out: torch.Tensor

    def broadcast(self, adv: torch.Tensor) -> torch.Tensor:
        """``(bs, T)`` float32: the sequence advantage ``adv`` ``(bs,)`` on valid tokens, 0 on padding (in place)."""
        return self.out.mul_(adv.to(torch.float32).unsqueeze(-1))

    def calibration_metrics(self, adv: torch.Tensor, keep: torch.Tensor | None = None) -> dict[str, float]:
        """:func:`capo_verl.metrics.capo_step_metrics` of this batch (needs ``lpm``) with sequence advantages."""
        return capo_step_metrics(
            self.lpm.numpy(force=True),
            self.correct.numpy(force=True),
            self.gid_np,
            self.valid.numpy(force=True),
            adv=adv.numpy(force=True),
            ref_ppl=None if self.ref_ppl is None else self.ref_ppl.numpy(force=True),
            keep=None if keep is None else keep.numpy(force=True),
        )


def read_batch(
    estimator: str,
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    index,
    reward_threshold: float,
    *,
    old_log_probs: torch.Tensor | None = None,
    rollout_log_probs: torch.Tensor | None = None,
    need_lpm: bool = True,
    ref_log_prob: torch.Tensor | None = None,
    need_ref: bool = False,
) -> BatchView:
    """The prologue every estimator shares: group ids, outcome, correctness, lpm and reference PPL, in one sweep.

    Args:
        estimator: the estimator's name, for error messages.
        token_level_rewards: ``(bs, T)`` rewards; R_i is their sum (float32).
        response_mask: ``(bs, T)`` 1 on valid response tokens.
        index: ``(bs,)`` group id (verl ``uid``) per response.
        reward_threshold: a response is correct iff R_i > this.
        old_log_probs, rollout_log_probs: ``(bs, T)`` behaviour log-probs (nats); the first present one gives lpm.
        need_lpm: read the behaviour log-probs (an error when both are None).
        ref_log_prob: ``(bs, T)`` reference-model log-probs (nats), or None.
        need_ref: ``ref_log_prob`` is required (the noise mask is on).

    Returns:
        A :class:`BatchView`.

    Raises:
        TypeError: an input that is not a ``torch.Tensor`` (e.g. a numpy array; :func:`check_tensors`).
        ValueError: missing ``uid``, log-probs (``need_lpm``) or ``ref_log_prob`` (``need_ref``); a shape mismatch;
            NaN/inf at a valid token of a log-prob that is used, or in a response's summed reward
            (:func:`check_rewards`). Each message names the key and the fix. ``ref_log_prob`` with NaN, or with a
            mean above 0, while ``need_ref`` is off is left out of the metrics instead (:func:`optional_ref_sum`).
        EstimatorInputError: ``response_mask`` not 0/1 (:func:`row_sweep`); a complex input (:func:`check_tensors`);
            a response whose mean behaviour log-prob, or (``need_ref``) mean ``ref_log_prob``, is above 0 nats
            (:func:`check_log_prob_means`: a reference perplexity below 1).
    """
    check_tensors(
        estimator,
        token_level_rewards=token_level_rewards,
        response_mask=response_mask,
        old_log_probs=old_log_probs,
        rollout_log_probs=rollout_log_probs,
        ref_log_prob=ref_log_prob,
    )
    bs = token_level_rewards.shape[0]
    gid_np, n_groups = group_ids(index, bs, estimator)
    masked = {}
    lp_key = None
    if need_lpm:
        log_probs, lp_key = behaviour_log_probs(old_log_probs, rollout_log_probs, estimator)
        masked[lp_key] = log_probs
    if need_ref:
        require_ref_log_prob(ref_log_prob, estimator)
        masked["ref_log_prob"] = ref_log_prob
    out, n_valid, sums, score = row_sweep(response_mask, masked, token_level_rewards)
    check_rewards(score, index, estimator)
    if ref_log_prob is not None and not need_ref:
        sums["ref_log_prob"] = optional_ref_sum(ref_log_prob, response_mask, estimator)
        if sums["ref_log_prob"] is None:
            ref_log_prob = None
    denom = n_valid.clamp_min(1.0)
    valid = n_valid > 0
    lpm = None if lp_key is None else sums[lp_key] / denom
    if lpm is not None:
        check_log_prob_means(estimator, lp_key, lpm, valid)
    ref_mean = None if ref_log_prob is None else sums["ref_log_prob"] / denom
    if ref_mean is not None and need_ref:
        check_log_prob_means(estimator, "ref_log_prob (a reference perplexity below 1)", ref_mean, valid)
    elif ref_mean is not None and bool((valid & (ref_mean > LOG_PROB_TOLERANCE)).any()):
        _warn_unused_ref(estimator, "it has a mean above 0 nats (a reference perplexity below 1)")
        ref_mean = None
    return BatchView(
        gid_np=gid_np,
        gid=torch.from_numpy(gid_np).to(out.device),
        n_groups=n_groups,
        n_valid=n_valid,
        valid=valid,
        score=score,
        correct=correct_mask(score, reward_threshold),
        lpm=lpm,
        ref_ppl=None if ref_mean is None else torch.exp(-ref_mean),  # PPL_ref, Eq. 16
        out=out,
    )


def norm_adv_by_std(config) -> bool:
    """``algorithm.norm_adv_by_std_in_grpo`` of verl's algorithm config (default true, as verl's)."""
    return True if config is None else bool(config.get("norm_adv_by_std_in_grpo", True))


# --- groups ----------------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class GroupLayout:
    """Ragged, interleaved groups sorted into contiguous runs; O(bs) memory, no padded table.

    Attributes:
        order: ``(bs,)`` int64, response ``order[k]`` is the k-th in group-sorted order (stable within a group).
        sizes: ``(n_groups,)`` int64 group sizes.
        starts: ``(n_groups,)`` int64 offset of each group's run in the sorted order.
    """

    order: torch.Tensor
    sizes: torch.Tensor
    starts: torch.Tensor

    def buckets(
        self, select: torch.Tensor | None = None, min_size: int = 1
    ) -> Iterator[tuple[int, torch.Tensor, torch.Tensor]]:
        """For each distinct group size s >= ``min_size``: ``(s, groups, idx)`` with ``groups`` ``(n_s,)`` int64 the
        ids of the n_s groups of that size (only those where ``select`` ``(n_groups,)`` bool is True) and ``idx``
        ``(n_s, s)`` int64 their members' positions in the sorted order.

        ``x_sorted[idx]`` is then an ``(n_s, s)`` table of those groups; there is one Python iteration per distinct
        size, not per group or response.
        """
        keep = self.sizes >= min_size
        if select is not None:
            keep &= select
        for size in torch.unique(self.sizes[keep]).tolist():
            groups = (keep & (self.sizes == size)).nonzero().flatten()
            idx = self.starts[groups].unsqueeze(1) + torch.arange(size, device=self.sizes.device)
            yield size, groups, idx


def group_layout(gid: torch.Tensor, n_groups: int) -> GroupLayout:
    """:class:`GroupLayout` of dense group ids ``gid`` ``(bs,)`` int64 in [0, n_groups)."""
    order = torch.argsort(gid, stable=True)
    sizes = torch.bincount(gid, minlength=n_groups)
    return GroupLayout(order=order, sizes=sizes, starts=torch.cumsum(sizes, 0) - sizes)


def grpo_group_advantages(
    scores: torch.Tensor,
    gid: torch.Tensor,
    n_groups: int,
    norm_by_std: bool = True,
    epsilon: float = 1e-6,
) -> torch.Tensor:
    """GRPO's outcome advantage per response: ``(R_i - mean R) / (std R + epsilon)`` within each group.

    Group statistics (``verl/trainer/ppo/core_algos.py::compute_grpo_outcome_advantage``, verl 0.9.1): ``torch.mean``
    and ``torch.std`` (unbiased, n - 1) of the group's scores in ``scores``' dtype, here over a batch of groups of one
    size at a time. The result equals verl's for every group whose scores are not all equal, bit for bit except where
    torch's batched ``std`` rounds its last bit differently from verl's call on one group (about 1 group in 6,000 random
    ones in the tests: a relative difference of one float32 rounding, ~6e-8). A group of two or more responses whose
    scores are all exactly equal gets exactly 0 (verl's float32 mean of equal values can be off by one rounding, which
    its std of ~1e-7 then blows up to a uniform advantage of up to ~0.1, e.g. seven scores of 0.7). A group with a
    single response keeps verl's convention: mean 0 and std 1, so its advantage is R_i / (1 + epsilon) (R_i without
    ``norm_by_std``). With ``norm_by_std=False``: ``R_i - mean R`` (Dr. GRPO). Vectorised per group size.

    Args:
        scores: ``(bs,)`` float outcome per response (float32 for verl's bits).
        gid: ``(bs,)`` int64 dense group ids in [0, n_groups); groups may be ragged and interleaved.
        n_groups: number of groups.
        norm_by_std: divide by the group's std (``algorithm.norm_adv_by_std_in_grpo``).
        epsilon: added to the std; a finite number >= 0 (a constant group gets 0 even with 0, as above).

    Returns:
        ``(bs,)`` tensor of ``scores``' dtype. Memory O(bs).

    Raises:
        TypeError: ``scores`` or ``gid`` not a ``torch.Tensor`` (:func:`check_rows`).
        EstimatorInputError: ``scores`` not real or with NaN/inf (:func:`check_finite`), ``gid`` not an integer
            tensor, the two of different lengths, ``gid`` outside [0, ``n_groups``) (:func:`check_groups`), or
            ``epsilon`` not a finite number >= 0 (:func:`check_constant`).
    """
    name = "grpo_group_advantages"
    check_rows(name, scores=scores, gid=gid)
    n_groups = check_groups(name, gid, n_groups)
    check_finite(name, "scores", scores)
    epsilon = check_constant(name, "epsilon", epsilon, 0.0, hint="GRPO's is 1e-6")
    return _grpo_group_advantages(scores, gid, n_groups, norm_by_std, epsilon)


def _grpo_group_advantages(scores, gid, n_groups: int, norm_by_std: bool = True, epsilon: float = 1e-6):
    """:func:`grpo_group_advantages` without its checks, for the inputs :func:`read_batch` made (the estimators)."""
    layout = group_layout(gid, n_groups)
    sorted_scores = scores[layout.order]
    mean = torch.zeros(n_groups, dtype=scores.dtype, device=scores.device)
    std = torch.ones(n_groups, dtype=scores.dtype, device=scores.device)
    constant = torch.zeros(n_groups, dtype=torch.bool, device=scores.device)
    for _, groups, idx in layout.buckets(min_size=2):  # verl: mean 0, std 1 for a lone response
        table = sorted_scores[idx]  # (n_s, size)
        mean[groups] = torch.mean(table, dim=1)
        same = table.amax(dim=1) == table.amin(dim=1)
        constant[groups] = same
        std[groups] = torch.where(same, 1.0, torch.std(table, dim=1))  # 0 / (1 + epsilon): 0 even for epsilon 0
    centred = torch.where(constant[gid], torch.zeros((), dtype=scores.dtype), scores - mean[gid])
    return centred / (std[gid] + epsilon) if norm_by_std else centred


def correct_mask(score: torch.Tensor, reward_threshold: float) -> torch.Tensor:
    """``(bs,)`` bool: a response is correct iff its summed reward ``score`` is > ``reward_threshold``."""
    return score > reward_threshold


def reference_ppl_mask(ref_ppl: torch.Tensor, correct: torch.Tensor, ref_high: float, ref_low: float) -> torch.Tensor:
    """The noise mask m(o) of CAPO's Eq. 18.

    Args:
        ref_ppl: ``(bs,)`` real reference-model perplexity ``exp(-mean ref_log_prob)`` (>= 1 for real models).
        correct: ``(bs,)`` bool.
        ref_high, ref_low: thresholds (perplexity units): ``ref_high`` a finite number >= 1, ``ref_low`` a finite
            number > 0 and <= ``ref_high`` (as :class:`~capo_verl.estimators.capo.CapoConfig` and the start checks).

    Returns:
        ``(bs,)`` bool, False where the response's advantage is dropped: correct with PPL_ref > ref_high,
        or incorrect with PPL_ref < ref_low.

    Raises:
        TypeError: ``ref_ppl`` or ``correct`` not a ``torch.Tensor`` (:func:`check_rows`).
        EstimatorInputError: ``ref_ppl`` not real, ``correct`` not bool, or the two of different lengths
            (:func:`check_rows`); a ``ref_ppl`` that is NaN or below 1 (:func:`check_reference_ppl`); ``ref_high`` or
            ``ref_low`` outside its range, or ``ref_high`` < ``ref_low`` (:func:`check_constant`).
    """
    name = "reference_ppl_mask"
    check_rows(name, ref_ppl=ref_ppl, correct=correct)
    ref_high = check_constant(name, "ref_high", ref_high, 1.0, hint="a perplexity is >= 1; the paper uses 2.5")
    ref_low = check_constant(name, "ref_low", ref_low, 0.0, low_open=True, hint="the paper uses 1.05")
    if ref_high < ref_low:
        raise EstimatorInputError(
            f"{name}: ref_high ({ref_high:g}) is below ref_low ({ref_low:g}); Eq. 18 needs ref_low <= ref_high "
            "(the paper's window is ref_low 1.05, ref_high 2.5): are they swapped? The signature is "
            "reference_ppl_mask(ref_ppl, correct, ref_high, ref_low)"
        )
    check_reference_ppl(name, ref_ppl)
    return noise_mask(ref_ppl, correct, ref_high, ref_low)


def noise_mask(ref_ppl: torch.Tensor, correct: torch.Tensor, ref_high: float, ref_low: float) -> torch.Tensor:
    """:func:`reference_ppl_mask` without its check, for a ``ref_ppl`` that :func:`read_batch` checked already."""
    return torch.where(correct, ref_ppl <= ref_high, ref_ppl >= ref_low)


# --- config ----------------------------------------------------------------------------------------------------------
def read_config_section(cls, config, section_name: str, unknown_hint: Mapping[str, str] | None = None):
    """Build dataclass ``cls`` from ``config.<section_name>`` (verl's algorithm config: DictConfig, dict,
    dataclass or None); an absent section gives ``cls()``.

    Raises:
        ValueError: an unknown key under ``algorithm.<section_name>`` (a typo would otherwise be ignored; a key in
            ``unknown_hint`` gets that explanation), or the section is not a mapping; and whatever ``cls`` raises
            for a bad value.
    """
    if config is None:
        section = None
    elif isinstance(config, Mapping) or hasattr(config, "get"):
        section = config.get(section_name, None)
    else:
        section = getattr(config, section_name, None)
    if section is None:
        return cls()
    if not isinstance(section, Mapping):
        try:
            from omegaconf import OmegaConf

            section = OmegaConf.to_container(section, resolve=True)
        except Exception as exc:  # not a config node either
            raise ValueError(f"algorithm.{section_name} must be a mapping, got {type(section).__name__}") from exc
    known = {f.name for f in fields(cls)}
    unknown = sorted(set(section) - known)
    for key in unknown:
        if unknown_hint and key in unknown_hint:
            raise ValueError(f"algorithm.{section_name}.{key}: {unknown_hint[key]}")
    if unknown:
        import difflib

        prefix = f"algorithm.{section_name}."
        key = unknown[0]
        meant = difflib.get_close_matches(key, sorted(known), n=1, cutoff=0.6)
        value = section[key]
        if meant and not isinstance(value, Mapping):
            plus = "" if meant[0] in section else "+"
            text = str(value).lower() if isinstance(value, bool) else value
            fix = f"did you mean {prefix}{meant[0]}? set ~{prefix}{key} {plus}{prefix}{meant[0]}={text}"
        else:
            fix = f"remove it: set ~{prefix}{key}"
        raise ValueError(f"unknown key(s) {prefix}{f', {prefix}'.join(unknown)}; valid keys: {sorted(known)}; {fix}")
    return cls(**{k: section[k] for k in section})


def check_number(section: str, key: str, value, default) -> float:
    """``value`` as a float; raises ValueError naming ``algorithm.<section>.<key>`` if it is not a finite number
    (the fix has no ``+``, as in :func:`check_positive`)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ValueError(
            f"algorithm.{section}.{key} must be a finite number, got {value!r}; "
            f"set e.g. algorithm.{section}.{key}={default}"
        )
    return float(value)


def check_positive(section: str, key: str, value, default) -> float:
    """``value`` as a float > 0; raises ValueError naming ``algorithm.<section>.<key>`` otherwise.

    The fix in the message has no ``+``: a bad value comes from the config, so the composed config has the key, and
    Hydra refuses ``+`` on a key that exists (``Could not append to config``)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
        raise ValueError(
            f"algorithm.{section}.{key} must be a positive number, got {value!r}; "
            f"set e.g. algorithm.{section}.{key}={default}"
        )
    return float(value)
