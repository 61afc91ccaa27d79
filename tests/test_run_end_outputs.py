"""What a run leaves at its end and on resume (capo_verl/compat/run_summary.py): verl's metrics file keeps the earlier
steps when a run resumes, the summary and the curves cover every step, and a failure to write the curves or the
summary is one warning line, never a failed run. And before a run: the CPU data folder (``CAPO_CPU_DATA_DIR``) that
cannot be written is one line naming it and the fix (capo_verl/data.py).

Fast: verl's own ``FileLogger`` (patched as in a run) and a stand-in trainer whose ``fit`` is wrapped by the same
patch as verl's ``PPOTrainer.fit``; the slow check on verl's trainer is in tests/test_stop_resume.py.
"""

from __future__ import annotations

import json
import logging
import types

import pytest
from omegaconf import OmegaConf

from capo_verl.compat import run_summary


def lines(path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


@pytest.fixture
def metrics(tmp_path, monkeypatch):
    path = tmp_path / "metrics.jsonl"
    monkeypatch.setenv("VERL_FILE_LOGGER_PATH", str(path))
    monkeypatch.setattr(run_summary, "HISTORY", [])
    monkeypatch.setattr(run_summary, "RESUMED", {"step": 0})
    return path


def earlier_run(path, steps=(0, 1, 2, 3), partial=True) -> None:
    """A metrics file as an earlier run left it: a line a step (step 0: the validation before training), and the
    start of a line it was killed writing."""
    text = "".join(
        json.dumps({"step": s, "data": {"critic/rewards/mean": s / 10, "timing_s/step": 1.0}}) + "\n" for s in steps
    )
    path.write_text(text + ('{"step": 4, "data": {"crit' if partial else ""))


def test_verls_file_logger_keeps_the_steps_up_to_the_resumed_checkpoint(metrics):
    from verl.utils.tracking import FileLogger

    assert hasattr(FileLogger.__init__, "__wrapped__"), "the patch is installed with verl"
    earlier_run(metrics)
    run_summary.RESUMED["step"] = 2
    logger = FileLogger("p", "e")
    logger.log({"critic/rewards/mean": 0.9}, 3)
    logger.finish()
    assert [r["step"] for r in lines(metrics)] == [0, 1, 2, 3]  # step 3 trained again, the partial line gone
    assert lines(metrics)[-1]["data"] == {"critic/rewards/mean": 0.9}


def test_a_run_from_the_model_starts_the_metrics_file_afresh_as_verl_does(metrics):
    from verl.utils.tracking import FileLogger

    earlier_run(metrics)
    logger = FileLogger("p", "e")
    logger.log({"critic/rewards/mean": 0.5}, 1)
    logger.finish()
    assert [r["step"] for r in lines(metrics)] == [1]


def test_a_resumed_run_without_a_metrics_file_writes_a_new_one(metrics):
    from verl.utils.tracking import FileLogger

    run_summary.RESUMED["step"] = 2
    logger = FileLogger("p", "e")
    logger.log({"x": 1.0}, 3)
    logger.finish()
    assert [r["step"] for r in lines(metrics)] == [3]


def trainer_module(steps, log_step=None):
    """A stand-in for ``verl.trainer.ppo.v1.trainer_base`` whose ``PPOTrainer.fit`` trains ``steps`` as verl's does:
    each logged through verl's ``FileLogger`` and the patched ``Tracking.log``'s record, :data:`HISTORY`."""

    class PPOTrainer:
        def __init__(self, config, global_steps):
            self.config, self.global_steps = config, global_steps

        def fit(self, agent_loop_manager):
            from verl.utils.tracking import FileLogger

            logger = FileLogger(self.config.trainer.project_name, self.config.trainer.experiment_name)
            for step in steps:
                data = {"critic/rewards/mean": step / 10, "timing_s/step": 1.0}
                run_summary.HISTORY.append((step, data))
                logger.log(data, step)
            logger.finish()
            return "fitted"

    module = types.SimpleNamespace(PPOTrainer=PPOTrainer)
    run_summary._patch_fit(module)
    return module


def config(tmp_path):
    return OmegaConf.create(
        {
            "algorithm": {"adv_estimator": "grpo"},
            "trainer": {
                "total_training_steps": 4,
                "default_local_dir": str(tmp_path / "ckpt"),
                "logger": ["console", "file"],
                "project_name": "p",
                "experiment_name": "e",
            },
        }
    )


def summary_lines(out: str) -> dict[str, str]:
    block = out[out.index("capo-verl: run summary") :].splitlines()[1:]
    return dict(line.strip().split(": ", 1) for line in block if ": " in line)


def test_a_resumed_run_summarises_and_draws_every_step(metrics, tmp_path, capsys, monkeypatch):
    earlier_run(metrics, steps=(1, 2, 3))
    drawn = {}
    monkeypatch.setattr("capo_verl.curves.panels_png", lambda panels: drawn.update(panels=panels) or b"png")
    module = trainer_module(steps=(3, 4))
    assert module.PPOTrainer(config(tmp_path), global_steps=2).fit(None) == "fitted"
    assert [r["step"] for r in lines(metrics)] == [1, 2, 3, 4]
    summary = summary_lines(capsys.readouterr().out)
    assert summary["steps"].startswith("4 of 4 (2 in this run, resumed from the checkpoint of step 2)")
    [(title, _, rewards)] = [p for p in drawn["panels"] if p[0].startswith("reward")]
    assert rewards["critic/rewards/mean"][0] == [1, 2, 3, 4]
    assert (tmp_path / "ckpt" / "curves.png").read_bytes() == b"png"


def test_a_folder_in_the_way_of_the_curves_is_one_warning_and_the_summary_is_printed(metrics, tmp_path, capsys, caplog):
    (tmp_path / "ckpt" / "curves.png").mkdir(parents=True)
    caplog.set_level(logging.WARNING, logger="capo_verl")
    module = trainer_module(steps=(1, 2))
    assert module.PPOTrainer(config(tmp_path), global_steps=0).fit(None) == "fitted"
    summary = summary_lines(capsys.readouterr().out)
    assert summary["steps"].startswith("2 of 4")
    assert summary["curves"].startswith("not written (IsADirectoryError")
    [warning] = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert "curves.png" in warning and "\n" not in warning
    assert [r["step"] for r in lines(metrics)] == [1, 2]


def test_a_summary_that_fails_is_one_warning_and_the_run_still_ends_well(
    metrics, tmp_path, capsys, caplog, monkeypatch
):
    def broken(*args, **kwargs):
        raise KeyError("trainer")

    monkeypatch.setattr(run_summary, "summary", broken)
    caplog.set_level(logging.WARNING, logger="capo_verl")
    module = trainer_module(steps=(1,))
    assert module.PPOTrainer(config(tmp_path), global_steps=0).fit(None) == "fitted"
    assert "run summary" not in capsys.readouterr().out
    [warning] = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert "summary" in warning and "KeyError" in warning
    assert (tmp_path / "ckpt" / "curves.png").exists()


# --- the CPU data folder -------------------------------------------------------------------------------------------
def data_command(folder) -> list[str]:
    """How the CPU launch scripts write their data (one ``python -c``)."""
    import sys

    code = "import sys; from capo_verl.data import gsm8k_calc_main as m; sys.exit(m(sys.argv[1:]))"
    return [sys.executable, "-c", code, str(folder)]


def test_a_data_folder_under_a_file_is_one_line_naming_it(tmp_path):
    import subprocess

    (tmp_path / "file").write_text("x")
    folder = tmp_path / "file" / "cpu"  # cannot be made, as root too (a read-only folder can be, as root)
    proc = subprocess.run(data_command(folder), capture_output=True, text=True, timeout=300)
    assert proc.returncode == 1, proc.stderr
    [line] = proc.stderr.strip().splitlines()[-1:]
    assert "Traceback" not in proc.stderr
    assert str(folder) in line and "CAPO_CPU_DATA_DIR" in line
    ok = subprocess.run(data_command(tmp_path / "cpu"), capture_output=True, text=True, timeout=300)
    assert ok.returncode == 0, ok.stderr
    assert (tmp_path / "cpu" / "gsm8k_calc_train.parquet").exists()


def test_a_full_disk_is_one_line_and_leaves_no_half_file(tmp_path, monkeypatch, capsys):
    import errno

    from capo_verl import data, outputs

    def full(path, payload):
        raise OSError(errno.ENOSPC, "No space left on device", str(path))

    monkeypatch.setattr(outputs, "write_atomic", full)
    with pytest.raises(data.DataFolderError) as info:
        data.write_gsm8k_calc_parquet(tmp_path / "cpu", n_train=4, n_val=2)
    assert info.value.errno == errno.ENOSPC
    assert str(info.value).startswith(f"{tmp_path / 'cpu'}: ") and "No space left" in str(info.value)
    assert data.gsm8k_calc_main([str(tmp_path / "cpu")]) == 1
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "CAPO_CPU_DATA_DIR" in err
