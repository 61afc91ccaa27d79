"""Data preparation: verl parquet for training (DeepScaleR) and the six evaluation benchmarks.

Run as ``capo-verl prepare-data [options]`` or ``python -m capo_verl.data [options]`` (``--help``).

Every row, training or evaluation, has verl's RL schema (``verl/utils/dataset/rl_dataset.py``)::

    data_source   str    "deepscaler" | "aime24" | "aime25" | "math500" | "amc23" | "minerva_math" | "olympiadbench"
    prompt        list   [{"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": problem}]
    ability       str    "math"
    reward_model  dict   {"style": "rule", "ground_truth": answer (str)}
    extra_info    dict   {"split": "train" | "val" | "test", "index": int (row in the source), "problem": str}

The prompt template (:data:`SYSTEM_PROMPT`, :func:`make_prompt`) is stated here and nowhere else: the
Qwen2.5-Math chain-of-thought prompt used by Qwen2.5-Math RL recipes (system message "Please reason step by
step, and put your final answer within \\boxed{}.", the problem as the user message). verl applies the
model's chat template to it.

Training (paper section 5.1): DeepScaleR-Preview (hub id :data:`DEEPSCALER_HUB_ID`, or a local
json/jsonl/parquet file with ``problem``/``answer`` columns, or a verl-format parquet such as the shipped
1,209-problem subset) is permuted with ``numpy.random.default_rng(seed)``; the first ``val_size`` problems
form the validation set, the next ``train_size`` the training set (defaults 240 and 20,000, seed 42).

Evaluation: the local jsonl files of :data:`BENCHMARKS` (shipped in ``capo_verl/resources/benchmarks``;
each keeps its gold answer in a different field, see ``capo_verl/resources/SOURCES.md``).

The CPU jobs (SmolLM2-135M-Instruct) train on GSM8K's one-step calculations instead, ``"What is 48 / 2? Answer with
the number only."`` (:func:`write_gsm8k_calc_parquet`; ``capo-verl compare`` and the CPU launch script write them).

Outputs in ``--out-dir`` (default ``$CAPO_DATA_DIR`` or ``~/data/capo``): ``deepscaler_train.parquet``,
``deepscaler_val.parquet``, ``<benchmark>.parquet`` and ``manifest.json`` (row counts, source, seed, prompt).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from capo_verl import commands
from capo_verl.stored import read_text

__all__ = [
    "SYSTEM_PROMPT",
    "DEEPSCALER_HUB_ID",
    "BENCHMARKS",
    "DEFAULT_BENCHMARKS",
    "make_prompt",
    "make_row",
    "load_deepscaler",
    "split_train_val",
    "load_benchmark",
    "GSM8K_CALC_SOURCE",
    "gsm8k_calc_problems",
    "gsm8k_calc_prompt",
    "write_gsm8k_calc_parquet",
    "DataFolderError",
    "gsm8k_calc_main",
    "prepare",
    "build_parser",
    "run",
    "main",
]

#: The one prompt template of this project (Qwen2.5-Math CoT prompt): system message + the problem as user turn.
SYSTEM_PROMPT = "Please reason step by step, and put your final answer within \\boxed{}."
DEEPSCALER_HUB_ID = "agentica-org/DeepScaleR-Preview-Dataset"
TRAIN_SIZE = 20_000
VAL_SIZE = 240
SEED = 42
RESOURCES = Path(__file__).resolve().parent / "resources"
SHIPPED_BENCHMARKS_DIR = RESOURCES / "benchmarks"

# Instructions that other recipes append to the problem (e.g. the shipped verl-format DeepScaleR subset);
# stripped when a verl-format file is read back, so that only SYSTEM_PROMPT instructs the model.
_KNOWN_INSTRUCTION_SUFFIXES = (
    "Let's think step by step and output the final answer within \\boxed{}.",
    "Please reason step by step, and put your final answer within \\boxed{}.",
)


def make_prompt(problem: str) -> list[dict[str, str]]:
    """The chat prompt for one problem: ``[system SYSTEM_PROMPT, user problem]``."""
    return [{"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": problem}]


def make_row(data_source: str, problem: str, answer: str, split: str, index: int) -> dict:
    """One verl RL row (schema in the module docstring)."""
    return {
        "data_source": data_source,
        "prompt": make_prompt(problem),
        "ability": "math",
        "reward_model": {"style": "rule", "ground_truth": answer},
        "extra_info": {"split": split, "index": int(index), "problem": problem},
    }


def _answer_to_str(value) -> str:
    """Gold answer as a string: 27.0 -> "27", "$\\frac{1}{2}$" -> "\\frac{1}{2}"."""
    if isinstance(value, (float, np.floating)) and float(value).is_integer():
        return str(int(value))
    if isinstance(value, (int, np.integer, float, np.floating)):
        return str(value)
    text = str(value).strip()
    while len(text) >= 2 and text.startswith("$") and text.endswith("$"):
        text = text[1:-1].strip()
    return text


# --------------------------------------------------------------------------------------------------------
# training data
# --------------------------------------------------------------------------------------------------------
def _read_table(path: Path) -> pd.DataFrame:
    """A ``.parquet``, ``.jsonl`` or ``.json`` table, checked before it is read
    (:func:`capo_verl.inputs.check_data_file`); a JSON error names the file and line
    (:class:`capo_verl.inputs.BadDataLine`)."""
    from capo_verl import inputs

    suffix = path.suffix.lower()
    if suffix not in (".parquet", ".jsonl", ".json"):
        raise ValueError(f"{path}: unsupported file type {suffix!r}; give a .parquet, .jsonl or .json file")
    inputs.check_data_file(path, "--train-source")
    if suffix == ".parquet":
        return pd.read_parquet(path)
    if suffix == ".jsonl":
        return _frame(inputs.read_jsonl(path, "--train-source"), path)
    with open(path, "rb") as f:
        head = f.read(4096).lstrip(b"\xef\xbb\xbf \t\r\n")[:1]
    if head == b"{":  # a .json file of JSON lines
        return _frame(inputs.read_jsonl(path, "--train-source"), path)
    records = inputs.read_json(path, "--train-source")
    return _frame(records if isinstance(records, list) else [records], path)


def _frame(records: list, path: Path) -> pd.DataFrame:
    """Records (JSON objects) as a table; a record that is not an object is refused, naming it."""
    for i, record in enumerate(records):
        if not isinstance(record, dict):
            raise ValueError(f"{path}: record {i + 1} is a JSON {type(record).__name__}, not an object")
    return pd.DataFrame.from_records(records)


def _strip_instruction(text: str) -> str:
    text = text.strip()
    for suffix in _KNOWN_INSTRUCTION_SUFFIXES:
        if text.endswith(suffix):
            return text[: -len(suffix)].strip()
    return text


def _problems_from_table(df: pd.DataFrame, where: str) -> pd.DataFrame:
    """``problem``/``answer`` columns from a DeepScaleR-style or a verl-format table."""
    if {"problem", "answer"} <= set(df.columns):
        problems = df["problem"]
        answers = df["answer"]
    elif {"prompt", "reward_model"} <= set(df.columns):  # verl format (e.g. the shipped subset)

        def user_text(prompt) -> str:
            users = [m["content"] for m in prompt if m["role"] == "user"]
            if not users:
                raise ValueError(f"{where}: a prompt has no user message: {prompt!r}")
            return _strip_instruction(users[-1])

        problems = df["prompt"].map(user_text)
        answers = df["reward_model"].map(lambda rm: rm["ground_truth"])
    else:
        raise ValueError(
            f"{where}: expected columns problem+answer (DeepScaleR) or prompt+reward_model (verl format), "
            f"found {sorted(df.columns)}"
        )
    out = pd.DataFrame(
        {
            "problem": problems.map(lambda p: "" if p is None else str(p).strip()),
            "answer": answers.map(lambda a: "" if a is None else _answer_to_str(a)),
            "source_index": np.arange(len(df), dtype=np.int64),
        }
    )
    return out


def load_deepscaler(source: str) -> tuple[pd.DataFrame, int]:
    """Load DeepScaleR problems from a local file or the Hugging Face hub.

    Args:
        source: a path to a .parquet/.jsonl/.json file (DeepScaleR columns ``problem``, ``answer``, or verl
            format), or a hub dataset id such as :data:`DEEPSCALER_HUB_ID` (split ``train``; needs network
            and the ``datasets`` package).

    Returns:
        ``(df, n_dropped)``: ``df`` has columns ``problem`` (str), ``answer`` (str), ``source_index`` (int64,
        row in the source); rows with an empty problem or answer are dropped and counted in ``n_dropped``.

    Raises:
        FileNotFoundError: ``source`` looks like a path but does not exist.
        ValueError: unknown columns or file type, or ``source`` is neither a file nor a hub id.
    """
    path = Path(os.path.expanduser(source))
    if os.path.lexists(path):  # a symlink loop too: refused as a loop by _read_table
        df = _problems_from_table(_read_table(path), str(path))
    elif re.fullmatch(r"[A-Za-z0-9][\w.-]*/[\w.-]+", source) and not source.endswith((".parquet", ".jsonl", ".json")):
        import datasets

        table = datasets.load_dataset(source, split="train").to_pandas()
        df = _problems_from_table(table, source)
    elif source.endswith((".parquet", ".jsonl", ".json")) or "/" in source:
        raise FileNotFoundError(f"DeepScaleR source {source!r} does not exist (a local file was expected)")
    else:
        raise ValueError(f"DeepScaleR source {source!r} is neither an existing file nor a hub id like owner/name")
    keep = (df["problem"] != "") & (df["answer"] != "")
    return df[keep].reset_index(drop=True), int((~keep).sum())


def split_train_val(
    df: pd.DataFrame, train_size: int = TRAIN_SIZE, val_size: int = VAL_SIZE, seed: int = SEED
) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Seeded disjoint split: permute rows with ``default_rng(seed)``; first ``val_size`` -> val, next
    ``train_size`` -> train. Each part keeps source order (sorted by ``source_index``).

    Raises:
        ValueError: a size is negative, or ``len(df) < train_size + val_size`` (the message says how many
            rows there are and which options lower the sizes).
    """
    if train_size < 0 or val_size < 0:
        raise ValueError(f"train_size ({train_size}) and val_size ({val_size}) must be >= 0")
    need = train_size + val_size
    if len(df) < need:
        raise ValueError(
            f"the training source has {len(df)} usable problems, fewer than train_size + val_size = "
            f"{train_size} + {val_size} = {need}; use the full DeepScaleR dataset ({DEEPSCALER_HUB_ID}, "
            "40,315 problems) or lower --train-size / --val-size"
        )
    perm = np.random.default_rng(seed).permutation(len(df))
    val = df.iloc[np.sort(perm[:val_size])].reset_index(drop=True)
    train = df.iloc[np.sort(perm[val_size:need])].reset_index(drop=True)
    return train, val


