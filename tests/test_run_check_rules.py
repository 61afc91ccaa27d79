"""The start checks of ``capo_verl/compat/run_checks.py`` as data: :data:`~capo_verl.compat.run_checks.RULES`, run in
order by one engine (:func:`~capo_verl.compat.run_checks.run_rules`).

- ``docs/configuration.md``'s table of them is :func:`~capo_verl.compat.run_checks.rules_table`'s output.
- Every rule reads the keys it names: a bad value of a rule family's key (``IntAtLeast``, ``PositiveNumber``, ...)
  is refused by :func:`~capo_verl.compat.run_checks.check_run_config` with a message that starts with that key, and
  each other rule refuses a bad value with a subject that starts with one of its keys.
- The engine raises the first refusal as ``subject: problem; fix``, and runs the ``here_only`` rules only where
  the file system is checked.

Fast: configs are composed, never run.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from capo_verl.compat import run_checks
from capo_verl.compat.run_checks import (
    RULES,
    Boolean,
    Context,
    Frequency,
    IntAtLeast,
    OneOf,
    PositiveNumber,
    Refusal,
    Rule,
    check_run_config,
    format_value,
    launch_script_files,
    rules_table,
    run_rules,
)

REPO = Path(__file__).resolve().parents[1]
DOCS = REPO / "docs" / "configuration.md"
CPU_CONFIG = "capo_smollm2_135m_cpu"


@pytest.fixture(scope="module")
def base(configs):
    """The CPU config, composed and checked once (with the path variables unset, as :func:`config_env` does)."""
    with pytest.MonkeyPatch.context() as mp:
        for key in configs.path_variables:
            mp.delenv(key, raising=False)
        mp.setenv("HOME", "/home/u")
        return configs.compose(CPU_CONFIG)


def changed(base, **updates):
    """A copy of ``base`` with ``{dotted key (``__`` for ``.``): value}`` set."""
    cfg = OmegaConf.create(OmegaConf.to_container(base, resolve=False))
    for key, value in updates.items():
        OmegaConf.update(cfg, key.replace("__", "."), value, force_add=True)
    return cfg


# --- the docs ---------------------------------------------------------------------------------------------------
def test_the_docs_table_is_the_rules_table():
    text = DOCS.read_text()
    found = re.search(r"<!-- run_checks rules -->\n(.*?)<!-- /run_checks rules -->", text, re.S)
    assert found, f"{DOCS} lacks the <!-- run_checks rules --> ... <!-- /run_checks rules --> markers"
    assert found.group(1) == rules_table(), (
        "docs/configuration.md's run_checks table differs from run_checks.rules_table(); paste its output between the "
        "markers"
    )


def test_every_rule_has_a_row():
    names = [rule.name for rule in RULES]
    assert len(set(names)) == len(names)
    rows = rules_table().splitlines()[2:]
    assert len(rows) == len(RULES)
    for rule, row in zip(RULES, rows):
        assert rule.refused_when and rule.why, rule.name
        assert rule.keys or rule.checked, rule.name
        assert "|" not in rule.refused_when + rule.why + rule.checked, rule.name
        assert row.count(" | ") == 3, row


# --- every rule reads its keys ----------------------------------------------------------------------------------
FAMILIES = (IntAtLeast, PositiveNumber, Boolean, OneOf, Frequency)
SIMPLE = [rule for rule in RULES if isinstance(rule.check, FAMILIES)]


def bad_value(check):
    """A value the family's check refuses."""
    if isinstance(check, IntAtLeast):
        return check.minimum - 1
    if isinstance(check, PositiveNumber):
        return 0
    if isinstance(check, Boolean):
        return "maybe"
    if isinstance(check, OneOf):
        return "nope"
    return None  # Frequency: the null of ${trainer.total_training_steps} after total_training_steps=null


def test_the_simple_rules_are_the_families():
    assert {rule.name for rule in SIMPLE} >= {"nnodes", "train_batch_size", "temperature", "val_before_train"}
    assert all(rule.keys == (rule.check.key,) and not rule.here_only for rule in SIMPLE)


