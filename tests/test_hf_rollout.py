"""The ``hf`` rollout backend: batched sampling semantics and the server's verl interface (CPU, no Ray).

The server class is driven directly in an asyncio loop with real verl configs (``RolloutConfig``,
``HFModelConfig``) and verl's ``TokenOutput``; the Ray/trainer path is covered by tests/test_e2e_cpu.py.
"""

from __future__ import annotations

import asyncio

import pytest
import torch

import capo_verl.plugin  # noqa: F401  (the plugin, as verl loads it)
from capo_verl.models import tiny_model_checkpoint
from capo_verl.rollout.sampling import SamplingSpec, _apply_repetition_penalty, _inverse_cdf, generate_batch


@pytest.fixture(scope="module")
def tiny_path(tmp_path_factory):
    return tiny_model_checkpoint(tmp_path_factory.mktemp("tiny_model"), seed=0)


@pytest.fixture(scope="module")
def model_and_tokenizer(tiny_path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(tiny_path, dtype=torch.float32, attn_implementation="sdpa").eval()
    return model, AutoTokenizer.from_pretrained(tiny_path)


def _prompts(tokenizer):
    texts = ["What is 48 / 2?", "Natalia sold clips to 48 of her friends in April, and then", "Hi", "What is 7 * 8?"]
    return [tokenizer(t)["input_ids"] for t in texts]


def _full_forward_logprobs(model, prompt, response, temperature=1.0):
    ids = torch.tensor([list(prompt) + list(response)])
    with torch.no_grad():
        logits = model(ids).logits[0, len(prompt) - 1 : -1].float()
    return (logits / temperature).log_softmax(-1).gather(-1, torch.tensor(response)[:, None]).squeeze(-1)


def test_batched_greedy_equals_one_by_one(model_and_tokenizer):
    model, tok = model_and_tokenizer
    prompts = _prompts(tok)  # different lengths: left padding in the batch
    spec = SamplingSpec(max_tokens=12, temperature=0.0)
    batched = generate_batch(model, prompts, [spec] * len(prompts), eos_token_ids=[tok.eos_token_id], pad_token_id=0)
    for prompt, out in zip(prompts, batched):
        single = generate_batch(model, [prompt], [spec], eos_token_ids=[tok.eos_token_id], pad_token_id=0)[0]
        assert out.token_ids == single.token_ids
        assert torch.allclose(torch.tensor(out.log_probs), torch.tensor(single.log_probs), atol=1e-5)


@pytest.mark.parametrize("temperature,top_k,top_p", [(1.0, -1, 1.0), (0.7, 20, 0.9), (1.3, 5, 1.0)])
def test_logprobs_are_log_softmax_at_the_sampling_temperature(model_and_tokenizer, temperature, top_k, top_p):
    """processed_logprobs = log_softmax(logits / T) over the full vocabulary: what verl's actor computes."""
    model, tok = model_and_tokenizer
    prompts = _prompts(tok)
    spec = SamplingSpec(max_tokens=10, temperature=temperature, top_k=top_k, top_p=top_p)
    outs = generate_batch(
        model, prompts, [spec] * len(prompts), eos_token_ids=[tok.eos_token_id], pad_token_id=0,
        generator=torch.Generator().manual_seed(1),
    )
    for prompt, out in zip(prompts, outs):
        assert len(out.log_probs) == len(out.token_ids) > 0
        expected = _full_forward_logprobs(model, prompt, out.token_ids, temperature)
        assert torch.allclose(torch.tensor(out.log_probs), expected, atol=1e-4)


def test_raw_logprobs_mode_ignores_temperature(model_and_tokenizer):
    model, tok = model_and_tokenizer
    prompt = _prompts(tok)[0]
    out = generate_batch(
        model, [prompt], [SamplingSpec(max_tokens=8, temperature=0.5)], eos_token_ids=[tok.eos_token_id],
        pad_token_id=0, logprobs_mode="raw_logprobs", generator=torch.Generator().manual_seed(0),
    )[0]
    assert torch.allclose(torch.tensor(out.log_probs), _full_forward_logprobs(model, prompt, out.token_ids), atol=1e-4)
    with pytest.raises(ValueError, match="logprobs_mode"):
        generate_batch(model, [prompt], [SamplingSpec(max_tokens=2)], eos_token_ids=[], pad_token_id=0,
                       logprobs_mode="processed_logits")


def test_top_k_1_and_tiny_top_p_are_greedy(model_and_tokenizer):
    model, tok = model_and_tokenizer
    prompts = _prompts(tok)
    kw = dict(eos_token_ids=[tok.eos_token_id], pad_token_id=0, generator=torch.Generator().manual_seed(3))
    greedy = generate_batch(model, prompts, [SamplingSpec(max_tokens=10, temperature=0)] * 4, **kw)
    top1 = generate_batch(model, prompts, [SamplingSpec(max_tokens=10, temperature=1.0, top_k=1)] * 4, **kw)
    nucleus = generate_batch(model, prompts, [SamplingSpec(max_tokens=10, temperature=1.0, top_p=1e-6)] * 4, **kw)
    for g, a, b in zip(greedy, top1, nucleus):
        assert g.token_ids == a.token_ids == b.token_ids


def test_sampling_differs_across_draws_and_is_reproducible(model_and_tokenizer):
    model, tok = model_and_tokenizer
    prompt = _prompts(tok)[0]
    spec = SamplingSpec(max_tokens=12, temperature=1.0)

    def run(seed):
        return generate_batch(model, [prompt] * 4, [spec] * 4, eos_token_ids=[], pad_token_id=0,
                              generator=torch.Generator().manual_seed(seed))

    first, again = run(0), run(0)
    assert [o.token_ids for o in first] == [o.token_ids for o in again]
    assert len({tuple(o.token_ids) for o in first}) > 1  # 4 samples of one prompt in one batch differ


def test_inverse_cdf_draws_follow_the_distribution_and_never_a_zero_probability_token():
    probs = torch.tensor([0.0, 0.5, 0.0, 0.2, 0.3, 0.0])
    # u on a fine grid: the fraction of u that lands on each token is its probability
    u = (torch.arange(100_000, dtype=torch.float64) + 0.5) / 100_000
    draws = _inverse_cdf(probs.expand(len(u), -1), u)
    freq = torch.bincount(draws, minlength=6).double() / len(u)
    assert torch.allclose(freq, probs.double(), atol=1e-4)
    # the edges: u = 0 takes the first token with mass, u -> 1 and a total rounded below 1 the last one
    edge = torch.tensor([[0.0, 0.5, 0.0, 0.5, 0.0], [0.0, 0.5, 0.0, 0.5, 0.0], [0.0, 0.3, 0.0, 0.3, 0.0]])
    u = torch.tensor([0.0, 1.0 - 2**-53, 1.0 - 2**-53], dtype=torch.float64)
    assert _inverse_cdf(edge, u).tolist() == [1, 3, 3]
    assert _inverse_cdf(edge, torch.ones(3, dtype=torch.float64)).tolist() == [3, 3, 3]  # target at the total


def test_per_row_seeds_make_a_response_independent_of_its_batch(model_and_tokenizer):
    """With seeds, row i's response depends on seeds[i] and its prompt only: alone, in another batch, in another
    order, it is the same; different seeds of one prompt give different responses."""
    model, tok = model_and_tokenizer
    prompts = _prompts(tok)
    spec = SamplingSpec(max_tokens=12, temperature=1.0)
    kw = dict(eos_token_ids=[], pad_token_id=0)
    seeds = [101, 202, 303, 404]
    together = generate_batch(model, prompts, [spec] * 4, seeds=seeds, **kw)
    reversed_ = generate_batch(model, prompts[::-1], [spec] * 4, seeds=seeds[::-1], **kw)[::-1]
    for i, prompt in enumerate(prompts):
        alone = generate_batch(model, [prompt], [spec], seeds=[seeds[i]], **kw)[0]
        assert together[i].token_ids == alone.token_ids == reversed_[i].token_ids
    # rows that stop early leave the batch (and the KV cache): the others go on exactly as alone
    lengths = [SamplingSpec(max_tokens=m, temperature=1.0) for m in (2, 12, 5, 9)]
    staggered = generate_batch(model, prompts, lengths, seeds=seeds, **kw)
    assert [len(o.token_ids) for o in staggered] == [2, 12, 5, 9]
    for i, prompt in enumerate(prompts):
        alone = generate_batch(model, [prompt], [lengths[i]], seeds=[seeds[i]], **kw)[0]
        assert staggered[i].token_ids == alone.token_ids
        assert torch.allclose(torch.tensor(staggered[i].log_probs), torch.tensor(alone.log_probs), atol=1e-5)
    penalised = [SamplingSpec(max_tokens=m, temperature=1.0, repetition_penalty=1.3) for m in (2, 12, 5, 9)]
    staggered = generate_batch(model, prompts, penalised, seeds=seeds, **kw)
    for i, prompt in enumerate(prompts):
        alone = generate_batch(model, [prompt], [penalised[i]], seeds=[seeds[i]], **kw)[0]
        assert staggered[i].token_ids == alone.token_ids
    same_prompt = generate_batch(model, [prompts[0]] * 4, [spec] * 4, seeds=[1, 2, 3, 4], **kw)
    assert len({tuple(o.token_ids) for o in same_prompt}) > 1
    with pytest.raises(ValueError, match="not both"):
        generate_batch(model, prompts, [spec] * 4, seeds=seeds, generator=torch.Generator(), **kw)
    with pytest.raises(ValueError, match="seeds"):
        generate_batch(model, prompts, [spec] * 4, seeds=seeds[:2], **kw)


def test_per_request_max_tokens_and_stop_tokens_in_one_batch(model_and_tokenizer):
    model, tok = model_and_tokenizer
    prompts = _prompts(tok)[:3]
    vocab = model.config.vocab_size
    specs = [
        SamplingSpec(max_tokens=3, temperature=1.0),
        SamplingSpec(max_tokens=9, temperature=1.0),
        SamplingSpec(max_tokens=9, temperature=1.0, stop_token_ids=tuple(range(vocab))),  # any token stops
    ]
    outs = generate_batch(model, prompts, specs, eos_token_ids=[], pad_token_id=0,
                          generator=torch.Generator().manual_seed(0))
    assert [len(o.token_ids) for o in outs] == [3, 9, 1]
    assert [o.finish_reason for o in outs] == ["length", "length", "stop"]
    assert [len(o.log_probs) for o in outs] == [3, 9, 1]


def test_eos_ends_a_response_unless_ignore_eos(model_and_tokenizer):
    model, tok = model_and_tokenizer
    prompt = _prompts(tok)[0]
    first = generate_batch(model, [prompt], [SamplingSpec(max_tokens=5, temperature=0)], eos_token_ids=[],
                           pad_token_id=0)[0].token_ids[0]
    stopped = generate_batch(model, [prompt], [SamplingSpec(max_tokens=5, temperature=0)], eos_token_ids=[first],
                             pad_token_id=0)[0]
    assert stopped.token_ids == [first] and stopped.finish_reason == "stop"
    ignored = generate_batch(model, [prompt], [SamplingSpec(max_tokens=5, temperature=0, ignore_eos=True)],
                             eos_token_ids=[first], pad_token_id=0)[0]
    assert len(ignored.token_ids) == 5 and ignored.finish_reason == "length"


def test_repetition_penalty_rule():
    logits = torch.tensor([[2.0, -2.0, 1.0, -1.0]])
    seen = torch.tensor([[True, True, False, False]])
    out = _apply_repetition_penalty(logits, seen, torch.tensor([2.0]))
    assert out.tolist() == [[1.0, -4.0, 1.0, -1.0]]


def test_sampling_spec_rejects_bad_values():
    for bad in (dict(max_tokens=0), dict(max_tokens=4, temperature=-1), dict(max_tokens=4, top_p=0.0),
                dict(max_tokens=4, repetition_penalty=0)):
        with pytest.raises(ValueError):
            SamplingSpec(**bad)


# ------------------------------------------------------------------------------------------ the server
def _server(tiny_path, **rollout_kw):
    from omegaconf import OmegaConf
    from verl.utils.config import omega_conf_to_dataclass
    from verl.workers.config import HFModelConfig, RolloutConfig
    from verl.workers.rollout.replica import RolloutMode

    from capo_verl.rollout.server import HFRolloutServer

    kw = dict(name="hf", prompt_length=64, response_length=16, max_num_seqs=64, dtype="float32")
    kw.update(rollout_kw)
    config = RolloutConfig(**kw)
    model_config = omega_conf_to_dataclass(OmegaConf.create({"path": str(tiny_path)}), dataclass_type=HFModelConfig)
    return HFRolloutServer(config, model_config, RolloutMode.HYBRID, replica_rank=0)


def _actor_state(tiny_path, seed):
    """Full HF-named weights of a differently initialised copy of the tiny model (what the actor would send)."""
    from transformers import AutoConfig, AutoModelForCausalLM

    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(tiny_path), dtype=torch.float32).eval()
    return model, {k: v.clone() for k, v in model.state_dict().items()}


