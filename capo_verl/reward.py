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
3. **The answer must be a value, not an operation on numbers** (the same rule for every gold and data source).
   The answer is read past a variable and ``=`` before it (``x = 17``) and units after it (``17 apples``,
   ``17 \\text{ dollars}``). A closed-form
   number (no variable, no word) must be written as a value (:func:`value_verdict`): an integer, a decimal, a fraction
   in lowest terms (``\\frac{3}{4}``, ``\\dfrac``, ``\\tfrac``, ``3/4``), a mixed number (``3\\frac{1}{2}``),
   scientific notation (``4.5 \\times 10^{3}``), with a sign; radicals in simplest form and ``\\pi``
   (``2\\sqrt{3}``, ``\\frac{1+\\sqrt{5}}{2}``, ``\\frac{3\\pi}{4}``), also beside rational numbers. An operation on
   numbers left undone scores 0 whatever the gold's form: a sum, difference, product or quotient of two rational
   numbers (``12 + 5`` for 17, ``18 \\times 4`` for 72, ``34 / 2``), a fraction not in lowest terms
   (``\\frac{34}{2}``), a radical not in simplest form (``\\sqrt{36}``, ``\\sqrt{12}``), a factorial. A GSM8K-style
   question contains exactly such an expression, and a grader that evaluates it pays a policy for copying the question
   instead of solving it (docs/evaluation.md, "The reward"). **Powers:** a power of rational numbers (``2^{10}`` for
   1024, ``10^{3}`` for 1000) is an operation, unless the answer is written as the gold is (a gold ``2^{10}`` pays the
   answer ``2^{10}``; this exception holds for any form): where the problem's authors wrote the power as the answer
   it is the expected final form (a number too long to write out), while for a gold written out as 1024 the power is
   the computation the question asks for, as ``12 + 5`` is. Tuples, intervals, sets and lists: each closed-form
   entry must be a value (``(12 + 5, 3)`` scores 0). Where the gold is a closed-form number, so must the answer be:
   words or a variable in its place score 0 (math-verify would take a number out of a sentence such as ``30. We
   answer "30" truncating ... to 3 digits`` and pay it for the gold 3; ``5n`` is not 5). Without a marker (point 1),
   the expression math-verify takes from the end of the text, after its last ``=``, is graded again as the answer
   (``3 * 4 = 12`` states 12: paid; ``12 = 3*4`` states ``3*4``: 0). Answers with a variable or words for golds that
   are not closed-form numbers, and matrices, are graded as below.
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
from fractions import Fraction
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
    "last_boxed",
    "matrix_entries",
    "normalize_answer",
    "reward_procs",
    "stated_value",
    "value_verdict",
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
# 3. the answer must be a value, not an operation on numbers
# --------------------------------------------------------------------------------------------------------
_PLAIN_NUMBER_RE = re.compile(r"^[+-]?(?:\d+(?:\.\d*)?|\.\d+)$")
#: units in ``\text{..}`` (or ``\mathrm``, ``\mbox`` ...) anywhere, with an optional power after them (``\text{ cm}^2``)
_UNIT_WRAP_RE = re.compile(r"\\(?:text|textbf|textrm|mathrm|mbox|operatorname)\s*\{[^{}]*\}(?:\s*\^\s*\{?\d\}?)?")
_ASSIGNMENT_RE = re.compile(r"^[A-Za-z][A-Za-z0-9_]*\s*=\s*")
#: units after a number: a word of two letters or more (not ``pi``); a single letter (``5n``, ``17e``, ``2 i``) is
#: algebra, not a unit
_TRAILING_WORDS_RE = re.compile(r"(?<=[\d.}])\s*(?!pi\b)[A-Za-z]{2,}[A-Za-z .]*(?:\^\s*\{?\d\}?)?$")
_THOUSANDS_WHOLE_RE = re.compile(r"[+-]?\$?\d{1,3}(?:,\d{3})+(?:\.\d+)?")

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


class _Operation(Exception):
    """Raised by :class:`_ValueParser` at the first operation on numbers left undone."""


class _Malformed(Exception):
    """Raised by :class:`_ValueParser` when the tokens do not form one expression."""


