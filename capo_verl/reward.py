"""Math-verify reward for verl: ``compute_score`` with verl's custom-reward signature.

Wired in by every config of this project (``configs/base.yaml``)::

    reward.custom_reward_function.path=pkg://capo_verl.reward
    reward.custom_reward_function.name=compute_score

verl's reward-loop workers call it as ``compute_score(data_source=, solution_str=, ground_truth=,
extra_info=)`` from a thread of an asyncio executor (``verl/experimental/reward_loop/reward_manager/
naive.py``); the returned dict's ``"score"`` is the reward and every key is logged per validation data
source (``val-core/<data_source>/acc/mean@16`` ...).

Grading, per response:

1. The answer is the content of the **last** ``\\boxed{...}`` (or ``\\fbox{...}``, ``\\boxed 5``) in the
   response, braces matched. Without a box: the last GSM8K-style ``#### X`` line, else the last
   "final answer is X" / "answer: X" statement, else math-verify's own extraction from the end of the
   text (its last expression). Extraction is plain string code, linear in the length of the response.
2. Gold and answer are normalised the same way: surrounding ``$``, ``\\%``/``%`` (so ``25\\%`` equals
   ``25``), degree signs, ``\\$``, a ``\\text{...}`` around the whole answer and ``{,}`` / ``1,234``
   thousands separators go.
3. **A plain-number gold needs a plain-number answer.** When the gold is a plain number (an integer or decimal,
   with or without a sign, ``$`` or thousands separators: ``17``, ``-3``, ``1,000``, ``18.90``), the answer must
   be one too, up to a variable and ``=`` before it (``x = 17``) and units after it (``17 apples``,
   ``17 \\text{ dollars}``). An expression that evaluates to the gold (``12 + 5`` for 17, ``18 \\times 4`` for 72,
   ``\\frac{34}{2}``) scores 0: a GSM8K-style question contains exactly such an expression, and a grader that
   evaluates it pays a policy for copying the question instead of solving it (docs/evaluation.md, "The reward").
   Golds of any other form are graded as below, whatever the answer's form.
4. Matrices (``\\begin{pmatrix}..\\end{pmatrix}``, ``bmatrix``) are compared entry by entry, each entry by the
   rules here, when both sides are one: math-verify parses neither ``-1/3`` nor a spaced ``-2 \\\\ -14`` inside
   them (7 of MATH-500's golds are matrices).
5. Correct if the normalised strings are equal, or math-verify (``parse`` + ``verify``) says the two are
   mathematically equal: ``\\frac12`` = ``0.5``, ``1,000`` = ``1000``, tuples, intervals, sets, ``x=3`` vs
   ``3``, algebraically equal expressions.

Time bound: math-verify's own timeouts use ``signal.alarm``, which only works in a process's main thread
and so not in verl's reward threads. Here math-verify runs with its timeouts off (``parsing_timeout=None``,
``timeout_seconds=None``) in separate worker processes (``capo_verl/_reward_worker.py`` children speaking JSON
lines over pipes; no ``multiprocessing``, so nothing depends on the Ray worker's ``__main__``). A call waits at most
``timeout_s`` seconds (default :data:`DEFAULT_TIMEOUT_S`) for its verdict; a worker that misses the deadline
(e.g. sympy expanding ``9^{9^{9^9}}``) or dies is killed and replaced, the response scores 0.0 and a warning
is logged. Workers are started lazily, reused across calls, and capped at ``CAPO_REWARD_PROCS``
(default ``min(4, cpu_count)``) per process; a new worker needs about 0.5 s to import math-verify, which is
not counted in ``timeout_s`` (bounded separately by :data:`STARTUP_TIMEOUT_S`). Answers longer than
:data:`MAX_ANSWER_CHARS` are compared as strings only.
"""

from __future__ import annotations

import atexit
import json
import logging
import math
import numbers
import os
import re
import select
import subprocess
import sys
import threading
import time
from collections.abc import Mapping
from typing import Any

logger = logging.getLogger("capo_verl.reward")

__all__ = [
    "DEFAULT_TIMEOUT_S",
    "PROCS_ENV",
    "check_timeout",
    "compute_score",
    "extract_answer",
    "grade",
    "is_plain_number",
    "plain_number_answer",
    "last_boxed",
    "matrix_entries",
    "normalize_answer",
    "reward_procs",
]