def test_server_batches_concurrent_requests_and_returns_verl_token_outputs(tiny_path, model_and_tokenizer):
    from verl.workers.rollout.replica import TokenOutput

    _, tok = model_and_tokenizer
    server = _server(tiny_path)
    actor, state = _actor_state(tiny_path, seed=11)
    prompts = _prompts(tok)

    async def main():
        await server.update_weights(state, global_steps=3)
        params = dict(temperature=1.0, top_p=1.0, top_k=-1, repetition_penalty=1.0, logprobs=True)
        outs = await asyncio.gather(
            *[server.generate(prompt_ids=p, sampling_params=dict(params), request_id=f"r{i}")
              for i, p in enumerate(prompts * 2)]
        )
        return outs, await server.get_stats()

    outs, stats = asyncio.run(main())
    assert stats["batches"] == 1 and stats["max_batch"] == 8  # all 8 concurrent requests in one batch
    for prompt, out in zip(prompts * 2, outs):
        assert isinstance(out, TokenOutput)
        assert out.stop_reason == "completed" and out.extra_fields["global_steps"] == 3
        assert 1 <= len(out.token_ids) <= 16 and len(out.log_probs) == len(out.token_ids)
        # log-probs are those of the synced weights (the actor's), not of the server's initial ones
        expected = _full_forward_logprobs(actor, prompt, out.token_ids)
        assert torch.allclose(torch.tensor(out.log_probs), expected, atol=1e-4)


