"""capo-verl mask-thresholds: the paper's quartile rule (both readings) against hand-computed quartiles, the masked
fractions, the question bootstrap, and the command on an existing pool scored by the tiny random model."""

import json
import math

import numpy as np
import pytest

from capo_verl import mask_thresholds as MT
from capo_verl.cli import main as cli_main
from capo_verl.cpu.models import tiny_model_checkpoint
from capo_verl.evaluation import teacher_forced as TF

# correct responses' PPL_ref 2, 4, 6, 8, 10; incorrect ones' 1, 3, 5, 7, 9
PPL = np.array([2.0, 1.0, 4.0, 3.0, 6.0, 5.0, 8.0, 7.0, 10.0, 9.0])
CORRECT = np.array([True, False] * 5)


def test_per_outcome_rule_by_hand():
    # numpy's linear quantile of 2, 4, 6, 8, 10 at 0.75: position 3 -> 8; of 1, 3, 5, 7, 9 at 0.25: position 1 -> 3
    assert MT.thresholds(PPL, CORRECT, "per-outcome") == (8.0, 3.0)


def test_whole_distribution_rule_by_hand():
    # 1..10 at 0.75: position 6.75 -> 7.75; at 0.25: position 2.25 -> 3.25
    assert MT.thresholds(PPL, CORRECT, "whole") == (7.75, 3.25)


def test_a_missing_outcome_gives_nan_on_its_side_only():
    high, low = MT.thresholds(PPL[CORRECT], CORRECT[CORRECT], "per-outcome")
    assert high == 8.0 and math.isnan(low)


def test_masked_fractions_follow_eq18():
    # correct masked when PPL > ref_high (10 > 8: 1 of 5), incorrect when PPL < ref_low (1 < 3: 1 of 5);
    # a response exactly at a threshold is kept (Eq. 18 keeps <= ref_high and >= ref_low)
    assert MT.masked_fractions(PPL, CORRECT, 8.0, 3.0) == {"correct": 0.2, "incorrect": 0.2, "all": 0.2}
    assert MT.masked_fractions(PPL, CORRECT, 1.5, 9.5) == {"correct": 1.0, "incorrect": 1.0, "all": 1.0}


def test_per_outcome_rule_masks_a_quarter_of_each_outcome():
    rng = np.random.default_rng(0)
    ppl = np.exp(rng.normal(1.5, 0.6, 4000))
    correct = rng.random(4000) < 0.1  # low accuracy: the whole-distribution quartiles follow the incorrect ones
    m = MT.masked_fractions(ppl, correct, *MT.thresholds(ppl, correct, "per-outcome"))
    assert m["correct"] == pytest.approx(0.25, abs=0.01) and m["incorrect"] == pytest.approx(0.25, abs=0.01)


def test_bootstrap_resamples_questions_and_is_seeded():
    questions = np.repeat(np.arange(5), 2)
    a = MT.bootstrap_thresholds(PPL, CORRECT, questions, "per-outcome", n_boot=300, seed=1)
    b = MT.bootstrap_thresholds(PPL, CORRECT, questions, "per-outcome", n_boot=300, seed=1)
    assert a == b
    lo, hi = a["ref_high"]
    assert 2.0 <= lo <= 8.0 <= hi <= 10.0  # quantiles of resampled correct PPLs stay within their range
    # one question holding everything: every resample is the sample itself
    one = MT.bootstrap_thresholds(PPL, CORRECT, np.zeros(10), "whole", n_boot=50)
    assert one == {"ref_high": [7.75, 7.75], "ref_low": [3.25, 3.25]}


def test_unknown_rule_is_refused():
    with pytest.raises(ValueError, match=r"rule='median'.*\bper-outcome, whole\b"):
        MT.thresholds(PPL, CORRECT, "median")


