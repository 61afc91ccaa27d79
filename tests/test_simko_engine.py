"""SimKO's plumbing through verl 0.9.1's real FSDP engine (capo_verl/compat/simko.py), on CPU.

One process, a gloo group of size 1, a tiny random Qwen2 model in verl's ``FSDPEngineWithLMHead`` (FSDP2, float32),
and batches in the layout verl's trainer hands the actor (``left_right_2_no_padding``). The loss function is verl's
own ``ppo_loss`` bound to an ``FSDPActorConfig``, as ``verl/workers/engine_workers.py`` builds it.
"""

from __future__ import annotations

import os
import socket
from functools import partial

import pytest
import torch
import torch.distributed as dist
import verl  # noqa: F401  installs capo-verl's compat layer
from omegaconf import OmegaConf
from tensordict import TensorDict

from capo_verl.compat import simko as compat_simko
from capo_verl.cpu.models import tiny_model_checkpoint

BS, P, R = 4, 6, 8
PROMPT_LENS = (6, 3, 5, 4)
RESPONSE_LENS = (8, 5, 7, 3)
ADVANTAGES = (0.75, -0.5, 0.25, -1.0)


@pytest.fixture(scope="module")
def model_path(tmp_path_factory):
    # width pinned: the absolute tolerances below are for this model's logits, whatever the helper's default
    return tiny_model_checkpoint(tmp_path_factory.mktemp("simko_tiny") / "tiny", hidden_size=32, init_std=0.5, seed=0)


@pytest.fixture(scope="module")
def engine(model_path):
    from verl.trainer.config import CheckpointConfig
    from verl.workers.config import FSDPEngineConfig, FSDPOptimizerConfig, HFModelConfig
    from verl.workers.engine import EngineRegistry

    created = not dist.is_initialized()
    if created:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK="0", WORLD_SIZE="1", LOCAL_RANK="0")
        dist.init_process_group("gloo", rank=0, world_size=1)
    model_config = HFModelConfig(path=str(model_path), override_config={"attn_implementation": "sdpa"})
    model_config.model_type = "language_model"
    fp32 = {"param_dtype": "fp32", "reduce_dtype": "fp32", "buffer_dtype": "fp32"}
    eng = EngineRegistry.new(
        model_type="language_model",
        backend="fsdp2",
        model_config=model_config,
        engine_config=FSDPEngineConfig(
            strategy="fsdp2", use_torch_compile=False, model_dtype="fp32", mixed_precision=fp32
        ),
        optimizer_config=FSDPOptimizerConfig(lr=1e-3),
        checkpoint_config=CheckpointConfig(),
    )
    eng.initialize()
    yield eng
    if created:
        dist.destroy_process_group()


@pytest.fixture(scope="module")
def hf_model(model_path, load_hf_model):
    return load_hf_model(model_path, attn_implementation="sdpa")


def _sequences(seed: int, vocab: int):
    g = torch.Generator().manual_seed(seed)
    return [
        (torch.randint(3, vocab, (p,), generator=g), torch.randint(3, vocab, (r,), generator=g))
        for p, r in zip(PROMPT_LENS, RESPONSE_LENS, strict=True)
    ]


def _padded_batch(seqs, old_log_probs=None) -> TensorDict:
    """Left-padded prompts, right-padded responses: the DataProto layout of verl's trainer."""
    prompts = torch.zeros(BS, P, dtype=torch.long)
    responses = torch.zeros(BS, R, dtype=torch.long)
    attention = torch.zeros(BS, P + R, dtype=torch.long)
    for i, (p, r) in enumerate(seqs):
        prompts[i, P - len(p) :] = p
        responses[i, : len(r)] = r
        attention[i, P - len(p) : P + len(r)] = 1
    response_mask = attention[:, P:].clone()
    advantages = torch.tensor(ADVANTAGES).view(BS, 1) * response_mask
    if old_log_probs is None:
        old_log_probs = torch.zeros(BS, R)
    return TensorDict(
        {
            "input_ids": torch.cat([prompts, responses], 1),
            "attention_mask": attention,
            "position_ids": (attention.cumsum(-1) - 1).clamp(min=0),
            "response_mask": response_mask,
            "prompts": prompts,
            "responses": responses,
            "old_log_probs": old_log_probs * response_mask,
            "advantages": advantages,
        },
        batch_size=[BS],
    )