def test_server_waits_for_a_staggered_burst_and_decodes_it_as_one_batch(tiny_path, model_and_tokenizer):
    """verl's agent loops send their requests a few ms apart (tokenization first): one burst, one batch."""
    from capo_verl.rollout import server as server_mod

    _, tok = model_and_tokenizer
    server = _server(tiny_path)
    _, state = _actor_state(tiny_path, seed=2)
    prompts = _prompts(tok) * 4  # 16 requests, 30 ms apart: 0.45 s in all, far longer than one quiet period
    assert 15 * 0.03 > server_mod.COLLECT_QUIET_S > 0.03

    async def send(i, p):
        await asyncio.sleep(0.03 * i)
        params = dict(temperature=1.0, top_p=1.0, top_k=-1, logprobs=False)
        return await server.generate(prompt_ids=p, sampling_params=params, request_id=f"r{i}")

    async def main():
        await server.update_weights(state)
        outs = await asyncio.gather(*[send(i, p) for i, p in enumerate(prompts)])
        return outs, await server.get_stats()

    outs, stats = asyncio.run(main())
    assert len(outs) == 16 and all(o.stop_reason == "completed" for o in outs)
    assert stats["batches"] == 1 and stats["max_batch"] == 16


def test_server_starts_a_batch_at_max_num_seqs_without_waiting_for_more(tiny_path, model_and_tokenizer):
    _, tok = model_and_tokenizer
    server = _server(tiny_path, max_num_seqs=3)
    _, state = _actor_state(tiny_path, seed=2)

    async def main():
        await server.update_weights(state)
        params = dict(temperature=1.0, top_p=1.0, top_k=-1, logprobs=False)
        outs = await asyncio.gather(
            *[server.generate(prompt_ids=p, sampling_params=dict(params), request_id=f"r{i}")
              for i, p in enumerate(_prompts(tok) * 2)]
        )
        return outs, await server.get_stats()

    outs, stats = asyncio.run(main())
    assert len(outs) == 8 and stats["max_batch"] == 3 and stats["batches"] == 3


