#!/usr/bin/env python3
"""Hostile round 4: rerun the scripted cases and print the table (case, class, expected, got, verdict).

    .venv/bin/python benchmarks/results/hostile_round4/run_cases.py [--only ID,ID] [--kills N] [--md FILE]

Safe: no trainer, no Ray, no vLLM engine. Launch scripts only with --dry-run; `eval generate` only with
`--device cuda` on a CPU-only vLLM (so it stops before any engine even if the check under test is missing);
`mask-thresholds` without --pool only with a 0-row --data (it stops before drawing); teacher-forced scoring
only with the tiny test model on 2-response pools. Scratch in a temp dir, removed at the end.
Verdicts: ok / refused-cleanly / PASSED-WRONGLY / TRACEBACK / LOST-DATA (and HANG: killed by its timeout).
--kills N adds N random-time SIGKILL/SIGTERM trials of `eval score` (timing cases, not reproducible one by one).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]
PY = str(REPO / ".venv/bin/python")
CLI = str(REPO / ".venv/bin/capo-verl")
SHARED = Path(os.environ.get("CAPO_SHARED_DATA", REPO.parent / "shared" / "data"))
ROOT = Path(tempfile.mkdtemp(prefix="hostile4.", dir=os.environ.get("HOSTILE4_TMP") or None))
FIX = ROOT / "fix"
CASES: list[dict] = []


def case(id, cls, cmd, expect, setup=None, must=None, allow_change=(), check=None, timeout=120, env=None, note=""):
    CASES.append(
        dict(
            id=id,
            cls=cls,
            cmd=cmd,
            expect=expect,
            setup=setup,
            must=must,
            allow_change=allow_change,
            check=check,
            timeout=timeout,
            env=env or {},
            note=note,
            kind="cli",
        )
    )


def lib(id, cls, code, expect, must=None, note=""):
    CASES.append(dict(id=id, cls=cls, cmd=code, expect=expect, must=must, kind="lib", note=note))


# ------------------------------------------------------------------------------------------ fixtures
def gen_lines(n_q=3, k=4, correct=None, lpm=None, source="gsm8k"):
    out = []
    for q in range(n_q):
        for s in range(k):
            c = (s % 2 == 0) if correct is None else correct
            out.append(
                dict(
                    data_source=source,
                    question_id=q,
                    sample_index=s,
                    response=f"r{q}{s} \\boxed{{{s}}}",
                    answer=str(s),
                    correct=c,
                    lpm=(-0.5 - 0.1 * s - 0.05 * q) if lpm is None else lpm,
                    num_tokens=5,
                    truncated=False,
                    ground_truth="0",
                )
            )
    return out


def write_gen(path, lines=None, **kw):
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in (lines if lines is not None else gen_lines(**kw))))
    return path


def make_fixtures():
    FIX.mkdir(parents=True)
    code = textwrap.dedent(f"""
        from capo_verl.cpu.models import tiny_model_checkpoint
        from capo_verl.data import write_gsm8k_calc_parquet
        tiny_model_checkpoint({str(FIX / "tiny")!r}, init_std=0.5, seed=0)
        write_gsm8k_calc_parquet({str(FIX / "data")!r}, n_train=16, n_val=4, seed=0)
        import pandas as pd
        df = pd.read_parquet({str(FIX / "data/gsm8k_calc_train.parquet")!r})
        df.iloc[:0].to_parquet({str(FIX / "empty_rows.parquet")!r})
        df.rename(columns={{'prompt': 'question'}}).to_parquet({str(FIX / "noprompt.parquet")!r})
    """)
    subprocess.run([PY, "-c", code], check=True, capture_output=True)
    write_gen(FIX / "gen.jsonl")
    # a pool for teacher-forced / mask-thresholds: 2 gsm8k calc questions, 2 responses each, from the val parquet
    import pyarrow.parquet as pq

    rows = pq.read_table(FIX / "data/gsm8k_calc_val.parquet").to_pylist()[:2]
    pool = []
    for _q, r in enumerate(rows):
        gt = r["reward_model"]["ground_truth"]
        for s, ans in enumerate([gt, "123456789"]):
            pool.append(
                dict(
                    data_source=r["data_source"],
                    question_id=r["extra_info"]["index"],
                    sample_index=s,
                    response=f"The answer is \\boxed{{{ans}}}",
                    answer=ans,
                    correct=(s == 0),
                    lpm=-1.0 - s,
                    num_tokens=6,
                    truncated=False,
                    ground_truth=gt,
                )
            )
    (FIX / "pool.jsonl").write_text("".join(json.dumps(p) + "\n" for p in pool))
    (FIX / "pool_allcorrect.jsonl").write_text(
        "".join(
            json.dumps(
                {
                    **p,
                    "response": p["response"].replace("123456789", p["ground_truth"]),
                    "answer": p["ground_truth"],
                    "correct": True,
                }
            )
            + "\n"
            for p in pool
        )
    )


def cp(src, dst):
    dst = Path(dst)
    dst.parent.mkdir(parents=True, exist_ok=True)
    if Path(src).is_dir():
        shutil.copytree(src, dst)
    else:
        shutil.copy2(src, dst)
    return dst


def scored(d, out="rep"):
    """An `eval score` output folder made for real (so its marker is there)."""
    write_gen(d / "old.jsonl", gen_lines(n_q=2, k=2))
    subprocess.run(
        [CLI, "eval", "score", "--no-plots", str(d / "old.jsonl"), "--out", str(d / out)],
        check=True,
        capture_output=True,
        cwd=d,
    )


# ------------------------------------------------------------------------------------------ snapshot
def snapshot(*roots):
    snap = {}
    for root in roots:
        for dirpath, dirnames, filenames in os.walk(root):
            for name in filenames + [d for d in dirnames if os.path.islink(os.path.join(dirpath, d))]:
                p = os.path.join(dirpath, name)
                try:
                    st = os.lstat(p)
                except OSError:
                    continue
                if os.path.islink(p):
                    snap[p] = "link:" + os.readlink(p)
                elif os.path.isfile(p) and st.st_size < 64 * 2**20 and not name.startswith("sparse"):
                    snap[p] = hashlib.sha256(Path(p).read_bytes()).hexdigest()
                else:
                    snap[p] = f"size:{st.st_size}:{st.st_mtime_ns}"
    return snap


def changed(before, after, allow):
    out = []
    for p, h in before.items():
        if any(p.endswith(a) or f"/{a}/" in p for a in allow):
            continue
        if p not in after:
            out.append(f"removed {Path(p).name}")
        elif after[p] != h:
            out.append(f"changed {Path(p).name}")
    return out


# ------------------------------------------------------------------------------------------ running
def first_error(text):
    for line in text.splitlines():
        if "error:" in line or "failed:" in line or line.startswith(("Traceback", "Error", "ERROR")):
            return line.strip()[:230]
    lines = [l for l in text.splitlines() if l.strip()]
    return (lines[-1].strip()[:230]) if lines else ""


def run_cli(c):
    d = ROOT / "cases" / c["id"]
    d.mkdir(parents=True, exist_ok=True)
    if c["setup"]:
        c["setup"](d)
    before = snapshot(d, FIX)
    env = dict(
        os.environ,
        HOME=str(d / "home"),
        CAPO_CKPT_DIR=str(d / "ckpt"),
        CAPO_DATA_DIR=str(d / "data"),
        CAPO_CPU_DATA_DIR=str(d / "cpudata"),
        CAPO_CPU_CKPT_DIR=str(d / "cpuckpt"),
        CAPO_VERL_CACHE=os.path.expanduser("~/.cache/capo-verl"),
        D=str(d),
        FIX=str(FIX),
        REPO=str(REPO),
        CLI=CLI,
        PY=PY,
    )
    (d / "home").mkdir(exist_ok=True)
    env.update({k: v.replace("{D}", str(d)).replace("{FIX}", str(FIX)) for k, v in c["env"].items()})
    cmd = c["cmd"].replace("$CLI", CLI)
    t0 = time.time()
    try:
        p = subprocess.run(
            ["bash", "-c", cmd],
            cwd=d,
            env=env,
            capture_output=True,
            text=True,
            timeout=c["timeout"],
            stdin=subprocess.DEVNULL,
        )
        rc, out = p.returncode, p.stdout + p.stderr
    except subprocess.TimeoutExpired as e:
        rc, out = 124, (e.stdout or b"").decode(errors="replace") + (e.stderr or b"").decode(errors="replace")
    after = snapshot(d, FIX)
    lost = changed(before, after, c["allow_change"])
    tb = "Traceback (most recent call last)" in out
    try:
        extra = c["check"](d, out) if c["check"] and rc != 124 else None
    except Exception as e:  # the check itself could not read what it expected
        extra = f"{'PASSED-WRONGLY' if c['expect'] == 'refuse' else 'REFUSED-WRONGLY'}: check failed ({type(e).__name__}: {e})"  # noqa: E501
    if tb:
        verdict = "TRACEBACK"
    elif lost:
        verdict = "LOST-DATA"
    elif rc == 124:
        verdict = "HANG"
    elif extra:
        verdict = extra.split(":")[0]
    elif c["expect"] == "refuse":
        verdict = "PASSED-WRONGLY" if rc == 0 or (c["must"] and c["must"] not in out) else "refused-cleanly"
    else:
        verdict = "ok" if rc == 0 else "REFUSED-WRONGLY"
    got = f"rc={rc}; {first_error(out) if rc else 'exit 0'}"
    if lost:
        got += f"; files: {', '.join(lost[:4])}"
    if extra:
        got += f"; {extra}"
    if c["must"] and c["must"] not in out and verdict == "PASSED-WRONGLY" and rc != 0:
        got += f"; message lacks {c['must']!r}"
    return dict(
        id=c["id"],
        cls=c["cls"],
        cmd=cmd,
        expect=c["expect"] + (f" ({c['note']})" if c["note"] else ""),
        got=got,
        verdict=verdict,
        secs=round(time.time() - t0, 1),
    )


LIB_HEAD = """
import json, math, sys, traceback, warnings
import numpy as np, torch
from omegaconf import OmegaConf
from capo_verl.estimators import *
from capo_verl.estimators.common import grpo_group_advantages
from capo_verl.evaluation import metrics as M
bs, L = 4, 3
R = torch.zeros(bs, L); R[0, -1] = 1; R[2, -1] = 1
MASK = torch.ones(bs, L); IDX = np.array(['a', 'a', 'b', 'b'], dtype=object)
OLP = torch.full((bs, L), -1.0); OLP[1] = -2; OLP[3] = -3
REF = torch.full((bs, L), -0.5)
CFG = OmegaConf.create({"capo": {"tau": 0.6, "use_mask": True}})
gid = torch.tensor([0, 0, 1, 1]); c = torch.tensor([True, False, True, False]); v = torch.ones(4, dtype=torch.bool)
lpm = torch.tensor([-1., -3., -1., -2.])
res = {}
for cid, code in json.loads(sys.argv[1]).items():
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        try:
            r = eval(code)
            res[cid] = ["RETURNED", repr(r).replace(chr(10), " ")[:160], [str(x.message)[:100] for x in w]]
        except Exception as e:
            res[cid] = ["RAISED", f"{type(e).__name__}: {str(e)[:200]}", [str(x.message)[:100] for x in w]]
