"""capo_verl.reward.compute_score: gold solutions of MATH-500, Minerva and GSM8K score 1.0, wrong answers 0.0,
the forms graders usually get wrong, thread safety and the time bound on a pathological answer."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest

from capo_verl import reward
from capo_verl.reward import compute_score, extract_answer, last_boxed, normalize_answer

BENCH = Path(reward.__file__).resolve().parent / "resources" / "benchmarks"


def load(name: str) -> list[dict]:
    with open(BENCH / name) as f:
        return [json.loads(line) for line in f if line.strip()]


# --- real benchmark solutions ---------------------------------------------------------------------------
def test_math500_gold_solutions_score_one():
    rows = load("math500.jsonl")
    assert len(rows) == 500
    failed = [(r["answer"], compute_score("math500", r["solution"], r["answer"])) for r in rows]
    failed = [f for f in failed if f[1]["score"] != 1.0]
    assert failed == []


def test_minerva_gold_solutions_score_one():
    rows = load("minerva_math.jsonl")
    assert len(rows) == 272
    failed = []
    for r in rows:
        gold = last_boxed(r["solution"])  # Minerva keeps its answer only in the solution's last box
        out = compute_score("minerva_math", r["solution"], gold)
        if out["score"] != 1.0:
            failed.append((gold, out))
    assert failed == []


def test_gsm8k_gold_solutions_score_one():
    """No box at all: the final answer is GSM8K's '#### X' line."""
    rows = load("gsm8k_test.jsonl")
    assert len(rows) == 1319
    failed = []
    for r in rows:
        gold = r["answer"].rsplit("####", 1)[1].strip()
        out = compute_score("gsm8k", r["answer"], gold)
        if out["score"] != 1.0 or out["pred"] != normalize_answer(gold):
            failed.append((gold, out))
    assert failed == []


def test_math500_gold_answers_through_math_verify():
    """compute_score accepts equal strings without math-verify; here math-verify itself (in the worker
    processes) must find every MATH-500 `answer` equal to the solution's box, on a deterministic sample."""
    pool = reward._get_pool()
    for r in load("math500.jsonl")[::5]:
        gold = "\\boxed{" + normalize_answer(r["answer"]) + "}"
        pred = "\\boxed{" + normalize_answer(last_boxed(r["solution"])) + "}"
        reply = pool.grade(gold, pred, reward.DEFAULT_TIMEOUT_S)
        assert reply is not None and reply["ok"] and reply["correct"], (r["answer"], reply)


def test_wrong_answers_score_zero():
    """Each MATH-500 / GSM8K solution graded against the gold answer of the next problem."""
    math500 = load("math500.jsonl")[:100]
    for i, r in enumerate(math500):
        other = math500[(i + 1) % len(math500)]["answer"]
        assert normalize_answer(other) != normalize_answer(r["answer"])
        if "=" in other:  # e.g. gold "5", other "x=5": the same answer
            continue
        out = compute_score("math500", r["solution"], other)
        assert out["score"] == 0.0 and out["acc"] == 0.0, (r["answer"], other)
    gsm8k = load("gsm8k_test.jsonl")[:100]
    for i, r in enumerate(gsm8k):
        gold = r["answer"].rsplit("####", 1)[1].strip()
        other = gsm8k[(i + 1) % len(gsm8k)]["answer"].rsplit("####", 1)[1].strip()
        if other == gold:
            continue
        assert compute_score("gsm8k", r["answer"], other)["score"] == 0.0


