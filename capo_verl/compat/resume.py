"""Start checks of a run's checkpoint folder against what verl will do with it
(``verl/trainer/ppo/v1/trainer_base.py`` and ``verl/trainer/ppo/ray_trainer.py``: ``_load_checkpoint``;
``verl/utils/checkpoint/checkpoint_manager.py``: ``find_latest_ckpt_path``;
``verl/utils/checkpoint/fsdp_checkpoint_manager.py``: ``FSDPCheckpointManager.load_checkpoint``).

:func:`resume_refusal` is the ``resume_state`` rule of :data:`capo_verl.compat.run_checks.RULES`. It runs where the
file system is checked (the trainer's own process, a launch script's ``--dry-run``), before Ray starts, and refuses:

- ``trainer.resume_mode=disable`` with a ``trainer.default_local_dir`` that holds checkpoints
  (``global_step_<N>`` folders or ``latest_checkpointed_iteration.txt``): verl would train from the model and write
  over them (its ``global_step_<N>``, its tracker; the run's ``curves.png`` beside them). The choices: go on from
  them (``trainer.resume_mode=auto``) or write the new run elsewhere (another ``trainer.default_local_dir``).
- ``trainer.resume_mode=auto`` with ``global_step_<N>`` folders but no tracker (verl then trains from the model and
  writes over them), a tracker that is not an integer (verl's ``int()`` fails after the model loaded), a tracker
  naming a step whose folder is missing (verl trains from the model without a word), or a step folder that is not
  whole.
- ``trainer.resume_mode=resume_path`` with a ``trainer.resume_from_path`` ending in ``/`` (verl reads the step as
  ``int("6/")`` and fails after the model loaded) or naming a step folder that is not whole.

A step folder is whole when it holds what verl loads: ``actor/`` with, for every rank of this run's actor
(``trainer.nnodes * trainer.n_gpus_per_node``), the files of ``actor_rollout_ref.actor.checkpoint.load_contents``
(``model`` -> ``model_world_size_<W>_rank_<R>.pt``, ``optimizer`` -> ``optim_...``, ``extra`` ->
``extra_state_...``), and ``data.pt``, the training data loader's place (without it verl logs a warning and
starts the data from its beginning, so the resumed run trains on the same prompts again). A resume that is fine is
logged in one line naming the step.

The step a run will resume from (``auto``'s tracked step, ``resume_path``'s folder), when whole and stamped
(:data:`STAMP`, written at each save by :mod:`capo_verl.compat.checkpoint_stamp`), is refused when this run's
:func:`run_identity` differs from the stamp's: another ``algorithm.adv_estimator`` or policy loss mode (two methods
in one run folder), or another model architecture (``config.json``'s :data:`ARCH_FIELDS`, compared where both sides
have them; verl would fail on shapes after the model loaded). A step without a stamp (saved before it) is not
refused.
"""

from __future__ import annotations

import json
import logging
import os
import re

logger = logging.getLogger("capo_verl")

#: verl's tracker of the last complete checkpoint (``checkpoint_manager.get_checkpoint_tracker_filename``)
TRACKER = "latest_checkpointed_iteration.txt"
#: a checkpoint of step N (``_save_checkpoint``: ``global_step_{N}``)
STEP_FOLDER = re.compile(r"global_step_(\d+)")
#: ``actor.checkpoint.load_contents`` item -> the per-rank file FSDPCheckpointManager loads
SHARD_FILES = {"model": "model", "optimizer": "optim", "extra": "extra_state"}
#: what a step folder was saved by: :func:`run_identity` as JSON
STAMP = "capo_verl.json"
#: the keys of the method a step was trained with
METHOD_KEYS = ("algorithm.adv_estimator", "actor_rollout_ref.actor.policy_loss.loss_mode")
#: the fields of the model's ``config.json`` that name its architecture
ARCH_FIELDS = ("architectures", "model_type", "hidden_size", "num_hidden_layers", "vocab_size")
MODEL_KEY = "actor_rollout_ref.model.path"


