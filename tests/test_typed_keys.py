"""A key that is typed is read, or refused.

Every recipe x ablation of ``configs/``: an ablation the recipe's estimator does not read is refused at the start
(``+ablation=tau0.4`` on the GRPO recipe trained plain GRPO under the name ``grpo_tau0.4``), and every pair that runs
has a checkpoint folder of its own (SimKO's ``grpo_mask`` ablation shared CAPO's, so a resume picked up the other
method's checkpoint). ``capo-verl compare`` hands a method's own keys only to the methods that read them (the
refusal of a typed key nothing reads is in tests/test_start_refusals.py)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

pytestmark = [
    pytest.mark.usefixtures("config_env"),
    pytest.mark.filterwarnings("ignore:Disabled critic as algorithm.adv_estimator:UserWarning"),
]

REPO = Path(__file__).resolve().parents[1]
RECIPES = sorted(p.stem for p in (REPO / "configs").glob("*_qwen2.5_math_*.yaml"))
ABLATIONS = sorted(p.stem for p in (REPO / "configs" / "ablation").glob("*.yaml"))
#: the recipes whose estimator reads ``algorithm.capo`` (the section the tau and mask ablations change)
READS_CAPO = {r for r in RECIPES if r.startswith("capo_")}
#: ablations that change ``algorithm.capo`` (``capo_run.changes: capo``); grpo_mask sets the estimator itself
CHANGES_CAPO = {a for a in ABLATIONS if a not in ("none", "grpo_mask")}
#: CoDaPO's recipes resample by the codapo estimator's weights: grpo_mask there is refused by that check
RESAMPLES = {r for r in RECIPES if r.startswith("codapo_")}


def _refused_because(recipe: str, ablation: str) -> str | None:
    """The key a refusal of the pair names first, or None when the pair runs."""
    if ablation in CHANGES_CAPO and recipe not in READS_CAPO:
        return f"ablation={ablation}:"
    if ablation == "grpo_mask" and recipe in RESAMPLES:
        return "algorithm.codapo.resample=true"
    return None


def _ablation(recipe: str, ablation: str) -> str:
    """``ablation=X`` where the recipe has the group in its defaults (the CAPO recipes), else ``+ablation=X``."""
    has_group = "ablation: none" in (REPO / "configs" / f"{recipe}.yaml").read_text()
    return f"{'' if has_group else '+'}ablation={ablation}"


def test_the_table_has_the_recipes_and_ablations():
    assert len(RECIPES) == 12 and {"capo_qwen2.5_math_1.5b", "simko_qwen2.5_math_7b"} <= set(RECIPES)
    assert {"tau0.4", "no_mask", "grpo_mask", "none"} <= set(ABLATIONS)


def test_each_pair_runs_under_a_folder_of_its_own_or_is_refused(configs):
    folders: dict[str, tuple[str, str]] = {}
    for recipe in RECIPES:
        for ablation in ABLATIONS:
            typed = _ablation(recipe, ablation)
            refused = _refused_because(recipe, ablation)
            if refused:
                with pytest.raises(ValueError) as info:
                    configs.compose(recipe, [typed], resolve=False, use_reference_policy=True)
                message = str(info.value)
                assert message.startswith(refused), (recipe, ablation, message)
                if refused.startswith("ablation="):
                    assert "algorithm.capo" in message and "capo" in message.split("read by", 1)[1], message
                continue
            cfg = configs.compose(recipe, [typed])
            folder = cfg.trainer.default_local_dir
            assert folder not in folders, (recipe, ablation, folders.get(folder), folder)
            folders[folder] = (recipe, ablation)
            method = cfg.capo_run.method
            assert Path(folder).name.startswith(method), (recipe, ablation, folder)
            if ablation != "none":
                assert cfg.capo_run.tag and cfg.capo_run.tag in folder, (recipe, ablation, folder)
    others = len(RECIPES) - len(READS_CAPO)
    assert len(folders) == len(READS_CAPO) * len(ABLATIONS) + others * 2 - len(RESAMPLES)


def test_grpo_mask_on_capo_and_on_simko_keep_apart(configs):
    capo = configs.compose("capo_qwen2.5_math_1.5b", ["ablation=grpo_mask"])
    simko = configs.compose("simko_qwen2.5_math_1.5b", ["+ablation=grpo_mask"])
    assert capo.algorithm.adv_estimator == simko.algorithm.adv_estimator == "grpo_mask"
    assert capo.trainer.experiment_name == "capo_grpo_mask_qwen2.5_math_1.5b"
    assert simko.trainer.experiment_name == "simko_grpo_mask_qwen2.5_math_1.5b"


@pytest.mark.parametrize(
    "overrides, named",
    [
        # Hydra keeps the last of two ``ablation=`` overrides; the script refuses the pair, naming both
        (["ablation=tau0.4", "ablation=no_mask"], ["ablation=tau0.4", "ablation=no_mask", "run_ablations.sh"]),
        # ``ablation=tau0.4 algorithm.capo.tau=0.9`` named the run ``..._tau0.4`` and trained tau 0.9
        (["ablation=tau0.4", "algorithm.capo.tau=0.9"], ["algorithm.capo.tau=0.9", "ablation=tau0.4"]),
    ],
    ids=["two ablations", "a key the ablation sets"],
)
def test_the_launch_script_refuses_overrides_that_contradict_the_ablation(tmp_path, configs, overrides, named):
    """One ``error:`` line naming what contradicts, exit 2, no traceback, nothing trained."""
    proc = subprocess.run(
        ["bash", str(REPO / "scripts" / "run_capo_qwen2.5_math_1.5b.sh"), "--dry-run", *overrides],
        env=configs.script_env(HOME=str(tmp_path)),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2, (proc.stdout[-1500:], proc.stderr[-1500:])
    [line] = [ln for ln in proc.stderr.splitlines() if ln.startswith("error:")]
    assert all(name in line for name in named), line
    assert "Traceback" not in proc.stderr and not (tmp_path / "checkpoints").exists()


def test_each_ablation_stands_for_keys_it_sets():
    """``capo_run.sets`` names keys the ablation's file sets (all of its ``algorithm.<changes>`` keys where it
    declares ``changes``): those are refused when typed beside it."""
    import yaml

    def leaves(node, prefix=""):
        for key, value in node.items():
            yield from leaves(value, f"{prefix}{key}.") if isinstance(value, dict) else [f"{prefix}{key}"]

    for ablation in ABLATIONS:
        data = yaml.safe_load((REPO / "configs" / "ablation" / f"{ablation}.yaml").read_text()) or {}
        run = data.get("capo_run", {})
        sets = set(leaves({"algorithm": data.get("algorithm", {})}))
        assert set(run.get("sets", [])) <= sets and (run.get("sets") or ablation == "none"), (ablation, run)
        if run.get("changes"):
            assert set(run["sets"]) == sets, (ablation, run)


def test_compare_hands_a_methods_keys_only_to_the_methods_that_read_them(tmp_path):
    from capo_verl.compare.running import train_command

    shared = ["algorithm.capo.ref_high=4.0", "algorithm.capo.tau=0.5", "+algorithm.codapo.percentile=0.5"]
    shared += ["data.train_batch_size=4", "+actor_rollout_ref.actor.policy_loss.simko.top_k=3"]
    kept = {
        method: [o for o in shared if o in train_command(method, "c", tmp_path, tmp_path / method, shared)]
        for method in ("grpo", "capo", "capo_no_mask", "grpo_mask", "codapo", "simko")
    }
    assert kept == {
        "grpo": ["data.train_batch_size=4"],
        "capo": ["algorithm.capo.ref_high=4.0", "algorithm.capo.tau=0.5", "data.train_batch_size=4"],
        "capo_no_mask": ["algorithm.capo.tau=0.5", "data.train_batch_size=4"],  # no mask: no thresholds
        "grpo_mask": ["algorithm.capo.ref_high=4.0", "data.train_batch_size=4"],  # no ranking: no tau
        "codapo": ["+algorithm.codapo.percentile=0.5", "data.train_batch_size=4"],
        "simko": ["data.train_batch_size=4", "+actor_rollout_ref.actor.policy_loss.simko.top_k=3"],
    }
