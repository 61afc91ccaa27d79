"""One way to write a ``capo-verl`` command: its parser, its shared options, its errors and its exit codes.

Every command (``capo-verl prepare-data``, ``eval generate|score|teacher-forced``, ``mask-thresholds``, ``smollm2``,
``demo``, and the ``capo-verl`` dispatcher itself) is built the same way::

    from capo_verl import commands

    def build_parser() -> argparse.ArgumentParser:
        p = commands.parser("smollm2", "Convert ... and print its folder.")
        commands.add_option(p, "--seed")                       # a shared option: its shared default and help
        commands.add_option(p, "--dtype", default="float32", why="teacher forcing compares checkpoints ...")
        p.add_argument("--cache-dir", ...)                     # an option of this command alone: plain argparse
        return p

    def run(args: argparse.Namespace) -> int | None:
        commands.check_out_dir(args.cache_dir, "--cache-dir")  # outputs checked before the expensive work
        ...                                                    # raise commands.UsageError(...) for a user's mistake

    def main(argv: list[str] | None = None) -> int:
        return commands.main(build_parser(), run, argv)

What a user then sees:

- a mistake (a bad option, a missing file, an output that cannot be written): one line on stderr,
  ``capo-verl <command>: error: <what is wrong, and what to do>``, and exit status 2 (:data:`USAGE`), with no
  traceback and no usage block. :class:`UsageError`, and the ``ValueError``, ``FileNotFoundError`` and
  ``ImportError`` that the library raises for bad inputs, end this way; so do argparse's own errors.
- a run that started and failed (a child process, a disk that filled up): one line
  ``capo-verl <command>: failed: <what>`` and exit status 1 (:data:`FAILED`). :class:`RunFailed`,
  ``subprocess.CalledProcessError`` and any other ``OSError`` end this way.
- Ctrl-C: ``capo-verl <command>: stopped`` and exit status 130 (:data:`INTERRUPTED`).
- anything else is a bug in capo-verl: its traceback is printed as Python prints it.

Options shared by name (:data:`SHARED_OPTIONS`) have one default and one meaning in every command. A command that
needs another default passes ``why=``, which :func:`add_option` requires and appends to the help, so that the
difference is stated where a user reads it (``tests/test_commands.py`` checks every command's parser for it).
"""

from __future__ import annotations

import argparse
import errno
import math
import os
import re
import shlex
import subprocess
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = [
    "USAGE",
    "FAILED",
    "INTERRUPTED",
    "SHARED_OPTIONS",
    "UsageError",
    "RunFailed",
    "Parser",
    "parser",
    "add_subcommand",
    "add_option",
    "positive_int",
    "positive_float",
    "one_line",
    "error",
    "main",
    "check_out_dir",
    "check_out_file",
    "folder_problem",
]

#: exit status of a user's mistake (argparse's own, too)
USAGE = 2
#: exit status of a run that started and failed
FAILED = 1
#: exit status after Ctrl-C (128 + SIGINT, as a shell reports it)
INTERRUPTED = 130


class UsageError(ValueError):
    """A mistake in a command's arguments or inputs: one line and exit status :data:`USAGE`.

    A ``ValueError`` so that library functions (which raise ``ValueError`` for a bad input) and commands are refused
    the same way.
    """


class RunFailed(RuntimeError):
    """A run that started and failed (e.g. a child process): one line and exit status :data:`FAILED`."""


class Parser(argparse.ArgumentParser):
    """``argparse.ArgumentParser`` whose errors raise :class:`UsageError` (one line, exit 2, no usage block)
    instead of printing the usage and exiting; ``--help`` prints and exits 0 as usual."""

    def error(self, message: str):  # noqa: D102  (argparse's hook)
        exc = UsageError(message)
        exc.prog = self.prog  # a sub-command's parser names the sub-command
        raise exc


