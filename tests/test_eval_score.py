"""`capo-verl eval score`: crafted files with hand-computed metrics, and the committed real SmolLM2 run end to end."""

import json
import math
from pathlib import Path

import numpy as np
import pytest
from sklearn.metrics import roc_auc_score

from capo_verl.evaluation import score as S
from capo_verl.evaluation.cli import main

REAL = Path(__file__).parent / "data" / "smollm2_cpu_gsm8k_math500_k8.jsonl"


def write(path, records):
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


def rec(ds, q, answer, correct, lpm, n=10):
    return {"data_source": ds, "question_id": q, "response": f"... \\boxed{{{answer}}}" if answer else "...",
            "answer": answer, "correct": correct, "lpm": lpm, "num_tokens": n}


def read(path):
    return [json.loads(line) for line in open(path, encoding="utf-8")]


# ------------------------------------------------------------------------------------------- crafted


def test_hand_computed_metrics(tmp_path):
    records = [
        # q0: mixed; correct lpm -0.1, wrong -0.5, -0.1 -> AUC (1 + 0.5) / 2 = 0.75
        rec("A", 0, "4", True, -0.1), rec("A", 0, "5", False, -0.5), rec("A", 0, "6", False, -0.1),
        # q1: all wrong, one without an answer
        rec("A", 1, "1", False, -0.2), rec("A", 1, "", False, -0.3), rec("A", 1, "1", False, -0.4),
        # q2 of B: one response only (k ragged across sources), correct
        rec("B", 0, "9", True, -1.0),
    ]
    path = write(tmp_path / "g.jsonl", records)
    metrics = S.score_runs({"run": path}, tmp_path / "out", plots=False)["run"]
    a, b, all_ = metrics["A"], metrics["B"], metrics["all"]
    assert (a["n_questions"], a["n_responses"], a["k"]) == (2, 6, 3)
    assert a["mean_acc"] == pytest.approx((1 / 3 + 0) / 2)
    assert a["auc_mean"] == pytest.approx(0.75) and a["n_mixed_questions"] == 1
    # q0: ppl consistency: C(4) = e^-0.1 = C(6) -> tie, half credit; majority: 3-way tie -> 1/3; max lpm: tie -> 1/2
    assert a["its_accuracy"] == pytest.approx({"ppl_consistency": 0.25, "majority_vote": 1 / 6, "max_lpm": 0.25})
    # pooled precision: lpm sorted -0.1 (c), -0.1 (w), -0.2, -0.3, -0.4, -0.5 (all w); tie block {c, w} -> 1/2
    prec = a["precision_coverage"]["precision"]
    assert prec[0] == pytest.approx(0.5) and prec[-1] == pytest.approx(1 / 6)
    assert a["precision_coverage"]["area"] == pytest.approx(np.mean([1 / 2, 1 / 2, 1 / 3, 1 / 4, 1 / 5, 1 / 6]))
    assert a["answered_frac"] == pytest.approx(5 / 6) and a["mean_num_tokens"] == 10
    assert b["k"] == 1 and b["mean_acc"] == 1.0 and math.isnan(b["auc_mean"]) and b["n_mixed_questions"] == 0
    assert all_["k"] == {"min": 1, "max": 3} and all_["n_questions"] == 3
    assert all_["mean_acc"] == pytest.approx((1 / 3 + 0 + 1) / 3)
    assert metrics["macro_avg"]["mean_acc"] == pytest.approx((a["mean_acc"] + 1.0) / 2)
    assert metrics["macro_avg"]["auc_mean"] == pytest.approx(0.75)  # B has no AUC: left out of the average
    # metrics.json is strict JSON: undefined metrics are null
    on_disk = json.loads((tmp_path / "out" / "metrics.json").read_text(), parse_constant=pytest.fail)
    assert set(on_disk) == {"run"} and on_disk["run"]["B"]["auc_mean"] is None
    assert on_disk["run"]["A"]["auc_mean"] == pytest.approx(0.75)


def test_labels_and_errors(tmp_path):
    good = write(tmp_path / "good.jsonl", [rec("A", 0, "1", True, -0.1)])
    assert S.parse_labelled([f"grpo={good}", str(good)]) == {"grpo": str(good), "good": str(good)}
    with pytest.raises(ValueError, match="label 'good' is given twice"):
        S.parse_labelled([str(good), f"good={good}"])
    with pytest.raises(ValueError, match="bad generation file spec"):
        S.parse_labelled(["=x.jsonl"])
    with pytest.raises(FileNotFoundError, match="capo-verl eval generate"):
        S.read_generations(tmp_path / "missing.jsonl")
    bad = write(tmp_path / "bad.jsonl", [rec("A", 0, "1", True, -0.1), {"data_source": "A", "question_id": 1}])
    with pytest.raises(ValueError, match=r"bad.jsonl:2: missing field\(s\) \['response', 'answer'"):
        S.read_generations(bad)
    nan = write(tmp_path / "nan.jsonl", [rec("A", 0, "1", True, float("nan"))])
    with pytest.raises(ValueError, match="nan.jsonl:1: lpm is nan"):
        S.read_generations(nan)
    (tmp_path / "text.jsonl").write_text("hello\n")
    with pytest.raises(ValueError, match="text.jsonl:1: not a JSON line"):
        S.read_generations(tmp_path / "text.jsonl")
    # the command line turns input errors into a message and exit code 2
    assert main(["score", "--generations", str(tmp_path / "missing.jsonl"), "--out", str(tmp_path / "o")]) == 2