#: Seconds one call may wait for math-verify's verdict (parse + verify) before the response scores 0.0.
DEFAULT_TIMEOUT_S = 10.0
#: Seconds a new worker process may take to start and import math-verify.
STARTUP_TIMEOUT_S = 120.0
#: Answers and gold strings longer than this are graded by string equality only (math-verify is not run).
MAX_ANSWER_CHARS = 1000
#: Without a box, math-verify looks at this many characters at the end of the response.
FREE_TEXT_TAIL_CHARS = 2000


# --------------------------------------------------------------------------------------------------------
# 1. answer extraction (string code only; linear time)
# --------------------------------------------------------------------------------------------------------
_GSM8K_RE = re.compile(r"^[ \t]*####([^\n]*)$", re.MULTILINE)
_ANCHOR_RE = re.compile(r"(?:final answer|the answer|answer)\s*(?:is|:)\s*", re.IGNORECASE)


def last_boxed(text: str) -> str | None:
    """Content of the last ``\\boxed{...}``/``\\fbox{...}`` (braces matched) or ``\\boxed X``; None if none.

    One pass over the text matches every brace, so this is O(len(text)) whatever the input. A box left
    unclosed at the end of a truncated response is skipped in favour of the last closed one.
    """
    starts = [m for m in re.finditer(r"\\(?:boxed|fbox)(?![A-Za-z])", text)]
    if not starts:
        return None
    close_of: dict[int, int] = {}
    stack: list[int] = []
    for i, ch in enumerate(text):
        if ch == "{":
            stack.append(i)
        elif ch == "}" and stack:
            close_of[stack.pop()] = i
    for m in reversed(starts):
        i = m.end()
        if text.startswith("{", i):
            j = close_of.get(i)
            if j is not None:
                return text[i + 1 : j].strip()
        else:  # "\boxed 5": the token after the spaces
            sp = re.match(r" +([^\s$]+)", text[i : i + 200])
            if sp:
                return sp.group(1).rstrip(".")
    return None


def extract_answer(solution_str: str) -> tuple[str | None, str]:
    """Find the final answer of a response.

    Args:
        solution_str: the decoded response (any length).

    Returns:
        ``(answer, how)``: ``how`` is ``"boxed"``, ``"gsm8k"`` (``#### X``), ``"anchor"`` ("final answer is
        X" / "answer: X", up to the end of that line, trailing period dropped) or ``"free"`` (no marker:
        ``answer`` is None and math-verify extracts the last expression from the end of the text).
    """
    boxed = last_boxed(solution_str)
    if boxed is not None:
        return boxed, "boxed"
    matches = [m.strip() for m in _GSM8K_RE.findall(solution_str)]
    matches = [m for m in matches if m]
    if matches:
        return matches[-1], "gsm8k"
    last = None
    for last in _ANCHOR_RE.finditer(solution_str):  # noqa: B007  (the last match is the one wanted)
        pass
    if last is not None:
        line = solution_str[last.end() :].split("\n", 1)[0].strip()
        line = line.rstrip(".").strip()
        if line:
            return line, "anchor"
    return None, "free"


# --------------------------------------------------------------------------------------------------------
# 2. normalisation (the same for gold and answer)
# --------------------------------------------------------------------------------------------------------
_TEXT_WRAP_RE = re.compile(r"^\\(?:text|textbf|mathrm|mbox)\{([^{}]*)\}$")
_THOUSANDS_BRACED_RE = re.compile(r"(\d)\{,\}(?=\d{3})")
_THOUSANDS_RE = re.compile(r"^[+-]?\d{1,3}(?:,\d{3})+(?:\.\d+)?$")
_DEGREE_RE = re.compile(r"\^\s*\{?\\circ\}?|°")


