"""SimKO's loss math (capo_verl/losses/simko.py) against the authors' code and a hand computation.

The reference functions below (``_authors_row_quantile_masked``, ``_authors_simko_loss``) are transcriptions of
CLR-Lab/SimKO@306f4ff4e84ace53e92501939692fcfeb32596b5 ``verl/trainer/ppo/core_algos.py`` (``row_quantile_masked``
and ``compute_policy_loss_simko``), including the old policy's top-K log-probs that capo-verl does not compute.
"""

from __future__ import annotations

import math
import re

import pytest
import torch

from capo_verl.losses.simko import (
    SimKOParams,
    entropy_quantile_threshold,
    gaps_from_picked,
    gather_with_inplace_grad,
    parse_simko_config,
    simko_diagnostics,
    simko_terms,
    top_k_indices,
    topk_and_entropy,
)


# --- the authors' code, transcribed ------------------------------------------------------------------------------
def _authors_row_quantile_masked(x, mask, q):
    qs = []
    for b in range(x.shape[0]):
        xb = x[b][mask[b]]
        if xb.numel() == 0:
            xb = x[b]
        qs.append(torch.quantile(xb, q))
    return torch.stack(qs, dim=0)


def _masked_mean(values, mask):
    return (values * mask).sum() / mask.sum()


def _authors_simko_loss(
    old_log_prob,
    old_log_probs_topk,
    log_prob,
    topk_log_probs,
    entropy,
    advantages,
    eos_mask,
    cliprange,
    token_level_scores,
    max_token,
    mix_topk_coef,
    tau,
):
    correct_idx = token_level_scores.sum(-1) == 1
    K = topk_log_probs.size(-1)
    log_prob_diff_bar = log_prob - old_log_prob
    log_prob_diff_topk = topk_log_probs - old_log_probs_topk
    numerator = torch.exp(log_prob_diff_bar.detach())
    denominator = torch.exp(log_prob_diff_topk.detach())
    top_i_terms = (numerator.unsqueeze(-1) / (denominator + 1e-8)) * torch.exp(log_prob_diff_topk)
    topk_sum = top_i_terms.sum(dim=-1)
    B, T = log_prob.shape
    has_label = correct_idx.view(B, 1).expand(B, T)
    eos_mask_bool = eos_mask > 0
    threshold = _authors_row_quantile_masked(entropy, eos_mask_bool, q=tau).view(-1, 1)
    w = (entropy > threshold).float()
    mix_topk_pos = mix_topk_coef * w * eos_mask_bool
    mix_main_pos = 1.0 - mix_topk_pos
    correct_mask = has_label & eos_mask_bool
    ratio = torch.exp(log_prob - old_log_prob)
    ratio = torch.where(correct_mask, mix_main_pos * ratio + (mix_topk_pos / float(K)) * topk_sum, ratio)
    neg_mask = (advantages.sum(dim=-1) < 0).unsqueeze(-1)
    neg_mask = (max_token > 0) & neg_mask & (entropy > threshold)
    advantages = advantages * torch.ones_like(advantages).masked_fill(neg_mask, 1.1)
    pg_losses = -advantages * ratio
    pg_losses2 = -advantages * torch.clamp(ratio, 1.0 - cliprange, 1.0 + cliprange)
    return _masked_mean(torch.max(pg_losses, pg_losses2), eos_mask)


def _ppo_clip_token_mean(old_log_prob, log_prob, advantages, mask, clip):
    """verl 0.2's PPO-clip (what the authors' SimKO loss reduces to without SimKO), token-mean."""
    ratio = torch.exp(log_prob - old_log_prob)
    losses = torch.max(-advantages * ratio, -advantages * torch.clamp(ratio, 1 - clip, 1 + clip))
    return _masked_mean(losses, mask)


# --- config ----------------------------------------------------------------------------------------------------------
def test_config_defaults_are_the_authors_qwen_math_7b_values():
    assert parse_simko_config(None) == SimKOParams(top_k=3, alpha=0.01, entropy_quantile=0.8, top1_penalty=1.1)
    assert parse_simko_config({"top_k": 5, "alpha": 0.1}) == SimKOParams(top_k=5, alpha=0.1)