_TOKEN_RE = re.compile(r"\s*(\d+(?:\.\d*)?|\.\d+|\\[A-Za-z]+|[-+*/^(){}\[\]!])")
_COMMANDS = {"\\frac", "\\sqrt", "\\pi", "\\infty", "\\times", "\\cdot", "\\div"}
#: radicands above this are taken to be in simplest form (the square-factor search is trial division)
_MAX_RADICAND = 10**10


class _Val:
    """A parsed closed-form number: its additive terms, ``{"": rational part, key: coefficient of the irrational
    factor named key}`` (``3 + 2\\sqrt{2}`` is ``{"": 3, "sqrt2(2)": 2}``), and ``lit``, the literal form when it is
    one: ``"int"``, ``"dec"``, ``"frac"`` (lowest terms), ``"mixed"``, ``"sci"`` (``4.5 \\times 10^{3}``) or
    ``"pow10"`` (``10^{3}``, a value only as the scale of scientific notation)."""

    __slots__ = ("lit", "terms")

    def __init__(self, terms: dict[str, Fraction], lit: str | None = None):
        self.terms, self.lit = terms, lit

    @property
    def rational(self) -> bool:
        return set(self.terms) <= {""}

    @property
    def value(self) -> Fraction:
        return self.terms.get("", Fraction(0))

    def key(self) -> str:
        """A name for the whole value as one irrational factor (for products and quotients of sums)."""
        return "(" + "+".join(f"{c}*{k}" for k, c in sorted(self.terms.items())) + ")"


def _has_power_factor(n: int, k: int) -> bool:
    """Does some m**k > 1 divide the integer n >= 2 (``\\sqrt{12}``: 4 divides 12)? False above _MAX_RADICAND."""
    if n > _MAX_RADICAND:
        return False
    m = 2
    while m**k <= n:
        if n % (m**k) == 0:
            return True
        m += 1
    return False


def _is_kth_power(n: int, k: int) -> bool:
    r = round(n ** (1.0 / k))
    return any((r + d) ** k == n for d in (-1, 0, 1) if r + d >= 0)


