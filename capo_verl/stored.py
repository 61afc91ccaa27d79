"""JSON-lines files as a study stores them: plain, or gzip-compressed beside the plain name.

A study's raw dumps (verl's validation dumps, ``metrics.jsonl``, held-out generations, teacher-forced pools) are
written plain and committed compressed (``<name>.jsonl.gz``, ``benchmarks/collect_compare.py --gzip-dumps``). Every
reader opens them through :func:`stored`, so that a folder of either form reads the same.
"""

from __future__ import annotations

import functools
import gzip
import os
import zlib
from pathlib import Path
from typing import IO

GZ = ".gz"

#: what a damaged ``.gz`` file raises while it is read: cut short, a corrupt body, a bad header or CRC
_GZIP_ERRORS = (EOFError, zlib.error, gzip.BadGzipFile)


class _CheckedGzipFile(gzip.GzipFile):
    """A :class:`gzip.GzipFile` whose every read turns a damaged file's error (:data:`_GZIP_ERRORS`) into
    :class:`capo_verl.inputs.NotADataFile` naming the file and the fix, for every reader of :func:`open_binary`."""

    def _damaged(self, exc: BaseException):
        from capo_verl.inputs import NotADataFile

        what = "is cut short" if isinstance(exc, EOFError) else "has a corrupt body"
        kind = (
            type(exc).__name__ if type(exc).__module__ == "builtins" else f"{type(exc).__module__}.{type(exc).__name__}"
        )
        return NotADataFile(
            f"{self.name}: the gzip file {what} ({kind}: {exc}); it cannot be decompressed: "
            "restore or recompress it from the original file"
        )


def _checked(method):
    """``method`` of :class:`gzip.GzipFile`, raising a damaged file's error as :meth:`_CheckedGzipFile._damaged`."""

    @functools.wraps(method)
    def read(self, *args, **kwargs):
        try:
            return method(self, *args, **kwargs)
        except _GZIP_ERRORS as exc:
            raise self._damaged(exc) from None

    return read


for _name in ("read", "read1", "readinto", "readinto1", "readline", "peek", "seek"):
    setattr(_CheckedGzipFile, _name, _checked(getattr(gzip.GzipFile, _name)))


def stored(path: str | os.PathLike) -> Path:
    """``path`` if it exists, else ``path.gz`` if that exists (a committed, compressed copy), else ``path``.

    A name that already ends in ``.gz`` is returned as it is.
    """
    path = Path(path)
    if path.suffix == GZ or path.exists():
        return path
    gz = path.with_name(path.name + GZ)
    return gz if gz.exists() else path


def open_binary(path: str | os.PathLike) -> IO[bytes]:
    """Open :func:`stored` ``(path)`` for reading bytes, decompressing a ``.gz`` file.

    Raises:
        FileNotFoundError: neither ``path`` nor ``path.gz`` exists.
        capo_verl.inputs.NotADataFile: while reading, a ``.gz`` file that is cut short, has a corrupt body or is
            not gzip (the message names the file).
    """
    path = stored(path)
    if path.suffix == GZ:
        return _CheckedGzipFile(path, "rb")
    return open(path, "rb")  # noqa: SIM115 (the caller closes it)


def read_bytes(path: str | os.PathLike) -> bytes:
    """The (decompressed) bytes of :func:`stored` ``(path)``.

    Raises:
        FileNotFoundError: neither ``path`` nor ``path.gz`` exists.
        capo_verl.inputs.NotADataFile: a ``.gz`` file that is not gzip, is cut short or has a corrupt body.
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


def gzip_bytes(data: bytes) -> bytes:
    """``data`` gzip-compressed at level 9 with mtime 0: the same bytes always give the same file."""
    return gzip.compress(data, compresslevel=9, mtime=0)


def compress(path: str | os.PathLike) -> Path:
    """Replace the file ``path`` by ``path.gz`` (:func:`gzip_bytes`), written under a temporary name and renamed
    into place before ``path`` is removed, so that a stop at any point leaves one whole copy. Returns ``path.gz``.

    Raises:
        FileNotFoundError: no file at ``path``.
    """
    path = Path(path)
    target = path.with_name(path.name + GZ)
    partial = path.with_name(path.name + GZ + ".partial")
    partial.write_bytes(gzip_bytes(path.read_bytes()))
    partial.replace(target)
    path.unlink()
    return target
