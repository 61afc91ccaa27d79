"""Data that verl's own dataset would reduce to nothing, or fail on only after Ray started, is refused at start.

Before, each of these passed ``--dry-run`` (the row count came from the parquet footer) and left verl's trainer 0
training rows, or failed inside Ray: a file with other columns, prompts stored as plain strings,
``data.prompt_key=question``, ``data.max_prompt_length=4``; a folder, a CSV or a garbage file as ``data.train_files``
or ``data.val_files``; a file without the ``reward_model`` column (which failed at the first reward). Each case is
first shown with verl's own ``RLHFDataset`` (what the trainer builds), then refused by
:func:`capo_verl.cpu.launch.checked_config`, which is what a launch script's ``--dry-run`` runs.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import sys
from pathlib import Path

import pandas as pd
import pytest
from omegaconf import OmegaConf

from capo_verl.cpu import launch

pytestmark = pytest.mark.filterwarnings("ignore:Disabled critic as algorithm.adv_estimator:UserWarning")

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def data(e2e_inputs, tmp_path_factory):
    """The end-to-end inputs (tiny model with a real tokenizer, 16 training rows, batch 4) and broken copies."""
    root = tmp_path_factory.mktemp("data")
    train = pd.read_parquet(e2e_inputs.train)
    files = {"train": e2e_inputs.train, "val": e2e_inputs.val}
    files["columns"] = root / "columns.parquet"
    train.rename(columns={"prompt": "question"}).to_parquet(files["columns"])
    files["strings"] = root / "strings.parquet"
    train.assign(prompt=[m[0]["content"] for m in train["prompt"]]).to_parquet(files["strings"])
    files["no_reward"] = root / "no_reward.parquet"
    train.drop(columns=["reward_model"]).to_parquet(files["no_reward"])
    files["empty"] = root / "empty.parquet"
    train.iloc[:0].to_parquet(files["empty"])
    files["garbage"] = root / "garbage.parquet"
    files["garbage"].write_bytes(b"PAR1 this is not a parquet file")
    files["csv"] = root / "train.csv"
    train.to_csv(files["csv"])
    files["folder"] = root
    return e2e_inputs, files


def command(data, tmp: Path, *overrides: str) -> list[str]:
    inputs, files = data
    return [
        sys.executable,
        "-m",
        "verl.trainer.main_ppo",
        f"--config-path={REPO / 'configs'}",
        "--config-name=capo_smollm2_135m_cpu",
        f"actor_rollout_ref.model.path={inputs.model}",
        f"data.train_files={files['train']}",
        f"data.val_files={files['val']}",
        f"trainer.default_local_dir={tmp / 'ckpt'}",
        "trainer.total_training_steps=2",
        *overrides,
    ]


def refusal(data, tmp: Path, *overrides: str) -> str:
    with pytest.raises(ValueError) as info:
        launch.checked_config(command(data, tmp, *overrides))
    message = str(info.value)
    assert "\n" not in message, message
    return message


def verl_rows(data, path: Path, **data_changes) -> int:
    """Rows of verl's own RLHFDataset for ``path`` with the main job's data config (``data_changes`` applied)."""
    from verl.utils import hf_tokenizer
    from verl.utils.dataset.rl_dataset import RLHFDataset

    inputs, _ = data
    with_defaults = {"prompt_key": "prompt", "max_prompt_length": 256, "filter_overlong_prompts": True}
    config = OmegaConf.create({**with_defaults, **data_changes, "filter_overlong_prompts_workers": 1})
    return len(RLHFDataset([str(path)], hf_tokenizer(str(inputs.model)), config))


def test_the_data_as_given_passes_and_leaves_nothing_behind(data, tmp_path):
    cfg = launch.checked_config(command(data, tmp_path))
    assert cfg.data.train_batch_size == 4 and verl_rows(data, data[1]["train"]) == 16
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(
    "case, overrides, verl_changes, start",
    [
        (
            "columns",
            ["data.train_files={columns}"],
            {},
            r"^data\.train_files=\S+columns\.parquet: \S+ has no column 'prompt' \(data\.prompt_key\), so verl's "
            r"dataset drops every row; its columns: data_source, question, ",
        ),
        (
            "strings",
            ["data.train_files={strings}"],
            {},
            r"^data\.train_files=\S+strings\.parquet: verl's dataset cannot chat-template 16 of 16 prompts \(column "
            r"'prompt', data\.prompt_key; .* leaving 0 rows, fewer than data\.train_batch_size=4; set "
            r"data\.train_files=\S+train\.parquet \(the value this command had before\)",
        ),
        (
            "train",
            ["data.prompt_key=question"],
            {"prompt_key": "question"},
            r"^data\.prompt_key=question: \S+ has no column 'question' \(data\.prompt_key\), .*; set "
            r"data\.prompt_key=prompt$",
        ),
        (
            "train",
            ["data.max_prompt_length=4"],
            {"max_prompt_length": 4},
            r"^data\.max_prompt_length=4: 16 of 16 prompts of data\.train_files are longer \(verl's dataset drops "
            r"them\), leaving 0 rows, fewer than data\.train_batch_size=4; set data\.max_prompt_length=\d+$",
        ),
        (
            "strings",
            ["data.val_files={strings}"],
            {},
            r"^data\.val_files=\S+strings\.parquet: verl's dataset cannot chat-template 16 of 16 .* leaving 0 rows, "
            r"fewer than the 1 row a validation pass needs; set data\.val_files=\S+val\.parquet ",
        ),
    ],
)
def test_data_verls_dataset_reduces_to_nothing_is_refused_naming_the_cause(
    data, tmp_path, case, overrides, verl_changes, start
):
    """verl's RLHFDataset keeps 0 rows of the file; the start check says why, and its fix passes when pasted."""
    _, files = data
    overrides = [o.format(**files) for o in overrides]
    assert verl_rows(data, files[case], **verl_changes) == 0
    message = refusal(data, tmp_path, *overrides)
    assert re.match(start, message), message
    fix = message.rsplit("; set ", 1)[-1].split(" ")[0]
    launch.checked_config(command(data, tmp_path, *overrides, fix))