class _ValueParser:
    """Recursive descent over the tokens of a closed-form number (digits, ``+ - * / ^ ! ( ) { } [ ]``, ``\\frac``,
    ``\\sqrt``, ``\\pi``, ``\\infty``, ``\\times``, ``\\cdot``, ``\\div``); raises :class:`_Operation` at the first
    operation on numbers left undone (:func:`value_verdict`)."""

    def __init__(self, tokens: list[str]):
        self.toks, self.i = tokens, 0

    def peek(self) -> str | None:
        return self.toks[self.i] if self.i < len(self.toks) else None

    def take(self, expected: str | None = None) -> str:
        tok = self.peek()
        if tok is None or (expected is not None and tok != expected):
            raise _Malformed
        self.i += 1
        return tok

    def parse(self) -> _Val:
        val = self.expr()
        if self.peek() is not None:
            raise _Malformed
        if val.lit == "pow10":  # 10^{3} on its own: a power of numbers
            raise _Operation
        return val

    def expr(self) -> _Val:
        val = self.unary()
        while self.peek() in ("+", "-"):
            sign = -1 if self.take() == "-" else 1
            val = self.add(val, self.unary(), sign)
        return val

    @staticmethod
    def add(a: _Val, b: _Val, sign: int) -> _Val:
        if set(a.terms) & set(b.terms):  # two rational parts (12 + 5) or like terms (\sqrt2 + \sqrt2)
            raise _Operation
        return _Val({**a.terms, **{k: sign * c for k, c in b.terms.items()}})

    def unary(self) -> _Val:
        if self.peek() in ("+", "-"):
            sign = -1 if self.take() == "-" else 1
            if self.peek() in ("+", "-"):  # --3
                raise _Operation
            val = self.term()
            return _Val({k: sign * c for k, c in val.terms.items()}, val.lit)
        return self.term()

    def term(self) -> _Val:
        val = self.power()
        while True:
            tok = self.peek()
            if tok in ("*", "\\times", "\\cdot"):
                self.take()
                val = self.mul(val, self.power(), explicit=True)
            elif tok in ("/", "\\div"):
                self.take()
                val = self.div(val, self.power(), slash=tok == "/")
            elif tok is not None and tok not in ("+", "-", ")", "}", "]", "^", "!"):
                val = self.mul(val, self.power(), explicit=False)
            else:
                return val

    @staticmethod
    def mul(a: _Val, b: _Val, explicit: bool) -> _Val:
        if a.rational and b.rational:
            if not explicit and a.lit == "int" and b.lit == "frac" and 0 < b.value < 1:  # mixed number 3\frac{1}{2}
                return _Val({"": a.value + (b.value if a.value >= 0 else -b.value)}, "mixed")
            if explicit and a.lit in ("int", "dec") and b.lit == "pow10":  # scientific notation 4.5 \times 10^{3}
                return _Val({"": a.value * b.value}, "sci")
            raise _Operation  # 18 \times 4, 2(3)
        if a.rational or b.rational:
            c, other = (a.value, b) if a.rational else (b.value, a)
            if len(other.terms) == 1:
                return _Val({k: c * v for k, v in other.terms.items()})
            return _Val({other.key(): c})
        if len(a.terms) == 1 and len(b.terms) == 1:
            (ka, ca), (kb, cb) = next(iter(a.terms.items())), next(iter(b.terms.items()))
            if ka.startswith("sqrt") and kb.startswith("sqrt"):  # \sqrt{2}\sqrt{3}
                raise _Operation
            return _Val({"*".join(sorted((ka, kb))): ca * cb})
        return _Val({a.key() + "*" + b.key(): Fraction(1)})

    @staticmethod
    def div(a: _Val, b: _Val, slash: bool) -> _Val:
        if b.rational:
            if not slash or b.lit != "int" or b.value <= 1:  # \div, a decimal or fraction below, /1, /0, /-2
                raise _Operation
            if a.rational:
                if a.lit != "int" or math.gcd(int(a.value), int(b.value)) != 1:  # \frac{34}{2}, \frac{1.5}{2}
                    raise _Operation
                return _Val({"": a.value / b.value}, "frac")
            coefs = list(a.terms.values())
            if any(c.denominator != 1 for c in coefs) or math.gcd(*(int(c) for c in coefs), int(b.value)) != 1:
                raise _Operation  # \frac{2\sqrt{3}}{4}
            return _Val({k: c / b.value for k, c in a.terms.items()})
        if a.rational:
            return _Val({"1/" + b.key(): a.value})  # \frac{1}{\sqrt{2}}
        return _Val({a.key() + "/" + b.key(): Fraction(1)})

    def power(self) -> _Val:
        val = self.atom()
        while self.peek() == "!":  # 5!
            self.take()
            raise _Operation
        if self.peek() != "^":
            return val
        self.take()
        exp = self.atom()
        if val.rational and exp.rational:
            if val.lit == "int" and val.value == 10 and exp.lit == "int":
                return _Val({"": Fraction(10) ** int(exp.value)} if abs(exp.value) < 400 else {"": 0}, "pow10")
            base, e = val.value, exp.value
            if e.denominator == 1 or base.denominator != 1 or base < 0 or base > _MAX_RADICAND:
                raise _Operation  # 2^{10}, \left(\frac{1}{2}\right)^2
            if _is_kth_power(int(base) ** e.numerator if abs(e.numerator) < 50 else 2, e.denominator):
                raise _Operation  # 4^{1/2}
            return _Val({f"{base}^({e})": Fraction(1)})
        if not val.rational and list(val.terms) == ["pi"] and val.terms["pi"] == 1:
            return _Val({"pi^" + exp.key(): Fraction(1)})  # \pi^2
        if val.rational and not exp.rational:
            return _Val({f"{val.value}^" + exp.key(): Fraction(1)})
        raise _Operation  # (\sqrt{2})^3

    def group(self) -> _Val:
        """The argument of ``\\frac`` / ``\\sqrt``: ``{...}`` or one token (``\\frac12``: one digit)."""
        if self.peek() == "{":
            return self.atom()
        tok = self.take()
        if tok[0].isdigit():
            self.toks[self.i - 1 : self.i] = list(tok)  # \frac12: the first digit only, the next token the rest
            return _Val({"": Fraction(int(tok[0]))}, "int")
        self.i -= 1
        return self.atom()

    def atom(self) -> _Val:
        tok = self.take()
        if tok[0].isdigit() or tok[0] == ".":
            return _Val({"": Fraction(tok)}, "int" if tok.isdigit() else "dec")
        if tok in ("(", "{", "["):
            val = self.expr()
            self.take({"(": ")", "{": "}", "[": "]"}[tok])
            return val
        if tok == "\\pi":
            return _Val({"pi": Fraction(1)})
        if tok == "\\infty":
            return _Val({"inf": Fraction(1)})
        if tok == "\\frac":
            num = self.group()
            return self.div(num, self.group(), slash=True)
        if tok == "\\sqrt":
            k = 2
            if self.peek() == "[":
                self.take()
                index = self.expr()
                self.take("]")
                if index.lit != "int" or index.value < 2:
                    raise _Operation
                k = int(index.value)
            rad = self.group()
            if not rad.rational:
                return _Val({f"sqrt{k}" + rad.key(): Fraction(1)})  # \sqrt{2+\sqrt{3}}
            if rad.lit != "int" or rad.value < 2 or _has_power_factor(int(rad.value), k):
                raise _Operation  # \sqrt{36}, \sqrt{12}, \sqrt{\frac{1}{2}}
            return _Val({f"sqrt{k}({rad.value})": Fraction(1)})
        raise _Malformed