def _actor_config(loss_mode: str, simko: dict | None = None, **overrides):
    from verl.utils.config import omega_conf_to_dataclass

    policy_loss = {"_target_": "verl.workers.config.PolicyLossConfig", "loss_mode": loss_mode}
    if simko is not None:
        policy_loss["simko"] = simko
    raw = {
        "_target_": "verl.workers.config.FSDPActorConfig",
        "strategy": "fsdp2",
        "rollout_n": 1,
        "ppo_mini_batch_size": BS,
        "ppo_micro_batch_size_per_gpu": BS,
        "use_dynamic_bsz": False,
        "policy_loss": policy_loss,
        "loss_agg_mode": "token-mean",
        "clip_ratio": 0.2,
        **overrides,
    }
    return omega_conf_to_dataclass(OmegaConf.create(raw))


def _run(
    engine, td, actor_config, *, remove_padding, temperature=1.0, calculate_entropy=False, ppo_loss=None, capture=False
):
    """One forward/backward of verl's engine on ``td``; returns loss, metrics, grads, model-output keys, captures."""
    from verl.trainer.ppo import core_algos
    from verl.utils import tensordict_utils as tu
    from verl.workers.utils import losses
    from verl.workers.utils.padding import left_right_2_no_padding

    data = left_right_2_no_padding(td.clone())
    tu.assign_non_tensor(
        data,
        temperature=temperature,
        use_remove_padding=remove_padding,
        calculate_entropy=calculate_entropy,
        use_dynamic_bsz=False,
        micro_batch_size_per_gpu=BS,
        max_token_len_per_gpu=None,
        global_batch_size=BS,
        use_fused_kernels=False,
    )
    seen: dict = {}
    real_simko = core_algos.POLICY_LOSS_REGISTRY["simko"]

    def capturing(**kwargs):
        seen["inputs"] = compat_simko._INPUTS.get()
        seen["log_prob"] = kwargs["log_prob"].detach()
        return real_simko(**kwargs)

    cls = type(engine)
    patched = cls.prepare_model_outputs

    def recording(self, *args, **kwargs):
        out = patched(self, *args, **kwargs)
        seen["keys"] = sorted(out)
        seen["model_output"] = {k: v.detach() for k, v in out.items()}
        return out

    loss_fn = partial(ppo_loss or losses.ppo_loss, config=actor_config)
    engine.optimizer_zero_grad()
    cls.prepare_model_outputs = recording
    core_algos.POLICY_LOSS_REGISTRY["simko"] = capturing if capture else real_simko
    try:
        grads = {}
        with engine.train_mode():  # zeroes the gradients on exit: read them inside
            out = engine.forward_backward_batch(data, loss_fn)
            for name, param in engine.module.named_parameters():
                if param.grad is not None:
                    grad = param.grad
                    grads[name] = (grad.full_tensor() if hasattr(grad, "full_tensor") else grad).clone()
    finally:
        cls.prepare_model_outputs = patched
        core_algos.POLICY_LOSS_REGISTRY["simko"] = real_simko
    assert grads, "no gradient reached the model"
    return {"metrics": _aggregate(out["metrics"]), "grads": grads, **seen}


def _aggregate(metrics: dict) -> dict[str, float]:
    from verl.utils.metric import Metric

    out = {}
    for key, value in metrics.items():
        if isinstance(value, list) and len(value) == 1:
            value = value[0]
        out[key] = float(value.aggregate() if isinstance(value, Metric) else value)
    return out


def _direct(hf_model, seqs, temperature: float, top_k: int):
    """Per response token, straight from the HF model on each unpadded sequence: top-K log-probs, entropy, top-1."""
    topk = torch.zeros(BS, R, top_k)
    entropy = torch.zeros(BS, R)
    is_top1 = torch.zeros(BS, R, dtype=torch.bool)
    log_prob = torch.zeros(BS, R)
    with torch.no_grad():
        for i, (p, r) in enumerate(seqs):
            ids = torch.cat([p, r]).unsqueeze(0)
            logits = hf_model(input_ids=ids).logits[0, len(p) - 1 : len(p) + len(r) - 1] / temperature
            logp = torch.log_softmax(logits.float(), -1)
            topk[i, : len(r)] = logp.topk(top_k, -1).values
            entropy[i, : len(r)] = -(logp.exp() * logp).sum(-1)
            is_top1[i, : len(r)] = r == logits.argmax(-1)
            log_prob[i, : len(r)] = logp.gather(-1, r.unsqueeze(-1)).squeeze(-1)
    return topk, entropy, is_top1, log_prob


def _response_mask():
    return torch.arange(R).unsqueeze(0) < torch.tensor(RESPONSE_LENS).unsqueeze(1)


