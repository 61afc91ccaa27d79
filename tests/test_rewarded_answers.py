"""benchmarks/rewarded_answers.py: the counts on a hand-written dump, and on pilot 2's committed dumps."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import numpy as np
import pytest

from capo_verl.compare.report import read_validation_pass

REPO = Path(__file__).resolve().parents[1]
PILOT2 = REPO / "benchmarks" / "results" / "compare_pilot2_cpu" / "pilot"
MAIN = REPO / "benchmarks" / "results" / "compare_main_cpu"


@pytest.fixture(scope="module")
def ra(load_benchmark):
    return load_benchmark("rewarded_answers")


def _row(output, pred, acc):
    question = "system\nuser\nWhat is 48 + 22? Answer with the number only.\nassistant\n"
    return {"input": question, "output": output, "gts": "70", "pred": pred, "acc": acc, "score": acc, "lpm": -0.1}


ROWS = [
    _row("48 + 22 = 70", "70", 1.0),
    _row("48 + 22 is 60, no: 48 + 22 equals 70.", "70", 1.0),  # 60 is neither an operand nor the gold
    _row("70", "70", 1.0),
    _row("48 + 22", "48 + 22", 0.0),
    _row("48 + 22 = 71", "71", 0.0),
]


@pytest.mark.parametrize("gz", [False, True])
def test_counts_on_a_hand_written_dump(ra, tmp_path, gz):
    d = tmp_path / "seed3" / "grpo" / "val_generations"
    d.mkdir(parents=True)
    text = "".join(json.dumps(r) + "\n" for r in ROWS)
    if gz:
        with gzip.open(d / "30.jsonl.gz", "wt") as f:
            f.write(text)
    else:
        (d / "30.jsonl").write_text(text)
    r = ra.read_unit(ra.validation_dump(d, 30))
    assert (r["n"], r["correct"]) == (5, 3)
    assert r["accuracy"] == pytest.approx(0.6)
    assert r["plain"] == 1.0
    assert r["states"] == pytest.approx(2 / 3)  # the bare "70" states no calculation
    assert r["other"] == pytest.approx(1 / 3)  # the 60 of the second; the unpaid "71" is not counted
    assert r["answers"] == {"70": 3}
    assert r["shapes"] == {"N + N = N": 1, "N + N is N, no: N + N equals N.": 1, "N": 1}
    text = ra.report(tmp_path, 30, top=2)
    assert "| seed3/grpo | 5 | 3 | 0.600 | 1.000 | 0.667 | 0.333 | `70` (3) |" in text


def test_an_unpaid_expression_is_not_plain_and_a_paid_one_would_be_counted(ra):
    rows = [_row("Answer: 12 + 5", "12 + 5", 1.0), _row("12 + 5 = 17", "17", 1.0)]
    assert ra.PLAIN.match("17") and not ra.PLAIN.match("12 + 5")
    assert [bool(ra.STATES.search(r["output"])) for r in rows] == [False, True]


def test_a_calculation_is_stated_with_the_operator_as_a_symbol_or_in_words(ra):
    stated = [
        "48 + 22 = 70",
        "84 divided by 12 equals 7.",
        "6 times 7 equal 42",
        "9 minus 4 is 5",
        "3 x 4 = 12",
        "20 multiplied by 3 is 60",
        "7 plus 8 equals 15",
    ]
    bare = ["70", "The answer is 70.", "48 and 22 make 70", "divided by 12 equals 7"]
    assert all(ra.STATES.search(t) for t in stated)
    assert not any(ra.STATES.search(t) for t in bare)


def test_not_a_dump_and_no_unit_are_refused(ra, tmp_path):
    d = tmp_path / "seed0" / "capo" / "val_generations"
    d.mkdir(parents=True)
    (d / "30.jsonl").write_text(json.dumps({"response": "x", "correct": True}) + "\n")
    with pytest.raises(ValueError, match="not a verl validation dump"):
        ra.read_unit(d / "30.jsonl")
    with pytest.raises(FileNotFoundError, match="val_generations/7"):
        ra.report(tmp_path, 7, top=1)


def test_pilot2_paid_only_plain_numbers_and_its_accuracy_is_the_dump_reader_s(ra):
    found = ra.units(PILOT2, 30)
    assert [name for name, _ in found] == [f"seed{s}/{m}" for s in range(3) for m in ("capo", "grpo")]
    for _, path in found:
        r = ra.read_unit(path)
        vp = read_validation_pass(path)
        assert r["n"] == sum(len(c) for c in vp.correct) == 2048
        assert r["accuracy"] == pytest.approx(float(np.mean(np.concatenate(vp.correct))))
        assert r["plain"] == 1.0  # the solving-only reward pays plain numbers only (pilot 2's page: no echo)
        assert r["other"] < 0.01  # trained 30 steps, the paid responses hold no wrong value before the paid one


def test_the_base_models_paid_responses_with_another_number(ra, tmp_path):
    """The main run's base-model step-0 pass (GRPO seed 3's first start): of its 818 paid responses, 88 hold a number
    that is neither an operand nor the gold, such as ``36 - 30 = 6\n36 - 0 = 6``; the base model, not a trained one,
    writes them."""
    unit = tmp_path / "seed3" / "grpo"
    unit.parent.mkdir()
    unit.symlink_to(MAIN / "units" / "failed" / "seed3_grpo_attempt1", target_is_directory=True)
    [(name, path)] = ra.units(tmp_path, 0)
    r = ra.read_unit(path)
    assert (name, r["n"], r["correct"]) == ("seed3/grpo", 9280, 818)
    assert r["other"] * r["correct"] == pytest.approx(88)
