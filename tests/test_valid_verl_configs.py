"""Configurations verl 0.9.1 runs are not refused by capo-verl's start checks, with any of its methods swapped in.

Each case is a verl configuration a cluster user writes (verl's own ``ppo_trainer`` or ``ppo_megatron_trainer``
config with the keys of verl's examples or verl-recipe's DAPO), checked the way a launch script's ``--dry-run``
checks it: composed like ``verl.trainer.main_ppo`` and passed through verl's ``validate_config`` with the plugin
loaded and the file-system checks on (:func:`capo_verl.cpu.launch.checked_config`). Each was refused before by a
rule stricter than verl; next to each stands the neighbouring refusal that remains, so that a rule is narrowed, not
dropped.
"""

from __future__ import annotations

import os

import pytest

from capo_verl.cpu import launch

pytestmark = pytest.mark.filterwarnings("ignore:Disabled critic as algorithm.adv_estimator:UserWarning")

#: every capo-verl method, as the overrides that switch it on in verl's own config
METHODS = {
    "capo": ("algorithm.adv_estimator=capo",),
    "grpo_mask": ("algorithm.adv_estimator=grpo_mask",),
    "codapo": ("algorithm.adv_estimator=codapo",),
    "cde": ("algorithm.adv_estimator=cde",),
    "simko": ("algorithm.adv_estimator=grpo", "actor_rollout_ref.actor.policy_loss.loss_mode=simko"),
}

#: a GPU run of verl's GRPO example on one node of 8 GPUs (nothing here is loaded: the model is a hub id)
GPU_RUN = (
    "actor_rollout_ref.model.path=Qwen/Qwen2.5-Math-1.5B",
    "actor_rollout_ref.actor.use_kl_loss=False",
    "actor_rollout_ref.rollout.name=vllm",
    "actor_rollout_ref.rollout.n=4",
    "actor_rollout_ref.rollout.tensor_model_parallel_size=1",
    "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=4",
    "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=4",
    "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=4",
    "data.train_batch_size=32",
    "actor_rollout_ref.actor.ppo_mini_batch_size=16",
    "data.max_prompt_length=512",
    "data.max_response_length=1024",
    "trainer.nnodes=1",
    "trainer.n_gpus_per_node=8",
    "trainer.total_training_steps=2",
    "trainer.logger=[console]",
)


@pytest.fixture(scope="module")
def run_files(tmp_path_factory):
    """``(data overrides, checkpoint folder)``: real GSM8K rows as train and validation files."""
    from capo_verl.data import write_gsm8k_calc_parquet

    root = tmp_path_factory.mktemp("valid_configs")
    train, val = write_gsm8k_calc_parquet(root / "data", n_train=256, n_val=8)
    return (f"data.train_files={train}", f"data.val_files={val}"), root / "ckpt"


def check(run_files, *overrides: str, config: str = "ppo_trainer", files=()):
    """The ``--dry-run`` check of verl's ``config`` with ``overrides``; returns the composed config."""
    import verl

    data, ckpt = run_files
    config_dir = os.path.join(os.path.dirname(verl.__file__), "trainer", "config")
    cmd = [
        "python3",
        "-m",
        "verl.trainer.main_ppo",
        f"--config-path={config_dir}",
        f"--config-name={config}",
        *data,
        *GPU_RUN,
        f"trainer.default_local_dir={ckpt}",
        *overrides,
    ]
    return launch.checked_config(cmd, files)


def cuda_present(monkeypatch, present: bool) -> None:
    """Make torch report CUDA (or not) in this process."""
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: present)


@pytest.fixture(params=sorted(METHODS))
def method(request, monkeypatch):
    """Each method's overrides, checked as on a GPU driver (torch reports CUDA)."""
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    cuda_present(monkeypatch, True)
    return METHODS[request.param]


@pytest.fixture(params=sorted(set(METHODS) - {"simko"}))
def parallel_method(request, monkeypatch):
    """The methods that run with Megatron and with Ulysses sequence parallelism: capo-verl computes SimKO's top-K
    log-probs in verl's FSDP engine without Ulysses only, and refuses the others, naming the strategy."""
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    cuda_present(monkeypatch, True)
    return METHODS[request.param]


@pytest.fixture
def capo(monkeypatch):
    """CAPO's overrides, checked as on a GPU driver: the refusals that remain are the method's neighbours' (their
    rules read no method key)."""
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    cuda_present(monkeypatch, True)
    return METHODS["capo"]


