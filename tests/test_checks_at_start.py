"""Values the run reads only later are refused before it starts: in verl's ``validate_config`` (hooked by
capo_verl/compat/methods.py::check_start_values, and, on this host without an accelerator, by the CPU port's
capo_verl/cpu/defaults.py for ``CAPO_VERL_WEIGHT_SYNC_TIMEOUT_S``), so also by the launch scripts' ``--dry-run``.

Before, ``trainer.val_calib=maybe`` failed at the first validation pass, ``reward_kwargs.timeout_s=-1`` at the first
reward call, ``CAPO_REWARD_PROCS`` at the first math-verify call and ``CAPO_VERL_WEIGHT_SYNC_TIMEOUT_S`` at the first
weight sync, all after the model had loaded; ``--dry-run`` passed all four.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import verl  # noqa: F401  loads the capo-verl plugin, as verl's launcher does
from hydra import compose, initialize_config_dir
from verl.trainer.ppo.utils import need_critic, need_reference_policy
from verl.utils.config import validate_config

from capo_verl.compat.methods import check_start_values, is_capo_reward

pytestmark = pytest.mark.filterwarnings("ignore:Disabled critic as algorithm.adv_estimator:UserWarning")

REPO = Path(__file__).resolve().parents[1]
ENV_VARS = ("CAPO_REWARD_PROCS", "CAPO_VERL_WEIGHT_SYNC_TIMEOUT_S")
TIMEOUT_KEY = "reward.custom_reward_function.reward_kwargs.timeout_s"


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch):
    for key in ENV_VARS:
        monkeypatch.delenv(key, raising=False)


def validate(*overrides: str, name: str = "capo_qwen2.5_math_1.5b"):
    with initialize_config_dir(config_dir=str(REPO / "configs"), version_base=None):
        cfg = compose(config_name=name, overrides=list(overrides))
    validate_config(config=cfg, use_reference_policy=need_reference_policy(cfg), use_critic=need_critic(cfg))
    return cfg


# (overrides, environment, the one-line message)
BAD = [
    (["trainer.val_calib=maybe"], {}, r"^trainer\.val_calib='maybe': must be true, false, auto or null "),
    (["trainer.val_calib=2"], {}, r"^trainer\.val_calib=2: must be true, false, auto or null "),
    ([f"+{TIMEOUT_KEY}=-1"], {}, rf"^{TIMEOUT_KEY}=-1: must be a finite number of seconds > 0 "),
    ([f"+{TIMEOUT_KEY}=0"], {}, rf"^{TIMEOUT_KEY}=0: must be a finite number of seconds > 0 "),
    ([f"+{TIMEOUT_KEY}=inf"], {}, rf"^{TIMEOUT_KEY}=inf: must be a finite number of seconds > 0 "),
    (
        ["+reward.custom_reward_function.reward_kwargs.timeout=5"],
        {},
        r"^reward\.custom_reward_function\.reward_kwargs\.timeout: capo_verl\.reward\.compute_score takes only ",
    ),
    ([], {"CAPO_REWARD_PROCS": "0"}, r"^CAPO_REWARD_PROCS='0': must be an integer >= 1 "),
    ([], {"CAPO_REWARD_PROCS": "four"}, r"^CAPO_REWARD_PROCS='four': must be an integer >= 1 "),
    ([], {"CAPO_VERL_WEIGHT_SYNC_TIMEOUT_S": "-5"}, r"^CAPO_VERL_WEIGHT_SYNC_TIMEOUT_S='-5': must be "),
    ([], {"CAPO_VERL_WEIGHT_SYNC_TIMEOUT_S": "soon"}, r"^CAPO_VERL_WEIGHT_SYNC_TIMEOUT_S='soon': must be "),
]


@pytest.mark.parametrize("overrides, env, message", BAD)
def test_validate_config_refuses_each_value_in_one_line(monkeypatch, overrides, env, message):
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    with pytest.raises(ValueError, match=message) as info:
        validate(*overrides)
    assert "\n" not in str(info.value)


@pytest.mark.parametrize(
    "overrides, env, val_calib, procs",
    [
        (["trainer.val_calib=auto", f"+{TIMEOUT_KEY}=2.5"], {"CAPO_REWARD_PROCS": "2"}, None, 2),
        (["trainer.val_calib=false"], {"CAPO_VERL_WEIGHT_SYNC_TIMEOUT_S": "60"}, False, None),
        (["trainer.val_calib=null"], {"CAPO_REWARD_PROCS": ""}, None, None),  # empty = unset: min(4, cpu_count)
    ],
)
def test_valid_values_pass_and_reach_the_run_as_given(monkeypatch, overrides, env, val_calib, procs):
    """The values pass the check, and the run reads them as the user meant (auto is None, an empty variable is
    unset)."""
    from capo_verl.compat.validation import parse_val_calib
    from capo_verl.reward import reward_procs

    for key, value in env.items():
        monkeypatch.setenv(key, value)
    cfg = validate(*overrides)
    assert parse_val_calib(cfg.trainer.val_calib) is val_calib
    assert reward_procs() == (procs or min(4, os.cpu_count() or 1))
    if f"+{TIMEOUT_KEY}=2.5" in overrides:
        assert cfg.reward.custom_reward_function.reward_kwargs.timeout_s == 2.5


def test_timeout_of_another_reward_function_is_not_ours_to_check():
    """reward_kwargs belong to the configured reward function: only capo-verl's own timeout_s is checked; another
    function gets its value unchanged."""
    cfg = validate(
        "reward.custom_reward_function.path=/somewhere/my_reward.py",
        "reward.custom_reward_function.name=my_score",
        f"+{TIMEOUT_KEY}=-1",
    )
    assert cfg.reward.custom_reward_function.reward_kwargs.timeout_s == -1
    assert not is_capo_reward(cfg.reward.custom_reward_function)


def test_is_capo_reward():
    from capo_verl import reward

    assert is_capo_reward({"path": "pkg://capo_verl.reward", "name": "compute_score"})
    assert is_capo_reward({"path": reward.__file__, "name": None})
    assert not is_capo_reward({"path": "pkg://capo_verl.reward", "name": "other"})
    assert not is_capo_reward({"path": "/x/reward.py", "name": "compute_score"})
    assert not is_capo_reward(None)


def test_check_start_values_alone_reads_the_environment(monkeypatch):
    from omegaconf import OmegaConf

    check_start_values(OmegaConf.create({}))
    monkeypatch.setenv("CAPO_REWARD_PROCS", "-1")
    with pytest.raises(ValueError, match=r"^CAPO_REWARD_PROCS='-1'"):
        check_start_values(OmegaConf.create({}))


@pytest.mark.parametrize(
    "overrides, env, line",
    [
        (["trainer.val_calib=maybe"], {}, "ValueError: trainer.val_calib='maybe': must be true, false, auto or null"),
        ([], {"CAPO_REWARD_PROCS": "0"}, "ValueError: CAPO_REWARD_PROCS='0': must be an integer >= 1"),
    ],
)
def test_launch_script_dry_run_stops_with_one_line(script_dry_run, tmp_path, overrides, env, line):
    """The real ``--dry-run`` (``import verl`` in a new process, ~20 s): status 2, and one line, no traceback, names
    the key or variable, the value and the range."""
    proc = script_dry_run("run_capo_qwen2.5_math_1.5b.sh", tmp_path, *overrides, env=env)
    assert proc.returncode == 2, proc.stdout[-2000:]
    errors = proc.errors
    assert len(errors) == 1 and errors[0].startswith(f"error: {line}"), proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr
    assert "All configuration checks passed" not in proc.stdout


# --- the capo_verl logger's console handler (capo_verl/logs.py) -----------------------------------------------
_LOG_SNIPPET = """
import logging, sys
setup = sys.argv[1]
if setup == "root_error":  # what model_hosting_container_standards does in verl's TaskRunner once vLLM is imported
    logging.basicConfig()
    logging.getLogger().setLevel(logging.ERROR)
    for h in logging.getLogger().handlers:
        h.setLevel(logging.ERROR)
