"""capo_verl.reward.compute_score on a table of (gold, response, expected) cases: every correct final answer written as
a value is paid whatever the gold's form (integer, decimal, fraction, radical, power), an operation on numbers (a
GSM8K one-step question's own expression) is not, wrong answers are not.

Every case that is not an echo is checked against math-verify's own ``verify`` (gold and response parsed by
``math_verify.parse``); where the two differ, the case names the reason. The reward's rule: capo_verl/reward.py,
module docstring, point 3; docs/evaluation.md, "The reward".
"""

from __future__ import annotations

from typing import NamedTuple

import pytest

from capo_verl.reward import compute_score

#: why this reward refuses what math-verify pays: an operation on numbers left undone (module docstring, point 3)
OPERATION = "an operation on numbers left undone, which this reward does not pay; math-verify evaluates it"
NOT_LOWEST = "a fraction not in lowest terms is a division left undone; math-verify evaluates it"
POWER = "a power of numbers is an operation unless the gold is written as that power; math-verify evaluates it"
RADICAL = "a radical not in simplest form (a square factor left inside) is left undone; math-verify evaluates it"


class Case(NamedTuple):
    gold: str
    response: str
    expected: float
    echo: bool = False  # the question's own arithmetic (GSM8K one-step): math-verify pays it, this reward does not
    why: str | None = None  # why math-verify's verdict differs from ``expected``; None: it agrees


