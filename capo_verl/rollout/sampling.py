"""Batched token-in/token-out sampling with a transformers causal LM: the engine of the ``hf`` rollout.

One call of :func:`generate_batch` decodes a batch of prompts of different lengths, each with its own sampling
parameters (temperature, top-k, top-p, repetition penalty, max tokens, stop tokens), with one KV cache and one
forward pass per generated position; a row that has stopped leaves the batch and the cache, so the remaining rows
decode without it (responses of very different lengths cost the tokens they have, not batch x longest). It returns
the response tokens and, per token, the log-probability the rollout reports to verl (``rollout_log_probs``).

Log-probabilities (what vLLM calls ``logprobs_mode``; verl's default is ``processed_logprobs``):

- ``processed_logprobs``: ``log_softmax(logits / T)`` over the full vocabulary, float32, where ``logits`` are the
  model's logits after the repetition penalty (if any) and ``T`` the request's temperature (``T = 1`` for greedy
  requests). This is what verl's actor computes for ``old_log_probs`` (``logits / temperature``, then
  log-softmax), so ``training/rollout_probs_diff_*`` measures only weight/numeric drift. It differs from vLLM's
  processed mode only when top-k/top-p truncation is on (vLLM renormalises over the kept tokens; here the
  truncation changes which token is drawn, not the reported log-prob).
- ``raw_logprobs``: ``log_softmax(logits)`` of the unmodified model logits (temperature 1).

Sampling follows vLLM's order: repetition penalty, temperature, top-k, top-p, then a draw from the remaining
distribution (greedy rows: argmax of the penalised logits). Left padding is used for the prompts, with explicit
``position_ids`` so padded rows decode exactly like unpadded ones.

The draw is by inverse CDF: row i at response position t takes the first token whose cumulative probability
(float64) exceeds ``u[i, t]``, one uniform per row and position. With ``seeds`` every row draws its uniforms from a
generator of its own, so a row's response depends on its seed and its own logits only, not on which other requests
share its batch or in which order they came (up to float rounding of the batched forward pass).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch

LOGPROBS_MODES = ("processed_logprobs", "raw_logprobs")


@dataclass
class SamplingSpec:
    """Sampling parameters of one request (the subset of vLLM's ``SamplingParams`` verl sends).

    Attributes:
        max_tokens: maximum number of response tokens, >= 1.
        temperature: >= 0; 0 means greedy.
        top_k: keep the k most likely tokens; -1 or 0 = off.
        top_p: nucleus mass in (0, 1]; 1 = off.
        repetition_penalty: > 0; 1 = off (HF/vLLM rule: positive logits of seen tokens are divided by it,
            negative ones multiplied).
        stop_token_ids: tokens that end the response (included in it), on top of the model's EOS ids.
        ignore_eos: do not stop at the model's EOS ids.
    """

    max_tokens: int
    temperature: float = 1.0
    top_k: int = -1
    top_p: float = 1.0
    repetition_penalty: float = 1.0
    stop_token_ids: tuple[int, ...] = ()
    ignore_eos: bool = False

    def __post_init__(self):
        if int(self.max_tokens) < 1:
            raise ValueError(f"max_tokens must be >= 1, got {self.max_tokens}")
        if not self.temperature >= 0 or not math.isfinite(self.temperature):
            raise ValueError(f"temperature must be finite and >= 0, got {self.temperature}")
        if not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if not self.repetition_penalty > 0:
            raise ValueError(f"repetition_penalty must be > 0, got {self.repetition_penalty}")
        self.max_tokens = int(self.max_tokens)
        self.top_k = int(self.top_k)


@dataclass
class SampleOutput:
    """Result for one request.

    Attributes:
        token_ids: response token ids (a stop token, if hit, is the last one).
        log_probs: one float per token (nats), see the module docstring; empty if not asked for.
        finish_reason: ``"stop"`` (EOS/stop token), ``"length"`` (max_tokens) or ``"abort"``.
    """

    token_ids: list[int] = field(default_factory=list)
    log_probs: list[float] = field(default_factory=list)
    finish_reason: str = "length"


def _apply_repetition_penalty(logits: torch.Tensor, seen: torch.Tensor, penalty: torch.Tensor) -> torch.Tensor:
    """``logits`` (B, V) float32; ``seen`` (B, V) bool; ``penalty`` (B,) float32 -> penalised copy."""
    p = penalty[:, None]
    penalised = torch.where(logits > 0, logits / p, logits * p)
    return torch.where(seen, penalised, logits)


def _inverse_cdf(probs: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """One draw per row from ``probs`` (B, V) (rows sum to 1, zeros allowed) with uniforms ``u`` (B,) in [0, 1).

    Returns (B,) int64: the first index whose cumulative probability (float64) exceeds ``u`` times the row's total,
    so a zero-probability token is never drawn, also for ``u = 0`` or a total rounded below 1.
    """
    cdf = probs.double().cumsum(dim=-1)
    target = (u.to(cdf) * cdf[:, -1])[:, None]
    index = torch.searchsorted(cdf, target, right=True).squeeze(-1)
    # right=True never lands on a zero-probability token inside the CDF; only a target rounded up to the row's
    # total runs past the end, and then the draw is the last token with mass (rare: no extra pass otherwise)
    past_end = index >= probs.shape[-1]
    if bool(past_end.any()):
        last_positive = probs.shape[-1] - 1 - (probs > 0).flip(-1).int().argmax(dim=-1)
        index = torch.where(past_end, last_positive, index)
    return index


def _sample(
    logits: torch.Tensor,
    temperature: torch.Tensor,
    top_k: torch.Tensor,
    top_p: torch.Tensor,
    greedy: torch.Tensor,
    u: torch.Tensor,
) -> torch.Tensor:
    """Draw one token per row. ``logits`` (B, V) float32; per-row (B,) parameters and uniforms ``u`` (B,) float64
    -> (B,) int64 token ids."""
    batch, vocab = logits.shape
    next_tokens = logits.argmax(dim=-1)
    if bool(greedy.all()):
        return next_tokens
    temp = torch.where(greedy, torch.ones_like(temperature), temperature)
    scaled = logits / temp[:, None]
    use_k = (top_k > 0) & (top_k < vocab)
    use_p = top_p < 1.0
    if bool(use_k.any()) or bool(use_p.any()):
        sorted_logits, sorted_idx = scaled.sort(dim=-1, descending=True)
        ranks = torch.arange(vocab, device=logits.device)[None, :]
        k = torch.where(use_k, top_k, torch.full_like(top_k, vocab))
        drop = ranks >= k[:, None]
        sorted_logits = sorted_logits.masked_fill(drop, float("-inf"))
        probs = sorted_logits.softmax(dim=-1)
        # nucleus: drop a token when the mass of the tokens before it already reaches top_p (keeps >= 1 token)
        mass_before = probs.cumsum(dim=-1) - probs
        drop_p = (mass_before >= top_p[:, None]) & use_p[:, None]
        sorted_logits = sorted_logits.masked_fill(drop_p, float("-inf"))
        probs = sorted_logits.softmax(dim=-1)
        choice = _inverse_cdf(probs, u)
        sampled = sorted_idx.gather(-1, choice[:, None]).squeeze(-1)
    else:
        sampled = _inverse_cdf(scaled.softmax(dim=-1), u)
    return torch.where(greedy, next_tokens, sampled)


@torch.inference_mode()
def generate_batch(
    model: torch.nn.Module,
    prompts: Sequence[Sequence[int]],
    specs: Sequence[SamplingSpec],
    *,
    eos_token_ids: Sequence[int],
    pad_token_id: int,
    want_log_probs: Sequence[bool] | bool = True,
    logprobs_mode: str = "processed_logprobs",
    generator: torch.Generator | None = None,
    seeds: Sequence[int] | None = None,
    should_abort: Callable[[], bool] | None = None,
) -> list[SampleOutput]:
    """Decode ``prompts`` together with one KV cache; one forward pass per generated position, over the rows
    still decoding (a row that stops leaves the batch and the cache).

    Args:
        model: a transformers causal LM (``forward(input_ids, attention_mask, position_ids, past_key_values,
            use_cache)`` returning ``.logits`` (B, L, V) and ``.past_key_values``), in eval mode, on its device.
        prompts: B token-id lists, each non-empty; lengths may differ (left-padded here).
        specs: B :class:`SamplingSpec`, one per prompt.
        eos_token_ids: ids that end a response unless the request sets ``ignore_eos``.
        pad_token_id: id of the prompts' left padding.
        want_log_probs: per row (or for all rows) whether to return log-probs.
        logprobs_mode: ``processed_logprobs`` or ``raw_logprobs`` (module docstring).
        generator: CPU RNG for the draws of the whole batch, for reproducible sampling (not with ``seeds``).
        seeds: B integer seeds, one per row: row i's draws come from a generator seeded with ``seeds[i]``
            (module docstring), so its response does not depend on the rest of the batch.
        should_abort: polled before every step; when it returns True decoding stops and every unfinished row
            is returned with ``finish_reason="abort"`` and the tokens it has so far.

    Returns:
        B :class:`SampleOutput`, in the order of ``prompts``.

    Raises:
        ValueError: empty prompt, ``len(specs) != len(prompts)`` or ``len(seeds) != len(prompts)``, both
            ``generator`` and ``seeds`` given, unknown ``logprobs_mode``.
    """
    if logprobs_mode not in LOGPROBS_MODES:
        raise ValueError(
            f"actor_rollout_ref.rollout.logprobs_mode={logprobs_mode!r} is not supported by the hf rollout; "
            f"use one of {LOGPROBS_MODES}"
        )
    batch = len(prompts)
    if len(specs) != batch:
        raise ValueError(f"got {batch} prompts but {len(specs)} sampling specs")
    if batch == 0:
        return []
    if any(len(p) == 0 for p in prompts):
        raise ValueError("every prompt needs at least one token")
    if isinstance(want_log_probs, bool):
        want_log_probs = [want_log_probs] * batch
    if seeds is not None and generator is not None:
        raise ValueError("give either one generator for the batch or one seed per row, not both")
    if seeds is not None and len(seeds) != batch:
        raise ValueError(f"got {batch} prompts but {len(seeds)} seeds")

    device = next(model.parameters()).device
    lengths = [len(p) for p in prompts]
    width = max(lengths)
    input_ids = torch.full((batch, width), pad_token_id, dtype=torch.long, device=device)
    attention_mask = torch.zeros((batch, width), dtype=torch.long, device=device)
    for i, p in enumerate(prompts):
        input_ids[i, width - len(p) :] = torch.as_tensor(list(p), dtype=torch.long, device=device)
        attention_mask[i, width - len(p) :] = 1
    position_ids = (attention_mask.cumsum(-1) - 1).clamp(min=0)

    f32 = dict(dtype=torch.float32, device=device)
    temperature = torch.tensor([s.temperature for s in specs], **f32)
    greedy = temperature == 0
    top_k = torch.tensor([s.top_k for s in specs], dtype=torch.long, device=device)
    top_p = torch.tensor([s.top_p for s in specs], **f32)
    penalty = torch.tensor([s.repetition_penalty for s in specs], **f32)
    use_penalty = bool((penalty != 1.0).any())
    lp_temperature = torch.where(greedy, torch.ones_like(temperature), temperature)
    if logprobs_mode == "raw_logprobs":
        lp_temperature = torch.ones_like(temperature)
    max_tokens = torch.tensor([s.max_tokens for s in specs], dtype=torch.long, device=device)
    # (B, max_tokens) uniforms of the draws, made up front on the CPU (float64)
    horizon = int(max_tokens.max())
    if seeds is not None:
        uniforms = torch.stack([
            torch.rand(horizon, dtype=torch.float64, generator=torch.Generator().manual_seed(int(seed)))
            for seed in seeds
        ])
    else:
        uniforms = torch.rand((batch, horizon), dtype=torch.float64, generator=generator)
    uniforms = uniforms.to(device)

    vocab = None
    seen = None
    eos = set(int(t) for t in eos_token_ids)
    stop_sets = [set(s.stop_token_ids) | (set() if s.ignore_eos else eos) for s in specs]

    outputs = [SampleOutput() for _ in range(batch)]
    active = list(range(batch))  # original index of each row still decoding; finished rows leave the batch
    past = None
    step_ids, step_mask, step_pos = input_ids, attention_mask, position_ids
    for step in range(horizon):
        if should_abort is not None and should_abort():
            for i in active:
                outputs[i].finish_reason = "abort"
            break
        out = model(
            input_ids=step_ids,
            attention_mask=step_mask,
            position_ids=step_pos,
            past_key_values=past,
            use_cache=True,
        )
        past = out.past_key_values
        raw = out.logits[:, -1, :].float()
        if vocab is None:
            vocab = raw.shape[-1]
            if use_penalty:
                seen = torch.zeros((batch, vocab), dtype=torch.bool, device=device)
                for i, p in enumerate(prompts):
                    seen[i, torch.as_tensor([t for t in p if t < vocab], dtype=torch.long, device=device)] = True
        logits = _apply_repetition_penalty(raw, seen, penalty) if use_penalty else raw
        tokens = _sample(logits, temperature, top_k, top_p, greedy, uniforms[:, step])
        lp_source = (raw if logprobs_mode == "raw_logprobs" else logits) / lp_temperature[:, None]
        token_lp = lp_source.gather(-1, tokens[:, None]).squeeze(-1) - lp_source.logsumexp(dim=-1)

        keep = []
        for j, (i, tok, lp) in enumerate(zip(active, tokens.tolist(), token_lp.tolist())):
            outputs[i].token_ids.append(tok)
            if want_log_probs[i]:
                outputs[i].log_probs.append(lp)
            if tok in stop_sets[i]:
                outputs[i].finish_reason = "stop"
            elif len(outputs[i].token_ids) >= specs[i].max_tokens:
                outputs[i].finish_reason = "length"
            else:
                keep.append(j)
        if not keep:
            break
        if use_penalty:
            seen[torch.arange(len(active), device=device), tokens.clamp(max=vocab - 1)] = True
        if len(keep) < len(active):  # drop the finished rows from the batch and the KV cache
            rows = torch.tensor(keep, dtype=torch.long, device=device)
            past.reorder_cache(rows)
            active = [active[j] for j in keep]
            tokens, step_mask, step_pos, uniforms = tokens[rows], step_mask[rows], step_pos[rows], uniforms[rows]
            temperature, greedy, top_k, top_p = temperature[rows], greedy[rows], top_k[rows], top_p[rows]
            penalty, lp_temperature = penalty[rows], lp_temperature[rows]
            if use_penalty:
                seen = seen[rows]
        step_ids = tokens[:, None]
        step_mask = torch.cat([step_mask, torch.ones((len(active), 1), dtype=torch.long, device=device)], dim=-1)
        step_pos = step_pos[:, -1:] + 1
    return outputs
