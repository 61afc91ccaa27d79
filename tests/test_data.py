"""capo_verl.data on the shipped files: verl parquet schema, row counts, split sizes, determinism, errors."""

from __future__ import annotations

import json
import re

import numpy as np
import pandas as pd
import pytest

from capo_verl import cli, data
from capo_verl.data import SYSTEM_PROMPT

SUBSET = data.RESOURCES / "train" / "deepscaler_sub1209.parquet"
BENCH_ROWS = {"aime24": 30, "aime25": 30, "math500": 500, "amc23": 40, "minerva_math": 272, "olympiadbench": 675}


@pytest.fixture(scope="module")
def prepared(tmp_path_factory):
    out = tmp_path_factory.mktemp("capo_data")
    rc = data.main(["--out-dir", str(out), "--train-source", str(SUBSET), "--train-size", "1000", "--val-size", "100"])
    assert rc == 0
    return out


def read(path) -> pd.DataFrame:
    return pd.read_parquet(path)


def assert_verl_rows(df: pd.DataFrame, data_source: str, split: str):
    assert list(df.columns) == ["data_source", "prompt", "ability", "reward_model", "extra_info"]
    assert (df["data_source"] == data_source).all()
    assert (df["ability"] == "math").all()
    for prompt, rm, extra in zip(df["prompt"], df["reward_model"], df["extra_info"], strict=True):
        prompt = list(prompt)
        assert [m["role"] for m in prompt] == ["system", "user"]
        assert prompt[0]["content"] == SYSTEM_PROMPT  # one template for every file
        problem = prompt[1]["content"]
        assert problem and problem == extra["problem"]
        assert "\\boxed{}" not in problem  # the instruction lives in the system message only
        assert rm["style"] == "rule"
        assert isinstance(rm["ground_truth"], str) and rm["ground_truth"].strip()
        assert not (rm["ground_truth"].startswith("$") and rm["ground_truth"].endswith("$"))
        assert extra["split"] == split and isinstance(extra["index"], (int, np.integer))


def test_training_split_on_shipped_subset(prepared):
    train, val = read(prepared / "deepscaler_train.parquet"), read(prepared / "deepscaler_val.parquet")
    assert (len(train), len(val)) == (1000, 100)
    assert_verl_rows(train, "deepscaler", "train")
    assert_verl_rows(val, "deepscaler", "val")
    train_idx = set(train["extra_info"].map(lambda e: e["index"]))
    val_idx = set(val["extra_info"].map(lambda e: e["index"]))
    assert len(train_idx) == 1000 and len(val_idx) == 100 and not train_idx & val_idx  # disjoint
    # the row with an empty gold answer in the subset (source row 265) is never used
    assert 265 not in train_idx | val_idx
    # problems are the subset's prompts without their appended instruction, gold answers unchanged
    source = pd.read_parquet(SUBSET)
    first = train.iloc[0]
    src = source.iloc[first["extra_info"]["index"]]
    assert src["prompt"][0]["content"].startswith(first["prompt"][1]["content"])
    assert first["reward_model"]["ground_truth"] == src["reward_model"]["ground_truth"].strip("$")
    manifest = json.loads((prepared / "manifest.json").read_text())
    assert manifest["system_prompt"] == SYSTEM_PROMPT
    info = manifest["files"]["deepscaler_train.parquet"]
    assert info["rows"] == 1000 and info["seed"] == 42 and info["source_rows_usable"] == 1208
    assert info["source_rows_dropped_empty"] == 1


@pytest.mark.parametrize("name", sorted(BENCH_ROWS))
def test_benchmarks(prepared, name):
    df = read(prepared / f"{name}.parquet")
    assert len(df) == BENCH_ROWS[name]
    assert_verl_rows(df, name, "test")
    assert list(df["extra_info"].map(lambda e: e["index"])) == list(range(len(df)))


