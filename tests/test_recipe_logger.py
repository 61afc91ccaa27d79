"""The paper launch scripts (scripts/_common.sh) log to wandb only where wandb can log in: ``WANDB_API_KEY`` set, a
netrc entry for api.wandb.ai (what ``wandb login`` writes), or ``WANDB_MODE=offline``. Elsewhere the run logs to
``[console,file]`` (verl's wandb logger fails at the start without credentials) and one start line says how to turn
wandb on. A ``trainer.logger=...`` the user types is kept as typed.

Two real ``--dry-run``s (the resolved config's ``trainer.logger``, HOME a tmp folder with or without ``.netrc``);
the other cases with a stand-in Python (the command's overrides, as verl's Hydra parses them)."""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "scripts" / "run_capo_qwen2.5_math_1.5b.sh"
NETRC = "machine api.wandb.ai\n  login user\n  password " + "0123456789abcdef" * 2 + "01234567\n"


def script_env(tmp_path: Path, netrc: bool, python: str = sys.executable, **values: str) -> dict[str, str]:
    """HOME a tmp folder (with ``.netrc`` when ``netrc``), no WANDB_* / NETRC / CAPO_* variables, and an
    ``nvidia-smi`` that fails (this test is about the logger, on any host)."""
    home = tmp_path / "home"
    home.mkdir(exist_ok=True)
    if netrc:
        (home / ".netrc").write_text(NETRC)
        (home / ".netrc").chmod(0o600)
    fakebin = tmp_path / "fakebin"
    fakebin.mkdir(exist_ok=True)
    (fakebin / "nvidia-smi").write_text("#!/bin/sh\nexit 9\n")
    (fakebin / "nvidia-smi").chmod(0o755)
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("WANDB_", "CAPO_", "RAY_")) and k not in ("NETRC", "VERL_PLATFORM", "NNODES")
    }
    env.update(HOME=str(home), PYTHON=python, PATH=f"{fakebin}{os.pathsep}{env['PATH']}", **values)
    return env


def run(env: dict[str, str], *args: str, timeout: int = 120) -> subprocess.CompletedProcess:
    proc = subprocess.run(
        ["bash", str(SCRIPT), "--dry-run", *args], env=env, capture_output=True, text=True, timeout=timeout
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr
    return proc


def resolved_logger(stdout: str) -> list[str]:
    """``trainer.logger`` of the resolved config the dry run prints."""
    lines = stdout.splitlines()
    [start] = [i for i, ln in enumerate(lines) if ln.startswith("# resolved config")]
    body = [ln for ln in lines[start + 1 :] if not ln.startswith("[validate_config]")]
    return yaml.safe_load("\n".join(body))["trainer"]["logger"]


def logger_line(stdout: str) -> str:
    [line] = [ln for ln in stdout.splitlines() if ln.startswith("# logger: ")]
    return line


@pytest.mark.parametrize("netrc", [False, True], ids=["no-credentials", "netrc"])
def test_the_resolved_logger_has_wandb_only_with_a_netrc_entry(tmp_path, netrc):
    proc = run(script_env(tmp_path, netrc), timeout=300)
    assert resolved_logger(proc.stdout) == (["console", "wandb"] if netrc else ["console", "file"])
    line = logger_line(proc.stdout)
    if netrc:
        assert str(tmp_path / "home" / ".netrc") in line, line
    else:  # how to turn it on
        assert "wandb login" in line and "WANDB_API_KEY" in line and "WANDB_MODE=offline" in line, line


#: a stand-in Python: can import verl; the dry run's config printing records the command instead; every other probe
#: (the netrc one) runs in this Python
STAND_IN = """#!/bin/sh
if [ "$1" = "-c" ]; then
  case "$2" in *find_spec*) exit 0;; esac
  exec "{python}" "$@"
fi
[ "$1" = "-" ] && cat >/dev/null
"""


def loggers(tmp_path: Path, netrc: bool, *args: str, **values: str) -> tuple[list[str], str]:
    """The command's ``trainer.logger`` overrides (as typed on its command line) and the logger line."""
    stand_in = tmp_path / "python"
    stand_in.write_text(STAND_IN.format(python=sys.executable))
    stand_in.chmod(0o755)
    proc = run(script_env(tmp_path, netrc, python=str(stand_in), **values), *args)
    lines = proc.stdout.splitlines()
    [cmd] = [shlex.split(lines[i + 1]) for i, ln in enumerate(lines) if ln.startswith("# command (dry run")]
    return [a for a in cmd if a.lstrip("+~").startswith("trainer.logger")], logger_line(proc.stdout)


@pytest.mark.parametrize(
    "values",
    [{"WANDB_API_KEY": "0123456789abcdef" * 2 + "01234567"}, {"WANDB_MODE": "offline"}],
    ids=["WANDB_API_KEY", "WANDB_MODE=offline"],
)
def test_an_api_key_or_offline_mode_turns_wandb_on(tmp_path, values):
    got, line = loggers(tmp_path, False, **values)
    assert got == ["trainer.logger=[console,wandb]"], got
    assert next(iter(values)) in line, line


def test_an_unusable_wandb_mode_or_another_hosts_netrc_entry_is_not_a_login(tmp_path):
    got, _ = loggers(tmp_path, True, WANDB_MODE="online", WANDB_BASE_URL="https://wandb.example.org")
    assert got == ["trainer.logger=[console,file]"], got


@pytest.mark.parametrize("netrc", [False, True], ids=["no-credentials", "netrc"])
def test_a_typed_logger_wins(tmp_path, netrc):
    got, line = loggers(tmp_path, netrc, "trainer.logger=[console,tensorboard]")
    assert got == ["trainer.logger=[console,tensorboard]"], got
    assert "as typed" in line, line
