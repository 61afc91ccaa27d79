"""`capo-verl eval score`: crafted files with hand-computed metrics, and the committed real SmolLM2 run end to end."""

import json
import math
import subprocess
import sys
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


def rec(ds, q, answer, correct, lpm, n=10, j=0):
    return {
        "data_source": ds,
        "question_id": q,
        "sample_index": j,
        "response": f"... \\boxed{{{answer}}}" if answer else "...",
        "answer": answer,
        "correct": correct,
        "lpm": lpm,
        "num_tokens": n,
    }


def numbered(records):
    """sample_index 0, 1, ... within each question, in list order."""
    seen = {}
    out = []
    for r in records:
        key = (r["data_source"], r["question_id"])
        seen[key] = seen.get(key, -1) + 1
        out.append({**r, "sample_index": seen[key]})
    return out


def read(path):
    return [json.loads(line) for line in open(path, encoding="utf-8")]


# ------------------------------------------------------------------------------------------- crafted


def test_hand_computed_metrics(tmp_path):
    records = [
        # q0: mixed; correct lpm -0.1, wrong -0.5, -0.1 -> AUC (1 + 0.5) / 2 = 0.75
        rec("A", 0, "4", True, -0.1),
        rec("A", 0, "5", False, -0.5),
        rec("A", 0, "6", False, -0.1),
        # q1: all wrong, one without an answer
        rec("A", 1, "1", False, -0.2),
        rec("A", 1, "", False, -0.3),
        rec("A", 1, "1", False, -0.4),
        # q0 of B: all correct
        rec("B", 0, "9", True, -1.0),
        rec("B", 0, "9", True, -1.2),
        rec("B", 0, "9", True, -0.9),
    ]
    path = write(tmp_path / "g.jsonl", numbered(records))
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
    assert b["k"] == 3 and b["mean_acc"] == 1.0 and math.isnan(b["auc_mean"]) and b["n_mixed_questions"] == 0
    assert all_["k"] == 3 and all_["n_questions"] == 3
    assert all_["mean_acc"] == pytest.approx((1 / 3 + 0 + 1) / 3)
    assert metrics["macro_avg"]["mean_acc"] == pytest.approx((a["mean_acc"] + 1.0) / 2)
    assert metrics["macro_avg"]["auc_mean"] == pytest.approx(0.75)  # B has no AUC: left out of the average
    # metrics.json is strict JSON: undefined metrics are null
    on_disk = json.loads((tmp_path / "out" / "metrics.json").read_text(), parse_constant=pytest.fail)
    assert set(on_disk) == {"run"} and on_disk["run"]["B"]["auc_mean"] is None
    assert on_disk["run"]["A"]["auc_mean"] == pytest.approx(0.75)


def test_ragged_k_is_reported_by_score_responses():
    """A caller passing arrays directly may mix k (files may not, see below): k is reported as a range."""
    m = S.score_responses(["a", "a", "b"], ["1", "2", "3"], [True, False, True], [-0.1, -0.2, -0.3])
    assert m["k"] == {"min": 1, "max": 2} and m["mean_acc"] == pytest.approx((0.5 + 1) / 2)


def test_pass_k_values():
    assert S.pass_k_values(1) == [1] and S.pass_k_values(2) == [1, 2] and S.pass_k_values(3) == [1, 2, 3]
    assert S.pass_k_values(8) == [1, 2, 4, 8] and S.pass_k_values(12) == [1, 2, 4, 8, 12]
    assert S.pass_k_values(16) == [1, 2, 4, 8, 16] and S.pass_k_values(0) == []