# --------------------------------------------------------------------------------------------------------
# benchmarks
# --------------------------------------------------------------------------------------------------------
def _olympiad_problem(r: dict) -> str:
    context = r.get("context")
    return f"{context.strip()}\n\n{r['question'].strip()}" if context else r["question"].strip()


def _olympiad_answer(r: dict) -> str:
    parts = r["final_answer"]
    if isinstance(parts, str):
        parts = [parts]
    return ", ".join(re.sub(r"(?<!\\)\$", "", str(p)).strip() for p in parts)


def _minerva_answer(r: dict) -> str:
    from capo_verl.reward import last_boxed

    answer = last_boxed(r["solution"])
    if answer is None:
        raise ValueError(f"minerva_math: no \\boxed{{}} answer in the solution of {r['problem'][:80]!r}")
    return answer


def _gsm8k_answer(r: dict) -> str:
    if "####" not in r["answer"]:
        raise ValueError(f"gsm8k: no '#### <answer>' line in {r['answer'][-80:]!r}")
    return r["answer"].rsplit("####", 1)[1].strip().replace(",", "")


@dataclass(frozen=True)
class BenchmarkSpec:
    """Where a benchmark's jsonl keeps its problem and gold answer."""

    file: str
    problem: Callable[[dict], str]
    answer: Callable[[dict], str]