def test_server_greedy_validation_and_max_tokens(tiny_path, model_and_tokenizer):
    _, tok = model_and_tokenizer
    server = _server(tiny_path)
    _, state = _actor_state(tiny_path, seed=5)
    prompt = _prompts(tok)[1]

    async def main():
        await server.update_weights(state)
        greedy = dict(temperature=0, top_p=1.0, top_k=-1, logprobs=False)
        a = await server.generate(prompt_ids=prompt, sampling_params=dict(greedy), request_id="a")
        b = await server.generate(prompt_ids=prompt, sampling_params=dict(greedy), request_id="b")
        c = await server.generate(prompt_ids=prompt, sampling_params=dict(greedy, max_tokens=4), request_id="c")
        return a, b, c

    a, b, c = asyncio.run(main())
    assert a.token_ids == b.token_ids and a.log_probs is None
    assert c.token_ids == a.token_ids[:4]
    # without max_tokens: min(response_length, prompt_length + response_length - len(prompt)), as verl's vLLM server
    assert len(a.token_ids) <= 16


def test_server_weight_sync_errors(tiny_path):
    server = _server(tiny_path)
    _, state = _actor_state(tiny_path, seed=1)

    async def main(payload):
        return await server.update_weights(payload)

    with pytest.raises(KeyError, match="does not have"):
        asyncio.run(main({"not.a.weight": torch.zeros(1)}))
    partial = dict(list(state.items())[:3])
    with pytest.raises(RuntimeError, match="did not cover"):
        asyncio.run(main(partial))
    assert asyncio.run(main(state))["tensors"] == len(state)