elif setup == "root_info":
    logging.basicConfig(level=logging.INFO, format="ROOT %(name)s: %(message)s")
import capo_verl  # noqa: F401  installs the handler
logging.getLogger("capo_verl.compat.advantage").warning("capo-verl: a warning")
logging.getLogger("capo_verl").info("capo-verl: an info line")
logging.getLogger("capo_verl").debug("capo-verl: a debug line")
"""


@pytest.mark.parametrize("setup", ["none", "root_error", "root_info"])
def test_capo_verl_log_lines_are_printed_exactly_once(setup):
    """Whatever the root logger does (nothing, ERROR as vLLM's dependency sets it, INFO with its own handler),
    capo-verl's warning and info lines reach stderr once each, and its debug lines do not."""
    proc = subprocess.run(
        [sys.executable, "-c", _LOG_SNIPPET, setup], capture_output=True, text=True, timeout=120, check=True
    )
    lines = proc.stderr.splitlines()
    assert sum("capo-verl: a warning" in ln for ln in lines) == 1, proc.stderr
    assert sum("capo-verl: an info line" in ln for ln in lines) == 1, proc.stderr
    assert "a debug line" not in proc.stderr
    if setup == "root_info":  # printed by the root handler, not by capo-verl's
        assert "ROOT capo_verl.compat.advantage: capo-verl: a warning" in lines, proc.stderr
    else:
        assert "WARNING capo_verl.compat.advantage: capo-verl: a warning" in lines, proc.stderr


def test_a_level_set_by_the_user_is_kept():
    code = (
        "import logging; logging.getLogger('capo_verl').setLevel(logging.ERROR); import capo_verl; "
        "logging.getLogger('capo_verl').warning('capo-verl: hidden')"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    assert "hidden" not in proc.stderr