# --- forms graders usually get wrong ---------------------------------------------------------------------
@pytest.mark.parametrize(
    "gold,response,expected",
    [
        ("25", "So the rate is \\boxed{25\\%}.", 1.0),
        ("25\\%", "The answer is $\\boxed{25}$", 1.0),
        ("25", "\\boxed{25\\%}", 1.0),
        ("1000", "\\boxed{1,000}", 1.0),
        ("1,000", "\\boxed{1000}", 1.0),
        ("1000000", "\\boxed{1{,}000{,}000}", 1.0),
        ("1234567", "\\boxed{1,234,567}", 1.0),
        ("\\frac{1}{2}", "\\boxed{0.5}", 1.0),
        ("\\frac{3}{4}", "\\boxed{0.75}", 1.0),
        ("0.75", "\\boxed{\\dfrac{3}{4}}", 1.0),  # a fraction in lowest terms is a value, whatever the gold's form
        ("0.75", "\\boxed{\\frac{6}{8}}", 0.0),  # one not in lowest terms is an operation left undone
        ("\\frac{1}{3}", "\\boxed{0.333333}", 1.0),
        ("\\frac{1}{3}", "\\boxed{0.3}", 0.0),
        ("(1,2)", "\\boxed{(1, 2)}", 1.0),
        ("(3,-1)", "the point is \\boxed{\\left(3, -1\\right)}", 1.0),
        ("(3,-1)", "\\boxed{(-1, 3)}", 0.0),
        ("[1,2)", "\\boxed{[1, 2)}", 1.0),
        ("[1,2)", "\\boxed{x \\in [1,2)}", 1.0),
        ("[1,2)", "\\boxed{(1,2]}", 0.0),
        ("(-\\infty, 3]", "\\boxed{(-\\infty,3]}", 1.0),
        ("2, 3", "\\boxed{3, 2}", 1.0),
        ("18", "She makes \\boxed{18 \\text{ dollars}} every day.", 1.0),
        ("18", "She makes $\\boxed{\\$18}$ every day.", 1.0),
        ("18.90", "\\boxed{\\$18.90}", 1.0),
        ("30^\\circ", "\\boxed{30}", 1.0),
        ("\\text{(C)}", "The correct option is \\boxed{C}.", 1.0),
        ("x^2+2x+1", "\\boxed{(x+1)^2}", 1.0),
        ("\\sqrt{2}/2", "\\boxed{\\frac{\\sqrt{2}}{2}}", 1.0),
        ("5", "\\boxed{x = 5}", 1.0),
        ("4", "First \\boxed{3}, but that is wrong; the answer is \\boxed{4}", 1.0),
        ("3", "First \\boxed{3}, but that is wrong; the answer is \\boxed{4}", 0.0),
        ("7", "Therefore the final answer is 7.", 1.0),
        ("7", "Answer: $7$", 1.0),
        ("42", "#### 42", 1.0),
        ("12", "We get 3 * 4 = 12", 1.0),  # no marker at all: math-verify takes the last expression
        ("5", "no answer here", 0.0),
        ("5", "", 0.0),
        ("\\frac{1}{2}", "\\boxed{\\frac{1}{2}", 1.0),  # unclosed box = no box: the final expression
        ("3", "\\boxed{3} and then the response was cut off \\boxed{\\frac{1", 1.0),
        ("27", "\\boxed{27.0}", 1.0),
        (
            "\\begin{pmatrix}-1/3\\\\2/3\\end{pmatrix}",
            "\\boxed{\\begin{pmatrix} -\\frac{1}{3} \\\\ \\frac{2}{3} \\end{pmatrix}}",
            1.0,
        ),
        (
            "\\begin{pmatrix}-1&0\\\\0&-1\\end{pmatrix}",
            "\\boxed{\\begin{pmatrix} -1 & 0 \\\\ 0 & -1 \\end{pmatrix}}",
            1.0,
        ),
        ("\\begin{pmatrix}-1&0\\\\0&-1\\end{pmatrix}", "\\boxed{\\begin{pmatrix} -1 & 0 & 0 & -1 \\end{pmatrix}}", 0.0),
        ("\\begin{pmatrix}2\\\\3\\end{pmatrix}", "\\boxed{\\begin{pmatrix} 3 \\\\ 2 \\end{pmatrix}}", 0.0),
    ],
)
def test_tricky_forms(gold, response, expected):
    out = compute_score("test", response, gold)
    assert set(out) == {"score", "acc", "pred"}
    assert out["score"] == expected and out["acc"] == expected, out


