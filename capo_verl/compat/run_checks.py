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
"""

from __future__ import annotations

import contextlib
import os
import re
import sys
from collections.abc import Iterable

__all__ = [
    "MISSING",
    "batch_problem",
    "check_run_config",
    "data_files_checked",
    "earlier_value",
    "expected_files",
    "launch_script_files",
    "override",
]


class _Missing:
    def __repr__(self) -> str:
        return "MISSING"


#: :func:`select`'s answer for a key the config does not have.
MISSING = _Missing()

#: Local data files a launch script writes before a real run, and the data keys' values it passes (set by its
#: ``--dry-run`` through :func:`launch_script_files`; empty in a real run, where the files exist by then).
_EXPECTED: dict[str, object] = {"active": False, "files": frozenset(), "overrides": []}


#: ``python -m`` modules whose process reads the data files right after ``validate_config``.
TRAINER_MODULES = ("verl.trainer.main_ppo", "verl.trainer.main_ppo_v0")


def data_files_checked() -> bool:
    """True in the process of a training run, ``python -m verl.trainer.main_ppo`` (or ``main_ppo_v0``), which reads
    the data files next, and within :func:`launch_script_files` (a launch script's ``--dry-run``); False where a
    config is only composed and validated (the tests, ``capo-verl compare``'s checks before it writes its data)."""
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
        except Exception:  # a mandatory value left unset (???), an unresolvable interpolation: verl's to name
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
        raise ValueError(
            f"trainer.total_training_steps={format_value(steps)}: must be an integer >= 1, or null for "
            f"trainer.total_epochs epochs (with {format_value(steps)} verl would load the model, validate and train "
            f"nothing); set e.g. {override(config, 'trainer.total_training_steps', 1)}"
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
    try:
        import pyarrow.parquet as pq
    except ImportError:  # pragma: no cover - pyarrow comes with verl's datasets
        return None
    total = 0
    for path in paths:
        if not (_is_local(path) and path.endswith(".parquet") and os.path.isfile(path)):
            return None
        try:
            total += pq.ParquetFile(path).metadata.num_rows
        except Exception:  # not a parquet file verl can read either: verl says so itself
            return None
    return total


def _check_training_set(config) -> None:
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
    per_epoch = rows // batch
    from .codapo_sampling import resample_config  # here: codapo_sampling imports the compat package

    if resample_config(config) is not None:  # CoDaSampling trains each loader batch twice (prepare, apply)
        per_epoch *= 2
    if steps > per_epoch * epochs:
        need = -(-steps // per_epoch)
        raise ValueError(
            f"trainer.total_training_steps={steps}: trainer.total_epochs={epochs} epoch(s) of data.train_files "
            f"give at most {per_epoch * epochs} steps ({rows} rows, at most {per_epoch} steps with "
            f"data.train_batch_size={batch} per epoch), and verl would stop there without a word; set "
            f"{override(config, 'trainer.total_epochs', need)}"
        )


def _divisor_at_most(n: int, limit: int) -> int:
    """The largest divisor of ``n`` that is <= ``limit`` (>= 1)."""
    return max(d for d in range(1, max(1, min(n, limit)) + 1) if n % d == 0)


def batch_problem(config, n: int | None = None, use_reference_policy: bool | None = None) -> str | None:
    """Why the batch sizes of ``config`` (with ``actor_rollout_ref.rollout.n`` replaced by ``n``, if given) do not
    split into verl's micro-batches (module docstring), as one message with the fix; None when they do, or when
    dynamic batch sizes or a strategy other than FSDP make the rule not apply."""
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
            f"{override(config, f'{actor}.ppo_mini_batch_size', mini_fix)}"
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
                f"{override(config, key, _divisor_at_most(size, value))}"
            )
    return None


def _needs_reference(config) -> bool:
    """Whether verl's trainer runs the reference model for ``config`` (verl's ``need_reference_policy``, with
    capo-verl's gate for CAPO's noise mask)."""
    try:
        from verl.trainer.ppo import utils as ppo_utils

        return bool(ppo_utils.need_reference_policy(config))
    except Exception:  # an incomplete config (a unit test's): verl's own checks name what is missing
        return True


def check_run_config(config) -> None:
    """Refuse, in one line each, the values of verl's keys listed in the module docstring that would fail late or
    do nothing.

    Args:
        config: the composed trainer config (OmegaConf ``DictConfig``), as verl's ``validate_config`` gets it.

    Raises:
        ValueError: the first bad value found; the message names the key, its value, what is allowed and a fix
            (an override that works when appended to the command line).
    """
    _check_steps(config)
    _check_resume(config)
    if data_files_checked():
        _check_data_files(config)
        _check_training_set(config)
    problem = batch_problem(config)
    if problem:
        raise ValueError(problem)