def parser(command: str, description: str | None = None, **kwargs) -> Parser:
    """A :class:`Parser` for ``capo-verl <command>`` (``prog`` is ``"capo-verl <command>"``).

    Args:
        command: the words after ``capo-verl``, e.g. ``"smollm2"`` or ``"eval teacher-forced"``.
        description: the ``--help`` text.
        **kwargs: passed on to ``argparse.ArgumentParser`` (``epilog``, ``formatter_class`` ...).
    """
    return Parser(prog=f"capo-verl {command}".strip(), description=description, **kwargs)


def positive_int(text: str) -> int:
    """An argparse type: an integer >= 1."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


def positive_float(text: str) -> float:
    """An argparse type: a finite number > 0."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not (math.isfinite(value) and value > 0):
        raise argparse.ArgumentTypeError(f"must be a finite number > 0, got {text}")
    return value


def add_subcommand(subparsers, name: str, run: Callable[[argparse.Namespace], int | None], **kwargs) -> Parser:
    """A sub-command's parser (``capo-verl eval generate``): ``subparsers.add_parser(name, **kwargs)``, whose
    ``run`` :func:`main` calls (when given ``run=None``) and whose ``prog`` prefixes its errors.

    Args:
        subparsers: what ``parser.add_subparsers()`` returned.
        name: the sub-command.
        run: executes its parsed arguments; returns the exit status (None for 0).
        **kwargs: ``help``, ``description`` ... for ``add_parser``.
    """
    p = subparsers.add_parser(name, **kwargs)
    p.set_defaults(_run=run, _prog=p.prog)
    return p


@dataclass(frozen=True)
class SharedOption:
    """An option that means the same in every command that has it: its default and help."""

    default: Any
    help: str
    type: Callable[[str], Any] | None = None
    metavar: str | None = None


#: options shared by name: ``--name -> SharedOption`` (one default and one meaning everywhere)
SHARED_OPTIONS: dict[str, SharedOption] = {
    "--seed": SharedOption(0, "random seed (default 0)", int),
    "--dtype": SharedOption(
        "auto",
        "weight dtype: auto (on CPU bfloat16 where it has avx512_bf16 or amx_bf16, float32 elsewhere; on GPU the "
        "checkpoint's dtype), float32, bfloat16 or float16 (default auto)",
    ),
    "--device": SharedOption(
        "auto",
        "where the model runs: auto (a CUDA GPU when there is one, else cpu), cpu or cuda (default auto)",
        metavar="{auto,cpu,cuda}",
    ),
    "--threads": SharedOption(
        None, "CPU threads (default: every usable core; as many as the cores at most)", int, metavar="N"
    ),
    "--batch-size": SharedOption(8, "responses per teacher-forced forward pass (default 8)", positive_int, metavar="N"),
    "--temperature": SharedOption(1.0, "sampling temperature, > 0 (default 1.0, the paper's)", positive_float),
    "-k": SharedOption(16, "responses per problem (default 16, the paper's)", positive_int, metavar="K"),
    "--max-new-tokens": SharedOption(
        3046, "the longest response, in tokens (default 3046, the paper's max response length)", positive_int
    ),
    "--overwrite": SharedOption(False, "replace the outputs of an earlier run instead of refusing or resuming"),
}


