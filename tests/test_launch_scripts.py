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