def test_numeric_ground_truth_and_pred():
    assert compute_score("amc23", "\\boxed{27}", 27.0) == {"score": 1.0, "acc": 1.0, "pred": "27"}
    assert compute_score("x", "\\boxed{2.5}", 2.5)["score"] == 1.0
    assert compute_score("x", "The answer is \\boxed{\\dfrac{5}{8}}.", "\\frac58")["pred"] == "\\frac{5}{8}"
    assert compute_score("x", "nothing", "3")["pred"] == ""


def test_extraction_helpers():
    assert extract_answer("a \\boxed{\\frac{1}{2}} b") == ("\\frac{1}{2}", "boxed")
    assert extract_answer("\\fbox{7}") == ("7", "boxed")
    assert extract_answer("so \\boxed 5.") == ("5", "boxed")
    assert extract_answer("x\n#### 1,234\n") == ("1,234", "gsm8k")
    assert extract_answer("The final answer is $3$.") == ("$3$", "anchor")
    assert extract_answer("just text") == (None, "free")
    assert last_boxed("\\boxed{\\{1,2\\}}") == "\\{1,2\\}"
    assert normalize_answer("$1,000.$") == "1000"
    assert normalize_answer("\\left( 3, \\dfrac{1}{2} \\right)") == "( 3, \\frac{1}{2} )"


def test_bad_ground_truth_is_a_clear_error():
    with pytest.raises(ValueError, match=r"\bempty\b.*\breward_model\.ground_truth\b.*\bdata_source='x'"):
        compute_score("x", "\\boxed{1}", "  ")
    with pytest.raises(
        ValueError,
        match=r"\breward_model\.ground_truth\b.*\(None\).*\bdata_source='x'",
    ):
        compute_score("x", "\\boxed{1}", None)
    with pytest.raises(ValueError, match=r"\breward_model\.ground_truth\b.*\bstring 'NaN'.*\bdata_source='x'"):
        compute_score("x", "\\boxed{1}", "NaN")
    with pytest.raises(TypeError, match="must be a string"):
        compute_score("x", "\\boxed{1}", ["1", "2"])
    with pytest.raises(TypeError, match="must be a string"):
        compute_score("x", "\\boxed{1}", True)


def test_nan_ground_truth_from_a_numeric_parquet_column(tmp_path):
    """AMC-style numeric answers with one missing value: pandas stores NaN in the float column. The row with an
    answer scores normally (27.0 -> "27"); the missing one is an error naming the data source and the column."""
    import pandas as pd

    pd.DataFrame({"data_source": ["amc23", "amc23"], "ground_truth": [27.0, None]}).to_parquet(tmp_path / "d.parquet")
    rows = pd.read_parquet(tmp_path / "d.parquet").to_dict("records")
    assert compute_score(rows[0]["data_source"], "\\boxed{27}", rows[0]["ground_truth"]) == {
        "score": 1.0,
        "acc": 1.0,
        "pred": "27",
    }
    with pytest.raises(
        ValueError,
        match=r"\breward_model\.ground_truth\b.*\bNaN\b.*\bdata_source='amc23'.*\bnumeric\b.*\bparquet\b",
    ):
        compute_score(rows[1]["data_source"], "\\boxed{27}", rows[1]["ground_truth"])


def test_numpy_number_ground_truth():
    """Numbers straight from numpy arrays grade like python numbers (np.int64 is not an int subclass)."""
    assert compute_score("x", "\\boxed{27}", np.int64(27)) == {"score": 1.0, "acc": 1.0, "pred": "27"}
    assert compute_score("x", "\\boxed{27}", np.float32(27.0))["score"] == 1.0
    assert compute_score("x", "\\boxed{2.50}", np.float64(2.5))["score"] == 1.0