def normalize_answer(answer: str) -> str:
    """Light, grader-independent clean-up of an answer string (gold or predicted).

    Removes surrounding ``$``/``\\(\\)``, ``\\%``, ``%``, ``\\$``, degree marks, ``\\left``/``\\right``,
    ``\\dfrac``/``\\tfrac`` -> ``\\frac``, a ``\\text{..}``-style wrapper around the whole answer (keeping its
    content; units inside an answer are left to math-verify), ``{,}`` and plain ``1,234,567`` thousands
    separators, a trailing period, and collapses whitespace. Never raises.
    """
    s = str(answer).strip()
    for left, right in (("$", "$"), ("\\(", "\\)"), ("\\[", "\\]")):
        while s.startswith(left) and s.endswith(right) and len(s) >= len(left) + len(right):
            s = s[len(left) : len(s) - len(right)].strip()
    s = s.replace("\\!", "").replace("\\,", "").replace("\\;", "").replace("\\ ", " ")
    s = s.replace("\\%", "").replace("%", "").replace("\\$", "")
    s = _DEGREE_RE.sub("", s)
    s = s.replace("\\left", "").replace("\\right", "")
    s = s.replace("\\dfrac", "\\frac").replace("\\tfrac", "\\frac")
    s = _TEXT_WRAP_RE.sub(r"\1", s)
    s = _THOUSANDS_BRACED_RE.sub(r"\1", s)
    s = re.sub(r"\s+", " ", s).strip().rstrip(".").strip()
    if _THOUSANDS_RE.match(s):
        s = s.replace(",", "")
    return s


# --------------------------------------------------------------------------------------------------------
# 3. plain-number golds need plain-number answers
# --------------------------------------------------------------------------------------------------------
_PLAIN_NUMBER_RE = re.compile(r"^[+-]?(?:\d+(?:\.\d*)?|\.\d+)$")
_UNIT_WRAP_RE = re.compile(r"\\(?:text|textbf|textrm|mathrm|mbox|operatorname)\s*\{[^{}]*\}")
_ASSIGNMENT_RE = re.compile(r"^[A-Za-z][A-Za-z0-9_]*\s*=\s*")
#: units after a number: a word of two letters or more (not ``pi``); a single letter (``5n``, ``17e``, ``2 i``) is
#: algebra, not a unit
_TRAILING_WORDS_RE = re.compile(r"(?<=[\d.])\s*(?!pi\b)[A-Za-z]{2,}[A-Za-z .]*$")


_MATRIX_RE = re.compile(r"^\\begin\{([pb]matrix)\}(.*)\\end\{\1\}$", re.DOTALL)


def matrix_entries(normalized: str) -> list[list[str]] | None:
    """Rows of entries of a ``\\begin{pmatrix}..\\end{pmatrix}`` (or ``bmatrix``) answer; None if it is not one.
    Rows end at ``\\\\`` or at ``\\`` + space (:func:`normalize_answer` turns ``\\\\ `` into ``\\ ``)."""
    m = _MATRIX_RE.match(normalized.strip())
    if m is None:
        return None
    return [[e.strip() for e in row.split("&")] for row in re.split(r"\\\\|\\ ", m.group(2)) if row.strip()]


def is_plain_number(normalized: str) -> bool:
    """Is a normalised answer (:func:`normalize_answer`) a plain number: an integer or decimal with an optional sign
    and an optional leading ``$`` (``17``, ``-3``, ``18.90``, ``.5``, ``$17``)? Thousands separators are already gone
    after :func:`normalize_answer`. Expressions (``12 + 5``), fractions, radicals, sets and words are not."""
    s = normalized.strip()
    if s.startswith("$"):
        s = s[1:].strip()
    return bool(_PLAIN_NUMBER_RE.match(s))


def plain_number_answer(normalized: str) -> str | None:
    """The plain number a normalised answer states, or None if it states anything else.

    Accepted around the number: a variable and ``=`` before it (``x = 17``), units after it in ``\\text{..}`` (or
    ``\\mathrm``, ``\\mbox``) or as plain words (``17 apples``), a leading ``$``. Rejected: any arithmetic (``12 + 5``,
    ``18 \\times 4``, ``\\frac{34}{2}``, ``2^3``), two numbers, no number. Used for golds that are plain numbers
    (:func:`grade`)."""
    s = _UNIT_WRAP_RE.sub(" ", normalized).strip()
    s = _ASSIGNMENT_RE.sub("", s)
    s = _TRAILING_WORDS_RE.sub("", s).strip()
    s = s.replace(",", "") if re.fullmatch(r"[+-]?\$?\d{1,3}(?:,\d{3})+(?:\.\d+)?", s) else s
    if not is_plain_number(s):
        return None
    return s[1:].strip() if s.startswith("$") else s


