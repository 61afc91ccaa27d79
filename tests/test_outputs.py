"""The outputs of a command (capo_verl/outputs.py): an output that is an input is refused however it is spelled, a
folder is replaced whole, one writer at a time, and a run killed at any moment leaves the old output or the new one;
the next run completes a commit that a kill cut short."""

from __future__ import annotations

import json
import os
import random
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from capo_verl import outputs
from capo_verl.outputs import InputIsOutput, OutputLocked, Outputs, SymlinkLoop


def tree(folder: Path) -> dict[str, bytes]:
    """``{relative path: bytes}`` of every file under ``folder`` (symlinks as ``-> target``)."""
    out = {}
    for root, dirs, files in os.walk(folder):
        for name in files + [d for d in dirs if os.path.islink(os.path.join(root, d))]:
            path = Path(root) / name
            rel = str(path.relative_to(folder))
            out[rel] = f"-> {os.readlink(path)}".encode() if path.is_symlink() else path.read_bytes()
    return out


def leftovers(folder: Path) -> list[str]:
    """What the mechanism may leave beside its outputs: staging, old, lock and journal entries."""
    prefixes = (outputs.STAGING_PREFIX, outputs.OLD_PREFIX, outputs.LOCK_PREFIX, outputs.JOURNAL_PREFIX)
    return sorted(p.name for p in folder.rglob("*") if p.name.startswith(prefixes))


# ------------------------------------------------------------------------------------------ output is input


def _case(tmp_path: Path, case: str) -> Outputs:
    data = tmp_path / "data"
    data.mkdir()
    src = data / "in.jsonl"
    src.write_text('{"a": 1}\n')
    outs = Outputs("test")
    if case == "same path":
        outs.input("--data", src)
        outs.file("--out", src)
    elif case == "dot-dot":
        outs.input("--data", src)
        outs.file("--out", data / "sub" / ".." / "in.jsonl")
    elif case == "symlink to the input":
        (tmp_path / "link.jsonl").symlink_to(src)
        outs.input("--data", src)
        outs.file("--out", tmp_path / "link.jsonl")
    elif case == "input through a symlinked folder":
        (tmp_path / "alias").symlink_to(data)
        outs.input("--data", tmp_path / "alias" / "in.jsonl")
        outs.file("--out", src)
    elif case == "hard link":
        os.link(src, tmp_path / "hard.jsonl")
        outs.input("--data", src)
        outs.file("--out", tmp_path / "hard.jsonl")
    elif case == "folder is the input folder":
        outs.input("--benchmarks-dir", data)
        outs.folder("--out-dir", data, owns=["x.parquet"])
    elif case == "folder owns the input":
        outs.input("--train-source", src)
        outs.folder("--out-dir", data, owns=["in.jsonl"])
    elif case == "existing file inside an input folder":
        outs.input("--model", data)
        outs.file("--out", src)
    elif case == "two outputs at one path":
        outs.file("--out", tmp_path / "o.json")
        outs.file("--out", tmp_path / "x" / ".." / "o.json")
    return outs


@pytest.mark.parametrize(
    "case",
    [
        "same path",
        "dot-dot",
        "symlink to the input",
        "input through a symlinked folder",
        "hard link",
        "folder is the input folder",
        "folder owns the input",
        "existing file inside an input folder",
        "two outputs at one path",
    ],
)
def test_an_output_that_is_an_input_is_refused_however_it_is_spelled(tmp_path, case):
    outs = _case(tmp_path, case)
    before = tree(tmp_path)
    with pytest.raises(InputIsOutput, match=r"--out(-dir)? .*(input|same path)"):
        outs.check()
    assert tree(tmp_path) == before and leftovers(tmp_path) == []


def test_what_is_not_an_input_passes(tmp_path):
    data = tmp_path / "data"
    data.mkdir()
    (data / "in.jsonl").write_text("{}\n")
    outs = Outputs("test")
    outs.input("--data", data / "in.jsonl")
    outs.input("--model", tmp_path / "model")  # a folder that does not exist yet: nothing in it can be replaced
    outs.file("--out", data / "new.json")  # a new file beside an input
    outs.folder("--out-dir", data, owns=["other.parquet"])  # a folder that holds an input it does not own
    outs.check()


