"""Teacher-forced calibration: how each checkpoint ranks one FIXED pool of responses.

The pool is drawn once (e.g. from the base model by ``capo-verl eval generate``: one JSON line per response with
``data_source``, ``question_id``, ``sample_index``, ``response``, ``correct``, ``truncated``, ``num_tokens`` and,
with ``--save-token-ids``, ``token_ids``). For every checkpoint, :func:`score_pool` computes each pool response's
mean token log-probability under that checkpoint by one forward pass over prompt + response (teacher forcing: no
sampling), and :func:`teacher_forced_metrics` computes the AUC-mean of that lpm against the pool's fixed
correctness (:func:`capo_verl.metrics.auc_mean`, the paper's Eq. 7-8).

What it measures, plainly: the checkpoint's confidence ranking of responses it did NOT sample itself. The
responses and their correctness are the same for every checkpoint, so the differences between checkpoints come
from the model alone, not from sampling noise or from a change of the response distribution (accuracy, length,
style). It is therefore a low-noise way to compare checkpoints, but it is not the AUC-mean of a checkpoint's own
samples that ``capo-verl eval score`` reports (and the paper's tables): a checkpoint can rank the base model's
responses well and its own badly, or the other way round.

Tokens (exactly those the pool was generated from, where the pool allows it):

- prompt: the pool does not store prompt token ids, so the prompt is rebuilt from the verl-schema data the pool
  was generated from (``--data`` files and/or ``--benchmarks``, read by
  :func:`capo_verl.evaluation.problems.load_problems`) with the same function generation uses,
  :func:`capo_verl.evaluation.sampling.encode_prompt` (the tokenizer's chat template with the assistant header,
  no added special tokens). Problems are matched by ``(data_source, question_id)``.
- response: the line's ``token_ids`` when present (``capo-verl eval generate --save-token-ids``; EOS included
  when it was reached): exact. Otherwise the ``response`` text is tokenized again (no added special tokens) and
  the tokenizer's EOS token appended unless ``truncated`` is true (an absent ``truncated`` counts as false),
  which reproduces generation's tokens only where the tokenizer maps the decoded text back to the sampled ids.
  Sampled text often is not tokenized the canonical way: on the first 64 lines of
  ``tests/data/smollm2_cpu_gsm8k_math500_k8.jsonl`` (SmolLM2, float32, no ``token_ids``) 37 responses gave back
  their sampled lpm to within 1e-6 nats and 27 differed by 0.002 to 0.12 nats (20 of them with another token
  count than ``num_tokens``). Every checkpoint with the same tokenizer still scores the same tokens, but for the
  pool's exact tokens generate it with ``--save-token-ids``. The lines whose count differs from ``num_tokens``
  are counted (:class:`ScoreInfo`, the ``tokens`` of the output JSON) and logged.
- tokenizer: each checkpoint's own (``AutoTokenizer`` from its folder), or one given for all (``tokenizer=``,
  ``--tokenizer``), e.g. the base model's when the checkpoints were saved without one.

Command line (``capo-verl eval teacher-forced``)::

    capo-verl eval teacher-forced --pool runs/base.jsonl --benchmarks gsm8k math500 \\
        --model ckpt/step_0 ckpt/step_100 ckpt/step_200 --out runs/teacher_forced.json
"""

from __future__ import annotations

import dataclasses
import inspect
import json
import logging
import os
import re
import time
from collections.abc import Sequence

import numpy as np

from capo_verl import inputs
from capo_verl.evaluation import metrics as M
from capo_verl.stored import open_binary, stored

logger = logging.getLogger("capo_verl.evaluation")

#: What the log-softmax works on at once, in float32 elements (batch x positions x vocabulary): about 256 MiB.
_CHUNK_ELEMENTS = 64 * 1024 * 1024


# ----------------------------------------------------------------------------------------------- the pool


