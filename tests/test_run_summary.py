"""The end of a run (capo_verl/compat/run_summary.py) and the warning when nothing trains
(capo_verl/compat/advantage.py ``watch_rewards``), without starting verl's trainer."""

from __future__ import annotations

import logging
import struct
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from capo_verl.compat import advantage, run_summary


@pytest.fixture
def history(monkeypatch):
    rows = [
        (0, {"val-core/gsm8k/acc/mean@4": 0.25, "val-calib/gsm8k/auc_mean": 0.5}),
        (1, {"critic/rewards/mean": 0.2, "capo/mask_frac_incorrect": 0.1, "actor/pg_clipfrac": 0.0}),
        (2, {"critic/rewards/mean": 0.4, "capo/mask_frac_incorrect": 0.3, "actor/pg_clipfrac": 0.02}),
        (2, {"val-core/gsm8k/acc/mean@4": 0.5, "val-calib/gsm8k/auc_mean": 0.75}),
    ]
    monkeypatch.setattr(run_summary, "HISTORY", rows)
    return rows


def config(tmp_path, logger=("console", "file")):
    return OmegaConf.create(
        {
            "algorithm": {"adv_estimator": "capo"},
            "trainer": {
                "total_training_steps": 2,
                "default_local_dir": str(tmp_path / "ckpt"),
                "logger": list(logger),
                "project_name": "p",
                "experiment_name": "e",
            },
        }
    )


def block_lines(text: str) -> dict[str, str]:
    return dict(line.strip().split(": ", 1) for line in text.splitlines()[1:])


def test_the_summary_gives_first_and_last_validation_the_estimators_numbers_and_the_resume(
    history, tmp_path, monkeypatch
):
    monkeypatch.setenv(run_summary.COMMAND_ENV, "python -m verl.trainer.main_ppo a=1")
    monkeypatch.setenv("VERL_FILE_LOGGER_PATH", str(tmp_path / "m.jsonl"))
    cfg = config(tmp_path)
    lines = block_lines(run_summary.summary(cfg, 12.0, 2, tmp_path / "ckpt" / "curves.png"))
    assert lines["steps"] == "2 of 2 in 12 s"
    assert "0.2500 (step 0) -> 0.5000 (step 2)" in lines["validation accuracy"]
    assert "0.5000 (step 0) -> 0.7500 (step 2)" in lines["val-calib AUC-mean"]
    for line in (lines["validation accuracy"], lines["val-calib AUC-mean"]):  # counts not logged: not judged
        assert "not logged" in line and "too few" not in line
    mask = next(v for k, v in lines.items() if k.startswith("capo mask, share of incorrect"))
    assert mask.startswith("0.2000 over 2 steps")
    assert lines["clip fraction (actor/pg_clipfrac)"].startswith("0.0100 over 2 steps")
    assert lines["last checkpoint"].startswith("none written")  # no checkpoint: no resume hint
    assert "resume" not in lines
    assert lines["metrics file"] == str(tmp_path / "m.jsonl")
    step = tmp_path / "ckpt" / "global_step_2"
    step.mkdir(parents=True)
    (tmp_path / "ckpt" / "latest_checkpointed_iteration.txt").write_text("2")
    lines = block_lines(run_summary.summary(cfg, 12.0, 2, None))
    assert lines["last checkpoint"] == str(step)
    assert lines["resume"] == "python -m verl.trainer.main_ppo a=1 trainer.resume_mode=auto"
    lines = block_lines(run_summary.summary(config(tmp_path, ("console",)), 1.0, 2, None))
    assert lines["metrics file"].startswith("none")


