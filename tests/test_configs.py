"""Every paper config composes with verl 0.9.1's real ppo_trainer config, passes verl's validate_config on CPU,
and resolves to the values of the paper's appendix table (configs/, capo_verl/reward.py wiring)."""

from __future__ import annotations

from pathlib import Path

import pytest
import verl  # noqa: F401  loads the capo-verl plugin (estimators, compat), as verl's launcher does
from omegaconf import OmegaConf
from verl.trainer.ppo import core_algos
from verl.trainer.ppo.reward import get_custom_reward_fn
from verl.trainer.ppo.utils import need_critic, need_reference_policy
from verl.utils.config import omega_conf_to_dataclass
from verl.workers.config import RolloutConfig

from capo_verl.compat.methods import ESTIMATORS
from capo_verl.estimators import CdeConfig, CodapoConfig

pytestmark = [
    pytest.mark.filterwarnings("ignore:Disabled critic as algorithm.adv_estimator:UserWarning"),
    pytest.mark.usefixtures("config_env"),
]

CONFIG_DIR = Path(__file__).resolve().parents[1] / "configs"
RUNS = [f"{m}_qwen2.5_math_{s}" for m in ("grpo", "gspo", "capo", "codapo", "cde") for s in ("1.5b", "7b")]
ABLATIONS = ["tau0.4", "tau0.6", "tau1.0", "mask_1.25_2.1", "no_mask", "grpo_mask"]
HF_ID = {"1.5b": "Qwen/Qwen2.5-Math-1.5B", "7b": "Qwen/Qwen2.5-Math-7B"}
STEPS = {"1.5b": 600, "7b": 400}
TAU = {"1.5b": 0.6, "7b": 0.5}


def assert_paper_table(cfg):
    """The appendix table and the shared settings of configs/base.yaml."""
    arr, actor, rollout = cfg.actor_rollout_ref, cfg.actor_rollout_ref.actor, cfg.actor_rollout_ref.rollout
    assert cfg.data.train_batch_size == 128
    assert actor.ppo_mini_batch_size == 64
    assert cfg.data.max_prompt_length == 1050 and rollout.prompt_length == 1050
    assert cfg.data.max_response_length == 3046 and rollout.response_length == 3046
    assert rollout.n == 8 and actor.rollout_n == 8
    assert rollout.temperature == 1.0 and rollout.top_p == 1.0 and rollout.top_k == -1 and rollout.do_sample
    assert rollout.val_kwargs.n == 16
    assert rollout.val_kwargs.temperature == 1.0 and rollout.val_kwargs.top_p == 1.0
    assert rollout.val_kwargs.do_sample is True
    assert actor.optim.lr == pytest.approx(1e-6)
    assert actor.entropy_coeff == 0
    # no KL anywhere
    assert actor.use_kl_loss is False and actor.kl_loss_coef == 0
    assert cfg.algorithm.use_kl_in_reward is False and cfg.algorithm.kl_ctrl.kl_coef == 0
    assert actor.loss_agg_mode == "seq-mean-token-mean"
    assert rollout.name == "vllm" and rollout.mode == "async"
    assert rollout.calculate_log_probs is True
    assert cfg.trainer.n_gpus_per_node == 8 and cfg.trainer.nnodes == 1
    assert cfg.trainer.val_calib is True
    assert cfg.reward.custom_reward_function.path == "pkg://capo_verl.reward"
    assert cfg.reward.custom_reward_function.name == "compute_score"
    assert arr.model.use_remove_padding is True
    assert need_critic(cfg) is False  # no value model in any run
    assert cfg.trainer.project_name == "capo"
    assert cfg.trainer.save_freq == 100 and cfg.trainer.test_freq == 20 and cfg.trainer.max_actor_ckpt_to_keep == 2


def assert_estimator_is_the_method(name: str):
    """verl's registry gives capo-verl's estimator for its names and verl's own GRPO for ``grpo``."""
    fn = core_algos.get_adv_estimator_fn(name)
    if name == "grpo":
        assert fn is core_algos.compute_grpo_outcome_advantage
    else:
        assert fn.__wrapped__ is ESTIMATORS[name].fn, (name, fn)