def test_pass_at_k_in_metrics_json_report_and_cli_line(tmp_path, capsys):
    records = [
        # A q0: 1 of 3 correct -> pass@1 1/3, pass@2 1 - C(2,2)/C(3,2) = 2/3, pass@3 1; A q1: none correct -> 0
        rec("A", 0, "4", True, -0.1),
        rec("A", 0, "5", False, -0.5),
        rec("A", 0, "6", False, -0.2),
        rec("A", 1, "1", False, -0.2),
        rec("A", 1, "2", False, -0.3),
        rec("A", 1, "3", False, -0.4),
        # B q0: 2 of 3 -> pass@1 2/3, pass@2 1 (n - c = 1 < 2), pass@3 1
        rec("B", 0, "9", True, -1.0),
        rec("B", 0, "9", True, -1.2),
        rec("B", 0, "8", False, -0.9),
    ]
    path = write(tmp_path / "g.jsonl", numbered(records))
    out = tmp_path / "out"
    assert main(["score", f"run={path}", "--out", str(out), "--no-plots"]) == 0
    assert "run: mean@k 33.3%, pass@3 66.7%, AUC-mean" in capsys.readouterr().out  # `all`: (1 + 0 + 1) / 3
    metrics = json.loads((out / "metrics.json").read_text())["run"]
    assert metrics["A"]["pass_at_k"] == pytest.approx({"1": 1 / 6, "2": 1 / 3, "3": 0.5}, abs=1e-15)
    assert metrics["B"]["pass_at_k"] == pytest.approx({"1": 2 / 3, "2": 1.0, "3": 1.0}, abs=1e-15)
    assert metrics["all"]["pass_at_k"] == pytest.approx({"1": 1 / 3, "2": 5 / 9, "3": 2 / 3}, abs=1e-15)
    assert metrics["macro_avg"]["pass_at_k"] == pytest.approx({"1": 5 / 12, "2": 2 / 3, "3": 0.75}, abs=1e-15)
    for key in ("A", "B", "all", "macro_avg"):
        assert metrics[key]["pass_at_k"]["1"] == pytest.approx(metrics[key]["mean_acc"], abs=1e-15)
    report = (out / "report.md").read_text()
    assert "pass@k: the unbiased estimator of Chen et al. 2021" in report and "pass@1 equals mean@k" in report
    for row in ("| pass@1 (%) | 16.7 |", "| pass@2 (%) | 33.3 |", "| pass@3 (%) | 50.0 |", "| pass@2 (%) | 55.6 |"):
        assert row in report  # A's rows, then all's
    assert report.count("| pass@3 (%) | 75.0 |") == 1  # the average over data sources


def test_pass_at_k_with_runs_of_different_k_side_by_side(tmp_path):
    two = write(tmp_path / "k2.jsonl", numbered([rec("A", 0, "1", True, -0.1), rec("A", 0, "2", False, -0.2)]))
    four = write(tmp_path / "k4.jsonl", numbered([rec("A", 0, "1", j == 0, -0.1 * (j + 1)) for j in range(4)]))
    S.score_runs({"k2": two, "k4": four}, tmp_path / "out", plots=False)
    report = (tmp_path / "out" / "report.md").read_text()
    assert "| pass@2 (%) | 100.0 | 50.0 |" in report and "| pass@4 (%) | – | 100.0 |" in report


def test_labels(tmp_path):
    good = write(tmp_path / "good.jsonl", [rec("A", 0, "1", True, -0.1)])
    assert S.parse_labelled([f"grpo={good}", str(good)]) == {"grpo": str(good), "good": str(good)}
    with pytest.raises(ValueError, match="label 'good' is given twice"):
        S.parse_labelled([str(good), f"good={good}"])
    with pytest.raises(ValueError, match="bad generation file spec"):
        S.parse_labelled(["=x.jsonl"])
    # `eval teacher-forced --model`: a bare PATH is its own label
    assert S.parse_labelled(["ckpt/a", "b=ckpt/b"], what="--model", default_label=str) == {
        "ckpt/a": "ckpt/a",
        "b": "ckpt/b",
    }
    with pytest.raises(ValueError, match=r"^--model: .*'ckpt/a'.*\btwice\b.*\bLABEL=PATH\b"):
        S.parse_labelled(["ckpt/a", "ckpt/a"], what="--model", default_label=str)
    with pytest.raises(ValueError, match="bad --model spec 'b='"):
        S.parse_labelled(["b="], what="--model", default_label=str)


# ------------------------------------------------------------------------------------------- input checks

GOOD = rec("A", 0, "1", True, -0.5)


