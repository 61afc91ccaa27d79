"""capo_verl/stored.py and benchmarks/compress_results.py: a study's dumps read the same plain, ``.xz`` or ``.gz``,
and storing a folder anew keeps every number and every step-0 marker valid."""

from __future__ import annotations

import gzip
import hashlib
import json
import lzma
from pathlib import Path

import pytest

from capo_verl import stored
from capo_verl.compare.report import read_validation_pass, validation_dump

TEXT = (
    b'{"input": "q", "output": "2", "lpm": -1.0, "acc": true}\n'
    b'{"input": "q", "output": "3", "lpm": -2.0, "acc": false}\n'
)


@pytest.fixture(scope="module")
def compress_results(load_benchmark):
    return load_benchmark("compress_results")


def test_stored_takes_the_plain_file_then_xz_then_gz(tmp_path):
    plain = tmp_path / "30.jsonl"
    assert stored.stored(plain) == plain  # nothing there: the plain name (.exists() tells)
    (tmp_path / "30.jsonl.gz").write_bytes(gzip.compress(TEXT))
    assert stored.stored(plain) == tmp_path / "30.jsonl.gz"
    (tmp_path / "30.jsonl.xz").write_bytes(lzma.compress(TEXT))
    assert stored.stored(plain) == tmp_path / "30.jsonl.xz"
    plain.write_bytes(TEXT)
    assert stored.stored(plain) == plain
    for name in ("30.jsonl.xz", "30.jsonl.gz", "none.jsonl.xz"):  # a compressed name is taken as it is
        assert stored.stored(tmp_path / name) == tmp_path / name
    for name in ("30.jsonl", "30.jsonl.xz", "30.jsonl.gz"):
        assert stored.read_bytes(tmp_path / name) == TEXT


def test_compress_writes_the_same_xz_bytes_for_the_same_text(tmp_path):
    a, b = tmp_path / "a.jsonl", tmp_path / "b.jsonl.gz"
    a.write_bytes(TEXT)
    b.write_bytes(gzip.compress(TEXT, mtime=123))  # an earlier study's gzip form
    xa, xb = stored.compress(a), stored.compress(b)
    assert (xa.name, xb.name) == ("a.jsonl.xz", "b.jsonl.xz")
    assert not a.exists() and not b.exists()
    assert xa.read_bytes() == xb.read_bytes() == stored.xz_bytes(TEXT)
    assert lzma.decompress(xa.read_bytes()) == TEXT
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.jsonl.xz", "b.jsonl.xz"]  # no partial file left
    with pytest.raises(ValueError, match="already stored as xz"):
        stored.compress(xa)


