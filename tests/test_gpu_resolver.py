"""What ``pip install '.[gpu]'`` resolves to on a user's machine: torch 2.11.0 (PyPI's CUDA 13.0 build), vllm 0.24.0
and verl 0.9.1, without a conflict, so that a pin that drifts upstream (a new verl, vLLM or torch release, a yanked
file) shows up here before it shows up on a cluster.

pip's resolver runs with ``--dry-run --report`` (PEP 658 metadata only: no wheel is downloaded; about 2 minutes
against PyPI) and ``--isolated`` with no ``PIP_*`` variables, so this machine's pip configuration (a local
``find-links`` folder with a CPU torch, constraints, extra indexes) plays no part. Needs PyPI.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]

#: what ``.[gpu]`` must resolve to (``pyproject.toml``: ``gpu = ["verl[vllm]==0.9.1"]``; verl's extra pins the rest)
EXPECTED = {"verl": "0.9.1", "torch": "2.11.0", "vllm": "0.24.0"}


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_gpu_extra_resolves_to_the_tested_releases_from_pypi(tmp_path):
    report = tmp_path / "report.json"
    env = {k: v for k, v in os.environ.items() if not k.startswith("PIP_")}
    out = subprocess.run(
        [sys.executable, "-m", "pip", "install", "--isolated", "--dry-run", "--ignore-installed", "--quiet",
         "--report", str(report), f"{REPO}[gpu]"],
        env=env,
        capture_output=True,
        text=True,
        timeout=840,
        cwd=tmp_path,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr[-3000:]  # a conflict: pip's ResolutionImpossible, exit status 1
    installs = {item["metadata"]["name"].lower(): item for item in json.loads(report.read_text())["install"]}
    assert {name: installs[name]["metadata"]["version"] for name in EXPECTED} == EXPECTED
    torch = installs["torch"]
    assert torch["download_info"]["url"].startswith("https://files.pythonhosted.org/"), torch["download_info"]
    # PyPI's torch 2.11.0 is the CUDA 13.0 build (driver >= 580, docs/quickstart.md); a change shows up here
    assert any(req.startswith("cuda-toolkit") and "13.0" in req for req in torch["metadata"]["requires_dist"])