QUESTIONS = ["What is 12 + 5? Answer with the number only.", "What is 18 * 4? Answer with the number only."]
GOLDS = ["17", "72"]
# (question, response, correct as the pool records it): the echo lines were paid by an older reward
POOL = [
    (0, "17", True),
    (0, "The answer is 17.", True),
    (0, "Answer: 12 + 5", True),
    (0, "It is 18", False),
    (1, "72", True),
    (1, "18 * 4", True),
    (1, "It is 70.", False),
    (1, "Answer: 74", False),
]


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    root = tmp_path_factory.mktemp("mt")
    tiny = str(tiny_model_checkpoint(root / "tiny", init_std=0.5))
    data = root / "train.jsonl"
    data.write_text(
        "".join(
            json.dumps(
                {
                    "data_source": "gsm8k_calc",
                    "prompt": [{"role": "user", "content": q}],
                    "reward_model": {"ground_truth": g},
                    "extra_info": {"index": i},
                }
            )
            + "\n"
            for i, (q, g) in enumerate(zip(QUESTIONS, GOLDS, strict=True))
        )
    )
    pool = root / "pool.jsonl"
    pool.write_text(
        "".join(
            json.dumps(
                {
                    "data_source": "gsm8k_calc",
                    "question_id": q,
                    "sample_index": j,
                    "response": text,
                    "correct": correct,
                    "ground_truth": GOLDS[q],
                }
            )
            + "\n"
            for j, (q, text, correct) in enumerate(POOL)
        )
    )
    return tiny, data, pool, root


def test_command_on_an_existing_pool(setup, capsys):
    tiny, data, pool, root = setup
    out = root / "thresholds.json"
    argv = ["mask-thresholds", "--model", tiny, "--data", str(data), "--pool", str(pool), "--n-boot", "200"]
    assert cli_main([*argv, "--out", str(out)]) == 0
    result = json.loads(out.read_text())
    # graded again: the two echoes are incorrect now, whatever the pool recorded
    correct = np.array([True, True, False, False, True, False, False, False])
    assert result["n_correct"] == 3 and result["n_responses"] == 8 and result["n_questions"] == 2
    lpm = TF.score_pool(tiny, TF.read_pool(pool), data=[str(data)], dtype="float32")
    ppl = np.exp(-lpm)
    for rule in MT.RULES:
        high, low = MT.thresholds(ppl, correct, rule)
        got = result["rules"][rule]
        assert got["ref_high"] == pytest.approx(high, rel=1e-9) and got["ref_low"] == pytest.approx(low, rel=1e-9)
        assert got["masked_fraction"] == MT.masked_fractions(ppl, correct, high, low)
    chosen = result["rules"]["per-outcome"]
    assert result["overrides"] == (
        f"algorithm.capo.ref_high={chosen['ref_high']:.3g} algorithm.capo.ref_low={chosen['ref_low']:.3g}"
    )
    printed = capsys.readouterr().out
    assert f"overrides: {result['overrides']}" in printed and "per-outcome (chosen)" in printed
    assert result["command"].startswith("capo-verl mask-thresholds --model")


def test_a_pool_without_a_correct_response_is_refused(setup, tmp_path, capsys):
    tiny, data, _, _ = setup
    pool = tmp_path / "pool.jsonl"
    pool.write_text(
        json.dumps({"data_source": "gsm8k_calc", "question_id": 0, "response": "12 + 5", "correct": True,
                    "ground_truth": "17"}) + "\n"
    )  # fmt: skip
    code = cli_main(
        [
            "mask-thresholds",
            "--model",
            tiny,
            "--data",
            str(data),
            "--pool",
            str(pool),
            "--out",
            str(tmp_path / "t.json"),
        ]
    )
    assert code == 2
    err = capsys.readouterr().err
    assert "0 of 1 " in err and "quartile" in err and "incorrect" in err, err


def test_smollm2_configs_hold_the_committed_thresholds():
    """The SmolLM2 configs take ref_high / ref_low from the command's committed output on the training data."""
    from pathlib import Path

    import yaml

    repo = Path(__file__).resolve().parents[1]
    result = json.loads((repo / "benchmarks/results/thresholds/smollm2_gsm8k_calc_train.json").read_text())
    assert "train" in result["data"] and result["rule"] == "per-outcome"
    chosen = result["rules"]["per-outcome"]
    for name in ("capo_smollm2_135m_cpu.yaml", "compare_smollm2_135m_cpu.yaml"):
        capo = yaml.safe_load((repo / "configs" / name).read_text())["algorithm"]["capo"]
        assert capo["ref_high"] == float(f"{chosen['ref_high']:.3g}"), name
        assert capo["ref_low"] == float(f"{chosen['ref_low']:.3g}"), name
