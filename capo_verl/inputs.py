"""Data files a command reads, checked before they are read: what they are, how big, and where a line is wrong.

Every reader of a user's data file (``prepare-data --train-source``, ``eval generate --data``, ``eval score``'s
generation files, ``eval teacher-forced --pool`` and ``--data``, ``mask-thresholds --data`` and ``--pool``) calls
:func:`check_data_file` first. It looks at the file's metadata and its first and last bytes only, so a file that is
not data (a folder, a device, a sparse file of holes, a file of another format) is refused before memory grows:

- a symlink loop is named as a loop (:class:`capo_verl.outputs.SymlinkLoop`), a missing file as missing;
- a folder, or anything but a regular file (a FIFO, ``/dev/zero``), is refused (:class:`NotADataFile`);
- a file of more than :data:`SPARSE_MIN_BYTES` of which less than an eighth holds data (the rest holes, as
  ``SEEK_HOLE`` reports them) is a sparse file, not data (:class:`NotADataFile`);
- the first bytes must be those of its format: ``PAR1`` at both ends of a ``.parquet`` file, the gzip magic of a
  ``.gz`` file, the xz magic of a ``.xz`` file, and for ``.jsonl`` / ``.json`` a ``{`` or ``[`` as the first byte
  that is not white space (after a UTF-8 byte-order mark), with no NUL byte in the first 4 KiB (:class:`NotADataFile`);
- a whole-file ``.json`` larger than :data:`MAX_JSON_BYTES` is refused (use JSON lines); a JSON line longer than
  :data:`MAX_LINE_BYTES` is refused when it is reached, before it is held whole (:class:`BadDataLine`).

:func:`read_jsonl` and :func:`read_json` parse with errors that name the file and the line (:class:`BadDataLine`).
"""

from __future__ import annotations

import errno
import json
import os
import stat
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

from capo_verl import commands
from capo_verl.outputs import resolve

__all__ = [
    "NotADataFile",
    "BadDataLine",
    "MAX_LINE_BYTES",
    "MAX_JSON_BYTES",
    "SPARSE_MIN_BYTES",
    "check_data_file",
    "numbered_lines",
    "read_jsonl",
    "read_json",
]

#: the longest JSON line read (a generation line with its token ids is tens of KiB)
MAX_LINE_BYTES = 16 * 2**20
#: the largest whole-file ``.json`` read at once (larger data belongs in ``.jsonl`` or ``.parquet``)
MAX_JSON_BYTES = 256 * 2**20
#: a file above this size with under an eighth of it on disk is refused as sparse
SPARSE_MIN_BYTES = 2**20
_HEAD = 4096
_BOM = b"\xef\xbb\xbf"


class NotADataFile(commands.UsageError):
    """A path given as data that is not a data file of its format (checked before it is read)."""


class BadDataLine(commands.UsageError):
    """A JSON or JSON-lines file that does not parse, or has a line too long: the message names the file and line."""


def _format(path: Path) -> str:
    return path.suffix.lower()


def check_data_file(
    path: str | os.PathLike, what: str = "data file", *, hint: str | None = None, folder_hint: str | None = None
) -> Path:
    """Refuse a path that is not a readable data file of its suffix's format, from its metadata and its first and
    last bytes only (module docstring).

    Args:
        path: the file (``~`` expanded). Its format is its suffix: ``.parquet``, ``.jsonl``, ``.json``, ``.gz`` or
            ``.xz``; another suffix is left to the reader (only the metadata checks apply).
        what: what it is, for the messages (``"generation file"``).
        hint: appended to the missing-file message, e.g. ``"write one with `capo-verl eval generate`"``.
        folder_hint: the message's end for a folder (default ``"pass a file"``).

    Returns:
        ``Path(path)``, ``~`` expanded (not resolved: messages keep the user's name).

    Raises:
        capo_verl.outputs.SymlinkLoop: the path runs into a symlink loop.
        FileNotFoundError: no such file: ``no such <what>: <path> (<hint>)``.
        NotADataFile: a folder, not a regular file, a sparse file, a head or tail of another format, a ``.json``
            above :data:`MAX_JSON_BYTES`.
    """
    given = Path(os.path.expanduser(str(path)))
    real = resolve(given, what)
    if not real.exists():
        raise FileNotFoundError(f"no such {what}: {given}" + (f" ({hint})" if hint else ""))
    st = os.stat(real)
    if stat.S_ISDIR(st.st_mode):
        raise NotADataFile(f"{given} is a folder; {folder_hint or f'pass a {what}'}")
    if not stat.S_ISREG(st.st_mode):
        raise NotADataFile(f"{what} {given} is not a regular file (a device, FIFO or socket); pass a file")
    size = st.st_size
    if size > SPARSE_MIN_BYTES:
        data = _data_bytes(real, size)
        if data < size // 8:
            raise NotADataFile(
                f"{what} {given}: {size / 2**20:.0f} MiB of which {data / 2**20:.1f} MiB hold data; a sparse file "
                "(mostly holes) is not data"
            )
    fmt = _format(given)
    if fmt == ".json" and size > MAX_JSON_BYTES:
        raise NotADataFile(
            f"{what} {given}: {size / 2**20:.0f} MiB of JSON, more than {MAX_JSON_BYTES // 2**20} MiB read whole; "
            "write it as JSON lines (.jsonl) or parquet"
        )
    if size == 0 or fmt not in (".parquet", ".gz", ".xz", ".jsonl", ".json"):
        return given
    with open(real, "rb") as f:
        head = f.read(_HEAD)
        tail = b""
        if fmt == ".parquet":
            f.seek(max(0, size - 4))
            tail = f.read(4)
    if fmt == ".parquet":
        if head[:4] != b"PAR1" or tail != b"PAR1":
            raise NotADataFile(f"{what} {given}: {_shown(head)} is not the start of a parquet file (PAR1 ... PAR1)")
    elif fmt == ".gz":
        if head[:2] != b"\x1f\x8b":
            raise NotADataFile(f"{what} {given}: {_shown(head)} is not the start of a gzip file")
    elif fmt == ".xz":
        if head[:6] != b"\xfd7zXZ\x00":
            raise NotADataFile(f"{what} {given}: {_shown(head)} is not the start of an xz file")
    else:
        text = head.removeprefix(_BOM)
        if b"\0" in text:
            raise NotADataFile(f"{what} {given}: holds NUL bytes ({_shown(head)}), not JSON text")
        first = text.lstrip(b" \t\r\n")[:1]
        if first and first not in b"{[":
            raise NotADataFile(f"{what} {given}: {_shown(head)} is not the start of JSON ({{ or [ expected)")
    return given