# --------------------------------------------------------------------------------------------------------
# 4. math-verify in worker processes
# --------------------------------------------------------------------------------------------------------
# The child runs capo_verl/_reward_worker.py by path: it does not import capo_verl, whose ``__init__`` imports verl and
# torch (a worker needs only math-verify, ~0.5 s to start and ~100 MB). Protocol (JSON lines over its stdin and
# stdout): in the worker's docstring.
_WORKER_SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_reward_worker.py")


class _Worker:
    """One child process running :data:`_WORKER_SCRIPT` (``capo_verl/_reward_worker.py``)."""

    def __init__(self):
        self.proc = subprocess.Popen(
            [sys.executable, _WORKER_SCRIPT],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=None,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )
        self._buf = b""
        ready = self.read_line(time.monotonic() + STARTUP_TIMEOUT_S)
        if ready is None or not ready.get("ready"):
            self.kill()
            raise RuntimeError(
                f"capo_verl.reward: the math-verify worker ({sys.executable} {_WORKER_SCRIPT}) "
                f"did not start within {STARTUP_TIMEOUT_S:.0f} s; check that math-verify imports in this Python "
                "(pip install 'math-verify[antlr4_9_3]'; the worker's stderr is above)"
            )

    def read_line(self, deadline: float) -> dict | None:
        """Next JSON line from the child, or None at the deadline or when the child exits."""
        fd = self.proc.stdout.fileno()
        while b"\n" not in self._buf:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return None
            readable, _, _ = select.select([fd], [], [], remaining)
            if not readable:
                return None
            chunk = os.read(fd, 65536)
            if not chunk:  # child exited
                return None
            self._buf += chunk
        line, self._buf = self._buf.split(b"\n", 1)
        return json.loads(line)

    def ask(self, gold: str, pred: str, timeout_s: float) -> dict | None:
        """Send one request; the reply, or None if the child missed the deadline or died."""
        try:
            self.proc.stdin.write((json.dumps({"gold": gold, "pred": pred}) + "\n").encode())
            self.proc.stdin.flush()
        except (BrokenPipeError, OSError):
            return None
        return self.read_line(time.monotonic() + timeout_s)

    def kill(self) -> None:
        try:
            self.proc.kill()
        except OSError:
            pass
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:  # pragma: no cover
            pass


class _Pool:
    """Thread-safe pool of :class:`_Worker` processes (at most ``size`` alive)."""

    def __init__(self, size: int):
        self.size = size
        self._idle: list[_Worker] = []
        self._lock = threading.Lock()
        self._slots = threading.BoundedSemaphore(size)
        self._pid = os.getpid()

    def grade(self, gold: str, pred: str, timeout_s: float) -> dict | None:
        self._slots.acquire()
        try:
            with self._lock:
                worker = self._idle.pop() if self._idle else None
            if worker is None:
                worker = _Worker()
            reply = worker.ask(gold, pred, timeout_s)
            if reply is None:
                worker.kill()  # hung or dead: never reused
            else:
                with self._lock:
                    self._idle.append(worker)
            return reply
        finally:
            self._slots.release()

    def close(self) -> None:
        with self._lock:
            idle, self._idle = self._idle, []
        for worker in idle:
            worker.kill()


_pool: _Pool | None = None
_pool_lock = threading.Lock()
_n_timeouts = 0


#: Environment variable: the most math-verify worker processes per process that scores.
PROCS_ENV = "CAPO_REWARD_PROCS"


def reward_procs(environ: Mapping[str, str] | None = None) -> int:
    """The math-verify pool size: :data:`PROCS_ENV` (``CAPO_REWARD_PROCS``), or ``min(4, cpu_count)`` when unset
    or empty. The pool reads it at the first call that needs math-verify; verl's ``validate_config`` (through
    :func:`capo_verl.compat.methods.check_method_configs`) reads it before the run starts.

    Args:
        environ: the environment to read (default ``os.environ``).

    Raises:
        ValueError: the value is not an integer >= 1; the message names the variable, the value and the range.
    """
    raw = (os.environ if environ is None else environ).get(PROCS_ENV, "")
    if not raw.strip():
        return min(4, os.cpu_count() or 1)
    try:
        size = int(raw)
    except ValueError:
        size = 0
    if size < 1:
        raise ValueError(
            f"{PROCS_ENV}={raw!r}: must be an integer >= 1 (math-verify worker processes per scoring process); "
            f"unset it for min(4, cpu_count)"
        )
    return size


