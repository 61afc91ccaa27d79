"""Which Python the paper launch scripts (scripts/_common.sh ``_capo_python``) run, and the environment
scripts/setup.sh builds, on CPU hosts and on hosts with NVIDIA GPUs.

- Order: ``PYTHON``; else the active environment's (``VIRTUAL_ENV``, ``CONDA_PREFIX``, ``python3`` on PATH) when
  it can import verl; else the checkout's ``.venv`` (setup.sh's CPU environment). The first output line names it.
- Where verl takes the host for a CUDA one (``nvidia-smi`` runs: ``verl/plugin/platform/platform_cuda.py``), a
  Python whose torch is a CPU build is refused in one line (status 2), and setup.sh refuses to build the CPU
  environment unless ``--cpu`` asks for it.

The Pythons are stand-ins (shell scripts that answer the scripts' ``-c`` probes: can it import verl, which torch, and
record the dry run's command instead of composing it); ``nvidia-smi`` is a fake on PATH that, like the real one,
prints its table and exits 0, or fails as on a machine without the driver.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SCRIPT = "run_capo_qwen2.5_math_1.5b.sh"
CPU_TORCH = "2.13.0+cpu None None"
CUDA_TORCH = "2.11.0+cu128 12.8 None True"
#: PyPI's CUDA 13.0 build on a CUDA 12 driver: torch sees no GPU
CUDA13_TORCH_NO_GPU = "2.11.0 13.0 None False"

SMI_OK = """#!/bin/sh
cat <<'EOF'
+-----------------------------------------------------------------------------------------+
| NVIDIA-SMI 570.124.06             Driver Version: 570.124.06     CUDA Version: 12.8     |
|-----------------------------------------+------------------------+----------------------+
|   0  NVIDIA H100 80GB HBM3          On  |   00000000:18:00.0 Off |                    0 |
+-----------------------------------------------------------------------------------------+
EOF
exit 0
"""
SMI_NO_DRIVER = """#!/bin/sh
echo "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver." >&2
exit 9
"""


def executable(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    path.chmod(0o755)
    return path


def fake_python(path: Path, verl: bool = True, torch: str = CPU_TORCH) -> Path:
    """A stand-in Python at ``path``: the verl probe succeeds when ``verl``; the torch probe prints ``torch``
    (``__version__ version.cuda version.hip``); the dry run (``python - ...``) prints ``# ran: <its path>``."""
    return executable(
        path,
        "#!/bin/sh\n"
        'if [ "$1" = "-c" ]; then\n'
        f'  case "$2" in *find_spec*) exit {0 if verl else 1};; *torch*) echo "{torch}";; esac\n'
        "  exit 0\n"
        "fi\n"
        'if [ "$1" = "-" ]; then cat >/dev/null; echo "# ran: $0"; fi\n',
    )


@pytest.fixture
def checkout(tmp_path) -> Path:
    """A copy of scripts/ and configs/ with a .venv whose Python (the CPU environment) can import verl."""
    repo = tmp_path / "repo"
    shutil.copytree(REPO / "scripts", repo / "scripts")
    shutil.copytree(REPO / "configs", repo / "configs")
    fake_python(repo / ".venv/bin/python")
    return repo


def env_for(tmp_path: Path, smi: str | None = SMI_NO_DRIVER, **values: str) -> dict[str, str]:
    """This process's environment with no active environment, no PYTHON and a ``python3`` on PATH without verl
    (fakebin first on PATH), a fake ``nvidia-smi`` (``smi``), plus ``values``."""
    drop = ("PYTHON", "VIRTUAL_ENV", "CONDA_PREFIX", "VERL_PLATFORM", "RAY_ADDRESS", "N_GPUS_PER_NODE", "NNODES")
    env = {k: v for k, v in os.environ.items() if k not in drop and not k.startswith(("CAPO_", "WANDB_"))}
    fakebin = tmp_path / "fakebin"
    fake_python(fakebin / "python3", verl=False)
    if smi is not None:
        executable(fakebin / "nvidia-smi", smi)
    env.update(PATH=f"{fakebin}{os.pathsep}{env['PATH']}", HOME=str(tmp_path / "home"), **values)
    return env


def dry_run(repo: Path, env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["bash", str(repo / "scripts" / SCRIPT), "--dry-run"], env=env, capture_output=True, text=True, timeout=120
    )


def chosen(proc: subprocess.CompletedProcess) -> tuple[str, str]:
    """The first output line's Python and why, and the Python the dry run ran."""
    assert proc.returncode == 0, proc.stderr
    first = proc.stdout.splitlines()[0]
    assert first.startswith("# python: "), proc.stdout
    ran = [ln.removeprefix("# ran: ") for ln in proc.stdout.splitlines() if ln.startswith("# ran: ")]
    assert ran == [first.removeprefix("# python: ").split(" (", 1)[0]], proc.stdout
    return ran[0], first


@pytest.mark.parametrize("active", ["VIRTUAL_ENV", "CONDA_PREFIX", "python3"])
def test_the_active_environment_with_verl_comes_before_the_checkouts_venv(checkout, tmp_path, active):
    env = env_for(tmp_path)
    if active == "python3":
        python = fake_python(tmp_path / "fakebin/python3")
    else:
        python = fake_python(tmp_path / active.lower() / "bin/python")
        env[active] = str(python.parent.parent)
    ran, first = chosen(dry_run(checkout, env))
    assert ran == str(python) and active in first