def read_pool(path: str | os.PathLike) -> list[dict]:
    """The responses of a pool file (``capo-verl eval generate`` JSONL), one dict per non-empty line, in file order.

    Every line needs ``data_source`` (non-empty str), ``question_id`` (str or int), ``correct`` (JSON boolean) and
    ``response`` (str) or ``token_ids`` (list of int >= 0); ``truncated`` (bool) and ``num_tokens`` (int) are used
    when present.

    Raises:
        FileNotFoundError: no such file.
        ValueError: a folder, a file with no response, a line that is not a JSON object, or a line missing one of
            the fields above or holding a wrong type (the message names the file and line).
    """
    path = stored(path)  # a committed pool is kept compressed: pool.jsonl.xz
    inputs.check_data_file(  # a loop, a folder, a sparse file or another format: refused before it is read
        path,
        "pool file",
        hint="write one with `capo-verl eval generate`",
        folder_hint="pass a pool .jsonl file (from `capo-verl eval generate`)",
    )
    out: list[dict] = []
    with open_binary(path) as f:
        try:  # each line read with a bound: one beyond it is refused before it is held whole
            lines = [raw.decode("utf-8") for _, raw in inputs.numbered_lines(f, path)]
        except UnicodeDecodeError as e:
            raise ValueError(f"{path}: not UTF-8 text ({e.reason}); is this a `capo-verl eval generate` output?") from e
    for i, line in enumerate(lines, 1):
        if not line.strip():
            continue
        where = f"{path}:{i}"
        try:
            rec = json.loads(line)
        except json.JSONDecodeError as e:
            raise ValueError(f"{where}: not a JSON line ({e}); is this a `capo-verl eval generate` output?") from e
        if not isinstance(rec, dict):
            raise ValueError(f"{where}: a JSON {type(rec).__name__}, not an object (one response per line)")
        if "correct" not in rec:
            raise ValueError(
                f"{where}: no `correct` field; a pool needs each response's fixed correctness "
                "(as `capo-verl eval generate` writes it)"
            )
        if not isinstance(rec["correct"], bool):
            raise ValueError(f"{where}: correct is {json.dumps(rec['correct'])}; expected a JSON boolean")
        missing = [k for k in ("data_source", "question_id") if k not in rec]
        if missing:
            raise ValueError(f"{where}: missing field(s) {missing}; each line needs data_source, question_id, correct")
        if not isinstance(rec["data_source"], str) or not rec["data_source"]:
            raise ValueError(f"{where}: data_source is {json.dumps(rec['data_source'])}; expected a non-empty string")
        qid = rec["question_id"]
        if not isinstance(qid, (str, int)) or isinstance(qid, bool):
            raise ValueError(f"{where}: question_id is {json.dumps(qid)}; expected a string or an integer")
        ids = rec.get("token_ids")
        if ids is not None:
            if not isinstance(ids, list) or not all(isinstance(t, int) and not isinstance(t, bool) for t in ids):
                raise ValueError(f"{where}: token_ids is not a list of integers")
            if any(t < 0 for t in ids):
                raise ValueError(f"{where}: token_ids holds a negative id")
        elif not isinstance(rec.get("response"), str):
            raise ValueError(f"{where}: no `response` string (and no `token_ids`); nothing to score")
        if "truncated" in rec and not isinstance(rec["truncated"], bool):
            raise ValueError(f"{where}: truncated is {json.dumps(rec['truncated'])}; expected a JSON boolean")
        rec["_line"] = i
        out.append(rec)
    if not out:
        raise ValueError(f"{path}: the pool is empty (no responses)")
    return out


def question_keys(pool: Sequence[dict]) -> np.ndarray:
    """``(n,)`` object array naming the question of each pool response: ``'["data_source", "question_id"]'`` (JSON
    of the pair, ``question_id`` as a string, as generation's :attr:`~capo_verl.evaluation.problems.Problem.key`)."""
    return np.array([json.dumps([r["data_source"], str(r["question_id"])]) for r in pool], dtype=object)


def problems_for(pool: Sequence[dict], data: Sequence[str | os.PathLike], benchmarks: Sequence[str]) -> dict:
    """``{(data_source, str(question_id)): Problem}`` for the pool's questions.

    With neither ``data`` nor ``benchmarks``, the pool's data sources are taken as shipped benchmark names.

    Raises:
        ValueError: a pool question missing from the data, or (no data given) a data source that is not a shipped
            benchmark.
    """
    from capo_verl import data as D
    from capo_verl.evaluation.problems import load_problems

    if not data and not benchmarks:
        sources = sorted({r["data_source"] for r in pool})
        unknown = [s for s in sources if s not in D.BENCHMARKS]
        if unknown:
            raise ValueError(
                f"the pool's data source(s) {', '.join(map(repr, unknown))} are not shipped benchmarks; pass the "
                "verl-schema file(s) the pool was generated from with --data FILE (prompts are rebuilt from them)"
            )
        benchmarks = sources
    problems = {p.key: p for p in load_problems(data, benchmarks)}
    for r in pool:
        key = (str(r["data_source"]), str(r["question_id"]))
        if key not in problems:
            raise ValueError(
                f"pool line {r['_line']}: question (data_source {key[0]!r}, question_id {key[1]!r}) is not in the "
                "given data; pass the --data/--benchmarks the pool was generated from"
            )
    return problems


