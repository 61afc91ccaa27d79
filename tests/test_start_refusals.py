"""Bad values of the main job are refused at ``--dry-run``, before any model loads, in one line that names the key,
the value, what is allowed and a fix; and every fix in such a line works when pasted onto the command line.

Before, ``bash scripts/run_capo_smollm2_cpu.sh --dry-run`` accepted ``algorithm.adv_estimator=capoo``,
``actor_rollout_ref.rollout.n=1``, ``trainer.total_training_steps=0``, ``algorithm.capo.ref_low=30
algorithm.capo.ref_high=20`` and ``data.train_files=/nonexistent.parquet``; the real runs failed, or trained nothing,
after the model and vLLM had loaded (2.5-3 min). ``algorithm.capo.tau=0`` was refused with the fix
``+algorithm.capo.tau=0.6``, which Hydra refuses for a key the config has.

One real ``--dry-run`` of the script gives its exact command; the rows are then checked in-process with
:func:`capo_verl.cpu.launch.checked_config`, which is what the script's ``--dry-run`` runs (one ``import verl`` for
all).
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
from omegaconf import OmegaConf

from capo_verl.compat.run_checks import batch_problem, format_value, launch_script_files, override
from capo_verl.cpu import launch

pytestmark = pytest.mark.filterwarnings("ignore:Disabled critic as algorithm.adv_estimator:UserWarning")

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "scripts" / "run_capo_smollm2_cpu.sh"
#: a Hydra override as the messages write a fix: key=value, key and value without spaces, commas or brackets
OVERRIDE = re.compile(r"(?<![\w.+])\+{0,2}[a-z_]\w*(?:\.\w+)+=[^\s,;()]+")


def _env(tmp: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("RAY_ADDRESS", "CONFIG_NAME", "CAPO_REWARD_PROCS")}
    env.update(PYTHON=sys.executable, HOME=str(tmp), CAPO_CPU_DATA_DIR=str(tmp / "data"), **extra)
    return env


@pytest.fixture(scope="module")
def main_job(script_dry_run, tmp_path_factory):
    """The main job's real ``--dry-run`` with the first row of the issue: refused in one line, no traceback, and
    the exact command it would run; ``(command, files the script writes before a real run)``."""
    tmp = tmp_path_factory.mktemp("main_job")
    proc = script_dry_run(SCRIPT.name, tmp, "algorithm.adv_estimator=capoo")
    assert proc.returncode == 2, proc.stdout[-2000:] + proc.stderr[-2000:]
    [error] = proc.errors
    assert error.startswith("error: ValueError: algorithm.adv_estimator=capoo"), proc.stderr[-3000:]
    assert names(error, "capo", "cde", "codapo", "grpo_mask", "gae", "grpo", "rloo"), error  # what is registered
    assert fixes(error) == ["algorithm.adv_estimator=capo"], error
    assert "Traceback" not in proc.stderr
    lines = proc.stdout.splitlines()
    [cmd] = [shlex.split(lines[i + 1]) for i, ln in enumerate(lines) if ln.startswith("# command (dry run")]
    assert cmd[-1] == "algorithm.adv_estimator=capoo"
    data = tmp / "data"
    model = next(a.partition("=")[2] for a in cmd if a.startswith("actor_rollout_ref.model.path="))
    return cmd[:-1], [str(data / "gsm8k_calc_train.parquet"), str(data / "gsm8k_calc_val.parquet"), model]


def check(main_job, *overrides: str):
    cmd, files = main_job
    return launch.checked_config([*cmd, *overrides], files)


def refusal(main_job, *overrides: str) -> str:
    with pytest.raises(ValueError) as info:
        check(main_job, *overrides)
    message = str(info.value)
    assert "\n" not in message, message
    return message


def names(message: str, *parts: str) -> bool:
    """Whether ``message`` names each of ``parts`` (a key, a value, what is allowed): what a refusal test asserts,
    leaving the sentence around them free to change."""
    return all(part in message for part in parts)


def fixes(message: str) -> list[str]:
    """The overrides a message gives as its fix: those after its last ';'."""
    return [m.rstrip(".") for m in OVERRIDE.findall(message.rsplit(";", 1)[-1])]


def follow_fixes(main_job, overrides: list[str], steps: int = 4) -> list[str]:
    """Paste each refusal's first fix after the command, as a user would, until the config passes; the fixes."""
    pasted = []
    for _ in range(steps):
        try:
            check(main_job, *overrides, *pasted)
            return pasted
        except ValueError as exc:
            found = fixes(str(exc))
            assert found, f"no fix to paste in: {exc}"
            assert found[0] not in pasted, f"the same fix again: {exc}"
            pasted.append(found[0])
    raise AssertionError(f"still refused after pasting {pasted}")