DAPO_REWARD = (
    "reward.reward_manager.name=dapo",
    "+reward.reward_kwargs.overlong_buffer_cfg.enable=True",
    "+reward.reward_kwargs.overlong_buffer_cfg.len=512",
    "+reward.reward_kwargs.overlong_buffer_cfg.penalty_factor=1.0",
    "+reward.reward_kwargs.overlong_buffer_cfg.log=False",
    "+reward.reward_kwargs.max_resp_len=1024",
)


def test_dapo_reward_kwargs_pass(run_files, method):
    cfg = check(run_files, *method, *DAPO_REWARD)
    assert cfg.reward.reward_kwargs.max_resp_len == 1024


def test_limited_reward_manager_timeout_passes(run_files, method):
    cfg = check(run_files, *method, "reward.reward_manager.name=limited", "+reward.timeout=600")
    assert cfg.reward.timeout == 600


def test_custom_reward_manager_section_passes(run_files, method, tmp_path):
    manager = tmp_path / "my_manager.py"
    manager.write_text("class MyRewardManager:\n    pass\n")
    cfg = check(
        run_files,
        *method,
        "reward.reward_manager.source=importlib",
        "reward.reward_manager.name=MyRewardManager",
        f"reward.reward_manager.module.path={manager}",
        "+my_reward.penalty=0.5",
    )
    assert cfg.my_reward.penalty == 0.5


def test_engine_kwargs_and_override_config_pass(run_files, method):
    cfg = check(
        run_files,
        *method,
        "+actor_rollout_ref.rollout.engine_kwargs.vllm.swap_space=4",
        "+actor_rollout_ref.model.override_config.attn_implementation=sdpa",
    )
    assert cfg.actor_rollout_ref.model.override_config.attn_implementation == "sdpa"


def test_typo_of_a_schema_key_is_still_refused(run_files, capo):
    """The neighbour: a near-miss of a key of verl's actor dataclass is a typo nothing reads."""
    with pytest.raises(ValueError) as info:
        check(run_files, *capo, "+actor_rollout_ref.actor.ppo_epoch=2")
    assert "ppo_epochs" in str(info.value)


def test_new_top_level_key_meaning_a_nested_one_is_still_refused(run_files, capo):
    """The neighbour of a custom reward section: ``+adv_estimator=capo`` (Hydra's hint) names a key of
    ``algorithm``, and nothing would read it."""
    with pytest.raises(ValueError) as info:
        check(run_files, *capo, "+adv_estimator=capo")
    assert "algorithm.adv_estimator" in str(info.value)


MEGATRON_TP8_PP2 = (
    "trainer.nnodes=4",
    "actor_rollout_ref.actor.megatron.tensor_model_parallel_size=8",
    "actor_rollout_ref.actor.megatron.pipeline_model_parallel_size=2",
    "actor_rollout_ref.ref.megatron.tensor_model_parallel_size=8",
    "actor_rollout_ref.ref.megatron.pipeline_model_parallel_size=2",
    "actor_rollout_ref.rollout.tensor_model_parallel_size=8",
    "data.train_batch_size=125",
    "actor_rollout_ref.actor.ppo_mini_batch_size=25",
    "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2",
    "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=2",
    "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=2",
)


def test_megatron_layout_divides_by_its_data_parallel_size(run_files, parallel_method):
    """TP 8 x PP 2 on 4 nodes of 8 GPUs: 2 data-parallel ranks, which 500 responses a step split over (verl's
    ``megatron_dp``), though 32 ranks would not."""
    cfg = check(run_files, *parallel_method, *MEGATRON_TP8_PP2, config="ppo_megatron_trainer")
    assert cfg.actor_rollout_ref.actor.strategy == "megatron"


def test_megatron_layout_that_does_not_split_is_still_refused(run_files, capo):
    """The neighbour: 6 nodes at TP 8 x PP 2 give 3 data-parallel ranks, over which 500 responses a step do not
    split; with dynamic batch sizes verl would pad them with dummy responses."""
    with pytest.raises(ValueError) as info:
        check(
            run_files,
            *capo,
            *MEGATRON_TP8_PP2,
            "trainer.nnodes=6",
            "actor_rollout_ref.actor.use_dynamic_bsz=True",
            config="ppo_megatron_trainer",
        )
    assert "trainer.n_gpus_per_node" in str(info.value)


ULYSSES_DYNAMIC = (
    "actor_rollout_ref.actor.use_dynamic_bsz=True",
    "actor_rollout_ref.actor.ulysses_sequence_parallel_size=4",
    "data.train_batch_size=125",
    "actor_rollout_ref.actor.ppo_mini_batch_size=25",
)


def test_dynamic_batch_with_ulysses_divides_by_its_data_parallel_size(run_files, parallel_method):
    """8 GPUs at Ulysses SP 4: 2 data-parallel ranks, which 500 responses a step split over."""
    check(run_files, *parallel_method, *ULYSSES_DYNAMIC)