def _get_pool() -> _Pool:
    global _pool
    with _pool_lock:
        if _pool is None or _pool._pid != os.getpid():  # a forked child must not share its parent's pipes
            _pool = _Pool(reward_procs())
        return _pool


@atexit.register
def _close_pool() -> None:
    if _pool is not None and _pool._pid == os.getpid():
        _pool.close()


def check_timeout(timeout_s: Any) -> None:
    """Refuse a ``timeout_s`` that would score every answer needing math-verify 0.0 (or never time out).

    Called by :func:`compute_score` and :func:`grade` on every call, and by verl's ``validate_config`` (through
    :func:`capo_verl.compat.methods.check_method_configs`) on ``reward.custom_reward_function.reward_kwargs.timeout_s``
    before the run starts.

    Raises:
        ValueError: ``timeout_s`` is not a finite real number > 0 (a bool, a string, 0, -1, inf, nan).
    """
    if isinstance(timeout_s, bool) or not isinstance(timeout_s, numbers.Real) or not 0 < timeout_s < math.inf:
        raise ValueError(
            f"reward.custom_reward_function.reward_kwargs.timeout_s={timeout_s!r}: must be a finite number of "
            f"seconds > 0 (0 or less would score every answer that needs math-verify 0.0); e.g. "
            f"+reward.custom_reward_function.reward_kwargs.timeout_s={DEFAULT_TIMEOUT_S:g} (the default)"
        )


def grade(gold: str, answer: str | None, solution_str: str, timeout_s: float = DEFAULT_TIMEOUT_S) -> tuple[bool, str]:
    """Is ``answer`` (or, when None, the end of ``solution_str``) mathematically equal to ``gold``?

    Args:
        gold: the reference answer (normalised here).
        answer: the extracted final answer, or None to let math-verify extract from ``solution_str``.
        solution_str: the whole response (used only when ``answer`` is None).
        timeout_s: the most seconds to wait for math-verify.

    Returns:
        ``(correct, shown)``: ``shown`` is the answer as graded (for logs: ``pred``).

    Raises:
        ValueError: ``timeout_s`` is not a finite number > 0.
        RuntimeError: a math-verify worker process does not start (math-verify is not importable).
    """
    global _n_timeouts
    check_timeout(timeout_s)
    gold_n = normalize_answer(gold)
    numeric_gold = is_plain_number(gold_n)
    if numeric_gold:
        gold_n = gold_n.lstrip("$").strip()
    if answer is not None:
        answer_n = normalize_answer(answer)
        if numeric_gold:  # module docstring, point 3: an expression that evaluates to the gold scores 0
            number = plain_number_answer(answer_n)
            if number is None:
                return False, answer_n
            answer_n = number
        if answer_n == gold_n:
            return True, answer_n
        gold_m, answer_m = matrix_entries(gold_n), matrix_entries(answer_n)
        if gold_m is not None and answer_m is not None:  # module docstring, point 4
            same_shape = [len(r) for r in gold_m] == [len(r) for r in answer_m]
            return same_shape and all(
                grade(g, a, "", timeout_s)[0] for gr, ar in zip(gold_m, answer_m) for g, a in zip(gr, ar)
            ), answer_n
        if len(answer_n) > MAX_ANSWER_CHARS or len(gold_n) > MAX_ANSWER_CHARS:
            return False, answer_n[:MAX_ANSWER_CHARS]
        pred_text = "\\boxed{" + answer_n + "}"
    else:
        answer_n = ""
        pred_text = solution_str[-FREE_TEXT_TAIL_CHARS:]
    reply = _get_pool().grade("\\boxed{" + gold_n + "}", pred_text, timeout_s)
    if reply is None:
        with _pool_lock:
            _n_timeouts += 1
            count = _n_timeouts
        logger.warning(
            "capo_verl.reward: math-verify gave no verdict within %.1f s (worker hung or died, killed; %d so far "
            "in this process); scoring 0.0 for answer %.200r against gold %.200r",
            timeout_s,
            count,
            answer_n or pred_text[-200:],
            gold_n,
        )
        return False, answer_n
    if not reply["ok"]:
        logger.warning("capo_verl.reward: math-verify failed (%s); scoring 0.0", reply["error"])
        return False, answer_n
    shown = answer_n or reply["pred"]
    if answer is None and numeric_gold:  # the expression math-verify took from the end of the text (point 3)
        stated = reply["pred"].rsplit("=", 1)[-1]  # "3 * 4 = 12" states 12
        if plain_number_answer(normalize_answer(stated)) is None:
            return False, shown
    return bool(reply["correct"]), shown