@pytest.mark.parametrize(
    "change, message",
    [
        ({"correct": "false"}, r'correct is "false" \(str\); expected a JSON boolean, true or false \(strings and 0/1'),
        ({"correct": 0}, r"correct is 0 \(int\); expected a JSON boolean"),
        ({"correct": None}, r"correct is null \(NoneType\); expected a JSON boolean"),
        ({"truncated": "no"}, r'truncated is "no" \(str\); expected a JSON boolean'),
        ({"lpm": "-0.5"}, r'lpm is "-0.5" \(str\); expected a number, the response\'s mean token log-prob in nats'),
        ({"lpm": True}, r"lpm is true \(bool\); expected a number"),
        ({"lpm": None}, r"lpm is null \(NoneType\); expected a number"),
        ({"lpm": float("nan")}, r"lpm is nan; every response needs a finite mean log-prob"),
        ({"lpm": float("-inf")}, r"lpm is -inf; every response needs a finite mean log-prob"),
        ({"lpm": -(10**400)}, r"lpm is -10{400}; every response needs a finite mean log-prob"),  # beyond float range
        ({"question_id": float("nan")}, r"question_id is NaN \(float\); expected a string or a finite number"),
        (
            {"lpm": 0.5},
            r"lpm is 0.5, but a mean token log-prob is <= 0 nats \(up to 1e-06 is accepted as float rounding",
        ),
        ({"lpm": 2e-6}, r"lpm is 2e-06, but a mean token log-prob is <= 0 nats"),
        ({"num_tokens": -1}, r"num_tokens is -1 \(int\); expected an integer >= 0"),
        ({"num_tokens": 10.0}, r"num_tokens is 10.0 \(float\); expected an integer >= 0"),
        ({"sample_index": "1"}, r'sample_index is "1" \(str\); expected an integer >= 0'),
        ({"data_source": ""}, r'data_source is "" \(str\); expected a non-empty string'),
        ({"question_id": None}, r"question_id is null \(NoneType\); expected a string or a finite number"),
        ({"question_id": [1]}, r"question_id is \[1\] \(list\); expected a string or a finite number"),
        ({"answer": 12}, r'answer is 12 \(int\); expected a string \("" or null when no answer was found\)'),
        ({"response": None}, r"response is null \(NoneType\); expected a string"),
    ],
)
def test_bad_values_name_file_and_line(tmp_path, change, message):
    path = write(tmp_path / "g.jsonl", [GOOD, {**GOOD, "question_id": 1, **change}])
    with pytest.raises(ValueError, match=r"g\.jsonl:2: " + message) as err:
        S.read_generations(path)
    assert "\n" not in str(err.value)


def test_values_that_are_accepted(tmp_path):
    """lpm up to +1e-6 (float rounding of a log-prob of 0), int lpm, string or int ids, null answer, no truncated."""
    lines = [
        GOOD,
        {**GOOD, "question_id": 1, "lpm": 1e-6, "answer": ""},
        {**GOOD, "question_id": "q2", "lpm": 0, "answer": None},
    ]
    cols = S.read_generations(write(tmp_path / "g.jsonl", lines))
    assert cols["lpm"].tolist() == [-0.5, 1e-6, 0.0] and cols["answer"].tolist() == ["1", "", ""]
    assert cols["question_id"].tolist() == ["0", "1", "q2"] and not cols["truncated"].any()


def test_malformed_lines(tmp_path):
    with pytest.raises(FileNotFoundError, match="capo-verl eval generate"):
        S.read_generations(tmp_path / "missing.jsonl")
    with pytest.raises(ValueError, match=r"\bfolder\b.*\.jsonl\b.*\bcapo-verl eval generate\b"):
        S.read_generations(tmp_path)
    bad = write(tmp_path / "bad.jsonl", [GOOD, {"data_source": "A", "question_id": 1}])
    with pytest.raises(ValueError, match=r"bad\.jsonl:2: .*\bmissing\b.*\['sample_index', 'response', 'answer'"):
        S.read_generations(bad)
    (tmp_path / "text.jsonl").write_text(json.dumps(GOOD) + "\nhello\n")
    with pytest.raises(ValueError, match="text.jsonl:2: not a JSON line"):
        S.read_generations(tmp_path / "text.jsonl")
    (tmp_path / "list.jsonl").write_text("[1, 2]\n")
    with pytest.raises(ValueError, match="list.jsonl:1: a JSON list, not an object"):
        S.read_generations(tmp_path / "list.jsonl")
    (tmp_path / "latin1.jsonl").write_bytes(
        json.dumps(GOOD).encode() + b"\n" + json.dumps(GOOD).encode()[:-2] + b' "caf\xe9"}\n'
    )
    with pytest.raises(ValueError, match="latin1.jsonl:2: not UTF-8 text"):
        S.read_generations(tmp_path / "latin1.jsonl")
    (tmp_path / "empty.jsonl").write_text("\n")
    with pytest.raises(ValueError, match="empty.jsonl: no responses in the file"):
        S.read_generations(tmp_path / "empty.jsonl")