def value_verdict(s: str) -> bool | None:
    """Is a normalised answer (:func:`normalize_answer`) a closed-form number written as a value?

    Returns:
        True for a value: an integer, a decimal, a fraction in lowest terms (``\\frac{3}{4}``, ``3/4``), a mixed
        number (``3\\frac{1}{2}``), scientific notation (``4.5 \\times 10^{3}``), with a sign; radicals in simplest
        form (``2\\sqrt{3}``, ``\\frac{1+\\sqrt{5}}{2}``, ``\\sqrt[3]{2}``), ``\\pi`` (``\\frac{3\\pi}{4}``,
        ``\\pi^2``) and ``\\infty``, also combined with rational numbers by ``+ - \\times /``.
        False for an operation on numbers left undone: a sum, difference, product or quotient of two rational
        numbers (``12 + 5``, ``18 \\times 4``, ``34 / 2``, ``3 \\div 4``, ``1 + \\sqrt{2} + 2``), a fraction not in
        lowest terms (``\\frac{34}{2}``, ``\\frac{2\\sqrt{3}}{4}``), a power of rational numbers (``2^{10}``,
        ``10^{3}``; module docstring, point 3), a factorial, a radical not in simplest form (``\\sqrt{36}``,
        ``\\sqrt{12}``), like terms (``\\sqrt{2} + \\sqrt{2}``). An operation is found where the parser meets it, so
        ``(12 + 5`` is one too.
        None when ``s`` is not a closed-form number: it holds a variable, a word, a comma, ``=``, nothing, or its
        digits and operators form no expression up to its first operation (``{\\frac{1}{2}``, ``12 +``).
    """
    s = s.strip()
    if s.startswith("$"):
        s = s[1:]
    tokens, pos = [], 0
    while pos < len(s):
        m = _TOKEN_RE.match(s, pos)
        if m is None:
            if s[pos:].strip():
                return None
            break
        tok = m.group(1)
        if tok.startswith("\\") and tok not in _COMMANDS:
            return None
        tokens.append(tok)
        pos = m.end()
    if not any(t[0].isdigit() or t[0] == "." or t in ("\\pi", "\\infty") for t in tokens):
        return None
    if tokens[0] == "(" and tokens[-1] == ")" and "(" not in tokens[1:-1]:  # (17): a one-entry tuple, not a number
        return None
    try:
        _ValueParser(tokens).parse()
    except _Operation:
        return False
    except (_Malformed, ValueError, ZeroDivisionError, OverflowError):  # not one expression: math-verify reads it
        return None
    return True