# ----------------------------------------------------------------------------------------------- models


def resolve_model_path(model: str) -> str:
    """``--model`` -> what ``from_pretrained`` loads: ``smollm2`` (and its bundled GGUF) -> the converted
    checkpoint folder (:func:`capo_verl.evaluation.vllm_backend.resolve_model`); a folder must hold ``config.json``;
    a string shaped like a hub id (``owner/name``) that is not a local path is passed on.

    Raises:
        FileNotFoundError: no such folder and not a hub id.
        ValueError: a folder without ``config.json``, or a GGUF file other than the bundled SmolLM2's.
    """
    from capo_verl.evaluation.vllm_backend import resolve_model

    path = resolve_model(model)
    if os.path.isdir(path):
        if not os.path.isfile(os.path.join(path, "config.json")):
            raise ValueError(f"--model {model}: a folder without config.json, not a Hugging Face checkpoint")
        return path
    if not os.path.exists(path) and re.fullmatch(r"[A-Za-z0-9][\w.-]*/[\w.-]+", path):
        return path
    raise FileNotFoundError(f"--model {model}: no such checkpoint folder (nor the built-in name smollm2)")


def torch_dtype(dtype):
    """``dtype`` (a ``torch.dtype`` or its name, ``"float32"``) as a floating-point ``torch.dtype``.

    Raises:
        ValueError: not the name of a torch floating-point dtype.
    """
    import torch

    if isinstance(dtype, torch.dtype):
        return dtype
    value = getattr(torch, str(dtype), None)
    if not isinstance(value, torch.dtype) or not value.is_floating_point:
        raise ValueError(f"dtype {dtype!r} is not a torch floating-point dtype; use float32, bfloat16 or float16")
    return value


def resolve_device(device: str) -> str:
    """``device`` as torch names it: ``auto`` -> ``cuda`` when torch sees a CUDA GPU, else ``cpu``; ``cpu``, ``cuda``
    and ``cuda:N`` as given.

    Raises:
        ValueError: another device, or ``cuda[:N]`` where torch sees no CUDA GPU.
    """
    import torch

    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if device.split(":")[0] == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"device {device!r}, but torch sees no CUDA GPU; use cpu")
    if device.split(":")[0] not in ("cpu", "cuda"):
        raise ValueError(f"device {device!r}: use auto, cpu or cuda[:N]")
    return device


def _context_length(config) -> int | None:
    for cfg in (config, getattr(config, "text_config", None)):
        n = getattr(cfg, "max_position_embeddings", None) if cfg is not None else None
        if isinstance(n, int) and n > 0:
            return n
    return None


# ----------------------------------------------------------------------------------------------- scoring


@dataclasses.dataclass
class ScoreInfo:
    """What :func:`score_pool` did, besides the lpm: token counts and where the response tokens came from."""

    model: str
    responses: int = 0
    prompt_tokens: int = 0
    response_tokens: int = 0
    from_token_ids: int = 0
    retokenized: int = 0
    retokenized_count_mismatch: int = 0
    load_s: float = 0.0
    forward_s: float = 0.0