# --- the rows: (overrides, the key the line starts with, other things it names) ------------------------------
ROWS = [
    (["actor_rollout_ref.rollout.n=1"], "actor_rollout_ref.rollout.n=1", ["capo", "2"]),
    (["trainer.total_training_steps=0"], "trainer.total_training_steps=0", ["null"]),
    (["algorithm.capo.ref_low=30", "algorithm.capo.ref_high=20"], "algorithm.capo.ref_low=30", ["ref_high=20"]),
    (["data.train_files=/nonexistent.parquet"], "data.train_files=/nonexistent.parquet", []),
    (["algorithm.capo.tau=0"], "algorithm.capo.tau", ["0"]),
    (["algorithm.capo.ref_high=0"], "algorithm.capo.ref_high", ["0"]),
    (["algorithm.capo.ref_low=-1"], "algorithm.capo.ref_low", ["-1"]),
]

#: keys added with ``+`` that nothing reads: (overrides, the line's start, what else it names, the fix's overrides)
UNREAD = [
    (
        ["+actor_rollout_ref.ref.enable=false"],
        "+actor_rollout_ref.ref.enable=false",
        ["FSDPActorConfig", "'enable'"],
        ["~actor_rollout_ref.ref.enable"],
    ),
    (
        ["+actor_rollout_ref.actor.clip_ratio_lo=0.1"],
        "+actor_rollout_ref.actor.clip_ratio_lo=0.1",
        ["FSDPActorConfig", "actor_rollout_ref.actor.clip_ratio_low"],
        ["~actor_rollout_ref.actor.clip_ratio_lo", "actor_rollout_ref.actor.clip_ratio_low=0.1"],
    ),
    (
        ["+actor_rollout_ref.model.lora_rnk=8"],
        "+actor_rollout_ref.model.lora_rnk=8",
        ["HFModelConfig"],
        ["~actor_rollout_ref.model.lora_rnk", "actor_rollout_ref.model.lora_rank=8"],
    ),
]


@pytest.mark.parametrize("overrides, key, parts, expected", UNREAD)
def test_a_new_key_nothing_reads_is_refused_and_its_fix_works_when_pasted(main_job, overrides, key, parts, expected):
    message = refusal(main_job, *overrides)
    assert message.startswith(key) and names(message, *parts), message
    found = message.rsplit("; ", 1)[1].rsplit("set ", 1)[1].split()  # ~key deletes the key again
    assert found == expected, message
    check(main_job, *overrides, *found)


@pytest.mark.parametrize(
    "override",
    [
        "+actor_rollout_ref.actor.fsdp_config.mixed_precision={param_dtype:fp32}",  # a field verl's YAML lacks
        "+reward.custom_reward_function.reward_kwargs.timeout_s=5",  # a free-form dict of verl's config
    ],
)
def test_a_new_key_that_verl_or_capo_verl_reads_passes(main_job, override):
    check(main_job, override)


@pytest.mark.parametrize("overrides, key, parts", ROWS)
def test_each_mistake_is_refused_in_one_line_and_its_fix_works_when_pasted(main_job, overrides, key, parts):
    message = refusal(main_job, *overrides)
    assert message.startswith(key) and names(message, *parts), message
    found = fixes(message)
    assert found and all(not f.startswith("+") for f in found), message  # the configs declare every key here
    for fix in found:
        check(main_job, *overrides, fix)