CASES = [
    # --- correct answers on competition golds that the plain-number rule used to refuse -------------------------
    Case("0.5", "\\boxed{\\frac{1}{2}}", 1.0),
    Case("0.75", "\\boxed{\\frac{3}{4}}", 1.0),
    Case("1.5", "\\boxed{\\dfrac{3}{2}}", 1.0),
    Case("12.5", "\\boxed{\\frac{25}{2}}", 1.0),
    Case("-50.5", "\\boxed{-\\frac{101}{2}}", 1.0),
    Case("4.5", "The answer is $\\frac{9}{2}$", 1.0),
    Case("\\frac{3}{4}", "\\boxed{0.75}", 1.0),
    # --- each value form against a decimal gold ----------------------------------------------------------------
    Case("0.5", "\\boxed{0.5}", 1.0),
    Case("0.5", "\\boxed{0.50}", 1.0),
    Case("0.5", "\\boxed{.5}", 1.0),
    Case("0.5", "\\boxed{\\tfrac{1}{2}}", 1.0),
    Case("0.5", "\\boxed{\\frac12}", 1.0),
    Case("0.5", "\\boxed{1/2}", 1.0),
    Case("2.25", "\\boxed{2\\frac{1}{4}}", 1.0),  # mixed number
    Case("2.25", "\\boxed{\\frac{9}{4}}", 1.0),
    Case("-1.5", "\\boxed{-1.5}", 1.0),
    Case("-1.5", "\\boxed{\\frac{-3}{2}}", 1.0),
    Case("4500", "\\boxed{4.5 \\times 10^{3}}", 1.0),  # scientific notation
    Case("27.0", "\\boxed{27}", 1.0),  # AMC23's golds are floats
    Case("18.90", "\\boxed{\\$18.9}", 1.0),
    # --- each value form against a fraction gold ---------------------------------------------------------------
    Case("\\frac{3}{4}", "\\boxed{\\dfrac{3}{4}}", 1.0),
    Case("\\frac{3}{4}", "\\boxed{\\frac34}", 1.0),
    Case("\\frac{3}{4}", "\\boxed{3/4}", 1.0),
    Case("\\frac{7}{2}", "\\boxed{3\\frac{1}{2}}", 1.0),
    Case("\\frac{7}{2}", "\\boxed{3.5}", 1.0),
    Case("-\\frac{101}{2}", "\\boxed{-50.5}", 1.0),
    Case("\\frac{1}{3}", "\\boxed{0.333333}", 1.0),
    # --- each value form against an integer gold --------------------------------------------------------------
    Case("17", "\\boxed{17}", 1.0),
    Case("17", "\\boxed{17.0}", 1.0),
    Case("17", "\\boxed{x = 17}", 1.0),
    Case("17", "Answer: 17 apples", 1.0),
    Case("-3", "#### -3", 1.0),
    Case("1000", "\\boxed{1,000}", 1.0),
    Case("1000", "\\boxed{1 \\times 10^{3}}", 1.0),
    Case("12", "We get 3 * 4 = 12", 1.0),  # no marker: math-verify's last expression, after its last "="
    Case("12", "\\boxed{3 \\times 4 = 12}", 0.0, why="an equation in the box is not a value; math-verify pays it"),
    Case("1", "21 - 20 equals 1 Crete (10).", 0.0, why="math-verify reads the text's (10) as 1"),
    Case("17", "\\boxed{\\frac{17}{1}}", 0.0, why=NOT_LOWEST),
    # --- radicals, pi and powers --------------------------------------------------------------------------------
    Case("2\\sqrt{3}", "\\boxed{2 \\sqrt 3}", 1.0),
    Case("2\\sqrt{3}", "\\boxed{\\sqrt{12}}", 0.0, why=RADICAL),
    Case("\\frac{\\sqrt{2}}{2}", "\\boxed{\\frac{1}{\\sqrt{2}}}", 1.0),  # a radical below the line is allowed
    Case("\\frac{1+\\sqrt{5}}{2}", "\\boxed{\\frac{1 + \\sqrt5}{2}}", 1.0),
    Case("\\frac{\\pi}{4}", "\\boxed{\\pi/4}", 1.0),
    Case("\\frac{\\pi}{4}", "\\boxed{0.25\\pi}", 1.0),
    Case("3+2\\sqrt{2}", "\\boxed{2\\sqrt{2} + 3}", 1.0),
    Case("2^{10}", "\\boxed{2^{10}}", 1.0),  # written as the gold is
    Case("2^{10}", "\\boxed{1024}", 1.0),
    Case("1024", "\\boxed{2^{10}}", 0.0, why=POWER),
    Case("1000", "\\boxed{10^{3}}", 0.0, why=POWER),
    Case("6", "\\boxed{\\sqrt{36}}", 0.0, why=RADICAL),
    # --- the non-numeric forms: as before ----------------------------------------------------------------------
    Case("(1,2)", "\\boxed{(1, 2)}", 1.0),
    Case("[1,2)", "\\boxed{[1, 2)}", 1.0),
    Case("(-\\infty, 3]", "\\boxed{(-\\infty,3]}", 1.0),
    Case("\\{1, 2\\}", "\\boxed{\\{2, 1\\}}", 1.0),
    Case("x^2+2x+1", "\\boxed{(x+1)^2}", 1.0),
    Case("\\begin{pmatrix}1\\\\2\\end{pmatrix}", "\\boxed{\\begin{pmatrix} 1 \\\\ 2 \\end{pmatrix}}", 1.0),
    # --- operations that are not echoes: refused for every gold ------------------------------------------------
    Case("0.75", "\\boxed{\\frac{6}{8}}", 0.0, why=NOT_LOWEST),
    Case("\\frac{1}{2}", "\\boxed{\\frac{2}{4}}", 0.0, why=NOT_LOWEST),
    Case("\\sqrt{36}", "\\boxed{2 \\cdot 3}", 0.0, why=OPERATION),
    Case("0.5", "\\boxed{1 - 0.5}", 0.0, why=OPERATION),
    Case("120", "\\boxed{5!}", 0.0, why=OPERATION),
    Case("(17, 3)", "\\boxed{(12 + 5, 3)}", 0.0, why=OPERATION),
    # --- echoes of GSM8K one-step questions ---------------------------------------------------------------------
    Case("17", "\\boxed{12 + 5}", 0.0, echo=True),
    Case("17", "Answer: 12 + 5", 0.0, echo=True),
    Case("17", "#### 12+5", 0.0, echo=True),
    Case("72", "\\boxed{18 \\times 4}", 0.0, echo=True),
    Case("72", "\\boxed{18 \\cdot 4}", 0.0, echo=True),
    Case("72", "The answer is 18 * 4", 0.0, echo=True),
    Case("31", "\\boxed{48 - 17}", 0.0, echo=True),
    Case("17", "\\boxed{\\frac{34}{2}}", 0.0, echo=True),
    Case("17", "\\boxed{34 / 2}", 0.0, echo=True),
    Case("17", "\\boxed{34 \\div 2}", 0.0, echo=True),
    Case("17", "\\boxed{x = 12 + 5}", 0.0, echo=True),
    Case("17", "\\boxed{12 + 5 \\text{ apples}}", 0.0, echo=True),
    Case("12", "So the total is 12 = 3*4", 0.0, echo=True),
    Case("2.5", "\\boxed{\\frac{10}{4}}", 0.0, echo=True),
    Case("-3", "\\boxed{2 - 5}", 0.0, echo=True),
    # --- wrong answers in each form -----------------------------------------------------------------------------
    Case("0.5", "\\boxed{\\frac{1}{3}}", 0.0),
    Case("0.5", "\\boxed{0.6}", 0.0),
    Case("2.25", "\\boxed{2\\frac{1}{3}}", 0.0),
    Case("-1.5", "\\boxed{\\frac{3}{2}}", 0.0),
    Case("\\frac{3}{4}", "\\boxed{0.7}", 0.0),
    Case("\\frac{3}{4}", "\\boxed{4/3}", 0.0),
    Case("17", "\\boxed{18}", 0.0),
    Case("17", "\\boxed{\\frac{35}{2}}", 0.0),
    Case("1000", "\\boxed{1.1 \\times 10^{3}}", 0.0),
    Case("2\\sqrt{3}", "\\boxed{3\\sqrt{2}}", 0.0),
    Case("\\frac{\\pi}{4}", "\\boxed{\\frac{\\pi}{3}}", 0.0),
    Case("(1,2)", "\\boxed{(2, 1)}", 0.0),
    Case("5", "\\boxed{5n}", 0.0),
    Case(
        "3",
        'The answer is 30. We answer "30" truncating the end to make it only 3 digits',
        0.0,
        why="words in a number's place: math-verify takes a number out of the sentence",
    ),
    Case("70", 'The answer is "70"', 1.0, why="math-verify does not read a number between double quotes"),
]


