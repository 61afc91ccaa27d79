"""Paths a user types into the launch scripts (issue 65, section 6): a folder with a comma, ``=``, a quote, a space or
non-ASCII characters reaches verl's Hydra as that folder (scripts/_common.sh ``capo_hydra_value`` quotes it for
Hydra's override grammar), and a leading ``~`` is expanded (``capo_expand_home``). Each character through Hydra's own
override parser; then both kinds of launch script, end to end, with a stand-in Python that records what it is given
(no verl import)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
from hydra.core.override_parser.overrides_parser import OverridesParser
from omegaconf import OmegaConf

REPO = Path(__file__).resolve().parents[1]
COMMON = REPO / "scripts" / "_common.sh"

#: one path per character class that Hydra's grammar splits or rejects unquoted, and the plain ones it must not touch
PATHS = {
    "comma": "/data/a,b",
    "equals": "/data/a=b",
    "single quote": "/data/it's",
    "double quote": '/data/say "hi"',
    "non-ASCII": "/data/dätä/日本",
    "space": "/data/my data",
    "brackets and braces": "/data/[a]{b}(c)",
    "colon": "/data/a:b",
    "dollar and interpolation": "/data/$HOME/${oc.env:HOME}",
    "backslash before a quote": "/data/a\\'b",
    "trailing backslash": "/data/a\\",
    "everything": "/home/u/dätä,1=x'y\"z w",
}
PLAIN = ["/home/u/data/capo", "Qwen/Qwen2.5-Math-1.5B", "/tmp/pytest-of-u/x_0/a-b.c+d@e%f"]


def bash(snippet: str, *args: str, env: dict | None = None) -> str:
    proc = subprocess.run(
        ["bash", "-c", f'source "{COMMON}"; {snippet}', "bash", *args],
        capture_output=True,
        text=True,
        check=True,
        env={**os.environ, **(env or {})},
    )
    return proc.stdout


def hydra_value(override: str):
    """The value Hydra's override parser, then OmegaConf's resolution, makes of ``key=value``."""
    parsed = OverridesParser.create().parse_override(override)
    return OmegaConf.to_container(OmegaConf.create({"v": parsed.value()}), resolve=True)["v"]


@pytest.mark.parametrize("path", PATHS.values(), ids=PATHS.keys())
def test_each_character_reaches_hydra_as_typed(path):
    quoted = bash('capo_hydra_value "$1"', path)
    assert quoted.startswith("'") and hydra_value(f"data.train_files={quoted}") == path
    listed = bash('echo -n "[$(capo_hydra_value "$1"),$(capo_hydra_value "$2")]"', path, "/plain/b.parquet")
    assert hydra_value(f"data.val_files={listed}") == [path, "/plain/b.parquet"]


@pytest.mark.parametrize("path", PLAIN)
def test_a_plain_path_is_passed_as_it_is(path):
    assert bash('capo_hydra_value "$1"', path) == path
    assert hydra_value(f"actor_rollout_ref.model.path={path}") == path


def test_a_suffix_keeps_its_interpolation_inside_the_quotes():
    quoted = bash("capo_hydra_value \"$1\" '/${p}'", "/ck,pt")
    parsed = OverridesParser.create().parse_override(f"d={quoted}").value()
    assert OmegaConf.to_container(OmegaConf.create({"d": parsed, "p": "exp"}), resolve=True)["d"] == "/ck,pt/exp"


def test_a_leading_tilde_is_expanded_and_nothing_else():
    env = {"HOME": "/home/ü"}
    for typed, expanded in [("~", "/home/ü"), ("~/data", "/home/ü/data"), ("a~b", "a~b"), ("~other/x", "~other/x")]:
        assert bash('capo_expand_home "$1"', typed, env=env) == expanded


#: a stand-in for PYTHON: `-c` code succeeds (the scripts' "can it import verl / vLLM" checks) and prints the model's
#: cache folder when asked for it; any other call (the dry run's `python -` or `python -m ...launch --dry-run`)
#: records its arguments, NUL-separated, in $ARGS_OUT
STAND_IN = """#!/bin/bash
if [ "$1" = "-c" ]; then
  case "$2" in *cache_dir*) printf '%s\\n' "$CAPO_VERL_CACHE/SmolLM2-135M-Instruct" ;; esac
  exit 0
fi
[ "$1" = "-" ] && cat >/dev/null
printf '%s\\0' "$@" > "$ARGS_OUT"
"""


@pytest.fixture
def stand_in(tmp_path) -> Path:
    path = tmp_path / "python"
    path.write_text(STAND_IN)
    path.chmod(0o755)
    return path


def overrides(args_file: Path) -> dict[str, object]:
    """``{key: value as Hydra parses it}`` of the trainer command's overrides (what follows ``main_ppo``)."""
    args = args_file.read_text().split("\0")[:-1]
    cmd = args[args.index("verl.trainer.main_ppo") + 1 :]
    parser = OverridesParser.create()
    out = {}
    for arg in cmd:
        if arg.startswith("--"):
            continue
        parsed = parser.parse_override(arg)
        out[parsed.key_or_group] = parsed.value()
    return out


