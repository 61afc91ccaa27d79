"""Teacher-forced scoring (``capo_verl.evaluation.teacher_forced.score_pool``) on CUDA against CPU float64.

Model: ``capo_verl.cpu.models.tiny_model_checkpoint`` (a random Qwen2, 4 layers, width 256, vocabulary 4,096,
``init_std`` 0.1 so that next-token distributions are peaked and the logits large enough for rounding to show) with
its offline tokenizer. Pool: 6 questions x 8 responses, one re-tokenized from text per question, the others token
ids of 8 to 768 tokens, scored in batches of 8 (right padding, as in an evaluation).

Tolerances on the per-response mean log-prob (lpm, nats), against CPU float64:

- CUDA float32: 1e-3. float32 logits over a few layers and a log-softmax differ from float64 by ~1e-6 (1.7e-6 on
  an NVIDIA H200); 1e-3 also holds where a site turns on TF32 matmuls (10-bit mantissa), and is far below the
  differences between checkpoints that the scores rank (tenths of a nat).
- CUDA bf16: 1% of |lpm|. bf16 weights and activations keep 8 significant bits (relative 2^-8 = 0.4% per
  rounding), so an lpm of -10 nats moves by a few hundredths: 0.36% of |lpm| (0.035 nats at -9.6) with bf16 on
  the CPU for this model, 0.013 nats on the H200 with another tiny model. 1% is 2.5x bf16's unit roundoff and
  about 3x the CPU's.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

pytestmark = pytest.mark.gpu

DEVICE = "cuda"
TOLERANCE = {"float32": (1e-3, 0.0), "bfloat16": (0.0, 1e-2)}  # (absolute nats, relative to |lpm|)
QUESTIONS = (
    "What is 2+3?",
    "Natalia sold clips to 48 of her friends in April. How many in May?",
    "A robe takes 2 bolts of blue fiber and half that much white fiber. How many bolts?",
    "What is 7 * 8?",
    "Weng earns $12 an hour for babysitting. How much did she earn?",
    "Betty needs $100 for a wallet. How much more money does she need?",
)
PER_QUESTION, MAX_LENGTH, VOCAB = 8, 768, 4096


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    from capo_verl.cpu.models import tiny_model_checkpoint

    folder = tmp_path_factory.mktemp("tiny")
    tiny_model_checkpoint(folder, vocab_size=VOCAB, hidden_size=256, num_layers=4, init_std=0.1)
    data = folder / "toy.jsonl"
    with open(data, "w") as f:
        for i, q in enumerate(QUESTIONS):
            record = {
                "data_source": "toy",
                "prompt": [{"role": "user", "content": q}],
                "reward_model": {"ground_truth": "x"},
                "extra_info": {"index": i},
            }
            f.write(json.dumps(record) + "\n")
    rng = np.random.default_rng(3)
    pool = []
    for q in range(len(QUESTIONS)):
        for j in range(PER_QUESTION):
            rec = {"data_source": "toy", "question_id": q, "sample_index": j, "correct": bool(rng.random() < 0.5)}
            rec["truncated"] = False
            if j == 0:  # text, re-tokenized with the tokenizer
                rec["response"] = "The answer is " + " ".join(str(int(x)) for x in rng.integers(0, 100, 6))
            else:
                rec["token_ids"] = [int(x) for x in rng.integers(3, VOCAB - 8, int(rng.integers(8, MAX_LENGTH + 1)))]
            pool.append(rec)
    return str(folder), str(data), pool


def score(setup, device: str, dtype: str):
    import copy

    from capo_verl.evaluation import teacher_forced as tf

    folder, data, pool = setup
    info = tf.ScoreInfo(model=folder)
    lpm = tf.score_pool(folder, copy.deepcopy(pool), data=[data], dtype=dtype, batch_size=8, device=device, info=info)
    return lpm, info


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_teacher_forced_lpm_on_cuda_matches_cpu_float64(setup, dtype, record_property):
    from capo_verl.evaluation import teacher_forced as tf

    ref, _ = score(setup, "cpu", "float64")
    lpm, info = score(setup, DEVICE, dtype)
    assert lpm.shape == ref.shape == (len(QUESTIONS) * PER_QUESTION,)
    assert np.isfinite(lpm).all() and info.retokenized == len(QUESTIONS)
    atol, rtol = TOLERANCE[dtype]
    excess = np.abs(lpm - ref) - (atol + rtol * np.abs(ref))
    worst = int(np.argmax(excess))
    used = float(np.max(np.abs(lpm - ref) / (atol + rtol * np.abs(ref))))  # the largest share of its tolerance
    record_property("measured:lpm_diff_over_tolerance", used)  # junit xml: read by device_record.py
    record_property("tolerance:lpm_diff_over_tolerance", 1.0)
    assert excess[worst] <= 0, (
        f"{DEVICE} {dtype}: lpm {lpm[worst]:.6g} vs CPU float64 {ref[worst]:.6g} (response {worst})"
    )
    pool = setup[2]
    keys = tf.question_keys(pool)
    correct = [r["correct"] for r in pool]
    got, want = tf.teacher_forced_metrics(lpm, correct, keys), tf.teacher_forced_metrics(ref, correct, keys)
    assert got["lpm_mean"] == pytest.approx(want["lpm_mean"], abs=atol, rel=rtol)
