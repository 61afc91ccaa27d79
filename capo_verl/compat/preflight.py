"""The preflight of a run: its data files, its model folder and the folders it writes, read as verl will read
them, before Ray starts. The ``here_only`` rules of :data:`capo_verl.compat.run_checks.RULES` (their table:
``docs/configuration.md``), imported only in the process that checks a run (verl's driver, a launch script's
``--dry-run``; :func:`capo_verl.compat.config_keys.data_files_checked`), never in a GPU worker. On an existing Ray
cluster a path the driver cannot see is a warning (:func:`capo_verl.compat.config_keys.unseen_on_cluster`).
"""

from __future__ import annotations

import contextlib
import glob
import logging
import os
import re
import tempfile

from capo_verl.commands import folder_problem
from capo_verl.compat.config_keys import (
    _EXPECTED,
    MISSING,
    Refusal,
    Refused,
    earlier_value,
    expected_files,
    format_value,
    on_ray_cluster,
    override,
    select,
)
from capo_verl.compat.config_keys import int_or_none as _int_or_none
from capo_verl.compat.config_keys import unseen_on_cluster as _unseen_on_cluster
from capo_verl.inputs import NotADataFile, check_data_file
from capo_verl.outputs import SymlinkLoop

logger = logging.getLogger("capo_verl")

_MODEL = "actor_rollout_ref.model"


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


def _output_folders(config, ctx) -> Refusal | None:
    """Every local folder the run writes: made, written in and removed again
    (:func:`capo_verl.commands.folder_problem`)."""
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
        if problem is None or _unseen_on_cluster(config, key, f"{value} ({problem})"):
            continue
        fix = _checkpoint_fix(config) if required else f"{key}=null (not written), or a folder you can write"
        return Refusal(f"{key}={format_value(value)}", f"{problem}; verl writes the run's {what}", f"set {fix}")
    return None


def _ray_folder_refusal(environ) -> Refusal | None:
    """:func:`ray_folder_problem`'s refusal."""
    if environ.get("RAY_ADDRESS"):
        return None
    there = "Ray puts its session folder (logs, sockets) there and would fail at ray.init"
    for var in ("RAY_TMPDIR", "TMPDIR"):
        if environ.get(var):
            problem = folder_problem(environ[var])
            if problem is None:
                return None
            if var == "TMPDIR" and _EXPECTED["active"] and folder_problem("/tmp") is None:
                return None  # the launcher falls back to /tmp
            return Refusal(
                f"{var}={environ[var]}",
                f"{problem}; {there}",
                f"export {var}=<a folder you can write> (e.g. export {var}=$HOME/tmp after mkdir -p $HOME/tmp), or "
                f"unset {var}",
            )
    problem = folder_problem("/tmp")
    if problem is None:
        return None
    return Refusal(
        "/tmp",
        f"{problem}; {there}",
        "export TMPDIR=<a folder you can write> (e.g. export TMPDIR=$HOME/tmp after mkdir -p $HOME/tmp)",
    )


def ray_folder_problem(environ=os.environ) -> str | None:
    """Why Ray's session folder cannot be made where this run's Ray would put it, as one message naming the
    environment variable and a fix; None when it can, or when ``RAY_ADDRESS`` names an existing cluster (whose
    folder is the cluster's). Ray uses ``RAY_TMPDIR``, else ``TMPDIR``, else ``/tmp``
    (``ray/_common/utils.py::get_default_system_temp_dir``); :mod:`capo_verl.cpu.launch` sets ``RAY_TMPDIR`` to a folder
    of the run's own in ``TMPDIR`` (``/tmp`` when that fails)."""
    refusal = _ray_folder_refusal(environ)
    return None if refusal is None else refusal.message()