print("@@" + json.dumps(res))
"""


def run_libs(cases):
    if not cases:
        return []
    codes = {c["id"]: c["cmd"] for c in cases}
    p = subprocess.run([PY, "-c", LIB_HEAD, json.dumps(codes)], capture_output=True, text=True, timeout=300)
    res = json.loads(p.stdout.split("@@", 1)[1])
    rows = []
    for c in cases:
        kind, msg, warns = res[c["id"]]
        if kind == "RETURNED":
            verdict = "ok" if c["expect"] == "ok" else "PASSED-WRONGLY"
            got = f"returned {msg}" + (f" (warning: {warns[0]})" if warns else "")
        else:
            etype = msg.split(":")[0]
            named = c["must"] is None or c["must"].lower() in msg.lower()
            if c["expect"] == "ok":
                verdict = "REFUSED-WRONGLY"
            elif etype in ("ValueError", "TypeError", "EstimatorInputError") and named:
                verdict = "refused-cleanly"
            else:
                verdict = "TRACEBACK"  # an exception that does not name what is wrong
            got = f"raised {msg}"
        rows.append(
            dict(
                id=c["id"],
                cls=c["cls"],
                cmd=c["cmd"],
                got=got,
                verdict=verdict,
                secs=0,
                expect=("returns" if c["expect"] == "ok" else f"ValueError/TypeError naming {c['must']!r}")
                + (f" ({c['note']})" if c["note"] else ""),
            )
        )
    return rows


# ------------------------------------------------------------------------------------------ the cases
from cases_def import define  # noqa: E402  (the case list, beside this file)


def kill_trials(n):
    rows = []
    d = ROOT / "kills"
    d.mkdir()
    scored(d)
    big = write_gen(d / "big.jsonl", gen_lines(n_q=400, k=8))
    for t in range(n):
        sig = signal.SIGKILL if t % 3 else signal.SIGTERM
        old = snapshot(d / "rep")
        delay = random.uniform(0.3, 6.0)
        p = subprocess.Popen(
            [CLI, "eval", "score", str(big), "--out", "rep"],
            cwd=d,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        time.sleep(delay)
        p.send_signal(sig)
        err = p.communicate()[1]
        mid = snapshot(d / "rep")
        new_ok = (
            (d / "rep/metrics.json").exists() and "big" in (d / "rep/.capo-verl-eval-score.json").read_text()
            if (d / "rep/.capo-verl-eval-score.json").exists()
            else False
        )
        whole = mid == old or (
            new_ok
            and (d / "rep/report.md").exists()
            and (d / "rep/old.jsonl").exists() is False
            or new_ok
            and (d / "rep/report.md").exists()
        )
        q = subprocess.run(
            [CLI, "eval", "score", "--no-plots", str(d / "old.jsonl"), "--out", "rep"],
            cwd=d,
            capture_output=True,
            text=True,
        )
        left = [x.name for x in d.iterdir() if x.name.startswith(".capo-verl")]
        tb = "Traceback" in err or "Traceback" in q.stderr
        verdict = "TRACEBACK" if tb else ("ok" if whole and q.returncode == 0 and not left else "LOST-DATA")
        state = "old" if mid == old else ("new" if new_ok else "MIXED/MISSING")
        rows.append(
            dict(
                id=f"K{t + 1:02d}",
                cls=2,
                cmd=f"eval score big.jsonl --out rep; {sig.name} after {delay:.2f}s; "
                "then eval score old.jsonl --out rep",
                expect="rep old or new whole; next run completes",
                got=f"rc={p.returncode}; rep={state}; next run rc={q.returncode}; leftovers={left}",
                verdict=verdict,
                secs=round(delay, 1),
            )
        )
    return rows


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--only", default="")
    ap.add_argument("--kills", type=int, default=0)
    ap.add_argument("--md", default="")
    args = ap.parse_args()
    try:
        make_fixtures()
        define(sys.modules[__name__])
        only = set(filter(None, args.only.split(",")))
        todo = [c for c in CASES if not only or c["id"] in only]
        rows = run_libs([c for c in todo if c["kind"] == "lib"])
        for c in todo:
            if c["kind"] == "cli":
                rows.append(run_cli(c))
                r = rows[-1]
                if os.environ.get("HOSTILE4_ROWS"):
                    with open(os.environ["HOSTILE4_ROWS"], "a") as f:
                        f.write(json.dumps(r) + "\n")
                print(f"{r['id']:8} {r['verdict']:16} {r['got'][:150]}", file=sys.stderr, flush=True)
        rows += kill_trials(args.kills)
        rows.sort(key=lambda r: (str(r["cls"]), r["id"]))
        counts = {}
        for r in rows:
            counts[r["verdict"]] = counts.get(r["verdict"], 0) + 1

        def esc(s):
            return str(s).replace("|", "\\|").replace("\n", " ")

        md = [
            f"cases: {len(rows)}; " + ", ".join(f"{k}: {v}" for k, v in sorted(counts.items())),
            "",
            "| case | class | command / snippet | expected | got | verdict |",
            "|---|---|---|---|---|---|",
        ]
        md += [
            f"| {r['id']} | {r['cls']} | `{esc(r['cmd'])}` | {esc(r['expect'])} | {esc(r['got'])} | **{r['verdict']}** |"  # noqa: E501
            if r["verdict"] not in ("ok", "refused-cleanly")
            else f"| {r['id']} | {r['cls']} | `{esc(r['cmd'])}` | {esc(r['expect'])} | {esc(r['got'])} | {r['verdict']} |"  # noqa: E501
            for r in rows
        ]
        print("\n".join(md))
        if args.md:
            Path(args.md).write_text("\n".join(md) + "\n")
            Path(args.md).with_suffix(".json").write_text(json.dumps(rows, indent=0))
    finally:
        shutil.rmtree(ROOT, ignore_errors=True)


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).parent))
    main()
