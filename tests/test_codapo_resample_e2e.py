"""CoDaPO's resampling (``algorithm.codapo.resample: true``) in verl 0.9.1's own trainer on the CPU, tiny model.

One run of 4 steps (4 prompts a step, 4 responses each, ``percentile`` 0.75, ``repeat_count`` 4: the top quarter of a
4-question batch is 1 question, 4 times), checkpoints at steps 2 and 4, every step's generations dumped
(``trainer.rollout_data_dir``). Then the same run resumed with ``trainer.resume_mode=auto`` from its step-2
checkpoint alone (copied, without step 4's: what a run stopped after step 2 leaves). Checked against the authors'
scheme (tmlr-group/CoDaPO@210c2051 ``codapo/ray_trainer.py``, docs/algorithms/codapo.md):

- steps 1 and 3 are prepare steps on fresh loader batches; steps 2 and 4 hold only the questions the step before
  selected (weight >= the 0.75 quantile of its batch's weights, recomputed here from the logged weights), each
  ``repeat_count`` times as its own group;
- ``codapo/*`` metrics at every step;
- the resumed run trains steps 3 and 4 only, step 3 a prepare step on the same fresh batch as the uninterrupted run.
"""

from __future__ import annotations

import json
import re
import shutil
from collections import Counter

import pytest
import torch

pytestmark = pytest.mark.slow

RESAMPLE = (
    "algorithm.adv_estimator=codapo",
    "+algorithm.codapo.resample=true",
    "+algorithm.codapo.percentile=0.75",
    "+algorithm.codapo.repeat_count=4",
    "trainer.total_training_steps=4",
    "trainer.save_freq=2",
    "trainer.test_freq=-1",
)
CODAPO_METRICS = ("codapo/weight_mean", "codapo/weight_max", "codapo/confidence_mean", "codapo/resample_apply_step")


def _dump(workdir, step: int) -> list[dict]:
    """The step's generations: one record per response, ``prompt_uid`` from verl's key ``{uid}_{rollout}_{output}``."""
    rows = [json.loads(line) for line in (workdir / "rollouts" / f"{step}.jsonl").read_text().splitlines()]
    for row in rows:
        row["prompt_uid"] = row["uid"].rsplit("_", 2)[0]
    return rows


def _selections(log: str) -> dict[int, dict]:
    """The prepare steps' logged weights and selection, by step."""
    out = {}
    for match in re.finditer(r"capo-verl codapo resampling (\{.*\})", log):
        record = json.loads(match.group(1))
        out[record["step"]] = record
    return out


def _check_prepare_apply(workdir, log: str, prepare: int) -> list[str]:
    """Steps ``prepare`` and ``prepare + 1`` of a run follow the authors' scheme; returns the prepare step's prompts."""
    first, second = _dump(workdir, prepare), _dump(workdir, prepare + 1)
    # prepare: 4 questions, 4 responses each, one uid per question
    by_uid = {}
    for row in first:
        by_uid.setdefault(row["prompt_uid"], set()).add(row["input"])
    assert len(by_uid) == 4 and all(len(texts) == 1 for texts in by_uid.values()), by_uid
    assert Counter(row["prompt_uid"] for row in first) == dict.fromkeys(by_uid, 4)
    text_of = {uid: next(iter(texts)) for uid, texts in by_uid.items()}
    assert len(set(text_of.values())) == 4

    record = _selections(log)[prepare]
    assert set(record["weights"]) == set(text_of)
    weights = record["weights"]
    # a question every response got right (or wrong) has weight exactly the offset, 0.1; a mixed one more
    for uid in text_of:
        scores = {row["score"] for row in first if row["prompt_uid"] == uid}
        if len(scores) == 1:
            assert weights[uid] == pytest.approx(0.1, abs=1e-6)
        else:
            assert weights[uid] > 0.1
    threshold = torch.quantile(torch.tensor(list(weights.values())), 0.75).item()
    expected = [uid for uid, w in weights.items() if w >= threshold]
    assert record["selected"] == expected
    # apply: the first selected question (4 rows = 1 question x repeat_count 4), each row its own group of 4
    assert record["apply_rows"] == [expected[0]] * 4
    assert {row["input"] for row in second} == {text_of[expected[0]]}
    groups = Counter(row["prompt_uid"] for row in second)
    assert len(groups) == 4 and set(groups.values()) == {4} and not set(groups) & set(text_of)
    return sorted(text_of.values())


def test_resampling_runs_prepare_and_apply_steps_and_resumes_with_a_prepare_step(run_verl, tmp_path):
    workdir = tmp_path / "codapo_resample"
    run = run_verl(workdir, [*RESAMPLE, f"trainer.rollout_data_dir={workdir / 'rollouts'}"])
    assert run.rc == 0, run.tail()
    # 16 training prompts, 4 a batch: 4 loader batches, 8 steps per epoch (the authors' DuplicateBatchDataLoader)
    assert re.search(r"CoDaPO resampling on \(.*0\.75.*repeat_count 4", run.log)
    assert re.search(r"\b8 steps per epoch, 4 training steps", run.log)
    assert sorted(run.steps) == [1, 2, 3, 4]
    for step, metrics in run.steps.items():
        assert all(key in metrics for key in CODAPO_METRICS), (step, sorted(metrics))
        assert metrics["codapo/resample_apply_step"] == float(step % 2 == 0)
    assert run.steps[1]["codapo/selected_questions"] >= 1 and "codapo/selected_questions" not in run.steps[2]

    batch_1 = _check_prepare_apply(workdir, run.log, 1)
    batch_2 = _check_prepare_apply(workdir, run.log, 3)
    assert not set(batch_1) & set(batch_2)  # step 3: a fresh loader batch (16 prompts, shuffled, no repeats)

    # resumed from the step-2 checkpoint alone: steps 3 and 4 only, step 3 the same fresh batch as above
    resumed_dir = tmp_path / "codapo_resumed"
    ckpt = resumed_dir / "ckpt"
    shutil.copytree(workdir / "ckpt", ckpt)
    shutil.rmtree(ckpt / "global_step_4")
    (ckpt / "latest_checkpointed_iteration.txt").write_text("2")
    resumed = run_verl(
        resumed_dir, [*RESAMPLE, "trainer.resume_mode=auto", f"trainer.rollout_data_dir={resumed_dir / 'rollouts'}"]
    )
    assert resumed.rc == 0, resumed.tail()
    assert sorted(resumed.steps) == [3, 4]  # no step trained twice
    assert [resumed.steps[s]["codapo/resample_apply_step"] for s in (3, 4)] == [0.0, 1.0]
    assert sorted((resumed_dir / "rollouts").glob("*.jsonl")) == [
        resumed_dir / "rollouts" / f"{s}.jsonl" for s in (3, 4)
    ]
    assert _check_prepare_apply(resumed_dir, resumed.log, 3) == batch_2
