"""benchmarks/unit_facts.py on pilot 2's committed units, checked against the units' files read by hand and against
the facts its result page states (grad norm clipped in 24, 22 and 21 of CAPO's 30 steps, GRPO 9-16)."""

from __future__ import annotations

import itertools
import json
import shutil
from pathlib import Path

import pytest

from capo_verl.stored import read_text

REPO = Path(__file__).resolve().parents[1]
PILOT = REPO / "benchmarks" / "results" / "compare_pilot2_cpu" / "pilot"


@pytest.fixture(scope="module")
def uf(load_benchmark):
    return load_benchmark("unit_facts")


def _steps(run: Path) -> dict[int, dict]:
    steps: dict[int, dict] = {}
    for line in read_text(run / "metrics.jsonl").splitlines():
        if line.strip():
            r = json.loads(line)
            steps.setdefault(r["step"], {}).update(r["data"])
    return steps


def test_facts_of_pilot2_by_hand(uf):
    rows = uf.unit_facts(PILOT, ["grpo", "capo"])
    assert [(r["seed"], r["method"]) for r in rows] == [(k, m) for k in (0, 1, 2) for m in ("grpo", "capo")]
    for r in rows:
        run = PILOT / f"seed{r['seed']}" / r["method"]
        done = json.loads((run / "done.json").read_text())
        assert r["trainer_min"] == pytest.approx(done["wall_s"] / 60)
        clip = done["settings"]["composed"]["actor_rollout_ref"]["actor"]["optim"]["clip_grad"]
        steps = _steps(run)
        norms = [d["actor/grad_norm"] for _, d in sorted(steps.items()) if "actor/grad_norm" in d]
        assert (r["clipped"], r["steps"]) == (sum(n > clip for n in norms), 30)
        passes = json.loads((run.parent / "summary.json").read_text())["methods"][r["method"]]["passes"]
        assert (r["mixed_first"], r["mixed_last"]) == (passes[0]["n_mixed"], passes[-1]["n_mixed"])
        for name, key in (("reward", "critic/score/mean"), ("tokens", "response_length/mean")):
            ys = [d[key] for _, d in sorted(steps.items()) if key in d]
            assert len(ys) == 30
            assert r[name] == pytest.approx((sum(ys[:5]) / 5, sum(ys[25:]) / 5))
        if r["method"] == "capo":
            for key in ("capo/mask_frac_incorrect", "capo/mask_frac_correct"):
                late = [d[key] for s, d in steps.items() if s > 20 and d.get(key) is not None]
                early = [d[key] for s, d in steps.items() if 1 <= s <= 2 and d.get(key) is not None]
                assert r[f"{key} late"] == (min(late), max(late))
                assert r[f"{key} early"] == (min(early), max(early))
        else:
            assert not any(k.startswith("capo/mask") for k in r)
    assert [r["clipped"] for r in rows if r["method"] == "capo"] == [24, 22, 21]
    assert {r["clipped"] for r in rows if r["method"] == "grpo"} <= set(range(9, 17))

    table = uf.markdown(rows)
    assert "| 0 | capo | 32.8 | 105 / 135 | 0.10 / 0.59 | 23.5 / 10.7 | 24 of 30 |" in table
    assert (
        "| all | capo | 32.8-36.9 | 104-108 / 126-135 | 0.05-0.10 / 0.44-0.59 | 23.5-32.4 / 10.7-12.0 | 21-24 |"
        in table
    )


def test_only_seeds_where_every_method_finished(uf, tmp_path):
    for k in (0, 1):
        shutil.copytree(PILOT / f"seed{k}", tmp_path / f"seed{k}")
    (tmp_path / "seed1" / "capo" / "done.json").unlink()
    assert uf.finished_seeds(tmp_path, ["grpo", "capo"]) == [0]
    assert uf.finished_seeds(tmp_path, ["grpo"]) == [0, 1]
    with pytest.raises(
        FileNotFoundError,
        match=r"\bseed<k>/.*\bgrpo, cde\b.*\bdone\.json\b.*\bcapo-verl compare --seeds\b.*--methods\b",
    ):
        uf.unit_facts(tmp_path, ["grpo", "cde"])


