"""capo_verl.compat.shm: what is removed from /dev/shm, and what is left alone."""

from __future__ import annotations

import time
from pathlib import Path

from capo_verl.compat import shm


def test_shm_cleanup_removes_only_new_unmapped_entries_of_its_patterns(tmp_path, monkeypatch):
    for name in ("psm_new", "verl_weights_abc", "sem.loky-1-x", "unrelated", "psm_held"):
        (tmp_path / name).write_bytes(b"x")
    # /proc/<pid>/maps would name the file under tmp_path, not /dev/shm: say which one a live process maps
    monkeypatch.setattr(shm, "_mapped_shm_paths", lambda: {str(tmp_path / "psm_held")})
    assert shm.cleanup_shm(time.time() + 60, shm_dir=str(tmp_path), wait_s=0.0) == []  # older than the run
    removed = shm.cleanup_shm(time.time() - 60, shm_dir=str(tmp_path), wait_s=0.0)
    assert sorted(Path(p).name for p in removed) == ["psm_new", "sem.loky-1-x", "verl_weights_abc"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["psm_held", "unrelated"]


def test_mapped_shm_paths_sees_a_live_mapping():
    import mmap
    from multiprocessing import shared_memory

    segment = shared_memory.SharedMemory(create=True, size=4096)
    try:
        assert f"/dev/shm/{segment.name}" in shm._mapped_shm_paths()
        assert isinstance(segment.buf, memoryview) and mmap.PAGESIZE > 0
    finally:
        segment.close()
        segment.unlink()