@pytest.mark.parametrize("kind", ["folder", "file", "append"])
@pytest.mark.parametrize("where", ["lock", "staging", "old", "journal", "inside staging", "inside old", "link", "hard"])
def test_an_input_at_a_path_the_machinery_writes_or_removes_is_refused(tmp_path, kind, where):
    w = tmp_path / "w"
    w.mkdir()
    target = w / ("rep" if kind == "folder" else "rep.jsonl")
    data = tmp_path / "data.jsonl"
    data.write_text('{"a": 1}\n')
    spot = {
        "lock": outputs.lock_path(target),
        "staging": outputs.staging_path(target),
        "old": outputs.old_path(target),
        "journal": outputs.journal_path(target),
        "inside staging": outputs.staging_path(target) / "gen.jsonl",
        "inside old": outputs.old_path(target) / "sub" / "gen.jsonl",
        "link": outputs.lock_path(target),
        "hard": outputs.lock_path(target),
    }[where]
    spot.parent.mkdir(parents=True, exist_ok=True)
    if where == "link":  # a symlink at the lock's name: the lock would truncate the file it points to
        spot.symlink_to(data)
        given = data
    elif where == "hard":  # a hard link at the lock's name: the same
        os.link(data, spot)
        given = data
    else:
        spot.write_text('{"a": 1}\n')
        given = spot
    outs = Outputs("test")
    outs.input("--data", given)
    if kind == "folder":
        outs.folder("--out", target, owns=["m.json"])
    elif kind == "file":
        outs.file("--out", target)
    else:
        outs.append("--out", target)
    before = tree(tmp_path)
    with pytest.raises(InputIsOutput) as err:
        outs.check()
    message = str(err.value)
    assert f"--data {given}" in message and f"--out {target}" in message, message
    assert tree(tmp_path) == before


def test_an_output_at_another_outputs_staging_path_is_refused(tmp_path):
    outs = Outputs("test")
    outs.folder("--out", tmp_path / "rep", owns=["m.json"])
    outs.file("--lpm", outputs.staging_path(tmp_path / "rep") / "x.npy")
    with pytest.raises(InputIsOutput, match=r"--lpm .*x\.npy .*--out .*rep"):
        outs.check()
    assert list(tmp_path.iterdir()) == []


def test_inputs_beside_the_machinerys_names_pass(tmp_path):
    """Names that only look alike (another output's lock, a longer name) are not the machinery's."""
    (tmp_path / "w").mkdir()
    names = [".capo-verl-lock.other", ".capo-verl-new.rep2", "rep.meta.json", ".capo-verl-lock.rep.bak"]
    for name in names:
        (tmp_path / "w" / name).write_text("{}\n")
    outs = Outputs("test")
    outs.input("--data", *(tmp_path / "w" / name for name in names))
    outs.folder("--out", tmp_path / "w" / "rep", owns=["m.json"])
    outs.check()


def test_a_symlink_loop_is_named_as_a_loop(tmp_path):
    (tmp_path / "a").symlink_to(tmp_path / "b")
    (tmp_path / "b").symlink_to(tmp_path / "a")
    with pytest.raises(SymlinkLoop, match=r"--data .*/a: .*/a is a symlink loop"):
        Outputs("test").input("--data", tmp_path / "a")
    with pytest.raises(SymlinkLoop, match="is a symlink loop"):
        Outputs("test").input("--data", tmp_path / "a" / "x.jsonl")
    for declare in (
        lambda: Outputs("test").folder("--out", tmp_path / "a", owns=["x"]),
        lambda: Outputs("test").file("--out", tmp_path / "a" / "x.json"),
    ):
        with pytest.raises(outputs.commands.UsageError, match="runs into a symlink loop"):
            declare()
    with pytest.raises(SymlinkLoop, match=r"--out .*/a: .*/a is a symlink loop"):
        Outputs("test").file("--out", tmp_path / "a")


# ------------------------------------------------------------------------------------------ whole or untouched


def _old_folder(tmp_path: Path) -> Path:
    out = tmp_path / "report"
    (out / "sub").mkdir(parents=True)
    (out / "metrics.json").write_text("old metrics")
    (out / "plot.png").write_text("old plot")  # owned, not written this time: gone from the new folder
    (out / "notes.md").write_text("the user's notes")
    (out / "sub" / "kept.txt").write_text("kept")
    (out / "link").symlink_to("notes.md")
    return out


