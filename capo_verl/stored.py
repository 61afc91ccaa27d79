"""JSON-lines files as a study stores them: plain, or compressed beside the plain name.

A study's raw dumps (verl's validation dumps, ``metrics.jsonl``, held-out generations, teacher-forced pools) are
written plain and committed compressed: ``<name>.jsonl.xz`` (:func:`compress`,
``benchmarks/collect_compare.py --compress-dumps``), about a quarter smaller than gzip on these dumps, so that the
tracked tree stays small enough to travel to a GPU machine. ``<name>.jsonl.gz`` (earlier studies, the shipped
training file, user files) reads the same. Every reader opens them through :func:`stored`, so that a folder of any
of the three forms reads the same.
"""

from __future__ import annotations

import functools
import gzip
import lzma
import os
import zlib
from pathlib import Path
from typing import IO

XZ = ".xz"
GZ = ".gz"
#: the compressed forms a stored file may take, the one :func:`compress` writes first
COMPRESSED = (XZ, GZ)

#: what a damaged compressed file raises while it is read: cut short, a corrupt body, a bad header or check
_ERRORS = (EOFError, zlib.error, gzip.BadGzipFile, lzma.LZMAError)


def _damaged(name, kind: str, exc: BaseException):
    """:class:`capo_verl.inputs.NotADataFile` for the ``kind`` (gzip, xz) file ``name`` whose read raised ``exc``."""
    from capo_verl.inputs import NotADataFile

    what = "is cut short" if isinstance(exc, EOFError) else "has a corrupt body"
    error = type(exc).__name__ if type(exc).__module__ == "builtins" else f"{type(exc).__module__}.{type(exc).__name__}"
    return NotADataFile(
        f"{name}: the {kind} file {what} ({error}: {exc}); it cannot be decompressed: "
        "restore or recompress it from the original file"
    )


def _xz_tail(path) -> None:
    """Refuse an ``.xz`` file that does not end as an xz stream does, with the footer's magic ``YZ``:
    :class:`lzma.LZMAFile` reads up to the last whole stream and ignores what follows, so a file with other data
    appended would read as whole. (Python's reader takes no stream padding after a stream either.)

    Raises:
        capo_verl.inputs.NotADataFile: so, naming the file.
    """
    with open(path, "rb") as f:
        f.seek(max(0, f.seek(0, os.SEEK_END) - 2))
        tail = f.read()
    if tail != b"YZ":
        from capo_verl.inputs import NotADataFile

        raise NotADataFile(
            f"{path}: the xz file does not end with an xz stream's footer (it is cut short, or other data follows "
            "it); it cannot be read whole: restore or recompress it from the original file"
        )


def _checked(cls: type, kind: str, check=None) -> type:
    """A subclass of the reader ``cls`` (:class:`gzip.GzipFile`, :class:`lzma.LZMAFile`) whose every read turns a
    damaged file's error (:data:`_ERRORS`) into :class:`capo_verl.inputs.NotADataFile` naming the file and the fix,
    for every reader of :func:`open_binary`; ``check(path)``, if given, runs at open (:func:`_xz_tail`)."""

    def wrap(method):
        @functools.wraps(method)
        def read(self, *args, **kwargs):
            try:
                return method(self, *args, **kwargs)
            except _ERRORS as exc:
                raise _damaged(self._given, kind, exc) from None

        return read

    def init(self, path, mode="rb"):
        self._given = path
        if check is not None:
            check(path)
        cls.__init__(self, path, mode)

    methods = ("read", "read1", "readinto", "readinto1", "readline", "peek", "seek")
    body = {name: wrap(getattr(cls, name)) for name in methods if hasattr(cls, name)}
    return type(f"_Checked{cls.__name__}", (cls,), {"__init__": init, **body})


_READERS = {GZ: _checked(gzip.GzipFile, "gzip"), XZ: _checked(lzma.LZMAFile, "xz", _xz_tail)}


def stored(path: str | os.PathLike) -> Path:
    """``path`` if it exists, else ``path.xz`` or else ``path.gz`` if one exists (a committed, compressed copy),
    else ``path``.

    A name that already ends in ``.xz`` or ``.gz`` is returned as it is.
    """
    path = Path(path)
    if path.suffix in COMPRESSED or path.exists():
        return path
    for suffix in COMPRESSED:
        packed = path.with_name(path.name + suffix)
        if packed.exists():
            return packed
    return path


def open_binary(path: str | os.PathLike) -> IO[bytes]:
    """Open :func:`stored` ``(path)`` for reading bytes, decompressing a ``.xz`` or ``.gz`` file.

    Raises:
        FileNotFoundError: none of ``path``, ``path.xz``, ``path.gz`` exists.
        capo_verl.inputs.NotADataFile: while reading, a compressed file that is cut short, has a corrupt body or is
            not of its suffix's format (the message names the file).
    """
    path = stored(path)
    reader = _READERS.get(path.suffix)
    return reader(path, "rb") if reader else open(path, "rb")  # noqa: SIM115 (the caller closes it)


def read_bytes(path: str | os.PathLike) -> bytes:
    """The (decompressed) bytes of :func:`stored` ``(path)``.

    Raises:
        FileNotFoundError: none of ``path``, ``path.xz``, ``path.gz`` exists.
        capo_verl.inputs.NotADataFile: a compressed file that is not of its format, is cut short or has a corrupt
            body.
    """
    with open_binary(path) as f:
        return f.read()


def read_text(path: str | os.PathLike) -> str:
    """The UTF-8 text of :func:`stored` ``(path)``.

    Raises:
        FileNotFoundError, capo_verl.inputs.NotADataFile: as :func:`read_bytes`.
        UnicodeDecodeError: the text is not UTF-8.
    """
    return read_bytes(path).decode("utf-8")


def xz_bytes(data: bytes) -> bytes:
    """``data`` xz-compressed (preset 9, extreme; CRC64 check): the same bytes always give the same file."""
    return lzma.compress(data, format=lzma.FORMAT_XZ, check=lzma.CHECK_CRC64, preset=9 | lzma.PRESET_EXTREME)


def plain_name(path: str | os.PathLike) -> Path:
    """``path`` without its compressed suffix (``30.jsonl.xz`` -> ``30.jsonl``); a plain name as it is."""
    path = Path(path)
    return path.with_suffix("") if path.suffix in COMPRESSED else path


def compress(path: str | os.PathLike) -> Path:
    """Store the file ``path`` (plain, or ``.gz``) as ``<plain name>.xz`` (:func:`xz_bytes` of its decompressed
    bytes), written under a temporary name and renamed into place before ``path`` is removed, so that a stop at any
    point leaves one whole copy; where that ``.xz`` file is already there with the same decompressed bytes, ``path``
    is only removed. Returns the ``.xz`` file.

    Raises:
        FileNotFoundError: no file at ``path``.
        ValueError: ``path`` is already a ``.xz`` file, or the ``.xz`` file beside it holds other data (nothing
            changes).
        capo_verl.inputs.NotADataFile: ``path`` or the ``.xz`` file beside it is damaged (nothing changes).
    """
    path = Path(path)
    if path.suffix == XZ:
        raise ValueError(f"{path}: already stored as xz")
    target = plain_name(path).with_name(plain_name(path).name + XZ)
    data = read_bytes(path)
    if target.exists():
        if read_bytes(target) != data:
            raise ValueError(f"{path}: {target.name} beside it holds other data; keep the one that is right")
    else:
        partial = target.with_name(target.name + ".partial")
        partial.write_bytes(xz_bytes(data))
        partial.replace(target)
    path.unlink()
    return target