def test_a_damaged_gz_is_not_replaced(tmp_path):
    from capo_verl.inputs import NotADataFile

    cut = tmp_path / "cut.jsonl.gz"
    data = gzip.compress(TEXT * 50)
    cut.write_bytes(data[: len(data) // 2])
    with pytest.raises(NotADataFile, match="cut.jsonl.gz: the gzip file is cut short"):
        stored.compress(cut)
    assert cut.read_bytes() == data[: len(data) // 2] and sorted(tmp_path.iterdir()) == [cut]


def _study(root: Path) -> dict[str, bytes]:
    """A seed folder as an earlier study committed it: the step-0 pass gzip-compressed, a method that took it with a
    marker naming the ``.gz`` by its own SHA-256, another whose marker names the plain dump, and a method's redundant
    copy of the pass."""
    seed = root / "seed3"
    step0 = seed / "step0" / "val_generations"
    step0.mkdir(parents=True)
    packed = gzip.compress(TEXT, mtime=0)
    (step0 / "0.jsonl.gz").write_bytes(packed)
    for method, named, digest in (
        ("grpo", "step0/val_generations/0.jsonl.gz", hashlib.sha256(packed).hexdigest()),
        ("capo", "step0/val_generations/0.jsonl", hashlib.sha256(TEXT).hexdigest()),
    ):
        folder = seed / method / "val_generations"
        folder.mkdir(parents=True)
        (folder / "0.shared.json").write_text(json.dumps({"from": named, "sha256": digest}, indent=1) + "\n")
        (folder / "30.jsonl.gz").write_bytes(gzip.compress(TEXT.replace(b"-2.0", b"-3.0"), mtime=0))
        (seed / method / "attempts.jsonl").write_text('{"attempt": 1}\n')
        (seed / method / "metrics.jsonl").write_text('{"step": 1}\n')
    (seed / "capo" / "val_generations" / "0.jsonl").write_bytes(TEXT)  # the copy the marker makes redundant
    return {
        str(p.relative_to(root)): stored.read_bytes(p)
        for p in sorted(root.rglob("*"))
        if p.is_file() and p.name != "0.shared.json"
    }


def test_compress_results_stores_an_earlier_study_as_xz_and_keeps_its_markers_valid(tmp_path, compress_results):
    contents = _study(tmp_path)
    seed = tmp_path / "seed3"
    passes = {m: read_validation_pass(validation_dump(seed / m / "val_generations", 0)) for m in ("grpo", "capo")}
    compress_results.main([str(tmp_path)])
    files = sorted(str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*") if p.is_file())
    assert files == [
        "seed3/capo/attempts.jsonl",
        "seed3/capo/metrics.jsonl.xz",
        "seed3/capo/val_generations/0.shared.json",
        "seed3/capo/val_generations/30.jsonl.xz",
        "seed3/grpo/attempts.jsonl",
        "seed3/grpo/metrics.jsonl.xz",
        "seed3/grpo/val_generations/0.shared.json",
        "seed3/grpo/val_generations/30.jsonl.xz",
        "seed3/step0/val_generations/0.jsonl.xz",
    ]
    for name, data in contents.items():  # every kept dump holds the text it held
        if name != "seed3/capo/val_generations/0.jsonl":
            assert stored.read_bytes(stored.stored(tmp_path / stored.plain_name(name))) == data, name
    marker = json.loads((tmp_path / "seed3/grpo/val_generations/0.shared.json").read_text())
    assert marker == {"from": "step0/val_generations/0.jsonl", "sha256": hashlib.sha256(TEXT).hexdigest()}
    for m, before in passes.items():  # each method still reads the seed's one pass, checked against its marker
        dump = validation_dump(tmp_path / "seed3" / m / "val_generations", 0)
        assert dump == tmp_path / "seed3/step0/val_generations/0.jsonl.xz"
        after = read_validation_pass(dump)
        assert after.questions == before.questions and [list(x) for x in after.lpm] == [list(x) for x in before.lpm]
    snapshot = {p: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()}
    compress_results.main([str(tmp_path)])  # a rerun changes nothing
    assert {p: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()} == snapshot


def test_compress_results_leaves_a_marker_whose_file_differs(tmp_path, compress_results):
    _study(tmp_path)
    marker = tmp_path / "seed3/grpo/val_generations/0.shared.json"
    marker.write_text(json.dumps({"from": "step0/val_generations/0.jsonl.gz", "sha256": "0" * 64}))
    before = {p: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()}
    with pytest.raises(ValueError, match=r"0.shared.json: .*0.jsonl.gz is missing or not the file it recorded"):
        compress_results.main([str(tmp_path)])
    assert {p: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()} == before


@pytest.mark.parametrize(
    "damage",
    [
        lambda x: x + b"not xz",  # appended: LZMAFile alone reads the stream before it and ignores the rest
        lambda x: x + b"\0\0\0\0" + b"\xfd7zXZ\0 a second stream cut",
        lambda x: x[:-3],  # cut short
        lambda x: x + b"\0\0\0\0",  # stream padding, which Python's reader does not take
    ],
    ids=["junk appended", "a broken second stream", "cut short", "padding"],
)
def test_an_xz_file_that_does_not_end_whole_is_refused(tmp_path, damage):
    from capo_verl.inputs import NotADataFile

    path = tmp_path / "30.jsonl.xz"
    path.write_bytes(damage(stored.xz_bytes(TEXT)))
    with pytest.raises(NotADataFile, match=r"30.jsonl.xz: the xz file does not end with an xz stream's footer"):
        stored.read_bytes(path)
    path.write_bytes(stored.xz_bytes(TEXT) + stored.xz_bytes(b"more\n"))  # two whole streams read as one text
    assert stored.read_bytes(path) == TEXT + b"more\n"


def test_compress_results_refuses_two_forms_of_a_dump_that_differ(tmp_path, compress_results):
    """A newer plain dump beside an older compressed one: nothing is stored anew, nothing lost."""
    seed = tmp_path / "seed3" / "grpo"
    seed.mkdir(parents=True)
    (seed / "metrics.jsonl").write_bytes(b'{"step": 1}\n{"step": 2}\n')
    (seed / "metrics.jsonl.gz").write_bytes(gzip.compress(b'{"step": 1}\n'))
    (seed / "eval_generations.jsonl").write_bytes(TEXT)
    before = {p: p.read_bytes() for p in seed.iterdir()}
    with pytest.raises(ValueError, match="metrics.jsonl.*metrics.jsonl.gz: forms of one dump that hold different"):
        compress_results.main([str(tmp_path)])
    assert {p: p.read_bytes() for p in seed.iterdir()} == before
    (seed / "metrics.jsonl.gz").write_bytes(gzip.compress(b'{"step": 1}\n{"step": 2}\n'))  # the same text
    (seed / "eval_generations.jsonl.xz").write_bytes(stored.xz_bytes(TEXT))
    compress_results.main([str(tmp_path)])
    assert sorted(p.name for p in seed.iterdir()) == ["eval_generations.jsonl.xz", "metrics.jsonl.xz"]
    assert stored.read_bytes(seed / "metrics.jsonl.xz") == b'{"step": 1}\n{"step": 2}\n'
    with pytest.raises(ValueError, match="holds other data"):  # compress itself never writes over other data
        (seed / "metrics.jsonl").write_bytes(b"{}\n")
        stored.compress(seed / "metrics.jsonl")
    assert (seed / "metrics.jsonl").exists()
