"""SimKO's and the vanilla policy loss on CUDA, forward and backward, float32 and bf16, against CPU float64.

The step is the one verl's FSDP engine and ``ppo_loss`` run with capo_verl.compat.simko's patches: the top-K
indices and the entropy without autograd (``topk_and_entropy``), the [sampled, top-K] logits gathered with the
in-place gradient (``gather_with_inplace_grad``), log-probs from the alias (log-softmax in float32; float64 for the
reference), the gaps and the top-1 mask (``gaps_from_picked``), then verl's registered ``simko`` / ``vanilla``
policy loss with the engine's tensors in capo's context variable, and ``backward`` to the logits.
Data: 8 responses x 2,048 tokens, a 4,096-token vocabulary, logits N(0, 2.5^2), sampled tokens, old log-probs
near the current ones (2% far outside the clip range), half the responses positive.

The reference is CPU float64 from the *same* logit values (the run's dtype, rounded, then float64), so the
differences below are the device's and the compute dtype's only.

Tolerances (the gradient as ``max |g - g_ref| / max |g_ref|``):

- float32: gradient 1e-4, loss 1e-4 relative. Every op is float32 (log-softmax, entropy, the loss); rounding is
  ~1e-6 of the gradient's maximum (1.1e-6 on an NVIDIA H200). 1e-4 also covers a forking-gate flip: a token whose
  float32 entropy sits within ~1e-6 of its response's threshold.
- bf16: gradient 2e-2, loss 1e-3 relative. The logits' gradient is stored in bf16 (8-bit mantissa: 0.4% of each
  entry at most, 0.3% measured for the vanilla loss), and a float32 entropy can flip a forking token's gate (SimKO
  then changes that token's gradient by ``alpha`` or the advantage by ``top1_penalty - 1``): 0.6% measured on the
  CPU. 2e-2 is 3x the CPU's. Before SimKO's tie rule, CUDA was at 3% because its ``topk`` chose other tied tokens.
- the top-K sets and the top-1 mask: CUDA and the CPU, on the same bf16 scaled logits (temperature 1 and 0.7),
  choose exactly the same tokens (``capo_verl.losses.simko.top_k_indices``' tie rule); the entropy agrees to 1e-4
  nats (float32 sums over 4,096 terms: 2e-6 measured).
"""

from __future__ import annotations

import pytest
import torch

pytestmark = pytest.mark.gpu

DEVICE = "cuda"
BS, T, V, K = 8, 2048, 4096, 3
PARAMS = {"top_k": K, "alpha": 0.1, "entropy_quantile": 0.8, "top1_penalty": 1.1}
GRAD_TOL = {"float32": 1e-4, "bfloat16": 2e-2}
LOSS_TOL = {"float32": 1e-4, "bfloat16": 1e-3}


