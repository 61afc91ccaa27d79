"""Stage 2 of the evaluation: calibration and accuracy metrics from generation files, with a report.

``score_runs({"grpo": "grpo.jsonl", "capo": "capo.jsonl"}, "out/")`` writes

- ``out/metrics.json``: ``{label: {data_source: M, ..., "all": M, "macro_avg": A}}`` where ``M`` is
  :func:`score_responses`'s dict (``"all"`` pools every question of the run, each question weighing the
  same) and ``A`` the unweighted mean over data sources of ``mean_acc``, ``pass_at_k``, ``auc_mean`` and
  ``its_accuracy`` (the "average across benchmarks" of the paper's Figure 1a; present when a run has two or more
  sources);
- ``out/report.md``: one table per data source (and all), runs side by side;
- ``out/precision_coverage.png`` and ``out/accuracy_vs_auc.png`` (paper Figures 4 and 1a), see
  :mod:`capo_verl.evaluation.plots`;
- ``out/.capo-verl-eval-score.json`` (:data:`MARKER`): marks the folder as this command's. It writes into no other
  non-empty folder unless told to (``overwrite=True``, ``--overwrite``), so a user's ``report.md`` is never replaced.

Every metric is computed from a response's ``lpm`` (confidence, nats) and ``correct``; see
:mod:`capo_verl.evaluation.metrics` for the definitions and sources.
"""

from __future__ import annotations

import json
import math
import os
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

import numpy as np

from capo_verl import inputs
from capo_verl.evaluation import REQUIRED_FIELDS
from capo_verl.evaluation import metrics as M
from capo_verl.stored import open_binary, stored

#: marks a folder that ``capo-verl eval score`` made (:func:`check_out_dir`)
MARKER = ".capo-verl-eval-score.json"

#: what ``eval score`` writes into ``--out``: replaced as a whole, the folder's other entries kept
OUTPUTS = ("metrics.json", "report.md", "precision_coverage.png", "accuracy_vs_auc.png", MARKER)

#: Coverage levels at which precision is reported (paper Figure 4's x axis in steps of 0.1).
COVERAGE_LEVELS = tuple(round(0.1 * i, 1) for i in range(1, 11))


def pass_k_values(k: int) -> list[int]:
    """The k at which pass@k is reported for questions with (at least) ``k`` responses each: the powers of two
    below ``k``, then ``k`` itself (``k = 8``: 1, 2, 4, 8; ``k = 12``: 1, 2, 4, 8, 12; ``k = 1``: 1), the points
    of a pass@k curve on a log axis, a handful of numbers even for large k. Empty for ``k < 1``."""
    return [2**j for j in range(k.bit_length()) if 2**j < k] + ([k] if k >= 1 else [])


def _jsonl_stem(path: str) -> str:
    return Path(path).name.removesuffix(".jsonl")


def parse_labelled(
    specs: Sequence[str], *, what: str = "generation file", default_label: Callable[[str], str] | None = None
) -> dict[str, str]:
    """``["grpo=a.jsonl", "b.jsonl"]`` -> ``{"grpo": "a.jsonl", "b": "b.jsonl"}``: ``LABEL=PATH`` or ``PATH`` (an
    existing path that contains ``=`` is a path). The label of a bare ``PATH`` is ``default_label(PATH)``, by default
    the file name without ``.jsonl``. ``what`` names the argument in the errors (``"--model"``, ...).

    Raises:
        ValueError: an empty label or path, or the same label twice.
    """
    default_label = default_label or _jsonl_stem
    runs: dict[str, str] = {}
    for spec in specs:
        label, path = None, spec
        if "=" in spec and not os.path.exists(spec):
            label, path = spec.split("=", 1)
            if not label or not path:
                raise ValueError(f"bad {what} spec {spec!r}; use LABEL=PATH or PATH")
        label = label or default_label(path)
        if label in runs:
            raise ValueError(f"{what}: label {label!r} is given twice; name each with LABEL=PATH")
        runs[label] = path
    return runs


