"""The math-verify worker of :mod:`capo_verl.reward`: run as a script by path (``python .../_reward_worker.py``).

It must not import ``capo_verl``, whose ``__init__`` imports verl and torch: a worker needs only math-verify (~0.5 s to
start and ~100 MB). So it is a plain script in the package's directory, and it takes that directory off ``sys.path``
before importing anything else, so that no module of the package (``data``, ``metrics``, ...) can shadow a top-level
name that math-verify's dependencies import.

Protocol: once started, one line ``{"ready": true}``; then one JSON line per request on stdin, ``{"gold", "pred"}``,
and one line per reply on the original stdout, ``{"ok": true, "correct", "pred"}`` or ``{"ok": false, "error"}``
(the error's type and message, at most 500 characters). Anything else that prints (math-verify's warnings, a library's
output) goes to stderr.
"""

import os
import sys

_HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:] = [p for p in sys.path if os.path.abspath(p or os.curdir) != _HERE]

import json  # noqa: E402  (after the sys.path fix above)
import logging  # noqa: E402


def main() -> None:
    """Answer requests until stdin closes (module docstring)."""
    proto = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    logging.getLogger("math_verify").setLevel(logging.ERROR)
    from math_verify import ExprExtractionConfig, LatexExtractionConfig, parse, verify

    configs = [LatexExtractionConfig(boxed_match_priority=0), ExprExtractionConfig()]
    proto.write(json.dumps({"ready": True}) + "\n")
    for line in sys.stdin:
        req = json.loads(line)
        try:
            gold = parse(req["gold"], extraction_config=configs, parsing_timeout=None)
            pred = parse(req["pred"], extraction_config=configs, parsing_timeout=None)
            correct = bool(gold and pred and verify(gold, pred, timeout_seconds=None))
            out = {"ok": True, "correct": correct, "pred": str(pred[-1]) if pred else ""}
        except Exception as exc:  # noqa: BLE001  any failure of one request is that request's answer, not the worker's end
            out = {"ok": False, "error": f"{type(exc).__name__}: {exc}"[:500]}
        proto.write(json.dumps(out) + "\n")


if __name__ == "__main__":
    main()