def simko_data(seed: int = 2) -> dict:
    """CPU float64: logits ``(BS, T, V)``, sampled tokens, bool response mask, old log-probs, advantages."""
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(BS, T, V, generator=g, dtype=torch.float64) * 2.5
    gumbel = -torch.log(-torch.log(torch.rand(BS, T, V, generator=g, dtype=torch.float64).clamp_(1e-12, 1 - 1e-12)))
    tokens = (logits + gumbel).argmax(-1)
    del gumbel
    lengths = torch.randint(T // 8, T + 1, (BS,), generator=g)
    mask = torch.arange(T)[None, :] < lengths[:, None]
    logp = torch.log_softmax(logits, -1).gather(-1, tokens[..., None]).squeeze(-1)
    old = logp + 0.05 * torch.randn(BS, T, generator=g, dtype=torch.float64)
    old = torch.where(torch.rand(BS, T, generator=g) < 0.02, old + 0.5, old)  # some ratios far outside the clip
    sign = torch.where(torch.arange(BS) % 2 == 0, 1.0, -1.0).to(torch.float64)
    adv = (sign * (0.5 + torch.rand(BS, generator=g, dtype=torch.float64)))[:, None] * mask
    return {"logits": logits, "tokens": tokens, "mask": mask, "old_log_prob": old, "advantages": adv}


@pytest.fixture(scope="module")
def data():
    return simko_data()


def actor_config(loss_mode: str):
    from omegaconf import OmegaConf
    from verl.utils.config import omega_conf_to_dataclass

    policy_loss = {"_target_": "verl.workers.config.PolicyLossConfig", "loss_mode": loss_mode}
    if loss_mode == "simko":
        policy_loss["simko"] = dict(PARAMS)
    raw = {
        "_target_": "verl.workers.config.FSDPActorConfig",
        "strategy": "fsdp2",
        "rollout_n": 1,
        "ppo_mini_batch_size": 1,
        "ppo_micro_batch_size_per_gpu": 1,
        "use_dynamic_bsz": False,
        "policy_loss": policy_loss,
        "loss_agg_mode": "token-mean",
        "clip_ratio": 0.2,
    }
    return omega_conf_to_dataclass(OmegaConf.create(raw))


def simko_step(d: dict, logits: torch.Tensor, loss_mode: str):
    """One forward + backward; returns ``(loss, metrics, logits.grad, inputs)`` (``inputs`` None for vanilla)."""
    import verl  # noqa: F401  (the plugin, through its entry point)
    from verl.trainer.ppo import core_algos

    from capo_verl.compat import simko as cs
    from capo_verl.losses.simko import gaps_from_picked, gather_with_inplace_grad, topk_and_entropy

    device = logits.device
    logits = logits.detach().requires_grad_(True)
    mask, tokens = d["mask"].to(device), d["tokens"].to(device)
    compute = torch.float64 if logits.dtype == torch.float64 else torch.float32
    config = actor_config(loss_mode)
    config.global_batch_info.update(  # what verl's ppo_loss sets before calling the policy loss (dp size 1)
        dp_size=1, batch_num_tokens=int(mask.sum()), global_batch_size=BS, loss_scale_factor=config.loss_scale_factor
    )
    inputs = None
    alias = logits
    if loss_mode == "simko":
        used = mask.reshape(-1).nonzero().squeeze(-1)
        labels = tokens.reshape(-1)[used]
        top_index, entropy = topk_and_entropy(logits.reshape(-1, V), K, None, rows=used, with_entropy=True)
        alias, picked = gather_with_inplace_grad(logits, used, torch.cat([labels[:, None], top_index], -1))
        gaps, is_top1 = gaps_from_picked(picked, None)
        n = BS * T
        inputs = cs.SimKOInputs(
            topk_gaps=gaps.new_zeros(n, K).index_put((used,), gaps).view(BS, T, K),
            is_top1=torch.zeros(n, dtype=torch.bool, device=device).index_put((used,), is_top1).view(BS, T),
            entropy=entropy.new_zeros(n).index_put((used,), entropy).view(BS, T),
        )
    log_prob = torch.log_softmax(alias.to(compute), -1).gather(-1, tokens[..., None]).squeeze(-1)
    token = cs._INPUTS.set(inputs) if inputs is not None else None
    try:
        loss, metrics = core_algos.get_policy_loss_fn(loss_mode)(
            old_log_prob=d["old_log_prob"].to(device, compute),
            log_prob=log_prob,
            advantages=d["advantages"].to(device, compute),
            response_mask=mask,
            loss_agg_mode="token-mean",
            config=config,
        )
    finally:
        if token is not None:
            cs._INPUTS.reset(token)
    loss.backward()
    return loss.detach(), metrics, logits.grad, inputs


def _scalar_metrics(metrics: dict) -> dict[str, float]:
    out = {}
    for key, value in metrics.items():
        if isinstance(value, torch.Tensor) and value.numel() == 1:
            out[key] = float(value)
        elif isinstance(value, (int, float)):
            out[key] = float(value)
    return out


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("loss_mode", ["simko", "vanilla"])
def test_loss_and_gradient_on_cuda_match_cpu_float64(data, loss_mode, dtype, record_property):
    rounded = data["logits"].to(getattr(torch, dtype))
    loss, metrics, grad, _ = simko_step(data, rounded.to(DEVICE), loss_mode)
    loss_ref, metrics_ref, grad_ref, _ = simko_step(data, rounded.to(torch.float64), loss_mode)
    assert grad.device.type == DEVICE and grad.dtype == rounded.dtype
    assert torch.isfinite(grad).all() and torch.isfinite(loss)
    scale = grad_ref.abs().max().item()
    rel = (grad.cpu().double() - grad_ref).abs().max().item() / scale
    loss_rel = abs(loss.item() - loss_ref.item()) / max(1.0, abs(loss_ref.item()))
    for quantity, measured, tolerance in (
        ("gradient_rel", rel, GRAD_TOL[dtype]),
        ("loss_rel", loss_rel, LOSS_TOL[dtype]),
    ):
        record_property(f"measured:{quantity}", measured)  # junit xml: read by device_record.py
        record_property(f"tolerance:{quantity}", tolerance)
    assert rel <= GRAD_TOL[dtype], f"{loss_mode} {dtype}: gradient differs by {rel:.3g} of its max"
    assert loss_rel <= LOSS_TOL[dtype]
    if loss_mode == "simko":
        got, ref = _scalar_metrics(metrics), _scalar_metrics(metrics_ref)
        for key in ("simko/forking_frac", "simko/smoothed_frac", "simko/penalized_frac"):
            assert ref[key] > 0, f"{key} = 0: SimKO's branch not exercised"
            assert abs(got[key] - ref[key]) <= 1e-3, f"{key}: {got[key]} vs {ref[key]}"
        _, _, grad_vanilla, _ = simko_step(data, rounded.to(torch.float64), "vanilla")
        assert (grad_ref - grad_vanilla).abs().max() > 0  # SimKO changes the gradient


@pytest.mark.parametrize("temperature", [None, 0.7])
def test_cuda_and_cpu_choose_the_same_top_k_and_top1_on_bf16_logits(data, temperature, record_property):
    from capo_verl.losses.simko import gaps_from_picked, topk_and_entropy

    logits = data["logits"].to(torch.bfloat16).reshape(-1, V)
    labels = data["tokens"].reshape(-1)
    temp = None if temperature is None else torch.full((logits.shape[0],), temperature)
    chosen = {}
    for device in (DEVICE, "cpu"):
        lg = logits.to(device)
        t = None if temp is None else temp.to(device)
        top, entropy = topk_and_entropy(lg, K, t, with_entropy=True)
        index = torch.cat([labels.to(device)[:, None], top], -1)
        _, is_top1 = gaps_from_picked(lg.gather(-1, index), t)
        chosen[device] = (top.cpu(), is_top1.cpu(), entropy.cpu())
    scaled = logits.float() if temp is None else (logits / temp.to(torch.bfloat16)[:, None]).float()
    ordered = scaled.sort(-1, descending=True).values
    assert (ordered[:, K - 1] == ordered[:, K]).any() and (ordered[:, 0] == ordered[:, 1]).any()  # ties present
    assert torch.equal(chosen[DEVICE][0], chosen["cpu"][0])
    assert torch.equal(chosen[DEVICE][1], chosen["cpu"][1])
    entropy_diff = (chosen[DEVICE][2] - chosen["cpu"][2]).abs().max().item()
    record_property("measured:entropy_max_abs_diff", entropy_diff)  # junit xml: read by device_record.py
    record_property("tolerance:entropy_max_abs_diff", 1e-4)
    assert entropy_diff <= 1e-4
