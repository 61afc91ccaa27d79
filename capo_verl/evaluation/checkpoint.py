"""verl training checkpoints as ``eval generate`` models: found (:func:`find_checkpoint`), merged once into a Hugging
Face folder with verl's own merger (:func:`merged_model`), refused with the missing file named otherwise.

verl 0.9.1's FSDP checkpoint manager (``verl/utils/checkpoint/fsdp_checkpoint_manager.py``,
``FSDPCheckpointManager.save_checkpoint``) writes, per saved step, ``global_step_N/actor/``::

    model_world_size_W_rank_R.pt        one sharded model state dict per rank R < W
    optim_world_size_W_rank_R.pt        the optimizer's (not needed here)
    extra_state_world_size_W_rank_R.pt  scheduler and RNG (not needed here)
    fsdp_config.json                    {"FSDP_version": ..., "world_size": W}
    huggingface/                        config.json, generation config and tokenizer; no weights (unless the run
                                        saved ``hf_model`` too: then the full weights are there)

vLLM loads none of the shard files. :func:`merged_model` runs verl's merger,
``python -m verl.model_merger merge --backend fsdp --local_dir <actor> --target_dir <folder>``
(``verl/model_merger/fsdp_model_merger.py``), as a child process (its memory, a full copy of the weights, is freed
when it ends), into a staged sibling that is renamed into place once verl's own check of the output
(``verl.model_merger.output_validation.validate_hf_model_output``) passes (:class:`capo_verl.outputs.Outputs`: a
lock, the staging folder ``.capo-verl-new.<name>``, one rename). A failed or interrupted merge leaves no merged
folder; the next run removes what a killed one left staged. A complete merged folder is reused: inside the actor
folder (``merged_hf``), or elsewhere (``--merged-dir``) when its ``capo_verl_merged_from.json`` names this actor
folder, so that one ``--merged-dir`` given for another step is refused rather than loaded.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from capo_verl import commands

__all__ = [
    "MERGED_NAME",
    "SOURCE_FILE",
    "VerlCheckpoint",
    "find_checkpoint",
    "weights_problem",
    "merge_command",
    "check_merged_dir",
    "merged_model",
]

#: the default merged folder's name, inside ``global_step_N/actor/``
MERGED_NAME = "merged_hf"
#: written into a merged folder: ``{"actor": <the checkpoint's actor folder, resolved>}``
SOURCE_FILE = "capo_verl_merged_from.json"
_SHARD = re.compile(r"model_world_size_(\d+)_rank_(\d+)\.pt")


@dataclass(frozen=True)
class VerlCheckpoint:
    """One actor checkpoint of verl's FSDP checkpoint manager (module docstring).

    Attributes:
        actor: the ``global_step_N/actor`` folder.
        world_size: the ranks that saved it (``fsdp_config.json``'s ``world_size``): one model shard each.
    """

    actor: Path
    world_size: int

    @property
    def hf_dir(self) -> Path:
        """``actor/huggingface``: config and tokenizer (and the weights where the run saved ``hf_model``)."""
        return self.actor / "huggingface"

    @property
    def default_merged(self) -> Path:
        """Where :func:`merged_model` writes by default: ``actor/merged_hf``."""
        return self.actor / MERGED_NAME


def _is_actor(folder: Path) -> bool:
    """A folder as verl saves an actor: a model shard file and ``huggingface/config.json``."""
    try:
        shards = any(_SHARD.fullmatch(name) for name in os.listdir(folder))
    except OSError:
        return False
    return shards and (folder / "huggingface" / "config.json").is_file()


def find_checkpoint(model: str | os.PathLike) -> VerlCheckpoint | None:
    """The verl checkpoint that the ``--model`` folder ``model`` is, or None.

    Recognised (verl's shard files ``model_world_size_*_rank_*.pt`` beside ``huggingface/config.json``): the actor
    folder ``global_step_N/actor``, its step folder ``global_step_N`` and its ``huggingface/`` folder.

    Raises:
        ValueError: a recognised checkpoint that verl's merger cannot read whole: ``fsdp_config.json`` missing or
            without an integer ``world_size``, or a model shard of a rank below it missing (a checkpoint still
            being written or copied); the message names the file.
    """
    path = Path(os.path.expanduser(str(model)))
    if not path.is_dir():
        return None
    actor = next((p for p in (path, path / "actor", path.parent) if _is_actor(p)), None)
    if actor is None or (actor == path.parent and path.name != "huggingface"):
        return None
    config = actor / "fsdp_config.json"
    try:
        world_size = json.loads(config.read_text())["world_size"]
    except FileNotFoundError:
        raise ValueError(
            f"--model {model} is a verl checkpoint without {config}, which verl's merger reads; copy the whole "
            "global_step_N folder, or pass a complete checkpoint"
        ) from None
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise ValueError(f"--model {model}: {config} does not give the checkpoint's world_size ({exc})") from exc
    if not isinstance(world_size, int) or world_size < 1:
        raise ValueError(f"--model {model}: {config} gives world_size {world_size!r}, not an integer >= 1")
    missing = [
        name
        for name in (f"model_world_size_{world_size}_rank_{r}.pt" for r in range(world_size))
        if not (actor / name).is_file()
    ]
    if missing:
        listed = ", ".join(missing[:3]) + (f" and {len(missing) - 3} more" if len(missing) > 3 else "")
        raise ValueError(
            f"--model {model}: the verl checkpoint {actor} lacks the model shard(s) {listed} of its "
            f"{world_size} ranks; wait until the checkpoint is written, or copy all of it"
        )
    return VerlCheckpoint(actor, world_size)


def weights_problem(folder: str | os.PathLike) -> str | None:
    """Why ``folder`` is not a complete Hugging Face model (config and weights), or None when it is.

    Decided by verl's own check of a merger's output, ``validate_hf_model_output``
    (``verl/model_merger/output_validation.py``): a non-empty ``config.json`` holding a JSON object, and
    ``model.safetensors`` or ``pytorch_model.bin``, or an index (``model.safetensors.index.json`` ...) whose shards
    are all there.

    Returns:
        None, or verl's reason (``no complete model weights; expected one of: model.safetensors, ...``).
    """
    from verl.model_merger.output_validation import validate_hf_model_output

    try:
        validate_hf_model_output(folder)
    except RuntimeError as exc:
        return str(exc).split(": ", 1)[-1]
    return None


def merge_command(ckpt: VerlCheckpoint, target: str | os.PathLike) -> list[str]:
    """verl's merger on ``ckpt`` into ``target``: ``python -m verl.model_merger merge --backend fsdp --local_dir
    <actor> --target_dir <target>`` with this interpreter (``verl/model_merger/__main__.py``)."""
    return [
        sys.executable,
        "-m",
        "verl.model_merger",
        "merge",
        "--backend",
        "fsdp",
        "--local_dir",
        str(ckpt.actor),
        "--target_dir",
        str(target),
    ]


def check_merged_dir(ckpt: VerlCheckpoint, merged_dir: str | os.PathLike | None = None) -> Path:
    """Where the merged model of ``ckpt`` is or goes, checked before anything is merged or loaded; reads only.

    Args:
        ckpt: the checkpoint (:func:`find_checkpoint`).
        merged_dir: ``--merged-dir``; None: ``<actor>/merged_hf``.

    Returns:
        The folder (``~`` expanded).

    Raises:
        ValueError: the folder exists but is not a complete Hugging Face model (:func:`weights_problem`: not a
            merge of capo-verl's, which moves a folder in only when complete); it lies outside the actor folder and
            its :data:`SOURCE_FILE` does not name this checkpoint (another step's merge, or any other model: loading
            it would evaluate other weights); or it cannot be created or written
            (:func:`capo_verl.commands.check_out_dir`).
    """
    target = Path(os.path.expanduser(str(merged_dir))) if merged_dir is not None else ckpt.default_merged
    if target.exists():
        problem = weights_problem(target) if target.is_dir() else "a file, not a folder"
        if problem:
            raise ValueError(
                f"--merged-dir {target} exists but is not a complete Hugging Face model ({problem}); remove it to "
                "merge the checkpoint again, or name another --merged-dir"
            )
        actor = Path(os.path.realpath(ckpt.actor))
        if actor not in Path(os.path.realpath(target)).parents:
            try:
                source = json.loads((target / SOURCE_FILE).read_text())["actor"]
            except (OSError, ValueError, KeyError, TypeError):
                source = None
            if source != str(actor):
                raise ValueError(
                    f"--merged-dir {target} holds a model that is not a merge of {ckpt.actor} (its {SOURCE_FILE} "
                    f"names {source}); name another --merged-dir, or remove it to merge this checkpoint there"
                )
        return target
    commands.check_out_dir(target.parent, "--merged-dir")
    return target


def merged_model(
    ckpt: VerlCheckpoint,
    merged_dir: str | os.PathLike | None = None,
    *,
    say: Callable[[str], None] | None = None,
) -> Path:
    """A Hugging Face folder that vLLM can load for ``ckpt``: merged once by verl's merger, reused afterwards.

    - ``actor/huggingface`` when it holds complete weights (a run that saved ``hf_model``): loaded as it is.
    - the merged folder (:func:`check_merged_dir`) when it is complete and inside the actor folder or a merge of
      this checkpoint (its :data:`SOURCE_FILE`): reused.
    - else :func:`merge_command` runs (the command printed through ``say``) into the staged sibling
      ``.capo-verl-new.<name>`` under the folder's lock; once it exits 0 and :func:`weights_problem` passes, one
      rename moves it in, with :data:`SOURCE_FILE` naming the actor folder. On a failure or Ctrl-C the staged
      folder is removed; a kill leaves it for the next run to remove; either way no folder appears at the merged
      path.

    Args:
        ckpt: the checkpoint (:func:`find_checkpoint`).
        merged_dir: ``--merged-dir``; None: ``<actor>/merged_hf``.
        say: prints one progress line (default: to stderr).

    Returns:
        The folder to load.

    Raises:
        ValueError: as :func:`check_merged_dir`.
        capo_verl.outputs.OutputLocked: another process merges into the same folder now.
        capo_verl.commands.RunFailed: the merger exited non-zero (its last output line quoted) or wrote an
            incomplete model.
    """
    from capo_verl import outputs

    say = say or (lambda line: print(line, file=sys.stderr, flush=True))
    if weights_problem(ckpt.hf_dir) is None:
        say(f"eval generate: {ckpt.hf_dir} holds the checkpoint's full weights; loading it")
        return ckpt.hf_dir
    target = check_merged_dir(ckpt, merged_dir)
    if target.exists():
        say(f"eval generate: using {target}, merged from {ckpt.actor} earlier")
        return target
    outs = outputs.Outputs("eval generate")
    outs.input("--model", ckpt.actor)
    folder = outs.folder("--merged-dir", target, owns=())
    outs.check()
    with outs.writing():
        cmd = merge_command(ckpt, folder.stage)
        say(f"eval generate: merging the verl checkpoint {ckpt.actor} into {target}: {shlex.join(cmd)}")
        proc = subprocess.run(cmd, stdin=subprocess.DEVNULL, capture_output=True, text=True)
        if proc.returncode != 0:
            output = (proc.stderr.strip() or proc.stdout.strip()).splitlines()  # a traceback ends stderr
            last = output[-1].strip() if output else "no output"
            raise commands.RunFailed(
                f"verl's merger exited with status {proc.returncode} ({last}); {target} was not written; run the "
                "command printed above to see its whole output"
            )
        problem = weights_problem(folder.stage)
        if problem:
            raise commands.RunFailed(
                f"verl's merger exited 0 but wrote no complete model ({problem}); {target} was not written"
            )
        source = {"actor": os.path.realpath(ckpt.actor), "command": shlex.join(cmd)}
        (folder.stage / SOURCE_FILE).write_text(json.dumps(source, indent=2) + "\n")
    say(f"eval generate: merged {ckpt.actor} into {target}")
    return target
