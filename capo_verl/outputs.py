"""The outputs of a ``capo-verl`` command, in one place: declared beside its inputs, checked before anything is
written, written whole or not at all, and by one writer at a time.

Every command that writes (``prepare-data``, ``eval generate``, ``eval score``, ``eval teacher-forced``,
``mask-thresholds``) builds one :class:`Outputs`::

    outs = outputs.Outputs("eval score")
    outs.input("--generations", *files)                      # what the command reads
    report = outs.folder("--out", args.out, owns=REPORT_FILES)  # what it writes
    outs.check()                                             # every refusal, before anything is written
    ...                                                      # read the inputs, compute
    with outs.writing():                                     # lock, then write into report.stage
        write(report.stage / "metrics.json")
    # here the new folder has replaced the old one in one rename; on an exception nothing was changed

The rules, the same for every command:

- **No output is an input.** An output that resolves (``~``, ``..`` and symlinks followed) to an input, an output
  file that already exists inside an input folder, an input at a name an output folder owns, and two outputs at one
  path are refused (:class:`InputIsOutput`), ``--overwrite`` or not; so is an input (or another output) that is, or
  lies inside, a path this module itself writes or removes beside an output (:meth:`Output.machinery`: its lock,
  staging, old-folder and journal paths). A symlink loop among them is named as a loop (:class:`SymlinkLoop`).
- **Nothing is written before every check.** :meth:`Outputs.check` only reads; a command reads and checks all its
  inputs before :meth:`Outputs.writing`, so a command that fails at its start leaves every file as it was.
- **One writer.** :meth:`Outputs.writing` takes a lock beside each output (``.capo-verl-lock.<name>``, an
  ``flock`` that the kernel drops when its process dies, holding the PID and the command). A second writer is refused
  at once, naming the first one's PID (:class:`OutputLocked`); the lock of a dead process is taken over.
- **Whole or untouched.** A file output is written to a temporary sibling (``.capo-verl-new.<name>``) and moved in
  with one rename. A folder output is built in a temporary sibling; the entries of the old folder that the command
  does not own (a user's notes, other commands' files) are hard-linked into it; then one ``renameat2`` with
  ``RENAME_EXCHANGE`` swaps it with the old folder, and the old one is removed. Where the file system cannot exchange,
  the old folder is renamed away (``.capo-verl-old.<name>``) and the new one renamed in: a kill between those two
  renames leaves no folder at ``<name>``, the old one at ``.capo-verl-old.<name>`` and the complete new one at
  ``.capo-verl-new.<name>``. Before the first rename a journal (``.capo-verl-commit.<name>.json``) lists the renames;
  the next run into the same output, before it starts, completes a commit that a kill cut short (everything the
  journal lists was complete when it was written): the old folder is renamed back, then the new one swapped in. A
  reader thus sees the old output or the new one, never a mix (on a file system without the exchange, also no
  folder for the moment between the two renames).

A file that a command appends to and resumes (``eval generate``'s ``--out``) is declared with :meth:`Outputs.append`:
checked and locked, written in place.
"""

from __future__ import annotations

import ctypes
import errno
import fcntl
import json
import logging
import os
import shutil
import time
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from capo_verl import commands

__all__ = [
    "InputIsOutput",
    "OutputLocked",
    "SymlinkLoop",
    "Output",
    "Outputs",
    "resolve",
    "lock_path",
    "staging_path",
    "old_path",
    "journal_path",
    "write_atomic",
    "recover",
]

logger = logging.getLogger("capo_verl.outputs")

LOCK_PREFIX = ".capo-verl-lock."
STAGING_PREFIX = ".capo-verl-new."
OLD_PREFIX = ".capo-verl-old."
JOURNAL_PREFIX = ".capo-verl-commit."


class InputIsOutput(commands.UsageError):
    """An output of a command that is (or would replace) one of its inputs, or two outputs at one path."""


class OutputLocked(commands.UsageError):
    """Another live process is writing this output (its PID and command are in the message)."""


class SymlinkLoop(commands.UsageError):
    """A path that runs into a symlink loop (``ELOOP``): named as a loop, not as a missing file."""


# ------------------------------------------------------------------------------------------------------ paths