def run_identity(config) -> dict:
    """What :data:`STAMP` records of a run: ``{key: value}`` of :data:`METHOD_KEYS` and ``MODEL_KEY`` (None where the
    config lacks one), and ``"model"``: :data:`ARCH_FIELDS` of the model's ``config.json`` when the model path is a
    local folder that has one (``{}`` for a hub id).

    Raises:
        OSError, ValueError: the local ``config.json`` cannot be read or is not JSON.
    """
    from capo_verl.compat.config_keys import MISSING, select

    found = {key: select(config, key) for key in (*METHOD_KEYS, MODEL_KEY)}
    found = {key: None if value is MISSING else value for key, value in found.items()}
    path = found[MODEL_KEY]
    model = os.path.join(os.path.expanduser(path), "config.json") if isinstance(path, str) else ""
    arch = {}
    if os.path.isfile(model):
        with open(model) as f:
            arch = json.load(f)
    found["model"] = {k: arch[k] for k in ARCH_FIELDS if isinstance(arch, dict) and k in arch}
    return found


def step_folders(folder: str) -> dict[int, str]:
    """``{N: path}`` of the ``global_step_<N>`` folders in ``folder`` (empty when it does not exist)."""
    try:
        names = os.listdir(folder)
    except OSError:
        return {}
    found = {}
    for name in names:
        match = STEP_FOLDER.fullmatch(name)
        path = os.path.join(folder, name)
        if match and os.path.isdir(path):
            found[int(match.group(1))] = path
    return found


def _actor_world_size(config) -> int | None:
    from capo_verl.compat.config_keys import select

    nnodes, gpus = select(config, "trainer.nnodes"), select(config, "trainer.n_gpus_per_node")
    if all(isinstance(v, int) and not isinstance(v, bool) and v >= 1 for v in (nnodes, gpus)):
        return nnodes * gpus
    return None


def _load_contents(config) -> list[str]:
    from capo_verl.compat.config_keys import MISSING, select

    contents = select(config, "actor_rollout_ref.actor.checkpoint.load_contents")
    if contents is MISSING or contents is None or isinstance(contents, str):
        return list(SHARD_FILES)
    return [str(c) for c in contents if str(c) in SHARD_FILES]


def step_problem(config, step_folder: str) -> str | None:
    """What a ``global_step_<N>`` folder lacks of what verl loads from it (module docstring), or None when whole.

    Args:
        config: the composed trainer config: the actor's world size and ``load_contents`` are read.
        step_folder: the ``global_step_<N>`` folder.

    Returns:
        None, or a predicate that reads after the folder's name (``lacks actor/model_world_size_1_rank_0.pt``).
    """
    actor = os.path.join(step_folder, "actor")
    if not os.path.isdir(actor):
        return "lacks actor/ (the policy's weights)"
    world = _actor_world_size(config)
    shards = re.compile(r"model_world_size_(\d+)_rank_\d+\.pt")
    saved = {int(m.group(1)) for m in map(shards.fullmatch, os.listdir(actor)) if m}
    if world is not None and saved and world not in saved:
        sizes = ", ".join(str(s) for s in sorted(saved))
        return (
            f"holds the actor's shards of {sizes} rank(s), and this run's actor has {world} "
            "(trainer.nnodes * trainer.n_gpus_per_node)"
        )
    world = world or (max(saved) if saved else 1)
    for content in _load_contents(config):
        for rank in range(world):
            name = f"{SHARD_FILES[content]}_world_size_{world}_rank_{rank}.pt"
            if not os.path.isfile(os.path.join(actor, name)):
                return f"lacks actor/{name} (a save stopped part way)"
    if not os.path.isfile(os.path.join(step_folder, "data.pt")):
        return "lacks data.pt (the data loader's place: verl would start the data from its beginning)"
    return None


def _last_whole(config, folder: str, below: int | None = None) -> str | None:
    """The last whole ``global_step_<N>`` folder of ``folder`` (N < ``below`` when given), or None."""
    for step, path in sorted(step_folders(folder).items(), reverse=True):
        if (below is None or step < below) and step_problem(config, path) is None:
            return path
    return None