@pytest.mark.parametrize(
    "remove_padding, temperature, calculate_entropy",
    [(False, 1.0, False), (True, 1.0, False), (False, 0.7, True), (True, 0.7, True), (True, 1.3, False)],
)
def test_engine_top_k_log_probs_top1_and_entropy_equal_a_direct_forward_pass(
    engine, hf_model, remove_padding, temperature, calculate_entropy
):
    seqs = _sequences(0, hf_model.config.vocab_size)
    config = _actor_config("simko", {"top_k": 4})
    got = _run(
        engine,
        _padded_batch(seqs),
        config,
        remove_padding=remove_padding,
        temperature=temperature,
        calculate_entropy=calculate_entropy,
        capture=True,
    )
    topk, entropy, is_top1, log_prob = _direct(hf_model, seqs, temperature, top_k=4)
    mask = _response_mask()
    inputs = got["inputs"]
    assert inputs.topk_gaps.shape == (BS, R, 4) and inputs.topk_gaps.requires_grad
    torch.testing.assert_close(got["log_prob"][mask], log_prob[mask], rtol=0, atol=1e-5)  # verl's own log-probs
    ours = (got["log_prob"].unsqueeze(-1) + inputs.topk_gaps.detach())[mask]
    torch.testing.assert_close(ours, topk[mask], rtol=0, atol=1e-5)
    torch.testing.assert_close(inputs.entropy[mask], entropy[mask], rtol=0, atol=1e-5)
    assert not inputs.entropy.requires_grad
    assert torch.equal(inputs.is_top1[mask], is_top1[mask])
    # verl's entropy is in the model output only when calculate_entropy asked for it
    assert ("entropy" in got["keys"]) == calculate_entropy
    assert {"simko_topk_gaps", "simko_is_top1", "simko_entropy"} <= set(got["keys"])


def test_top1_mask_is_true_where_the_response_follows_the_argmax(engine, hf_model):
    seqs = _sequences(1, hf_model.config.vocab_size)
    # make every second response token the model's argmax (greedy continuation)
    greedy = []
    with torch.no_grad():
        for p, r in seqs:
            ids = p.clone()
            out = []
            for t in range(len(r)):
                nxt = hf_model(input_ids=ids.unsqueeze(0)).logits[0, -1].argmax() if t % 2 == 0 else r[t]
                out.append(int(nxt))
                ids = torch.cat([ids, torch.tensor([int(nxt)])])
            greedy.append((p, torch.tensor(out)))
    got = _run(engine, _padded_batch(greedy), _actor_config("simko"), remove_padding=False, capture=True)
    mask = _response_mask()
    even = (torch.arange(R) % 2 == 0).unsqueeze(0) & mask
    assert got["inputs"].is_top1[even].all()
    _, _, is_top1, _ = _direct(hf_model, greedy, 1.0, top_k=3)
    assert torch.equal(got["inputs"].is_top1[mask], is_top1[mask])


def _independent_simko_loss(hf_model, seqs, old_log_probs, params, clip):
    """The authors' SimKO loss (token-mean) on the HF model, with their sg(r_t)/sg(r_k) r_k form of the ratio."""
    losses, mask = [], _response_mask()
    n_tokens = mask.sum()
    for i, (p, r) in enumerate(seqs):
        ids = torch.cat([p, r]).unsqueeze(0)
        logits = hf_model(input_ids=ids).logits[0, len(p) - 1 : len(p) + len(r) - 1]
        logp_all = torch.log_softmax(logits.float(), -1)
        lp = logp_all.gather(-1, r.unsqueeze(-1)).squeeze(-1)
        top_lp = logp_all.gather(-1, logits.detach().topk(params.top_k, -1).indices)
        ent = -(logp_all.exp() * logp_all).sum(-1).detach()
        threshold = torch.quantile(ent, params.entropy_quantile)
        forking = ent > threshold
        old = old_log_probs[i, : len(r)]
        old_top = top_lp.detach() + 0.01  # any old top-K log-probs: they cancel
        r_t = torch.exp(lp - old)
        r_k = torch.exp(top_lp - old_top)
        smooth = (r_t.detach().unsqueeze(-1) / r_k.detach() * r_k).sum(-1)
        a = ADVANTAGES[i]
        w = params.alpha * forking.float() if a > 0 else torch.zeros_like(ent)
        ratio = (1 - w) * r_t + w / params.top_k * smooth
        top1 = r == logits.detach().argmax(-1)
        adv = torch.full_like(ent, a)
        if a < 0:
            adv = torch.where(forking & top1, adv * params.top1_penalty, adv)
        token_loss = torch.max(-adv * ratio, -adv * ratio.clamp(1 - clip, 1 + clip))
        losses.append(token_loss.sum())
    return torch.stack(losses).sum() / n_tokens


