"""The plugin's seeded draws through vLLM's real ``TopKTopPSampler`` (``vllm/v1/sample/ops/topk_topp_sampler.py``).

No engine: the sampler object vLLM's CPU worker builds, called as the worker calls it (``sampler(logits,
generators, k, p)``), with the plugin's ``forward_cpu`` installed by ``import verl``.
"""

from __future__ import annotations

import math

import pytest
import torch
import verl  # noqa: F401  (loads the plugin, which patches vLLM's sampler at its import)

from capo_verl.cpu import vllm_cpu

pytestmark = pytest.mark.timeout(600)

V = 49_152  # SmolLM2's vocabulary

#: a seed whose first key (torch.randint of the request's generator, as the patched forward_cpu draws it) made the
#: former 24-bit noise exactly -0.0 at entry 43009: the race computed 0 / -0.0 = NaN there and argmax drew it.
OLD_ZERO_NOISE_SEED, OLD_ZERO_NOISE_ENTRY = 910, 43009


def _sampler(**kwargs):
    from vllm.v1.sample.ops.topk_topp_sampler import TopKTopPSampler

    sampler = TopKTopPSampler(**kwargs)
    assert sampler.forward.__func__.__code__.co_filename == vllm_cpu.__file__  # the plugin's forward_cpu
    return sampler


def _old_24_bit_u(key: int, index: int) -> float:
    """The former noise's uniform: top 24 bits of splitmix64, plus one, over 2^24 (in (0, 1])."""
    x = (key % 2**64 + (index + 1) * 0x9E3779B97F4A7C15) % 2**64
    x ^= x >> 30
    x = x * 0xBF58476D1CE4E5B9 % 2**64
    x ^= x >> 27
    x = x * 0x94D049BB133111EB % 2**64
    x ^= x >> 31
    return ((x >> 40) + 1) / 2**24


def test_a_key_that_made_the_old_noise_zero_draws_inside_top_k():
    key = torch.randint(
        -(2**63), 2**63 - 1, (), dtype=torch.int64, generator=torch.Generator().manual_seed(OLD_ZERO_NOISE_SEED)
    )
    assert _old_24_bit_u(int(key), OLD_ZERO_NOISE_ENTRY) == 1.0  # the case the fix is about
    logits = torch.randn(1, V, generator=torch.Generator().manual_seed(1))
    logits[0, OLD_ZERO_NOISE_ENTRY] = -20.0  # far outside the top 50
    support = set(logits[0].topk(50).indices.tolist())
    for fp64 in (False, True):
        generators = {0: torch.Generator().manual_seed(OLD_ZERO_NOISE_SEED)}
        token, _ = _sampler(use_fp64_gumbel=fp64)(logits.clone(), generators, torch.tensor([50]), None)
        assert int(token[0]) in support, (fp64, int(token[0]))


@pytest.mark.parametrize("cut", ["top_k", "top_p"])
def test_no_seeded_draw_falls_outside_the_top_k_or_top_p_support(cut):
    # With 24-bit noise a zero-probability entry won at (zero entries) / 2^24 per draw: 0.29% here, about 12 in
    # 4,000 draws (P(none) = e^-12). Keys from a fresh generator per request, as vLLM seeds them.
    sampler = _sampler(logprobs_mode="processed_logprobs")
    rows, draws = 200, 4000
    gen = torch.Generator().manual_seed(7)
    logits = torch.randn(rows, V, generator=gen) * 3
    k = torch.full((rows,), 50) if cut == "top_k" else None
    p = torch.full((rows,), 0.5) if cut == "top_p" else None
    from vllm.v1.sample.ops.topk_topp_sampler import apply_top_k_top_p

    allowed = torch.isfinite(apply_top_k_top_p(logits.clone(), k, p))
    assert int((~allowed).sum(dim=1).min()) > 40_000  # most entries are masked
    outside = 0
    for start in range(0, draws, rows):
        generators = {i: torch.Generator().manual_seed(start + i) for i in range(rows)}
        tokens, logprobs = sampler(logits.clone(), generators, k, p)
        outside += int((~allowed.gather(1, tokens[:, None])).sum())
        assert bool(torch.isfinite(logprobs.gather(1, tokens[:, None])).all())
    assert outside == 0


def test_noise_is_never_zero_or_infinite_and_its_tail_is_exponential():
    # the smallest and largest uniforms the 53-bit grid can produce map to finite, positive noise
    keys = torch.randint(-(2**63), 2**63 - 1, (64,), generator=torch.Generator().manual_seed(3))
    for dtype in (torch.float32, torch.float64):
        q = vllm_cpu.exponential_noise(keys, V, dtype)
        assert q.dtype == dtype and bool(torch.isfinite(q).all()) and bool((q > 0).all())
    assert -math.log(1 - 2**-53) > 0 and math.isfinite(-math.log(2**-53))
    # P(q < t) = 1 - e^-t: at t = 1e-6 the 24-bit noise gave 16 / 2^24 = 0.954e-6 (and q = 0 at u = 1)
    n, t, hits = 0, 1e-6, 0
    gen = torch.Generator().manual_seed(11)
    while n < 200_000_000:
        q = vllm_cpu.exponential_noise(torch.randint(-(2**63), 2**63 - 1, (400,), generator=gen), 250_000)
        hits += int((q < t).sum())
        n += q.numel()
    expected = n * -math.expm1(-t)  # 200
    assert abs(hits - expected) <= 4 * math.sqrt(expected), (hits, expected)


def test_a_token_of_probability_1e6_is_drawn_at_its_rate_through_the_sampler():
    # one row: a token of probability 1e-6 per entry of a rare block, the rest on one token; over many rows the
    # rare block (1,000 entries, 1e-3 in all) is drawn at 1e-3 within its sampling error
    sampler = _sampler()
    m, p_rare = 1000, 1e-6
    probs = torch.full((m + 1,), p_rare, dtype=torch.float64)
    probs[0] = 1 - m * p_rare
    logits = probs.log().float()
    rows, batches = 500, 400  # 200,000 draws, 200 expected
    rare = 0
    for b in range(batches):
        generators = {i: torch.Generator().manual_seed(b * rows + i) for i in range(rows)}
        tokens, _ = sampler(logits.expand(rows, -1).clone(), generators, None, None)
        rare += int((tokens != 0).sum())
    expected = rows * batches * m * p_rare
    assert abs(rare - expected) <= 4 * math.sqrt(expected), (rare, expected)


def test_use_fp64_gumbel_draws_float64_noise(monkeypatch):
    seen = []
    original = vllm_cpu.exponential_noise

    def spy(keys, vocab_size, dtype=torch.float32):
        seen.append(dtype)
        return original(keys, vocab_size, dtype)

    monkeypatch.setattr(vllm_cpu, "exponential_noise", spy)
    logits = torch.randn(2, 100)
    for fp64 in (False, True):
        _sampler(use_fp64_gumbel=fp64)(logits.clone(), {0: torch.Generator().manual_seed(0)}, None, None)
    assert seen == [torch.float32, torch.float64]