def test_duplicate_response_names_both_lines(tmp_path):
    # question ids are compared as text: 0 and "0" are the same question
    lines = numbered([rec("A", 0, "1", True, -0.1), rec("A", 0, "2", False, -0.2)])
    path = write(tmp_path / "dup.jsonl", lines + [rec("A", 1, "1", True, -0.3), {**lines[1], "question_id": "0"}])
    with pytest.raises(
        ValueError,
        match=r"dup\.jsonl:4: .*\bduplicate\b.*\bdata_source 'A', question_id '0', sample_index 1\b.*\bline 2\b",
    ):
        S.read_generations(path)


def test_mixed_k_names_the_odd_question(tmp_path):
    # k=2 for the first question, k=3 for the two others: the first is the odd one (line 1)
    lines = numbered(
        [rec("A", 0, "1", True, -0.1)] * 2 + [rec("A", 1, "1", True, -0.1)] * 3 + [rec("B", 0, "1", True, -0.1)] * 3
    )
    path = write(tmp_path / "mixed.jsonl", lines)
    with pytest.raises(
        ValueError,
        match=r"mixed\.jsonl:1: data_source 'A', question_id '0'.*\b2 response\(s\).*\b3\b"
        r".*\b3 for 2 question\(s\), 2 for 1 question\(s\)",
    ):
        S.read_generations(path)
    # the same across data sources: gsm8k at k=2 appended to math500 at k=4
    lines = numbered(
        [rec("math500", 0, "1", True, -0.1)] * 4
        + [rec("math500", 1, "1", True, -0.1)] * 4
        + [rec("gsm8k", 0, "1", True, -0.1)] * 2
    )
    with pytest.raises(ValueError, match=r"mixed\.jsonl:9: data_source 'gsm8k', question_id '0'.*\b2 response"):
        S.read_generations(write(path, lines))


def test_nothing_written_on_a_bad_file(tmp_path):
    good = write(tmp_path / "good.jsonl", [GOOD])
    bad = write(tmp_path / "bad.jsonl", [GOOD, {**GOOD, "question_id": 1, "correct": "true"}])
    with pytest.raises(ValueError, match="bad.jsonl:2: correct is"):
        S.score_runs({"good": good, "bad": bad}, tmp_path / "out", plots=False)
    assert not (tmp_path / "out").exists()
    (tmp_path / "file").write_text("")
    with pytest.raises(ValueError, match="file is a file, not a folder"):
        S.score_runs({"good": good}, tmp_path / "file", plots=False)


def test_cli_out_that_cannot_be_created(tmp_path, capsys):
    (tmp_path / "file").write_text("")
    good = write(tmp_path / "good.jsonl", [GOOD])
    out = tmp_path / "file" / "report"
    assert main(["score", str(good), "--out", str(out), "--no-plots"]) == 2
    message = f"--out {out} lies under {out.parent}, which is a file"
    assert capsys.readouterr().err == f"capo-verl eval score: error: {message}\n"


