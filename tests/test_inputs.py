"""Data files a user types (issue 65, section 6): checked by their metadata and first bytes before they are read (a
1 GiB sparse file is refused before memory grows), a JSON error names the file and the line, a symlink loop is named
as a loop, in every command that reads them."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from capo_verl import data, inputs, mask_thresholds
from capo_verl.evaluation import cli as eval_cli
from capo_verl.evaluation.problems import read_rows
from capo_verl.outputs import SymlinkLoop


def one_error(capsys, prog: str) -> str:
    err = capsys.readouterr().err
    assert "Traceback" not in err, err
    lines = [line for line in err.splitlines() if line.startswith(f"{prog}: error: ")]
    assert len(lines) == 1, err
    return lines[0].removeprefix(f"{prog}: error: ")


def test_what_is_not_a_data_file_is_refused_from_its_first_bytes(tmp_path, monkeypatch):
    cases = {
        "sparse.jsonl": None,  # made below
        "zeros.jsonl": b"\0" * 64,
        "binary.jsonl": b"\x89PNG\r\n",
        "text.json": b"hello",
        "json.parquet": b'{"a": 1}',
        "cut.parquet": b"PAR1 and no footer",
        "plain.jsonl.gz": b'{"a": 1}\n',
        "plain.jsonl.xz": b'{"a": 1}\n',
        "gzip.jsonl.xz": b"\x1f\x8b\x08\x00",
    }
    for name, content in cases.items():
        path = tmp_path / name
        if content is None:
            with open(path, "wb") as f:
                f.write(b'{"a": 1}\n')
                f.truncate(2**30)  # 1 GiB, all but 9 bytes a hole
        else:
            path.write_bytes(content)
        with pytest.raises(inputs.NotADataFile, match=rf"{name}: "):
            inputs.check_data_file(path)
    with pytest.raises(inputs.NotADataFile, match="is a folder"):
        inputs.check_data_file(tmp_path)
    with pytest.raises(inputs.NotADataFile, match="not a regular file"):
        inputs.check_data_file("/dev/zero")
    with pytest.raises(FileNotFoundError, match=r"no such data file: .*/none.jsonl \(make one\)"):
        inputs.check_data_file(tmp_path / "none.jsonl", hint="make one")
    monkeypatch.setattr(inputs, "MAX_JSON_BYTES", 10)
    (tmp_path / "big.json").write_text('[{"a": 1}, {"a": 2}]')
    with pytest.raises(inputs.NotADataFile, match="write it as JSON lines"):
        inputs.check_data_file(tmp_path / "big.json")
    import lzma

    whole = (("a.jsonl", b'\xef\xbb\xbf\n {"a": 1}\n'), ("b.json", b"[1]"), ("c.jsonl", b""))
    for ok, content in (*whole, ("d.jsonl.xz", lzma.compress(b'{"a": 1}\n')), ("E.JSONL.XZ", lzma.compress(b"{}"))):
        (tmp_path / ok).write_bytes(content)
        inputs.check_data_file(tmp_path / ok)


def test_json_errors_name_the_file_and_the_line(tmp_path, monkeypatch):
    (tmp_path / "rows.jsonl").write_text('{"a": 1}\n\n{"a": 2}\n{"a": \n')
    with pytest.raises(inputs.BadDataLine, match=r"rows.jsonl:4: not a JSON line \("):
        read_rows(tmp_path / "rows.jsonl")
    (tmp_path / "rows.json").write_text('[\n  {"a": 1},\n  {"a": 2,}\n]\n')
    with pytest.raises(inputs.BadDataLine, match=r"rows.json:3:\d+: not JSON \("):
        read_rows(tmp_path / "rows.json")
    (tmp_path / "latin.jsonl").write_bytes(b'{"a": "\xe9"}\n')
    with pytest.raises(inputs.BadDataLine, match=r"latin.jsonl:1: not UTF-8"):
        inputs.read_jsonl(tmp_path / "latin.jsonl")
    monkeypatch.setattr(inputs, "MAX_LINE_BYTES", 32)
    (tmp_path / "long.jsonl").write_text('{"a": 1}\n{"a": "' + "x" * 100 + '"}\n')
    with pytest.raises(inputs.BadDataLine, match=r"long.jsonl:2: a line longer than"):
        inputs.read_jsonl(tmp_path / "long.jsonl")


def test_a_benchmark_file_error_names_its_line(tmp_path):
    (tmp_path / "gsm8k_test.jsonl").write_text('{"question": "1+1?", "answer": "#### 2"}\n[1, 2]\n')
    with pytest.raises(ValueError, match=r"\bgsm8k\b.*\brow 1\b.*gsm8k_test\.jsonl\b.*\blist\b"):
        data.load_benchmark("gsm8k", tmp_path)
    (tmp_path / "gsm8k_test.jsonl").write_text('{"question": "1+1?", "answer": "#### 2"}\n{"question": \n')
    with pytest.raises(inputs.BadDataLine, match="gsm8k_test.jsonl:2: not a JSON line"):
        data.load_benchmark("gsm8k", tmp_path)


@pytest.fixture
def loop(tmp_path):
    (tmp_path / "a.jsonl").symlink_to(tmp_path / "b.jsonl")
    (tmp_path / "b.jsonl").symlink_to(tmp_path / "a.jsonl")
    return tmp_path / "a.jsonl"


def test_a_symlink_loop_is_named_as_a_loop_by_every_command(loop, tmp_path, capsys):
    out = tmp_path / "out"
    runs = [
        ("capo-verl eval score", lambda: eval_cli.main(["score", str(loop), "--out", str(out)])),
        (
            "capo-verl eval generate",
            lambda: eval_cli.main(
                ["generate", "--model", "smollm2", "--data", str(loop), "--out", str(out / "g.jsonl")]
            ),
        ),
        (
            "capo-verl eval teacher-forced",
            lambda: eval_cli.main(["teacher-forced", "--pool", str(loop), "--model", "smollm2", "--out", "x.json"]),
        ),
        (
            "capo-verl mask-thresholds",
            lambda: mask_thresholds.main(["--model", "smollm2", "--data", str(loop), "--out", str(out / "t.json")]),
        ),
        (
            "capo-verl prepare-data",
            lambda: data.main(["--train-source", str(loop), "--no-benchmarks", "--out-dir", str(out)]),
        ),
    ]
    for prog, run in runs:
        assert run() == 2, prog
        assert "is a symlink loop" in one_error(capsys, prog), prog
    assert not out.exists()
    with pytest.raises(SymlinkLoop):
        inputs.check_data_file(loop)


#: the command in a fresh process, then its resident high-water mark in KiB (VmHWM: of this process's own memory since
#: its exec; ru_maxrss would also count the parent's resident set at fork)
SPARSE_SCORE = """
import sys
from capo_verl.cli import main
code = main(["eval", "score", sys.argv[1], "--out", sys.argv[2]])
with open("/proc/self/status") as f:
    print(code, next(int(line.split()[1]) for line in f if line.startswith("VmHWM:")))