#: A mean token log-prob is <= 0 nats; values up to this are accepted as float rounding of a log-prob of 0.
LPM_TOLERANCE = 1e-6


def _is_number(x) -> bool:
    """A JSON number (int or float), not a bool (``True`` is an ``int`` in Python) nor a numeric string."""
    return isinstance(x, (int, float)) and not isinstance(x, bool)


def _check_line(rec: dict, where: str) -> None:
    """Type and range checks of one generation line; ``where`` is ``"FILE:LINE"``."""

    def bad(field: str, expected: str):
        value = rec[field]
        return ValueError(f"{where}: {field} is {json.dumps(value)} ({type(value).__name__}); expected {expected}")

    if not isinstance(rec["data_source"], str) or not rec["data_source"]:
        raise bad("data_source", "a non-empty string")
    qid = rec["question_id"]
    if not (isinstance(qid, str) or _is_number(qid) and (isinstance(qid, int) or math.isfinite(qid))):
        raise bad("question_id", "a string or a finite number")
    idx = rec["sample_index"]
    if not isinstance(idx, int) or isinstance(idx, bool) or idx < 0:
        raise bad("sample_index", "an integer >= 0")
    if not isinstance(rec["response"], str):
        raise bad("response", "a string")
    if rec["answer"] is not None and not isinstance(rec["answer"], str):
        raise bad("answer", 'a string ("" or null when no answer was found)')
    if not isinstance(rec["correct"], bool):
        raise bad("correct", "a JSON boolean, true or false (strings and 0/1 are not accepted)")
    lpm = rec["lpm"]
    if not _is_number(lpm):
        raise bad("lpm", "a number, the response's mean token log-prob in nats")
    try:
        value = float(lpm)
    except OverflowError:  # an int beyond float range
        value = math.inf
    if not math.isfinite(value):
        raise ValueError(
            f"{where}: lpm is {lpm!r}; every response needs a finite mean log-prob (regenerate it, or drop that line)"
        )
    if value > LPM_TOLERANCE:
        raise ValueError(
            f"{where}: lpm is {lpm!r}, but a mean token log-prob is <= 0 nats (up to {LPM_TOLERANCE:g} "
            "is accepted as float rounding); is it a negated log-prob or a probability?"
        )
    n = rec["num_tokens"]
    if not isinstance(n, int) or isinstance(n, bool) or n < 0:
        raise bad("num_tokens", "an integer >= 0")
    if "truncated" in rec and not isinstance(rec["truncated"], bool):
        raise bad("truncated", "a JSON boolean, true or false")