def test_benchmark_gold_fields(prepared):
    """Each benchmark keeps its gold answer in a different field (capo_verl/resources/SOURCES.md)."""

    def gold(name, i):
        return read(prepared / f"{name}.parquet").iloc[i]["reward_model"]["ground_truth"]

    assert gold("aime24", 0) == "204"
    assert gold("aime25", 0) == "70"
    assert gold("amc23", 0) == "27"  # float 27.0 in the source
    assert gold("math500", 0) == "\\left( 3, \\frac{\\pi}{2} \\right)"
    assert gold("minerva_math", 0) == "1.6"  # last \boxed{} of the solution
    olympiad = read(prepared / "olympiadbench.parquet")
    golds = list(olympiad["reward_model"].map(lambda r: r["ground_truth"]))
    assert golds[0] == "2"
    assert "69,84" in golds  # "$69$,$84$" in the source
    assert not any("$" in g for g in golds)


def test_split_is_deterministic_and_seeded(tmp_path):
    df, dropped = data.load_deepscaler(str(SUBSET))
    assert (len(df), dropped) == (1208, 1)
    a_train, a_val = data.split_train_val(df, 500, 50, seed=42)
    b_train, b_val = data.split_train_val(df, 500, 50, seed=42)
    pd.testing.assert_frame_equal(a_train, b_train)
    pd.testing.assert_frame_equal(a_val, b_val)
    c_train, c_val = data.split_train_val(df, 500, 50, seed=7)
    assert set(c_val["source_index"]) != set(a_val["source_index"])
    # the validation set does not depend on the training size (first val_size of the permutation)
    _, d_val = data.split_train_val(df, 100, 50, seed=42)
    pd.testing.assert_frame_equal(a_val, d_val)
    assert (np.diff(a_train["source_index"]) > 0).all()  # source order kept
    # the whole pipeline writes byte-identical files for the same seed
    for out in (tmp_path / "a", tmp_path / "b"):
        data.prepare(out, train_source=str(SUBSET), train_size=300, val_size=30, benchmarks=())
    for name in ("deepscaler_train.parquet", "deepscaler_val.parquet"):
        pd.testing.assert_frame_equal(read(tmp_path / "a" / name), read(tmp_path / "b" / name))


def test_too_few_rows_is_a_clear_error(tmp_path, capsys):
    df, _ = data.load_deepscaler(str(SUBSET))
    with pytest.raises(
        ValueError, match=r"\b1208\b.*train_size \+ val_size = 20000 \+ 240\b.*--train-size / --val-size"
    ):
        data.split_train_val(df)  # the paper's 20,000 / 240 need the full dataset
    rc = data.main(["--out-dir", str(tmp_path), "--train-source", str(SUBSET), "--no-benchmarks"])
    assert rc == 2
    err = capsys.readouterr().err
    assert "--train-size / --val-size" in err and "agentica-org/DeepScaleR-Preview-Dataset" in err
    assert not (tmp_path / "deepscaler_train.parquet").exists()


def test_local_deepscaler_json_formats(tmp_path):
    """DeepScaleR's own columns (problem, answer, solution) from jsonl and json files."""
    records = [{"problem": f"What is {i}+{i}?", "answer": str(2 * i), "solution": "..."} for i in range(30)]
    records.append({"problem": "", "answer": "1", "solution": ""})
    (tmp_path / "dsr.jsonl").write_text("\n".join(json.dumps(r) for r in records))
    (tmp_path / "dsr.json").write_text(json.dumps(records))
    for name in ("dsr.jsonl", "dsr.json"):
        df, dropped = data.load_deepscaler(str(tmp_path / name))
        assert (len(df), dropped) == (30, 1)
        assert df.iloc[3].to_dict() == {"problem": "What is 3+3?", "answer": "6", "source_index": 3}
    manifest = data.prepare(tmp_path / "out", str(tmp_path / "dsr.jsonl"), train_size=20, val_size=5, benchmarks=())
    assert manifest["files"]["deepscaler_val.parquet"]["rows"] == 5


def test_hub_id_goes_through_datasets(monkeypatch):
    """A hub id is loaded with datasets.load_dataset(id, split='train') (faked here: no network)."""
    import datasets

    calls = []

    def fake_load_dataset(path, split=None, **kwargs):
        calls.append((path, split))
        return datasets.Dataset.from_dict({"problem": ["1+1?", "2+2?"], "answer": ["2", "4"], "solution": ["", ""]})

    monkeypatch.setattr(datasets, "load_dataset", fake_load_dataset)
    df, dropped = data.load_deepscaler(data.DEEPSCALER_HUB_ID)
    assert calls == [(data.DEEPSCALER_HUB_ID, "train")]
    assert list(df["answer"]) == ["2", "4"] and dropped == 0