def _ray_folder(config, ctx) -> Refusal | None:
    """Ray's session folder in this process's environment (:func:`ray_folder_problem`); on an existing cluster,
    ``ray_kwargs.ray_init.num_cpus`` / ``num_gpus`` (the CPU profile sets both), which ``ray.init`` refuses when it
    connects to one ("When connecting to an existing cluster, num_cpus and num_gpus must not be provided")."""
    if on_ray_cluster(config):
        typed = [
            k for k in ("num_cpus", "num_gpus") if select(config, f"ray_kwargs.ray_init.{k}") not in (None, MISSING)
        ]
        if typed:
            where = "RAY_ADDRESS" if os.environ.get("RAY_ADDRESS") else "ray_kwargs.ray_init.address"
            keys = ", ".join(
                f"ray_kwargs.ray_init.{k}={format_value(select(config, f'ray_kwargs.ray_init.{k}'))}" for k in typed
            )
            return Refusal(
                keys,
                f"with an existing Ray cluster ({where}) ray.init refuses them, after the driver started; the "
                "cluster's own resources count (verl places each trainer rank on one Ray GPU: start the cluster with "
                "--num-gpus, fake ones on a CPU)",
                f"set {' '.join(f'ray_kwargs.ray_init.{k}=null' for k in typed)} to join the cluster, or unset "
                f"{where} to start a local Ray",
            )
    return _ray_folder_refusal(os.environ)


# --- the model and the data -------------------------------------------------------------------------------------
def _looks_like_hub_id(path: str) -> bool:
    """``name`` or ``org/name``, as Hugging Face model ids are written (a relative path of one or two parts reads
    the same; transformers tries the folder first)."""
    return re.fullmatch(r"[A-Za-z0-9_][\w.-]*(/[\w.-]+)?", path) is not None


def _model_path(config, ctx) -> Refusal | None:
    """A local ``actor_rollout_ref.model.path``: a folder with ``config.json``."""
    key = "actor_rollout_ref.model.path"
    path = select(config, key)
    if path is MISSING or path is None:
        return None
    if not isinstance(path, str) or not path.strip():
        problem = "must be a model: a local folder with config.json, or a Hugging Face model id"
    elif not _is_local(path) or os.path.abspath(os.path.expanduser(path)) in expected_files():
        return None  # a remote model (verl's copy_to_local), or the one the launch script converts before a real run
    else:
        local = os.path.expanduser(path)
        if os.path.isdir(local):
            if os.path.isfile(os.path.join(local, "config.json")):
                return None
            problem = "is a folder without config.json, not a Hugging Face model folder"
        elif os.path.exists(local):
            problem = "is a file, not a model folder"
        elif _looks_like_hub_id(path):
            return None  # a Hugging Face id: downloaded (or found in the cache) when the workers start
        elif _unseen_on_cluster(config, key, path):
            return None
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
    return Refusal(
        f"{key}={format_value(path)}", f"{problem}; verl would fail only after Ray and its workers started", fix
    )


def _paths(value) -> list:
    """The paths of a data key's value (a path or a list), a local glob pattern expanded as verl's dataset loader
    (``datasets.load_dataset``) expands it; a pattern that matches nothing is kept as it is."""
    if value is None or value is MISSING:
        return []
    raw = [value] if isinstance(value, str) else list(value) if hasattr(value, "__iter__") else [value]
    paths = []
    for path in raw:
        is_pattern = isinstance(path, str) and _is_local(path) and glob.has_magic(path)
        paths += (sorted(glob.glob(os.path.expanduser(path))) or [path]) if is_pattern else [path]
    return paths


def _is_local(path) -> bool:
    return isinstance(path, str) and "://" not in path


def _data_files(config, ctx) -> Refusal | None:
    """Every local path of ``data.train_files`` and ``data.val_files`` exists (or the launch script writes it)."""
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
        if value is None:  # an empty list: the data_sets rule's
            return Refusal(
                f"{key}=null",
                "verl's trainer builds its data set from it (the validation set even when it never validates) and "
                "fails in its TaskRunner, after Ray started",
                f"set {key}=<existing parquet files>" + (f", e.g. {key}={earlier}" if usable else ""),
            )
        for path in _paths(value):
            if not isinstance(path, str) or not path:
                return Refusal(
                    f"{key}={format_value(value)}", "must be a path, or a list of paths, of parquet files", fix
                )
            if not _is_local(path) or os.path.abspath(path) in files:
                continue
            if os.path.exists(path) or _unseen_on_cluster(config, key, path):
                continue
            return Refusal(
                f"{key}={format_value(value)}",
                f"{'no file matches' if glob.has_magic(path) else 'no file'} {path}; it must name existing parquet "
                "files (capo-verl prepare-data writes the paper's)",
                fix,
            )
    return None


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
        except (pa.ArrowException, OSError) as exc:  # refused by data_sets, which reads the same footer
            logger.debug("capo-verl start checks: rows of %s not read (%s)", path, exc)
            return None
    return total


