"""The reward against Qwen's own grader on real Qwen2.5-Math-1.5B responses (MATH-500, 500 greedy responses;
tests/data/qwen25_math_1.5b_math500_greedy.md says where they come from)."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

from capo_verl.reward import compute_score, normalize_answer, stated_value

FIXTURE = Path(__file__).parent / "data" / "qwen25_math_1.5b_math500_greedy.jsonl.gz"


def _rows() -> list[dict]:
    with gzip.open(FIXTURE, "rt") as f:
        return [json.loads(line) for line in f if line.strip()]


def test_agreement_with_qwen_grader_is_at_least_99_percent():
    rows = _rows()
    assert len(rows) == 500
    disagree = [
        (r["idx"], r["answer"], r["pred"], r["score"])
        for r in rows
        if (compute_score("math500", r["response"], r["answer"])["score"] == 1.0) != r["score"]
    ]
    # 3 of 500 at the time of writing: a bold '**3**' this reward does not read (idx 35), and two answers Qwen's
    # grader refuses and this one accepts ('[-2, 7]' for 'x \in [-2,7]', '15' for '15\mbox{ cm}^2')
    assert len(disagree) <= 5, disagree


def test_qwen_accepted_answers_are_values():
    """The value rule takes nothing from a real model that Qwen's grader pays: every answer it accepted, whatever the
    gold's form, is stated as a value (no operation on numbers left undone)."""
    accepted = [r for r in _rows() if r["score"]]
    assert len(accepted) > 250
    assert [r["pred"] for r in accepted if not stated_value(normalize_answer(r["pred"]))[1]] == []
