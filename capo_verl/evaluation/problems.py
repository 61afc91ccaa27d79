"""The problems of an evaluation: verl parquet / JSON lines rows, or benchmarks shipped with capo-verl, as
:class:`Problem` (``capo-verl eval generate --data`` / ``--benchmarks``; the teacher-forced pool's questions)."""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any


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
        ValueError: a row is not a mapping, lacks ``data_source``, ``prompt`` or ``reward_model.ground_truth``, or
            two rows share ``(data_source, question_id)``.
    """
    out: list[Problem] = []
    seen: set[tuple[str, str]] = set()
    for i, row in enumerate(rows):
        if not isinstance(row, dict):
            raise ValueError(f"{where}: row {i} is a {type(row).__name__}, not an object (one row per JSON object)")
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
    """Read a ``.parquet``, ``.jsonl`` or ``.json`` (list of rows) file into a list of dicts.

    The file is checked before it is read (:func:`capo_verl.inputs.check_data_file`: a folder, a sparse file, a
    file of another format are refused before memory grows).

    Raises:
        FileNotFoundError: no such file.
        ValueError: an unsupported suffix; :class:`capo_verl.inputs.NotADataFile`, or
            :class:`capo_verl.inputs.BadDataLine` naming the file and line of a JSON error.
    """
    from capo_verl import inputs

    path = Path(path)
    if path.suffix not in (".parquet", ".jsonl", ".json"):
        raise ValueError(f"{path}: unsupported data file type {path.suffix!r}; use .parquet, .jsonl or .json")
    inputs.check_data_file(path, "data file")
    if path.suffix == ".parquet":
        import pandas as pd

        return pd.read_parquet(path).to_dict("records")
    if path.suffix == ".jsonl":
        return inputs.read_jsonl(path, "data file")
    data = inputs.read_json(path, "data file")
    return data if isinstance(data, list) else [data]


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


def benchmark_files(names: Sequence[str]) -> list[Path]:
    """The shipped files that :func:`load_problems` reads for the ``benchmarks`` ``names`` (``paper`` expanded;
    an unknown name is skipped: :func:`capo_verl.data.load_benchmark` refuses it), to declare as a command's inputs."""
    from capo_verl import data

    return [
        Path(data.SHIPPED_BENCHMARKS_DIR) / data.BENCHMARKS[name].file
        for name in expand_benchmarks(names)
        if name in data.BENCHMARKS
    ]


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
