"""JSON-lines files as a study stores them: plain, or gzip-compressed beside the plain name.

A study's raw dumps (verl's validation dumps, ``metrics.jsonl``, held-out generations, teacher-forced pools) are
written plain and committed compressed (``<name>.jsonl.gz``, ``benchmarks/collect_compare.py --gzip-dumps``). Every
reader opens them through :func:`stored`, so that a folder of either form reads the same.
"""

from __future__ import annotations

import gzip
import os
from pathlib import Path
from typing import IO

GZ = ".gz"


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
    """
    path = stored(path)
    return gzip.open(path, "rb") if path.suffix == GZ else open(path, "rb")  # noqa: SIM115 (the caller closes it)


def read_bytes(path: str | os.PathLike) -> bytes:
    """The (decompressed) bytes of :func:`stored` ``(path)``.

    Raises:
        FileNotFoundError: neither ``path`` nor ``path.gz`` exists.
        gzip.BadGzipFile: a ``.gz`` file that is not gzip; ``EOFError``: one cut short.
    """
    with open_binary(path) as f:
        return f.read()


def read_text(path: str | os.PathLike) -> str:
    """The UTF-8 text of :func:`stored` ``(path)``.

    Raises:
        FileNotFoundError, gzip.BadGzipFile, EOFError: as :func:`read_bytes`.
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