def _training_set(config, ctx) -> Refusal | None:
    """The training set's rows (from the parquet footers) against ``data.train_batch_size`` and the steps."""
    batch = _int_or_none(select(config, "data.train_batch_size"))
    if batch is None or batch < 1:
        return None
    rows = _parquet_rows(_paths(select(config, "data.train_files")))
    if rows is None:
        return None
    limit = _int_or_none(select(config, "data.train_max_samples"))
    if limit is not None and 0 < limit < rows:  # verl's RLHFDataset keeps that many rows (max_samples)
        if limit < batch:
            return Refusal(
                f"data.train_max_samples={limit}",
                f"fewer rows than data.train_batch_size={batch}, so verl's dataloader (drop_last) would give no step "
                "at all and the run would end at once",
                f"set {override(config, 'data.train_max_samples', batch)} or a smaller data.train_batch_size",
            )
        rows = limit
    if rows < batch:
        return Refusal(
            f"data.train_batch_size={batch}",
            f"larger than the {rows} rows of data.train_files, so verl's dataloader (drop_last) would give no step "
            "at all",
            f"set {override(config, 'data.train_batch_size', rows)} or train on more data",
        )
    steps = select(config, "trainer.total_training_steps")
    epochs = _int_or_none(select(config, "trainer.total_epochs"))
    if _int_or_none(steps) is None or epochs is None:
        return None
    per_epoch = rows // batch * ctx.steps_per_loader_batch  # CoDaSampling trains each loader batch twice
    if steps <= per_epoch * epochs:
        return None
    need = -(-steps // per_epoch)
    return Refusal(
        f"trainer.total_training_steps={steps}",
        f"trainer.total_epochs={epochs} epoch(s) of data.train_files give at most {per_epoch * epochs} steps ({rows} "
        f"rows, at most {per_epoch} steps with data.train_batch_size={batch} per epoch), and verl would stop there "
        "without a word",
        f"set {override(config, 'trainer.total_epochs', need)}",
    )


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
    """Why verl cannot read ``path`` as its data, from the file's name, its metadata, first and last bytes
    (:func:`capo_verl.inputs.check_data_file`) and parquet footer; None when it can."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    if os.path.isdir(path):
        return f"{path} is a folder; verl reads files ({', '.join(DATA_SUFFIXES)})"
    if not path.endswith(DATA_SUFFIXES):
        return f"{path}: verl reads only {', '.join(DATA_SUFFIXES)} files (its RLHFDataset refuses any other)"
    try:  # a FIFO (which blocked the start until it was killed), a device, a sparse file, another format's bytes
        check_data_file(path, "data file")
    except (NotADataFile, SymlinkLoop) as exc:
        return str(exc)
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


def _local_model_file(config, key: str) -> str | None:
    """The local folder ``key`` names, falling back to ``actor_rollout_ref.model.path`` when it is null (as verl's
    ``HFModelConfig`` does for ``hf_config_path`` and ``tokenizer_path``), if it holds ``config.json``; else None
    (a Hugging Face id is not downloaded here)."""
    path = select(config, key)
    if path is None or path is MISSING:
        path = select(config, f"{_MODEL}.path")
    if not isinstance(path, str) or not os.path.isfile(os.path.join(os.path.expanduser(path), "config.json")):
        return None
    return os.path.expanduser(path)


def _trust_remote_code(config) -> bool:
    return bool(select(config, f"{_MODEL}.trust_remote_code") is True)


def _tokenizer(config):
    """verl's tokenizer and processor of the actor's model (``verl.utils.hf_tokenizer``, ``hf_processor``, as its
    ``HFModelConfig`` loads them: from ``model.tokenizer_path``, else ``model.path``), or None when that is not a
    local folder; :class:`Refused` when transformers cannot read them."""
    local = _local_model_file(config, f"{_MODEL}.tokenizer_path")
    if local is None:
        return None
    from verl.utils import hf_processor, hf_tokenizer

    trust = _trust_remote_code(config)
    try:
        return hf_tokenizer(local, trust_remote_code=trust), hf_processor(local, trust_remote_code=trust, use_fast=True)
    except (OSError, ValueError, TypeError, KeyError) as exc:
        why = _one_line(exc)
        key = f"{_MODEL}.tokenizer_path" if select(config, f"{_MODEL}.tokenizer_path") else f"{_MODEL}.path"
        raise Refused(
            Refusal(
                f"{key}={format_value(select(config, key))}",
                f"transformers cannot read the tokenizer in {local} ({type(exc).__name__}: {why})",
                "fix or replace the folder's tokenizer files (tokenizer.json, tokenizer_config.json)",
            )
        ) from exc


def _model_positions(config) -> int | None:
    """The positions of the actor's model as verl's rollout reads them (``get_max_position_embeddings`` of the
    ``hf_config`` from ``model.hf_config_path``, else ``model.path``, with ``model.override_config`` applied, as in
    verl's ``HFModelConfig``), or None when the model is not a local folder or its config has no such field."""
    local = _local_model_file(config, f"{_MODEL}.hf_config_path")
    if local is None:
        return None
    from omegaconf import OmegaConf
    from verl.utils.model import update_model_config
    from verl.workers.rollout.utils import get_max_position_embeddings

    hf_config = _hf_config(config, local)
    overrides = select(config, f"{_MODEL}.override_config")
    overrides = OmegaConf.to_container(overrides) if OmegaConf.is_config(overrides) else {}
    update_model_config(hf_config, override_config_kwargs=overrides.get("model_config", overrides))
    try:
        positions = get_max_position_embeddings(hf_config)
    except ValueError:
        return None
    if isinstance(positions, bool) or not isinstance(positions, int) or positions < 1:
        raise Refused(
            Refusal(
                f"{_MODEL}.path={format_value(select(config, f'{_MODEL}.path'))}",
                f"the model's config.json gives max_position_embeddings={positions!r}, not a positive integer",
                "fix the model's config.json, or use another model folder",
            )
        )
    return positions


def _one_line(exc: BaseException, limit: int = 240) -> str:
    """``exc``'s message on one line, at most ``limit`` characters."""
    text = " ".join(str(exc).split()) or type(exc).__name__
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _hf_config(config, local: str):
    """The model's ``config.json`` as transformers reads it (``AutoConfig``), or :class:`Refused` naming the folder
    when it cannot be read (cut short, not JSON, no ``model_type``)."""
    from huggingface_hub.errors import StrictDataclassError
    from transformers import AutoConfig

    try:
        return AutoConfig.from_pretrained(local, trust_remote_code=_trust_remote_code(config))
    except (OSError, ValueError, TypeError, KeyError, StrictDataclassError) as exc:  # the last: a field's type
        why = _one_line(exc)
        raise Refused(
            Refusal(
                f"{_MODEL}.path={format_value(select(config, f'{_MODEL}.path'))}",
                f"transformers cannot read the model's config.json in {local} ({type(exc).__name__}: {why})",
                "fix or replace the folder's config.json (a Hugging Face model folder holds config.json, the "
                "tokenizer files and the weights)",
            )
        ) from exc


def _model_fits(config, ctx) -> Refusal | None:
    """The actor's model (a local folder) holds a prompt and its response (``data.max_prompt_length`` +
    ``data.max_response_length`` <= its positions), and its tokenizer's ids index its embedding (``len(tokenizer)``
    <= ``vocab_size``)."""
    prompt, response = (_int_or_none(select(config, f"data.{k}")) for k in ("max_prompt_length", "max_response_length"))
    positions = _model_positions(config)
    if positions is not None and prompt and response and prompt + response > positions:
        fix = (
            override(config, "data.max_response_length", positions - prompt)
            if positions > prompt
            else override(config, "data.max_prompt_length", positions - response)
            if positions > response
            else None
        )
        return Refusal(
            f"data.max_prompt_length={prompt} + data.max_response_length={response}",
            f"{prompt + response} tokens, more than the {positions} positions of the model "
            f"({_MODEL}.path, max_position_embeddings); verl's rollout cuts the responses to the positions left "
            "after each prompt without a word",
            f"set {fix}" if fix else "use a model with more positions",
        )
    local = _local_model_file(config, f"{_MODEL}.hf_config_path")
    tokens = _tokenizer(config) if local is not None else None
    if tokens is not None:
        hf_config = _hf_config(config, local)
        vocab = getattr(hf_config.get_text_config(), "vocab_size", None)
        if isinstance(vocab, int) and len(tokens[0]) > vocab:
            key = f"{_MODEL}.tokenizer_path" if select(config, f"{_MODEL}.tokenizer_path") else f"{_MODEL}.path"
            return Refusal(
                f"{key}={format_value(select(config, key))}",
                f"its tokenizer has {len(tokens[0])} tokens, the model's embedding {vocab} (vocab_size): the ids "
                f"from {vocab} on index past it, and the first forward pass fails inside Ray",
                "use the tokenizer the model was trained with",
            )
    return None


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


def _kept_refusal(config, key: str, paths: list[str], total: int, need: int, tokens, folder: str) -> Refusal | None:
    """The refusal when verl's dataset keeps fewer than ``need`` rows of ``paths``, naming the cause."""
    is_train = key == "data.train_files"
    rows = min(total, max(need, HEAD_ROWS))
    while True:
        read, kept = _kept_rows(paths, rows, config, tokens, is_train, folder)
        if kept >= need or read >= total:
            break
        rows = min(total, rows * 4)
    if kept >= need:
        return None
    unit = f"data.train_batch_size={need}" if is_train else "the 1 row a validation pass needs"
    length = select(config, "data.max_prompt_length")
    _, templated = _kept_rows(paths, rows, config, tokens, is_train, folder, max_prompt_length=2**31 - 1)
    if templated < read:
        prompt_key = select(config, "data.prompt_key")
        return Refusal(
            f"{key}={format_value(select(config, key))}",
            f"verl's dataset cannot chat-template {read - templated} of {read} prompts (column {prompt_key!r}, "
            "data.prompt_key; each must be a list of messages [{'role': 'user', 'content': ...}], not a plain "
            f"string) and drops them, leaving {kept} rows, fewer than {unit}",
            _data_fix(key),
        )
    # the length to suggest: the earlier value of the command, else the first of a doubling series, that keeps
    # enough rows and leaves the responses room in the model's positions (the model_fits rule)
    positions, response = _model_positions(config), _int_or_none(select(config, "data.max_response_length")) or 0
    room = positions - response if positions is not None else None
    fix = next(
        (
            n
            for n in (int(earlier_value("data.max_prompt_length") or 0), *(2**k for k in range(6, 14)))
            if n > length
            and (room is None or n <= room)
            and _kept_rows(paths, rows, config, tokens, is_train, folder, max_prompt_length=n)[1] >= need
        ),
        None,
    )
    if fix:
        fix = f"set {override(config, 'data.max_prompt_length', fix)}"
    elif room is not None:
        fix = (
            f"use shorter prompts, or a shorter data.max_response_length: the model's {positions} positions hold "
            f"a prompt and its response; {_data_fix(key)}"
        )
    else:
        fix = f"use shorter prompts; {_data_fix(key)}"
    return Refusal(
        f"data.max_prompt_length={length}",
        f"{read - kept} of {read} prompts of {key} are longer (verl's dataset drops them), leaving {kept} rows, fewer "
        f"than {unit}",
        fix,
    )


def _data_sets(config, ctx) -> Refusal | None:
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
        subject = f"{key}={format_value(value)}"
        if not paths:
            return Refusal(subject, "names no data file", _data_fix(key))
        if not all(_is_local(p) for p in paths) or any(os.path.abspath(p) in expected_files() for p in paths):
            continue  # remote files (verl's copy_to_local), or files the launch script writes before a real run
        if not all(os.path.exists(p) for p in paths):
            continue  # on a Ray cluster, files only its nodes see (data_files refuses them elsewhere)
        for path in paths:
            problem = _parquet_schema_problem(path, prompt_key)
            if problem and prompt_key != "prompt" and _parquet_schema_problem(path, "prompt") is None:
                return Refusal(
                    f"data.prompt_key={prompt_key}", problem, f"set {override(config, 'data.prompt_key', 'prompt')}"
                )
            if problem:
                return Refusal(subject, problem, _data_fix(key))
        if not all(p.endswith(".parquet") for p in paths):
            continue
        total = _parquet_rows(paths)
        if total == 0:
            return Refusal(subject, "the file(s) hold no rows", _data_fix(key))
        if select(config, "data.filter_overlong_prompts") is False or select(config, "data.custom_cls.path"):
            continue  # nothing filtered, or a dataset class of the user's
        if tokens is MISSING:
            tokens = _tokenizer(config)
        if tokens is None or total is None:
            continue
        with tempfile.TemporaryDirectory(prefix="capo-verl-data-check-") as folder:
            refusal = _kept_refusal(config, key, paths, total, need, tokens, folder)
        if refusal is not None:
            return refusal
    return None


# --- the ground truths, graded once by the run's reward function ---------------------------------------------------
#: the response every distinct ground truth is graded against: a boxed operation, which capo-verl's reward scores 0
#: without its math-verify workers (``capo_verl/reward.py``, point 3)
DUMMY_RESPONSE = "The answer is \\boxed{1+1}."
#: the most seconds the start spends grading ground truths; past it the rest are left to the run (a log line says so)
GROUND_TRUTH_CAP_S = 30.0


def _distinct_ground_truths(files: list[tuple[str, str]]) -> list[tuple[str, str, int, object, object, dict]]:
    """``(key, file, row, data_source, ground_truth, extra_info)`` of the first row of each distinct
    ``(data_source, ground_truth)`` of the parquet ``files`` (``(key, file)`` pairs), from the columns verl's reward
    managers read."""
    import pyarrow.parquet as pq

    seen, out = set(), []
    for data_key, path in files:
        names = set(pq.read_schema(path).names)
        table = pq.read_table(path, columns=[c for c in ("data_source", "reward_model", "extra_info") if c in names])
        columns = {name: table.column(name).to_pylist() for name in table.column_names}
        for row in range(table.num_rows):
            source = columns.get("data_source", [None] * table.num_rows)[row]
            model = columns.get("reward_model", [None] * table.num_rows)[row]
            truth = model.get("ground_truth") if isinstance(model, dict) else None
            key = (repr(source), repr(truth))
            if key not in seen:
                seen.add(key)
                extra = columns.get("extra_info", [None] * table.num_rows)[row]
                out.append((data_key, path, row, source, truth, extra if isinstance(extra, dict) else {}))
    return out


def _ground_truths(config, ctx) -> Refusal | None:
    """Every distinct ground truth of the local parquet training and validation files, graded once by the run's
    custom reward function (``reward.custom_reward_function``, loaded with verl's ``get_custom_reward_fn``) against
    :data:`DUMMY_RESPONSE`, with the keywords verl's reward managers pass: one it raises on is refused, naming the
    file, the row and the value. A score of 0 is not refused. At most :data:`GROUND_TRUTH_CAP_S` seconds (in a
    thread: a function that hangs is left to the run, with a warning)."""
    import threading

    if not select(config, "reward.custom_reward_function.path") or select(
        config, "reward.reward_manager.source"
    ) not in (
        "register",
        MISSING,
    ):
        return None  # verl's default_compute_score (it may call a code sandbox), or a manager of the user's own
    paths = []
    for key in ("data.train_files", "data.val_files"):
        found = [p for p in _paths(select(config, key)) if isinstance(p, str)]
        if not all(_is_local(p) and p.endswith(".parquet") and os.path.isfile(p) for p in found):
            continue  # remote, written by the launch script, or refused by data_files / data_sets
        paths += [(key, p) for p in found]
    if not paths:
        return None
    import inspect

    from verl.trainer.ppo.reward import get_custom_reward_fn

    try:
        score = get_custom_reward_fn(config)
    except Exception as exc:  # verl's loader: a missing file or function
        return Refusal(
            f"reward.custom_reward_function.path={format_value(select(config, 'reward.custom_reward_function.path'))}",
            f"verl cannot load the reward function ({type(exc).__name__}: {exc})",
            "point reward.custom_reward_function.path and .name at a file and a function in it",
        )
    if score is None or inspect.iscoroutinefunction(getattr(score, "args", [None])[0]):
        return None
    rows = _distinct_ground_truths(paths)
    found: list = []

    def grade_all():
        for data_key, path, row, source, truth, extra in rows:
            try:
                score(
                    data_source=source,
                    solution_str=DUMMY_RESPONSE,
                    ground_truth=truth,
                    extra_info={**extra, "num_turns": None, "rollout_reward_scores": {}},
                )
            except Exception as exc:
                found.append((data_key, path, row, truth, exc))
                return
            found.append(None)

    worker = threading.Thread(target=grade_all, name="capo-verl-ground-truths", daemon=True)
    worker.start()
    worker.join(GROUND_TRUTH_CAP_S)
    bad = next((f for f in found if f is not None), None)
    if bad is not None:
        data_key, path, row, truth, exc = bad
        return Refusal(
            f"{data_key}={path}",
            f"row {row}: reward_model.ground_truth={truth!r}: the reward function raises on it ({type(exc).__name__}: "
            f"{' '.join(str(exc).split())[:300]}), and the run would stop at the first batch that holds it",
            "fix that row's ground_truth in the file (or drop the row)",
        )
    if worker.is_alive():
        logger.warning(
            "capo-verl: graded %d of %d distinct ground truths in %.0f s (the start's cap); the rest are graded when "
            "the run reaches them",
            len(found),
            len(rows),
            GROUND_TRUTH_CAP_S,
        )
    return None


# --- room for a checkpoint ---------------------------------------------------------------------------------------
#: bytes per parameter of each ``actor.checkpoint.save_contents`` item, at the least: verl's FSDP checkpoint saves
#: the fp32 parameters (``model``), AdamW's two fp32 moments (``optimizer``) and, with ``hf_model``, the weights in
#: the model's own dtype (2 bytes for bf16, the least); ``extra`` (the scheduler and RNG states) is small
CHECKPOINT_BYTES_PER_PARAM = {"model": 4, "optimizer": 8, "hf_model": 2}


def _parameters(config, local: str) -> int:
    """The actor model's parameters, counted on PyTorch's meta device from its ``config.json`` (nothing loaded)."""
    import torch
    from transformers import AutoModelForCausalLM

    hf_config = _hf_config(config, local)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(hf_config, trust_remote_code=_trust_remote_code(config))
    return sum(p.numel() for p in model.parameters())


def checkpoint_bytes(config) -> int | None:
    """The least size of one checkpoint of the actor (:data:`CHECKPOINT_BYTES_PER_PARAM` for each item of
    ``actor_rollout_ref.actor.checkpoint.save_contents``), in bytes; None when the model is not a local folder."""
    local = _local_model_file(config, f"{_MODEL}.hf_config_path")
    if local is None:
        return None
    contents = select(config, "actor_rollout_ref.actor.checkpoint.save_contents")
    contents = list(contents) if contents not in (None, MISSING) else ["model", "optimizer", "extra"]
    per_param = sum(CHECKPOINT_BYTES_PER_PARAM.get(str(item), 0) for item in contents)
    return _parameters(config, local) * per_param if per_param else None


def _checkpoint_space(config, ctx) -> Refusal | None:
    """The free space where ``trainer.default_local_dir`` is (its first existing folder) holds one checkpoint of
    the actor (:func:`checkpoint_bytes`): else verl trains until its first save, which then fails with an error
    that does not say the disk is full, and the steps since the last checkpoint are lost."""
    import shutil

    folder = select(config, "trainer.default_local_dir")
    if not isinstance(folder, str) or not _is_local(folder) or select(config, "trainer.val_only") is True:
        return None
    if _int_or_none(select(config, "trainer.save_freq")) in (None, 0):
        return None
    existing = os.path.abspath(os.path.expanduser(folder))
    while not os.path.isdir(existing) and os.path.dirname(existing) != existing:
        existing = os.path.dirname(existing)
    need = checkpoint_bytes(config)
    if need is None:
        return None
    free = shutil.disk_usage(existing).free
    if free >= need:
        return None
    gib = 1024**3
    return Refusal(
        f"trainer.default_local_dir={format_value(folder)}",
        f"{free / gib:.2f} GiB free there, and one checkpoint of the actor takes at least {need / gib:.2f} GiB "
        "(actor_rollout_ref.actor.checkpoint.save_contents, from the model's config.json): verl would train until its "
        "first save and then fail without saying the disk is full",
        "free space there, or set another trainer.default_local_dir on a disk with room",
    )