def _choices(config, folder: str, below: int | None = None, *, whole: str | None = None) -> str:
    """The fix: resume from the last whole step (when there is one), start from the model in another folder, or
    with ``trainer.resume_mode=disable`` there."""
    from capo_verl.compat.config_keys import override

    whole = whole if whole is not None else _last_whole(config, folder, below)
    parts = []
    if whole:
        parts.append(
            f"set trainer.resume_mode=resume_path {override(config, 'trainer.resume_from_path', whole)} to go on from "
            "its last whole checkpoint"
        )
    elsewhere = override(config, "trainer.default_local_dir", folder + "_new")
    parts.append(f"set another trainer.default_local_dir (e.g. {elsewhere}) to start from the model")
    return ", or ".join(parts)


def _folder(config) -> str | None:
    from capo_verl.compat.config_keys import select

    folder = select(config, "trainer.default_local_dir")
    if not isinstance(folder, str) or not folder.strip() or "://" in folder:
        return None
    return os.path.abspath(os.path.expanduser(folder))  # verl joins a relative one to the working folder


def _disable_refusal(config, folder: str):
    from capo_verl.compat.config_keys import Refusal, format_value, override

    steps = step_folders(folder)
    tracker = os.path.join(folder, TRACKER)
    if not steps and not os.path.exists(tracker):
        return None
    held = [os.path.basename(p) for _, p in sorted(steps.items())]
    if os.path.exists(tracker):
        held.append(TRACKER)
    shown = ", ".join(held[:3] + ([f"... ({len(held)} in all)"] if len(held) > 3 else []))
    return Refusal(
        f"trainer.default_local_dir={format_value(folder)} (with trainer.resume_mode=disable)",
        f"holds another run's checkpoints ({shown}), which this run would write over, from the model",
        f"set trainer.resume_mode=auto to go on from them, or another trainer.default_local_dir (e.g. "
        f"{override(config, 'trainer.default_local_dir', folder + '_new')}) for a new run",
    )


def stamp_problem(config, step_folder: str) -> tuple[str, str] | None:
    """``(problem, fix)`` when ``step_folder``'s :data:`STAMP` names another method or model than this run's
    (module docstring), or None (also when it has no stamp). The fix: the stamp's value, to go on with it, or
    another ``trainer.default_local_dir`` for a new run."""
    from capo_verl.compat.config_keys import format_value, override

    path = os.path.join(step_folder, STAMP)
    if not os.path.isfile(path):
        return None
    try:
        with open(path) as f:
            saved = json.load(f)
        now = run_identity(config)
    except (OSError, ValueError) as exc:
        name = f"{os.path.basename(step_folder)}/{STAMP}"
        return f"{name} or the model's config.json cannot be read ({exc})", f"remove {path} to resume unchecked"
    saved = saved if isinstance(saved, dict) else {}
    new = override(config, "trainer.default_local_dir", os.path.dirname(step_folder) + "_new")
    elsewhere = f"or another trainer.default_local_dir (e.g. {new}) for a new run"
    for key in METHOD_KEYS:
        if key in saved and saved[key] != now[key]:
            problem = f"was saved with {key}={format_value(saved[key])}, not {format_value(now[key])}"
            return problem, f"set {override(config, key, saved[key])} to go on with it, {elsewhere}"
    arch = saved.get("model") if isinstance(saved.get("model"), dict) else {}
    for field in ARCH_FIELDS:
        if field in arch and field in now["model"] and arch[field] != now["model"][field]:
            problem = (
                f"was saved from a model with {field}={format_value(arch[field])} ({saved.get(MODEL_KEY)}), and "
                f"{MODEL_KEY}={now[MODEL_KEY]} has {format_value(now['model'][field])}"
            )
            return problem, f"set {override(config, MODEL_KEY, saved.get(MODEL_KEY))} to go on with it, {elsewhere}"
    return None