def _write_new(tmp_path: Path, out: Path) -> None:
    outs = Outputs("test")
    folder = outs.folder("--out", out, owns=["metrics.json", "report.md", "plot.png"])
    with outs.writing():
        (folder.stage / "metrics.json").write_text("new metrics")
        (folder.stage / "report.md").write_text("new report")


NEW = {
    "metrics.json": b"new metrics",
    "report.md": b"new report",
    "notes.md": b"the user's notes",
    "sub/kept.txt": b"kept",
    "link": b"-> notes.md",
}


def test_a_folder_is_replaced_whole_keeping_what_the_command_does_not_own(tmp_path):
    out = _old_folder(tmp_path)
    _write_new(tmp_path, out)
    assert tree(out) == NEW and leftovers(tmp_path) == []
    (tmp_path / "fresh").mkdir()
    _write_new(tmp_path, tmp_path / "fresh" / "a" / "b")  # missing parents made
    assert tree(tmp_path / "fresh") == {"a/b/metrics.json": b"new metrics", "a/b/report.md": b"new report"}


def test_a_folder_that_holds_the_current_folder_is_refused(tmp_path, monkeypatch):
    out = _old_folder(tmp_path)
    monkeypatch.chdir(out / "sub")
    with pytest.raises(
        outputs.commands.UsageError,
        match=rf"--out .*\breport\b.*\bcurrent folder\b.*\bfrom {re.escape(str(out.resolve().parent))}\b",
    ):
        Outputs("test").folder("--out", out, owns=["metrics.json"])
    monkeypatch.chdir(tmp_path)
    Outputs("test").folder("--out", out, owns=["metrics.json"])


def test_the_new_folder_keeps_the_old_ones_permissions(tmp_path):
    out = _old_folder(tmp_path)
    out.chmod(0o750)
    _write_new(tmp_path, out)
    assert out.stat().st_mode & 0o777 == 0o750 and tree(out) == NEW


def test_a_failure_while_writing_changes_nothing(tmp_path):
    out = _old_folder(tmp_path)
    before = tree(tmp_path)
    outs = Outputs("test")
    folder = outs.folder("--out", out, owns=["metrics.json"])
    file = outs.file("--out", tmp_path / "new" / "deeper" / "x.json")
    with pytest.raises(RuntimeError, match="disk full"), outs.writing():
        (folder.stage / "metrics.json").write_text("half")
        file.stage.write_text("half")
        raise RuntimeError("disk full")
    assert tree(tmp_path) == before and not (tmp_path / "new").exists() and leftovers(tmp_path) == []


HOLD = """
import sys, time
from capo_verl import outputs
outs = outputs.Outputs("eval score")
outs.folder("--out", sys.argv[1], owns=["metrics.json"])
with outs.writing():
    print("locked", flush=True)
    time.sleep(600)
"""