def test_without_verl_in_the_active_environment_the_checkouts_venv_is_run_and_the_line_says_why(checkout, tmp_path):
    venv = fake_python(tmp_path / "venv/bin/python", verl=False)
    ran, first = chosen(dry_run(checkout, env_for(tmp_path, VIRTUAL_ENV=str(venv.parent.parent))))
    assert ran == str(checkout / ".venv/bin/python")
    assert ".venv" in first and str(venv) in first  # the active Python tried, that cannot import verl


def test_PYTHON_comes_first(checkout, tmp_path):
    python = fake_python(tmp_path / "mine/python")
    venv = fake_python(tmp_path / "venv/bin/python")
    ran, first = chosen(dry_run(checkout, env_for(tmp_path, PYTHON=str(python), VIRTUAL_ENV=str(venv.parent.parent))))
    assert ran == str(python) and "PYTHON" in first


def test_a_cpu_torch_on_a_host_with_nvidia_gpus_is_one_line_naming_python_torch_and_the_fix(checkout, tmp_path):
    """The checkout's .venv (CPU torch) is what a plain run picks when the cluster's environment is not active."""
    proc = dry_run(checkout, env_for(tmp_path, smi=SMI_OK))
    assert proc.returncode == 2, proc.stdout + proc.stderr
    [line] = proc.stderr.strip().splitlines()
    assert line.startswith("error: ") and str(checkout / ".venv/bin/python") in line, line
    assert "2.13.0+cpu" in line and "PYTHON=" in line, line
    assert proc.stdout == ""


def test_a_cuda_torch_that_sees_no_gpu_where_nvidia_smi_runs_names_both_cuda_versions(checkout, tmp_path):
    """PyPI's torch 2.11.0 (CUDA 13.0) on a CUDA 12 driver: nvidia-smi runs, torch sees nothing, and verl would fail
    on its first CUDA call."""
    python = fake_python(tmp_path / "env/bin/python", torch=CUDA13_TORCH_NO_GPU)
    proc = dry_run(checkout, env_for(tmp_path, smi=SMI_OK, VIRTUAL_ENV=str(python.parent.parent)))
    assert proc.returncode == 2, proc.stdout + proc.stderr
    [line] = proc.stderr.strip().splitlines()
    assert line.startswith("error: ") and str(python) in line, line
    assert "13.0" in line and "12.8" in line and "docs/quickstart.md" in line, line


@pytest.mark.parametrize(
    "smi, torch, extra",
    [
        (SMI_OK, CUDA_TORCH, {}),  # the cluster's environment
        (SMI_NO_DRIVER, CPU_TORCH, {}),  # nvidia-smi there, but no GPU verl can use
        (SMI_OK, CPU_TORCH, {"VERL_PLATFORM": "cpu"}),  # verl told to take the host for a CPU one
    ],
    ids=["cuda-torch", "smi-fails", "VERL_PLATFORM=cpu"],
)
def test_where_verl_would_not_use_cuda_or_torch_has_it_the_python_is_run(checkout, tmp_path, smi, torch, extra):
    python = fake_python(tmp_path / "env/bin/python", torch=torch)
    ran, _ = chosen(dry_run(checkout, env_for(tmp_path, smi=smi, VIRTUAL_ENV=str(python.parent.parent), **extra)))
    assert ran == str(python)


def setup_dry_run(tmp_path: Path, smi: str, *args: str) -> subprocess.CompletedProcess:
    """scripts/setup.sh copied into an empty checkout, ``--dry-run`` on a stock Linux x86-64 machine (fake uname and
    ldconfig, pip's configuration empty) with the fake ``nvidia-smi``."""
    root = tmp_path / "checkout"
    (root / "scripts").mkdir(parents=True)
    shutil.copy(REPO / "scripts/setup.sh", root / "scripts/setup.sh")
    env = {k: v for k, v in env_for(tmp_path, smi=smi).items() if not k.startswith("PIP_")}
    executable(tmp_path / "fakebin/uname", '#!/bin/sh\ncase "$1" in -s) echo Linux;; -m) echo x86_64;; esac\n')
    executable(tmp_path / "fakebin/ldconfig", "#!/bin/sh\necho '\tlibnuma.so.1 (libc6) => /lib/libnuma.so.1'\n")
    env.update(PIP_CONFIG_FILE=os.devnull, PYTHON=sys.executable)
    cmd = ["bash", str(root / "scripts/setup.sh"), "--dry-run", *args]
    return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=120)


def test_setup_refuses_the_cpu_environment_on_a_host_with_nvidia_gpus(tmp_path):
    proc = setup_dry_run(tmp_path, SMI_OK)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    [line] = proc.stderr.strip().splitlines()
    assert "docs/quickstart.md" in line and "--cpu" in line, line
    assert proc.stdout == ""


@pytest.mark.parametrize("smi, args", [(SMI_OK, ("--cpu",)), (SMI_NO_DRIVER, ())], ids=["--cpu", "smi-fails"])
def test_setup_builds_the_cpu_environment_when_asked_or_without_a_gpu(tmp_path, smi, args):
    proc = setup_dry_run(tmp_path, smi, *args)
    assert proc.returncode == 0, proc.stderr
    assert "+ .venv/bin/python -m pip install -q torch==2.13.0+cpu" in proc.stdout
    assert "dry run: nothing installed" in proc.stdout