"""


def test_a_1_gib_sparse_file_is_refused_before_memory_grows(tmp_path):
    sparse = tmp_path / "gen.jsonl"
    with open(sparse, "wb") as f:
        f.write(b'{"data_source": "toy", "response": "')  # a line that never ends, as far as 1 GiB goes
        f.truncate(2**30)
    proc = subprocess.run(
        [sys.executable, "-c", SPARSE_SCORE, str(sparse), str(tmp_path / "out")],
        capture_output=True,
        text=True,
        timeout=300,
    )
    code, max_rss_kib = map(int, proc.stdout.split())
    assert code == 2 and "a sparse file (mostly holes) is not data" in proc.stderr, proc.stderr[-2000:]
    assert max_rss_kib < 400 * 1024, f"{max_rss_kib / 1024:.0f} MiB resident before the refusal"
    assert not (tmp_path / "out").exists() and sorted(os.listdir(tmp_path)) == ["gen.jsonl"]


def test_data_files_that_are_fine_still_read(tmp_path):
    rows = [{"data_source": "toy", "prompt": "1+1?", "reward_model": {"ground_truth": "2"}}]
    (tmp_path / "r.jsonl").write_text(json.dumps(rows[0]) + "\n")
    (tmp_path / "r.json").write_text(json.dumps(rows))
    assert read_rows(tmp_path / "r.jsonl") == rows == read_rows(tmp_path / "r.json")