@pytest.mark.parametrize(
    "raw, key",
    [
        ({"top_k": 0}, "simko.top_k"),
        ({"top_k": 2.5}, "simko.top_k"),
        ({"top_k": True}, "simko.top_k"),
        ({"alpha": 1.5}, "simko.alpha"),
        ({"alpha": "0.1"}, "simko.alpha"),
        ({"entropy_quantile": -0.1}, "simko.entropy_quantile"),
        ({"entropy_quantile": float("nan")}, "simko.entropy_quantile"),
        ({"top1_penalty": 0.0}, "simko.top1_penalty"),
        ({"mix_topk_coef": 0.01}, "simko.mix_topk_coef"),
    ],
)
def test_config_errors_name_the_key(raw, key):
    with pytest.raises(ValueError, match=re.escape(f"actor_rollout_ref.actor.policy_loss.{key}")):
        parse_simko_config(raw)


# --- entropy gate ----------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("q", [0.0, 0.3, 0.8, 0.95, 1.0])
def test_entropy_threshold_equals_the_authors_per_row_torch_quantile(q):
    g = torch.Generator().manual_seed(0)
    entropy = torch.rand(17, 23, generator=g) * 3
    entropy[3, :10] = 1.25  # ties
    mask = torch.rand(17, 23, generator=g) > 0.3
    mask[5] = False
    mask[6] = False
    mask[6, 4] = True  # a single valid token
    ours = entropy_quantile_threshold(entropy, mask, q)
    ref = _authors_row_quantile_masked(entropy, mask, q)
    nonempty = mask.any(-1)
    assert torch.equal(ours[nonempty], ref[nonempty])  # bit-identical, so `entropy > threshold` agrees
    assert torch.isinf(ours[~nonempty]).all()  # an empty response has no forking token


# --- the loss on a tiny vocabulary -----------------------------------------------------------------------------------
V, K, CLIP = 5, 2, 0.2


def _tiny_batch(seed: int = 0):
    """Two responses of one group (correct, incorrect) over a 5-token vocabulary; logits are the leaf."""
    g = torch.Generator().manual_seed(seed)
    bs, T = 2, 6
    logits = (torch.randn(bs, T, V, generator=g) * 1.5).requires_grad_(True)
    old_logits = logits.detach() + 0.05 * torch.randn(bs, T, V, generator=g)  # inside the clip range
    tokens = torch.randint(0, V, (bs, T), generator=g)
    tokens[0, 1] = logits[0, 1].argmax()  # make sure both outcomes have top-1 tokens
    tokens[1, 2] = logits[1, 2].argmax()
    tokens[1, 4] = logits[1, 4].argmax()
    mask = torch.ones(bs, T, dtype=torch.bool)
    mask[1, 5] = False
    scores = torch.tensor([[0, 0, 0, 0, 0, 1.0], [0, 0, 0, 0, 0, 0]])  # response 0 correct, 1 incorrect
    adv = torch.tensor([0.5, -0.5]).view(2, 1) * mask  # GRPO: R_i - mean(R)
    return logits, old_logits, tokens, mask, scores, adv


def _inputs(logits, old_logits, tokens):
    logp_all = torch.log_softmax(logits, dim=-1)
    log_prob = logp_all.gather(-1, tokens.unsqueeze(-1)).squeeze(-1)
    top_index = logits.detach().topk(K, dim=-1).indices
    topk_log_probs = logp_all.gather(-1, top_index)
    old_all = torch.log_softmax(old_logits, dim=-1)
    old_log_prob = old_all.gather(-1, tokens.unsqueeze(-1)).squeeze(-1)
    old_topk = old_all.gather(-1, old_logits.topk(K, dim=-1).indices)  # the authors' old_log_probs_topk
    probs = logp_all.detach().exp()
    entropy = -(probs * logp_all.detach()).sum(-1)
    is_top1 = tokens == logits.detach().argmax(-1)
    return log_prob, topk_log_probs, old_log_prob, old_topk, entropy, is_top1


def _ours(logits, old_logits, tokens, mask, adv, params):
    log_prob, topk, old_log_prob, _, entropy, is_top1 = _inputs(logits, old_logits, tokens)
    terms = simko_terms(log_prob, topk, is_top1, entropy, adv, mask, params)
    return terms, _ppo_clip_token_mean(old_log_prob, terms.log_prob, terms.advantages, mask, CLIP)