def test_source_errors(tmp_path):
    with pytest.raises(FileNotFoundError, match="does not exist"):
        data.load_deepscaler(str(tmp_path / "missing.parquet"))
    (tmp_path / "bad.jsonl").write_text(json.dumps({"question": "x", "gold": "1"}) + "\n")
    with pytest.raises(ValueError, match="expected columns problem\\+answer"):
        data.load_deepscaler(str(tmp_path / "bad.jsonl"))
    with pytest.raises(KeyError, match="unknown benchmark 'aime23'"):
        data.load_benchmark("aime23")
    with pytest.raises(FileNotFoundError, match="--benchmarks-dir"):
        data.load_benchmark("aime24", tmp_path)
    with pytest.raises(ValueError, match="must be >= 0"):
        data.split_train_val(pd.DataFrame({"problem": [], "answer": []}), -1, 0)


def test_cli_entry_point(tmp_path, capsys):
    """`capo-verl prepare-data` dispatches to capo_verl.data.main."""
    rc = cli.main(["prepare-data", "--out-dir", str(tmp_path), "--no-train", "--benchmarks", "aime25,gsm8k"])
    assert rc == 0
    out = capsys.readouterr().out
    assert f"{tmp_path}/aime25.parquet: 30 rows (aime25)" in out
    assert f"{tmp_path}/gsm8k.parquet: 1319 rows (gsm8k)" in out
    gsm8k = read(tmp_path / "gsm8k.parquet")
    assert gsm8k.iloc[0]["reward_model"]["ground_truth"] == "18"
    assert cli.main(["prepare-data", "--out-dir", str(tmp_path), "--no-train", "--benchmarks", "nope"]) == 2


def test_gold_answers_grade_with_the_reward(prepared):
    """The prepared gold answers are what capo_verl.reward expects: a boxed copy of each scores 1.0."""
    from capo_verl.reward import compute_score

    for name in ("aime24", "amc23", "olympiadbench"):
        df = read(prepared / f"{name}.parquet").iloc[::10]
        for rm in df["reward_model"]:
            gold = rm["ground_truth"]
            assert compute_score(name, f"The answer is \\boxed{{{gold}}}.", gold)["score"] == 1.0, gold


def test_gsm8k_calc_slice_is_seeded_and_its_splits_are_disjoint(tmp_path):
    train, val = data.write_gsm8k_calc_parquet(tmp_path / "a", n_train=8, n_val=4, n_test=3, seed=0)
    again, _ = data.write_gsm8k_calc_parquet(tmp_path / "b", n_train=8, n_val=4, seed=0)
    rows = {split: read(tmp_path / "a" / f"gsm8k_calc_{split}.parquet") for split in ("train", "val", "test")}
    assert [len(rows[s]) for s in ("train", "val", "test")] == [8, 4, 3]
    assert train == tmp_path / "a" / "gsm8k_calc_train.parquet" and val.name == "gsm8k_calc_val.parquet"
    assert read(again)["extra_info"].tolist() == rows["train"]["extra_info"].tolist()
    first = rows["train"].iloc[0]
    assert first["data_source"] == data.GSM8K_CALC_SOURCE
    expression = {e: r for e, r in data.gsm8k_calc_problems(data.RESOURCES / "train" / "gsm8k_train.jsonl")}
    problem = first["extra_info"]["problem"]
    [(a, op, b)] = re.findall(r"What is (\d+) ([-+*/]) (\d+)\?", problem)
    assert list(first["prompt"]) == [{"role": "user", "content": problem}]
    assert first["reward_model"]["ground_truth"] == expression[f"{a}{op}{b}"]
    val_ids = {i["index"] for i in rows["val"]["extra_info"]}
    assert not val_ids & {i["index"] for i in rows["test"]["extra_info"]}  # both from the test file, disjoint
    with pytest.raises(ValueError, match="asked for"):
        data.write_gsm8k_calc_parquet(tmp_path / "c", n_train=10**6)