@pytest.mark.parametrize("remove_padding", [False, True])
def test_simko_gradient_through_the_engine_equals_an_independent_computation(engine, hf_model, remove_padding):
    from capo_verl.losses.simko import SimKOParams

    seqs = _sequences(2, hf_model.config.vocab_size)
    _, _, _, log_prob = _direct(hf_model, seqs, 1.0, top_k=3)
    g = torch.Generator().manual_seed(5)
    old = log_prob + 0.02 * torch.randn(BS, R, generator=g)  # ratios near 1: nothing clipped, both sides move
    params = SimKOParams(top_k=3, alpha=0.2, entropy_quantile=0.5, top1_penalty=1.1)
    config = _actor_config("simko", {"top_k": 3, "alpha": 0.2, "entropy_quantile": 0.5})
    got = _run(engine, _padded_batch(seqs, old), config, remove_padding=remove_padding)

    hf_model.zero_grad()
    loss = _independent_simko_loss(hf_model, seqs, old, params, clip=0.2)
    loss.backward()
    assert got["metrics"]["actor/pg_loss"] == pytest.approx(loss.item(), rel=1e-4, abs=1e-6)
    assert got["metrics"]["simko/smoothed_frac"] > 0 and got["metrics"]["simko/forking_frac"] > 0
    checked = 0
    for name, param in hf_model.named_parameters():
        if name not in got["grads"]:
            assert param.grad is None or not param.grad.any(), name
            continue
        torch.testing.assert_close(got["grads"][name], param.grad, rtol=1e-3, atol=1e-6, msg=name)
        checked += 1
    assert checked >= 20

    # and it is not vanilla PPO's gradient
    vanilla = _run(engine, _padded_batch(seqs, old), _actor_config("vanilla"), remove_padding=remove_padding)
    assert any(not torch.allclose(vanilla["grads"][n], got["grads"][n], rtol=1e-4, atol=1e-7) for n in got["grads"])


@pytest.mark.parametrize("loss_mode", ["vanilla", "gspo"])
@pytest.mark.parametrize("remove_padding", [False, True])
def test_other_loss_modes_give_exactly_verls_original_results(engine, hf_model, loss_mode, remove_padding):
    from verl.workers.utils import losses

    cls = type(engine)
    seqs = _sequences(3, hf_model.config.vocab_size)
    td = _padded_batch(seqs, torch.full((BS, R), -5.0))
    config = _actor_config(loss_mode)
    patched = _run(engine, td, config, remove_padding=remove_padding, calculate_entropy=True)
    saved = cls.prepare_model_outputs
    cls.prepare_model_outputs = saved.__wrapped__  # verl's own method
    try:
        original = _run(
            engine,
            td,
            config,
            remove_padding=remove_padding,
            calculate_entropy=True,
            ppo_loss=losses.ppo_loss.__wrapped__,
        )
    finally:
        cls.prepare_model_outputs = saved
    assert patched["keys"] == original["keys"] == ["entropy", "log_probs"]
    for key in patched["model_output"]:
        assert torch.equal(patched["model_output"][key].values(), original["model_output"][key].values()), key
    assert patched["metrics"] == original["metrics"]
    for name in original["grads"]:
        assert torch.equal(patched["grads"][name], original["grads"][name]), name


def test_forward_without_a_loss_adds_nothing(engine, hf_model):
    """compute_log_prob (no loss function) with a SimKO actor: verl's output only, no top-K work."""
    from verl.utils import tensordict_utils as tu
    from verl.workers.utils.padding import left_right_2_no_padding

    seqs = _sequences(4, hf_model.config.vocab_size)
    data = left_right_2_no_padding(_padded_batch(seqs))
    tu.assign_non_tensor(
        data,
        temperature=1.0,
        use_remove_padding=False,
        calculate_entropy=True,
        use_dynamic_bsz=False,
        micro_batch_size_per_gpu=BS,
        max_token_len_per_gpu=None,
        global_batch_size=BS,
        use_fused_kernels=False,
    )
    with engine.eval_mode():
        out = engine.infer_batch(data, loss_function=None)
    assert sorted(out["model_output"]) == ["entropy", "log_probs"]


def test_simko_loss_without_the_engine_tensors_is_an_error():
    config = _actor_config("simko")
    x = torch.zeros(2, 3)
    with pytest.raises(RuntimeError, match="top-K log-probs.*FSDP engine"):
        compat_simko.compute_policy_loss_simko(x, x, x, x.bool(), "token-mean", config)