def resolve(path: str | os.PathLike, option: str = "path") -> Path:
    """``path`` with ``~`` expanded, made absolute, ``..`` and every symlink followed (the path need not exist).

    Raises:
        SymlinkLoop: the path, or a folder above it, is a symlink loop; the message names the link.
    """
    p = Path(os.path.abspath(os.path.expanduser(str(path))))
    try:
        return Path(os.path.realpath(p, strict=True))
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            loop = _loop_link(p)
            raise SymlinkLoop(f"{option} {path}: {loop} is a symlink loop (it points back to itself)") from None
    # a path that does not exist (yet): resolve what does, keep the rest
    return Path(os.path.realpath(p))


def _loop_link(p: Path) -> Path:
    """The first component of ``p`` whose lookup fails with ``ELOOP``."""
    probe = Path(p.anchor)
    for part in p.parts[1:]:
        probe = probe / part
        try:
            os.stat(probe)
        except OSError as exc:
            if exc.errno == errno.ELOOP:
                return probe
            break
    return p


def _is_under(path: Path, folder: Path) -> bool:
    return path != folder and folder in path.parents


def lock_path(target: Path) -> Path:
    """The lock file of output ``target``: ``.capo-verl-lock.<name>`` beside it."""
    return target.parent / f"{LOCK_PREFIX}{target.name}"


def staging_path(target: Path) -> Path:
    """Where output ``target`` is written before it is moved in: ``.capo-verl-new.<name>`` beside it (the name keeps
    the suffix, so that a reader that goes by it, or ``numpy.save``, sees the right one)."""
    return target.parent / f"{STAGING_PREFIX}{target.name}"


def old_path(target: Path) -> Path:
    """Where the old folder ``target`` waits while the new one is renamed in, where it cannot be exchanged."""
    return target.parent / f"{OLD_PREFIX}{target.name}"


def journal_path(target: Path) -> Path:
    """The commit journal beside the first output ``target``: ``.capo-verl-commit.<name>.json``."""
    return target.parent / f"{JOURNAL_PREFIX}{target.name}.json"


# ------------------------------------------------------------------------------------------------------ the lock


class _Lock:
    """An exclusive ``flock`` on ``.capo-verl-lock.<name>`` beside an output, with the holder's PID and command."""

    def __init__(self, target: Path, option: str, command: str):
        self.target, self.option, self.command = target, option, command
        self.path = lock_path(target)
        self.fd: int | None = None

    def acquire(self) -> None:
        """Raises: OutputLocked naming the holder's PID when a live process holds the lock."""
        while True:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(fd)
                holder = self._holder()
                raise OutputLocked(
                    f"{self.option} {self.target} is being written by another capo-verl process ({holder}); wait for "
                    f"it to finish, stop it, or choose another {self.option}"
                ) from None
            # the previous holder may have removed the file between our open and our flock: lock the file that is there
            try:
                same = os.path.samestat(os.fstat(fd), os.stat(self.path))
            except FileNotFoundError:
                same = False
            if not same:
                os.close(fd)
                continue
            self.fd = fd
            try:
                os.ftruncate(fd, 0)
                record = {"pid": os.getpid(), "command": f"capo-verl {self.command}", "since": time.strftime("%FT%T%z")}
                os.write(fd, (json.dumps(record) + "\n").encode())
            except OSError:  # a full disk: the lock file is not left behind
                self.release()
                raise
            return

    def _holder(self) -> str:
        for _ in range(20):  # the holder writes its PID right after it locks: give it a moment
            try:
                record = json.loads(self.path.read_text() or "null")
            except (OSError, ValueError):
                record = None
            if isinstance(record, dict) and "pid" in record:
                return f"PID {record['pid']}, `{record.get('command', '?')}` since {record.get('since', '?')}"
            time.sleep(0.05)
        return "PID unknown"

    def release(self) -> None:
        if self.fd is None:
            return
        try:
            os.unlink(self.path)  # while still holding it: a waiting opener then retries on a fresh file
        except FileNotFoundError:
            pass
        os.close(self.fd)
        self.fd = None


# ------------------------------------------------------------------------------------------------------ outputs


