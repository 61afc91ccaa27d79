"""benchmarks/unit_facts.py on pilot 2's committed units, checked against the units' files read by hand and against
the facts its result page states (grad norm clipped in 24, 22 and 21 of CAPO's 30 steps, GRPO 9-16)."""

from __future__ import annotations

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
    assert "| 0 | capo | 32.8 | 105 / 135 | 24 of 30 |" in table
    assert "| all | capo | 32.8-36.9 | 104-108 / 126-135 | 21-24 |" in table


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