@pytest.mark.parametrize("name", RUNS)
def test_run_config_composes_validates_and_matches_paper(configs, name):
    method, size = name.split("_")[0], name.rsplit("_", 1)[1]
    cfg = configs.compose(name)
    assert_paper_table(cfg)
    actor = cfg.actor_rollout_ref.actor
    assert cfg.actor_rollout_ref.model.path == HF_ID[size]
    assert cfg.trainer.total_training_steps == STEPS[size]
    assert cfg.trainer.experiment_name == name
    assert cfg.trainer.default_local_dir == f"/home/u/checkpoints/capo/capo/{name}"
    assert cfg.data.train_files == "/home/u/data/capo/deepscaler_train.parquet"
    val_sets = ("deepscaler_val", "aime24", "aime25")
    assert list(cfg.data.val_files) == [f"/home/u/data/capo/{n}.parquet" for n in val_sets]
    # the rollout section converts to verl's RolloutConfig dataclass (as the workers do)
    assert omega_conf_to_dataclass(cfg.actor_rollout_ref.rollout, dataclass_type=RolloutConfig).n == 8
    if method == "grpo":
        assert cfg.algorithm.adv_estimator == "grpo"
        assert cfg.algorithm.norm_adv_by_std_in_grpo is False  # Dr. GRPO
        assert actor.policy_loss.loss_mode == "vanilla"
        assert actor.clip_ratio_low == 0.2 and actor.clip_ratio_high == 0.2 and actor.clip_ratio == 0.2
        assert need_reference_policy(cfg) is False
    elif method == "gspo":
        assert cfg.algorithm.adv_estimator == "grpo"
        assert actor.policy_loss.loss_mode == "gspo"
        assert actor.loss_agg_mode == "seq-mean-token-mean"
        assert actor.clip_ratio_low == pytest.approx(3e-4) and actor.clip_ratio_high == pytest.approx(4e-4)
        # verl's own GSPO loss: what the CPU end-to-end runs would add is verl's code, not capo-verl's
        assert core_algos.get_policy_loss_fn(actor.policy_loss.loss_mode) is core_algos.compute_policy_loss_gspo
        assert need_reference_policy(cfg) is False
    elif method == "codapo":
        assert cfg.algorithm.adv_estimator == "codapo"
        # the authors' values (tmlr-group/CoDaPO): weight_offset 0.1, std-normalised GRPO advantages, resampling of
        # the top quarter (percentile 0.75), each question 4 times
        assert dict(cfg.algorithm.codapo) == {
            "weight_offset": 0.1,
            "reward_threshold": 0.5,
            "resample": True,
            "percentile": 0.75,
            "repeat_count": 4,
        }
        assert cfg.algorithm.norm_adv_by_std_in_grpo is True
        assert CodapoConfig.from_algorithm_config(cfg.algorithm) == CodapoConfig(weight_offset=0.1, resample=True)
        assert actor.policy_loss.loss_mode == "vanilla" and actor.clip_ratio == 0.2
        assert need_reference_policy(cfg) is False  # no reference model
    elif method == "cde":
        assert cfg.algorithm.adv_estimator == "cde"
        # CDE paper: kappa 3, alpha 1; the staircase drops the bonus after half of the run
        assert dict(cfg.algorithm.cde) == {
            "w0": 1.0,
            "w_zero_after_step": STEPS[size] // 2,
            "kappa": 3.0,
            "alpha": 1.0,
            "reward_threshold": 0.5,
        }
        assert cfg.algorithm.norm_adv_by_std_in_grpo is True
        assert CdeConfig.from_algorithm_config(cfg.algorithm).w_zero_after_step == STEPS[size] // 2
        assert actor.policy_loss.loss_mode == "vanilla" and actor.clip_ratio == 0.2
        assert need_reference_policy(cfg) is False
        assert cfg.trainer.use_v1 is True  # the step schedule reads the v1 trainer's global_steps
    else:
        assert cfg.algorithm.adv_estimator == "capo"
        assert dict(cfg.algorithm.capo) == {
            "tau": TAU[size],
            "ref_high": 2.5,
            "ref_low": 1.05,
            "use_mask": True,
            "normalize": "none",
            "reward_threshold": 0.5,
        }
        assert actor.clip_ratio_low == 0.2 and actor.clip_ratio_high == 0.2
        # the noise mask needs ref_log_prob: the reference pass is on, without any KL term
        assert need_reference_policy(cfg) is True
    assert_estimator_is_the_method(cfg.algorithm.adv_estimator)