def test_a_second_writer_is_refused_at_once_naming_the_first_and_a_dead_ones_lock_is_taken_over(tmp_path):
    out = _old_folder(tmp_path)
    holder = subprocess.Popen([sys.executable, "-c", HOLD, str(out)], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "locked"
        t0 = time.monotonic()
        with pytest.raises(
            OutputLocked, match=rf"--out {re.escape(str(out))}\b.*\bPID {holder.pid}\b.*\banother --out\b"
        ):
            _write_new(tmp_path, out)
        assert time.monotonic() - t0 < 5  # at once
    finally:
        holder.kill()
        holder.wait()
    assert (tmp_path / f"{outputs.LOCK_PREFIX}report").exists()  # a killed holder's lock file stays behind ...
    _write_new(tmp_path, out)  # ... and is taken over, its staged folder removed
    assert tree(out) == NEW and leftovers(tmp_path) == []


def test_a_lock_file_naming_a_dead_pid_is_taken_over(tmp_path):
    out = _old_folder(tmp_path)
    (tmp_path / f"{outputs.LOCK_PREFIX}report").write_text(json.dumps({"pid": 2**22 + 7, "command": "x"}))
    _write_new(tmp_path, out)
    assert tree(out) == NEW and leftovers(tmp_path) == []


class Killed(BaseException):
    """Stands for SIGKILL at one point of a commit: nothing after it runs (no except clause catches it)."""


@pytest.mark.parametrize("exchange", [True, False], ids=["exchange", "two renames"])
@pytest.mark.parametrize("point", ["after the journal", "after the first rename", "before the old one is removed"])
def test_a_commit_cut_short_leaves_old_or_new_and_the_next_run_completes_it(tmp_path, monkeypatch, exchange, point):
    out = _old_folder(tmp_path)
    old = tree(out)
    if not exchange:
        monkeypatch.setattr(outputs, "_exchange", lambda a, b: False)
    real_rename, real_swap, renames = os.rename, outputs._swap_folder, []

    def rename(a, b):
        renames.append((a, b))
        if point == "after the first rename" and len(renames) == 2:
            raise Killed
        real_rename(a, b)

    def swap(staged, final, old_):
        if point == "after the journal":
            raise Killed
        if point == "after the first rename" and exchange:
            real_swap(staged, final, old_)
            raise Killed
        real_swap(staged, final, old_)

    monkeypatch.setattr(outputs.os, "rename", rename)
    monkeypatch.setattr(outputs, "_swap_folder", swap)
    if point == "before the old one is removed":
        monkeypatch.setattr(outputs, "_finish", lambda entries: (_ for _ in ()).throw(Killed()))
    with pytest.raises(Killed):
        _write_new(tmp_path, out)
    monkeypatch.undo()
    seen = tree(out) if out.exists() else None
    if seen is None:  # only between the two renames, where the file system cannot exchange
        assert not exchange and point == "after the first rename"
        assert tree(tmp_path / f"{outputs.OLD_PREFIX}report") == old
    else:
        assert seen in (old, NEW)
    assert (tmp_path / f"{outputs.JOURNAL_PREFIX}report.json").exists()
    outs = Outputs("test")  # the next run into the folder: it completes the commit before it starts
    folder = outs.folder("--out", out, owns=["metrics.json", "report.md", "plot.png"])
    with outs.writing():
        assert tree(out) == NEW
        assert leftovers(tmp_path) == [f"{outputs.LOCK_PREFIX}report", f"{outputs.STAGING_PREFIX}report"]
        (folder.stage / "metrics.json").write_text("new metrics")
        (folder.stage / "report.md").write_text("new report")
    assert tree(out) == NEW and leftovers(tmp_path) == []


def test_files_are_committed_together_or_not_at_all(tmp_path, monkeypatch):
    (tmp_path / "tf.json").write_text("old json")
    (tmp_path / "tf.0.npy").write_text("old lpm")
    outs = Outputs("test")
    json_out = outs.file("--out", tmp_path / "tf.json")
    npy = outs.file("--out", tmp_path / "tf.0.npy")
    real_replace, calls = os.replace, []

    def replace(a, b):
        calls.append(b)
        if len(calls) == 2:  # the journal is the first replace; killed after the first file moved in
            real_replace(a, b)
            raise Killed
        real_replace(a, b)

    monkeypatch.setattr(outputs.os, "replace", replace)
    with pytest.raises(Killed), outs.writing():
        json_out.stage.write_text("new json")
        npy.stage.write_text("new lpm")
    monkeypatch.undo()
    outputs.recover(tmp_path / "tf.json")  # what the next run does first, holding the lock
    assert (tmp_path / "tf.json").read_text() == "new json" and (tmp_path / "tf.0.npy").read_text() == "new lpm"
    assert leftovers(tmp_path) == []


def test_write_atomic_replaces_a_symlink_and_leaves_its_target(tmp_path):
    target = tmp_path / "metrics.jsonl"
    target.write_text("an input")
    (tmp_path / "summary.json").symlink_to(target)
    outputs.write_atomic(tmp_path / "summary.json", "{}")
    assert target.read_text() == "an input" and (tmp_path / "summary.json").read_text() == "{}"
    assert not (tmp_path / "summary.json").is_symlink() and leftovers(tmp_path) == []


# ------------------------------------------------------------------------------------------ eval score killed


def _generations(path: Path, seed: int, n_questions: int = 40, k: int = 4) -> Path:
    rng = random.Random(seed)
    with open(path, "w") as f:
        for q in range(n_questions):
            for j in range(k):
                correct = rng.random() < 0.5
                rec = {
                    "data_source": ["gsm8k", "math500"][q % 2],
                    "question_id": q,
                    "sample_index": j,
                    "response": "x",
                    "answer": str(int(correct)),
                    "correct": correct,
                    "lpm": -rng.random(),
                    "num_tokens": 3,
                }
                f.write(json.dumps(rec) + "\n")
    return path


def _start_score(gen: Path, out: Path) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "capo_verl.cli", "eval", "score", f"run={gen}", "--out", str(out)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )


def _score(gen: Path, out: Path) -> tuple[float, float]:
    """Run ``eval score`` to the end; ``(seconds until its staging folder appeared, seconds in all)``."""
    staging = out.parent / f"{outputs.STAGING_PREFIX}{out.name}"
    t0 = time.monotonic()
    proc, appeared = _start_score(gen, out), None
    while proc.poll() is None:
        if appeared is None and staging.exists():
            appeared = time.monotonic() - t0
        time.sleep(0.005)
    assert proc.returncode == 0, proc.stderr.read()[-3000:]
    return appeared if appeared is not None else 0.0, time.monotonic() - t0


def test_eval_score_killed_at_random_points_leaves_the_old_folder_or_the_new_one(tmp_path):
    gens = [_generations(tmp_path / "a.jsonl", 1), _generations(tmp_path / "b.jsonl", 2)]
    out = tmp_path / "report"
    _score(gens[0], out)
    expected = [tree(out)]
    appeared, total = _score(gens[1], out)
    expected.append(tree(out))
    assert expected[0] != expected[1] and "metrics.json" in expected[1] and "precision_coverage.png" in expected[1]
    rng = random.Random(0)
    staging = tmp_path / f"{outputs.STAGING_PREFIX}report"
    journal = tmp_path / f"{outputs.JOURNAL_PREFIX}report.json"
    hits = {"while staging": 0, "other": 0}
    for i in range(12):
        target = i % 2
        before = tree(out)
        pending = journal.exists()  # a commit that a kill cut short: this run moves that folder in first
        proc = _start_score(gens[target], out)
        if i % 3 == 2:  # a random moment of the whole run
            time.sleep(rng.uniform(0, total))
        else:  # a random moment after it started writing: the staging folder, the renames, the cleanup
            deadline = time.monotonic() + 2 * total + 30
            while not staging.exists() and proc.poll() is None and time.monotonic() < deadline:
                time.sleep(0.002)
            time.sleep(rng.uniform(0, max(total - appeared, 0.05)))
        hits["while staging" if staging.exists() else "other"] += 1
        proc.send_signal(signal.SIGKILL if i % 2 else signal.SIGTERM)
        proc.wait()
        now = tree(out)
        assert now in expected, f"kill {i}: a mix of the old and the new folder"
        if not pending:
            assert now in (before, expected[target]), f"kill {i}"
    print(f"kills: {hits}")
    assert hits["while staging"] >= 1  # some kills landed while the new folder was being written
    _score(gens[0], out)  # the next run recovers what the kills left, and leaves nothing beside the folder
    assert tree(out) == expected[0] and leftovers(tmp_path) == []


def test_a_full_disk_at_the_lock_leaves_no_lock_file_and_the_old_output(tmp_path, monkeypatch):
    """The lock's PID record is the first byte a command writes: on a full disk that write fails, the command stops
    with the OSError, and neither a 0-byte ``.capo-verl-lock.*`` nor a change to the old output is left."""
    import errno

    target = tmp_path / "report.json"
    target.write_text("old")
    real_write = os.write

    def full(fd, data):
        if os.readlink(f"/proc/self/fd/{fd}").endswith(f"{outputs.LOCK_PREFIX}report.json"):
            raise OSError(errno.ENOSPC, "No space left on device")
        return real_write(fd, data)

    monkeypatch.setattr(outputs.os, "write", full)
    outs = Outputs("eval score")
    outs.file("--out", target)
    with pytest.raises(OSError) as info, outs.writing():
        pass
    assert info.value.errno == errno.ENOSPC
    assert sorted(p.name for p in tmp_path.iterdir()) == ["report.json"] and target.read_text() == "old"