#: Local benchmark files (``--benchmarks-dir``) and their fields; the key is the ``data_source``.
BENCHMARKS: dict[str, BenchmarkSpec] = {
    "aime24": BenchmarkSpec("aime24.jsonl", lambda r: r["problem"], lambda r: _answer_to_str(r["answer"])),
    "aime25": BenchmarkSpec("aime25.jsonl", lambda r: r["problem"], lambda r: _answer_to_str(r["answer"])),
    "math500": BenchmarkSpec("math500.jsonl", lambda r: r["problem"], lambda r: _answer_to_str(r["answer"])),
    "amc23": BenchmarkSpec("amc23.jsonl", lambda r: r["problem"], lambda r: _answer_to_str(r["answer"])),
    "minerva_math": BenchmarkSpec("minerva_math.jsonl", lambda r: r["problem"], _minerva_answer),
    "olympiadbench": BenchmarkSpec("olympiadbench.jsonl", _olympiad_problem, _olympiad_answer),
    "gsm8k": BenchmarkSpec("gsm8k_test.jsonl", lambda r: r["question"], _gsm8k_answer),
}
#: The paper's six test benchmarks (gsm8k is available on request: ``--benchmarks gsm8k``).
DEFAULT_BENCHMARKS = ("aime24", "aime25", "math500", "amc23", "minerva_math", "olympiadbench")