@pytest.mark.parametrize("key", ["data.train_files", "data.val_files"])
@pytest.mark.parametrize(
    "case, problem",
    [
        ("folder", r"\S+ is a folder; verl reads files \(\.parquet, \.json, \.jsonl\)"),
        ("csv", r"\S+train\.csv: verl reads only \.parquet, \.json, \.jsonl files"),
        ("garbage", r"data file \S+garbage\.parquet: .* not the start of a parquet file"),
        ("no_reward", r"\S+ has no column 'reward_model', which verl's reward reads for every response"),
        ("empty", r"\S+empty\.parquet holds no rows"),
    ],
)
def test_files_verl_cannot_use_are_refused_at_start(data, tmp_path, key, case, problem):
    _, files = data
    message = refusal(data, tmp_path, f"{key}={files[case]}")
    assert re.match(rf"^{re.escape(key)}=\S+: {problem}", message), message
    assert "train_batch_size=0" not in message
    assert message.endswith(
        f"; set {key}={files['train' if key == 'data.train_files' else 'val']} (the value this "
        "command had before), or fix the data"
    ), message


def test_verl_itself_refuses_a_csv_only_when_it_builds_the_dataset(data):
    """What the start check spares: verl's own error, raised inside the trainer's Ray actor."""
    with pytest.raises(ValueError, match="Unsupported file format"):
        verl_rows(data, data[1]["csv"])


def test_an_empty_list_of_training_files_names_the_data(data, tmp_path):
    message = refusal(data, tmp_path, "data.train_files=[]")
    assert message.startswith("data.train_files=[]: ") and "set data.train_files=" in message, message


def _positions(model: Path) -> int:
    return json.loads((model / "config.json").read_text())["max_position_embeddings"]