def _split_top_level(s: str) -> list[str]:
    """``s`` split at the commas outside any bracket."""
    parts, depth, start = [], 0, 0
    for i, ch in enumerate(s):
        if ch in "([{":
            depth += 1
        elif ch in ")]}":
            depth -= 1
        elif ch == "," and depth == 0:
            parts.append(s[start:i])
            start = i + 1
    return [*parts, s[start:]]


def stated_value(normalized: str) -> tuple[str, bool]:
    """What a normalised answer states, and whether it is stated as a value (module docstring, point 3).

    The number is read past a variable and ``=`` before it (``x = 17``), units after it (``17 apples``,
    ``17 \\text{ dollars}``, ``15 \\text{ cm}^2``), a leading ``$``, thousands separators and double quotes around
    it. A closed-form number must be a value
    (:func:`value_verdict`); in a tuple, interval, set or list each closed-form entry must be one; any other answer
    (an expression with a variable, words) is stated as it is.

    Returns:
        ``(stated, is_value)``: ``stated`` is the string to grade.
    """
    core = _UNIT_WRAP_RE.sub(" ", normalized).strip()
    core = core[1:-1].strip() if len(core) > 2 and core[0] == core[-1] == '"' else core  # "70"
    core = _ASSIGNMENT_RE.sub("", core)
    core = _TRAILING_WORDS_RE.sub("", core).strip()
    core = core.replace(",", "") if _THOUSANDS_WHOLE_RE.fullmatch(core) else core
    core = core[1:].strip() if core.startswith("$") else core
    verdict = value_verdict(core)
    if verdict is not None:
        return core, verdict
    inner = normalized.strip()
    for left, right in (("\\{", "\\}"), ("(", ")"), ("[", "]"), ("(", "]"), ("[", ")")):
        if inner.startswith(left) and inner.endswith(right):
            inner = inner[len(left) : len(inner) - len(right)]
            break
    if any(value_verdict(entry) is False for entry in _split_top_level(inner)):
        return normalized, False
    return normalized, True


def _balanced(s: str) -> str:
    """``s`` without the unmatched braces at its ends that math-verify's extraction can leave (``{\\frac{1}{2}``)."""
    while s.startswith("{") and s.count("{") > s.count("}"):
        s = s[1:].strip()
    while s.endswith("}") and s.count("}") > s.count("{"):
        s = s[:-1].strip()
    return s


def _same_writing(a: str, b: str) -> bool:
    """Equal up to spaces and the braces of a one-digit exponent (``2^{10}`` = ``2^{10}``, ``x^{2}`` = ``x^2``)."""

    def key(s: str) -> str:
        return re.sub(r"\^\{(\w)\}", r"^\1", re.sub(r"\s+", "", s))

    return key(a) == key(b)


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
    if is_plain_number(gold_n):
        gold_n = gold_n.lstrip("$").strip()
    numeric_gold = value_verdict(gold_n) is not None
    if answer is not None:
        answer_n = normalize_answer(answer)
        if _same_writing(answer_n, gold_n):  # written as the gold is (a gold 2^{10} pays the answer 2^{10})
            return True, answer_n
        gold_m, answer_m = matrix_entries(gold_n), matrix_entries(answer_n)
        if gold_m is not None and answer_m is not None:  # module docstring, point 4
            same_shape = [len(r) for r in gold_m] == [len(r) for r in answer_m]
            return same_shape and all(
                grade(g, a, "", timeout_s)[0] for gr, ar in zip(gold_m, answer_m) for g, a in zip(gr, ar)
            ), answer_n
        answer_n, is_value = stated_value(answer_n)
        if not is_value:  # module docstring, point 3: an operation on numbers scores 0
            return False, answer_n
        if numeric_gold and value_verdict(answer_n) is None:  # point 3: a number's place holds words or a variable
            return False, answer_n
        if _same_writing(answer_n, gold_n):
            return True, answer_n
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
    if answer is None and reply["correct"]:  # the expression math-verify took from the end of the text (point 3)
        stated = _balanced(normalize_answer(reply["pred"].rsplit("=", 1)[-1]))  # "3 * 4 = 12" states 12
        return grade(gold, stated, "", timeout_s)  # math-verify's value may not be its string's ("(10)." read as 1)
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
