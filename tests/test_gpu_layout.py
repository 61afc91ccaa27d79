"""A GPU layout verl would reject, or pad, is refused when the config is checked (a launch script's ``--dry-run``), for
every recipe over 1-16 GPUs a node: the 7B recipes' vLLM replicas of 2 GPUs (``rollout.tensor_model_parallel_size:
2``) on 1 or 3 GPUs, or on 2 nodes of 3; 1,024 responses a step over 6 ranks (verl padded them to 1,536).

The expected table is written by hand from the recipes' sizes (``configs/base.yaml``: 128 prompts x 8 responses a
step, 64 x 8 an update; a replica of 1 GPU at 1.5B, 2 at 7B), not computed by the rule under test."""

from __future__ import annotations

from pathlib import Path

import pytest

from capo_verl.compat.run_checks import layout_problem

pytestmark = [
    pytest.mark.usefixtures("config_env"),
    pytest.mark.filterwarnings("ignore:Disabled critic as algorithm.adv_estimator:UserWarning"),
]

REPO = Path(__file__).resolve().parents[1]
RECIPES = sorted(p.stem for p in (REPO / "configs").glob("*_qwen2.5_math_*.yaml"))
GPUS = (1, 2, 3, 4, 6, 8, 16)
#: ``(nnodes, n_gpus_per_node)`` layouts up to 16 GPUs a node that run, by model size: every other one is refused
RUNS = {
    "1.5b": {(1, 1), (1, 2), (1, 4), (1, 8), (1, 16), (2, 1), (2, 2), (2, 4), (2, 8), (2, 16)},
    "7b": {(1, 2), (1, 4), (1, 8), (1, 16), (2, 1), (2, 2), (2, 4), (2, 8), (2, 16)},
}
LAYOUTS = [(1, g) for g in GPUS] + [(2, 1), (2, 3), (2, 4)]


@pytest.mark.parametrize("recipe", RECIPES)
def test_every_recipe_over_the_layouts(configs, recipe):
    size = recipe.rsplit("_", 1)[1]
    for nnodes, gpus in LAYOUTS:
        overrides = [f"trainer.nnodes={nnodes}", f"trainer.n_gpus_per_node={gpus}"]
        if (nnodes, gpus) in RUNS[size]:
            cfg = configs.compose(recipe, overrides, resolve=False)
            assert cfg.trainer.n_gpus_per_node == gpus
            continue
        with pytest.raises(ValueError) as info:
            configs.compose(recipe, overrides, resolve=False)
        message = str(info.value)
        assert message.startswith(f"trainer.n_gpus_per_node={gpus} (trainer.nnodes={nnodes})"), (recipe, message)
        fixes = [int(part.split("=")[1]) for part in message.rsplit("; set ", 1)[1].split() if "=" in part]
        assert fixes and all((nnodes, g) in RUNS[size] or g > 16 for g in fixes), (recipe, nnodes, gpus, message)


def test_the_nearest_layouts_are_the_fix(configs):
    message = None
    with pytest.raises(ValueError) as info:
        configs.compose("capo_qwen2.5_math_1.5b", ["trainer.n_gpus_per_node=6"], resolve=False)
    message = str(info.value)
    assert "1024" in message and "6 data-parallel trainer ranks" in message, message
    assert message.rsplit("; ", 1)[1].startswith("set trainer.n_gpus_per_node=4 or trainer.n_gpus_per_node=8"), message
    cfg = configs.compose("capo_qwen2.5_math_1.5b", ["trainer.n_gpus_per_node=4"], resolve=False)
    assert cfg.trainer.n_gpus_per_node == 4


def test_layout_problem_by_hand():
    assert layout_problem(1, 8, 1, 1024, 512) is None
    assert "tile" in layout_problem(1, 3, 2, 1024, 512)
    assert "fill" in layout_problem(1, 1, 2, 1024, 512)  # a replica of 2 GPUs on one node of 1
    assert layout_problem(2, 1, 2, 1024, 512) is None  # ... spans two nodes of 1
    assert "1024" in layout_problem(1, 6, 2, 1024, 512)
    assert "update" in layout_problem(1, 16, 1, 1024 + 16 * 3, 512 + 8)  # the step splits, the update does not
