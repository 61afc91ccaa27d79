"""The output folder of ``capo-verl compare``: compare writes into a folder it made (or one it is told to reuse),
never deletes a folder it did not make, and reuses a finished method only if it ran with the same settings.

* ``<out>/.capo-verl-compare.json`` (:data:`MARKER`) marks a folder compare made and records the settings every
  method shares: config name, overrides, and the composed config. Every later run into the folder must have the
  same; so the folder (and its ``compare.json``) never mixes results of different settings.
* ``<out>/<method>/.capo-verl-run.json`` (:data:`RUN_MARKER`) marks a method folder compare made, with the method's
  settings. Such a folder, unfinished (no ``done.json``: the training was stopped or failed), resumes from its last
  complete checkpoint when it has one and its recorded settings equal the new ones; otherwise it (and only such a
  folder) is deleted and the method trained again.
* ``<out>/<method>/done.json`` records the method's settings as well: a finished method is reused only if they
  equal the new ones; ``<out>/<method>/eval_done`` records the held-out evaluation's ``k``.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

from capo_verl import __version__
from capo_verl.compare.config import UsageError
from capo_verl.compare.report import REPORT_OUTPUTS
from capo_verl.compare.teacher_forced import POOL_DIR, SCORED
from capo_verl.outputs import write_atomic

MARKER = ".capo-verl-compare.json"
RUN_MARKER = ".capo-verl-run.json"
#: what compare writes at the top of the output folder, besides the method folders and the marker
OUTPUTS = ("compare.json", *REPORT_OUTPUTS)
_ABSENT = "<absent>"


def differences(old, new, prefix: str = "") -> list[tuple[str, object, object]]:
    """``(dotted key, old value, new value)`` of every leaf that differs between two JSON records, sorted by key;
    a key only one side has shows ``'<absent>'`` on the other."""
    if not (isinstance(old, dict) and isinstance(new, dict)):
        return [] if old == new else [(prefix, old, new)]
    out = []
    for key in sorted(old.keys() | new.keys()):
        out += differences(
            old.get(key, _ABSENT), new.get(key, _ABSENT), f"{prefix}{key}" if not prefix else f"{prefix}.{key}"
        )
    return out


def require_same(recorded: dict, settings: dict, what: str) -> None:
    """Raises: UsageError naming the differing keys (recorded -> now), unless ``recorded == settings``."""
    diff = differences(recorded, settings)
    if diff:

        def short(value):
            text = repr(value)
            return text if len(text) <= 60 else text[:57] + "..."

        shown = "; ".join(f"{key}: {short(a)} -> {short(b)}" for key, a, b in diff[:6])
        more = f"; and {len(diff) - 6} more" if len(diff) > 6 else ""
        raise UsageError(f"{what} other settings (recorded -> now): {shown}{more}; use another --out")


def _read_json(path: Path) -> dict:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise UsageError(f"{path}: unreadable ({exc}); move it away or use another --out") from exc


def check_method_dir(run_dir: Path, settings: dict, eval_k: int | None) -> str:
    """What compare may do with ``<out>/<method>``: ``"new"`` (absent: train), ``"done"`` (finished with these
    settings: reuse; without its checkpoints only if it holds what this run would make from them), ``"resume"``
    (an unfinished run compare made with these settings, with a complete checkpoint: go on from it), or
    ``"retrain"`` (another unfinished run compare made: delete and train again).

    ``eval_k``: the held-out evaluation's k this time (None: no evaluation); a recorded evaluation must match.

    Raises:
        UsageError: the folder was not made by compare, or finished with other settings (or with settings an
            earlier version did not record), or its evaluation used another k, or it finished without its
            checkpoints and without the teacher-forced scores or held-out generations this run needs.
    """
    if not run_dir.exists():
        return "new"
    done = run_dir / "done.json"
    if done.exists():
        recorded = _read_json(done).get("settings")
        if recorded is None:
            raise UsageError(
                f"{run_dir} finished under an earlier capo-verl compare that did not record its settings, "
                "so they cannot be checked: use another --out (or --plot-only to redraw its report)"
            )
        require_same(recorded, settings, f"{run_dir.name}: finished in {run_dir} with")
        eval_done = run_dir / "eval_done"
        if eval_k is not None and eval_done.exists():
            k = _read_json(eval_done).get("k")
            if k != eval_k:
                raise UsageError(
                    f"{run_dir.name}: evaluated in {run_dir} with other settings (recorded -> now): "
                    f"eval_k: {k!r} -> {eval_k!r}; use --eval-k {k}, --no-eval or another --out"
                )
        if not (run_dir / "ckpt").exists():  # e.g. its small outputs copied to another machine
            missing = []
            if settings.get("teacher_forced") and not (run_dir / POOL_DIR / SCORED).exists():
                missing.append(f"its teacher-forced scores ({POOL_DIR}/{SCORED})")
            if eval_k is not None and not eval_done.exists():
                missing.append("its held-out generations (eval_done)")
            if missing:
                raise UsageError(
                    f"{run_dir.name}: finished in {run_dir} without its checkpoints (ckpt/) and without "
                    f"{' and '.join(missing)}, which need them: delete {run_dir} to train it again, or use "
                    "another --out"
                )
        return "done"
    if not (run_dir / RUN_MARKER).is_file():
        raise UsageError(
            f"{run_dir} exists and was not made by capo-verl compare (no {RUN_MARKER}); it is left "
            "as it is: move it away or use another --out"
        )
    recorded = _read_json(run_dir / RUN_MARKER).get("settings")
    if recorded is not None and not differences(recorded, settings) and last_checkpoint(run_dir) > 0:
        return "resume"
    return "retrain"


def last_checkpoint(run_dir: Path) -> int:
    """The step of the run's last complete checkpoint (``<run>/ckpt/latest_checkpointed_iteration.txt``, which verl
    writes after a checkpoint is complete), 0 when there is none."""
    tracker = run_dir / "ckpt" / "latest_checkpointed_iteration.txt"
    try:
        return int(tracker.read_text().strip())
    except (OSError, ValueError):
        return 0


def prepare_out(
    out: Path, settings: dict, method_settings: dict[str, dict], *, eval_k: int | None, reuse: bool = False
) -> None:
    """Check that compare may write into ``out`` for these methods, then mark ``out`` as compare's (:data:`MARKER`).

    ``out`` may be absent, empty, marked by compare with the same ``settings``, or (``reuse``) any folder that holds
    none of compare's outputs (:data:`OUTPUTS`). Nothing is written unless every check passes.

    Raises:
        UsageError: ``out`` is a file; marked with other settings; not empty, unmarked and ``reuse`` is false;
            reused but holding one of compare's outputs; or a method folder fails :func:`check_method_dir`.
    """
    marker = out / MARKER
    if out.exists() and not out.is_dir():
        raise UsageError(f"--out {out} is not a folder")
    if marker.exists():
        recorded = _read_json(marker).get("settings", {})
        require_same(recorded, settings, f"--out {out} was made by capo-verl compare with")
    elif out.exists() and any(out.iterdir()):
        if not reuse:
            raise UsageError(
                f"--out {out} is not empty and was not made by capo-verl compare (no {MARKER}): use "
                "another --out, or --reuse-out to add compare's folders to it (nothing there is deleted)"
            )
        taken = [name for name in OUTPUTS if (out / name).exists()]
        if taken:
            raise UsageError(
                f"--reuse-out: {out} already holds {', '.join(taken)}, which compare would overwrite; "
                "move them away or use another --out"
            )
    for method, method_settings_ in method_settings.items():
        check_method_dir(out / method, method_settings_, eval_k)
    if not marker.exists():
        out.mkdir(parents=True, exist_ok=True)
        record = {
            "made_by": "capo-verl compare",
            "capo_verl_version": __version__,
            "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            "settings": settings,
        }
        write_atomic(marker, json.dumps(record, indent=1) + "\n")