def test_dynamic_batch_with_ulysses_that_does_not_split_is_still_refused(run_files, capo):
    """The neighbour: SP 2 gives 4 data-parallel ranks, and an update of 25 x 4 = 100 responses splits, a step of
    125 x 4 = 500 too; SP 1 gives 8 ranks, over which 500 responses do not split (verl would pad them)."""
    with pytest.raises(ValueError) as info:
        check(run_files, *capo, *ULYSSES_DYNAMIC, "actor_rollout_ref.actor.ulysses_sequence_parallel_size=1")
    assert "trainer.n_gpus_per_node" in str(info.value)


def test_glob_of_training_files_passes(run_files, method, tmp_path):
    import shutil

    for i in range(2):
        shutil.copy(run_files[0][0].partition("=")[2], tmp_path / f"shard-{i}.parquet")
    check(run_files, *method, f"data.train_files={tmp_path}/shard-*.parquet")


def test_glob_that_matches_nothing_is_still_refused(run_files, capo, tmp_path):
    with pytest.raises(ValueError) as info:
        check(run_files, *capo, f"data.train_files={tmp_path}/nothing-*.parquet")
    assert "data.train_files" in str(info.value)


def test_val_only_run_with_zero_learning_rate_passes(run_files, method):
    check(run_files, *method, "trainer.val_only=True", "actor_rollout_ref.actor.optim.lr=0")


def test_zero_learning_rate_of_a_training_run_is_still_refused(run_files, capo):
    with pytest.raises(ValueError) as info:
        check(run_files, *capo, "actor_rollout_ref.actor.optim.lr=0")
    assert "actor_rollout_ref.actor.optim.lr" in str(info.value)


def test_val_only_grpo_with_one_response_per_prompt_passes(run_files, monkeypatch):
    cuda_present(monkeypatch, True)
    check(
        run_files,
        "algorithm.adv_estimator=grpo",
        "trainer.val_only=True",
        "actor_rollout_ref.rollout.n=1",
    )


def test_grpo_training_with_one_response_per_prompt_is_still_refused(run_files, monkeypatch):
    cuda_present(monkeypatch, True)
    with pytest.raises(ValueError) as info:
        check(run_files, "algorithm.adv_estimator=grpo", "actor_rollout_ref.rollout.n=1")
    assert "actor_rollout_ref.rollout.n" in str(info.value)


@pytest.mark.parametrize("address", ["env", "config"])
def test_driver_without_gpu_on_a_ray_cluster_passes(run_files, method, monkeypatch, address):
    """A head node or login node without a GPU launches onto a Ray cluster: its own machine says nothing about
    where the run trains."""
    cuda_present(monkeypatch, False)
    extra = ("trainer.device=cuda",)
    if address == "env":
        monkeypatch.setenv("RAY_ADDRESS", "10.0.0.1:6379")
    else:
        extra += ("+ray_kwargs.ray_init.address=10.0.0.1:6379",)
    check(run_files, *method, *extra)


def test_driver_without_gpu_and_without_a_ray_cluster_is_still_refused(run_files, capo, monkeypatch):
    cuda_present(monkeypatch, False)
    with pytest.raises(ValueError) as info:
        check(run_files, *capo, "trainer.device=cuda")
    assert "trainer.device" in str(info.value)


def test_path_the_driver_cannot_see_on_a_ray_cluster_is_a_warning(run_files, capo, monkeypatch, caplog):
    """On a Ray cluster the data may exist only on the workers' shared file system: a warning naming the path."""
    cuda_present(monkeypatch, False)
    monkeypatch.setenv("RAY_ADDRESS", "10.0.0.1:6379")
    missing = "/shared/nowhere/train.parquet"
    with caplog.at_level("WARNING", logger="capo_verl"):
        check(run_files, *capo, f"data.train_files={missing}")
    assert missing in caplog.text


@pytest.mark.parametrize("value", ["null", "[]"])
def test_validation_files_absent_are_refused_even_without_validation(run_files, capo, value):
    """verl's trainer builds its validation set from ``data.val_files`` whether or not it validates, and
    ``create_rl_dataset(None)`` fails in its TaskRunner: refused at the start, naming the key (every other case here
    is the valid neighbour, with validation files)."""
    with pytest.raises(ValueError) as info:
        check(run_files, *capo, f"data.val_files={value}", "trainer.test_freq=-1", "trainer.val_before_train=False")
    assert str(info.value).startswith("data.val_files=")