def load_benchmark(name: str, benchmarks_dir: str | os.PathLike = SHIPPED_BENCHMARKS_DIR) -> list[dict]:
    """verl rows (split ``test``) for benchmark ``name`` read from ``benchmarks_dir/<file>``.

    Raises:
        KeyError: unknown ``name`` (the message lists :data:`BENCHMARKS`).
        FileNotFoundError: the file is missing.
        ValueError: a row is not a JSON object or has no problem or no gold answer; the file is not JSON lines, or a
            line does not parse (:class:`capo_verl.inputs.BadDataLine`, naming the file and line).
    """
    if name not in BENCHMARKS:
        raise KeyError(f"unknown benchmark {name!r}; choose from {', '.join(BENCHMARKS)}")
    spec = BENCHMARKS[name]
    path = Path(benchmarks_dir) / spec.file
    if not path.exists() and not path.is_symlink():
        raise FileNotFoundError(f"benchmark {name}: {path} not found (set --benchmarks-dir)")
    from capo_verl import inputs

    rows = []
    for i, record in enumerate(inputs.read_jsonl(path, f"benchmark {name}")):  # errors name the file and line
        if not isinstance(record, dict):
            raise ValueError(f"benchmark {name}: row {i} of {path} is a JSON {type(record).__name__}, not an object")
        problem, answer = spec.problem(record).strip(), spec.answer(record).strip()
        if not problem or not answer:
            raise ValueError(f"benchmark {name}: row {i} of {path} has an empty problem or answer")
        rows.append(make_row(name, problem, answer, "test", i))
    return rows


# --------------------------------------------------------------------------------------------------------
# the CPU job's data: GSM8K's one-step calculations
# --------------------------------------------------------------------------------------------------------
GSM8K_CALC_SOURCE = "gsm8k_calc"
_CALC_PATTERN = re.compile(r"<<([^=<>]+)=([^<>]+)>>")
_SIMPLE_EXPR = re.compile(r"(\d+)([-+*/])(\d+)")