def compute_score(
    data_source: str,
    solution_str: str,
    ground_truth: Any,
    extra_info: Mapping | None = None,
    timeout_s: float = DEFAULT_TIMEOUT_S,
    **kwargs,
) -> dict[str, Any]:
    """verl custom reward: 1.0 if the response's final answer equals ``ground_truth``, else 0.0.

    Args:
        data_source: the row's ``data_source`` (any; all sources are graded the same way).
        solution_str: the decoded response text.
        ground_truth: ``reward_model.ground_truth`` of the row: a string (or an int/float, e.g. AMC's 27.0).
        extra_info: the row's ``extra_info`` (unused).
        timeout_s: the most seconds to wait for math-verify, a finite number > 0 (set it with
            ``reward.custom_reward_function.reward_kwargs.timeout_s``; verl passes ``reward_kwargs`` as
            keyword arguments).
        **kwargs: anything else verl passes (ignored).

    Returns:
        ``{"score": float, "acc": float, "pred": str}``: score and acc are 1.0 or 0.0; ``pred`` is the graded
        answer ("" if none was found). Always these three keys, so verl's per-sample lists stay aligned.

    Raises:
        ValueError: ``ground_truth`` is None, an empty string, NaN or the string ``"nan"`` (a data error: a
            missing value in the data file's ``reward_model.ground_truth``; the message names ``data_source``),
            or ``timeout_s`` is not a finite number > 0 (checked on every call, also when no math-verify runs).
        TypeError: ``ground_truth`` is not a string or a number (e.g. a list: prepare the data with
            ``capo-verl prepare-data``, which writes one string per problem).
        RuntimeError: a math-verify worker process does not start (math-verify is not importable).
    """
    check_timeout(timeout_s)
    if ground_truth is None:
        raise ValueError(
            f"capo_verl.reward.compute_score: reward_model.ground_truth is missing (None) for "
            f"data_source={data_source!r}; every row needs its gold answer: check the ground_truth values of that "
            "data source in the data file (capo-verl prepare-data writes one string per row)"
        )
    if isinstance(ground_truth, str) and not ground_truth.strip():
        raise ValueError(
            f"capo_verl.reward.compute_score: empty reward_model.ground_truth for data_source={data_source!r}; "
            "every row needs its gold answer (see capo-verl prepare-data)"
        )
    if isinstance(ground_truth, str) and ground_truth.strip().lower() == "nan":
        raise ValueError(
            f"capo_verl.reward.compute_score: reward_model.ground_truth is the string {ground_truth!r} for "
            f"data_source={data_source!r}: a missing value written as text (e.g. pandas astype(str) of a NaN); check "
            "the ground_truth column of the data file"
        )
    if isinstance(ground_truth, bool) or not isinstance(ground_truth, (str, numbers.Real)):
        raise TypeError(
            f"capo_verl.reward.compute_score: reward_model.ground_truth must be a string (or a number), got "
            f"{type(ground_truth).__name__} {ground_truth!r} for data_source={data_source!r}; write one string "
            "per problem (capo-verl prepare-data joins multi-part answers with ', ')"
        )
    if isinstance(ground_truth, numbers.Real):  # numpy scalars included
        if math.isnan(ground_truth):
            raise ValueError(
                f"capo_verl.reward.compute_score: reward_model.ground_truth is NaN for data_source={data_source!r}: "
                "a missing value in a numeric ground_truth column of the parquet file; check that column (every "
                "row needs its gold answer; capo-verl prepare-data writes strings)"
            )
        as_float = float(ground_truth)
        if isinstance(ground_truth, numbers.Integral) or (math.isfinite(as_float) and as_float.is_integer()):
            ground_truth = int(ground_truth)
    answer, _how = extract_answer(solution_str or "")
    correct, shown = grade(str(ground_truth), answer, solution_str or "", timeout_s=timeout_s)
    value = 1.0 if correct else 0.0
    return {"score": value, "acc": value, "pred": shown}