def add_option(
    target: argparse.ArgumentParser | argparse._ArgumentGroup,
    name: str,
    *aliases: str,
    default: Any = None,
    why: str | None = None,
    help: str | None = None,
    **kwargs,
) -> argparse.Action:
    """Add the shared option ``name`` (:data:`SHARED_OPTIONS`) to a parser or argument group.

    Args:
        target: the parser, or one of its argument groups.
        name: a key of :data:`SHARED_OPTIONS`, e.g. ``"--dtype"``.
        aliases: more spellings of it (``"--k"`` beside ``"-k"``).
        default: this command's default; leave it out for the shared one.
        why: required when ``default`` differs from the shared default: one phrase saying why, appended to the help.
        help: this command's help text instead of the shared one (same meaning, said for this command).
        **kwargs: more ``add_argument`` arguments (``choices``, ``metavar`` ...).

    Returns:
        argparse's action.

    Raises:
        KeyError: ``name`` is not a shared option.
        TypeError: another default without ``why``.
    """
    shared = SHARED_OPTIONS[name]
    if default is None:
        default = shared.default
    elif default != shared.default and not why:
        raise TypeError(f"{name}: default {default!r} differs from the shared {shared.default!r}; say why (why=...)")
    text = help or shared.help
    if why and default != shared.default:
        text = re.sub(r"\s*\(default [^)]*\)$", "", text) + f" (default {default}: {why})"
    if isinstance(shared.default, bool):
        return target.add_argument(name, *aliases, action="store_true", help=text, **kwargs)
    if shared.type is not None:
        kwargs.setdefault("type", shared.type)
    if shared.metavar is not None:
        kwargs.setdefault("metavar", shared.metavar)
    return target.add_argument(name, *aliases, default=default, help=text, **kwargs)


def one_line(text: object) -> str:
    """``text`` on one line: its line breaks and the blanks around them become one space."""
    return re.sub(r"\s*\n\s*", " ", str(text).strip())


def error(prog: str, message: object, *, kind: str = "error") -> None:
    """Print ``<prog>: <kind>: <message>`` to stderr, on one line (:func:`one_line`)."""
    print(f"{prog}: {kind}: {one_line(message)}", file=sys.stderr, flush=True)


def _describe(exc: BaseException) -> str:
    if isinstance(exc, subprocess.CalledProcessError):
        cmd = exc.cmd if isinstance(exc.cmd, str) else shlex.join(map(str, exc.cmd))
        return f"`{cmd}` exited with status {exc.returncode}"
    if isinstance(exc, OSError) and exc.strerror and exc.filename:
        return f"{exc.filename}: {exc.strerror}"
    return str(exc) or type(exc).__name__


def main(
    parser: argparse.ArgumentParser,
    run: Callable[[argparse.Namespace], int | None] | None,
    argv: list[str] | None = None,
    *,
    intermixed: bool = False,
) -> int:
    """Parse ``argv`` with ``parser``, call ``run(args)`` and turn what it raises into one line and an exit status.

    Sets up capo-verl's console logging first (:func:`capo_verl.logs.install`: ``LEVEL capo_verl...: message`` on
    stderr, printed once however verl or vLLM configured the root logger).

    Args:
        parser: the command's parser (:func:`parser`); its ``prog`` prefixes every error line.
        run: executes the parsed arguments; returns the exit status (None for 0). None: the sub-command's, as
            :func:`add_subcommand` recorded it; its ``prog`` then prefixes the errors.
        argv: the arguments after the command's name (default ``sys.argv[1:]``).
        intermixed: parse with ``parse_intermixed_args`` (options between positional arguments).

    Returns:
        ``run``'s status; :data:`USAGE` (2) after a user's mistake, :data:`FAILED` (1) after a failed run,
        :data:`INTERRUPTED` (130) after Ctrl-C; 0 after ``--help``.
    """
    from capo_verl import logs

    logs.install()
    prog = parser.prog
    argv = sys.argv[1:] if argv is None else list(argv)
    try:
        args, extra = parser.parse_known_intermixed_args(argv) if intermixed else parser.parse_known_args(argv)
        prog = getattr(args, "_prog", prog)  # a sub-command's
        if extra:
            raise UsageError(f"unrecognized arguments: {' '.join(extra)}")
        return int((run or args._run)(args) or 0)
    except SystemExit as exc:  # --help, --version; or a parser that is not a Parser
        return exc.code if isinstance(exc.code, int) else (0 if exc.code is None else USAGE)
    except (ValueError, FileNotFoundError, ImportError) as exc:
        error(getattr(exc, "prog", prog), _describe(exc))
        return USAGE
    except (RunFailed, subprocess.CalledProcessError, OSError) as exc:
        error(prog, _describe(exc), kind="failed")
        return FAILED
    except KeyboardInterrupt:
        print(f"{prog}: stopped", file=sys.stderr, flush=True)
        return INTERRUPTED