def read_generations(path: str | os.PathLike) -> dict[str, np.ndarray]:
    """Load a generation file (``capo-verl eval generate`` output) into column arrays, checking every line.

    A file holds one run: every question has the same number k of responses, each ``sample_index`` once.

    Returns:
        ``{"data_source", "question_id", "answer"}`` as object arrays of str, ``"correct"`` bool,
        ``"lpm"`` float64 (nats), ``"num_tokens"`` int64, ``"truncated"`` bool (False when absent); one
        entry per response, in file order.

    Raises:
        FileNotFoundError: no such file.
        ValueError: the path is a folder, a symlink loop, not a JSON-lines file by its first bytes or a sparse file
            (:func:`capo_verl.inputs.check_data_file`), a ``.xz`` or ``.gz`` file is cut short or corrupt
            (:class:`capo_verl.inputs.NotADataFile`, :func:`capo_verl.stored.open_binary`), the file is empty or not
            UTF-8, a line is too long
            (:data:`capo_verl.inputs.MAX_LINE_BYTES`), or a line is not a JSON object,
            lacks a field of :data:`REQUIRED_FIELDS`, or has a value of the wrong type or range:
            ``data_source`` a non-empty string, ``question_id`` a string or finite number, ``sample_index``
            and ``num_tokens`` integers >= 0, ``response`` a string, ``answer`` a string or null,
            ``correct`` (and ``truncated`` when present) a JSON boolean (not a string, not 0/1), ``lpm`` a
            finite number <= :data:`LPM_TOLERANCE`; or a ``(data_source, question_id, sample_index)``
            repeats; or questions have different numbers of responses (runs of different k mixed in one
            file). The message names the file and line.
    """
    path = stored(path)  # committed generations are kept compressed: <name>.jsonl.xz
    inputs.check_data_file(  # a loop, a folder, a sparse file or another format: refused before it is read
        path,
        "generation file",
        hint="write one with `capo-verl eval generate`",
        folder_hint="pass a generation .jsonl file (from `capo-verl eval generate`)",
    )
    cols: dict[str, list] = {
        f: [] for f in ("data_source", "question_id", "answer", "correct", "lpm", "num_tokens", "truncated")
    }
    first_line: dict[tuple[str, str, int], int] = {}  # (data_source, question_id, sample_index) -> line
    questions: dict[tuple[str, str], list[int]] = {}  # (data_source, question_id) -> [first line, responses]
    with open_binary(path) as f:
        for i, raw in inputs.numbered_lines(f, path):  # a line beyond its bound refused before it is held whole
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as e:
                raise ValueError(
                    f"{path}:{i}: not UTF-8 text ({e.reason} at byte {e.start}); "
                    "is this a `capo-verl eval generate` output?"
                ) from None
            if not line.strip():
                continue
            try:
                rec = json.loads(line)
            except json.JSONDecodeError as e:
                raise ValueError(
                    f"{path}:{i}: not a JSON line ({e}); is this a `capo-verl eval generate` output?"
                ) from e
            if not isinstance(rec, dict):
                raise ValueError(
                    f"{path}:{i}: a JSON {type(rec).__name__}, not an object; each line is one response "
                    "as a JSON object"
                )
            missing = [k for k in REQUIRED_FIELDS if k not in rec]
            if missing:
                raise ValueError(f"{path}:{i}: missing field(s) {missing}; each line needs {list(REQUIRED_FIELDS)}")
            _check_line(rec, f"{path}:{i}")
            question = (rec["data_source"], str(rec["question_id"]))
            sample = (*question, rec["sample_index"])
            if sample in first_line:
                raise ValueError(
                    f"{path}:{i}: duplicate response: data_source {question[0]!r}, question_id "
                    f"{question[1]!r}, sample_index {sample[2]} is already on line {first_line[sample]} "
                    "(the same run appended twice?); keep one of them"
                )
            first_line[sample] = i
            questions.setdefault(question, [i, 0])[1] += 1
            cols["data_source"].append(question[0])
            cols["question_id"].append(question[1])
            cols["answer"].append(rec["answer"] or "")
            cols["correct"].append(rec["correct"])
            cols["lpm"].append(float(rec["lpm"]))
            cols["num_tokens"].append(rec["num_tokens"])
            cols["truncated"].append(rec.get("truncated", False))
    if not cols["lpm"]:
        raise ValueError(f"{path}: no responses in the file")
    counts = Counter(n for _, n in questions.values())
    if len(counts) > 1:
        k = counts.most_common(1)[0][0]
        (ds, qid), (line, n) = next((q, v) for q, v in questions.items() if v[1] != k)
        sizes = ", ".join(f"{m} for {c} question(s)" for m, c in sorted(counts.items(), reverse=True))
        raise ValueError(
            f"{path}:{line}: data_source {ds!r}, question_id {qid!r} has {n} response(s), but other "
            f"questions have {k} (responses per question in this file: {sizes}); a file holds one run "
            "with the same k for every question: put runs of different k in separate files"
        )
    return {
        "data_source": np.array(cols["data_source"], dtype=object),
        "question_id": np.array(cols["question_id"], dtype=object),
        "answer": np.array(cols["answer"], dtype=object),
        "correct": np.array(cols["correct"], dtype=bool),
        "lpm": np.array(cols["lpm"], dtype=np.float64),
        "num_tokens": np.array(cols["num_tokens"], dtype=np.int64),
        "truncated": np.array(cols["truncated"], dtype=bool),
    }


