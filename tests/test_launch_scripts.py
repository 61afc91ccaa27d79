"""The paper launch scripts (scripts/_common.sh) refuse an unknown ablation before Python starts."""

from __future__ import annotations

import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def test_an_unknown_ablation_is_one_line_naming_the_choices():
    script = REPO / "scripts/run_capo_qwen2.5_math_1.5b.sh"
    proc = subprocess.run(
        ["bash", str(script), "ablation=nonsense", "--dry-run"], capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "no configs/ablation/nonsense.yaml" in lines[0], proc.stderr
    for name in (p.stem for p in (REPO / "configs/ablation").glob("*.yaml")):
        assert f" {name} " in lines[0] + " "
    assert proc.stdout == ""


def test_cpu_script_dry_run_prints_the_validated_command_and_refuses_a_bad_value_in_one_line(tmp_path):
    """scripts/run_capo_smollm2_cpu.sh --dry-run: the command, the config after verl's validate_config (capo-verl's
    start checks included); nothing converted, written or started."""
    import os

    env = {**os.environ, "HOME": str(tmp_path), "CAPO_VERL_CACHE": str(tmp_path / "cache")}
    script = REPO / "scripts/run_grpo_smollm2_cpu.sh"
    ok = subprocess.run(
        ["bash", str(script), "--dry-run", "trainer.total_training_steps=2"],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert ok.returncode == 0, ok.stderr[-3000:]
    assert "--config-name=grpo_smollm2_135m_cpu" in ok.stdout
    assert f"actor_rollout_ref.model.path={tmp_path}/cache/SmolLM2-135M-Instruct" in ok.stdout
    assert "total_training_steps: 2" in ok.stdout
    assert "-m capo_verl.cpu.launch --" in ok.stdout
    assert list(tmp_path.iterdir()) == []  # no checkpoint converted, no data written

    bad = subprocess.run(
        ["bash", str(script), "--dry-run", "trainer.val_calib=maybe"],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert bad.returncode == 2
    errors = [ln for ln in bad.stderr.splitlines() if ln.startswith("error: ")]
    assert errors == [
        "error: ValueError: trainer.val_calib='maybe': must be true, false, auto or null (null = auto); e.g. "
        "trainer.val_calib=auto (+trainer.val_calib=auto if your config lacks the key)"
    ], bad.stderr[-3000:]
    assert "Traceback" not in bad.stderr
