"""benchmarks/collect_compare.py: what is copied, what is left behind, and the seeds summary at the top of ``out/``."""

from __future__ import annotations

import json
import lzma
from pathlib import Path

import pytest


@pytest.fixture(scope="module")
def cc(load_benchmark):
    return load_benchmark("collect_compare")


def _write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def _out(tmp_path: Path, methods: list[str]) -> Path:
    """A compare ``--out`` folder: one finished unit, one under way, and a top-level summary of ``methods``."""
    src = tmp_path / "out"
    done = src / "seed3" / "grpo"
    _write(done / ".capo-verl-run.json", "{}")
    _write(done / "done.json", "{}")
    _write(done / "metrics.jsonl", '{"step": 1}\n')
    _write(done / "train.log", "log\n")
    _write(done / "ckpt" / "global_step_30" / "model.pt", "weights")
    _write(done / "val_generations" / "30.jsonl", '{"output": "1 + 1 = 2"}\n')
    running = src / "seed3" / "capo"
    _write(running / ".capo-verl-run.json", "{}")
    _write(running / "attempts.jsonl", "{}\n")
    _write(running / "metrics.jsonl", '{"step": 1}\n')
    _write(src / "seeds_summary.json", json.dumps({"methods": methods, "seeds": [3]}))
    _write(src / "seeds_summary.md", "summary\n")
    _write(src / "seeds_curves.png", "png")
    _write(src / "compare.json", "{}")
    return src


def test_two_method_summary_and_finished_unit_copied(cc, tmp_path):
    src, dest = _out(tmp_path, ["grpo", "capo"]), tmp_path / "dest"
    copied, left_out = cc.collect(src, dest, max_bytes=2**20, compress_dumps=True)
    assert sorted(map(str, copied)) == [
        "compare.json",
        "seed3/capo/.capo-verl-run.json",
        "seed3/capo/attempts.jsonl",
        "seed3/grpo/.capo-verl-run.json",
        "seed3/grpo/done.json",
        "seed3/grpo/metrics.jsonl.xz",
        "seed3/grpo/val_generations/30.jsonl.xz",
        "seeds_curves.png",
        "seeds_summary.json",
        "seeds_summary.md",
    ]
    assert left_out == []
    assert (
        lzma.decompress((dest / "seed3/grpo/val_generations/30.jsonl.xz").read_bytes()) == b'{"output": "1 + 1 = 2"}\n'
    )
    assert cc.collect(src, dest, max_bytes=2**20, compress_dumps=True) == ([], [])  # rerun: nothing changed


def test_compress_dumps_replaces_an_older_gzip_copy(cc, tmp_path):
    """A folder collected into with the former gzip form holds each dump once, as ``.xz``, after a rerun."""
    import gzip

    src, dest = _out(tmp_path, ["grpo", "capo"]), tmp_path / "dest"
    old = dest / "seed3/grpo/val_generations/30.jsonl.gz"
    _write(old, "")
    old.write_bytes(gzip.compress(b'{"output": "1 + 1 = 2"}\n', mtime=0))
    cc.collect(src, dest, max_bytes=2**20, compress_dumps=True)
    assert sorted(p.name for p in old.parent.iterdir()) == ["30.jsonl.xz"]


def test_one_method_summary_keeps_the_last_comparison(cc, tmp_path):
    dest = tmp_path / "dest"
    _write(dest / "seeds_summary.json", json.dumps({"methods": ["grpo", "capo"], "seeds": [3]}))
    _write(dest / "seeds_summary.md", "pair\n")
    src = _out(tmp_path, ["grpo"])
    copied, left_out = cc.collect(src, dest, max_bytes=2**20)
    assert sorted((str(rel), why) for rel, why in left_out) == [
        (name, "a one-method seeds summary") for name in ("seeds_curves.png", "seeds_summary.json", "seeds_summary.md")
    ]
    assert not {"seeds_summary.json", "seeds_summary.md", "seeds_curves.png"} & set(map(str, copied))
    assert json.loads((dest / "seeds_summary.json").read_text())["methods"] == ["grpo", "capo"]
    assert (dest / "seeds_summary.md").read_text() == "pair\n"
    assert "seed3/grpo/val_generations/30.jsonl" in set(map(str, copied))  # no --compress-dumps: copied as it is


def test_size_limit_lists_the_file(cc, tmp_path):
    src = _out(tmp_path, ["grpo", "capo"])
    _write(src / "seed3" / "grpo" / "big.json", "x" * (2**20 + 1))
    copied, left_out = cc.collect(src, tmp_path / "dest", max_bytes=2**20)
    assert left_out == [(Path("seed3/grpo/big.json"), "over 1 MB")]
    assert Path("seed3/grpo/big.json") not in copied


def test_skip_leaves_out_the_shared_folders(cc, tmp_path):
    src, dest = _out(tmp_path, ["grpo", "capo"]), tmp_path / "dest"
    _write(src / "teacher_forced" / "pool.jsonl", "{}\n")
    copied, _ = cc.collect(src, dest, max_bytes=2**20, skip=("seed*/grpo", "teacher_forced", "*.png"))
    names = sorted(map(str, copied))
    assert not [n for n in names if n.startswith(("seed3/grpo", "teacher_forced")) or n.endswith(".png")]
    assert "seed3/capo/attempts.jsonl" in names and "compare.json" in names