@dataclass
class Output:
    """One declared output of a command.

    Attributes:
        option: the option that names it (``--out``), for messages.
        path: the path as the user gave it, ``~`` expanded.
        real: :func:`resolve` of it: where it is written.
        kind: ``"file"`` (moved in whole), ``"folder"`` (built beside and swapped in) or ``"append"`` (written in
            place, resumable).
        owns: for a folder, the entry names the command writes (the rest of an old folder is carried over).
        lock: whether :meth:`Outputs.writing` locks it (False for a file a child command writes and locks).
        stage: inside :meth:`Outputs.writing`, the path to write to (the temporary sibling; ``real`` for
            ``"append"``); None outside.
    """

    option: str
    path: Path
    real: Path
    kind: str
    owns: frozenset[str] = frozenset()
    lock: bool = True
    stage: Path | None = None

    def paths(self) -> list[Path]:
        """The real paths this output writes: the file, or the folder and each owned entry in it."""
        return [self.real, *(self.real / name for name in sorted(self.owns))]

    def machinery(self) -> list[tuple[str, Path]]:
        """``(what, path)`` of every path beside this output that the machinery of this module creates, replaces or
        removes while it writes it (whatever its kind): the lock file, the staging path, the old folder's name, the
        commit journal, and the temporary siblings :func:`write_atomic` writes the output and the journal through."""
        journal = journal_path(self.real)
        return [
            ("the lock file", lock_path(self.real)),
            ("the staging path", staging_path(self.real)),
            ("the old-folder path", old_path(self.real)),
            ("the commit journal", journal),
            ("a temporary sibling", _atomic_tmp(self.real)),
            ("a temporary sibling", _atomic_tmp(journal)),
        ]


@dataclass
class _Input:
    option: str
    path: str
    real: Path