@pytest.mark.parametrize("timeout_s", [0, -1.0, float("inf"), float("nan"), "10", None, True])
def test_bad_timeout_is_refused_on_every_call(timeout_s):
    """timeout_s <= 0 used to be accepted and then scored every answer needing math-verify 0.0 (0.5 vs 1/2 here);
    it is refused on every call, also for an answer that equals the gold as a string."""
    message = (
        r"^reward.custom_reward_function.reward_kwargs.timeout_s=.*: must be a finite number of seconds > 0 "
        r"\(0 or less would score every answer that needs math-verify 0.0\); e.g. "
        r"\+reward\.custom_reward_function\.reward_kwargs\.timeout_s=10 \(the default\)$"
    )
    for response, gold in (("\\boxed{0.5}", "\\frac{1}{2}"), ("\\boxed{3}", "3")):
        with pytest.raises(ValueError, match=message):
            compute_score("x", response, gold, timeout_s=timeout_s)
    with pytest.raises(ValueError, match=message):
        reward.grade("3", "3", "", timeout_s=timeout_s)
    with pytest.raises(ValueError, match=message):
        reward.check_timeout(timeout_s)


@pytest.mark.parametrize("raw", ["0", "-2", "two", "1.5", "inf"])
def test_reward_procs_refuses_anything_but_a_positive_integer(raw):
    """CAPO_REWARD_PROCS: one line naming the variable, the value and the range (the pool and the start check
    both read it through reward_procs)."""
    with pytest.raises(ValueError, match=rf"^CAPO_REWARD_PROCS='{re.escape(raw)}'.*>= 1\b.*\bunset it\b"):
        reward.reward_procs({"CAPO_REWARD_PROCS": raw})


def test_reward_procs_default_and_value():
    assert reward.reward_procs({}) == min(4, os.cpu_count() or 1)
    assert reward.reward_procs({"CAPO_REWARD_PROCS": ""}) == min(4, os.cpu_count() or 1)
    assert reward.reward_procs({"CAPO_REWARD_PROCS": " 3 "}) == 3


# --- the answer must be a value, not an operation on numbers (no pay for copying the question's expression) ----
@pytest.mark.parametrize(
    "response,gold",
    [
        ("Answer: 12 + 5", "17"),
        ("12 + 5", "17"),
        ("Answer: 18 * 4", "72"),
        ("The answer is 48 - 17", "31"),
        ("\\boxed{48-17}", "31"),
        ("\\boxed{18 \\times 4}", "72"),
        ("\\boxed{\\frac{34}{2}}", "17"),
        ("\\boxed{2^3}", "8"),
        ("#### 6 * 7", "42"),
        ("So the total is 12 = 3*4", "12"),  # no marker: math-verify's last expression, 3*4
        ("\\boxed{12 + 5 \\text{ apples}}", "17"),
        ("\\boxed{\\$ 5 \\cdot 3}", "15"),
        ("\\boxed{5n}", "5"),  # a single letter after a number is algebra, not a unit
        ("\\boxed{3 \\pi}", "3"),
        ("\\boxed{3 pi}", "3"),
        ("\\boxed{17e}", "17"),
        ("\\boxed{2 i}", "2"),
    ],
)
def test_echoed_expression_scores_zero(response, gold):
    """An operation on numbers that evaluates to the gold is not an answer: a GSM8K one-step question contains
    exactly that expression, and paying for it paid a policy for copying the question. A number followed by one
    letter is algebra (``5n``, ``17e``, ``2 i``, ``3\\pi``), not the gold."""
    assert compute_score("gsm8k_calc", response, gold)["score"] == 0.0