def test_a_seed_without_its_summary_names_the_command_that_writes_it(uf, tmp_path):
    shutil.copytree(PILOT / "seed0", tmp_path / "seed0")
    (tmp_path / "seed0" / "summary.json").unlink()
    with pytest.raises(
        FileNotFoundError,
        match=r"\bseed0/summary\.json\b.*\bcapo-verl compare --plot-only --seeds 0 --methods grpo capo\b",
    ):
        uf.unit_facts(tmp_path, ["grpo", "capo"])


def test_a_unit_that_logged_no_response_length_names_what_logs_it(uf, tmp_path):
    shutil.copytree(PILOT / "seed0", tmp_path / "seed0")
    run = tmp_path / "seed0" / "grpo"
    lines = []
    for line in read_text(run / "metrics.jsonl").splitlines():
        if line.strip():
            r = json.loads(line)
            r["data"].pop("response_length/mean", None)
            lines.append(json.dumps(r))
    (run / "metrics.jsonl.xz").unlink()
    (run / "metrics.jsonl").write_text("\n".join(lines) + "\n")
    with pytest.raises(
        ValueError, match=r"seed0/grpo: metrics\.jsonl logged no response_length/mean; .*capo-verl compare"
    ):
        uf.unit_facts(tmp_path, ["grpo", "capo"])


def _bounds_by_enumeration(n_correct: int, n_mixed: int, n: int, groups: int) -> tuple[float, float]:
    """Every split of the batch into groups (correct count per group) with these counts, read directly."""
    shares = [
        sum(n - c for c in split if 0 < c < n) / (n * groups - n_correct)
        for split in itertools.combinations_with_replacement(range(n + 1), groups)
        if sum(split) == n_correct and sum(0 < c < n for c in split) == n_mixed
    ]
    return min(shares), max(shares)


def test_nonzero_incorrect_bounds_by_hand(uf):
    # 2 groups of 4, 3 correct, 1 mixed group: splits (3 | 0 correct) only -> 1 of the 5 incorrect is in the mixed
    # group; 4 correct, 1 mixed: (4 | 0) is not mixed, so (x | y) with one of them 0 or 4 and the other mixed: none
    assert uf.nonzero_incorrect_bounds(3, 1, 4, 2) == (0.2, 0.2)
    with pytest.raises(ValueError, match=r"\b4 correct responses and 1 mixed groups\b.*train_batch_size"):
        uf.nonzero_incorrect_bounds(4, 1, 4, 2)
    # 3 groups of 4, 4 correct, 1 mixed: (4 | 0 | 0) impossible (not mixed); all 4 correct in the mixed group is not
    # mixed either -> no split; 5 correct, 1 mixed: (4 | 1 | 0): 3 of 7 incorrect in the mixed group
    with pytest.raises(ValueError):
        uf.nonzero_incorrect_bounds(4, 1, 4, 3)
    assert uf.nonzero_incorrect_bounds(5, 1, 4, 3) == (3 / 7, 3 / 7)
    # 8 correct in 3 groups of 4, 2 mixed: (4 | 3 | 1) or (4 | 2 | 2): 4 of 4 incorrect in mixed groups either way;
    # 6 correct, 2 mixed: (4 | 1 | 1) -> 6 of 6, (3 | 3 | 0) -> 2 of 6, (3 | 2 | 1) impossible (3 mixed)
    assert uf.nonzero_incorrect_bounds(8, 2, 4, 3) == (1.0, 1.0)
    assert uf.nonzero_incorrect_bounds(6, 2, 4, 3) == (2 / 6, 1.0)
    # the mask drops a share of the incorrect responses, wherever it lies
    assert uf.nonzero_incorrect_bounds(6, 2, 4, 3, 0.5) == (0.0, 0.5)
    assert uf.nonzero_incorrect_bounds(6, 2, 4, 3, 0.25) == pytest.approx((2 / 6 - 0.25, 0.75))
    assert uf.nonzero_incorrect_bounds(8, 0, 4, 2) is None  # all correct
    for n_correct, n_mixed in [(c, m) for c in range(17) for m in range(5)]:
        try:
            bounds = uf.nonzero_incorrect_bounds(n_correct, n_mixed, 4, 4)
        except ValueError:
            assert not any(
                sum(s) == n_correct and sum(0 < c < 4 for c in s) == n_mixed
                for s in itertools.combinations_with_replacement(range(5), 4)
            )
            continue
        if bounds is not None:
            assert bounds == pytest.approx(_bounds_by_enumeration(n_correct, n_mixed, 4, 4))