def test_loss_value_equals_ppo_and_gradient_equals_the_authors_code():
    logits, old_logits, tokens, mask, scores, adv = _tiny_batch()
    params = SimKOParams(top_k=K, alpha=0.3, entropy_quantile=0.5, top1_penalty=1.1)
    terms, loss = _ours(logits, old_logits, tokens, mask, adv, params)
    assert terms.forking.any() and terms.smoothed.any() and terms.penalized.any()

    # value: PPO-clip with the penalised advantages (the smoothing does not change the value)
    log_prob, topk, old_log_prob, old_topk, entropy, is_top1 = _inputs(logits, old_logits, tokens)
    assert torch.equal(terms.log_prob, log_prob)
    assert loss.item() == pytest.approx(
        _ppo_clip_token_mean(old_log_prob, log_prob, terms.advantages, mask, CLIP).item(), abs=0
    )
    (grad,) = torch.autograd.grad(loss, logits)

    # the authors' loss, with their old top-K log-probs and epsilon
    ref = _authors_simko_loss(
        old_log_prob,
        old_topk,
        log_prob,
        topk,
        entropy,
        adv,
        mask.float(),
        CLIP,
        scores,
        is_top1.float(),
        params.alpha,
        params.entropy_quantile,
    )
    (ref_grad,) = torch.autograd.grad(ref, logits)
    assert loss.item() == pytest.approx(ref.item(), rel=1e-6)
    torch.testing.assert_close(grad, ref_grad, rtol=1e-5, atol=1e-7)

    # without SimKO the gradient differs exactly at the smoothed / penalised tokens
    log_prob, _, old_log_prob, _, _, _ = _inputs(logits, old_logits, tokens)
    plain = _ppo_clip_token_mean(old_log_prob, log_prob, adv, mask, CLIP)
    (plain_grad,) = torch.autograd.grad(plain, logits)
    changed = (grad - plain_grad).abs().amax(-1) > 1e-9
    assert torch.equal(changed, terms.smoothed | terms.penalized)


def test_gradient_matches_the_closed_form_by_hand():
    """d loss / d logits at an unclipped token: -A r_t [(1 - a) (e_t - p) + (a / K) sum_k (e_k - p)] / n_tokens."""
    logits, old_logits, tokens, mask, _, adv = _tiny_batch(seed=1)
    params = SimKOParams(top_k=K, alpha=0.25, entropy_quantile=0.4, top1_penalty=1.3)
    terms, loss = _ours(logits, old_logits, tokens, mask, adv, params)
    (grad,) = torch.autograd.grad(loss, logits)

    with torch.no_grad():
        p = torch.softmax(logits, -1)
        old_p = torch.softmax(old_logits, -1)
        r = p.gather(-1, tokens.unsqueeze(-1)).squeeze(-1) / old_p.gather(-1, tokens.unsqueeze(-1)).squeeze(-1)
        assert ((r - 1).abs() < CLIP).all()  # nothing clipped: the closed form holds everywhere
        n = mask.sum()
        expected = torch.zeros_like(logits)
        top_index = logits.topk(K, dim=-1).indices
        for b in range(logits.shape[0]):
            for t in range(logits.shape[1]):
                if not mask[b, t]:
                    continue
                a = params.alpha if terms.smoothed[b, t] else 0.0
                A = adv[b, t] * (params.top1_penalty if terms.penalized[b, t] else 1.0)
                e_t = torch.nn.functional.one_hot(tokens[b, t], V).float()
                direction = (1 - a) * (e_t - p[b, t])
                for k in top_index[b, t]:
                    direction += a / K * (torch.nn.functional.one_hot(k, V).float() - p[b, t])
                expected[b, t] = -A * r[b, t] * direction / n
    torch.testing.assert_close(grad, expected, rtol=1e-5, atol=1e-7)


def test_alpha_zero_and_penalty_one_is_plain_ppo():
    logits, old_logits, tokens, mask, _, adv = _tiny_batch(seed=2)
    params = SimKOParams(top_k=K, alpha=0.0, entropy_quantile=0.5, top1_penalty=1.0)
    _, loss = _ours(logits, old_logits, tokens, mask, adv, params)
    (grad,) = torch.autograd.grad(loss, logits)
    log_prob, _, old_log_prob, _, _, _ = _inputs(logits, old_logits, tokens)
    (plain_grad,) = torch.autograd.grad(_ppo_clip_token_mean(old_log_prob, log_prob, adv, mask, CLIP), logits)
    assert torch.equal(grad, plain_grad)