@pytest.mark.parametrize("size", ["1.5b", "7b"])
@pytest.mark.parametrize("ablation", ABLATIONS)
def test_ablation_configs(configs, ablation, size):
    cfg = configs.compose(f"capo_qwen2.5_math_{size}", [f"ablation={ablation}"])
    assert_paper_table(cfg)
    capo = cfg.algorithm.capo
    expected_name = {
        "tau0.4": f"capo_tau0.4_qwen2.5_math_{size}",
        "tau0.6": f"capo_tau0.6_qwen2.5_math_{size}",
        "tau1.0": f"capo_tau1.0_qwen2.5_math_{size}",
        "mask_1.25_2.1": f"capo_mask1.25-2.1_qwen2.5_math_{size}",
        "no_mask": f"capo_no_mask_qwen2.5_math_{size}",
        "grpo_mask": f"capo_grpo_mask_qwen2.5_math_{size}",
    }[ablation]
    assert cfg.trainer.experiment_name == expected_name  # own checkpoint folder: never resumes another run
    assert cfg.trainer.total_training_steps == STEPS[size]
    if ablation.startswith("tau"):
        assert cfg.algorithm.adv_estimator == "capo"
        assert capo.tau == float(ablation[3:])
        assert (capo.ref_low, capo.ref_high, capo.use_mask) == (1.05, 2.5, True)
    elif ablation == "mask_1.25_2.1":
        assert (capo.ref_low, capo.ref_high, capo.use_mask, capo.tau) == (1.25, 2.1, True, TAU[size])
    elif ablation == "no_mask":
        assert capo.use_mask is False and capo.tau == TAU[size]
        assert need_reference_policy(cfg) is False  # no reference model without the mask
    else:
        assert cfg.algorithm.adv_estimator == "grpo_mask"
        assert cfg.algorithm.norm_adv_by_std_in_grpo is False
        assert (capo.ref_low, capo.ref_high, capo.use_mask, capo.reward_threshold) == (1.05, 2.5, True, 0.5)
        assert need_reference_policy(cfg) is True
    assert_estimator_is_the_method(cfg.algorithm.adv_estimator)