def test_server_rejects_what_it_cannot_do(tiny_path, model_and_tokenizer):
    _, tok = model_and_tokenizer
    server = _server(tiny_path, prompt_length=2048, response_length=16)
    prompt = _prompts(tok)[0]

    async def gen(**kw):
        kw.setdefault("prompt_ids", prompt)
        kw.setdefault("sampling_params", {"temperature": 1.0})
        return await server.generate(request_id="x", **kw)

    with pytest.raises(ValueError, match="unsupported sampling parameters"):
        asyncio.run(gen(sampling_params={"temperature": 1.0, "min_p": 0.1}))
    with pytest.raises(NotImplementedError, match="text-only"):
        asyncio.run(gen(image_data=["an image"]))
    with pytest.raises(ValueError, match="leaves no room"):
        asyncio.run(gen(prompt_ids=[5] * 1024))  # the tiny model's max_position_embeddings
    with pytest.raises(ValueError, match="full_determinism"):
        _server(tiny_path, full_determinism=True)


def test_server_abort_and_resume(tiny_path, model_and_tokenizer):
    _, tok = model_and_tokenizer
    server = _server(tiny_path, response_length=1000, prompt_length=16)
    _, state = _actor_state(tiny_path, seed=2)
    prompt = _prompts(tok)[0]
    params = {"temperature": 1.0, "logprobs": True, "ignore_eos": True}

    async def main():
        await server.update_weights(state)
        running = asyncio.ensure_future(server.generate(prompt_ids=prompt, sampling_params=dict(params),
                                                        request_id="long"))
        while not server.batch_running:
            await asyncio.sleep(0.001)
        await asyncio.sleep(0.01)
        result = await server.abort_all_requests(reject_request=True)
        long_out = await running
        rejected = await server.generate(prompt_ids=prompt, sampling_params=dict(params), request_id="late")
        await server.resume_generation()
        after = await server.generate(prompt_ids=prompt, sampling_params=dict(params, max_tokens=3), request_id="ok")
        return result, long_out, rejected, after

    result, long_out, rejected, after = asyncio.run(main())
    assert isinstance(result, dict) and "aborted_count" in result
    assert long_out.stop_reason == "aborted" and 0 < len(long_out.token_ids) < 1000
    assert len(long_out.log_probs) == len(long_out.token_ids)
    assert rejected.stop_reason == "aborted" and rejected.token_ids == []
    assert after.stop_reason == "completed" and len(after.token_ids) == 3