# ---------------------------------------------------------------------------------------- outputs, checked first


def folder_problem(path: str | os.PathLike) -> str | None:
    """Why this process cannot write files in the folder ``path``, or None when it can.

    The folder and its missing parents are made, a file is written in it and removed, and the folders made here are
    removed again (deepest first, only while empty): nothing is left behind.

    Args:
        path: a local folder (``~`` expanded; relative to the current folder).

    Returns:
        None, or the reason as a predicate that reads after the path (``--out PATH is a file, not a folder``,
        ``key=PATH: cannot be created or written (Permission denied)``): ``is a file, not a folder``, ``lies under
        <file>, which is a file``, ``runs into a symlink loop (...)``, or ``cannot be created or written (<the
        operating system's error>)``.
    """
    try:
        os.stat(os.path.expanduser(str(path)))
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            return "runs into a symlink loop (a link that points back to itself)"
    folder = Path(os.path.realpath(os.path.expanduser(str(path))))  # `..` and symlinks followed, as mkdir does
    missing: list[Path] = []
    probe = folder
    while not probe.exists() and probe.parent != probe:
        missing.append(probe)
        probe = probe.parent
    if not probe.is_dir():
        return "is a file, not a folder" if probe == folder else f"lies under {probe}, which is a file"
    try:
        folder.mkdir(parents=True, exist_ok=True)
        fd, name = tempfile.mkstemp(prefix=".capo-verl-probe-", dir=folder)
        os.close(fd)
        os.unlink(name)
    except OSError as exc:
        return f"cannot be created or written ({exc.strerror or exc})"
    finally:
        for created in missing:  # deepest first
            try:
                created.rmdir()
            except OSError:
                break
    return None


def check_out_dir(path: str | os.PathLike, option: str = "--out") -> Path:
    """Check, before any expensive work, that folder ``path`` exists or can be created and that files can be written
    in it; leaves nothing behind (the folders it had to create for the probe are removed again).

    Args:
        path: the folder (``~`` is expanded).
        option: the option's name, for the message.

    Returns:
        ``Path(path)``, ``~`` expanded.

    Raises:
        UsageError: an empty ``path``; ``path`` or a folder above it is a file; the folder cannot be created or
            written (the message names the option and the reason).
    """
    if str(path) == "":
        raise UsageError(f"{option} is empty; name a folder")
    folder = Path(os.path.expanduser(str(path)))
    problem = folder_problem(folder)
    if problem:
        raise UsageError(f"{option} {path} {problem}")
    return folder


def check_out_file(
    path: str | os.PathLike, option: str = "--out", *, suffix: str | None = None, overwrite: bool = True
) -> Path:
    """Check, before any expensive work, that file ``path`` can be written: its folder as :func:`check_out_dir`,
    ``path`` not a folder, the right suffix, and (``overwrite=False``) not there yet. Leaves nothing behind.

    Args:
        path: the file (``~`` is expanded).
        option: the option's name, for the message.
        suffix: the suffix it must have (``".json"``), or None.
        overwrite: whether an existing file may be replaced.

    Returns:
        ``Path(path)``, ``~`` expanded.

    Raises:
        UsageError: an empty ``path``; its folder as :func:`check_out_dir`; ``path`` is a folder, has another suffix,
            or exists while ``overwrite`` is false.
    """
    if str(path) == "":
        raise UsageError(f"{option} is empty; name a file")
    file = Path(os.path.expanduser(str(path)))
    if suffix is not None and file.suffix != suffix:
        raise UsageError(f"{option} {path}: expected a {suffix} file name")
    if file.is_dir():
        raise UsageError(f"{option} {path} is a folder; name a file")
    problem = folder_problem(file.parent)
    if problem:
        raise UsageError(f"{option} {path}: its folder {file.parent} {problem}")
    if file.exists() and not overwrite:
        raise UsageError(f"{option} {path} exists; remove it, pass --overwrite or choose another {option}")
    return file
