"""The CUDA tier's gate (tests/gpu/conftest.py): never collected unless asked for; without CUDA, one error.

Runs pytest in subprocesses with CUDA hidden (``CUDA_VISIBLE_DEVICES=""``), so the error path is what runs on
any machine, a GPU node included: on the repository (``pytest -m gpu`` stops before importing any test module), and
on a small copy of the layout (the tier's conftest, a gpu test, a plain and a slow one) for the selection rules.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
MESSAGE = "the GPU tier (pytest -m gpu) needs CUDA: torch.cuda.is_available() is False"


def _pytest(args: list[str], cwd: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": ""}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH", "")) if p)
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_pytest_m_gpu_without_cuda_stops_at_once_with_one_error():
    run = _pytest(["-m", "gpu", "-q"], REPO)
    out = run.stdout + run.stderr
    assert run.returncode == pytest.ExitCode.USAGE_ERROR, out
    assert out.count(MESSAGE) == 1, out
    assert "passed" not in out and "skipped" not in out and "deselected" not in out, out  # no test module imported


@pytest.fixture(scope="module")
def layout(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("layout")
    (root / "tests" / "gpu").mkdir(parents=True)
    shutil.copy(REPO / "tests" / "gpu" / "conftest.py", root / "tests" / "gpu" / "conftest.py")
    (root / "tests" / "gpu" / "test_tier.py").write_text(
        "import pytest\npytestmark = pytest.mark.gpu\n\ndef test_on_cuda():\n    pass\n"
    )
    (root / "tests" / "test_plain.py").write_text("def test_plain():\n    pass\n")
    (root / "tests" / "test_heavy.py").write_text("import pytest\n\n@pytest.mark.slow\ndef test_heavy():\n    pass\n")
    (root / "pytest.ini").write_text(
        "[pytest]\naddopts = --import-mode=importlib --strict-markers\ntestpaths = tests\n"
        "markers =\n    slow: slow\n    gpu: gpu\n"
    )
    return root


@pytest.mark.parametrize(
    "args, collected",
    [
        ([], {"test_plain", "test_heavy"}),  # plain pytest
        (["-m", "not slow"], {"test_plain"}),  # CI's fast tier
        (["-m", "slow"], {"test_heavy"}),  # CI's slow tier
        (["-m", "not gpu"], {"test_plain", "test_heavy"}),
    ],
)
def test_the_tier_is_not_collected_unless_asked_for(layout, args, collected):
    run = _pytest(["--collect-only", "-q", *args], layout)
    assert run.returncode == 0, run.stdout + run.stderr
    names = {line.rsplit("::", 1)[-1] for line in run.stdout.splitlines() if "::" in line}
    assert names == collected, run.stdout
    assert MESSAGE not in run.stdout + run.stderr


@pytest.mark.parametrize("args", [["-m", "gpu"], ["-m", "gpu or slow"], ["tests/gpu"], ["tests/gpu/test_tier.py"]])
def test_asking_for_the_tier_without_cuda_is_one_error(layout, args):
    run = _pytest(["-q", *args], layout)
    out = run.stdout + run.stderr
    assert run.returncode == pytest.ExitCode.USAGE_ERROR, out
    assert out.count(MESSAGE) == 1 and "test_on_cuda" not in out and "passed" not in out, out