@pytest.mark.parametrize(
    "response,gold",
    [
        ("The answer is \\boxed{17}.", "17"),
        ("Answer: 17", "17"),
        ("Answer: 17.", "17"),
        ("\\boxed{$17}", "17"),
        ("She pays \\boxed{\\$1,234.50}.", "1234.5"),
        ("\\boxed{1,000}", "1000"),
        ("\\boxed{1000}", "1,000"),
        ("#### -3", "-3"),
        ("\\boxed{x = 17}", "17"),
        ("\\boxed{17 \\text{ apples}}", "17"),
        ("Answer: 17 apples", "17"),
        ("We get 3 * 4 = 12", "12"),
        ("\\boxed{17.0}", "17"),
        ("\\boxed{0.5}", "0.50"),
        ("\\boxed{25\\%}", "25"),
        ("\\boxed{-(3)}", "-3"),  # a sign before a bracketed number: no operation left undone
        ("\\boxed{17 \\frac{1}{2}}", "17.5"),  # a mixed number
    ],
)
def test_plain_numeric_answers_still_score_one(response, gold):
    assert compute_score("gsm8k_calc", response, gold)["score"] == 1.0


def test_done_when_cases():
    assert compute_score("gsm8k_calc", "Answer: 12 + 5", "17")["score"] == 0
    assert compute_score("gsm8k_calc", "The answer is \\boxed{17}.", "17")["score"] == 1


@pytest.mark.parametrize(
    "response,gold",
    [
        ("\\boxed{\\frac{1}{2}}", "0.5 + 0"),
        ("\\boxed{6}", "\\sqrt{36}"),
        ("\\boxed{(x+1)^2}", "x^2+2x+1"),
        ("\\boxed{0.5}", "\\frac{1}{2}"),
        ("\\boxed{0.5 + 0}", "0.5 + 0"),  # written as the gold is written
    ],
)
def test_value_answers_to_golds_of_any_form(response, gold):
    """A value (or an expression with a variable) goes to math-verify whatever the gold's form."""
    assert compute_score("math", response, gold)["score"] == 1.0


@pytest.mark.parametrize(
    "response,gold",
    [("\\boxed{2 \\cdot 3}", "\\sqrt{36}"), ("\\boxed{\\frac{2}{4}}", "\\frac{1}{2}"), ("\\boxed{2^{10}}", "1024")],
)
def test_operations_score_zero_whatever_the_gold(response, gold):
    """The rule is the same for every gold: an operation on numbers is not paid, also where the gold is no integer."""
    assert compute_score("math", response, gold)["score"] == 0.0


def test_value_helpers():
    assert [reward.is_plain_number(s) for s in ("17", "-3", "18.90", ".5", "$17", "12 + 5", "\\frac{1}{2}", "")] == [
        True,
        True,
        True,
        True,
        True,
        False,
        False,
        False,
    ]
    assert reward.stated_value("x = 17") == ("17", True)
    assert reward.stated_value("17 \\text{ dollars}") == ("17", True)
    assert reward.stated_value("$1,234") == ("1234", True)
    assert reward.stated_value("12 + 5") == ("12 + 5", False)
    assert reward.stated_value("(17)") == ("(17)", True)  # not a closed-form number: graded by math-verify
    assert reward.stated_value("(12 + 5, 3)") == ("(12 + 5, 3)", False)
    assert reward.stated_value("17 and 18") == ("17 and 18", True)  # words: math-verify decides
    assert [reward.value_verdict(s) for s in ("17", "x + 1", "12 + 5", "12 +", "")] == [True, None, False, None, None]


