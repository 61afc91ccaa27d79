"""SimKO (Peng et al. 2025, "SimKO: Simple Pass@K Policy Optimization"): the loss math, without verl.

Source: CLR-Lab/SimKO at commit 306f4ff4e84ace53e92501939692fcfeb32596b5 (a fork of verl 0.2):
``verl/trainer/ppo/core_algos.py`` (``row_quantile_masked``, ``compute_policy_loss_simko``) and
``verl/workers/actor/dp_actor.py`` (``_forward_micro_batch``: ``max_token``, ``topk_log_probs``; ``update_policy``);
hyperparameters from ``run_qwen2.5-math-7b_SimKO.sh`` (``top_k=3``, ``tau=0.8``, ``mix_topk_coef=0.01``).

What SimKO changes in PPO-clip, per response token t with sampled token o_t (authors' names in brackets):

* **Forking tokens.** t is a forking token if its (detached) entropy H_t is above the ``entropy_quantile``-quantile
  [``tau``] of the entropies of that response's valid tokens (``torch.quantile``, linear interpolation;
  ``core_algos.py`` lines 391-394: ``threshold = row_quantile_masked(entropy, eos_mask, q=tau)``,
  ``w = (entropy > threshold)``).
* **Positive responses, forking tokens: top-K smoothing.** The ratio r_t = pi(o_t)/pi_old(o_t) becomes
  ``(1 - alpha) r_t + (alpha / K) sum_k sg(r_t) / sg(r_k) r_k`` over the current policy's top-K tokens k
  [``mix_topk_coef``, ``top_k``] (lines 353-370 and 396-413). Its value is r_t, so clipping is unchanged; its
  gradient is ``r_t [(1 - alpha) grad log pi(o_t) + (alpha / K) sum_k grad log pi(k)]``.
* **Negative responses, forking tokens where o_t is the top-1 token: the advantage times 1.1** (lines 421-426;
  the authors hard-code 1.1, here ``top1_penalty``).
* Everything else is the PPO-clip loss (here verl 0.9.1's ``vanilla`` loss, see :mod:`capo_verl.compat.simko`).

How this module computes it, and where it differs from the authors' code (all differences are listed in the
README):

* The smoothed ratio is built as ``exp(lp' - old_log_prob)`` with the surrogate log-prob
  ``lp' = lp_t + alpha_t [mean_k (lp_k - sg(lp_k)) - (lp_t - sg(lp_t))]`` (``alpha_t = alpha`` at positive forking
  tokens, else 0). ``lp'`` equals ``lp_t`` exactly and ``grad exp(lp' - old) = r_t [(1 - alpha_t) grad lp_t +
  (alpha_t / K) sum_k grad lp_k]``: the authors' value and gradient. The authors also divide by
  ``sg(r_k) + 1e-8`` with the *old* policy's top-K log-probs (``old_log_probs_topk``, an extra pass); since
  ``sg(r_t) / sg(r_k) r_k = r_t pi(k) / sg(pi(k))``, the old top-K log-probs cancel and are not computed here
  (the 1e-8 changes the authors' value by a relative 1e-8, nothing else).
* "Positive" / "negative" is the sign of the response's summed advantage. The authors use
  ``token_level_scores.sum(-1) == 1`` (line 351) for the positive side and ``advantages.sum(-1) < 0`` (line 422)
  for the negative side; with 0/1 rewards and a group-baseline estimator (GRPO) the two agree wherever the loss
  has a gradient (a correct response in a mixed group has A > 0; in an all-correct group A = 0 and the smoothing
  multiplies nothing).
* Ties (:func:`top_k_indices`; the same on every device). "o_t is the top-1 token" is ``logit(o_t) >= max logit``
  (a sampled token tied with the maximum counts as top-1); the authors compare ``argmax(logits) == o_t``
  (``dp_actor.py`` lines 132-133 and 206-207; ``argmax`` takes the lowest tied id), which differs only on exact
  ties. The top-K set is the K largest scaled logits, ties at the K-th place going to the lowest token ids, in the
  order (logit descending, token id ascending); the authors take ``torch.topk(logits, k).indices`` (lines 136 and
  211), whose choice among ties is unspecified and differs between CPU and CUDA.
* A response without valid tokens has no forking tokens (the authors take the quantile of its padding).

All tensors are ``(bs, T)`` response-aligned as in verl's policy losses; ``K`` = ``top_k``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any

import torch

#: The authors' repository and commit this module follows.
SOURCE = "CLR-Lab/SimKO@306f4ff4e84ace53e92501939692fcfeb32596b5"

#: Where the parameters live in a verl config.
CONFIG_KEY = "actor_rollout_ref.actor.policy_loss.simko"


@dataclass(frozen=True)
class SimKOParams:
    """SimKO's hyperparameters (defaults: the authors' Qwen2.5-Math-7B script ``run_qwen2.5-math-7b_SimKO.sh``).

    Attributes:
        top_k: K, number of the current policy's most likely tokens the smoothing spreads over [``top_k`` 3].
        alpha: weight of the top-K term in the ratio at positive forking tokens, in [0, 1] [``mix_topk_coef`` 0.01].
        entropy_quantile: per-response entropy quantile above which a token is a forking token, in [0, 1]
            [``tau`` 0.8].
        top1_penalty: advantage multiplier at negative forking tokens whose sampled token is the top-1 token, > 0
            (hard-coded 1.1 in ``core_algos.py`` line 425).
    """

    top_k: int = 3
    alpha: float = 0.01
    entropy_quantile: float = 0.8
    top1_penalty: float = 1.1


def parse_simko_config(raw: Mapping[str, Any] | None) -> SimKOParams:
    """Validate ``actor_rollout_ref.actor.policy_loss.simko``; return :class:`SimKOParams` (defaults for absent keys).

    Args:
        raw: a mapping (dict, OmegaConf ``DictConfig``) or None (all defaults).

    Raises:
        ValueError: an unknown key, or a value of the wrong type or out of range; the message names the full key.
    """
    if raw is None:
        return SimKOParams()
    if isinstance(raw, SimKOParams):
        return raw
    if not isinstance(raw, Mapping):
        raise ValueError(f"{CONFIG_KEY} must be a mapping of {[f.name for f in fields(SimKOParams)]}, got {raw!r}")
    known = {f.name for f in fields(SimKOParams)}
    unknown = sorted(set(raw) - known)
    if unknown:
        raise ValueError(f"unknown key(s) {[f'{CONFIG_KEY}.{k}' for k in unknown]}; known keys: {sorted(known)}")
    values = {k: raw[k] for k in raw}

    def number(name: str, *, integer: bool = False) -> float:
        value = values.get(name, getattr(SimKOParams, name))
        ok_types = (int,) if integer else (int, float)
        if isinstance(value, bool) or not isinstance(value, ok_types) or not math.isfinite(value):
            kind = "an integer" if integer else "a finite number"
            raise ValueError(f"{CONFIG_KEY}.{name} must be {kind}, got {value!r}")
        return value

    top_k = number("top_k", integer=True)
    if top_k < 1:
        raise ValueError(
            f"{CONFIG_KEY}.top_k must be an integer >= 1, got {top_k}; e.g. {CONFIG_KEY}.top_k={SimKOParams.top_k} "
            "(the default)"
        )
    alpha = float(number("alpha"))
    if not 0.0 <= alpha <= 1.0:
        raise ValueError(
            f"{CONFIG_KEY}.alpha must be in [0, 1], got {alpha}; e.g. {CONFIG_KEY}.alpha={SimKOParams.alpha} "
            "(the default)"
        )
    quantile = float(number("entropy_quantile"))
    if not 0.0 <= quantile <= 1.0:
        raise ValueError(
            f"{CONFIG_KEY}.entropy_quantile must be in [0, 1], got {quantile}; e.g. "
            f"{CONFIG_KEY}.entropy_quantile={SimKOParams.entropy_quantile} (the default)"
        )
    penalty = float(number("top1_penalty"))
    if penalty <= 0.0:
        raise ValueError(
            f"{CONFIG_KEY}.top1_penalty must be > 0, got {penalty}; e.g. "
            f"{CONFIG_KEY}.top1_penalty={SimKOParams.top1_penalty} (the default)"
        )
    return SimKOParams(top_k=int(top_k), alpha=alpha, entropy_quantile=quantile, top1_penalty=penalty)


def entropy_quantile_threshold(entropy: torch.Tensor, mask: torch.Tensor, q: float) -> torch.Tensor:
    """Per-row ``q``-quantile of ``entropy`` over the row's valid tokens, as ``torch.quantile`` (linear) computes it.

    Vectorized replacement of the authors' per-row loop ``row_quantile_masked`` (``core_algos.py`` line 317): one
    sort of the ``(bs, T)`` entropies with invalid entries pushed to +inf, then the same rank arithmetic as
    ``torch.quantile`` (rank ``q * (n - 1)`` in the input's dtype, ``lerp`` between the neighbours).

    Args:
        entropy: ``(bs, T)`` float, nats (detached by the caller or not: no gradient flows through the result).
        mask: ``(bs, T)`` bool or 0/1, valid tokens.
        q: quantile in [0, 1].

    Returns:
        ``(bs,)`` tensor in ``entropy``'s dtype; +inf for a row without valid tokens (no token is above it).
    """
    with torch.no_grad():
        valid = mask.bool()
        ent = entropy.detach()
        if not ent.is_floating_point():
            ent = ent.float()
        n = valid.sum(dim=-1, keepdim=True)  # (bs, 1)
        ordered = torch.where(valid, ent, torch.full_like(ent, math.inf)).sort(dim=-1).values
        ranks = torch.tensor(q, dtype=ent.dtype, device=ent.device) * (n - 1).clamp(min=0).to(ent.dtype)
        below = ranks.to(torch.long)
        above = ranks.ceil().to(torch.long)
        low = ordered.gather(-1, below)
        high = ordered.gather(-1, above)
        threshold = low.lerp(high, ranks - below.to(ent.dtype)).squeeze(-1)
        return torch.where(n.squeeze(-1) > 0, threshold, torch.full_like(threshold, math.inf))


@dataclass
class SimKOTerms:
    """What :func:`simko_terms` returns: the inputs of a PPO-clip loss plus SimKO's token masks.

    Attributes:
        log_prob: ``(bs, T)`` float, equal in value to the input ``log_prob``, with SimKO's gradient: pass it to the
            PPO-clip loss in place of ``log_prob``.
        advantages: ``(bs, T)`` the advantages, times ``top1_penalty`` at :attr:`penalized` tokens.
        forking: ``(bs, T)`` bool, valid tokens above their response's entropy quantile.
        smoothed: ``(bs, T)`` bool, forking tokens of positive responses (top-K smoothing applied).
        penalized: ``(bs, T)`` bool, forking tokens of negative responses whose sampled token is the top-1 token.
        threshold: ``(bs,)`` the per-response entropy threshold (nats; +inf for an empty response).
    """

    log_prob: torch.Tensor
    advantages: torch.Tensor
    forking: torch.Tensor
    smoothed: torch.Tensor
    penalized: torch.Tensor
    threshold: torch.Tensor


def simko_terms(
    log_prob: torch.Tensor,
    topk_log_probs: torch.Tensor,
    is_top1: torch.Tensor,
    entropy: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    params: SimKOParams,
) -> SimKOTerms:
    """SimKO's surrogate log-prob and advantages (see the module docstring for the formulas and the source).

    Args:
        log_prob: ``(bs, T)`` float, log pi_theta(o_t) of the sampled tokens under the current policy, with gradient.
        topk_log_probs: ``(bs, T, K)`` float, log pi_theta of the current policy's K most likely tokens at each
            position, with gradient (same temperature as ``log_prob``).
        is_top1: ``(bs, T)`` bool, the sampled token is the current policy's most likely token.
        entropy: ``(bs, T)`` float, token entropy of the current policy in nats (detached here).
        advantages: ``(bs, T)`` float, e.g. verl's GRPO advantages (0 outside ``response_mask``).
        response_mask: ``(bs, T)`` bool or 0/1.
        params: :class:`SimKOParams`.

    Returns:
        :class:`SimKOTerms`; ``log_prob`` and ``advantages`` keep the input dtypes.

    Raises:
        ValueError: ``topk_log_probs.shape[-1] != params.top_k`` or shapes that do not match ``(bs, T)``.
    """
    if topk_log_probs.dim() != 3 or topk_log_probs.shape[-1] != params.top_k:
        raise ValueError(
            f"topk_log_probs must be (bs, T, top_k={params.top_k}), got {tuple(topk_log_probs.shape)} "
            f"({CONFIG_KEY}.top_k must match the top-K the actor computed)"
        )
    shape = log_prob.shape
    for name, tensor in (
        ("topk_log_probs", topk_log_probs[..., 0]),
        ("is_top1", is_top1),
        ("entropy", entropy),
        ("advantages", advantages),
        ("response_mask", response_mask),
    ):
        if tensor.shape != shape:
            raise ValueError(f"SimKO: {name} has shape {tuple(tensor.shape)}, expected {tuple(shape)} like log_prob")

    mask = response_mask.bool()
    with torch.no_grad():
        threshold = entropy_quantile_threshold(entropy, mask, params.entropy_quantile)
        forking = (entropy.detach() > threshold.unsqueeze(-1).to(entropy.dtype)) & mask
        seq_advantage = (advantages.detach() * mask).sum(dim=-1, keepdim=True)
        smoothed = forking & (seq_advantage > 0)
        penalized = forking & (seq_advantage < 0) & is_top1.bool()

    # lp' = lp_t + alpha_t [mean_k (lp_k - sg lp_k) - (lp_t - sg lp_t)]: value lp_t, SimKO's gradient.
    topk_zero = (topk_log_probs - topk_log_probs.detach()).mean(dim=-1)
    own_zero = log_prob - log_prob.detach()
    alpha_t = smoothed.to(log_prob.dtype) * params.alpha
    surrogate = log_prob + alpha_t * (topk_zero.to(log_prob.dtype) - own_zero)

    if params.top1_penalty != 1.0:
        scale = torch.where(penalized, params.top1_penalty, 1.0).to(advantages.dtype)
        new_advantages = advantages * scale
    else:
        new_advantages = advantages
    return SimKOTerms(
        log_prob=surrogate,
        advantages=new_advantages,
        forking=forking,
        smoothed=smoothed,
        penalized=penalized,
        threshold=threshold,
    )


def simko_diagnostics(
    terms: SimKOTerms, topk_log_probs: torch.Tensor, is_top1: torch.Tensor, response_mask: torch.Tensor
) -> dict[str, float]:
    """Per-micro-batch diagnostics of :func:`simko_terms` (fractions of valid tokens; probabilities; nats).

    Returns:
        ``simko/forking_frac`` (forking tokens), ``simko/smoothed_frac`` (top-K smoothing applied),
        ``simko/penalized_frac`` (advantage times ``top1_penalty``), ``simko/top1_frac`` (sampled token is the
        top-1), ``simko/top1_prob_mean`` and ``simko/topk_prob_mass_mean`` (mean pi of the top-1 token and of the
        top-K tokens together), ``simko/entropy_threshold_mean`` (mean threshold over non-empty responses).
        Fractions and means are over the valid tokens of the micro-batch; an empty micro-batch gives 0.
    """
    with torch.no_grad():
        mask = response_mask.bool()
        n = mask.sum().clamp(min=1).float()
        probs = topk_log_probs.detach().float().exp()
        finite = torch.isfinite(terms.threshold)
        values = torch.stack(
            [
                terms.forking.sum() / n,
                terms.smoothed.sum() / n,
                terms.penalized.sum() / n,
                (is_top1.bool() & mask).sum() / n,
                (probs[..., 0] * mask).sum() / n,
                (probs.sum(dim=-1) * mask).sum() / n,
                torch.where(finite, terms.threshold.float(), 0.0).sum() / finite.sum().clamp(min=1),
            ]
        ).tolist()
    names = (
        "forking_frac",
        "smoothed_frac",
        "penalized_frac",
        "top1_frac",
        "top1_prob_mean",
        "topk_prob_mass_mean",
        "entropy_threshold_mean",
    )
    return {f"simko/{name}": value for name, value in zip(names, values, strict=True)}


def top_k_indices(scores: torch.Tensor, k: int) -> torch.Tensor:
    """The K largest entries of each row, with one tie rule on every device; no autograd.

    The rule: the set is the K largest values, ties at the K-th place going to the lowest indices (token ids);
    the order is value descending, then index ascending. So column 0 is ``torch.argmax``'s choice (the lowest
    index of the maximum). ``torch.topk`` alone does not fix this: which of several equal values it returns, and
    in which order, is unspecified and differs between CPU and CUDA (bf16 logits tie often: 9.5% of rows at the
    4th place and 3.9% at the top in a 4,096-token vocabulary, measured on an H200 run).

    How: ``torch.topk`` with K + 1 gives the K-th and (K+1)-th largest values (values are the same on every
    device; only the indices of equal values are not). Rows where the two are equal (a tie at the K-th place) are
    redone: the entries above ``v_K``, then the first ``K - #above`` entries equal to ``v_K`` by a cumulative count
    along the row. Last, the K indices are sorted ascending and then stably by value descending. Extra memory:
    ``(t, V)`` (bool, int32 and a copy in ``scores``' dtype) for the ``t`` tied rows only; no extra pass over the
    other rows. NaN ranks above every number, as in ``torch.topk`` (such a row's loss is NaN anyway).

    Args:
        scores: ``(n, V)`` float (e.g. scaled logits, any float dtype), no gradient needed.
        k: K, 1 <= K <= V.

    Returns:
        ``(n, K)`` long, indices into the last dimension.
    """
    with torch.no_grad():
        scores = scores.detach()
        vocab = scores.shape[-1]
        values, index = torch.topk(scores, k=min(k + 1, vocab), dim=-1)
        kth = values[:, k - 1 : k]  # (n, 1)
        index = index[:, :k].contiguous()
        # a tie at the K-th place: the (K+1)-th largest value equals the K-th (none when K = V: all are taken)
        tied = (values[:, k - 1] == values[:, k]).nonzero().squeeze(-1) if k < vocab else index.new_empty(0)
        if tied.numel():
            sub, sub_kth = scores[tied], kth[tied]  # (CPU: bf16 index_select is ~10x slower than indexing)
            above = (sub > sub_kth) | sub.isnan()  # NaN ranks above everything, as in torch.topk
            at = sub == sub_kth
            need = k - above.sum(dim=-1, keepdim=True)
            keep = above | (at & (at.cumsum(dim=-1, dtype=torch.int32) <= need))  # exactly K per row
            index.index_copy_(0, tied, keep.nonzero()[:, 1].view(-1, k))
        index = index.sort(dim=-1).values
        order = scores.gather(-1, index).sort(dim=-1, descending=True, stable=True).indices
        return index.gather(-1, order)


def topk_and_entropy(
    logits: torch.Tensor,
    top_k: int,
    temperature: torch.Tensor | None = None,
    rows: torch.Tensor | None = None,
    with_entropy: bool = False,
    chunk_size: int = 2048,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The top-K token indices of the (scaled) logits and, optionally, the entropy; no autograd, chunked.

    Args:
        logits: ``(M, V)`` raw logits (any float dtype).
        top_k: K >= 1.
        temperature: None for temperature 1, else ``(N,)`` float, one per used row; logits are divided by
            ``temperature.clamp(min=1e-8)`` cast to the logits' dtype, as verl 0.9.1 scales them
            (``verl/workers/engine/fsdp/transformer_impl.py::_scale_logits_by_temperature``).
        rows: optional ``(N,)`` long, the rows of ``logits`` to use (default all ``M``); the selected logits are
            never copied at once.
        with_entropy: also return the entropy (nats, float32) of the scaled logits, computed as
            ``log Z - sum_v e_v (s_v - max s) / Z`` with ``e = exp(s - max s)``, ``Z = sum e`` (one ``exp`` pass).
        chunk_size: rows per chunk (peak extra memory about ``3 x chunk_size x V`` float32).

    Returns:
        ``top_index`` ``(N, K)`` long and ``entropy`` ``(N,)`` float32 or None. ``top_index`` follows
        :func:`top_k_indices`'s tie rule on the scaled logits: value descending, then token id ascending, so it is
        the same on every device.
    """
    n = logits.shape[0] if rows is None else rows.shape[0]
    detached = logits.detach()
    top_index = torch.empty(n, top_k, dtype=torch.long, device=logits.device)
    entropy = torch.empty(n, dtype=torch.float32, device=logits.device) if with_entropy else None
    with torch.no_grad():
        for start in range(0, n, chunk_size):
            stop = min(start + chunk_size, n)
            chunk = detached[start:stop] if rows is None else detached.index_select(0, rows[start:stop])
            if temperature is not None:
                chunk = chunk / temperature[start:stop].reshape(-1, 1).clamp(min=1e-8).to(chunk.dtype)
            top_index[start:stop] = top_k_indices(chunk, top_k)
            if with_entropy:
                shifted = chunk.float()
                shifted = shifted - shifted.amax(dim=-1, keepdim=True)
                weights = shifted.exp()
                total = weights.sum(dim=-1)
                entropy[start:stop] = total.log() - torch.linalg.vecdot(weights, shifted) / total
    return top_index, entropy


class _GatherWithInplaceGrad(torch.autograd.Function):
    """``(alias, picked)`` with ``alias`` a view of ``logits`` and ``picked = logits2d[rows, index]``.

    Backward adds the gradient of ``picked`` into the gradient of ``alias`` in place, so the few gathered entries
    cost no second ``(M, V)`` gradient buffer (a plain gather's backward allocates one and adds it).
    """

    @staticmethod
    def forward(ctx, logits, rows, index):
        ctx.save_for_backward(rows, index)
        ctx.logits_shape = logits.shape
        flat = logits.detach().reshape(-1, logits.shape[-1])
        return logits.view_as(logits), flat[rows.unsqueeze(-1), index]

    @staticmethod
    def backward(ctx, grad_alias, grad_picked):
        rows, index = ctx.saved_tensors
        if grad_alias is None:
            grad_alias = grad_picked.new_zeros(ctx.logits_shape)
        elif not grad_alias.is_contiguous():
            grad_alias = grad_alias.contiguous()
        if grad_picked is not None:
            flat = grad_alias.view(-1, ctx.logits_shape[-1])
            flat.index_put_((rows.unsqueeze(-1).expand_as(index), index), grad_picked.to(flat.dtype), accumulate=True)
        return grad_alias, None, None


def gather_with_inplace_grad(
    logits: torch.Tensor, rows: torch.Tensor, index: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Gather ``logits.reshape(-1, V)[rows, index]`` and return it with an alias of ``logits`` to compute on.

    Everything downstream that should see ``logits`` must use the returned alias: its gradient then receives the
    gathered entries' gradient in place (no extra ``(M, V)`` buffer).

    Args:
        logits: ``(..., V)`` with gradient.
        rows: ``(N,)`` long, rows of ``logits.reshape(-1, V)``.
        index: ``(N, J)`` long, vocabulary indices per row.

    Returns:
        ``alias`` (same shape as ``logits``) and ``picked`` ``(N, J)`` in ``logits``' dtype, with gradient.
    """
    return _GatherWithInplaceGrad.apply(logits, rows, index)


def gaps_from_picked(
    picked: torch.Tensor, temperature: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(gaps, is_top1)`` from ``picked`` ``(N, 1 + K)`` = raw logits of [sampled token, top-1, ..., top-K].

    ``gaps`` ``(N, K)`` float32 = s_k - s_t of the scaled logits (with gradient); ``is_top1`` ``(N,)`` bool =
    ``s_t >= s_top1``: a sampled token whose scaled logit equals the row's maximum counts as top-1, whichever of
    the tied ids :func:`top_k_indices` put first (the values compared are the same on every device).

    With the sampled token's log-prob ``log p_t = s_t - logsumexp(s)`` that the actor computes anyway,
    ``log p_t + gaps`` are the top-K log-probs: the logsumexp is reused, and the logits are never copied K times
    (the authors expand them K times, ``dp_actor.py`` lines 209-222).
    """
    if temperature is not None:
        picked = picked / temperature.reshape(-1, 1).clamp(min=1e-8).to(picked.dtype)
    picked = picked.float()
    with torch.no_grad():
        is_top1 = picked[:, 0] >= picked[:, 1]
    return picked[:, 1:] - picked[:, :1], is_top1