def test_simko_terms_rejects_a_top_k_mismatch():
    logits, old_logits, tokens, mask, _, adv = _tiny_batch()
    log_prob, topk, _, _, entropy, is_top1 = _inputs(logits, old_logits, tokens)
    with pytest.raises(ValueError, match=r"top_k=3.*policy_loss\.simko\.top_k"):
        simko_terms(log_prob, topk, is_top1, entropy, adv, mask, SimKOParams(top_k=3))


def test_diagnostics():
    logits, old_logits, tokens, mask, _, adv = _tiny_batch()
    params = SimKOParams(top_k=K, alpha=0.3, entropy_quantile=0.5)
    log_prob, topk, _, _, entropy, is_top1 = _inputs(logits, old_logits, tokens)
    terms = simko_terms(log_prob, topk, is_top1, entropy, adv, mask, params)
    d = simko_diagnostics(terms, topk, is_top1, mask)
    n = mask.sum().item()
    assert d["simko/forking_frac"] == pytest.approx(terms.forking.sum().item() / n)
    assert d["simko/smoothed_frac"] == pytest.approx(terms.smoothed.sum().item() / n)
    assert d["simko/penalized_frac"] == pytest.approx(terms.penalized.sum().item() / n)
    assert d["simko/top1_frac"] == pytest.approx((is_top1 & mask).sum().item() / n)
    probs = torch.softmax(logits.detach(), -1)
    top1 = probs.max(-1).values
    assert d["simko/top1_prob_mean"] == pytest.approx(top1[mask].mean().item(), rel=1e-5)
    assert d["simko/topk_prob_mass_mean"] == pytest.approx(
        probs.topk(K, -1).values.sum(-1)[mask].mean().item(), rel=1e-5
    )
    assert d["simko/entropy_threshold_mean"] == pytest.approx(terms.threshold.mean().item(), rel=1e-6)
    # with the 0.5 quantile about half of each response's tokens fork
    assert 0.3 < d["simko/forking_frac"] < 0.6


# --- top-K log-probs from logits -------------------------------------------------------------------------------------
def topk_logit_gaps(logits, labels, top_k, temperature=None, rows=None, with_entropy=False, chunk_size=2048):
    """The engine's sequence (capo_verl/compat/simko.py::_simko_model_outputs): top-K indices and entropy, the
    [label, top-K] logits gathered with the in-place gradient, then gaps and the top-1 mask."""
    top_index, entropy = topk_and_entropy(logits, top_k, temperature, rows, with_entropy, chunk_size)
    index = torch.cat([labels.reshape(-1, 1).to(torch.long), top_index], dim=-1)  # (N, 1 + K)
    used = torch.arange(logits.shape[0]) if rows is None else rows
    _, picked = gather_with_inplace_grad(logits, used, index)
    gaps, is_top1 = gaps_from_picked(picked, temperature)
    return gaps, is_top1, entropy


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("temperature", [None, 0.7])
def test_topk_gaps_plus_log_prob_are_the_top_k_log_probs(dtype, temperature):
    g = torch.Generator().manual_seed(3)
    N, vocab, k = 40, 300, 3
    logits = (torch.randn(N, vocab, generator=g) * 4).to(dtype).requires_grad_(True)
    labels = torch.randint(0, vocab, (N,), generator=g)
    labels[::4] = logits.detach().float().argmax(-1)[::4]
    temp = None if temperature is None else torch.full((N,), temperature)
    scaled = logits if temp is None else logits / temp.clamp(min=1e-8).to(dtype).unsqueeze(-1)  # verl's scaling
    logp_all = torch.log_softmax(scaled.float(), -1)
    log_prob = logp_all.gather(-1, labels.unsqueeze(-1)).squeeze(-1)
    gaps, is_top1, entropy = topk_logit_gaps(logits, labels, k, temp, chunk_size=7)
    assert entropy is None
    ours = log_prob.unsqueeze(-1) + gaps
    # the tie rule (value descending, then token id ascending) as a stable sort: bf16 logits here do tie
    rule = scaled.detach().float().sort(dim=-1, descending=True, stable=True).indices[:, :k]
    direct = logp_all.gather(-1, rule)
    torch.testing.assert_close(ours, direct, rtol=0, atol=2e-5)
    assert torch.equal(is_top1, labels == scaled.detach().float().argmax(-1))
    weights = torch.randn(N, k, generator=g)
    (g_ours,) = torch.autograd.grad((ours * weights).sum(), logits, retain_graph=True)
    (g_direct,) = torch.autograd.grad((direct * weights).sum(), logits)
    torch.testing.assert_close(
        g_ours.float(),
        g_direct.float(),
        rtol=1e-2 if dtype == torch.bfloat16 else 1e-5,
        atol=1e-2 if dtype == torch.bfloat16 else 1e-6,
    )