def test_the_tau_fix_pasted_into_the_real_dry_run_passes(script_dry_run, tmp_path):
    """The fix the issue found wrong (``+algorithm.capo.tau=0.6``), now without ``+``, in the script's own
    ``--dry-run``: the config is printed, status 0."""
    refused = script_dry_run(SCRIPT.name, tmp_path, "algorithm.capo.tau=0")
    assert refused.returncode == 2 and len(refused.errors) == 1, refused.stderr[-3000:]
    [message] = refused.errors
    assert message.startswith("error: ValueError: algorithm.capo.tau") and "Traceback" not in refused.stderr
    assert fixes(message) == ["algorithm.capo.tau=0.6"], message  # the config's default, no +
    proc = script_dry_run(SCRIPT.name, tmp_path, "algorithm.capo.tau=0", *fixes(message))
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "    tau: 0.6\n" in proc.stdout


def test_the_data_fix_is_the_scripts_own_file(main_job):
    message = refusal(main_job, "data.train_files=/nonexistent.parquet")
    assert fixes(message) == [f"data.train_files={main_job[1][0]}"]


def test_the_fix_has_a_plus_only_where_the_config_lacks_the_key(main_job):
    """Without an algorithm.capo section (verl's own configs; here deleted with ``~``), ``+`` adds a key; the fix
    for its value then needs none. A fix for a key the config still lacks has one."""
    lacking = "~algorithm.capo"
    assert fixes(refusal(main_job, lacking, "+algorithm.capo.tau=0")) == ["algorithm.capo.tau=0.6"]
    check(main_job, lacking, "+algorithm.capo.tau=0", "algorithm.capo.tau=0.6")
    # ref_high below the default ref_low (1.05): the fix sets ref_low, which the composed config lacks
    message = refusal(main_job, lacking, "+algorithm.capo.ref_high=1.0")
    assert fixes(message) == ["+algorithm.capo.ref_low=1"], message
    check(main_job, lacking, "+algorithm.capo.ref_high=1.0", "+algorithm.capo.ref_low=1")


# --- every fix of capo-verl's messages: (overrides that are refused, the key the line starts with, what it names) --
N1 = "actor_rollout_ref.rollout.n=1"
MORE = [
    (["algorithm.adv_estimator=capoo"], "algorithm.adv_estimator=capoo", []),
    (["algorithm.adv_estimator=GRPO"], "algorithm.adv_estimator=GRPO", ["grpo"]),
    (["algorithm.adv_estimator=grpo", N1], N1, ["grpo"]),
    (["algorithm.adv_estimator=grpo_mask", N1], N1, ["grpo_mask"]),
    (["algorithm.adv_estimator=codapo", N1], N1, ["codapo"]),
    (["algorithm.adv_estimator=cde", N1], N1, ["cde"]),
    (["algorithm.adv_estimator=rloo", N1], N1, ["rloo"]),
    (["algorithm.adv_estimator=grpo", "algorithm.capo.tau=0.4"], "algorithm.capo.tau=0.4", ["capo", "grpo"]),
    (["algorithm.capo.use_mask=false", "algorithm.capo.ref_low=1.2"], "algorithm.capo.ref_low=1.2", ["use_mask"]),
    (["algorithm.adv_estimator=grpo_mask", "algorithm.capo.tau=0.3"], "algorithm.capo.tau=0.3", ["grpo_mask"]),
    (["trainer.total_training_steps=-3"], "trainer.total_training_steps=-3", []),
    (["trainer.total_epochs=0"], "trainer.total_epochs=0", []),
    (["trainer.total_training_steps=null"], "trainer.save_freq=null", []),  # ${trainer.total_training_steps}
    (["trainer.test_freq=null"], "trainer.test_freq=null", []),
    (["trainer.resume_mode=resume"], "trainer.resume_mode=resume", ["auto", "disable", "resume_path"]),
    (["trainer.resume_mode=resume_path"], "trainer.resume_from_path=null", ["trainer.resume_mode=resume_path"]),
    (["data.val_files=[/nowhere/a.parquet]"], "data.val_files=[/nowhere/a.parquet]", ["/nowhere/a.parquet"]),
    (["actor_rollout_ref.rollout.n=2"], "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=16", []),
    (["actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=3"], "actor_rollout_ref.actor.ppo_micro_batch_size", []),
    (["actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=32"], "actor_rollout_ref.ref.log_prob_micro", []),
    (["algorithm.capo.tau=1e39"], "algorithm.capo.tau=1e+39", ["float32"]),
    (["algorithm.capo.ref_high=0.5"], "algorithm.capo.ref_high", ["1"]),
    (["algorithm.capo.reward_threshold=x"], "algorithm.capo.reward_threshold", []),
    (["algorithm.adv_estimator=codapo", "+algorithm.codapo.weight_offset=nan"], "algorithm.codapo.weight_offset", []),
    (["algorithm.adv_estimator=cde", "+algorithm.cde.kappa=0"], "algorithm.cde.kappa", []),
    (
        ["algorithm.adv_estimator=cde", "+algorithm.cde.w_zero_after_step=3", "trainer.use_v1=false"],
        "algorithm.cde.w_zero_after_step=3",
        ["v1"],
    ),
]


