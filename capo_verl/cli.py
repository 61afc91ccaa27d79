"""``capo-verl``: one entry point, one sub-command per stage, each built with :mod:`capo_verl.commands`."""

from __future__ import annotations

import atexit
import importlib
import os
import sys

from capo_verl import commands

# sub-command -> ("module", "function taking argv: list[str] and returning an exit code", help)
COMMANDS = {
    "prepare-data": ("capo_verl.data", "main", "write verl parquet for training and the six benchmarks"),
    "eval": (
        "capo_verl.evaluation.cli",
        "main",
        "generate: k samples per problem; score: their calibration; teacher-forced: a fixed pool scored by each "
        "checkpoint",
    ),
    "compare": (
        "capo_verl.compare.cli",
        "main",
        "train methods under identical settings, compare calibration (plots, CIs)",
    ),
    "mask-thresholds": (
        "capo_verl.mask_thresholds",
        "main",
        "CAPO's ref_high / ref_low from the reference model's perplexity quartiles (paper section 4)",
    ),
    "smollm2": ("capo_verl.cpu.models", "main", "convert the offline SmolLM2-135M-Instruct GGUF to an HF checkpoint"),
    "demo": ("capo_verl.demo", "main", "run the capo estimator on a real verl DataProto and print it"),
}


def usage() -> str:
    """The ``capo-verl --help`` text: the usage line and one line per command, its help after two spaces at least."""
    width = max(map(len, COMMANDS)) + 2
    lines = ["usage: capo-verl COMMAND [ARGS...]", "", "commands:"]
    lines += [f"  {name:<{width}}{help_}" for name, (_, _, help_) in COMMANDS.items()]
    lines += ["", "capo-verl COMMAND --help describes a command's options."]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """Run ``capo-verl COMMAND ARGS...``; returns the command's exit status.

    No command prints the usage to stderr (status 2); ``-h``/``--help`` prints it to stdout (status 0); an unknown
    command is named in one line ``capo-verl: error: ...`` (status 2).
    """
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] in ("-h", "--help"):
        print(usage())
        return 0
    if not argv:
        print(usage(), file=sys.stderr)
        return commands.USAGE
    if argv[0] not in COMMANDS:
        commands.error(
            "capo-verl", f"unknown command {argv[0]!r}; choose from {', '.join(COMMANDS)} (capo-verl --help)"
        )
        return commands.USAGE
    module, func, _ = COMMANDS[argv[0]]
    return int(getattr(importlib.import_module(module), func)(argv[1:]) or 0)


def run() -> None:
    """The ``capo-verl`` console script (pyproject.toml) and ``python -m capo_verl.cli``: :func:`main`, then the exit.

    A process that loaded Triton (vLLM imports it through xgrammar, also on a CPU) exits without the interpreter's
    teardown of its modules, after every ``atexit`` handler ran and the output was flushed: in that teardown,
    Triton's nanobind extension printed about 30 lines of "leaked instances / types / functions" for objects Triton
    keeps in module globals, harmless with the process ending. Any other process exits as usual. An exception
    raised by the command propagates as usual (its traceback printed).
    """
    status = main()
    if "triton._C.libtriton" in sys.modules:
        atexit._run_exitfuncs()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(status)
    sys.exit(status)


if __name__ == "__main__":
    run()