def test_masked_bounds_by_enumeration(uf):
    """With K of the I incorrect responses masked, anywhere: every split of the batch and every placement of the K
    (k of them in the mixed groups) leaves (incorrect in mixed groups) - k with a nonzero advantage."""
    n, groups = 3, 3
    for split_counts in {
        (sum(s), sum(0 < c < n for c in s))
        for s in itertools.combinations_with_replacement(range(n + 1), groups)
        if sum(s) < n * groups
    }:
        n_correct, n_mixed = split_counts
        n_incorrect = n * groups - n_correct
        for k_masked in range(n_incorrect + 1):
            shares = [
                (in_mixed - k) / n_incorrect
                for s in itertools.combinations_with_replacement(range(n + 1), groups)
                if (sum(s), sum(0 < c < n for c in s)) == split_counts
                for in_mixed in [sum(n - c for c in s if 0 < c < n)]
                for k in range(max(0, k_masked - (n_incorrect - in_mixed)), min(k_masked, in_mixed) + 1)
            ]
            assert uf.nonzero_incorrect_bounds(n_correct, n_mixed, n, groups, k_masked / n_incorrect) == pytest.approx(
                (min(shares), max(shares))
            ), (split_counts, k_masked)


def test_nonzero_incorrect_of_pilot2_by_enumeration(uf):
    rows = uf.unit_facts(PILOT, ["grpo", "capo"])
    for r in rows:
        run = PILOT / f"seed{r['seed']}" / r["method"]
        composed = json.loads((run / "done.json").read_text())["settings"]["composed"]
        n, groups = composed["actor_rollout_ref"]["rollout"]["n"], composed["data"]["train_batch_size"]
        per_step = {}
        for s, d in _steps(run).items():
            if "critic/score/mean" not in d:
                continue
            n_correct, n_mixed = round(d["critic/score/mean"] * n * groups), round(d["capo/mixed_group_frac"] * groups)
            if n_correct < n * groups:
                lo, hi = _bounds_by_enumeration(n_correct, n_mixed, n, groups)
                f = d.get("capo/mask_frac_incorrect")
                per_step[s] = (lo, hi) if f is None else (max(0.0, lo - f), min(hi, 1.0 - f))
        assert len(per_step) >= 25
        late = [s for s in per_step if s > 20]
        for when, chosen in (("all", list(per_step)), ("late", late)):
            expected = tuple(sum(per_step[s][i] for s in chosen) / len(chosen) for i in (0, 1))
            assert r[f"nonzero adv. incorrect {when}"] == pytest.approx(expected)
    # the mask leaves fewer incorrect responses a nonzero advantage late in training than GRPO's groups do
    late_hi = {m: max(r["nonzero adv. incorrect late"][1] for r in rows if r["method"] == m) for m in ("grpo", "capo")}
    late_lo = {m: min(r["nonzero adv. incorrect late"][0] for r in rows if r["method"] == m) for m in ("grpo", "capo")}
    assert late_hi["capo"] < late_lo["grpo"]


def test_main_page_quotes_the_scripts_table(uf):
    """docs/results/main.md's per-unit table is the script's output on the committed units, and its sentence on the
    last 10 steps' bounds reads that table."""
    units = REPO / "benchmarks" / "results" / "compare_main_cpu" / "units"
    rows = uf.unit_facts(units, ["grpo", "capo"])
    page = (REPO / "docs" / "results" / "main.md").read_text()
    assert uf.markdown(rows) in page
    late = {m: [r["nonzero adv. incorrect late"] for r in rows if r["method"] == m] for m in ("grpo", "capo")}
    hi = [f"{b[1]:.2f}" for b in late["capo"]]
    lo = [f"{b[0]:.2f}" for b in late["grpo"]]
    assert f"at most {min(hi)}-{max(hi)} of CAPO's incorrect" in page.replace("\n", " ")
    assert f"at least {min(lo)}-{max(lo)} of GRPO's" in page.replace("\n", " ")
    reward = [f"{min(r['reward'][j] for r in rows):.2f}-{max(r['reward'][j] for r in rows):.2f}" for j in (0, 1)]
    tokens = [f"{min(r['tokens'][j] for r in rows):.0f}-{max(r['tokens'][j] for r in rows):.0f}" for j in (0, 1)]
    assert (
        f"the reward rose from {reward[0]} to {reward[1]} while responses shortened from {tokens[0]} tokens to "
        f"{tokens[1]}" in page.replace("\n", " ")
    )