@pytest.mark.parametrize("overrides, key, parts", MORE)
def test_following_the_fixes_gives_a_config_that_passes(main_job, overrides, key, parts):
    """Each message names the key and value and a fix; pasting its fix (then the next message's, if the first fix
    uncovers another value to change) gives a config that composes and passes every check."""
    message = refusal(main_job, *overrides)
    assert message.startswith(key) and names(message, *parts), message
    pasted = follow_fixes(main_job, overrides)
    assert pasted, message


def test_a_fix_for_batch_sizes_keeps_them_dividing(main_job):
    """rollout.n=2 on the main job: 8 responses per step against micro-batches of 16, for the log-prob pass, the
    reference pass and the update; following the fixes sets each to 8."""
    pasted = follow_fixes(main_job, ["actor_rollout_ref.rollout.n=2"])
    assert pasted == [
        "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=8",
        "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=8",
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=8",
    ]


def test_the_training_set_must_hold_the_batch_and_the_steps(main_job, tmp_path):
    train = tmp_path / "train.parquet"
    rows = {
        "data_source": ["sums"] * 10,
        "prompt": [[{"role": "user", "content": "1+1?"}]] * 10,
        "reward_model": [{"style": "rule", "ground_truth": "2"}] * 10,
    }
    pd.DataFrame(rows).to_parquet(train)
    data = f"data.train_files={train}"
    message = refusal(main_job, data, "data.train_batch_size=16")
    assert message.startswith("data.train_batch_size=16") and names(message, "10", "data.train_files"), message
    assert fixes(message) == ["data.train_batch_size=10"]
    message = refusal(main_job, data, "trainer.total_training_steps=6")  # batch 4: 2 steps an epoch
    assert message.startswith("trainer.total_training_steps=6") and names(message, "trainer.total_epochs=1", "2"), (
        message
    )
    assert fixes(message) == ["trainer.total_epochs=3"]
    check(main_job, data, "trainer.total_training_steps=6", "trainer.total_epochs=3")
    # CoDaSampling trains each loader batch twice (a prepare and an apply step): 4 steps an epoch
    codapo = ["algorithm.adv_estimator=codapo", "+algorithm.codapo.resample=true", "+algorithm.codapo.repeat_count=4"]
    check(main_job, data, *codapo, "trainer.total_training_steps=4")
    message = refusal(main_job, data, *codapo, "trainer.total_training_steps=6")
    assert message.startswith("trainer.total_training_steps=6") and names(message, "4 steps", "10 rows"), message
    assert fixes(message) == ["trainer.total_epochs=2"]


def test_data_files_are_checked_in_the_trainers_process_and_the_dry_run_only(main_job):
    """Composing a config (tests, capo-verl compare's checks before it writes its data) does not read the files."""
    from hydra import compose, initialize_config_dir
    from verl.trainer.ppo.utils import need_critic, need_reference_policy
    from verl.utils.config import validate_config

    with initialize_config_dir(config_dir=str(REPO / "configs"), version_base=None):
        cfg = compose(config_name="capo_smollm2_135m_cpu", overrides=["data.train_files=/nonexistent.parquet"])
    validate_config(config=cfg, use_reference_policy=need_reference_policy(cfg), use_critic=need_critic(cfg))
    with launch_script_files(), pytest.raises(ValueError, match=r"^data\.train_files=/nonexistent\.parquet\b"):
        validate_config(config=cfg, use_reference_policy=need_reference_policy(cfg), use_critic=need_critic(cfg))


