"""The record of one ``tests/gpu/run_on_device.sh`` run: ``record.json`` from the files the run left in its folder.

    python tests/gpu/device_record.py env OUT_DIR [--repo REPO]     # source_blobs.txt, env.json, env.txt (first)
    python tests/gpu/device_record.py build OUT_DIR [--repo REPO]   # writes OUT_DIR/record.json, prints a summary
    python tests/gpu/device_record.py verify OUT_DIR [--repo REPO]  # the tested files against the recorded commit

``record.json`` holds: the commit tested (``git rev-parse HEAD`` where the checkout has its ``.git``, else
``$CAPO_VERL_COMMIT``) and the git blob hash of every source file the run read (``source_blobs.txt``: the same
hashes as ``git ls-tree -r <commit>``, so ``verify`` can tell whether the files that ran are the commit's); the
machine (``nvidia-smi``, CPU count, memory, Python, torch, CUDA, transformers; ``env.json``); the kit laid
(``kit.txt``: the dist-infos laid, or ``none`` with ``KIT=none``); each stage's exit status and time
(``stages.tsv``); every test of the CUDA tier with its outcome and time (``pytest_gpu.xml``) and the differences it
measured next to their tolerances (the tests'
``record_property("measured:<q>", ...)`` / ``("tolerance:<q>", ...)``); the actor-update comparison
(``actor_update_compare.json``: each quantity's measured difference and tolerance); the estimator timings
(``gpu_tier.json``). ``ok`` is true when every stage exited 0.

The exit status of ``build`` is 0 when ``ok``, else 1.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

#: what the run reads from the checkout (the source files whose blob hashes are recorded)
SOURCE_DIRS = ("capo_verl", "tests", "benchmarks", "configs", "scripts")
SOURCE_FILES = ("pyproject.toml",)
SOURCE_SUFFIXES = (".py", ".sh", ".yaml", ".yml", ".toml", ".json", ".jsonl", ".txt", ".md", ".jinja")


def git_blob_hash(data: bytes) -> str:
    """``git hash-object`` of ``data``."""
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def source_files(repo: Path) -> list[str]:
    """The checkout's source files under :data:`SOURCE_DIRS` (no caches, no results), repository-relative."""
    out = [f for f in SOURCE_FILES if (repo / f).is_file()]
    for top in SOURCE_DIRS:
        for root, dirs, files in os.walk(repo / top):
            dirs[:] = sorted(d for d in dirs if d not in ("__pycache__", "results") and not d.startswith("."))
            for name in sorted(files):
                if name.endswith(SOURCE_SUFFIXES):
                    out.append(str((Path(root) / name).relative_to(repo)))
    return sorted(out)


def source_blobs(repo: Path) -> dict[str, str]:
    return {path: git_blob_hash((repo / path).read_bytes()) for path in source_files(repo)}