# ------------------------------------------------------------------------------------------- real run


def _by_question(lines, source=None):
    groups = {}
    for r in lines:
        if source is None or r["data_source"] == source:
            groups.setdefault((r["data_source"], str(r["question_id"])), []).append(r)
    return groups


def test_end_to_end_on_committed_real_generations(tmp_path):
    """SmolLM2-135M-Instruct on GSM8K and MATH-500 (k=8, CPU), scored through the CLI next to an
    anti-calibrated copy of itself (lpm negated), then checked against straightforward recomputations."""
    lines = read(REAL)
    assert len(lines) >= 100 and {r["data_source"] for r in lines} == {"gsm8k", "math500"}
    flipped = write(tmp_path / "flipped.jsonl", [{**r, "lpm": -r["lpm"]} for r in lines])
    out = tmp_path / "out"
    assert main(["score", "--generations", f"smollm2={REAL}", f"flipped={flipped}", "--out", str(out)]) == 0

    metrics = json.loads((out / "metrics.json").read_text())
    assert list(metrics) == ["smollm2", "flipped"]
    m, f = metrics["smollm2"], metrics["flipped"]
    assert set(m) == {"gsm8k", "math500", "all", "macro_avg"}
    n_mixed_total = 0
    for source in ("gsm8k", "math500", None):
        key = source or "all"
        groups = _by_question(lines, source)
        assert m[key]["n_questions"] == len(groups) and m[key]["k"] == 8
        acc = np.mean([np.mean([r["correct"] for r in g]) for g in groups.values()])
        assert m[key]["mean_acc"] == pytest.approx(acc, abs=1e-12)
        aucs = [roc_auc_score([r["correct"] for r in g], [r["lpm"] for r in g])
                for g in groups.values() if 0 < sum(r["correct"] for r in g) < len(g)]
        assert m[key]["n_mixed_questions"] == len(aucs)
        if aucs:
            assert m[key]["auc_mean"] == pytest.approx(np.mean(aucs), abs=1e-12)
            assert f[key]["auc_mean"] == pytest.approx(1 - np.mean(aucs), abs=1e-12)  # reversed ranking
        n_mixed_total += len(aucs) if source else 0
        # Algorithm 1 by hand (no ties in real lpm values)
        credit = []
        for g in groups.values():
            c = {}
            for r in g:
                if r["answer"]:
                    c.setdefault(r["answer"].strip(), []).append(r)
            if not c:
                credit.append(0.0)
                continue
            best = max(c, key=lambda a: sum(math.exp(r["lpm"]) for r in c[a]))
            credit.append(float(np.mean([r["correct"] for r in c[best]])))
        assert m[key]["its_accuracy"]["ppl_consistency"] == pytest.approx(np.mean(credit), abs=1e-12)
        assert m[key]["its_accuracy"]["majority_vote"] == f[key]["its_accuracy"]["majority_vote"]  # lpm-free
        pooled = sorted((r for g in groups.values() for r in g), key=lambda r: -r["lpm"])
        prec = m[key]["precision_coverage"]["precision"]
        assert prec[-1] == pytest.approx(np.mean([r["correct"] for r in pooled]), abs=1e-12)
        top = math.ceil(0.5 * len(pooled))
        assert prec[4] == pytest.approx(np.mean([r["correct"] for r in pooled[:top]]), abs=1e-12)
        assert m[key]["mean_acc"] == f[key]["mean_acc"]
    assert n_mixed_total >= 1  # the real file has questions with both outcomes, so AUC is exercised

    report = (out / "report.md").read_text()
    for needle in ("## gsm8k", "## math500", "## all", "| metric | smollm2 | flipped |", "AUC-mean",
                   "ITS accuracy, perplexity consistency", "precision @ coverage 0.1", "smollm2_cpu",
                   "![precision_coverage](precision_coverage.png)"):
        assert needle in report, needle

    import matplotlib.image as mpimg

    for name in ("precision_coverage.png", "accuracy_vs_auc.png"):
        img = mpimg.imread(out / name)
        assert img.ndim == 3 and img.shape[0] > 300 and img.shape[1] > 400
        assert img[..., :3].std() > 0.05  # something is drawn