def score_responses(
    group, answer, correct, lpm, num_tokens=None, truncated=None, levels: Sequence[float] = COVERAGE_LEVELS
) -> dict:
    """All metrics of one set of responses (one data source, or all of a run).

    Args:
        group: ``(n,)`` question id per response (unique across the set).
        answer: ``(n,)`` extracted answer (str, ``""`` if none).
        correct: ``(n,)`` bool.
        lpm: ``(n,)`` float64 mean token log-prob (nats), the confidence.
        num_tokens, truncated: ``(n,)`` optional, for the response-length statistics.
        levels: coverages for ``precision_coverage.precision``.

    Returns:
        dict with ``n_questions``, ``n_responses``, ``k`` (responses per question: an int, or
        ``{"min", "max"}`` when ragged), ``mean_acc`` (mean@k), ``pass_at_k`` (``{"1": pass@1, "2": pass@2,
        ...}``, the unbiased estimator of Chen et al. 2021 at :func:`pass_k_values` of the smallest number of
        responses of a question; pass@1 = mean@k), ``auc_mean`` and ``n_mixed_questions``
        (Eq. 7-8), ``its_accuracy`` (``{"ppl_consistency", "majority_vote", "max_lpm"}``, Algorithm 1),
        ``precision_coverage`` (``{"coverage", "precision", "area"}``, Figure 4), ``answered_frac``
        (non-empty answer), ``lpm_correct_mean``/``lpm_incorrect_mean``, and with ``num_tokens``:
        ``mean_num_tokens``, ``truncated_frac``. Undefined values are NaN (``null`` in metrics.json).
    """
    group = np.asarray(group)
    correct = np.asarray(correct, dtype=bool)
    lpm = np.asarray(lpm, dtype=np.float64)
    answer = np.asarray(answer, dtype=object)
    _, counts = np.unique(group, return_counts=True)
    k = int(counts[0]) if counts.min() == counts.max() else {"min": int(counts.min()), "max": int(counts.max())}
    mean_acc, nq = M.mean_at_k(correct, group)
    auc, n_mixed = M.auc_mean(lpm, correct, group)
    pass_curve, _ = M.pass_at_k_curve(correct, group, int(counts.min()))  # pass@1 .. pass@K, K = the fewest responses
    out = {
        "n_questions": nq,
        "n_responses": int(len(lpm)),
        "k": k,
        "mean_acc": mean_acc,
        "pass_at_k": {str(j): float(pass_curve[j - 1]) for j in pass_k_values(int(counts.min()))},
        "auc_mean": auc,
        "n_mixed_questions": n_mixed,
        "its_accuracy": {m: M.its_accuracy(group, answer, lpm, correct, m) for m in M.ITS_METHODS},
        "precision_coverage": {
            "coverage": [float(c) for c in levels],
            "precision": M.precision_at_coverage(lpm, correct, levels).tolist(),
            "area": M.precision_coverage_area(lpm, correct),
        },
        "answered_frac": float(np.mean(answer != "")),
        "lpm_correct_mean": float(lpm[correct].mean()) if correct.any() else float("nan"),
        "lpm_incorrect_mean": float(lpm[~correct].mean()) if (~correct).any() else float("nan"),
    }
    if num_tokens is not None:
        out["mean_num_tokens"] = float(np.mean(num_tokens))
    if truncated is not None:
        out["truncated_frac"] = float(np.mean(truncated))
    return out