@dataclass
class Outputs:
    """The inputs and outputs of one command run (module docstring).

    Args:
        command: the command's name after ``capo-verl`` (``"eval score"``), written into its locks.
    """

    command: str
    inputs: list[_Input] = field(default_factory=list)
    outputs: list[Output] = field(default_factory=list)
    _created: list[Path] = field(default_factory=list)

    def input(self, option: str, *paths: str | os.PathLike | None) -> None:
        """Declare paths the command reads (files or folders; a missing one is the reader's to refuse; None skipped).

        Raises:
            SymlinkLoop: a path that is a symlink loop.
        """
        for path in paths:
            if path is not None and str(path) != "":
                self.inputs.append(_Input(option, str(path), resolve(path, option)))

    def file(
        self,
        option: str,
        path: str | os.PathLike,
        *,
        suffix: str | None = None,
        overwrite: bool = True,
        lock: bool = True,
    ) -> Output:
        """Declare a file the command writes whole (a temporary sibling, then one rename).

        Args:
            option: the option that names it.
            path: the file.
            suffix: the suffix it must have, or None.
            overwrite: whether an existing file may be replaced.
            lock: lock it while writing (False: a child command writes and locks it).

        Raises:
            UsageError: as :func:`capo_verl.commands.check_out_file`; SymlinkLoop.
        """
        checked = commands.check_out_file(path, option, suffix=suffix, overwrite=overwrite)
        return self._add(Output(option, checked, resolve(checked, option), "file", lock=lock))

    def append(self, option: str, path: str | os.PathLike, *, lock: bool = True) -> Output:
        """Declare a file the command appends to in place (resumable): checked and locked, not staged.

        Args:
            option, path: as :meth:`file`.
            lock: lock it while writing (False for a sidecar of a locked output).

        Raises:
            UsageError: as :func:`capo_verl.commands.check_out_file`; SymlinkLoop.
        """
        checked = commands.check_out_file(path, option)
        return self._add(Output(option, checked, resolve(checked, option), "append", lock=lock))

    def folder(self, option: str, path: str | os.PathLike, *, owns: Iterable[str]) -> Output:
        """Declare a folder the command writes whole: built beside it, then swapped in with one rename.

        Args:
            option: the option that names it.
            path: the folder.
            owns: the entry names the command writes into it; an old folder's other entries are carried over.

        Raises:
            UsageError: as :func:`capo_verl.commands.check_out_dir`; the folder is a mount point (a rename cannot
                replace it), or is or holds the current folder (the shell would be left in the old folder);
                SymlinkLoop.
        """
        checked = commands.check_out_dir(path, option)
        real = resolve(checked, option)
        if real.is_dir() and os.path.ismount(real):
            raise commands.UsageError(
                f"{option} {path} is a mount point: its folder cannot be replaced by a rename; name a folder inside it"
            )
        cwd = Path(os.path.realpath(os.getcwd()))
        if cwd == real or real in cwd.parents:
            raise commands.UsageError(
                f"{option} {path} holds the current folder ({cwd}): it is replaced whole by a rename, which would "
                f"leave this shell in the old one; run the command from outside it (e.g. from {real.parent})"
            )
        owned = frozenset(owns)
        bad = sorted(
            n
            for n in owned
            if not n
            or "/" in n
            or n.startswith((LOCK_PREFIX, STAGING_PREFIX, OLD_PREFIX, JOURNAL_PREFIX))
            or n in (".", "..")
        )
        if bad:
            raise ValueError(f"owns: {bad} are not plain entry names")
        return self._add(Output(option, checked, real, "folder", owned))

    def _add(self, out: Output) -> Output:
        self.outputs.append(out)
        return out

    # -------------------------------------------------------------------------------------------- the checks

    def check(self) -> None:
        """Refuse every output that is, or would replace, an input, two outputs at one path, and an input or output
        that is, or lies inside, a path of another output's :meth:`Output.machinery` (its lock file, staging path,
        old-folder path, commit journal); reads only.

        Raises:
            InputIsOutput: naming both options and paths.
        """
        for i, a in enumerate(self.outputs):
            for b in self.outputs[i + 1 :]:
                if set(a.paths()) & set(b.paths()):
                    raise InputIsOutput(f"{a.option} {a.path} and {b.option} {b.path} are the same path; name two")
        for out in self.outputs:
            for inp in self.inputs:
                why = _overlap(out, inp)
                if why:
                    via = "" if str(inp.real) == inp.path and str(out.real) == str(out.path) else f" ({out.real})"
                    raise InputIsOutput(
                        f"{out.option} {out.path} {why} {inp.option} {inp.path}{via}: writing it would destroy the "
                        f"input, with --overwrite or without; choose another {out.option}"
                    )
        # the paths the machinery itself writes and removes beside each output: an input (or another output) there
        # would be truncated, replaced or removed by the lock, the staging, the commit or the recovery of a commit
        for out in self.outputs:
            for what, path in out.machinery():
                for option, given, real in [(i.option, i.path, i.real) for i in self.inputs] + [
                    (o.option, o.path, o.real) for o in self.outputs if o is not out
                ]:
                    how = _inside_machinery(real, path)
                    if how:
                        raise InputIsOutput(
                            f"{option} {given} {how} {path}, {what} of {out.option} {out.path}, which capo-verl "
                            f"creates and removes while it writes {out.option}: it would be lost; move or rename "
                            f"{given}, or choose another {out.option}"
                        )

    # -------------------------------------------------------------------------------------------- writing

    @contextmanager
    def writing(self) -> Iterator[Outputs]:
        """Lock every output, finish or undo what a killed run left, give each output its ``stage``, and on a
        normal exit move every output in (the journal first); on an exception remove what was staged and change
        nothing. Locks and the folders made for them are removed afterwards.

        Raises:
            OutputLocked: another live process writes one of the outputs.
            OSError: a file system error while staging or moving in.
        """
        locks: list[_Lock] = []
        try:
            for out in sorted(self.outputs, key=lambda o: str(o.real)):
                self._make_parents(out.real.parent)
                if out.lock:
                    lock = _Lock(out.real, out.option, self.command)
                    lock.acquire()
                    locks.append(lock)
            for out in self.outputs:
                recover(out.real)
            for out in self.outputs:
                out.stage = out.real if out.kind == "append" else staging_path(out.real)
                if out.kind != "append":
                    _remove(out.stage)
                if out.kind == "folder":
                    out.stage.mkdir()
            try:
                yield self
            except BaseException:
                for out in self.outputs:
                    if out.kind != "append":
                        _remove(out.stage)
                raise
            self._commit()
        finally:
            for out in self.outputs:
                out.stage = None
            for lock in reversed(locks):
                lock.release()
            for folder in sorted(self._created, key=lambda p: len(p.parts), reverse=True):  # deepest first, if empty
                try:
                    folder.rmdir()
                except OSError:
                    pass
            self._created.clear()

    def _make_parents(self, folder: Path) -> None:
        missing = []
        probe = folder
        while not probe.exists():
            missing.append(probe)
            probe = probe.parent
        folder.mkdir(parents=True, exist_ok=True)
        self._created += [m for m in missing if m not in self._created]

    def _commit(self) -> None:
        staged = [o for o in self.outputs if o.kind != "append"]
        if not staged:
            self._created.clear()
            return
        try:  # before the journal: a failure here (a foreign entry that cannot be read ...) changes nothing
            for out in staged:
                if out.kind == "folder" and out.real.is_dir():
                    _carry(out.real, out.stage, out.owns)
                    shutil.copymode(out.real, out.stage)  # the folder keeps its permissions
                elif out.kind == "file" and out.real.is_file():
                    shutil.copymode(out.real, out.stage)
        except BaseException:
            for out in staged:
                _remove(out.stage)
            raise
        entries = []
        for out in staged:
            if out.kind == "folder":
                st = os.stat(out.stage)
                entries.append(
                    {
                        "kind": "folder",
                        "final": str(out.real),
                        "staged": str(out.stage),
                        "old": str(old_path(out.real)),
                        "staged_id": [st.st_dev, st.st_ino],
                        "owns": sorted(out.owns),
                    }
                )
            else:
                entries.append({"kind": "file", "final": str(out.real), "staged": str(out.stage)})
        journal = journal_path(staged[0].real)
        write_atomic(journal, json.dumps({"command": self.command, "pid": os.getpid(), "entries": entries}) + "\n")
        for entry in entries:
            if entry["kind"] == "file":
                os.replace(entry["staged"], entry["final"])
            else:
                _swap_folder(Path(entry["staged"]), Path(entry["final"]), Path(entry["old"]))
        _finish(entries)
        journal.unlink()
        self._created.clear()  # the folders made for the outputs now hold them