def tokenize_pool(pool: Sequence[dict], tokenizer, problems: dict, info: ScoreInfo | None = None):
    """``(prompt_ids, response_ids)``: two lists of int lists, one entry per pool response (see the module doc).

    Raises:
        ValueError: a prompt or a response with no token.
    """
    from capo_verl.evaluation.sampling import encode_prompt

    info = info or ScoreInfo(model="")
    prompt_cache: dict[tuple[str, str], list[int]] = {}
    prompts, responses = [], []
    eos = tokenizer.eos_token_id
    for r in pool:
        key = (str(r["data_source"]), str(r["question_id"]))
        if key not in prompt_cache:
            prompt_cache[key] = encode_prompt(tokenizer, problems[key].prompt)
            if not prompt_cache[key]:  # the first response token needs a position to be predicted from
                raise ValueError(f"pool line {r['_line']}: the rebuilt prompt has no token")
        if r.get("token_ids") is not None:
            ids = list(r["token_ids"])
            info.from_token_ids += 1
        else:
            ids = list(tokenizer(r["response"], add_special_tokens=False)["input_ids"])
            if not r.get("truncated", False):
                if eos is None:
                    raise ValueError("the tokenizer has no EOS token to end the re-tokenized responses with")
                ids.append(int(eos))
            info.retokenized += 1
            n = r.get("num_tokens")
            if isinstance(n, int) and not isinstance(n, bool) and n != len(ids):
                info.retokenized_count_mismatch += 1
        if not ids:
            raise ValueError(f"pool line {r['_line']}: the response has no token; its mean log-prob is undefined")
        prompts.append(prompt_cache[key])
        responses.append(ids)
    return prompts, responses