def gsm8k_calc_problems(path: str | os.PathLike, max_value: int = 100) -> list[tuple[str, str]]:
    """One-step calculations that GSM8K's annotators wrote inside its solutions as ``<<expr=result>>``.

    Keeps ``a op b`` with op in ``+ - * /`` whose operands and integer result are all below ``max_value``,
    deduplicated, in order of first appearance (2,309 from the training file, 949 from the test file with the
    default). SmolLM2-135M-Instruct answers these right about 20% of the time at temperature 1.0, so most
    groups of 4 samples are mixed (some right, some wrong), which is what CAPO and GRPO learn from.

    Args:
        path: a GSM8K jsonl file (``answer`` field with ``<<...>>`` annotations), e.g. the shipped
            ``capo_verl/resources/train/gsm8k_train.jsonl`` (shipped as ``.jsonl.gz``, read as it is,
            :func:`capo_verl.stored.stored`) or ``resources/benchmarks/gsm8k_test.jsonl``.
        max_value: exclusive bound on operands and result.

    Returns:
        ``[(expression, result), ...]``, e.g. ``("48/2", "24")``.
    """
    seen: dict[str, str] = {}
    for line in read_text(path).split("\n"):  # the shipped training file is kept compressed (.jsonl.gz)
        if line.strip():
            for expr, result in _CALC_PATTERN.findall(json.loads(line)["answer"]):
                expr, result = expr.strip(), result.strip()
                match = _SIMPLE_EXPR.fullmatch(expr)
                if match is None or not result.isdigit() or expr in seen:
                    continue
                if max(int(match.group(1)), int(match.group(3)), int(result)) < max_value:
                    seen[expr] = result
    return list(seen.items())


def gsm8k_calc_prompt(expression: str) -> str:
    """User message for one calculation: ``"What is 48 / 2? Answer with the number only."``."""
    a, op, b = _SIMPLE_EXPR.fullmatch(expression).groups()
    return f"What is {a} {op} {b}? Answer with the number only."


class DataFolderError(OSError):
    """A data folder that cannot be made or written: its message is one line, ``<folder>: cannot ... (<reason>);
    <fix>``; ``errno`` is the operating system's."""

    def __init__(self, folder: str | os.PathLike, cause: OSError):
        reason = cause.strerror or str(cause)
        super().__init__(
            f"{folder}: the data files cannot be written there ({reason}); choose a folder you can write with a few "
            "MB free (the CPU launch scripts: CAPO_CPU_DATA_DIR=<folder>; capo-verl compare: --out)"
        )
        self.errno = cause.errno
        self.folder = Path(folder)


def gsm8k_calc_main(argv: Sequence[str] | None = None) -> int:
    """``python -c "...; sys.exit(gsm8k_calc_main(sys.argv[1:]))" <folder>``, as the CPU launch scripts write their
    data: :func:`write_gsm8k_calc_parquet` into ``<folder>`` with its defaults.

    Returns:
        0; 1 after a :class:`DataFolderError`, printed as one line on stderr (``capo-verl: error: <folder>: ...``);
        2 without exactly one folder.
    """
    argv = list(sys.argv[1:] if argv is None else argv)
    if len(argv) != 1:
        commands.error("capo-verl", f"expected one data folder, got {len(argv)} arguments")
        return 2
    try:
        write_gsm8k_calc_parquet(argv[0])
    except DataFolderError as exc:
        commands.error("capo-verl", exc)
        return 1
    return 0