def test_the_suggested_prompt_length_is_the_smallest_that_keeps_a_batch(data, tmp_path):
    """Of 64, 128, 256, ...: the first that leaves verl's dataset a batch of 4 (the one before it does not)."""
    inputs, files = data
    message = refusal(data, tmp_path, "data.max_prompt_length=4")
    n = int(message.rsplit("data.max_prompt_length=", 1)[1])
    assert n in (64, 128, 256, 512) and n + 48 <= _positions(inputs.model), message
    assert verl_rows(data, files["train"], max_prompt_length=n) >= 4
    assert n == 64 or verl_rows(data, files["train"], max_prompt_length=n // 2) < 4


def test_no_prompt_length_is_suggested_past_the_models_positions(data, tmp_path):
    """With 1,000 response tokens the 1,024-position model leaves prompts 24, which keeps no batch: no length is
    suggested that the model could not hold with its responses."""
    inputs, _ = data
    assert _positions(inputs.model) == 1024
    message = refusal(data, tmp_path, "data.max_prompt_length=4", "data.max_response_length=1000")
    assert message.startswith("data.max_prompt_length=4: "), message
    assert "; set " not in message and "1024 positions" in message and "data.max_response_length" in message, message


def test_a_prompt_and_response_past_the_models_positions_are_refused_with_the_response_length_that_fits(data, tmp_path):
    inputs, _ = data
    positions = _positions(inputs.model)
    message = refusal(data, tmp_path, "data.max_prompt_length=1000", "data.max_response_length=100")
    assert message.startswith("data.max_prompt_length=1000 + data.max_response_length=100: 1100 tokens"), message
    assert f"{positions} positions" in message, message
    fix = message.rsplit("; set ", 1)[-1]
    assert fix == f"data.max_response_length={positions - 1000}", message
    launch.checked_config(command(data, tmp_path, "data.max_prompt_length=1000", "data.max_response_length=100", fix))


def test_a_tokenizer_larger_than_the_models_embedding_is_refused_with_both_numbers(data, tmp_path):
    """A model folder whose config.json has a smaller vocab_size than its tokenizer (no weights are read)."""
    from transformers import AutoTokenizer

    inputs, _ = data
    model = tmp_path / "model"
    shutil.copytree(inputs.model, model)
    tokens = len(AutoTokenizer.from_pretrained(model))
    config = json.loads((model / "config.json").read_text())
    assert config["vocab_size"] == tokens  # the model as built passes (test_the_data_as_given_passes...)
    config["vocab_size"] = tokens - 8
    (model / "config.json").write_text(json.dumps(config))
    message = refusal(data, tmp_path / "run", f"actor_rollout_ref.model.path={model}")
    assert message.startswith(f"actor_rollout_ref.model.path={model}: "), message
    assert f"{tokens} tokens" in message and f"{tokens - 8} (vocab_size)" in message, message


@pytest.mark.parametrize(
    "broken, named",
    [
        (lambda text: text[: len(text) // 2], "config.json"),  # cut short
        (lambda text: text.replace('"max_position_embeddings": 1024', '"max_position_embeddings": "1024"'), "'1024'"),
    ],
    ids=["cut-short", "string-positions"],
)
def test_a_model_folder_whose_config_cannot_be_read_is_refused_in_one_line(data, tmp_path, broken, named):
    inputs, _ = data
    model = tmp_path / "model"
    shutil.copytree(inputs.model, model)
    text = (model / "config.json").read_text()
    assert '"max_position_embeddings": 1024' in text
    (model / "config.json").write_text(broken(text))
    message = refusal(data, tmp_path / "run", f"actor_rollout_ref.model.path={model}")
    assert message.startswith(f"actor_rollout_ref.model.path={model}: ") and named in message, message
    assert "config.json" in message.rsplit("; ", 1)[1], message


@pytest.mark.parametrize("key", ["data.train_files", "data.val_files"])
def test_a_fifo_given_as_data_is_refused_without_opening_it(data, tmp_path, key):
    """A reader that opens a FIFO waits for a writer: the start blocked until it was killed."""
    fifo = tmp_path / "f.parquet"
    os.mkfifo(fifo)
    message = refusal(data, tmp_path, f"{key}={fifo}")
    assert message.startswith(f"{key}={fifo}: ") and "FIFO" in message, message