def score_generations(cols: Mapping[str, np.ndarray], levels: Sequence[float] = COVERAGE_LEVELS) -> dict:
    """Metrics of one run per data source (sorted by name), then ``"all"`` and, with 2+ sources, ``"macro_avg"``."""
    ds = cols["data_source"]
    out = {}
    for source in sorted(set(ds.tolist())):
        sel = ds == source
        out[source] = score_responses(
            cols["question_id"][sel],
            cols["answer"][sel],
            cols["correct"][sel],
            cols["lpm"][sel],
            cols["num_tokens"][sel],
            cols["truncated"][sel],
            levels,
        )
    group_all = np.array([f"{d}\x1f{q}" for d, q in zip(ds, cols["question_id"])], dtype=object)
    out["all"] = score_responses(
        group_all, cols["answer"], cols["correct"], cols["lpm"], cols["num_tokens"], cols["truncated"], levels
    )
    sources = [s for s in out if s != "all"]
    if len(sources) > 1:

        def avg(values):
            values = [v for v in values if not math.isnan(v)]
            return float(np.mean(values)) if values else float("nan")

        out["macro_avg"] = {
            "n_data_sources": len(sources),
            "mean_acc": avg([out[s]["mean_acc"] for s in sources]),
            # a k that some source lacks (fewer responses there) averages the sources that have it
            "pass_at_k": {
                j: avg([out[s]["pass_at_k"][j] for s in sources if j in out[s]["pass_at_k"]])
                for j in _pass_keys(out[s] for s in sources)
            },
            "auc_mean": avg([out[s]["auc_mean"] for s in sources]),
            "its_accuracy": {m: avg([out[s]["its_accuracy"][m] for s in sources]) for m in M.ITS_METHODS},
        }
    return out


def _pass_keys(metrics) -> list[str]:
    """The pass@k keys (``"1"``, ``"2"``, ...) found in any of ``metrics`` (dicts or None), in increasing k."""
    return sorted({j for m in metrics if m is not None for j in m.get("pass_at_k", {})}, key=int)


def _json_safe(x):
    """NaN -> None, so that metrics.json is strict JSON (``null`` where a metric is undefined)."""
    if isinstance(x, dict):
        return {k: _json_safe(v) for k, v in x.items()}
    if isinstance(x, list):
        return [_json_safe(v) for v in x]
    if isinstance(x, float) and math.isnan(x):
        return None
    return x


#: the fields of a generation file's ``.meta.json`` that the report shows, and what each must be (a missing one, or
#: null, is shown as "–")
META_FIELDS: dict[str, tuple[str, Callable[[object], bool]]] = {
    "model": ("a string", lambda v: isinstance(v, str)),
    "backend": ("a string", lambda v: isinstance(v, str)),
    "k": ("an integer", lambda v: isinstance(v, int) and not isinstance(v, bool)),
    "temperature": ("a number", _is_number),
    "top_p": ("a number", _is_number),
    "max_new_tokens": ("an integer", lambda v: isinstance(v, int) and not isinstance(v, bool)),
    "seed": ("an integer", lambda v: isinstance(v, int) and not isinstance(v, bool)),
    "wall_s": ("a finite number of seconds", lambda v: _is_number(v) and math.isfinite(v)),
}


def meta_file(path: str | os.PathLike) -> Path:
    """The settings sidecar of a generation file: ``<path>.meta.json`` (``capo-verl eval generate`` writes it)."""
    return Path(f"{os.path.expanduser(str(path))}.meta.json")


def read_meta(path: str | os.PathLike) -> dict:
    """The settings of generation file ``path`` from its ``.meta.json`` (:func:`meta_file`), for the report's runs
    table; ``{}`` when there is none. The file is checked before it is read
    (:func:`capo_verl.inputs.check_data_file`: a FIFO or a folder is refused, not waited on), must hold a JSON object,
    and each field of :data:`META_FIELDS` it has must be of its type.

    Raises:
        capo_verl.inputs.NotADataFile, capo_verl.inputs.BadDataLine: not a regular file, or not JSON.
        ValueError: not a JSON object, or a field of the wrong type. Every message names the file (and the field)
            and the fix: remove the file (the report then shows no settings for the run) or regenerate it.
    """
    mp = meta_file(path)
    if not os.path.lexists(mp):
        return {}
    fix = (
        f"remove {mp} (the report then shows no settings for this run), or regenerate it with `capo-verl eval generate`"
    )
    try:
        meta = inputs.read_json(mp, "generation meta file", folder_hint=fix)
    except (inputs.NotADataFile, inputs.BadDataLine) as e:
        raise type(e)(f"{e}; {fix}") from None
    if not isinstance(meta, dict):
        raise ValueError(f"{mp}: a JSON {type(meta).__name__}, not an object of a run's settings; {fix}")
    for name, (expected, ok) in META_FIELDS.items():
        value = meta.get(name)
        if value is not None and not ok(value):
            raise ValueError(
                f"{mp}: {name} is {json.dumps(value)[:80]} ({type(value).__name__}); expected {expected}; {fix}"
            )
    return meta