def write_gsm8k_calc_parquet(
    out_dir: str | os.PathLike,
    *,
    n_train: int = 256,
    n_val: int = 16,
    n_test: int = 0,
    seed: int = 0,
    val_all: bool = False,
) -> tuple[Path, Path]:
    """Write the GSM8K one-step-calculation slice in verl's RL parquet schema (the module docstring's, with its own
    prompt: :func:`gsm8k_calc_prompt`).

    Train rows come from the shipped GSM8K training file, validation rows from the GSM8K test file (disjoint
    problems), each shuffled with ``numpy.random.default_rng(seed)``. Row: ``data_source="gsm8k_calc"``,
    ``prompt=[{"role": "user", "content": gsm8k_calc_prompt(expr)}]`` (the model's chat template adds its own
    system prompt), ``reward_model={"style": "rule", "ground_truth": result}``,
    ``extra_info={"split", "index", "problem"}``. Source: openai/grade-school-math (MIT), see
    ``capo_verl/resources/SOURCES.md``.

    With ``n_test > 0`` a third file, ``<out_dir>/gsm8k_calc_test.parquet``, holds the next ``n_test`` problems of
    the same shuffled GSM8K test slice (disjoint from the validation rows): a held-out evaluation set.

    With ``val_all``, the validation rows are instead every calculation of the test slice outside the held-out set
    (which stays the ``n_test`` after the first ``n_val``), in the shuffled order, less every one whose expression
    (whitespace removed) is also a training row's: the same calculation occurs in both GSM8K splits, and a
    validation question must never have been trained on.

    Returns:
        ``(train_path, val_path)``: ``<out_dir>/gsm8k_calc_train.parquet`` and ``gsm8k_calc_val.parquet``.

    Raises:
        ValueError: more rows asked for than the slice has.
        DataFolderError: ``out_dir`` cannot be made or written (read-only, under a file, full): one line naming the
            folder and the fix, not the operating system's traceback.
    """
    from capo_verl.outputs import write_atomic

    resources = RESOURCES
    out = Path(out_dir)
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise DataFolderError(out, exc) from None
    paths = []
    splits = [
        ("train", resources / "train" / "gsm8k_train.jsonl", 0, n_train),
        ("val", resources / "benchmarks" / "gsm8k_test.jsonl", 0, n_val),
    ]
    if n_test > 0:
        splits.append(("test", resources / "benchmarks" / "gsm8k_test.jsonl", n_val, n_test))
    trained: set[str] = set()
    for split, source, start, count in splits:
        problems = gsm8k_calc_problems(source)
        if start + count > len(problems):
            raise ValueError(
                f"asked for {start + count} calculations of {source.name} ({split}), its slice has {len(problems)}"
            )
        shuffled = np.random.default_rng(seed).permutation(len(problems))
        order = shuffled[start : start + count]
        if split == "train":
            trained = {"".join(problems[int(i)][0].split()) for i in order}
        elif split == "val" and val_all:
            held_out = set(shuffled[n_val : n_val + n_test].tolist())
            order = [i for i in shuffled if i not in held_out and "".join(problems[int(i)][0].split()) not in trained]
        rows = []
        for index in order:
            expr, result = problems[int(index)]
            question = gsm8k_calc_prompt(expr)
            rows.append(
                {
                    "data_source": GSM8K_CALC_SOURCE,
                    "prompt": [{"role": "user", "content": question}],
                    "ability": "math",
                    "reward_model": {"style": "rule", "ground_truth": result},
                    "extra_info": {"split": split, "index": int(index), "problem": question},
                }
            )
        path = out / f"gsm8k_calc_{split}.parquet"
        try:  # a reader sees the old file or the new
            write_atomic(path, pd.DataFrame(rows).to_parquet(None, index=False))
        except OSError as exc:
            raise DataFolderError(out, exc) from None
        paths.append(path)
    return paths[0], paths[1]


# --------------------------------------------------------------------------------------------------------
# writing
# --------------------------------------------------------------------------------------------------------
def _write(rows: list[dict], path: Path) -> int:
    path.parent.mkdir(parents=True, exist_ok=True)
    pd.DataFrame(rows, columns=["data_source", "prompt", "ability", "reward_model", "extra_info"]).to_parquet(
        path, index=False
    )
    return len(rows)