def _ids(case: Case) -> str:
    return f"{case.gold}|{case.response}"


def test_the_table_covers_the_forms():
    assert len(CASES) >= 60
    assert len({(c.gold, c.response) for c in CASES}) == len(CASES)
    assert sum(c.echo for c in CASES) >= 10 and all(c.expected == 0.0 for c in CASES if c.echo)


@pytest.mark.parametrize("case", CASES, ids=_ids)
def test_compute_score(case: Case):
    out = compute_score("forms", case.response, case.gold)
    assert (out["score"], out["acc"]) == (case.expected, case.expected), out


@pytest.fixture(scope="module")
def math_verify_verdict():
    from math_verify import parse, verify

    def verdict(gold: str, response: str) -> float:
        return 1.0 if verify(parse("$" + gold + "$"), parse(response)) else 0.0

    return verdict


@pytest.mark.parametrize("case", [c for c in CASES if not c.echo], ids=_ids)
def test_against_math_verify(case: Case, math_verify_verdict):
    """Where math-verify's own verdict differs from this reward's, the case says why; where it agrees, no reason."""
    mv = math_verify_verdict(case.gold, case.response)
    if case.why is None:
        assert mv == case.expected, f"math-verify says {mv}; give the case a reason or fix the reward"
    else:
        assert mv != case.expected, f"math-verify agrees ({mv}); the case's reason is stale"


@pytest.mark.parametrize("case", [c for c in CASES if c.echo and "\\boxed" in c.response], ids=_ids)
def test_math_verify_pays_the_boxed_echoes(case: Case, math_verify_verdict):
    """Why the rule exists: math-verify evaluates the question's expression and pays it."""
    assert math_verify_verdict(case.gold, case.response) == 1.0