@pytest.mark.parametrize("size", ["1.5b", "7b"])
def test_the_sweep_runs_every_ablation_config(tmp_path, size):
    """``run_ablations.sh`` without --only starts one CAPO run per file of configs/ablation/ (the main CAPO run's
    tau0.6 left out for 1.5b). The per-run script is a stand-in here that prints its arguments."""
    import shutil

    scripts = tmp_path / "scripts"
    scripts.mkdir()
    shutil.copy(CONFIG_DIR.parent / "scripts" / "run_ablations.sh", scripts)
    shutil.copytree(CONFIG_DIR / "ablation", tmp_path / "configs" / "ablation")
    (scripts / f"run_capo_qwen2.5_math_{size}.sh").write_text('echo "RUN $*"\n')
    proc = subprocess.run(
        ["bash", str(scripts / "run_ablations.sh"), "--size", size, "trainer.nnodes=2"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    runs = [line.split()[1:] for line in proc.stdout.splitlines() if line.startswith("RUN ")]
    folder = sorted(p.stem for p in (CONFIG_DIR / "ablation").glob("*.yaml") if p.stem != "none")
    assert sorted(name.removeprefix("ablation=") for name, _ in runs) == sorted(
        a for a in folder if not (size == "1.5b" and a == "tau0.6")
    )
    assert all(override == "trainer.nnodes=2" for _, override in runs)
    assert sorted(folder) == sorted(ABLATIONS)  # every ablation config is also tested above


@pytest.mark.parametrize("size", ["1.5b", "7b"])
def test_paths_from_variables(configs, monkeypatch, size):
    """Set once in the environment: data, checkpoints and model follow (also without the launch scripts)."""
    monkeypatch.setenv("CAPO_DATA_DIR", "/data/capo")
    monkeypatch.setenv("CAPO_CKPT_DIR", "/ckpt")
    monkeypatch.setenv("CAPO_MODEL_1_5B", "/models/m15")
    monkeypatch.setenv("CAPO_MODEL_7B", "/models/m7")
    cfg = configs.compose(f"gspo_qwen2.5_math_{size}")
    assert cfg.actor_rollout_ref.model.path == {"1.5b": "/models/m15", "7b": "/models/m7"}[size]
    assert cfg.data.train_files == "/data/capo/deepscaler_train.parquet"
    assert cfg.data.val_files[0] == "/data/capo/deepscaler_val.parquet"
    assert cfg.trainer.default_local_dir == f"/ckpt/capo/gspo_qwen2.5_math_{size}"


def test_method_keys_override_without_plus(configs):
    """The codapo and cde configs declare their sections: plain overrides reach the estimators' configs (bad values
    stop in verl's validate_config: tests/test_method_configs.py)."""
    cfg = configs.compose("cde_qwen2.5_math_1.5b", ["algorithm.cde.w0=0.5", "algorithm.cde.w_zero_after_step=null"])
    assert CdeConfig.from_algorithm_config(cfg.algorithm) == CdeConfig(w0=0.5, w_zero_after_step=None)
    cfg = configs.compose("codapo_qwen2.5_math_7b", ["algorithm.codapo.weight_offset=0.2"])
    assert CodapoConfig.from_algorithm_config(cfg.algorithm).weight_offset == 0.2


def test_overrides_without_plus(configs):
    """Users override the CAPO keys directly (no '+'), and the ablation tag follows the override."""
    cfg = configs.compose(
        "capo_qwen2.5_math_1.5b",
        ["algorithm.capo.tau=0.3", "algorithm.capo.ref_high=3.0", "trainer.val_calib=false", "trainer.nnodes=2"],
    )
    assert cfg.algorithm.capo.tau == 0.3 and cfg.algorithm.capo.ref_high == 3.0
    assert cfg.trainer.val_calib is False and cfg.trainer.nnodes == 2


def test_reward_function_loads_through_verl(configs):
    """verl's own loader finds capo_verl.reward.compute_score from the config and it grades."""
    cfg = configs.compose("grpo_qwen2.5_math_1.5b")
    fn = get_custom_reward_fn(cfg)
    out = fn(data_source="aime24", solution_str="so the answer is \\boxed{204}.", ground_truth="204", extra_info={})
    assert out == {"score": 1.0, "acc": 1.0, "pred": "204"}


# ---------------------------------------------------------------------------------------------------------
# launch scripts: --dry-run. The scripts run with a stand-in Python (conftest.py: stand_in_python) that passes their
# "is verl importable" check and skips their config printing; the printed command is then composed here, in-process,
# exactly as the dry run's own Python does (compose + verl's validate_config). The scripts' real printing runs in
# test_scripts_use_the_project_venv_without_PYTHON and tests/test_method_configs.py.
# ---------------------------------------------------------------------------------------------------------
import os  # noqa: E402
import shlex  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402

SCRIPTS_DIR = CONFIG_DIR.parent / "scripts"
DRY_RUNS = {f"run_{name}.sh": ["--dry-run", "trainer.test_freq=7"] for name in RUNS}
DRY_RUNS["run_ablations.sh"] = ["--dry-run", "--only", "tau0.4,grpo_mask", "--size", "7b"]


def _script_env(configs, data_dir: Path, python: str = sys.executable) -> dict[str, str]:
    return configs.script_env(
        PYTHON=python,
        CAPO_DATA_DIR=str(data_dir),
        CAPO_CKPT_DIR="/ckpt/capo",
        CAPO_MODEL_1_5B="/models/qwen-math-1.5b",
        NNODES="2",
    )


@pytest.fixture(scope="module")
def dry_runs(configs, tmp_path_factory, stand_in_python):
    """Every script's --dry-run with the stand-in Python; {script: (rc, out, err)}."""
    data_dir = tmp_path_factory.mktemp("data")  # empty: the dry run warns about missing files, starts nothing
    env = _script_env(configs, data_dir, str(stand_in_python))
    results = {}
    for script, args in DRY_RUNS.items():
        proc = subprocess.run(
            ["bash", str(SCRIPTS_DIR / script), *args], env=env, capture_output=True, text=True, timeout=60
        )
        results[script] = (proc.returncode, proc.stdout, proc.stderr)
    return data_dir, results


def _commands(out: str) -> list[list[str]]:
    lines = out.splitlines()
    return [shlex.split(lines[i + 1]) for i, ln in enumerate(lines) if ln.startswith("# command (dry run")]


def _compose_command(configs, cmd: list[str]):
    """Compose ``python -m verl.trainer.main_ppo --config-path=D --config-name=N OVERRIDES...`` like the dry run."""
    assert cmd[1:3] == ["-m", "verl.trainer.main_ppo"] and cmd[3] == f"--config-path={CONFIG_DIR}", cmd
    return configs.compose(cmd[4].removeprefix("--config-name="), cmd[5:])


@pytest.mark.parametrize("name", RUNS)
def test_run_script_dry_run(configs, dry_runs, stand_in_python, name):
    data_dir, results = dry_runs
    rc, out, err = results[f"run_{name}.sh"]
    assert rc == 0, err[-3000:]
    size = name.rsplit("_", 1)[1]
    [cmd] = _commands(out)
    assert cmd[0] == str(stand_in_python)  # $PYTHON
    assert cmd[4] == f"--config-name={name}"
    assert cmd[-1] == "trainer.test_freq=7"  # "$@" passed through, last
    assert any(
        ln.startswith("# warning: ") and f"{data_dir}/deepscaler_train.parquet " in ln and "exist" in ln
        for ln in out.splitlines()
    ), out
    # what the dry run's Python is given (capo_verl.cpu.launch --dry-run): the data files the script lacks, the command
    [given] = [ln.split()[3:] for ln in out.splitlines() if ln.startswith("# stand-in python: ")]
    assert given[given.index("--") + 1 :] == cmd
    assert given[: given.index("--")][:2] == ["--script-file", f"{data_dir}/deepscaler_train.parquet"]
    cfg = _compose_command(configs, cmd)
    model = "/models/qwen-math-1.5b" if size == "1.5b" else HF_ID["7b"]  # env variable, else the HF id
    assert cfg.actor_rollout_ref.model.path == model
    assert cfg.data.train_files == f"{data_dir}/deepscaler_train.parquet"
    assert list(cfg.data.val_files) == [f"{data_dir}/{n}.parquet" for n in ("deepscaler_val", "aime24", "aime25")]
    assert cfg.trainer.default_local_dir == f"/ckpt/capo/capo/{name}"
    assert cfg.trainer.nnodes == 2 and cfg.trainer.n_gpus_per_node == 8
    assert cfg.trainer.test_freq == 7
    assert cfg.trainer.total_training_steps == STEPS[size]
    assert cfg.actor_rollout_ref.rollout.val_kwargs.n == 16 and cfg.data.train_batch_size == 128


def test_ablation_sweep_dry_run(configs, dry_runs):
    _, results = dry_runs
    rc, out, err = results["run_ablations.sh"]
    assert rc == 0, err[-3000:]
    cmds = _commands(out)
    assert [c[-1] for c in cmds] == ["ablation=tau0.4", "ablation=grpo_mask"]
    assert all("--config-name=capo_qwen2.5_math_7b" in c for c in cmds)
    tau, mask = (_compose_command(configs, c) for c in cmds)
    assert tau.trainer.experiment_name == "capo_tau0.4_qwen2.5_math_7b" and tau.algorithm.capo.tau == 0.4
    assert mask.trainer.experiment_name == "capo_grpo_mask_qwen2.5_math_7b"
    assert mask.algorithm.adv_estimator == "grpo_mask"


def test_printed_command_is_what_verl_main_ppo_parses(dry_runs):
    """The exact printed command, given to verl's real Hydra entry point (with --cfg job: print, no run)."""
    _, results = dry_runs
    [cmd] = _commands(results["run_capo_qwen2.5_math_1.5b.sh"][1])
    proc = subprocess.run(
        [sys.executable, *cmd[1:], "ablation=no_mask", "--cfg", "job", "--resolve"],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    cfg = OmegaConf.create(proc.stdout)
    assert cfg.trainer.experiment_name == "capo_no_mask_qwen2.5_math_1.5b"
    assert cfg.trainer.default_local_dir == "/ckpt/capo/capo/capo_no_mask_qwen2.5_math_1.5b"
    assert cfg.algorithm.capo.use_mask is False and cfg.trainer.test_freq == 7


def test_launch_refuses_without_data(configs, tmp_path):
    """Without --dry-run the script checks the data files first and names the fix; nothing starts."""
    env = _script_env(configs, tmp_path)
    proc = subprocess.run(
        ["bash", str(SCRIPTS_DIR / "run_grpo_qwen2.5_math_1.5b.sh")], env=env, capture_output=True, text=True
    )
    assert proc.returncode == 2
    assert "missing data file(s)" in proc.stderr and "capo-verl prepare-data" in proc.stderr


def test_script_rejects_unknown_option(configs, tmp_path):
    proc = subprocess.run(
        ["bash", str(SCRIPTS_DIR / "run_capo_qwen2.5_math_7b.sh"), "--dryrun"],
        env=_script_env(configs, tmp_path),
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 2 and "unknown option --dryrun" in proc.stderr


def _fake_repo(tmp_path: Path) -> Path:
    """A copy of scripts/ and configs/ (the launcher finds .venv next to them), without a .venv."""
    import shutil

    repo = tmp_path / "repo"
    shutil.copytree(SCRIPTS_DIR, repo / "scripts")
    shutil.copytree(CONFIG_DIR, repo / "configs")
    return repo


def test_scripts_use_the_project_venv_without_PYTHON(configs, tmp_path):
    """After scripts/setup.sh a plain `bash scripts/run_*.sh` runs .venv/bin/python when no active environment can
    import verl (here python3 on PATH is a Python without site-packages)."""
    repo = _fake_repo(tmp_path)
    venv_python = repo / ".venv" / "bin" / "python"
    venv_python.parent.mkdir(parents=True)
    venv_python.write_text(f'#!/bin/sh\nexec "{sys.executable}" "$@"\n')  # a Python with verl, as setup.sh makes
    venv_python.chmod(0o755)
    env = _script_env(configs, tmp_path)
    env.pop("PYTHON")
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "python3").write_text(f'#!/bin/sh\nexec "{sys.executable}" -S "$@"\n')
    (bin_dir / "python3").chmod(0o755)
    env["PATH"] = f"{bin_dir}{os.pathsep}{env['PATH']}"
    proc = subprocess.run(
        ["bash", str(repo / "scripts" / "run_codapo_qwen2.5_math_1.5b.sh"), "--dry-run"],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    [cmd] = _commands(proc.stdout)
    assert cmd[0] == str(repo / ".venv" / "bin" / "python")
    assert "All configuration checks passed" in proc.stdout


@pytest.mark.parametrize("python", ["missing", "without_verl"])
def test_scripts_stop_clearly_without_a_python_with_verl(configs, tmp_path, python):
    repo = _fake_repo(tmp_path)
    env = _script_env(configs, tmp_path)
    if python == "missing":
        env["PYTHON"] = str(tmp_path / "no" / "python")
    else:  # no PYTHON and no .venv: python3 from PATH, here a real Python without site-packages, so without verl
        env.pop("PYTHON")
        bin_dir = tmp_path / "bin"
        bin_dir.mkdir()
        (bin_dir / "python3").write_text(f'#!/bin/sh\nexec "{sys.executable}" -S "$@"\n')
        (bin_dir / "python3").chmod(0o755)
        env["PATH"] = f"{bin_dir}{os.pathsep}{env['PATH']}"
    for script in ("run_cde_qwen2.5_math_7b.sh", "run_capo_qwen2.5_math_1.5b.sh"):
        proc = subprocess.run(
            ["bash", str(repo / "scripts" / script), "--dry-run"], env=env, capture_output=True, text=True, timeout=120
        )
        assert proc.returncode == 2, (proc.stdout[-2000:], proc.stderr[-2000:])
        assert "error: no Python with verl" in proc.stderr and "bash scripts/setup.sh" in proc.stderr
        assert ("was not found" if python == "missing" else "cannot import verl") in proc.stderr
        assert "ModuleNotFoundError" not in proc.stderr and "# command" not in proc.stdout
