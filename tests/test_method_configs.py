"""Every capo-verl method's keys are refused where verl validates its config: verl's real ``validate_config``
(``verl/utils/config.py``, hooked once by capo_verl/compat/methods.py), on configs composed from configs/ like
``verl.trainer.main_ppo`` and the launch scripts' ``--dry-run`` do."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import verl  # noqa: F401  loads the capo-verl plugin, as verl's launcher does

pytestmark = [
    pytest.mark.filterwarnings("ignore:Disabled critic as algorithm.adv_estimator:UserWarning"),
    pytest.mark.usefixtures("config_env"),
]

REPO = Path(__file__).resolve().parents[1]
CONFIG_DIR = REPO / "configs"


CODAPO, CDE, CAPO, GRPO = (f"{method}_qwen2.5_math_1.5b" for method in ("codapo", "cde", "capo", "grpo"))


@pytest.mark.parametrize(
    "name, overrides, message",
    [
        # CoDaPO
        (CODAPO, ["algorithm.codapo.weight_offset=-0.1"], r"algorithm\.codapo\.weight_offset must be >= 0"),
        (CODAPO, ["algorithm.codapo.weight_offset=nan"], r"algorithm\.codapo\.weight_offset must be a finite number"),
        (CODAPO, ["algorithm.codapo.reward_threshold=high"], r"algorithm\.codapo\.reward_threshold"),
        (CODAPO, ["algorithm.codapo.percentile=1.5"], r"algorithm\.codapo\.percentile must be a number in \(0, 1\)"),
        (CODAPO, ["algorithm.codapo.repeat_count=0"], r"algorithm\.codapo\.repeat_count must be an integer >= 1"),
        (CODAPO, ["algorithm.codapo.repeat_count=3"], r"repeat_count=3 cannot fill data\.train_batch_size=128"),
        (GRPO, ["+algorithm.codapo.resample=true"], r"algorithm\.codapo\.resample=true needs algorithm\.adv_estimator"),
        (CODAPO, ["+algorithm.codapo.weight_ofset=0.1"], r"unknown key.*algorithm\.codapo\.weight_ofset"),
        # CDE
        (CDE, ["algorithm.cde.kappa=0"], r"algorithm\.cde\.kappa must be a positive number"),
        (CDE, ["algorithm.cde.alpha=-1"], r"algorithm\.cde\.alpha must be a positive number"),
        (CDE, ["algorithm.cde.w0=-1"], r"algorithm\.cde\.w0 must be >= 0"),
        (CDE, ["algorithm.cde.w_zero_after_step=2.5"], r"algorithm\.cde\.w_zero_after_step must be a non-negative"),
        (
            CDE,
            ["trainer.use_v1=false"],
            r"algorithm\.cde\.w_zero_after_step=300 .*needs verl's v1 trainer.*"
            r"trainer\.use_v1=true",
        ),
        (CDE, ["+algorithm.cde.w_0=1"], r"unknown key.*algorithm\.cde\.w_0"),
        # CAPO (use_reference_policy given: need_reference_policy itself would already read the section)
        (CAPO, ["algorithm.capo.tau=1e-50"], r"algorithm\.capo\.tau=1e-50 is outside float32's range"),
        (CAPO, ["algorithm.capo.ref_high=0.5"], r"algorithm\.capo\.ref_high must be >= 1"),
        # a method's section is checked wherever it appears, e.g. the capo section read for every run's metrics
        (GRPO, ["+algorithm.capo.reward_threshold=high"], r"algorithm\.capo\.reward_threshold"),
        (GRPO, ["+algorithm.cde.kappa=0"], r"algorithm\.cde\.kappa"),
    ],
)
def test_bad_values_stop_in_verls_validate_config(configs, name, overrides, message):
    with pytest.raises(ValueError, match=message):
        configs.compose(name, overrides, resolve=False, use_reference_policy=True)


def test_valid_variants_pass_validate_config_and_keep_their_values(configs):
    """Values at the edge of each range pass verl's validate_config and reach the estimators' configs unchanged."""
    from capo_verl.estimators import CapoConfig, CdeConfig, CodapoConfig

    # constant weight on the legacy trainer: no step needed
    cfg = configs.compose(CDE, ["trainer.use_v1=false", "algorithm.cde.w_zero_after_step=null"], resolve=False)
    assert cfg.trainer.use_v1 is False and CdeConfig.from_algorithm_config(cfg.algorithm).w_zero_after_step is None
    cde = CdeConfig.from_algorithm_config(
        configs.compose(CDE, ["algorithm.cde.kappa=2", "algorithm.cde.w0=0"], resolve=False).algorithm
    )
    assert (cde.kappa, cde.w0, cde.w_zero_after_step) == (2, 0, 300)
    codapo = configs.compose(CODAPO, ["algorithm.codapo.weight_offset=0"], resolve=False)
    assert CodapoConfig.from_algorithm_config(codapo.algorithm).weight_offset == 0
    capo = configs.compose(CAPO, ["algorithm.capo.tau=3e-39"], resolve=False)
    assert CapoConfig.from_algorithm_config(capo.algorithm).tau == 3e-39


def _local_model(tmp_path: Path, config: dict | None) -> Path:
    folder = tmp_path / "model"
    folder.mkdir()
    if config is not None:
        (folder / "config.json").write_text(json.dumps(config))
    return folder


@pytest.mark.parametrize(
    "model_config, top_k, message",
    [
        ({"vocab_size": 5}, 5, None),
        ({"vocab_size": 5}, 6, r"policy_loss\.simko\.top_k=6 is larger than the vocabulary .*5 tokens"),
        ({"text_config": {"vocab_size": 4}}, 6, r"policy_loss\.simko\.top_k=6 is larger .*4 tokens"),
        (None, 3, r"model\.path=.* is a local directory, but its config\.json could not be read"),
        ({"hidden_size": 8}, 3, r"config\.json has no integer vocab_size"),
    ],
)
def test_simko_top_k_is_checked_against_a_local_models_vocabulary(configs, tmp_path, model_config, top_k, message):
    overrides = [
        f"actor_rollout_ref.model.path={_local_model(tmp_path, model_config)}",
        f"actor_rollout_ref.actor.policy_loss.simko.top_k={top_k}",
    ]
    if message is None:
        configs.compose("simko_qwen2.5_math_1.5b", overrides, resolve=False)
    else:
        with pytest.raises(ValueError, match=message):
            configs.compose("simko_qwen2.5_math_1.5b", overrides, resolve=False)


def test_simko_top_k_is_not_checked_for_a_hub_model(configs):
    """A hub id (not a local directory) is skipped: the vocabulary is unknown before the model is downloaded."""
    cfg = configs.compose(
        "simko_qwen2.5_math_1.5b", ["actor_rollout_ref.actor.policy_loss.simko.top_k=10000000"], resolve=False
    )
    assert cfg.actor_rollout_ref.model.path == "Qwen/Qwen2.5-Math-1.5B"


def test_launch_script_dry_run_stops_on_a_bad_key(configs, tmp_path):
    env = configs.script_env(PYTHON=sys.executable, CAPO_DATA_DIR=str(tmp_path), HOME=str(tmp_path))
    proc = subprocess.run(
        [
            "bash",
            str(REPO / "scripts" / "run_codapo_qwen2.5_math_1.5b.sh"),
            "--dry-run",
            "algorithm.codapo.percentile=1.5",
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode != 0
    assert "algorithm.codapo.percentile" in proc.stderr and "(0, 1)" in proc.stderr and "1.5" in proc.stderr
    assert "All configuration checks passed" not in proc.stdout