def _batch_lpm(model, prompts: list[list[int]], responses: list[list[int]], pad_id: int, device: str, accepts_keep):
    """Mean response-token log-prob of each row of one right-padded batch: ``(B,)`` float64 numpy, nats."""
    import torch

    lengths = [len(p) + len(r) for p, r in zip(prompts, responses)]
    B, L = len(lengths), max(lengths)
    ids = torch.full((B, L), pad_id, dtype=torch.long)
    mask = torch.zeros((B, L), dtype=torch.long)
    for i, (p, r) in enumerate(zip(prompts, responses)):
        ids[i, : lengths[i]] = torch.tensor(p + r, dtype=torch.long)
        mask[i, : lengths[i]] = 1
    p_len = torch.tensor([len(p) for p in prompts])
    # position t predicts token t + 1; the first response token of row i sits at p_len[i], predicted at p_len[i] - 1
    start = int(p_len.min()) - 1
    ids, mask = ids.to(device), mask.to(device)
    kwargs = {"input_ids": ids, "attention_mask": mask, "use_cache": False}
    if accepts_keep:
        kwargs["logits_to_keep"] = L - start  # logits of positions start .. L-1 only
    logits = model(**kwargs).logits
    logits = logits[:, -(L - start) :]  # (B, L - start, V) whether or not the model took logits_to_keep
    targets = ids[:, start + 1 :]  # (B, L - start - 1): the token each kept position predicts
    logits = logits[:, :-1]
    pos = torch.arange(start + 1, L, device=device)  # target positions
    resp = (pos[None, :] >= p_len.to(device)[:, None]) & (pos[None, :] < torch.tensor(lengths, device=device)[:, None])
    tok_lp = torch.empty(targets.shape, dtype=torch.float32, device=device)
    step = max(1, _CHUNK_ELEMENTS // max(1, B * logits.shape[-1]))
    for s in range(0, targets.shape[1], step):
        lp = torch.log_softmax(logits[:, s : s + step].float(), dim=-1)  # float32 whatever the model's dtype
        tok_lp[:, s : s + step] = lp.gather(-1, targets[:, s : s + step, None]).squeeze(-1)
    tok_lp = torch.where(resp, tok_lp, torch.zeros((), dtype=tok_lp.dtype, device=device)).double()
    return (tok_lp.sum(1) / resp.sum(1)).cpu().numpy()


def score_pool(
    model_path: str,
    pool_jsonl: str | os.PathLike | Sequence[dict],
    *,
    data: Sequence[str | os.PathLike] = (),
    benchmarks: Sequence[str] = (),
    tokenizer: str | None = None,
    dtype="float32",
    batch_size: int = 8,
    device: str = "cpu",
    info: ScoreInfo | None = None,
) -> np.ndarray:
    """Mean token log-probability of every pool response under one checkpoint, by teacher forcing.

    For response i with prompt tokens ``q`` (length P) and response tokens ``y`` (length R) (how both are obtained:
    module doc), one forward pass over ``q + y`` gives ``lpm_i = (1/R) sum_t log p_theta(y_t | q, y_<t)``: the
    log-softmax of the logits in float32 (whatever ``dtype`` the weights run in), gathered at the response tokens
    and averaged over them only (the prompt does not count), in nats. No sampling, no temperature. Responses are
    sorted by length and run ``batch_size`` at a time, right-padded with an attention mask; padding does not change
    a row's result beyond float rounding. The same pool gives the same batches for every checkpoint.

    Args:
        model_path: a Hugging Face checkpoint folder (``config.json`` + weights), ``smollm2`` (the offline
            SmolLM2-135M-Instruct) or a hub id; see :func:`resolve_model_path`.
        pool_jsonl: the pool file (:func:`read_pool`), or its already-read records.
        data, benchmarks: where the prompts come from, as ``capo-verl eval generate`` resolves them
            (:func:`capo_verl.evaluation.problems.load_problems`); both empty: the pool's data sources as shipped
            benchmark names.
        tokenizer: tokenizer folder for all checkpoints; None: the checkpoint's own.
        dtype: weight dtype, a ``torch.dtype`` or its name (default float32).
        batch_size: responses per forward pass (the memory knob: the logits of a batch are
            ``batch_size x longest sequence x vocabulary`` in ``dtype``).
        device: ``cpu``, ``cuda``, ``cuda:N`` or ``auto``.
        info: a :class:`ScoreInfo` to fill with token counts and timings, or None.

    Returns:
        ``(n,)`` float64 numpy array, nats (<= 0), aligned with the pool's lines in file order.

    Raises:
        FileNotFoundError: no pool file or no model folder.
        ValueError: a bad pool (:func:`read_pool`), a pool question missing from the data, a bad ``dtype`` /
            ``device`` / ``batch_size``, a model or tokenizer that cannot load, a token id outside the model's
            vocabulary, a response without tokens, or a prompt + response longer than the model's context
            (``max_position_embeddings``; the message names the pool line).
    """

    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise ValueError(f"batch_size must be an integer >= 1, got {batch_size!r}")
    dtype = torch_dtype(dtype)
    device = resolve_device(device)
    pool = read_pool(pool_jsonl) if isinstance(pool_jsonl, (str, os.PathLike)) else list(pool_jsonl)
    if not pool:
        raise ValueError("the pool is empty (no responses)")
    for i, r in enumerate(pool, 1):
        r.setdefault("_line", i)
    problems = problems_for(pool, data, benchmarks)
    info = info if info is not None else ScoreInfo(model=model_path)
    t0 = time.perf_counter()
    tok, model = load_model(model_path, tokenizer=tokenizer, dtype=dtype, device=device)
    info.load_s = time.perf_counter() - t0

    prompts, responses = tokenize_pool(pool, tok, problems, info)
    vocab = model.get_input_embeddings().num_embeddings
    check_fits(pool, prompts, responses, model_path, vocab=vocab, context=_context_length(model.config))
    info.responses = len(pool)
    info.prompt_tokens = sum(map(len, prompts))
    info.response_tokens = sum(map(len, responses))
    if info.retokenized_count_mismatch:
        logger.warning(
            "%s: %d of %d re-tokenized responses have another token count than the pool's num_tokens; "
            "generate the pool with --save-token-ids for exact tokens",
            model_path,
            info.retokenized_count_mismatch,
            info.retokenized,
        )

    pad_id = tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id
    pad_id = int(pad_id) if pad_id is not None and 0 <= pad_id < vocab else 0
    t0 = time.perf_counter()
    lpm = _forward_pool(model, prompts, responses, pad_id=pad_id, device=device, batch_size=batch_size)
    info.forward_s = time.perf_counter() - t0
    return lpm


def load_model(model_path: str, *, tokenizer: str | None = None, dtype="float32", device: str = "cpu"):
    """``(tokenizer, model)``: a checkpoint's tokenizer (or ``tokenizer``'s) and its causal LM in ``dtype``, moved to
    ``device`` and in eval mode.

    Raises:
        FileNotFoundError, ValueError: as :func:`resolve_model_path`, :func:`torch_dtype` and
            :func:`resolve_device`; a model or tokenizer that cannot load (ValueError).
    """
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = resolve_model_path(model_path)
    tok_path = resolve_model_path(tokenizer) if tokenizer else path
    try:
        tok = AutoTokenizer.from_pretrained(tok_path)
        model = AutoModelForCausalLM.from_pretrained(path, dtype=torch_dtype(dtype))
    except OSError as e:
        raise ValueError(f"cannot load --model {model_path!r}: {e}") from e
    return tok, model.to(resolve_device(device)).eval()


def check_fits(
    pool: Sequence[dict],
    prompts: Sequence[list[int]],
    responses: Sequence[list[int]],
    model_name: str,
    *,
    vocab: int,
    context: int | None,
) -> None:
    """Refuse a pool response whose tokens the model cannot score: an id outside its ``vocab``, or a prompt +
    response longer than its ``context`` (None: no limit known).

    Raises:
        ValueError: naming the pool line and the model.
    """
    for r, p, y in zip(pool, prompts, responses):
        if max(p + y) >= vocab:
            raise ValueError(
                f"pool line {r['_line']}: token id {max(p + y)} is outside the vocabulary of {model_name} "
                f"({vocab} tokens); the pool comes from a model with another tokenizer"
            )
        if context is not None and len(p) + len(y) > context:
            raise ValueError(
                f"pool line {r['_line']}: prompt {len(p)} + response {len(y)} tokens = {len(p) + len(y)} exceed the "
                f"context of {model_name} ({context} tokens, max_position_embeddings)"
            )


def _forward_pool(model, prompts, responses, *, pad_id: int, device: str, batch_size: int) -> np.ndarray:
    """``(n,)`` float64 lpm of every response: sorted by length, ``batch_size`` per forward pass (:func:`_batch_lpm`),
    in the pool's order again."""
    import torch

    accepts_keep = "logits_to_keep" in inspect.signature(model.forward).parameters
    order = sorted(range(len(prompts)), key=lambda i: (len(prompts[i]) + len(responses[i]), i))
    lpm = np.empty(len(prompts), dtype=np.float64)
    with torch.inference_mode():
        for s in range(0, len(order), batch_size):
            rows = order[s : s + batch_size]
            lpm[rows] = _batch_lpm(
                model, [prompts[i] for i in rows], [responses[i] for i in rows], pad_id, device, accepts_keep
            )
    return lpm


# ----------------------------------------------------------------------------------------------- metrics


def teacher_forced_metrics(lpm, correct, question_ids) -> dict:
    """AUC-mean of teacher-forced lpm against the pool's fixed correctness, and the mean lpm of each outcome.

    Args:
        lpm: ``(n,)`` float mean token log-prob per response (nats), e.g. from :func:`score_pool`; non-finite
            entries are left out (and counted).
        correct: ``(n,)`` bool (or 0/1) correctness per response.
        question_ids: ``(n,)`` question id per response (hashable; e.g. :func:`question_keys`).

    Returns:
        ``auc_mean`` (:func:`capo_verl.metrics.auc_mean`: per question the ROC-AUC of lpm against correctness,
        ties 1/2, averaged over the questions that have both a correct and an incorrect response; NaN when none),
        ``n_mixed_questions``, ``n_questions``, ``n_responses`` (those with a finite lpm), ``n_dropped`` (non-finite
        lpm), ``lpm_mean``, ``lpm_correct_mean`` and ``lpm_incorrect_mean`` (float, nats, pooled over responses;
        NaN when there is no such response).

    Raises:
        ValueError: inputs of different lengths.
    """
    lpm = np.asarray(lpm, dtype=np.float64).reshape(-1)
    correct = np.asarray(correct).reshape(-1).astype(bool)
    group = np.asarray(question_ids).reshape(-1)
    if not (len(lpm) == len(correct) == len(group)):
        raise ValueError(
            f"teacher_forced_metrics: lpm ({len(lpm)}), correct ({len(correct)}) and question_ids ({len(group)}) "
            "must have the same length (one entry per response)"
        )
    ok = np.isfinite(lpm)
    lpm, correct, group = lpm[ok], correct[ok], group[ok]
    value, n_mixed = M.auc_mean(lpm, correct, group)

    def mean(x):
        return float(x.mean()) if len(x) else float("nan")

    return {
        "auc_mean": value,
        "n_mixed_questions": n_mixed,
        "n_questions": int(len(np.unique(group))) if len(group) else 0,
        "n_responses": int(len(lpm)),
        "n_dropped": int((~ok).sum()),
        "lpm_mean": mean(lpm),
        "lpm_correct_mean": mean(lpm[correct]),
        "lpm_incorrect_mean": mean(lpm[~correct]),
    }