def test_policy_loss_config_takes_simko_and_names_bad_keys():
    config = _actor_config("simko", {"top_k": 5})
    assert config.policy_loss.simko == {"top_k": 5, "alpha": 0.01, "entropy_quantile": 0.8, "top1_penalty": 1.1}
    assert _actor_config("simko").policy_loss.simko["top_k"] == 3
    assert _actor_config("vanilla").policy_loss.simko is None
    with pytest.raises(
        Exception,
        match=r"policy_loss\.simko\.alpha\b.*\[0, 1\].*\b2\.0\b"
        r".*\bactor_rollout_ref\.actor\.policy_loss\.simko\.alpha=0\.01\b",
    ):
        _actor_config("simko", {"alpha": 2.0})
    with pytest.raises(Exception, match=r"unknown key.*policy_loss\.simko\.mix_topk_coef"):
        _actor_config("simko", {"mix_topk_coef": 0.01})


def _trainer_config(*overrides):
    from hydra import compose, initialize_config_dir

    config_dir = os.path.join(os.path.dirname(verl.__file__), "trainer", "config")
    with initialize_config_dir(config_dir=config_dir, version_base=None):
        return compose(
            config_name="ppo_trainer",
            overrides=[
                "actor_rollout_ref.rollout.name=vllm",
                "actor_rollout_ref.actor.policy_loss.loss_mode=simko",
                "actor_rollout_ref.actor.use_dynamic_bsz=true",
                *overrides,
            ],
        )


@pytest.mark.parametrize(
    "overrides, message",
    [
        (["actor_rollout_ref.actor.strategy=megatron"], r"actor_rollout_ref\.actor\.strategy fsdp or fsdp2"),
        (["actor_rollout_ref.model.use_fused_kernels=true"], r"actor_rollout_ref\.model\.use_fused_kernels=false"),
        (
            ["actor_rollout_ref.actor.fsdp_config.ulysses_sequence_parallel_size=2"],
            r"actor_rollout_ref\.actor\.fsdp_config\.ulysses_sequence_parallel_size=1",
        ),
        (["distillation.enabled=true"], r"distillation\.enabled=true"),
        (["+actor_rollout_ref.actor.policy_loss.simko.top_k=0"], r"policy_loss\.simko\.top_k must be an integer >= 1"),
    ],
)
def test_uncovered_setups_stop_in_verls_validate_config(overrides, message):
    from verl.utils.config import validate_config

    with pytest.raises(ValueError, match=message):
        validate_config(_trainer_config(*overrides), use_reference_policy=False, use_critic=False)


def test_covered_setup_passes_the_check():
    compat_simko.check_simko_setup(_trainer_config("actor_rollout_ref.actor.strategy=fsdp2"))
    compat_simko.check_simko_setup(
        _trainer_config(
            "actor_rollout_ref.actor.policy_loss.loss_mode=vanilla", "actor_rollout_ref.actor.strategy=megatron"
        )
    )


def test_patches_refuse_a_verl_whose_code_changed():
    import dataclasses
    import types

    class Engine:
        def prepare_model_outputs(self, output, micro_batch):
            pass

    with pytest.raises(RuntimeError, match="prepare_model_outputs has parameters"):
        compat_simko._patch_engine(types.SimpleNamespace(FSDPEngineWithLMHead=Engine))

    def ppo_loss(config, model_output):
        pass

    with pytest.raises(RuntimeError, match="ppo_loss has parameters"):
        compat_simko._patch_ppo_loss(types.SimpleNamespace(ppo_loss=ppo_loss, no_padding_2_padding=None))

    @dataclasses.dataclass
    class PolicyLossConfig:
        loss_mode: str = "vanilla"
        simko: int = 0

    with pytest.raises(RuntimeError, match="PolicyLossConfig has fields"):
        compat_simko._patch_policy_loss_config(types.SimpleNamespace(PolicyLossConfig=PolicyLossConfig))

    from verl.trainer.ppo import core_algos

    assert core_algos.get_policy_loss_fn("simko") is compat_simko.compute_policy_loss_simko
    fake = types.SimpleNamespace(
        POLICY_LOSS_REGISTRY={"simko": ppo_loss},
        register_policy_loss=core_algos.register_policy_loss,
        get_policy_loss_fn=core_algos.get_policy_loss_fn,
    )
    with pytest.raises(RuntimeError, match="already registered"):
        compat_simko._register_loss(fake)