@pytest.mark.parametrize("rule", SIMPLE, ids=lambda rule: rule.name)
def test_a_bad_value_of_a_simple_rules_key_is_refused_naming_the_key(base, rule):
    key, bad = rule.check.key, bad_value(rule.check)
    cfg = changed(base, **{key: bad})
    assert rule.check(cfg, Context()) is not None
    with pytest.raises(ValueError) as refused:
        check_run_config(cfg)
    message = str(refused.value)
    assert message.startswith(f"{key}={format_value(bad)}: "), message
    assert rule.check(changed(base), Context()) is None  # the config's own value passes


@pytest.fixture
def files(tmp_path):
    """Files for the here-only rules: a CSV, a parquet file of 3 rows verl's dataset would read, and a model folder
    (its config.json only) of 64 positions."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    (tmp_path / "data.csv").write_text("a,b\n1,2\n")
    rows = {
        "prompt": [[{"role": "user", "content": "1+1?"}]] * 3,
        "data_source": ["gsm8k"] * 3,
        "reward_model": [{"ground_truth": "2"}] * 3,
    }
    pq.write_table(pa.table(rows), tmp_path / "three.parquet")
    rows["reward_model"] = [{"ground_truth": "2"}, {"ground_truth": ""}, {"ground_truth": "2"}]  # row 1: no gold
    pq.write_table(pa.table(rows), tmp_path / "no_gold.parquet")
    from transformers import Qwen2Config

    Qwen2Config(max_position_embeddings=64).save_pretrained(tmp_path / "model")  # a config.json, no weights
    # terabytes of parameters (counted on the meta device): more than any disk has free for a checkpoint
    huge = {"hidden_size": 65536, "intermediate_size": 262144, "num_attention_heads": 64, "num_key_value_heads": 8}
    Qwen2Config(**huge, num_hidden_layers=4).save_pretrained(tmp_path / "huge")
    return tmp_path


#: rule name -> (the config's changes, Context, the refusal's subject starts with)
OTHER = {
    "top_level_keys": ({"adv_estimator": "capo"}, Context(), "adv_estimator"),
    "unread_new_keys": ({"+actor_rollout_ref__ref__enable": False}, Context(), "+actor_rollout_ref.ref.enable="),
    "mini_batch_larger": (
        {"actor_rollout_ref__actor__use_dynamic_bsz": False, "actor_rollout_ref__actor__ppo_mini_batch_size": 8},
        Context(),
        "actor_rollout_ref.actor.ppo_mini_batch_size=8",
    ),
    "cuda_here": ({"trainer__device": "cuda"}, Context(), "trainer.device=cuda"),
    "lr": ({"actor_rollout_ref__actor__optim__lr": 0}, Context(), "actor_rollout_ref.actor.optim.lr=0"),
    "resume_state": (
        {"trainer__resume_mode": "resume_path", "trainer__resume_from_path": "/tmp/x/global_step_1/"},
        Context(),
        "trainer.resume_from_path=/tmp/x/global_step_1/",
    ),
    "rollout_on_cpu": ({"actor_rollout_ref__rollout__name": "sglang"}, Context(), "actor_rollout_ref.rollout.name="),
    "rollout_installed": (
        {"trainer__device": "cuda", "actor_rollout_ref__rollout__name": "trtllm"},
        Context(),
        "actor_rollout_ref.rollout.name=trtllm",
    ),
    "val_calib_inputs": (
        {"actor_rollout_ref__rollout__calculate_log_probs": False},
        Context(val_calib_required="trainer.val_calib=true"),
        "actor_rollout_ref.rollout.calculate_log_probs=false",
    ),
    "total_training_steps": ({"trainer__total_training_steps": 0}, Context(), "trainer.total_training_steps=0"),
    "total_epochs": ({"trainer__total_epochs": 0}, Context(), "trainer.total_epochs=0"),
    "resume_from_path": (
        {"trainer__resume_mode": "resume_path", "trainer__resume_from_path": "/nonexistent/global_step_1"},
        Context(),
        "trainer.resume_from_path=/nonexistent/global_step_1",
    ),
    "output_folders": ({"trainer__default_local_dir": "/dev/null/ckpt"}, Context(), "trainer.default_local_dir="),
    "ray_folder": ({}, Context(), "RAY_TMPDIR=/proc/capo-ray"),
    "checkpoint_space": (
        {"actor_rollout_ref__model__path": "{files}/huge", "trainer__default_local_dir": "{files}/ckpt"},
        Context(),
        "trainer.default_local_dir=",
    ),
    "model_path": (
        {"actor_rollout_ref__model__path": "/nonexistent/model"},
        Context(),
        "actor_rollout_ref.model.path=",
    ),
    "model_fits": ({"actor_rollout_ref__model__path": "{files}/model"}, Context(), "data.max_prompt_length="),
    "data_files": ({"data__train_files": "/nonexistent/train.parquet"}, Context(), "data.train_files="),
    "data_sets": ({"data__train_files": "{files}/data.csv"}, Context(), "data.train_files="),
    "ground_truths": ({"data__train_files": "{files}/no_gold.parquet"}, Context(), "data.train_files="),
    "training_set": (
        {"data__train_files": "{files}/three.parquet", "data__train_batch_size": 4},
        Context(),
        "data.train_batch_size=4",
    ),
    "gpu_layout": ({"trainer__n_gpus_per_node": 3}, Context(), "trainer.n_gpus_per_node=3"),
    "batch_divisibility": (
        {
            "actor_rollout_ref__actor__use_dynamic_bsz": False,
            "actor_rollout_ref__actor__strategy": "fsdp",
            "actor_rollout_ref__rollout__log_prob_micro_batch_size_per_gpu": 3,
        },
        Context(),
        "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=3",
    ),
}


def test_every_rule_is_tried():
    assert {rule.name for rule in RULES} == {rule.name for rule in SIMPLE} | set(OTHER)


@pytest.mark.parametrize("rule", [rule for rule in RULES if rule.name in OTHER], ids=lambda rule: rule.name)
def test_each_other_rule_refuses_naming_one_of_its_keys(base, rule, files, monkeypatch):
    updates, ctx, subject = OTHER[rule.name]
    updates = {k: v.format(files=files) if isinstance(v, str) else v for k, v in updates.items()}
    monkeypatch.setattr(run_checks, "_cuda_available", lambda: False)
    monkeypatch.setenv("RAY_TMPDIR", "/proc/capo-ray")
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    cfg = changed(base, **{k.lstrip("+"): v for k, v in updates.items()})
    command = [f"{k.replace('__', '.')}={v}" for k, v in updates.items()]  # a key with + is added by the command
    with launch_script_files((), command):  # a --dry-run whose command line sets the keys
        refusal = rule.check(cfg, ctx)
    assert refusal is not None, rule.name
    assert refusal.subject.startswith(subject), refusal.message()
    key = refusal.subject.split("=")[0]
    assert key in rule.keys or not rule.keys, (key, rule.keys)
    if not rule.here_only:  # the composed config's own paths lie under HOME=/home/u, which does not exist
        with launch_script_files((), command):
            assert rule.check(changed(base), ctx) is None


# --- the engine -------------------------------------------------------------------------------------------------
def refuses(subject: str):
    return lambda config, ctx: Refusal(subject, f"{subject} is bad", f"set {subject}=1")


def passes(config, ctx):
    return None


def test_the_engine_raises_the_first_refusal_as_subject_problem_fix():
    rules = (
        Rule("ok", ("a",), "never", "", passes),
        Rule("first", ("b",), "always", "", refuses("b")),
        Rule("second", ("c",), "always", "", refuses("c")),
    )
    with pytest.raises(ValueError, match=r"^b: b is bad; set b=1$"):
        run_rules(rules, OmegaConf.create({}), Context())


def test_the_engine_runs_here_only_rules_only_where_files_are_checked():
    rules = (Rule("here", ("a",), "always", "", refuses("a"), here_only=True), Rule("b", ("b",), "", "", refuses("b")))
    with pytest.raises(ValueError, match=r"^b: "):
        run_rules(rules, OmegaConf.create({}), Context())
    with launch_script_files(), pytest.raises(ValueError, match=r"^a: "):
        run_rules(rules, OmegaConf.create({}), Context())


def test_check_run_config_passes_its_arguments_to_the_rules(base):
    cfg = changed(base, actor_rollout_ref__rollout__val_kwargs__n=1)
    check_run_config(cfg)  # the val-calib/* metrics not required: one sample is fine
    with pytest.raises(ValueError, match=r"^actor_rollout_ref\.rollout\.val_kwargs\.n=1: the val-calib/\* metrics"):
        check_run_config(cfg, val_calib_required="trainer.val_calib=true")