# --- the worker process ---------------------------------------------------------------------------------
def test_the_worker_is_a_file_of_the_package_that_imports_neither_capo_verl_nor_verl_nor_torch(tmp_path):
    """The child runs capo_verl/_reward_worker.py by path and answers the JSON-lines protocol; Python's import log
    (``-X importtime``) shows that it imported math-verify and none of capo_verl, verl or torch, even when started
    from the package's own directory."""
    script = Path(reward._WORKER_SCRIPT)
    assert script.is_file() and script.parent == Path(reward.__file__).resolve().parent
    requests = [{"gold": "$\\frac{1}{2}$", "pred": "$0.5$"}, {"gold": "$3$", "pred": "$4$"}]
    out = subprocess.run(
        [sys.executable, "-X", "importtime", str(script)],
        input="".join(json.dumps(r) + "\n" for r in requests),
        capture_output=True,
        text=True,
        timeout=120,
        cwd=script.parent,
        check=True,
    )
    replies = [json.loads(line) for line in out.stdout.splitlines()]
    assert replies[0] == {"ready": True}
    assert [(r["ok"], r["correct"]) for r in replies[1:]] == [(True, True), (True, False)]
    imported = {line.rsplit("|", 1)[-1].strip() for line in out.stderr.splitlines() if line.startswith("import time:")}
    assert "math_verify" in imported
    top_level = {name.split(".")[0] for name in imported}
    assert not top_level & {"capo_verl", "verl", "torch"}
    assert not top_level & {"data", "metrics", "models", "precision", "logs", "reward"}  # the package's own files


# --- threads and time bound -----------------------------------------------------------------------------
def test_runs_in_worker_threads_like_verl():
    """verl calls compute_score from executor threads (no signals there): results stay right and aligned."""
    cases = [(f"\\boxed{{{k / 2}}}", f"\\frac{{{k}}}{{2}}", 1.0) for k in range(1, 25)]
    cases += [(f"\\boxed{{{k}}}", str(k + 1), 0.0) for k in range(1, 25)]
    with ThreadPoolExecutor(max_workers=8) as pool:
        outs = list(pool.map(lambda c: compute_score("t", c[0], c[1]), cases))
    assert [o["score"] for o in outs] == [c[2] for c in cases]


def test_pathological_answer_times_out_cleanly():
    """sympy would expand 9^(9^(9^9)) for ever; the call returns 0.0 within the bound and the pool recovers."""
    compute_score("warm", "\\boxed{1}", "2")  # a worker is up (its ~1 s start-up is not part of the bound)
    start = time.monotonic()
    out = compute_score("patho", "\\boxed{9^{9^{9^{9}}}}", "3^{2}", timeout_s=2.0)
    elapsed = time.monotonic() - start
    assert out == {"score": 0.0, "acc": 0.0, "pred": "9^{9^{9^{9}}}"}
    assert elapsed < 2.0 + 3.0, elapsed
    # the hung worker was killed; the next calls get a fresh one and grade normally
    assert compute_score("after", "\\boxed{1.5}", "\\frac{6}{4}")["score"] == 1.0


def test_pathological_answers_in_threads_stay_bounded():
    """Several hung answers at once from verl-like threads: every call still returns within its bound."""
    n = 3
    started = threading.Barrier(n)

    def call(_):
        started.wait()
        t0 = time.monotonic()
        out = compute_score("patho", "\\boxed{9^{9^{9^{9}}}} ", "3^{2}", timeout_s=1.5)
        return out["score"], time.monotonic() - t0

    with ThreadPoolExecutor(max_workers=n) as pool:
        results = list(pool.map(call, range(n)))
    assert all(score == 0.0 for score, _ in results)
    # queued behind at most pool-size hung calls, each bounded (+ start-up of replacement workers)
    bound = 1.5 * (n // reward._get_pool().size + 1) + reward.STARTUP_TIMEOUT_S
    assert all(elapsed < bound for _, elapsed in results)
    assert max(elapsed for _, elapsed in results) < 30, results


def test_huge_response_is_fast():
    """A 50,000-character degenerate response with 5,000 unclosed boxes: extraction stays linear."""
    text = "\\boxed{" * 5000 + "x" * 15000
    t0 = time.monotonic()
    out = compute_score("t", text, "1")
    assert out["score"] == 0.0
    assert time.monotonic() - t0 < 15
