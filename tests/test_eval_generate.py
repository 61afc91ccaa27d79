"""`capo-verl eval generate` with a tiny random model built here (no download).

Checks: well-formed lines; lpm equals a separate forward pass over the same tokens (1e-4), also with
temperature/top-p; EOS handling; determinism under the seed; resuming (also after a torn write) gives
the same file as a fresh run; clear errors; the CLI on a parquet file; the vLLM adapter on a stand-in.
"""

import json
import re
import sys
import types

import pytest
import torch

from capo_verl.evaluation import REQUIRED_FIELDS
from capo_verl.evaluation import generate as G


def _tiny_model_and_tokenizer():
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    tk = Tokenizer(models.BPE())
    tk.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tk.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=300, special_tokens=["<|im_start|>", "<|im_end|>", "<pad>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tk.train_from_iterator(["What is 1 + 1? The answer is \\boxed{2}.", "user assistant 0123456789"], trainer=trainer)
    tok = PreTrainedTokenizerFast(tokenizer_object=tk, bos_token="<|im_start|>", eos_token="<|im_end|>",
                                  pad_token="<pad>")
    tok.chat_template = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
                         "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=len(tok), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                      bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id)
    model = LlamaForCausalLM(cfg).eval()
    return model, tok


@pytest.fixture(scope="module")
def tiny():
    model, tok = _tiny_model_and_tokenizer()
    eos = tok.eos_token_id
    # +2.5 on the EOS logit (part of the model: the reference forward pass sees it too), so that about a
    # quarter of the responses stop before max_new_tokens and the EOS path is exercised
    model.lm_head.register_forward_hook(lambda mod, inp, out: out.index_add(
        -1, torch.tensor([eos]), torch.full((*out.shape[:-1], 1), 2.5)))
    return model, tok


def digit_scorer(data_source, solution_str, ground_truth, extra_info=None):
    """Stand-in reward: the last digit of the response is the answer."""
    digits = re.findall(r"\d", solution_str)
    pred = digits[-1] if digits else ""
    return {"score": float(pred == str(ground_truth)), "acc": pred == str(ground_truth), "pred": pred}


def rows(n=3, sources=("toy_a", "toy_b")):
    # prompts of different lengths, so that batched calls are left-padded
    return [{"data_source": ds, "prompt": [{"role": "user", "content": f"What is {i} + 1?" + " Think." * i}],
             "reward_model": {"ground_truth": str((i + 1) % 10), "style": "rule"}, "extra_info": {"index": 10 + i}}
            for ds in sources for i in range(n)]


def read(path):
    return [json.loads(line) for line in open(path, encoding="utf-8")]


@pytest.mark.parametrize("temperature, top_p", [(1.0, 1.0), (0.7, 0.9)])
def test_lines_well_formed_and_lpm_matches_forward_pass(tiny, tmp_path, temperature, top_p):
    model, tok = tiny
    backend = G.HFBackend(model, tok, model_name="tiny")
    settings = G.SamplingSettings(k=4, temperature=temperature, top_p=top_p, max_new_tokens=12, seed=3)
    problems = G.problems_from_rows(rows())
    out = tmp_path / "gen.jsonl"
    summary = G.generate(problems, backend, settings, out, scorer=digit_scorer, save_token_ids=True, progress=False,
                         chunk=4)  # 4 questions (16 left-padded rows) per generate call
    lines = read(out)
    assert summary["responses"] == len(lines) == 6 * 4 and summary["questions_done"] == 6
    assert set(REQUIRED_FIELDS) <= set(lines[0])
    eos = tok.eos_token_id
    n_eos = 0
    for rec in lines:
        assert isinstance(rec["response"], str) and isinstance(rec["answer"], str)
        assert isinstance(rec["correct"], bool) and isinstance(rec["lpm"], float)
        assert rec["correct"] == (rec["answer"] == rec["ground_truth"])
        ids = rec["token_ids"]
        assert rec["num_tokens"] == len(ids) >= 1
        assert rec["response"] == tok.decode(ids, skip_special_tokens=True)
        # the response ends at the first EOS (included), or runs to max_new_tokens
        assert eos not in ids[:-1]
        assert rec["truncated"] == (ids[-1] != eos) and (rec["truncated"] or len(ids) <= 12)
        assert len(ids) == 12 or not rec["truncated"]
        n_eos += not rec["truncated"]
        # separate forward pass over prompt + response, raw log-softmax at temperature 1
        prompt = next(p for p in problems if (p.data_source, p.question_id) == (rec["data_source"], rec["question_id"]))
        prompt_ids = backend.encode(prompt.prompt)
        with torch.no_grad():
            logits = model(torch.tensor([prompt_ids + ids])).logits[0].double()
        logp = torch.log_softmax(logits, -1)[len(prompt_ids) - 1:-1].gather(1, torch.tensor(ids)[:, None])
        assert rec["lpm"] == pytest.approx(logp.mean().item(), abs=1e-4)
    assert 0 < n_eos < len(lines)  # both endings occur
    # sample indices 0..k-1 for every question
    by_q = {}
    for rec in lines:
        by_q.setdefault((rec["data_source"], rec["question_id"]), []).append(rec["sample_index"])
    assert all(sorted(v) == [0, 1, 2, 3] for v in by_q.values()) and len(by_q) == 6
    meta = json.loads((tmp_path / "gen.jsonl.meta.json").read_text())
    assert meta["k"] == 4 and meta["temperature"] == temperature and meta["backend"] == "hf"


def test_deterministic_and_resumable(tiny, tmp_path):
    model, tok = tiny
    backend = G.HFBackend(model, tok, model_name="tiny")
    settings = G.SamplingSettings(k=3, max_new_tokens=8, seed=7)
    problems = G.problems_from_rows(rows())
    fresh, resumed, other = tmp_path / "fresh.jsonl", tmp_path / "resumed.jsonl", tmp_path / "other.jsonl"
    torch.manual_seed(123)
    rng_before = torch.get_rng_state()
    G.generate(problems, backend, settings, fresh, scorer=digit_scorer, progress=True, chunk=1)
    assert torch.equal(torch.get_rng_state(), rng_before)  # the caller's RNG is left alone
    # a run interrupted after 2 questions, with a torn half-written line at the end, then resumed
    G.generate(problems[:2], backend, settings, resumed, scorer=digit_scorer, progress=False)
    with open(resumed, "a") as f:
        f.write('{"data_source": "toy_a", "question_id": 12, "sample_')
    summary = G.generate(problems, backend, settings, resumed, scorer=digit_scorer, progress=False)
    assert summary["questions_skipped"] == 2 and summary["questions_done"] == 4
    assert resumed.read_text() == fresh.read_text()
    # rerunning a finished file does nothing
    assert G.generate(problems, backend, settings, resumed, scorer=digit_scorer, progress=False)["responses"] == 0
    assert resumed.read_text() == fresh.read_text()
    # same seed, other input order: same lines per question; other seed: other responses
    G.generate(problems[::-1], backend, settings, other, scorer=digit_scorer, progress=False)
    key = lambda r: (r["data_source"], r["question_id"], r["sample_index"])  # noqa: E731
    assert sorted(read(other), key=key) == sorted(read(fresh), key=key)
    G.generate(problems, backend, G.SamplingSettings(k=3, max_new_tokens=8, seed=8), other, scorer=digit_scorer,
               progress=False, overwrite=True)
    assert [r["response"] for r in read(other)] != [r["response"] for r in read(fresh)]
    # several questions per generate call (left padding): the same responses, lpm equal up to rounding
    G.generate(problems, backend, settings, other, scorer=digit_scorer, progress=False, overwrite=True, chunk=4)
    for a, b in zip(read(other), read(fresh)):
        assert a["lpm"] == pytest.approx(b["lpm"], abs=1e-5)
        assert {**a, "lpm": 0} == {**b, "lpm": 0}


def test_resume_refuses_other_settings_and_foreign_files(tiny, tmp_path):
    model, tok = tiny
    backend = G.HFBackend(model, tok, model_name="tiny")
    problems = G.problems_from_rows(rows(1))
    out = tmp_path / "gen.jsonl"
    G.generate(problems, backend, G.SamplingSettings(k=2, max_new_tokens=4), out, scorer=digit_scorer, progress=False)
    with pytest.raises(ValueError, match="k: file has 2, asked 3.*--overwrite"):
        G.generate(problems, backend, G.SamplingSettings(k=3, max_new_tokens=4), out, scorer=digit_scorer,
                   progress=False)
    foreign = tmp_path / "notes.jsonl"
    foreign.write_text("hello\n")
    with pytest.raises(ValueError, match="exists without its notes.jsonl.meta.json"):
        G.generate(problems, backend, G.SamplingSettings(k=2, max_new_tokens=4), foreign, scorer=digit_scorer,
                   progress=False)


def test_problem_loading(tmp_path):
    import pandas as pd

    path = tmp_path / "bench.parquet"
    pd.DataFrame(rows(4)).to_parquet(path)
    problems = G.load_problems([path], limit=2)
    assert [(p.data_source, p.question_id) for p in problems] == [("toy_a", 10), ("toy_a", 11), ("toy_b", 10),
                                                                   ("toy_b", 11)]
    assert problems[0].prompt == [{"role": "user", "content": "What is 0 + 1?"}]  # numpy arrays -> plain lists
    assert problems[0].ground_truth == "1"
    with pytest.raises(ValueError, match="row 0 lacks \\['reward_model'\\]"):
        G.problems_from_rows([{"data_source": "x", "prompt": "hi"}])
    with pytest.raises(ValueError, match="duplicate question"):
        G.problems_from_rows(rows(1) + rows(1))
    with pytest.raises(ValueError, match="no problems to evaluate"):
        G.load_problems([], [])
    with pytest.raises(ValueError, match="limit must be >= 1"):
        G.load_problems([path], limit=0)
    with pytest.raises(ValueError, match="k \\(samples per problem\\) must be >= 1"):
        G.SamplingSettings(k=0)


def test_cli_generate_on_parquet_with_project_reward(tiny, tmp_path):
    """The command line end to end: a saved checkpoint, a verl parquet, the project's math-verify reward."""
    import pandas as pd

    from capo_verl.evaluation.cli import main

    model, tok = _tiny_model_and_tokenizer()  # a clean copy (no hook) to save
    model.save_pretrained(tmp_path / "ckpt")
    tok.save_pretrained(tmp_path / "ckpt")
    data = [{"data_source": "toy", "prompt": [{"role": "user", "content": "1+1?"}],
             "reward_model": {"ground_truth": "2"}, "extra_info": {"index": i}} for i in range(2)]
    pd.DataFrame(data).to_parquet(tmp_path / "toy.parquet")
    out = tmp_path / "gen.jsonl"
    args = ["generate", "--model", str(tmp_path / "ckpt"), "--data", str(tmp_path / "toy.parquet"), "-k", "2",
            "--max-new-tokens", "6", "--out", str(out), "--no-progress", "--backend", "hf"]
    assert main(args) == 0
    lines = read(out)
    assert len(lines) == 4 and all(set(REQUIRED_FIELDS) <= set(r) for r in lines)
    assert main(args) == 0 and read(out) == lines  # resumed: nothing new
    args[args.index("-k") + 1] = "3"
    assert main(args) == 2  # other k than the file: a clear error, exit code 2


def test_vllm_adapter_on_a_stand_in(monkeypatch):
    """VLLMBackend's conversion of vLLM outputs (the real engine needs a GPU; this checks our side)."""
    seen = {}

    class Logprob:
        def __init__(self, v):
            self.logprob = v

    class SamplingParams:
        def __init__(self, **kw):
            self.kw = kw

    class LLM:
        def __init__(self, **kw):
            seen["llm"] = kw

        def get_tokenizer(self):
            return _Tok()

        def generate(self, prompts, params, use_tqdm=False):
            seen["params"] = [p.kw for p in params]
            outs = []
            for _ in prompts:
                comp = [types.SimpleNamespace(index=1, token_ids=[5, 2], text="b", finish_reason="stop",
                                              logprobs=[{5: Logprob(-1.0)}, {2: Logprob(-0.5)}]),
                        types.SimpleNamespace(index=0, token_ids=[4, 4, 4], text="aaa", finish_reason="length",
                                              logprobs=[{4: Logprob(-0.1)}, {4: Logprob(-0.2)}, {4: Logprob(-0.3)}])]
                outs.append(types.SimpleNamespace(outputs=comp))
            return outs

    class _Tok:
        chat_template = None

        def __call__(self, text, add_special_tokens=False):
            return {"input_ids": [ord(c) for c in text]}

    monkeypatch.setitem(sys.modules, "vllm", types.SimpleNamespace(LLM=LLM, SamplingParams=SamplingParams))
    backend = G.VLLMBackend("some/model")
    assert seen["llm"]["logprobs_mode"] == "raw_logprobs" and seen["llm"]["model"] == "some/model"
    problems = G.problems_from_rows(rows(1, ("x",)))
    settings = G.SamplingSettings(k=2, max_new_tokens=5, seed=1)
    [samples] = backend.sample_many(problems, settings, [99])
    assert seen["params"][0] == {"n": 2, "temperature": 1.0, "top_p": 1.0, "max_tokens": 5, "seed": 99, "logprobs": 0}
    assert [s.text for s in samples] == ["aaa", "b"]  # ordered by completion index
    assert samples[0].truncated and not samples[1].truncated
    assert samples[0].lpm == pytest.approx(-0.2) and samples[1].lpm == pytest.approx(-0.75)


def test_gumbel_max_draws_from_the_softmax():
    probs = torch.tensor([[0.5, 0.3, 0.15, 0.05]])
    sampler = G._GumbelMax([1234], "cpu")
    draws = torch.stack([sampler(None, probs.log()).argmax(-1) for _ in range(20000)]).reshape(-1)
    freq = torch.bincount(draws, minlength=4).double() / len(draws)
    assert torch.allclose(freq, probs[0].double(), atol=0.012)  # ~3.5 standard errors
    # one stream per row: row 0's draws are the same with or without other rows
    a = G._GumbelMax([7], "cpu")
    b = G._GumbelMax([7, 8, 9], "cpu")
    for _ in range(5):
        assert torch.equal(a(None, probs.log()).argmax(-1), b(None, probs.log().repeat(3, 1)).argmax(-1)[:1])