def test_compress_dumps_keeps_one_copy_of_a_shared_step0_pass(cc, tmp_path):
    """A method's copy of its seed's step-0 pass is left out where the pass it names is copied with the same
    bytes, and the committed folder still reads the pass for that method (``validation_dump``)."""
    import hashlib

    from capo_verl.compare.report import read_validation_pass, validation_dump

    src, dest = _out(tmp_path, ["grpo", "capo"]), tmp_path / "dest"
    dump = '{"input": "q", "output": "2", "lpm": -1.0, "acc": true}\n'
    _write(src / "seed3" / "step0" / ".capo-verl-run.json", "{}")
    _write(src / "seed3" / "step0" / "done.json", "{}")
    _write(src / "seed3" / "step0" / "val_generations" / "0.jsonl", dump)
    marker = {"from": "step0/val_generations/0.jsonl", "sha256": hashlib.sha256(dump.encode()).hexdigest()}
    _write(src / "seed3" / "grpo" / "val_generations" / "0.jsonl", dump)
    _write(src / "seed3" / "grpo" / "val_generations" / "0.shared.json", json.dumps(marker))
    copied, _ = cc.collect(src, dest, max_bytes=2**20, compress_dumps=True)
    names = set(map(str, copied))
    assert "seed3/step0/val_generations/0.jsonl.xz" in names
    assert not {"seed3/grpo/val_generations/0.jsonl", "seed3/grpo/val_generations/0.jsonl.xz"} & names
    folder = dest / "seed3" / "grpo" / "val_generations"
    assert validation_dump(folder, 0) == dest / "seed3" / "step0" / "val_generations" / "0.jsonl.xz"
    assert read_validation_pass(validation_dump(folder, 0)).questions == ["q"]
    # a copy whose bytes differ from its source is kept
    _write(src / "seed3" / "grpo" / "val_generations" / "0.jsonl", dump.replace("-1.0", "-2.0"))
    copied, _ = cc.collect(src, dest, max_bytes=2**20, compress_dumps=True)
    assert "seed3/grpo/val_generations/0.jsonl.xz" in set(map(str, copied))


def test_validation_dump_refuses_a_shared_pass_of_other_bytes(tmp_path):
    from capo_verl.compare.report import validation_dump

    seed = tmp_path / "seed3"
    _write(seed / "step0" / "val_generations" / "0.jsonl", "{}\n")
    marker = {"from": "step0/val_generations/0.jsonl", "sha256": "0" * 64}
    _write(seed / "grpo" / "val_generations" / "0.shared.json", json.dumps(marker))
    with pytest.raises(ValueError, match="SHA-256"):
        validation_dump(seed / "grpo" / "val_generations", 0)


def test_compress_dumps_stores_a_pass_taken_from_a_committed_gzip_pass(cc, tmp_path):
    """A run that took its seed's committed step-0 pass holds it as ``0.jsonl.gz``, with a marker naming the ``.gz``
    by that file's SHA-256: collected, the pass is stored once as ``.xz`` and the marker names the plain dump by the
    SHA-256 of its text, so the method still reads the pass."""
    import gzip
    import hashlib

    from capo_verl.compare.report import read_validation_pass, validation_dump

    src, dest = _out(tmp_path, ["grpo", "capo"]), tmp_path / "dest"
    dump = b'{"input": "q", "output": "2", "lpm": -1.0, "acc": true}\n'
    packed = gzip.compress(dump, mtime=0)
    _write(src / "seed3" / "step0" / ".capo-verl-run.json", "{}")
    _write(src / "seed3" / "step0" / "done.json", "{}")
    for folder in (src / "seed3" / "step0" / "val_generations", src / "seed3" / "grpo" / "val_generations"):
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "0.jsonl.gz").write_bytes(packed)
    marker = {"from": "step0/val_generations/0.jsonl.gz", "sha256": hashlib.sha256(packed).hexdigest()}
    _write(src / "seed3" / "grpo" / "val_generations" / "0.shared.json", json.dumps(marker))
    cc.collect(src, dest, max_bytes=2**20, compress_dumps=True)
    step0, grpo = dest / "seed3" / "step0" / "val_generations", dest / "seed3" / "grpo" / "val_generations"
    assert sorted(p.name for p in step0.iterdir()) == ["0.jsonl.xz"]
    assert sorted(p.name for p in grpo.iterdir()) == ["0.shared.json", "30.jsonl.xz"]
    assert json.loads((grpo / "0.shared.json").read_text()) == {
        "from": "step0/val_generations/0.jsonl",
        "sha256": hashlib.sha256(dump).hexdigest(),
    }
    assert validation_dump(grpo, 0) == step0 / "0.jsonl.xz"
    assert read_validation_pass(validation_dump(grpo, 0)).questions == ["q"]
