"""``capo-verl`` command line: one entry point, one sub-command per stage."""

from __future__ import annotations

import importlib
import sys

# sub-command -> ("module", "function taking argv: list[str] and returning an exit code", help)
COMMANDS = {
    "prepare-data": ("capo_verl.data", "main", "write verl parquet for training and the six benchmarks"),
    "eval": ("capo_verl.evaluation.cli", "main", "generate k samples per problem, then score calibration"),
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
    "smollm2": ("capo_verl.models", "main", "convert the offline SmolLM2-135M-Instruct GGUF to an HF checkpoint"),
    "demo": ("capo_verl.demo", "main", "run the capo estimator on a real verl DataProto and print it"),
}


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help") or argv[0] not in COMMANDS:
        lines = ["usage: capo-verl COMMAND [ARGS...]", "", "commands:"]
        lines += [f"  {name:<14}{help_}" for name, (_, _, help_) in COMMANDS.items()]
        print("\n".join(lines), file=sys.stderr if argv and argv[0] not in ("-h", "--help") else sys.stdout)
        return 0 if argv and argv[0] in ("-h", "--help") else 2
    module, func, _ = COMMANDS[argv[0]]
    return int(getattr(importlib.import_module(module), func)(argv[1:]) or 0)


if __name__ == "__main__":
    sys.exit(main())
