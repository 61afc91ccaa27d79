"""``capo-verl compare --seeds 0,1`` end to end on the tiny model: two training seeds x GRPO and CAPO through verl's
trainer (four launches under capo_verl.cpu.launch), per-seed reports and the summary across seeds.

CI-sized: 2 steps of 4 prompts x 4 samples, 16 validation questions x 4 samples at steps 0 and 2, the parity reward
of tests/conftest.py (half of random text is "correct", so questions are mixed and AUC-mean is defined), and the
teacher-forced pool (``--teacher-forced 2``: 2 base-model responses per validation question, scored with the base
model and the checkpoints of steps 1 and 2 of every run).
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys

import numpy as np
import pytest

from capo_verl.compare.outdir import last_checkpoint
from capo_verl.evaluation.teacher_forced import read_pool

pytestmark = [pytest.mark.slow, pytest.mark.timeout(2400)]


def test_compare_two_seeds_pairs_the_methods_by_seed(e2e_inputs, tmp_path, failure_excerpt):
    out = tmp_path / "cmp"
    cmd = [
        sys.executable, "-m", "capo_verl.compare",
        "--methods", "grpo", "capo",
        "--seeds", "0,1",
        "--steps", "2",
        "--val-questions", "16",
        "--data-dir", str(tmp_path / "data"),
        "--no-eval",
        "--teacher-forced", "2",
        "--n-boot", "200",
        "--out", str(out),
        f"actor_rollout_ref.model.path={e2e_inputs.model}",
        f"reward.custom_reward_function.path={e2e_inputs.reward}",
        "reward.custom_reward_function.name=parity_reward",
        "data.train_batch_size=4",
        "data.max_response_length=16",
        "actor_rollout_ref.actor.ppo_mini_batch_size=4",
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=16",
        "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=16",
        "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=16",
        "actor_rollout_ref.rollout.n=4",
        "actor_rollout_ref.rollout.val_kwargs.n=4",
        "actor_rollout_ref.actor.optim.lr=1e-3",
        "trainer.test_freq=2",
        "trainer.save_freq=1",
        "actor_rollout_ref.actor.checkpoint.save_contents=[model,optimizer,extra,hf_model]",
        "algorithm.capo.ref_high=4.0",
        "algorithm.capo.ref_low=4.0",
    ]  # fmt: skip
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=2200, stdin=subprocess.DEVNULL)
    assert proc.returncode == 0, failure_excerpt(proc, sorted(out.rglob("train.log")))

    pool = read_pool(out / "teacher_forced" / "pool.jsonl")
    assert len(pool) == 16 * 2 and all(r["token_ids"] for r in pool)
    base = json.loads((out / "teacher_forced" / "step0.json").read_text())
    assert base["models"]["step0"]["tokens"]["from_token_ids"] == 32 and base["settings"]["dtype"] == "float32"
    base_lpm = np.load(out / "teacher_forced" / "step0.0.npy")
    assert base_lpm.shape == (32,) and np.isfinite(base_lpm).all() and (base_lpm < 0).all()
    for k in (0, 1):
        for method in ("grpo", "capo"):
            run = out / f"seed{k}" / method
            for step in (1, 2):  # every checkpoint scores the same pool; training moved the lpm
                lpm = np.load(run / "teacher_forced" / f"step{step}.0.npy")
                assert lpm.shape == (32,) and np.isfinite(lpm).all() and not np.allclose(lpm, base_lpm)
            assert json.loads((run / "teacher_forced" / "scored.json").read_text()) == {"steps": [1, 2]}
            assert list(run.rglob("*.pt")) == []  # pruned to the Hugging Face weights, which stay
            assert len(list(run.glob("ckpt/global_step_*/actor/huggingface/*.safetensors"))) == 2
            done = json.loads((run / "done.json").read_text())
            assert done["code"]["commit"] and done["settings"]["teacher_forced"] == 2
            composed = done["settings"]["composed"]
            assert composed["data"]["seed"] == k and composed["actor_rollout_ref"]["rollout"]["seed"] == k
            assert [a["start_step"] for a in done["attempts"]] == [0]
            assert last_checkpoint(run) == 2
            assert sorted(p.stem for p in (run / "val_generations").glob("*.jsonl")) == ["0", "2"]
        assert (out / f"seed{k}" / "summary.json").exists()
    summary_file = out / "seeds_summary.json"
    summary = json.loads(summary_file.read_text())
    assert summary["seeds"] == [0, 1] and summary["n_questions"] == 16
    diff = summary["differences"]["capo - grpo"]["auc_mean"]["last"]
    assert len(diff["per_seed"]) == 2 and diff["t_interval"]["n_seeds"] == 2
    assert diff["t_interval"]["low"] <= diff["t_interval"]["mean"] <= diff["t_interval"]["high"]
    assert "across 2 training seed(s): 0, 1" in proc.stdout
    assert "bootstrap (seeds, then questions; 200 resamples)" in proc.stdout

    # the finished units' small outputs on another machine (no checkpoints): the same command goes on without
    # training or scoring anything again
    for run in out.glob("seed*/*/ckpt"):
        shutil.rmtree(run)
    again = subprocess.run(cmd, capture_output=True, text=True, timeout=600, stdin=subprocess.DEVNULL)
    assert again.returncode == 0, (again.stdout[-3000:], again.stderr[-3000:])
    # compare's progress goes to the capo_verl logger (stderr); its products (the summaries) to stdout
    assert again.stderr.count("not trained again") == 4 and again.stderr.count("not scored again") == 4
    diffs = [json.dumps(s["differences"], sort_keys=True) for s in (summary, json.loads(summary_file.read_text()))]
    assert diffs[0] == diffs[1]  # the same summary (compared as text: an undefined value is NaN)