def prepare(
    out_dir: str | os.PathLike,
    train_source: str | None = DEEPSCALER_HUB_ID,
    train_size: int = TRAIN_SIZE,
    val_size: int = VAL_SIZE,
    seed: int = SEED,
    benchmarks: Sequence[str] | None = DEFAULT_BENCHMARKS,
    benchmarks_dir: str | os.PathLike = SHIPPED_BENCHMARKS_DIR,
) -> dict:
    """Write the parquet files and ``manifest.json`` into ``out_dir``; return the manifest.

    ``train_source=None`` skips the training split, ``benchmarks=None`` or ``()`` the benchmarks. Entries of
    an existing ``manifest.json`` for files not rewritten now are kept, and so are the folder's other files. Every
    source is read and checked before anything is written; the folder is then written whole
    (:class:`capo_verl.outputs.Outputs`: built beside ``out_dir``, the entries it does not rewrite carried over, moved
    in with one rename, under a lock), so a failed or stopped run leaves the old folder as it was.

    Raises:
        capo_verl.outputs.InputIsOutput: ``out_dir`` is, or would replace, ``train_source`` or ``benchmarks_dir``.
        capo_verl.outputs.OutputLocked: another process writes ``out_dir``.
        What :func:`load_deepscaler`, :func:`split_train_val` and :func:`load_benchmark` raise.
    """
    from capo_verl import inputs, outputs

    out = Path(os.path.expanduser(str(out_dir)))
    benchmarks = list(benchmarks or ())
    names = [f"deepscaler_{split}.parquet" for split in ("train", "val")] if train_source is not None else []
    names += [f"{name}.parquet" for name in benchmarks]
    outs = outputs.Outputs("prepare-data")
    if train_source is not None and os.path.lexists(os.path.expanduser(train_source)):
        outs.input("--train-source", train_source)
    if benchmarks:
        outs.input("--benchmarks-dir", benchmarks_dir)
    folder = outs.folder("--out-dir", out, owns=[*names, "manifest.json"])
    outs.check()
    manifest_path = out / "manifest.json"
    manifest = inputs.read_json(manifest_path, "manifest") if manifest_path.exists() else {}
    if not isinstance(manifest, dict) or not isinstance(manifest.get("files", {}), dict):
        raise ValueError(f"{manifest_path}: not a manifest of `capo-verl prepare-data`; move it away")
    manifest["system_prompt"] = SYSTEM_PROMPT
    files = manifest.setdefault("files", {})
    tables: dict[str, list[dict]] = {}
    if train_source is not None:
        df, dropped = load_deepscaler(train_source)
        train, val = split_train_val(df, train_size, val_size, seed)
        for split, part in (("train", train), ("val", val)):
            name = f"deepscaler_{split}.parquet"
            tables[name] = [
                make_row("deepscaler", p, a, split, i)
                for p, a, i in zip(part["problem"], part["answer"], part["source_index"], strict=True)
            ]
            files[name] = {
                "rows": len(tables[name]),
                "data_source": "deepscaler",
                "source": str(train_source),
                "source_rows_usable": len(df),
                "source_rows_dropped_empty": dropped,
                "seed": seed,
                "train_size": train_size,
                "val_size": val_size,
            }
    for name in benchmarks:
        tables[f"{name}.parquet"] = load_benchmark(name, benchmarks_dir)
        files[f"{name}.parquet"] = {
            "rows": len(tables[f"{name}.parquet"]),
            "data_source": name,
            "source": str(Path(benchmarks_dir) / BENCHMARKS[name].file),
        }
    with outs.writing():
        for name, rows in tables.items():
            _write(rows, folder.stage / name)
        (folder.stage / "manifest.json").write_text(json.dumps(manifest, indent=2) + "\n")
    return manifest


