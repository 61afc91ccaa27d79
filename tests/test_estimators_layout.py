"""The estimator package: one module per method, shared pieces in one module, verl only in the registration; the
shared GRPO statistics equal verl's own; the old import path still works."""

from __future__ import annotations

import ast
from pathlib import Path

import numpy as np
import pytest
import torch

import capo_verl.estimators as estimators
from capo_verl.estimators.common import group_ids, grpo_group_advantages
from verl.trainer.ppo import core_algos

PKG = Path(estimators.__file__).parent
METHOD_MODULES = {"capo": "capo.py", "grpo_mask": "grpo_mask.py", "codapo": "codapo.py", "cde": "cde.py"}
MARKER = "# --- registration with verl"


def _imports(tree) -> list[tuple[int, str]]:
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out += [(node.lineno, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            out.append((node.lineno, node.module or ""))
    return out


def _touches_verl(module: str) -> bool:
    return module == "verl" or module.startswith("verl.") or module.startswith("capo_verl.compat")


def test_one_module_per_method_and_each_name_registered():
    for name, filename in METHOD_MODULES.items():
        assert (PKG / filename).is_file(), filename
        assert core_algos.get_adv_estimator_fn(name) is not None, name
        assert getattr(core_algos.ADV_ESTIMATOR_REGISTRY[name], "batch_keys", None), name  # batch-aware


def test_shared_module_imports_nothing_from_verl():
    tree = ast.parse((PKG / "common.py").read_text())
    assert not [m for _, m in _imports(tree) if _touches_verl(m)]


@pytest.mark.parametrize("filename", ["capo.py", "codapo.py", "cde.py"])
def test_math_above_the_registration_section_imports_nothing_from_verl(filename):
    """verl and capo_verl.compat appear only below the module's registration marker."""
    text = (PKG / filename).read_text()
    assert MARKER in text, f"{filename} has no '{MARKER}' section"
    marker_line = text[: text.index(MARKER)].count("\n") + 1
    early = [(line, m) for line, m in _imports(ast.parse(text)) if _touches_verl(m) and line < marker_line]
    assert not early, early


def test_old_import_path_still_works():
    import capo_verl.estimator as old

    assert old.compute_capo_outcome_advantage is estimators.compute_capo_outcome_advantage
    assert old.CapoConfig is estimators.CapoConfig and old.sequence_mean is estimators.sequence_mean


def _random_groups(rng, kind):
    sizes = rng.integers(1, 10, rng.integers(1, 12))  # ragged, with lone responses
    uids = np.concatenate([[f"u{g}"] * s for g, s in enumerate(sizes)])
    uids = np.array(uids[rng.permutation(len(uids))], dtype=object)  # interleaved
    bs = len(uids)
    if kind == "binary":
        scores = rng.integers(0, 2, bs).astype(np.float32)
    elif kind == "pm1_shaped":
        scores = np.where(rng.random(bs) < 0.5, 1.0, -1.0).astype(np.float32) + 0.3 * rng.random(bs).astype(np.float32)
    else:
        scores = rng.normal(size=bs).astype(np.float32)
    return uids, torch.from_numpy(scores)


@pytest.mark.parametrize("norm_by_std", [True, False])
@pytest.mark.parametrize("kind", ["binary", "pm1_shaped", "normal"])
def test_grpo_group_advantages_is_bitwise_verls_grpo(kind, norm_by_std):
    rng = np.random.default_rng(hash((kind, norm_by_std)) % 2**32)
    for _ in range(30):
        uids, scores = _random_groups(rng, kind)
        bs, T = len(uids), 4
        rewards = torch.zeros(bs, T)
        rewards[:, -1] = scores
        expected, _ = core_algos.compute_grpo_outcome_advantage(
            rewards, torch.ones(bs, T, dtype=torch.int64), uids, norm_adv_by_std_in_grpo=norm_by_std
        )
        gid, n_groups = group_ids(uids, bs)
        got = grpo_group_advantages(rewards.sum(-1), torch.from_numpy(gid), n_groups, norm_by_std)
        assert got.dtype == torch.float32
        assert torch.equal(got, expected[:, 0])


def test_grpo_group_advantages_by_hand():
    # group a: R = (1, 0, 0) -> mean 1/3, std (unbiased) sqrt(1/3); group b: lone response R = 1 -> mean 0, std 1
    scores = torch.tensor([1.0, 0.0, 1.0, 0.0])
    gid = torch.tensor([0, 0, 1, 0])
    std_a = (1 / 3) ** 0.5
    expected = [(1 - 1 / 3) / (std_a + 1e-6), -1 / 3 / (std_a + 1e-6), 1 / (1 + 1e-6), -1 / 3 / (std_a + 1e-6)]
    torch.testing.assert_close(grpo_group_advantages(scores, gid, 2), torch.tensor(expected), rtol=1e-6, atol=0)
    torch.testing.assert_close(
        grpo_group_advantages(scores, gid, 2, norm_by_std=False), torch.tensor([2 / 3, -1 / 3, 1.0, -1 / 3])
    )