def test_entropy_and_row_selection_match_verl_formula():
    from verl.utils.torch_functional import entropy_from_logits

    g = torch.Generator().manual_seed(4)
    logits = (torch.randn(37, 50, generator=g) * 3).requires_grad_(True)
    labels = torch.randint(0, 50, (37,), generator=g)
    temp = torch.rand(37, generator=g) + 0.5
    gaps, is_top1, ours = topk_logit_gaps(logits, labels, 3, temp, with_entropy=True, chunk_size=8)
    expected = entropy_from_logits(logits.detach() / temp.unsqueeze(-1))
    torch.testing.assert_close(ours, expected, rtol=1e-5, atol=1e-5)
    assert not ours.requires_grad and math.isfinite(ours.sum().item())
    rows = torch.tensor([30, 2, 2, 17, 5, 36])
    sel_gaps, sel_top1, sel_entropy = topk_logit_gaps(
        logits, labels[rows], 3, temp[rows], rows=rows, with_entropy=True, chunk_size=4
    )
    torch.testing.assert_close(sel_entropy, ours[rows], rtol=0, atol=0)
    torch.testing.assert_close(sel_gaps, gaps[rows], rtol=0, atol=0)
    assert torch.equal(sel_top1, is_top1[rows])
    (g_sel,) = torch.autograd.grad(sel_gaps.sum(), logits)
    (g_all,) = torch.autograd.grad(gaps[rows].sum(), logits)
    torch.testing.assert_close(g_sel, g_all, rtol=0, atol=0)


@pytest.mark.parametrize("use_alias", [True, False])
def test_gather_with_inplace_grad_equals_a_plain_gather(use_alias):
    g = torch.Generator().manual_seed(6)
    logits = torch.randn(3, 5, 11, generator=g).requires_grad_(True)
    rows = torch.tensor([0, 4, 7, 7, 14])
    index = torch.randint(0, 11, (5, 3), generator=g)
    weights = torch.randn(5, 3, generator=g)
    alias, picked = gather_with_inplace_grad(logits, rows, index)
    assert torch.equal(alias, logits)
    assert torch.equal(picked, logits.detach().reshape(-1, 11)[rows.unsqueeze(-1), index])
    loss = (picked * weights).sum() + (torch.log_softmax(alias, -1)[..., 2].sum() if use_alias else 0.0)
    (ours,) = torch.autograd.grad(loss, logits)
    plain = (logits.reshape(-1, 11)[rows.unsqueeze(-1), index] * weights).sum()
    plain = plain + (torch.log_softmax(logits, -1)[..., 2].sum() if use_alias else 0.0)
    (expected,) = torch.autograd.grad(plain, logits)
    torch.testing.assert_close(ours, expected, rtol=0, atol=1e-6)


# --- ties: one rule on every device ----------------------------------------------------------------------------------
def _tied_bf16_logits(n=96, vocab=500, seed=11):
    """bf16 logits with many exact ties: values on a coarse grid (as bf16 rounds large logits), plus rows built by
    hand (all equal; a tie at the top; a tie at the K-th place wider than K)."""
    g = torch.Generator().manual_seed(seed)
    logits = (torch.randint(-40, 9, (n, vocab), generator=g).float() / 2).to(torch.bfloat16)
    logits[0] = 1.0  # every token ties
    logits[1, [7, 3, 250, 299]] = 9.0  # 4-way tie at the top
    logits[2, 17] = 9.5
    logits[2, [290, 5, 90, 201, 6]] = 9.0  # 1 above, 5-way tie at places 2-6
    return logits


def _rule(row: torch.Tensor, k: int) -> list[int]:
    """The tie rule in plain Python: value descending, then token id ascending."""
    values = row.float().tolist()
    return sorted(range(len(values)), key=lambda v: (-values[v], v))[:k]