def _count(minimum: int):
    """An argparse type: an integer >= ``minimum``."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"must be >= {minimum}, got {value}")
        return value

    return parse


def build_parser() -> argparse.ArgumentParser:
    """The parser of ``capo-verl prepare-data``."""
    p = commands.parser(
        "prepare-data",
        "Write verl parquet files: DeepScaleR train/val split and the evaluation benchmarks, "
        "all with the Qwen2.5-Math prompt (system: " + SYSTEM_PROMPT + ").",
    )
    p.add_argument(
        "--out-dir",
        default=os.environ.get("CAPO_DATA_DIR", "~/data/capo"),
        help="output folder (default: $CAPO_DATA_DIR or ~/data/capo)",
    )
    p.add_argument(
        "--train-source",
        default=DEEPSCALER_HUB_ID,
        help=f"hub id or local .parquet/.jsonl/.json file (default: {DEEPSCALER_HUB_ID}); the shipped subset "
        f"is {RESOURCES / 'train' / 'deepscaler_sub1209.parquet'}",
    )
    p.add_argument(
        "--train-size", type=_count(1), default=TRAIN_SIZE, help=f"training problems, >= 1 (default {TRAIN_SIZE})"
    )
    p.add_argument(
        "--val-size", type=_count(1), default=VAL_SIZE, help=f"validation problems, >= 1 (default {VAL_SIZE})"
    )
    commands.add_option(p, "--seed", default=SEED, why="the paper's split, which the shipped configs expect")
    p.add_argument(
        "--benchmarks",
        default=",".join(DEFAULT_BENCHMARKS),
        help=f"comma list from {', '.join(BENCHMARKS)} (default: the six of the paper)",
    )
    p.add_argument(
        "--benchmarks-dir",
        default=str(SHIPPED_BENCHMARKS_DIR),
        help="folder with the benchmark jsonl files (default: the copies shipped in capo_verl/resources)",
    )
    p.add_argument("--no-train", action="store_true", help="skip the DeepScaleR split")
    p.add_argument("--no-benchmarks", action="store_true", help="skip the benchmarks")
    return p


def run(args: argparse.Namespace) -> int:
    """Execute ``capo-verl prepare-data``'s parsed arguments; returns 0.

    Raises:
        UsageError: nothing to write (``--no-train`` and no benchmark), an unknown benchmark, or an ``--out-dir``
            that cannot be written (checked before anything is read).
        ValueError, FileNotFoundError: as :func:`prepare`.
    """
    benchmarks = [] if args.no_benchmarks else [b.strip() for b in args.benchmarks.split(",") if b.strip()]
    unknown = [b for b in benchmarks if b not in BENCHMARKS]
    if unknown:
        raise commands.UsageError(f"unknown benchmark(s) {unknown}; choose from {', '.join(BENCHMARKS)}")
    if args.no_train and not benchmarks:
        raise commands.UsageError(
            "nothing to write: --no-train and no benchmark (--no-benchmarks or an empty --benchmarks); drop one"
        )
    out = commands.check_out_dir(args.out_dir, "--out-dir")
    try:
        manifest = prepare(
            out,
            train_source=None if args.no_train else args.train_source,
            train_size=args.train_size,
            val_size=args.val_size,
            seed=args.seed,
            benchmarks=benchmarks,
            benchmarks_dir=args.benchmarks_dir,
        )
    except KeyError as exc:  # a benchmark file's row without the field its spec reads
        raise ValueError(f"a benchmark row has no field {exc.args[0]!r}") from None
    for name, info in manifest["files"].items():
        note = ""
        if info.get("source_rows_dropped_empty"):
            note = f"; {info['source_rows_dropped_empty']} source rows without problem or answer dropped"
        print(f"{out / name}: {info['rows']} rows ({info['data_source']}{note})")
    return 0


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``capo-verl prepare-data``; returns the exit status (:func:`capo_verl.commands.main`)."""
    return commands.main(build_parser(), run, argv)


if __name__ == "__main__":
    sys.exit(main())