def _overlap(out: Output, inp: _Input) -> str | None:
    """Why ``out`` would destroy ``inp``, or None."""
    for path in out.paths():
        if path == inp.real:
            return "is the input"
        if _samefile(path, inp.real):
            return "is the same file as the input"
        if path != out.real and _is_under(inp.real, path):
            return "owns the entry that holds the input"
    if out.real.exists() and _is_under(out.real, inp.real):
        return "exists inside, and would replace part of, the input folder"
    return None


def _inside_machinery(real: Path, path: Path) -> str | None:
    """How the resolved path ``real`` is, or lies inside, the machinery ``path`` (followed where it is a symlink, or
    a hard link to ``real``), or None."""
    for probe in dict.fromkeys((path, Path(os.path.realpath(path)))):
        if real == probe:
            return "is"
        if _is_under(real, probe):
            return "lies inside"
    if _samefile(path, real):
        return "is the same file as"
    return None


def _samefile(a: Path, b: Path) -> bool:
    try:
        return os.path.samefile(a, b)
    except OSError:
        return False


# ------------------------------------------------------------------------------------------------ moving in


_LIBC = None
_EXCHANGE_WARNED = False
RENAME_EXCHANGE = 2
AT_FDCWD = -100


def _exchange(a: Path, b: Path) -> bool:
    """Swap ``a`` and ``b`` in one ``renameat2(RENAME_EXCHANGE)``; False where the system or file system lacks it.

    Raises:
        OSError: any other error of the call.
    """
    global _LIBC
    if _LIBC is None:
        _LIBC = ctypes.CDLL(None, use_errno=True)
    fn = getattr(_LIBC, "renameat2", None)
    if fn is None:
        return False
    if fn(AT_FDCWD, os.fsencode(a), AT_FDCWD, os.fsencode(b), RENAME_EXCHANGE) == 0:
        return True
    err = ctypes.get_errno()
    if err in (errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP):
        return False
    raise OSError(err, os.strerror(err), str(b))


def _swap_folder(staged: Path, final: Path, old: Path) -> None:
    """Move the complete folder ``staged`` in at ``final`` (module docstring). The old folder ends at ``staged``
    (exchanged) or ``old`` (two renames); :func:`_finish` removes it."""
    global _EXCHANGE_WARNED
    if not os.path.lexists(final):
        os.rename(staged, final)
        return
    if _exchange(staged, final):
        return
    if not _EXCHANGE_WARNED:
        _EXCHANGE_WARNED = True
        logger.warning(
            "%s: this file system cannot exchange two folders in one rename; the old folder is renamed to %s and the "
            "new one renamed in (a kill between the two is undone by the next run)",
            final.parent,
            old.name,
        )
    os.rename(final, old)
    os.rename(staged, final)


def _finish(entries: list[dict]) -> None:
    """Remove the old folders that the commit's ``entries`` replaced, keeping anything that appeared in them during
    the run (moved into the new folder)."""
    for entry in entries:
        if entry["kind"] != "folder":
            continue
        final, staged, old = Path(entry["final"]), Path(entry["staged"]), Path(entry["old"])
        for leftover in (staged, old):
            if leftover.exists() and not _is_id(leftover, entry["staged_id"]):
                if not _sweep(leftover, final, frozenset(entry["owns"])):
                    kept = leftover.with_name(f"{OLD_PREFIX}{final.name}.kept-{time.strftime('%Y%m%d-%H%M%S')}")
                    os.rename(leftover, kept)
                    logger.warning(
                        "%s: the old folder's entries that changed while the new one was written are kept in %s",
                        final,
                        kept,
                    )