@pytest.mark.parametrize("k", [1, 3, 5])
def test_top_k_indices_follow_the_tie_rule_on_bf16_logits_built_to_tie(k):
    logits = _tied_bf16_logits()
    ordered = logits.float().sort(dim=-1, descending=True).values
    assert (ordered[:, k - 1] == ordered[:, k]).float().mean() > 0.5  # the K-th place ties in most rows
    assert (ordered[:, 0] == ordered[:, 1]).float().mean() > 0.1  # and the top in some
    got = top_k_indices(logits, k)
    assert got.dtype == torch.long and got.shape == (logits.shape[0], k)
    assert got.tolist() == [_rule(row, k) for row in logits]
    assert torch.equal(got[:, 0], logits.argmax(-1))  # column 0: torch.argmax's documented choice (lowest id)
    assert got[0].tolist() == list(range(k))
    assert got[1, :4].tolist() == [3, 7, 250, 299][:k] and got[2].tolist() == [17, 5, 6, 90, 201][:k]


@pytest.mark.parametrize("order", ["highest_id_first", "shuffled"])
def test_top_k_indices_do_not_depend_on_torch_topk_tie_order(monkeypatch, order):
    """CUDA's topk returns other tied ids than the CPU's; a topk that breaks ties in another way (highest id first,
    or at random) must give the same result."""
    logits = _tied_bf16_logits(seed=12)
    expected = top_k_indices(logits, 3)
    real_topk = torch.topk
    g = torch.Generator().manual_seed(0)

    def other_topk(x, k, dim=-1, **kwargs):
        perm = torch.randperm(x.shape[-1], generator=g) if order == "shuffled" else torch.arange(x.shape[-1]).flip(0)
        values, index = real_topk(x[..., perm], k, dim=dim, **kwargs)
        return torch.return_types.topk((values, perm[index]))

    monkeypatch.setattr(torch, "topk", other_topk)
    got = top_k_indices(logits, 3)
    assert not torch.equal(torch.topk(logits, 3).indices, real_topk(logits, 3).indices)  # the stand-in differs
    assert torch.equal(got, expected)


@pytest.mark.parametrize("temperature", [None, 0.7])
def test_top1_mask_and_top_k_log_probs_under_ties_in_bf16(temperature):
    """A sampled token tied with the maximum counts as top-1 (also when another tied id is first); the top-K
    log-probs are the tied tokens' by the rule, with the gradient on those tokens."""
    logits = _tied_bf16_logits(n=40, vocab=300, seed=13)
    logits[3] = -5.0
    logits[3, [40, 41]] = 3.0  # row 3: tie at the top
    labels = torch.randint(0, 300, (40,), generator=torch.Generator().manual_seed(1))
    labels[3] = 41  # tied with the max, not the lowest tied id
    labels[4] = logits[4].float().argmax()
    temp = None if temperature is None else torch.full((40,), temperature)
    logits.requires_grad_(True)
    gaps, is_top1, _ = topk_logit_gaps(logits, labels, 3, temp, chunk_size=16)
    scaled = logits.detach() if temp is None else logits.detach() / temp.to(torch.bfloat16).unsqueeze(-1)
    scaled = scaled.float()
    assert torch.equal(is_top1, scaled.gather(-1, labels.unsqueeze(-1)).squeeze(-1) >= scaled.max(-1).values)
    assert is_top1[3] and is_top1[4] and labels[3] != scaled[3].argmax()
    rule = torch.tensor([_rule(row, 3) for row in scaled])
    logp = torch.log_softmax((logits if temp is None else logits / temp.to(torch.bfloat16).unsqueeze(-1)).float(), -1)
    log_prob = logp.gather(-1, labels.unsqueeze(-1)).squeeze(-1)
    torch.testing.assert_close(log_prob.detach().unsqueeze(-1) + gaps.detach(), logp.detach().gather(-1, rule))
    (grad,) = torch.autograd.grad(gaps.sum(), logits)
    hit = (
        torch.zeros(40, 300, dtype=torch.bool).scatter_(-1, rule, True)
        | torch.nn.functional.one_hot(labels, 300).bool()
    )
    assert (grad[~hit] == 0).all() and grad.gather(-1, rule)[rule != labels.unsqueeze(-1)].ne(0).all()


def test_top_k_indices_rank_nan_above_numbers_as_topk_does():
    nan = float("nan")
    x = torch.tensor([[nan, nan, 5.0, 5.0, 1.0], [1.0, 2.0, nan, 2.0, 2.0]], dtype=torch.bfloat16)
    assert top_k_indices(x, 3).tolist() == [[0, 1, 2], [2, 1, 3]]