def test_train_max_samples_below_one_batch_is_refused_and_one_batch_passes(run_files, capo):
    """``data.train_max_samples`` rows of a 256-row file, ``data.train_batch_size=32``: 2 rows leave verl's dataloader
    (drop_last) without a step, so the run would end at once with status 0; 32 rows give one step."""
    with pytest.raises(ValueError) as info:
        check(run_files, *capo, "data.train_max_samples=2")
    assert str(info.value).startswith("data.train_max_samples=2") and "data.train_max_samples=32" in str(info.value)
    check(run_files, *capo, "data.train_max_samples=32", "trainer.total_training_steps=1")


def test_ray_resources_typed_with_an_existing_cluster_are_refused_and_null_joins(run_files, capo, monkeypatch):
    """``ray.init`` refuses ``num_cpus`` / ``num_gpus`` when it connects to an existing cluster (the CPU profile sets
    both); the refusal names them and ``RAY_ADDRESS``, and its fix (both null) passes."""
    monkeypatch.setenv("RAY_ADDRESS", "10.0.0.1:6379")
    typed = ("ray_kwargs.ray_init.num_cpus=16", "+ray_kwargs.ray_init.num_gpus=8")
    with pytest.raises(ValueError) as info:
        check(run_files, *capo, *typed)
    message = str(info.value)
    assert (
        message.startswith("ray_kwargs.ray_init.num_cpus=16, ray_kwargs.ray_init.num_gpus=8")
        and "RAY_ADDRESS" in message
    )
    check(run_files, *capo, "ray_kwargs.ray_init.num_cpus=null", "+ray_kwargs.ray_init.num_gpus=null")


CAPO_REWARD = (
    "reward.custom_reward_function.path=pkg://capo_verl.reward",
    "reward.custom_reward_function.name=compute_score",
)


@pytest.mark.parametrize("bad", [None, "", "nan"], ids=["None", "empty", "nan"])
def test_a_ground_truth_the_reward_cannot_grade_is_refused_naming_its_row(run_files, capo, tmp_path, bad):
    """One bad gold among 16 validation rows: refused at the start, naming the file and the row (the reward would
    raise at the first batch that holds it, after the model and vLLM loaded); the same rows without it pass."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    (train, val), ckpt = run_files
    table = pq.read_table(val.split("=", 1)[1]).slice(0, 8)
    rows = table.to_pylist() * 2
    good = tmp_path / "good.parquet"
    pq.write_table(pa.Table.from_pylist(rows, schema=table.schema), good)
    check(((train, f"data.val_files={good}"), ckpt), *capo, *CAPO_REWARD)

    rows[11] = {**rows[11], "reward_model": {**rows[11]["reward_model"], "ground_truth": bad}}
    bad_file = tmp_path / "bad.parquet"
    pq.write_table(pa.Table.from_pylist(rows), bad_file)
    with pytest.raises(ValueError) as info:
        check(((train, f"data.val_files={bad_file}"), ckpt), *capo, *CAPO_REWARD)
    assert str(info.value).startswith(f"data.val_files={bad_file}: row 11: reward_model.ground_truth="), info.value


def test_a_checkpoint_folder_without_room_for_one_checkpoint_is_refused_and_room_passes(
    run_files, capo, tmp_path, monkeypatch
):
    """A local model of 205,376 parameters (embedding 2048 x 64, tied; per layer q 64x64+64, k and v 64x32+32 each,
    o 64x64, MLP 3 x 64x128, two norms of 64; a final norm of 64): a checkpoint of model and optimizer takes at
    least 12 bytes each (2.5 MB). 1 MB free is refused, naming both sizes; 1 GB free passes."""
    import shutil
    from collections import namedtuple

    from transformers import Qwen2Config

    model = tmp_path / "model"
    Qwen2Config(
        hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
        vocab_size=2048, tie_word_embeddings=True,
    ).save_pretrained(model)  # fmt: skip
    from capo_verl.compat import preflight

    usage = namedtuple("usage", "total used free")
    cpu = (f"actor_rollout_ref.model.path={model}", "actor_rollout_ref.model.tokenizer_path=null")
    layer = (64 * 64 + 64) + 2 * (64 * 32 + 32) + 64 * 64 + 3 * 64 * 128 + 2 * 64
    assert preflight._parameters(None, str(model)) == 2048 * 64 + 2 * layer + 64 == 205_376
    monkeypatch.setattr(shutil, "disk_usage", lambda path: usage(10**12, 10**12 - 10**6, 10**6))
    with pytest.raises(ValueError) as info:
        check(run_files, *capo, *cpu)
    message = str(info.value)
    assert message.startswith("trainer.default_local_dir=") and "0.00 GiB free" in message, message
    monkeypatch.setattr(shutil, "disk_usage", lambda path: usage(10**12, 0, 10**9))
    check(run_files, *capo, *cpu)