def _data_bytes(path: Path, size: int, max_segments: int = 4096) -> int:
    """The bytes of ``path`` that are data, not holes (``SEEK_DATA`` / ``SEEK_HOLE``; compression does not count as
    a hole); ``size`` where the file system cannot tell or the file has more than ``max_segments`` data runs."""
    if not hasattr(os, "SEEK_DATA"):
        return size
    fd = os.open(path, os.O_RDONLY)
    try:
        total = pos = 0
        for _ in range(max_segments):
            try:
                start = os.lseek(fd, pos, os.SEEK_DATA)
            except OSError as exc:
                if exc.errno == errno.ENXIO:  # no data after pos
                    return total
                return size
            pos = os.lseek(fd, start, os.SEEK_HOLE)
            total += pos - start
            if pos >= size:
                return total
        return size
    finally:
        os.close(fd)


def _shown(head: bytes) -> str:
    return f"it starts with {head[:16]!r}"


def numbered_lines(f: IO[bytes], path: str | os.PathLike) -> Iterator[tuple[int, bytes]]:
    """``(line number from 1, raw line)`` of a binary file, each read with a bound: a line longer than
    :data:`MAX_LINE_BYTES` is refused when it is reached, before it is held whole.

    Raises:
        BadDataLine: naming the file and the line.
    """
    number = 0
    while True:
        raw = f.readline(MAX_LINE_BYTES + 1)
        if not raw:
            return
        number += 1
        if len(raw) > MAX_LINE_BYTES and not raw.endswith(b"\n"):
            raise BadDataLine(
                f"{path}:{number}: a line longer than {MAX_LINE_BYTES // 2**20} MiB; not a JSON-lines file of "
                "capo-verl's (one record per line)"
            )
        yield number, raw


def read_jsonl(path: str | os.PathLike, what: str = "data file", *, hint: str | None = None) -> list[Any]:
    """The records of a JSON-lines file, blank lines skipped, after :func:`check_data_file`.

    Raises:
        BadDataLine: a line that is not UTF-8 or not JSON, or too long: ``<file>:<line>: ...``.
        FileNotFoundError, NotADataFile, SymlinkLoop: as :func:`check_data_file`.
    """
    path = check_data_file(path, what, hint=hint)
    records = []
    with open(path, "rb") as f:
        for number, raw in numbered_lines(f, path):
            if not raw.strip():
                continue
            try:
                records.append(json.loads(raw.decode("utf-8")))
            except UnicodeDecodeError as e:
                raise BadDataLine(f"{path}:{number}: not UTF-8 text ({e.reason} at byte {e.start})") from None
            except json.JSONDecodeError as e:
                raise BadDataLine(f"{path}:{number}: not a JSON line ({e.msg} at column {e.colno})") from None
    return records


def read_json(
    path: str | os.PathLike, what: str = "data file", *, hint: str | None = None, folder_hint: str | None = None
) -> Any:
    """The value of a whole-file JSON document, after :func:`check_data_file` (``hint``, ``folder_hint`` as there).

    Raises:
        BadDataLine: not UTF-8, or not JSON: ``<file>:<line>:<column>: ...``.
        FileNotFoundError, NotADataFile, SymlinkLoop: as :func:`check_data_file`.
    """
    path = check_data_file(path, what, hint=hint, folder_hint=folder_hint)
    raw = Path(path).read_bytes()
    try:
        return json.loads(raw.decode("utf-8-sig"))
    except UnicodeDecodeError as e:
        raise BadDataLine(f"{path}: not UTF-8 text ({e.reason} at byte {e.start})") from None
    except json.JSONDecodeError as e:
        raise BadDataLine(f"{path}:{e.lineno}:{e.colno}: not JSON ({e.msg})") from None