@pytest.mark.parametrize(("questions", "mixed", "few_acc", "few_auc"), [(16, 2, True, True), (580, 300, False, False)])
def test_each_change_names_the_questions_it_rests_on_and_says_when_they_are_too_few(
    questions, mixed, few_acc, few_auc, monkeypatch, tmp_path
):
    counts = {"val-calib/openai/gsm8k/n_questions": questions, "val-calib/openai/gsm8k/n_mixed": mixed}
    rows = [
        (0, {"val-core/openai/gsm8k/acc/mean@4": 0.1, "val-calib/openai/gsm8k/auc_mean": 0.5, **counts}),
        (6, {"val-core/openai/gsm8k/acc/mean@4": 0.03, "val-calib/openai/gsm8k/auc_mean": 1.0, **counts}),
    ]
    rows[0][1]["val-calib/openai/gsm8k/n_mixed"] = mixed - 1
    monkeypatch.setattr(run_summary, "HISTORY", rows)
    lines = block_lines(run_summary.summary(config(tmp_path), 1.0, 6, None))
    accuracy, auc = lines["validation accuracy"], lines["val-calib AUC-mean"]
    assert f"{questions} questions" in accuracy and f"{mixed - 1} -> {mixed} mixed" in auc and f"of {questions}" in auc
    assert ("too few" in accuracy, "too few" in auc) == (few_acc, few_auc)
    assert (run_summary.LONGER_RUN in accuracy, run_summary.LONGER_RUN in auc) == (few_acc, few_auc)
    assert (Path(__file__).parents[1] / run_summary.LONGER_RUN).is_file()
    assert run_summary.MIN_QUESTIONS > questions if few_acc else run_summary.MIN_QUESTIONS <= questions


def test_the_validation_logs_the_counts_the_summary_reads():
    from capo_verl.compat.validation import LPM_KEY, validation_calibration_metrics

    # q1 mixed, q2 all correct, q3's only incorrect answer has no lpm (not mixed), source b one question
    acc = [1.0, 0.0, 1.0, 1.0, 1.0, 0.0, 1.0]
    lpm = [-1.0, -2.0, -1.0, -1.0, -1.0, None, -1.0]
    sources, uids = ["a/x"] * 6 + ["b"], ["q1", "q1", "q2", "q2", "q3", "q3", "q4"]
    m = validation_calibration_metrics(sources, uids, {"acc": acc, LPM_KEY: lpm})
    assert (m["val-calib/a/x/n_questions"], m["val-calib/a/x/n_mixed"]) == (3, 1)
    assert (m["val-calib/b/n_questions"], m["val-calib/b/n_mixed"]) == (1, 0)


def test_the_summarys_mixed_question_floor_is_compares():
    from capo_verl.compare.statistics import MIN_MIXED_QUESTIONS

    assert run_summary.MIN_MIXED == MIN_MIXED_QUESTIONS


def test_the_curves_png_has_its_panels(history, tmp_path):
    path = run_summary.write_curves(tmp_path / "ckpt")
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    width, height = struct.unpack(">II", data[16:24])
    assert width > height > 300  # 3 x 2 panels


def test_the_dataloader_workers_are_stopped_before_the_run_ends():
    import torch
    from torch.utils.data import DataLoader

    class Trainer:
        pass

    trainer = Trainer()
    trainer.train_dataloader_it = iter(DataLoader(list(range(64)), batch_size=2, num_workers=2))
    next(trainer.train_dataloader_it)
    workers = list(trainer.train_dataloader_it._workers)
    assert all(w.is_alive() for w in workers)
    assert run_summary.stop_dataloader_workers(trainer) is True
    assert trainer.train_dataloader_it is None and not any(w.is_alive() for w in workers)
    assert run_summary.stop_dataloader_workers(trainer) is False
    del torch


def test_a_run_where_every_reward_is_the_same_is_warned_once(monkeypatch, caplog):
    monkeypatch.setattr(advantage, "_reward_watch", {"seen": set(), "calls": 0, "done": False})
    caplog.set_level(logging.WARNING, logger="capo_verl")
    assert [advantage.watch_rewards([0.0] * 8) for _ in range(advantage.WATCHED_STEPS + 2)] == [
        False,
        False,
        True,
        False,
        False,
    ]
    [record] = [r for r in caplog.records if "every advantage is 0" in r.getMessage()]
    assert "reward_model.ground_truth" in record.getMessage()
    monkeypatch.setattr(advantage, "_reward_watch", {"seen": set(), "calls": 0, "done": False})
    assert not any(advantage.watch_rewards(r) for r in ([0.0] * 4, [0.0, 1.0], [0.0] * 4, [1.0] * 4))