def commit_of(repo: Path) -> dict:
    """The commit tested and whether the checkout had local changes (only where ``.git`` came along)."""
    try:
        head = subprocess.run(
            ["git", "-C", str(repo), "rev-parse", "HEAD"], capture_output=True, text=True, check=True
        ).stdout.strip()
        status = subprocess.run(
            ["git", "-C", str(repo), "status", "--porcelain", "--untracked-files=no"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        return {"commit": head, "from": "git", "locally_changed": [line[3:] for line in status.splitlines()]}
    except (OSError, subprocess.CalledProcessError):
        commit = os.environ.get("CAPO_VERL_COMMIT") or None
        return {"commit": commit, "from": "CAPO_VERL_COMMIT" if commit else None, "locally_changed": None}


def junit_tests(path: Path) -> list[dict]:
    """Every test case of a pytest junit xml: id, outcome, seconds, and its ``measured:`` / ``tolerance:``
    properties paired by quantity."""
    if not path.is_file():
        return []
    tests = []
    for case in ET.parse(path).getroot().iter("testcase"):
        outcome = "passed"
        message = None
        for tag in ("failure", "error", "skipped"):
            node = case.find(tag)
            if node is not None:
                outcome = {"failure": "failed", "error": "error", "skipped": "skipped"}[tag]
                message = (node.get("message") or "")[:500]
                break
        measured: dict[str, dict] = {}
        for prop in case.iter("property"):
            kind, _, quantity = prop.get("name", "").partition(":")
            if kind in ("measured", "tolerance") and quantity:
                try:
                    value = float(prop.get("value"))
                except (TypeError, ValueError):
                    value = prop.get("value")
                measured.setdefault(quantity, {})[kind] = value
        for row in measured.values():
            if isinstance(row.get("measured"), float) and isinstance(row.get("tolerance"), float):
                row["fraction_of_tolerance"] = row["measured"] / row["tolerance"] if row["tolerance"] else None
        classname = case.get("classname", "")
        tests.append(
            {
                "id": f"{classname.replace('.', '/')}.py::{case.get('name')}" if classname else case.get("name"),
                "outcome": outcome,
                "seconds": float(case.get("time") or 0.0),
                "message": message,
                "differences": measured,
            }
        )
    return tests


def read_stages(path: Path) -> list[dict]:
    stages = []
    if path.is_file():
        for line in path.read_text().splitlines():
            name, status, seconds = line.split("\t")[:3]
            stages.append({"stage": name, "exit_status": int(status), "seconds": int(seconds)})
    return stages


def _json(path: Path):
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def _run(*cmd: str, timeout: float = 10) -> str:
    """A command's standard output (stripped), or one line naming why it gave none; never raises."""
    try:
        return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout).stdout.strip()
    except (OSError, subprocess.SubprocessError) as e:
        return f"{cmd[0]}: {type(e).__name__}: {e}"


def environment(out_dir: Path, repo: Path) -> dict:
    """Write ``source_blobs.txt`` (first: what the run reads), ``env.json`` (Python, torch and its CUDA, the GPU,
    ``nvidia-smi``'s name, driver and memory, CPU count, memory in GiB, the versions of the machine's packages) and
    ``env.txt`` (the date, ``nvidia-smi``, ``pip list``); returns what ``env.json`` holds. Each external command has
    a time limit of 10 s (``pip list`` 30 s) and a command that fails is recorded as its error, not raised."""
    import platform
    import time

    blobs = source_blobs(repo)
    (out_dir / "source_blobs.txt").write_text("".join(f"{h}  {p}\n" for p, h in blobs.items()))
    info: dict = {"python": platform.python_version(), "executable": sys.executable, "cpus": os.cpu_count(),
                  "uname": platform.platform()}  # fmt: skip
    try:
        import torch

        cuda = torch.cuda.is_available()
        info.update(torch=torch.__version__, cuda=torch.version.cuda, gpu=torch.cuda.get_device_name(0) if cuda
                    else None, gpu_count=torch.cuda.device_count() if cuda else 0)  # fmt: skip
    except Exception as e:  # noqa: BLE001  recorded: the run's CUDA check already needed torch
        info["torch"] = f"cannot import torch ({type(e).__name__}: {e})"
    query = ("--query-gpu=name,driver_version,memory.total", "--format=csv,noheader")
    info["nvidia_smi_query"] = _run("nvidia-smi", *query)
    for name in ("transformers", "numpy", "pandas", "pytest", "safetensors", "tokenizers"):
        try:
            info[name] = __import__(name).__version__
        except Exception as e:  # noqa: BLE001  recorded as missing
            info[name] = f"missing ({type(e).__name__})"
    try:
        info["memory_gib"] = round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30, 1)
    except (ValueError, OSError):
        pass
    (out_dir / "env.json").write_text(json.dumps(info, indent=1))
    text = [time.strftime("%a %b %d %H:%M:%S UTC %Y", time.gmtime()), _run("nvidia-smi"),
            _run(sys.executable, "-m", "pip", "list", timeout=30)]  # fmt: skip
    (out_dir / "env.txt").write_text("\n".join(text) + "\n")
    return info