def test_cli_input_error_is_one_line_with_exit_code_2(tmp_path):
    """As a user runs it: a string "false" in `correct` stops the command with the file and line, no traceback."""
    path = write(tmp_path / "g.jsonl", [GOOD, {**GOOD, "question_id": 1, "correct": "false"}])
    proc = subprocess.run(
        [sys.executable, "-m", "capo_verl.cli", "eval", "score", f"run={path}", "--out", str(tmp_path / "out")],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.splitlines() == [
        f'capo-verl eval score: error: {path}:2: correct is "false" (str); expected a '
        "JSON boolean, true or false (strings and 0/1 are not accepted)"
    ]
    assert proc.stdout == "" and not (tmp_path / "out").exists()


# ------------------------------------------------------------------------------------------- real run


def _by_question(lines, source=None):
    groups = {}
    for r in lines:
        if source is None or r["data_source"] == source:
            groups.setdefault((r["data_source"], str(r["question_id"])), []).append(r)
    return groups


def test_end_to_end_on_committed_real_generations(tmp_path):
    """SmolLM2-135M-Instruct on GSM8K and MATH-500 (k=8, CPU), scored through the CLI next to an
    anti-calibrated copy of itself (lpm reflected to min(lpm) - lpm: the ranking reversed, still <= 0), then
    checked against straightforward recomputations."""
    lines = read(REAL)
    assert len(lines) >= 100 and {r["data_source"] for r in lines} == {"gsm8k", "math500"}
    lowest = min(r["lpm"] for r in lines)
    flipped = write(tmp_path / "flipped.jsonl", [{**r, "lpm": lowest - r["lpm"]} for r in lines])
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
        assert list(m[key]["pass_at_k"]) == ["1", "2", "4", "8"]
        solved = np.mean([any(r["correct"] for r in g) for g in groups.values()])
        assert m[key]["pass_at_k"]["8"] == pytest.approx(solved, abs=1e-15)  # k = n: a question solved at all
        assert m[key]["pass_at_k"]["1"] == pytest.approx(acc, abs=1e-12)
        aucs = [
            roc_auc_score([r["correct"] for r in g], [r["lpm"] for r in g])
            for g in groups.values()
            if 0 < sum(r["correct"] for r in g) < len(g)
        ]
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

    # report.md: one table per data source and all, the runs as columns, showing the values of metrics.json
    blocks = dict(block.split("\n", 1) for block in (out / "report.md").read_text().split("\n## ")[1:])
    sections = {
        title: {
            cells[0]: cells[1:]
            for line in body.splitlines()
            if line.startswith("| ")
            for cells in [[c.strip() for c in line.strip().strip("|").split("|")]]
        }
        for title, body in blocks.items()
    }

    def shown(x, pct=True):  # how the report prints a value of metrics.json (null: undefined)
        return "–" if x is None else f"{100 * x:.1f}" if pct else f"{x:.3f}"

    assert {"gsm8k", "math500", "all"} <= set(sections)
    for key in ("gsm8k", "math500", "all"):
        table = sections[key]
        assert table["metric"] == ["smollm2", "flipped"]
        assert table["AUC-mean"] == [shown(r[key]["auc_mean"], pct=False) for r in (m, f)]
        assert table["mean@k accuracy (%)"] == [shown(r[key]["mean_acc"]) for r in (m, f)]
        assert table["pass@1 (%)"] == table["mean@k accuracy (%)"]
        assert table["pass@8 (%)"] == [shown(r[key]["pass_at_k"]["8"]) for r in (m, f)]
        assert table["ITS accuracy, perplexity consistency (%)"] == [
            shown(r[key]["its_accuracy"]["ppl_consistency"]) for r in (m, f)
        ]
        assert table["precision @ coverage 0.1 (%)"] == [
            shown(r[key]["precision_coverage"]["precision"][0]) for r in (m, f)
        ]
    assert sections["math500"]["AUC-mean"] == ["–", "–"]  # no question with both outcomes there
    assert sections["Runs"]["smollm2"][0] == f"`{REAL}`"  # the file each column comes from
    assert blocks["Plots"].split() == [
        "![precision_coverage](precision_coverage.png)",
        "![accuracy_vs_auc](accuracy_vs_auc.png)",
    ]

    import matplotlib.image as mpimg

    for name in ("precision_coverage.png", "accuracy_vs_auc.png"):
        img = mpimg.imread(out / name)
        assert img.ndim == 3 and img.shape[0] > 300 and img.shape[1] > 400
        assert img[..., :3].std() > 0.05  # something is drawn


# ------------------------------------------------------------------------------------------- damaged inputs


def _run_cli(args, cwd):
    """``capo-verl eval score`` as a user runs it, with a deadline (a read that blocks fails the test)."""
    return subprocess.run(
        [sys.executable, "-m", "capo_verl.cli", "eval", "score", "--no-plots", *args],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=cwd,
    )


def _files(folder):
    return {p.name: (p.read_bytes() if p.is_file() else None) for p in sorted(Path(folder).iterdir())}


@pytest.mark.parametrize("suffix", [".gz", ".xz"])
@pytest.mark.parametrize("damage", ["cut short", "corrupt body", "bad check"])
def test_a_damaged_compressed_generation_file_is_refused_naming_it(tmp_path, capsys, damage, suffix):
    """C6-12, C6-13: a .jsonl.gz or .jsonl.xz cut short (EOFError), with a corrupt body (zlib.error,
    lzma.LZMAError) or a wrong check (gzip.BadGzipFile, lzma.LZMAError) is one refusal line naming the file, exit 2,
    nothing written."""
    import gzip
    import lzma

    text = "".join(json.dumps({**GOOD, "question_id": q}) + "\n" for q in range(200)).encode()
    whole = gzip.compress(text, mtime=0) if suffix == ".gz" else lzma.compress(text)
    if damage == "cut short":
        data = whole[: len(whole) // 2]
    elif damage == "corrupt body":
        data = whole[:12] + b"\xff" * 24 + whole[36:]
    elif suffix == ".gz":  # the CRC32 of the trailer
        data = whole[:-8] + bytes(b ^ 0xFF for b in whole[-8:-4]) + whole[-4:]
    else:  # the CRC32 of the index, just before the stream footer (12 bytes)
        data = whole[:-16] + bytes(b ^ 0xFF for b in whole[-16:-12]) + whole[-12:]
    path = tmp_path / f"cut.jsonl{suffix}"
    path.write_bytes(data)
    before = _files(tmp_path)
    assert main(["score", "--no-plots", str(path), "--out", str(tmp_path / "r")]) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and len(err.splitlines()) == 1, err
    assert err.startswith("capo-verl eval score: error: ") and str(path) in err, err
    assert _files(tmp_path) == before
    from capo_verl import inputs, stored

    with pytest.raises(inputs.NotADataFile, match=f"cut.jsonl{suffix}"):  # every reader of stored files
        stored.read_bytes(path)


@pytest.mark.parametrize("suffix", [".gz", ".xz"])
def test_a_whole_compressed_generation_file_still_scores(tmp_path, suffix):
    import gzip
    import lzma

    path = tmp_path / f"g.jsonl{suffix}"
    pack = gzip.compress if suffix == ".gz" else lzma.compress
    path.write_bytes(pack((json.dumps(GOOD) + "\n").encode()))
    assert main(["score", "--no-plots", str(path), "--out", str(tmp_path / "r")]) == 0


@pytest.mark.parametrize(
    "meta, named",
    [
        ("[1, 2]", "list"),  # C6-14
        ('{"wall_s": "12"}', "wall_s"),  # C6-15
        ('{"k": "8"}', "k"),
        ('{"model": ["a"]}', "model"),
        ('{"seed": 1.5}', "seed"),
        ('{"temperature": true}', "temperature"),
        ('{"wall_s": NaN}', "wall_s"),
        ('{"wall_s": 1', "meta.json"),
        ("fifo", "meta.json"),  # C6-16: refused, not waited on
        ("folder", "meta.json"),
    ],
)
def test_a_bad_meta_file_is_refused_naming_it_and_the_field(tmp_path, meta, named):
    gen = write(tmp_path / "g.jsonl", [GOOD])
    mp = tmp_path / "g.jsonl.meta.json"
    if meta == "fifo":
        import os

        os.mkfifo(mp)
    elif meta == "folder":
        mp.mkdir()
    else:
        mp.write_text(meta)
    proc = _run_cli([str(gen), "--out", "r"], tmp_path)
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr and len(proc.stderr.splitlines()) == 1, proc.stderr
    assert "g.jsonl.meta.json" in proc.stderr and named in proc.stderr, proc.stderr
    assert "remove" in proc.stderr  # the fix
    assert not (tmp_path / "r").exists()


def test_a_meta_file_with_the_fields_of_eval_generate_or_nulls_is_shown(tmp_path):
    gen = write(tmp_path / "g.jsonl", [GOOD])
    meta = {
        "model": "smollm2",
        "backend": "vllm",
        "dtype": "bfloat16",
        "k": 1,
        "temperature": 1,
        "top_p": 1.0,
        "max_new_tokens": 64,
        "seed": None,
        "wall_s": 12.4,
        "questions": 1,
        "something_else": ["kept", "unread"],
    }
    (tmp_path / "g.jsonl.meta.json").write_text(json.dumps(meta))
    S.score_runs({"g": gen}, tmp_path / "r", plots=False)
    row = next(line for line in (tmp_path / "r" / "report.md").read_text().splitlines() if line.startswith("| g |"))
    assert "smollm2" in row and "vllm" in row and "| 64 |" in row and "12 s" in row and "None" not in row