# ----------------------------------------------------------------------------------------------- report

_ITS_NAMES = {"ppl_consistency": "perplexity consistency", "majority_vote": "majority vote", "max_lpm": "max lpm"}


def _pct(x) -> str:
    return "–" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{100 * x:.1f}"


def _num(x, fmt=".3f") -> str:
    return "–" if x is None or (isinstance(x, float) and math.isnan(x)) else format(x, fmt)


def _k(k) -> str:
    return str(k) if isinstance(k, int) else f"{k['min']}–{k['max']}"


def _table(labels: list[str], rows: list[tuple[str, list[str]]]) -> list[str]:
    lines = ["| metric | " + " | ".join(labels) + " |", "|---|" + "---:|" * len(labels)]
    lines += [f"| {name} | " + " | ".join(cells) + " |" for name, cells in rows]
    return lines


def _source_rows(per_run: list[dict | None]) -> list[tuple[str, list[str]]]:
    def cells(fn):
        return [fn(m) if m is not None else "–" for m in per_run]

    rows = [
        ("questions", cells(lambda m: str(m["n_questions"]))),
        ("responses per question (k)", cells(lambda m: _k(m["k"]))),
        ("mean@k accuracy (%)", cells(lambda m: _pct(m["mean_acc"]))),
        *[(f"pass@{j} (%)", cells(lambda m, j=j: _pct(m.get("pass_at_k", {}).get(j)))) for j in _pass_keys(per_run)],
        ("AUC-mean", cells(lambda m: _num(m["auc_mean"]))),
        ("questions with both outcomes", cells(lambda m: str(m["n_mixed_questions"]))),
    ]
    rows += [
        (f"ITS accuracy, {name} (%)", cells(lambda m, key=key: _pct(m["its_accuracy"][key])))
        for key, name in _ITS_NAMES.items()
    ]
    levels = next(m for m in per_run if m is not None)["precision_coverage"]["coverage"]
    rows += [
        (f"precision @ coverage {c:.1f} (%)", cells(lambda m, i=i: _pct(m["precision_coverage"]["precision"][i])))
        for i, c in enumerate(levels)
    ]
    rows += [
        ("area under precision-coverage (%)", cells(lambda m: _pct(m["precision_coverage"]["area"]))),
        (
            "mean lpm, correct / incorrect (nats)",
            cells(lambda m: f"{_num(m['lpm_correct_mean'])} / {_num(m['lpm_incorrect_mean'])}"),
        ),
        ("responses with an answer (%)", cells(lambda m: _pct(m["answered_frac"]))),
        ("truncated responses (%)", cells(lambda m: _pct(m.get("truncated_frac")))),
        ("mean response tokens", cells(lambda m: _num(m.get("mean_num_tokens"), ".1f"))),
    ]
    return rows