def test_override_and_format_value():
    cfg = OmegaConf.create({"a": {"b": 1, "n": None}})
    assert override(cfg, "a.b", 2) == "a.b=2"
    assert override(cfg, "a.n", True) == "a.n=true"
    assert override(cfg, "a.c", None) == "+a.c=null"
    assert override(cfg, "x.y", [1, "p"]) == "+x.y=[1,p]"
    assert format_value(OmegaConf.create([1, 2])) == "[1,2]"


def test_batch_problem_is_silent_for_dynamic_batch_sizes():
    cfg = OmegaConf.create(
        {
            "data": {"train_batch_size": 4},
            "trainer": {"nnodes": 1, "n_gpus_per_node": 1},
            "actor_rollout_ref": {
                "actor": {"use_dynamic_bsz": True, "strategy": "fsdp2", "ppo_mini_batch_size": 4},
                "rollout": {"n": 3, "log_prob_micro_batch_size_per_gpu": 5},
            },
        }
    )
    assert batch_problem(cfg, use_reference_policy=False) is None
    cfg.actor_rollout_ref.actor.use_dynamic_bsz = False
    assert "log_prob_micro_batch_size_per_gpu=4" in batch_problem(cfg, use_reference_policy=False)


# --- --help ------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("flag", ["--help", "-h"])
@pytest.mark.parametrize(
    "script", ["run_capo_smollm2_cpu.sh", "run_grpo_smollm2_cpu.sh", "run_capo_qwen2.5_math_1.5b.sh"]
)
def test_help_prints_the_scripts_usage(tmp_path, script, flag):
    proc = subprocess.run(
        ["bash", str(REPO / "scripts" / script), "trainer.total_training_steps=2", flag],
        env=_env(tmp_path),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0 and proc.stderr == "", proc.stderr
    out = proc.stdout
    assert out.startswith("usage: bash scripts/") and "[--dry-run] [-h|--help] [HYDRA_OVERRIDE ...]" in out
    assert "--dry-run" in out and "HYDRA_OVERRIDE" in out and "examples" in out
    assert len(out.splitlines()) < 60  # the script's usage, not Hydra's ~1,000 lines
    assert not (tmp_path / "data").exists()  # nothing written


def test_an_unknown_option_points_to_help(tmp_path):
    proc = subprocess.run(["bash", str(SCRIPT), "-x"], env=_env(tmp_path), capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    assert names(proc.stderr, "-x", "bash scripts/run_capo_smollm2_cpu.sh --help"), proc.stderr


def test_format_value_of_the_messages():
    assert format_value(None) == "null" and format_value(False) == "false" and format_value("a") == "a"


def test_resume_path_must_name_an_existing_checkpoint_folder(main_job, tmp_path):
    step = tmp_path / "global_step_2"
    (step / "actor").mkdir(parents=True)  # a whole checkpoint of the main job (one rank), as verl saves it
    for kind in ("model", "optim", "extra_state"):
        (step / "actor" / f"{kind}_world_size_1_rank_0.pt").write_bytes(b"x")
    (step / "data.pt").write_bytes(b"x")
    mode = "trainer.resume_mode=resume_path"
    check(main_job, mode, f"trainer.resume_from_path={step}")
    message = refusal(main_job, mode, f"trainer.resume_from_path={tmp_path}/global_step_3")
    assert message.startswith(f"trainer.resume_from_path={tmp_path}/global_step_3") and names(message, mode), message
    message = refusal(main_job, mode, f"trainer.resume_from_path={step}/actor")
    assert message.startswith(f"trainer.resume_from_path={step}/actor") and names(message, "global_step_<N>"), message
    assert fixes(message) == ["trainer.resume_mode=auto"]


# --- values that passed --dry-run and failed, or did nothing, later ------------------------------------------------
LATE = [
    (["actor_rollout_ref.model.path=/nonexistent/model"], "actor_rollout_ref.model.path=/nonexistent/model", []),
    (
        ["actor_rollout_ref.rollout.calculate_log_probs=false"],
        "actor_rollout_ref.rollout.calculate_log_probs=false",
        ["val-calib", "trainer.val_calib=false"],
    ),
    (["actor_rollout_ref.actor.ppo_mini_batch_size=0"], "actor_rollout_ref.actor.ppo_mini_batch_size=0", [">= 1"]),
    (["data.max_response_length=0"], "data.max_response_length=0", [">= 1"]),
    (["actor_rollout_ref.rollout.name=sglang"], "actor_rollout_ref.rollout.name=sglang", ["trainer.device=cpu"]),
    (["actor_rollout_ref.rollout.name=hf"], "actor_rollout_ref.rollout.name=hf", ["vllm", "sglang"]),
    (["actor_rollout_ref.actor.optim.lr=-1"], "actor_rollout_ref.actor.optim.lr=-1", ["> 0"]),
    (["actor_rollout_ref.actor.optim.lr=nan"], "actor_rollout_ref.actor.optim.lr=nan", ["> 0"]),
    (["actor_rollout_ref.rollout.val_kwargs.n=1"], "actor_rollout_ref.rollout.val_kwargs.n=1", ["val-calib"]),
    (["trainer.val_before_train=maybe"], "trainer.val_before_train=maybe", ["true", "false"]),
    (["data.max_prompt_length=-1"], "data.max_prompt_length=-1", [">= 1"]),
    (["trainer.device=tpu"], "trainer.device=tpu", ["cuda", "npu", "cpu"]),
    (["trainer.n_gpus_per_node=0"], "trainer.n_gpus_per_node=0", [">= 1"]),
    (["trainer.nnodes=0"], "trainer.nnodes=0", [">= 1"]),
    (["trainer.default_local_dir=/proc/capo_ckpt"], "trainer.default_local_dir=/proc/capo_ckpt", []),
    (["trainer.default_local_dir="], "trainer.default_local_dir=:", []),
    (["+trainer.validation_data_dir=/proc/v"], "trainer.validation_data_dir=/proc/v", []),
    (["+trainer.rollout_data_dir=/proc/r"], "trainer.rollout_data_dir=/proc/r", []),
]


@pytest.mark.parametrize("overrides, key, parts", LATE)
def test_values_that_failed_late_are_refused_at_start_with_a_fix_that_works(main_job, overrides, key, parts):
    message = refusal(main_job, *overrides)
    assert message.startswith(key) and names(message, *parts), message
    found = fixes(message)
    assert found, message
    for fix in found:
        check(main_job, *overrides, fix)


def test_the_val_calib_inputs_are_not_needed_without_the_metrics(main_job):
    """GRPO with trainer.val_calib=auto logs val-calib/* only when it can: no log-probs, one sample, both fine."""
    check(
        main_job,
        "algorithm.adv_estimator=grpo",
        "trainer.val_calib=auto",
        "actor_rollout_ref.rollout.calculate_log_probs=false",
        "actor_rollout_ref.rollout.val_kwargs.n=1",
    )


def test_cuda_is_refused_on_a_machine_without_it_only_for_this_machine(main_job, monkeypatch):
    """Asked for on the command line (or in the trainer's own process), trainer.device=cuda without CUDA is refused;
    a --dry-run of a GPU config on another machine (the config's own value) is not."""
    from capo_verl.compat import run_checks

    monkeypatch.setattr(run_checks, "_cuda_available", lambda: False)
    message = refusal(main_job, "trainer.device=cuda")
    assert message.startswith("trainer.device=cuda") and "CUDA" in message, message
    assert fixes(message) == ["trainer.device=cpu"]
    cmd, files = main_job
    gpu = [a for a in cmd if not a.startswith("--config-name")] + ["--config-name=capo_qwen2.5_math_1.5b"]
    cfg = launch.checked_config(gpu, files)
    assert cfg.trainer.device == "cuda"


def test_a_file_in_the_way_of_the_checkpoint_folder(main_job, tmp_path):
    (tmp_path / "afile").write_text("x")
    message = refusal(main_job, f"trainer.default_local_dir={tmp_path}/afile/ckpt")
    assert message.startswith(f"trainer.default_local_dir={tmp_path}/afile/ckpt") and f"{tmp_path}/afile," in message
    [fix] = fixes(message)
    check(main_job, f"trainer.default_local_dir={tmp_path}/afile/ckpt", fix)


def test_the_write_check_leaves_nothing_behind(main_job, tmp_path):
    """A checkpoint folder that does not exist yet is made, written in and removed again, its parents too."""
    check(main_job, f"trainer.default_local_dir={tmp_path}/a/b/c", f"+trainer.validation_data_dir={tmp_path}/v")
    assert list(tmp_path.iterdir()) == []
    (tmp_path / "kept").mkdir()
    check(main_job, f"trainer.default_local_dir={tmp_path}/kept")
    assert [p.name for p in tmp_path.iterdir()] == ["kept"] and list((tmp_path / "kept").iterdir()) == []


def test_the_folder_check_names_the_reason():
    from capo_verl.commands import folder_problem

    assert folder_problem("/proc/capo_x") is not None and folder_problem("/tmp") is None
    assert names(folder_problem("/dev/null/x"), "/dev/null", "file")  # the file in the way
    assert names(folder_problem("/dev/null"), "file")


def test_rays_folder_must_be_writable(tmp_path):
    from capo_verl.compat.preflight import ray_folder_problem

    assert ray_folder_problem({"TMPDIR": str(tmp_path)}) is None
    message = ray_folder_problem({"RAY_TMPDIR": "/proc/ray"})
    assert message.startswith("RAY_TMPDIR=/proc/ray") and "export RAY_TMPDIR=" in message
    assert ray_folder_problem({"TMPDIR": "/proc/t"}).startswith("TMPDIR=/proc/t")
    assert ray_folder_problem({"RAY_TMPDIR": "/proc/ray", "RAY_ADDRESS": "auto"}) is None  # the cluster's folder
    with launch_script_files():  # the launcher falls back to /tmp when TMPDIR cannot take its Ray folder
        assert ray_folder_problem({"TMPDIR": "/proc/t"}) is None
    assert list(tmp_path.iterdir()) == []


# --- new top-level keys (Hydra's hint: +adv_estimator=capo) ---------------------------------------------------------
@pytest.mark.parametrize(
    "override_, start, fix",
    [
        ("+adv_estimator=grpo", "adv_estimator:", ["~adv_estimator", "algorithm.adv_estimator=grpo"]),
        ("+capo.tau=0.5", "capo:", ["~capo", "algorithm.capo.tau=0.5"]),
    ],
)
def test_a_new_top_level_key_is_refused_naming_the_key_meant(main_job, override_, start, fix):
    message = refusal(main_job, override_)
    assert message.startswith(start), message
    assert message.endswith(" set " + " ".join(fix)), message
    cfg = check(main_job, override_, *fix)
    if "algorithm.adv_estimator=grpo" in fix:
        assert cfg.algorithm.adv_estimator == "grpo"


def test_a_new_top_level_section_that_names_no_key_is_kept(main_job):
    """A section of the user's own (a custom reward manager gets the whole config) is not judged."""
    cfg = check(main_job, "+no_such_key.penalty=1")
    assert cfg.no_such_key.penalty == 1


def test_a_top_level_block_read_through_interpolations_is_kept(main_job):
    cfg = check(main_job, "+my_run.name=x", "trainer.experiment_name=run_${my_run.name}")
    assert cfg.trainer.experiment_name == "run_x"


def test_the_grpo_twin_refuses_plus_adv_estimator_in_its_real_dry_run(script_dry_run, tmp_path):
    """The issue's command: the GRPO config with +adv_estimator=capo trained GRPO; now status 2 and one line."""
    proc = script_dry_run(SCRIPT.name, tmp_path, "+adv_estimator=capo", env={"CONFIG_NAME": "grpo_smollm2_135m_cpu"})
    assert proc.returncode == 2, proc.stdout[-2000:]
    [error] = proc.errors
    assert error.startswith("error: ValueError: adv_estimator:"), proc.stderr[-3000:]
    assert error.endswith(" set ~adv_estimator algorithm.adv_estimator=capo"), error
    assert "Traceback" not in proc.stderr


# --- fixes that were wrong, or missing ------------------------------------------------------------------------------
def test_a_refused_ref_high_suggests_the_committed_threshold_not_ref_low(main_job):
    """SmolLM2's config has ref_low 3.97; the fix for ref_high=nan was 3.97 (no window). Now the committed 6.43."""
    message = refusal(main_job, "algorithm.capo.ref_high=nan")
    assert fixes(message) == ["algorithm.capo.ref_high=6.43"], message
    check(main_job, "algorithm.capo.ref_high=nan", *fixes(message))


def test_a_mini_batch_larger_than_the_batch_gets_one_consistent_set(main_job):
    """train_batch_size=3 with ppo_mini_batch_size=8 took three rounds of pasted fixes and ended in verl's error
    without one; now one message sets the mini-batch and every micro-batch size it moves."""
    overrides = ["data.train_batch_size=3", "actor_rollout_ref.actor.ppo_mini_batch_size=8"]
    message = refusal(main_job, *overrides)
    assert message.startswith("actor_rollout_ref.actor.ppo_mini_batch_size=8") and "train_batch_size=3" in message
    found = fixes(message)
    assert found[0] == "actor_rollout_ref.actor.ppo_mini_batch_size=3" and len(found) > 1, message
    cfg = check(main_job, *overrides, *found)
    assert cfg.actor_rollout_ref.actor.ppo_mini_batch_size == 3


@pytest.mark.parametrize(
    "override_, start, fix",
    [
        ("data.train_batch_size=0", "data.train_batch_size=0", "data.train_batch_size=4"),
        (
            "actor_rollout_ref.rollout.temperature=-1",
            "actor_rollout_ref.rollout.temperature=-1",
            "actor_rollout_ref.rollout.temperature=1.0",
        ),
    ],
)
def test_values_that_ended_in_a_verl_assert_get_a_fix(main_job, override_, start, fix):
    message = refusal(main_job, override_)
    assert message.startswith(start) and fixes(message) == [fix], message
    check(main_job, override_, fix)


@pytest.mark.parametrize(
    "overrides, fix",
    [
        (["algorithm.adv_estimator=GRPO"], "algorithm.adv_estimator=grpo"),
        (["algorithm.capo.use_mask=maybe"], "algorithm.capo.use_mask=true"),
        (["algorithm.capo.normalize=Group"], "algorithm.capo.normalize=group"),
        (["trainer.total_training_steps=1e3", "trainer.total_epochs=500"], "trainer.total_training_steps=1000"),
        (
            ["algorithm.adv_estimator=cde", "+algorithm.cde.w_zero_after_step=-1"],
            "algorithm.cde.w_zero_after_step=null",
        ),
    ],
)
def test_keys_refused_without_a_fix_now_name_one(main_job, overrides, fix):
    message = refusal(main_job, *overrides)
    assert fixes(message)[0] == fix, message
    check(main_job, *overrides, fix)


def test_an_unknown_capo_key_names_the_key_meant(main_job):
    message = refusal(main_job, "+algorithm.capo.taus=0.5")
    assert "algorithm.capo.taus" in message and "algorithm.capo.tau?" in message, message
    assert message.endswith(" set ~algorithm.capo.taus algorithm.capo.tau=0.5"), message
    cfg = check(main_job, "+algorithm.capo.taus=0.5", "~algorithm.capo.taus", "algorithm.capo.tau=0.5")
    assert cfg.algorithm.capo.tau == 0.5


def test_a_typed_key_the_run_does_not_read_is_refused(main_job):
    """``+algorithm.capo.tau=0.4`` with GRPO, SimKO's keys without its loss mode: nothing would read them."""
    message = refusal(main_job, "algorithm.adv_estimator=grpo", "algorithm.capo.tau=0.4")
    assert message.startswith("algorithm.capo.tau=0.4") and fixes(message) == ["algorithm.adv_estimator=capo"]
    simko = "+actor_rollout_ref.actor.policy_loss.simko.top_k=3"
    message = refusal(main_job, simko)
    assert message.startswith(simko) and "loss_mode=simko" in message, message
    cfg = check(main_job, "algorithm.adv_estimator=capo", "algorithm.capo.tau=0.4")  # read: kept
    assert cfg.algorithm.capo.tau == 0.4
