"""Teacher-forced scoring of a fixed pool (capo_verl.evaluation.teacher_forced), on the tiny random model.

score_pool's lpm is checked against an independent forward pass over each unpadded sequence; the metric against a
hand-computed AUC-mean; the command line for its JSON and its one-line refusals.
"""

import json

import numpy as np
import pytest
import torch

from capo_verl.cpu.models import tiny_model_checkpoint
from capo_verl.evaluation import teacher_forced as TF
from capo_verl.evaluation import teacher_forced_cli as CLI

PREFIX = "capo-verl eval teacher-forced: error: "

QUESTIONS = [
    "What is 2+3?",
    "Natalia sold clips to 48 of her friends in April, and then she sold half as many clips in May. How many?",
    "A robe takes 2 bolts of blue fiber and half that much white fiber. How many bolts in total does it take?",
]
RESPONSES = [  # (question, response text, correct, truncated, save token ids)
    (0, "The answer is 5.", True, False, True),
    (0, "2 plus 3 makes 6", False, False, False),
    (0, "5", True, True, False),
    (1, "She sold 48/2 = 24 clips in May, so 48+24 = 72 clips in total.", True, False, True),
    (1, "72", True, False, False),
    (1, "In April 48, in May 96, so 144 altogether, which is the total number of clips", False, True, True),
    (2, "It takes 2 + 1 = 3 bolts.", True, False, False),
    (2, "4 bolts", False, False, True),
    (2, "Half of 2 is 1 so the robe takes 2 bolts", False, False, False),
]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return str(tiny_model_checkpoint(tmp_path_factory.mktemp("tiny"), init_std=0.5))


@pytest.fixture(scope="module")
def tokenizer(tiny):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny)


@pytest.fixture(scope="module")
def data_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("data") / "toy.jsonl"
    rows = [
        {
            "data_source": "toy",
            "prompt": [{"role": "user", "content": q}],
            "reward_model": {"ground_truth": "x"},
            "extra_info": {"index": i},
        }
        for i, q in enumerate(QUESTIONS)
    ]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def response_ids(tokenizer, text, truncated):
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    return ids if truncated else [*ids, tokenizer.eos_token_id]


@pytest.fixture(scope="module")
def pool_file(tmp_path_factory, tokenizer):
    """Lines as `capo-verl eval generate` writes them; a few with --save-token-ids' token_ids."""
    path = tmp_path_factory.mktemp("pool") / "pool.jsonl"
    index: dict[int, int] = {}
    lines = []
    for q, text, correct, truncated, save in RESPONSES:
        j = index[q] = index.get(q, -1) + 1
        ids = response_ids(tokenizer, text, truncated)
        rec = {
            "data_source": "toy",
            "question_id": q,
            "sample_index": j,
            "response": text,
            "answer": "",
            "correct": correct,
            "lpm": -1.0 - 0.1 * len(lines),
            "num_tokens": len(ids),
            "truncated": truncated,
            "ground_truth": "x",
        }
        if save:
            rec["token_ids"] = ids
        lines.append(json.dumps(rec) + "\n")
    path.write_text("".join(lines))
    return path