def _auto_refusal(config, folder: str):
    from capo_verl.compat.config_keys import Refusal, format_value

    subject = f"trainer.default_local_dir={format_value(folder)} (with trainer.resume_mode=auto)"
    tracker = os.path.join(folder, TRACKER)
    steps = step_folders(folder)
    if not os.path.exists(tracker):
        if not steps:
            return None  # a new run: verl trains from the model
        last = max(steps)
        return Refusal(
            subject,
            f"holds global_step_{last} but no {TRACKER}, so verl would train from the model and write over them",
            _choices(config, folder),
        )
    try:
        with open(tracker, "rb") as f:
            raw = f.read()
    except OSError as exc:
        return Refusal(subject, f"its {TRACKER} cannot be read ({exc.strerror or exc})", _choices(config, folder))
    try:
        step = int(raw.decode())  # as find_latest_ckpt_path reads it
    except (UnicodeDecodeError, ValueError):
        shown = raw.decode(errors="replace").strip()[:40]
        return Refusal(
            subject,
            f"its {TRACKER} holds {shown!r}, not a step number, so verl would fail after the model loaded",
            _choices(config, folder),
        )
    path = os.path.join(folder, f"global_step_{step}")
    if not os.path.isdir(path):
        return Refusal(
            subject,
            f"its {TRACKER} names step {step}, and global_step_{step} is not there, so verl would train from the "
            "model without a word",
            _choices(config, folder),
        )
    problem = step_problem(config, path)
    if problem:
        return Refusal(subject, f"global_step_{step}, its last checkpoint, {problem}", _choices(config, folder, step))
    mismatch = stamp_problem(config, path)
    if mismatch:
        return Refusal(subject, f"global_step_{step}, its last checkpoint, {mismatch[0]}", mismatch[1])
    logger.info("capo-verl: resuming from %s (step %d)", path, step)
    return None


def _resume_path_refusal(config):
    from capo_verl.compat.config_keys import Refusal, format_value, select

    path = select(config, "trainer.resume_from_path")
    if not isinstance(path, str):
        return None  # the resume_from_path rule's
    subject = f"trainer.resume_from_path={format_value(path)} (with trainer.resume_mode=resume_path)"
    if path.endswith(("/", os.sep)):
        return Refusal(
            subject,
            "ends with /, so verl reads its step as int('<N>/') and fails after the model loaded",
            f"set trainer.resume_from_path={path.rstrip('/' + os.sep)}",
        )
    full = os.path.abspath(os.path.expanduser(path))
    if not os.path.isdir(full) or not STEP_FOLDER.fullmatch(os.path.basename(full)):
        return None  # the resume_from_path rule's
    problem = step_problem(config, full)
    if problem:
        folder = os.path.dirname(full)
        step = int(STEP_FOLDER.fullmatch(os.path.basename(full)).group(1))
        return Refusal(subject, f"{os.path.basename(full)} {problem}", _choices(config, folder, step))
    mismatch = stamp_problem(config, full)
    if mismatch:
        return Refusal(subject, f"{os.path.basename(full)} {mismatch[0]}", mismatch[1])
    logger.info("capo-verl: resuming from %s", full)
    return None


def resume_refusal(config, ctx):
    """The refusal of a checkpoint folder verl would resume from wrongly or write over (module docstring), or None.

    Args:
        config: the composed trainer config (OmegaConf ``DictConfig``); reads ``trainer.resume_mode``,
            ``trainer.default_local_dir``, ``trainer.resume_from_path``, ``trainer.nnodes``,
            ``trainer.n_gpus_per_node``, ``actor_rollout_ref.actor.checkpoint.load_contents`` and, against a stamped
            step (:func:`stamp_problem`), :data:`METHOD_KEYS` and ``actor_rollout_ref.model.path``.
        ctx: the start checks' :class:`capo_verl.compat.run_checks.Context` (not read).

    Returns:
        A :class:`capo_verl.compat.run_checks.Refusal` (``subject: problem; fix``, the subject naming the folder or
        ``trainer.resume_from_path``), or None when the folder is fine (a resume is then logged with its step).
    """
    from capo_verl.compat.config_keys import select

    mode = select(config, "trainer.resume_mode")
    if mode == "resume_path":
        return _resume_path_refusal(config)
    folder = _folder(config)
    if folder is None:
        return None  # not a local folder: the output_folders rule's, or a remote one verl copies
    if mode == "disable":
        return _disable_refusal(config, folder)
    if mode == "auto":
        return _auto_refusal(config, folder)
    return None  # another mode: the resume_mode rule's