def build(out_dir: Path, repo: Path) -> dict:
    stages = read_stages(out_dir / "stages.tsv")
    tests = junit_tests(out_dir / "pytest_gpu.xml")
    counts: dict[str, int] = {}
    for test in tests:
        counts[test["outcome"]] = counts.get(test["outcome"], 0) + 1
    blobs_file = out_dir / "source_blobs.txt"
    blobs = (
        dict(line.split("  ", 1)[::-1] for line in blobs_file.read_text().splitlines()) if blobs_file.is_file() else {}
    )
    compare = _json(out_dir / "actor_update_compare.json")
    timings = _json(out_dir / "gpu_tier.json")
    record = {
        "source": {**commit_of(repo), "files": len(blobs), "blobs": "source_blobs.txt"},
        "machine": _json(out_dir / "env.json"),
        "kit": (out_dir / "kit.txt").read_text().splitlines() if (out_dir / "kit.txt").is_file() else None,
        "stages": stages,
        "cuda_tier": {
            "counts": counts,
            "failed": [t["id"] for t in tests if t["outcome"] in ("failed", "error")],
            "tests": tests,
        },
        "actor_update": None
        if compare is None
        else {
            "ok": compare["ok"],
            "rows": compare["rows"],
            "update_effect": compare.get("update_effect"),
            "problems": compare.get("problems"),
            "reference": compare.get("reference"),
            "candidate": compare.get("candidate"),
        },
        "estimator_timings": timings,
        "ok": bool(stages) and all(s["exit_status"] == 0 for s in stages),
    }
    (out_dir / "record.json").write_text(json.dumps(record, indent=1))
    return record


def summary(record: dict) -> str:
    lines = [f"commit {record['source']['commit']} ({record['source']['from']}); ok: {record['ok']}"]
    machine = record.get("machine") or {}
    lines.append(f"machine: {machine.get('gpu')}; torch {machine.get('torch')}; python {machine.get('python')}")
    for stage in record["stages"]:
        lines.append(f"  {stage['stage']:<20} exit {stage['exit_status']:>3}  {stage['seconds']:>4} s")
    tier = record["cuda_tier"]
    if tier["tests"]:
        lines.append(f"CUDA tier: {tier['counts']}; failed: {tier['failed'] or 'none'}")
    else:
        lines.append("CUDA tier: no test ran (no pytest_gpu.xml: see pytest_gpu.log)")
    for test in tier["tests"]:
        for quantity, row in test["differences"].items():
            lines.append(f"  {test['id']}: {quantity} {row.get('measured')!r} <= {row.get('tolerance')!r}")
    if record["actor_update"] is not None:
        lines.append(f"actor update, CUDA against the CPU: ok {record['actor_update']['ok']}")
        for row in record["actor_update"]["rows"]:
            lines.append(
                f"  {row['update']} {row['quantity']}: {row['measured']!r} <= {row['tolerance']!r} "
                f"({'ok' if row['ok'] else 'FAILED'})"
            )
    return "\n".join(lines)


def verify(out_dir: Path, repo: Path, commit: str | None) -> int:
    """Compare ``source_blobs.txt`` with ``git ls-tree -r <commit>``: prints the files that differ."""
    record = _json(out_dir / "record.json") or {}
    commit = commit or (record.get("source") or {}).get("commit")
    if not commit:
        print("no commit recorded: pass --commit", file=sys.stderr)
        return 2
    tree = subprocess.run(
        ["git", "-C", str(repo), "ls-tree", "-r", commit], capture_output=True, text=True, check=True
    ).stdout
    committed = {line.split("\t", 1)[1]: line.split()[2] for line in tree.splitlines()}
    ran = dict(line.split("  ", 1)[::-1] for line in (out_dir / "source_blobs.txt").read_text().splitlines())
    differ = sorted(p for p, h in ran.items() if committed.get(p) != h)
    for path in differ:
        print(f"differs from {commit[:10]}: {path}" if path in committed else f"not in {commit[:10]}: {path}")
    print(f"{len(ran)} files of the run checked against {commit}, {len(differ)} differ")
    return 1 if differ else 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    for name in ("build", "verify", "blobs", "env"):
        p = sub.add_parser(name)
        p.add_argument("out_dir")
        p.add_argument("--repo", default=str(Path(__file__).resolve().parents[2]))
        if name == "verify":
            p.add_argument("--commit", default=None)
    args = parser.parse_args(argv)
    out_dir, repo = Path(args.out_dir), Path(args.repo)
    if args.command == "blobs":
        blobs = source_blobs(repo)
        (out_dir / "source_blobs.txt").write_text("".join(f"{h}  {p}\n" for p, h in blobs.items()))
        return 0
    if args.command == "env":  # run_on_device.sh, before anything else runs
        print(json.dumps(environment(out_dir, repo), indent=1))
        return 0
    if args.command == "verify":
        return verify(out_dir, repo, args.commit)
    record = build(out_dir, repo)
    print(summary(record))
    return 0 if record["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