def write_report(
    results: Mapping[str, dict],
    files: Mapping[str, str],
    metas: Mapping[str, dict],
    out_dir: str | os.PathLike,
    plots: Sequence[str] = (),
) -> Path:
    """Write ``out_dir/report.md``: the runs, then one table per data source and all (runs side by side)."""
    labels = list(results)
    lines = [
        "# Evaluation report",
        "",
        "Confidence is each response's mean token log-probability `lpm` (nats). mean@k: mean over questions "
        "of the fraction correct. pass@k: the unbiased estimator of Chen et al. 2021, per question "
        "1 - C(n-c, k) / C(n, k) with c correct among its n responses (the chance that k of them drawn without "
        "replacement include a correct one), averaged over questions; reported at k = 1, 2, 4, ... and k = n. "
        "pass@1 equals mean@k. AUC-mean: per-question ROC-AUC of lpm against correctness (ties 1/2), "
        "averaged over questions with both outcomes (paper Eq. 7-8). ITS: one answer per question from "
        "its k responses (perplexity consistency = paper Algorithm 1; empty answers do not vote; ties "
        "share credit). Precision @ coverage: responses pooled and ranked by lpm, precision of the most "
        "confident fraction (paper Figure 4). `all` pools every question of a run.",
        "",
        "## Runs",
        "",
        "| run | file | model | backend | k | temperature | top_p | max new tokens | seed | generation wall time |",
        "|---|---|---|---|---:|---:|---:|---:|---:|---:|",
    ]
    for label in labels:
        m = metas.get(label) or {}

        def cell(name: str, m=m) -> str:
            value = m.get(name)
            return "–" if value is None else str(value)

        wall = m.get("wall_s")
        lines.append(
            f"| {label} | `{files[label]}` | {cell('model')} | {cell('backend')} | "
            f"{cell('k')} | {cell('temperature')} | {cell('top_p')} | "
            f"{cell('max_new_tokens')} | {cell('seed')} | "
            f"{'–' if wall is None else f'{wall:.0f} s'} |"
        )
    sources = sorted({s for r in results.values() for s in r if s not in ("all", "macro_avg")})
    for source in [*sources, "all"]:
        lines += ["", f"## {source}", ""]
        lines += _table(labels, _source_rows([results[l].get(source) for l in labels]))
    if any("macro_avg" in r for r in results.values()):
        lines += [
            "",
            "## average over data sources (unweighted, as the paper's Figure 1a)",
            "",
            "Each metric averages the data sources where it is defined (AUC-mean needs a question with both outcomes).",
            "",
        ]
        rows = [
            (
                "data sources",
                [str(results[l]["macro_avg"]["n_data_sources"]) if "macro_avg" in results[l] else "–" for l in labels],
            ),
            ("mean@k accuracy (%)", [_pct(results[l].get("macro_avg", {}).get("mean_acc")) for l in labels]),
            *[
                (f"pass@{j} (%)", [_pct(results[l].get("macro_avg", {}).get("pass_at_k", {}).get(j)) for l in labels])
                for j in _pass_keys(results[l].get("macro_avg") for l in labels)
            ],
            ("AUC-mean", [_num(results[l].get("macro_avg", {}).get("auc_mean")) for l in labels]),
        ]
        rows += [
            (
                f"ITS accuracy, {name} (%)",
                [_pct(results[l].get("macro_avg", {}).get("its_accuracy", {}).get(key)) for l in labels],
            )
            for key, name in _ITS_NAMES.items()
        ]
        lines += _table(labels, rows)
    if plots:
        lines += ["", "## Plots", ""] + [f"![{Path(p).stem}]({Path(p).name})" for p in plots]
    path = Path(out_dir) / "report.md"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def _scored_before_the_marker(out_dir: Path) -> bool:
    """Whether ``out_dir`` holds the ``metrics.json`` of an ``eval score`` from before :data:`MARKER` existed:
    ``{label: {..., "all": {...}}}``."""
    try:
        metrics = json.loads((out_dir / "metrics.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    return (
        isinstance(metrics, dict)
        and bool(metrics)
        and all(isinstance(m, dict) and isinstance(m.get("all"), dict) for m in metrics.values())
    )


def check_out_dir(out_dir: str | os.PathLike, overwrite: bool = False) -> Path:
    """Refuse a report folder this command may not write into; changes nothing on disk.

    Accepted: a folder that does not exist yet (and can be made), an empty one, one an earlier ``eval score`` made
    (with :data:`MARKER`, or with its ``metrics.json`` from before the marker), and with ``overwrite`` any folder.

    Returns:
        ``Path(out_dir)``.

    Raises:
        ValueError: ``out_dir`` is a file or lies under one, cannot be written, or is a non-empty folder that
            ``eval score`` did not make while ``overwrite`` is false.
    """
    from capo_verl import commands

    out = commands.check_out_dir(out_dir, "--out")
    if overwrite or not out.exists() or (out / MARKER).is_file() or not any(out.iterdir()):
        return out
    if _scored_before_the_marker(out):
        return out
    raise ValueError(
        f"--out {out_dir} is a folder that capo-verl eval score did not make (no {MARKER}); its metrics.json, "
        "report.md and plots would be replaced: choose a new folder, or pass --overwrite"
    )


def score_runs(
    runs: Mapping[str, str | os.PathLike],
    out_dir: str | os.PathLike,
    plots: bool = True,
    levels: Sequence[float] = COVERAGE_LEVELS,
    overwrite: bool = False,
) -> dict:
    """Score labelled generation files and write ``metrics.json``, ``report.md`` and the plots to ``out_dir``.

    Every file is read and scored before anything is written; the folder is then written whole or not at all
    (:class:`capo_verl.outputs.Outputs`: built beside ``out_dir`` and moved in with one rename, under a lock). Its
    entries other than :data:`OUTPUTS` are kept.

    Args:
        runs: ``{label: path}`` (see :func:`parse_labelled`); order = column order in the report.
        out_dir: created if needed; marked with :data:`MARKER` (:func:`check_out_dir`).
        plots: also draw the PNGs (matplotlib, Agg backend).
        levels: coverage levels reported in the tables and JSON.
        overwrite: write into a non-empty folder that ``eval score`` did not make.

    Returns:
        The metrics dict written to ``metrics.json`` (``{label: {data_source | "all" | "macro_avg": ...}}``;
        NaN here, ``null`` in the file).

    Raises:
        ValueError: no runs, an ``out_dir`` refused by :func:`check_out_dir`, or a generation file is malformed
            (see :func:`read_generations`; every file is read and checked before anything is written).
        capo_verl.inputs.NotADataFile, capo_verl.inputs.BadDataLine, ValueError: a generation file's ``.meta.json``
            that is not a regular file, not a JSON object, or has a field of the wrong type (:func:`read_meta`).
        capo_verl.outputs.InputIsOutput: ``out_dir`` is, or owns, a generation file, or a generation file lies at a
            path the output machinery writes (:meth:`capo_verl.outputs.Output.machinery`).
        capo_verl.outputs.OutputLocked: another process writes ``out_dir``.
        FileNotFoundError: a generation file does not exist.
    """
    from capo_verl.outputs import Outputs

    if not runs:
        raise ValueError("no generation files given: pass --generations [LABEL=]PATH.jsonl ...")
    outs = Outputs("eval score")
    outs.input("--generations", *runs.values())
    report = outs.folder("--out", check_out_dir(out_dir, overwrite), owns=OUTPUTS)
    outs.check()
    cols = {label: read_generations(path) for label, path in runs.items()}
    metas = {label: read_meta(path) for label, path in runs.items()}  # a bad one refused before anything is written
    results = {label: score_generations(c, levels) for label, c in cols.items()}
    with outs.writing():  # into a sibling folder, moved in whole at the end
        stage = report.stage
        (stage / MARKER).write_text(json.dumps({"runs": {l: str(p) for l, p in runs.items()}}, indent=1) + "\n")
        (stage / "metrics.json").write_text(
            json.dumps(_json_safe(results), indent=2, allow_nan=False) + "\n", encoding="utf-8"
        )
        pngs: list[str] = []
        if plots:
            from capo_verl.evaluation import plots as P

            pngs.append(str(P.plot_precision_coverage(cols, stage / "precision_coverage.png")))
            pngs.append(str(P.plot_accuracy_vs_auc(results, stage / "accuracy_vs_auc.png")))
        write_report(results, {l: str(p) for l, p in runs.items()}, metas, stage, pngs)
    return results