def _is_id(path: Path, ident) -> bool:
    try:
        st = os.stat(path)
    except OSError:
        return False
    return [st.st_dev, st.st_ino] == list(ident)


def recover(target: Path) -> None:
    """Finish or undo, beside output ``target``, what a killed run of a command left: complete a commit its journal
    lists (every file in it was complete), put back an old folder a kill left renamed away, and remove a staged
    output that never got in. Call it holding the output's lock (:meth:`Outputs.writing` does)."""
    journal = journal_path(target)
    if journal.exists():
        try:
            entries = json.loads(journal.read_text())["entries"]
        except (OSError, ValueError, KeyError) as exc:
            raise commands.RunFailed(
                f"{journal}: a commit journal that cannot be read ({exc}); check {target} by hand and remove it"
            ) from exc
        for entry in entries:
            final, staged = Path(entry["final"]), Path(entry["staged"])
            if entry["kind"] == "file":
                if staged.exists():
                    os.replace(staged, final)
                continue
            old = Path(entry["old"])
            if _is_id(final, entry["staged_id"]):
                continue  # the new folder is in: _finish removes the old one
            if not os.path.lexists(final) and old.exists():
                os.rename(old, final)  # killed between the two renames: the old folder back
            if _is_id(staged, entry["staged_id"]):
                _swap_folder(staged, final, old)  # complete: the commit goes on
        _finish(entries)
        logger.warning("%s: completed the commit of a run that was stopped while moving its outputs in", target)
        journal.unlink()
    _remove(staging_path(target))


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    elif os.path.lexists(path):
        path.unlink()


def _carry(old: Path, new: Path, owns: frozenset[str]) -> None:
    """Hard-link (or copy, where links fail) every entry of ``old`` that ``new`` lacks and the command does not own
    into ``new``, recursively; symlinks are copied as links."""
    for entry in os.scandir(old):
        if entry.name in owns or entry.name.startswith((STAGING_PREFIX, LOCK_PREFIX)):
            continue
        src, dst = Path(entry.path), new / entry.name
        if os.path.lexists(dst):
            continue
        if entry.is_symlink():
            os.symlink(os.readlink(src), dst)
        elif entry.is_dir():
            dst.mkdir()
            shutil.copystat(src, dst)
            _carry(src, dst, frozenset())
        else:
            try:
                os.link(src, dst, follow_symlinks=False)
            except OSError:
                shutil.copy2(src, dst, follow_symlinks=False)


def _same_entry(a: Path, b: Path) -> bool:
    sa, sb = os.lstat(a), os.lstat(b)
    if os.path.samestat(sa, sb):
        return True
    if os.path.islink(a) and os.path.islink(b):
        return os.readlink(a) == os.readlink(b)
    return sa.st_size == sb.st_size and sa.st_mtime_ns == sb.st_mtime_ns  # a copy (shutil.copy2)


def _sweep(old: Path, new: Path, owns: frozenset[str]) -> bool:
    """Remove the replaced folder ``old``: its owned entries and the ones carried into ``new``; an entry that
    appeared in it meanwhile is moved into ``new``. Returns False (and keeps ``old``) when an entry differs from its
    carried copy."""
    whole = True
    for entry in os.scandir(old):
        src, dst = Path(entry.path), new / entry.name
        if entry.name in owns:
            _remove(src)
        elif not os.path.lexists(dst):
            os.rename(src, dst)
        elif entry.is_dir(follow_symlinks=False) and dst.is_dir() and not dst.is_symlink():
            whole = _sweep(src, dst, frozenset()) and whole
        elif _same_entry(src, dst):
            src.unlink()
        else:
            whole = False
    if whole:
        os.rmdir(old)
    return whole


def write_atomic(path: str | os.PathLike, data: str | bytes) -> Path:
    """Write ``data`` to ``path`` whole: into ``.capo-verl-new.<name>`` beside it, then one rename (a reader sees
    the old file or the new one). Text is written as UTF-8.

    Returns:
        ``Path(path)``.

    Raises:
        OSError: the folder cannot be written.
    """
    path = Path(path)
    tmp = _atomic_tmp(path)
    try:
        tmp.write_bytes(data.encode("utf-8") if isinstance(data, str) else data)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return path


def _atomic_tmp(path: Path) -> Path:
    """The temporary sibling :func:`write_atomic` writes ``path`` through: ``.capo-verl-new.<pid>.<name>``."""
    return path.with_name(f"{STAGING_PREFIX}{os.getpid()}.{path.name}")