def test_the_paper_scripts_pass_expanded_quoted_paths(tmp_path, stand_in):
    home = tmp_path / "hömé"
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith(("CAPO_", "RAY_", "N_GPUS", "NNODES"))},
        "HOME": str(home),
        "PYTHON": str(stand_in),
        "ARGS_OUT": str(tmp_path / "args"),
        "CAPO_DATA_DIR": "~/dätä,1=x'y",
        "CAPO_CKPT_DIR": '~/ck "pts"',
        "CAPO_MODEL_1_5B": "~/models/mö,del",
        "CAPO_VAL_SETS": "aime24 deepscaler_val",
    }
    proc = subprocess.run(
        ["bash", str(REPO / "scripts/run_capo_qwen2.5_math_1.5b.sh"), "--dry-run"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    got = overrides(tmp_path / "args")
    data = f"{home}/dätä,1=x'y"
    assert got["actor_rollout_ref.model.path"] == f"{home}/models/mö,del"
    assert got["data.train_files"] == f"{data}/deepscaler_train.parquet"
    assert got["data.val_files"] == [f"{data}/aime24.parquet", f"{data}/deepscaler_val.parquet"]
    assert got["trainer.default_local_dir"] == f'{home}/ck "pts"/${{trainer.project_name}}/${{trainer.experiment_name}}'


def test_the_cpu_script_passes_expanded_quoted_paths(tmp_path, stand_in):
    home = tmp_path / "hömé"
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith(("CAPO_", "RAY_"))},
        "HOME": str(home),
        "PYTHON": str(stand_in),
        "ARGS_OUT": str(tmp_path / "args"),
        "CAPO_CPU_DATA_DIR": "~/dätä,1",
        "CAPO_CPU_CKPT_DIR": "~/it's",
        "CAPO_VERL_CACHE": str(home / "ca=che"),
    }
    proc = subprocess.run(
        ["bash", str(REPO / "scripts/run_grpo_smollm2_cpu.sh"), "--dry-run"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    got = overrides(tmp_path / "args")
    assert got["actor_rollout_ref.model.path"] == f"{home}/ca=che/SmolLM2-135M-Instruct"
    assert got["data.train_files"] == f"{home}/dätä,1/gsm8k_calc_train.parquet"
    assert got["data.val_files"] == f"{home}/dätä,1/gsm8k_calc_val.parquet"
    assert got["trainer.default_local_dir"] == f"{home}/it's/${{trainer.experiment_name}}"
    assert not home.exists()  # a dry run writes nothing


@pytest.mark.parametrize(
    "script, folders",
    [
        ("run_capo_smollm2_cpu.sh", ("CAPO_CPU_DATA_DIR", "CAPO_CPU_CKPT_DIR")),
        ("run_capo_qwen2.5_math_1.5b.sh", ("CAPO_DATA_DIR", "CAPO_CKPT_DIR")),
    ],
)
def test_without_home_the_folders_are_asked_for_and_given_they_suffice(tmp_path, stand_in, script, folders):
    """HOME unset (a cron job, a container): one line naming HOME and the folder variables, status 2; with those
    variables set, the script goes on (HOME is not needed); a ``~`` path without HOME is one line too."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("CAPO_", "RAY_")) and k != "HOME"}
    env.update(PYTHON=str(stand_in), ARGS_OUT=str(tmp_path / "args"), CAPO_VERL_CACHE=str(tmp_path / "cache"))

    def dry_run(**extra):
        cmd = ["bash", str(REPO / "scripts" / script), "--dry-run"]
        return subprocess.run(cmd, env={**env, **extra}, capture_output=True, text=True, timeout=120)

    refused = dry_run()
    assert refused.returncode == 2, refused.stderr
    [line] = refused.stderr.splitlines()
    assert line.startswith("error: HOME is not set") and all(f in line for f in folders), line

    given = dry_run(**{f: str(tmp_path / f) for f in folders})
    assert given.returncode == 0, given.stderr
    assert overrides(tmp_path / "args")["data.train_files"].startswith(str(tmp_path / folders[0]))

    tilde = dry_run(**{folders[0]: "~/data", folders[1]: str(tmp_path / "ckpt")})
    assert tilde.returncode == 2, tilde.stderr
    [line] = tilde.stderr.splitlines()
    assert line.startswith("error: ~/data:") and "HOME" in line, line