def reference_lpm(model_dir, tokenizer):
    """A plain transformers forward pass per unpadded (prompt + response) sequence: log_softmax, gather, mean."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    out = []
    for q, text, _, truncated, _ in RESPONSES:
        chat = tokenizer.apply_chat_template(
            [{"role": "user", "content": QUESTIONS[q]}], add_generation_prompt=True, tokenize=False
        )
        prompt = tokenizer(chat, add_special_tokens=False)["input_ids"]
        resp = response_ids(tokenizer, text, truncated)
        seq = torch.tensor([prompt + resp])
        with torch.no_grad():
            logp = torch.log_softmax(model(seq).logits[0].float(), dim=-1)
        p, n = len(prompt), len(resp)
        out.append(logp[p - 1 : p + n - 1].gather(-1, seq[0, p:, None]).mean().item())
    return np.array(out)


def test_score_pool_matches_an_unpadded_forward_pass(tiny, tokenizer, data_file, pool_file):
    ref = reference_lpm(tiny, tokenizer)
    lengths = {len(response_ids(tokenizer, t, tr)) for _, t, _, tr, _ in RESPONSES}
    assert len(lengths) > 3  # batches mix lengths, so rows are padded
    info = TF.ScoreInfo(model=tiny)
    lpm4 = TF.score_pool(tiny, pool_file, data=[data_file], batch_size=4, info=info)
    lpm1 = TF.score_pool(tiny, pool_file, data=[data_file], batch_size=1)
    assert lpm4.dtype == np.float64 and lpm4.shape == (len(RESPONSES),)
    np.testing.assert_allclose(lpm4, ref, rtol=0, atol=2e-5)
    np.testing.assert_allclose(lpm1, ref, rtol=0, atol=2e-5)
    assert (lpm4 < 0).all() and np.ptp(lpm4) > 0.1  # peaked random model: responses differ visibly
    assert info.from_token_ids == 4 and info.retokenized == 5 and info.retokenized_count_mismatch == 0


def test_teacher_forced_metrics_hand_computed():
    # q1: correct -1, -3 vs incorrect -2 -> pairs (1, 0) -> 0.5; q2: correct -0.5 vs incorrect -1, -0.5 -> (1 + 1/2)
    # / 2 = 0.75; q3: all correct, not mixed; the NaN response is left out. AUC-mean = (0.5 + 0.75) / 2.
    lpm = [-1.0, -3.0, -2.0, -0.5, -1.0, -0.5, -0.2, -0.4, float("nan")]
    correct = [1, 1, 0, 1, 0, 0, 1, 1, 0]
    qid = ["q1", "q1", "q1", "q2", "q2", "q2", "q3", "q3", "q3"]
    m = TF.teacher_forced_metrics(lpm, correct, qid)
    assert m["auc_mean"] == pytest.approx(0.625)
    assert m["n_mixed_questions"] == 2 and m["n_questions"] == 3
    assert m["n_responses"] == 8 and m["n_dropped"] == 1
    assert m["lpm_correct_mean"] == pytest.approx((-1 - 3 - 0.5 - 0.2 - 0.4) / 5)
    assert m["lpm_incorrect_mean"] == pytest.approx((-2 - 1 - 0.5) / 3)
    with pytest.raises(ValueError, match="same length"):
        TF.teacher_forced_metrics([-1.0], [True, False], ["a", "a"])


def test_cli_writes_metrics_and_lpm_per_model(tiny, data_file, pool_file, tmp_path, capsys):
    out = tmp_path / "tf.json"
    argv = ["--pool", str(pool_file), "--data", str(data_file), "--model", f"a={tiny}", f"b={tiny}"]
    assert CLI.main([*argv, "--out", str(out), "--batch-size", "3", "--threads", "1"]) == 0
    result = json.loads(out.read_text())
    assert result["n_responses"] == len(RESPONSES) and result["n_questions"] == 3
    assert list(result["models"]) == ["a", "b"]
    expected = TF.score_pool(tiny, pool_file, data=[data_file], batch_size=3)
    keys = TF.question_keys(TF.read_pool(pool_file))
    correct = [c for _, _, c, _, _ in RESPONSES]
    for entry in result["models"].values():
        lpm = np.load(entry["lpm_file"])
        np.testing.assert_allclose(lpm, expected, rtol=0, atol=1e-6)
        want = TF.teacher_forced_metrics(lpm, correct, keys)
        assert entry["metrics"]["auc_mean"] == pytest.approx(want["auc_mean"])
        assert entry["metrics"]["n_mixed_questions"] == 3
        assert entry["by_data_source"]["toy"]["auc_mean"] == pytest.approx(want["auc_mean"])
    assert result["pool_metrics"]["n_mixed_questions"] == 3  # the pool's own sampling-time lpm, for reference
    assert CLI.build_parser().prog == "capo-verl eval teacher-forced"


def one_error_line(capsys):
    err = capsys.readouterr().err
    assert "Traceback" not in err
    lines = [line for line in err.splitlines() if line.startswith("capo-verl eval")]
    assert len(lines) == 1, err
    assert lines[0].startswith(PREFIX)
    return lines[0]


@pytest.mark.parametrize(
    "case, message",
    [
        ("missing", "no such pool file"),
        ("empty", "the pool is empty"),
        ("no_correct", "no `correct` field"),
        ("too_long", "exceed the context"),
    ],
)
def test_cli_refuses_a_bad_pool_in_one_line(case, message, tiny, data_file, pool_file, tmp_path, capsys):
    pool = tmp_path / "pool.jsonl"
    lines = pool_file.read_text().splitlines()
    if case == "empty":
        pool.write_text("\n")
    elif case == "no_correct":
        rec = json.loads(lines[0])
        del rec["correct"]
        pool.write_text("\n".join([*lines[:2], json.dumps(rec)]) + "\n")
    elif case == "too_long":
        rec = json.loads(lines[0])
        rec["token_ids"] = [5] * 1100  # the tiny model's context is 1024 tokens
        pool.write_text("\n".join([*lines[:2], json.dumps(rec)]) + "\n")
    out = tmp_path / "tf.json"
    argv = ["--pool", str(pool), "--data", str(data_file), "--model", tiny, "--out", str(out)]
    assert CLI.main(argv) == 2
    line = one_error_line(capsys)
    assert message in line
    if case == "too_long":
        assert "pool.jsonl:3" in line or "pool line 3" in line
    assert not out.exists()


def test_cli_refuses_a_question_missing_from_the_data(tiny, pool_file, tmp_path, capsys):
    other = tmp_path / "other.jsonl"
    other.write_text(
        json.dumps({"data_source": "toy", "prompt": "1+1?", "reward_model": {"ground_truth": "2"}, "extra_info": {}})
        + "\n"
    )
    assert CLI.main(["--pool", str(pool_file), "--data", str(other), "--model", tiny, "--out", "x.json"]) == 2
    assert "is not in the given data" in one_error_line(capsys)


def test_capo_verl_eval_mounts_teacher_forced(tmp_path, capsys):
    from capo_verl.evaluation.cli import main as eval_main

    assert (
        eval_main(
            [
                "teacher-forced",
                "--pool",
                str(tmp_path / "none.jsonl"),
                "--model",
                "m",
                "--out",
                str(tmp_path / "o.json"),
            ]
        )
        == 2
    )
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("capo-verl eval teacher-forced: error: "), err
    assert "pool file" in err[0] and "none.jsonl" in err[0] and "capo-verl eval generate" in err[0]