def test_server_control_methods_are_harmless_on_cpu(tiny_path, model_and_tokenizer):
    _, tok = model_and_tokenizer
    server = _server(tiny_path)
    _, state = _actor_state(tiny_path, seed=4)
    prompt = _prompts(tok)[2]
    greedy = {"temperature": 0, "logprobs": True}

    async def main():
        await server.update_weights(state)
        before = await server.generate(prompt_ids=prompt, sampling_params=dict(greedy), request_id="a")
        # the order verl's sync trainer uses: sleep after rollout, wake/resume around the weight sync
        await server.sleep()
        await server.wake_up(tags=["weights"])
        await server.update_weights(state, global_steps=1)
        await server.wake_up(tags=["kv_cache"])
        for method in (server.clear_kv_cache, server.release_kv_cache, server.resume_kv_cache,
                       server.start_profile, server.stop_profile):
            await method()
        after = await server.generate(prompt_ids=prompt, sampling_params=dict(greedy), request_id="b")
        return before, after

    before, after = asyncio.run(main())
    assert before.token_ids == after.token_ids
    assert torch.allclose(torch.tensor(before.log_probs), torch.tensor(after.log_probs), atol=1e-6)
    assert after.extra_fields["global_steps"] == 1


def test_server_draws_common_random_numbers_whatever_the_batching(tiny_path, model_and_tokenizer):
    """Two servers (two runs) with the same weights and step answer the same multiset of requests with the same
    samples, whether the requests come as one batch or one by one; the n requests of one prompt differ; another
    trainer step or rollout.seed draws anew."""
    _, tok = model_and_tokenizer
    _, state = _actor_state(tiny_path, seed=7)
    prompts = _prompts(tok)
    params = dict(temperature=1.0, top_p=1.0, top_k=-1, logprobs=True)

    async def run(server, together, step=5):
        await server.update_weights(state, global_steps=step)
        requests = [(p, f"r{i}") for i, p in enumerate(prompts * 3)]
        if together:
            outs = await asyncio.gather(*[server.generate(prompt_ids=p, sampling_params=dict(params), request_id=r)
                                          for p, r in requests])
        else:
            outs = [await server.generate(prompt_ids=p, sampling_params=dict(params), request_id=r)
                    for p, r in requests]
        return outs, (await server.get_stats())["batches"]

    batched, n_batched = asyncio.run(run(_server(tiny_path), together=True))
    serial, n_serial = asyncio.run(run(_server(tiny_path), together=False))
    assert (n_batched, n_serial) == (1, 12)
    assert [o.token_ids for o in batched] == [o.token_ids for o in serial]
    for a, b in zip(batched, serial):
        assert torch.allclose(torch.tensor(a.log_probs), torch.tensor(b.log_probs), atol=1e-5)
    per_prompt = [{tuple(batched[j].token_ids) for j in range(i, 12, 4)} for i in range(4)]
    assert all(len(samples) > 1 for samples in per_prompt)  # 3 samples of a prompt are not copies
    other_step, _ = asyncio.run(run(_server(tiny_path), together=True, step=6))
    other_seed, _ = asyncio.run(run(_server(tiny_path, seed=43), together=True))
    for other in (other_step, other_seed):
        assert [o.token_ids for o in other] != [o.token_ids for o in batched]
