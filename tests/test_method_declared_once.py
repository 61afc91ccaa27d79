"""A method is declared once: what the rest of capo-verl knows of an estimator is in its registration
(capo_verl/estimators/registry.py, ``EstimatorSpec``), and no module outside capo_verl/estimators/ names one.

1. The source: no string literal of a module under capo_verl/ (docstrings aside) outside the estimators and the study
   tools' method tables equals a declared estimator's name, so nothing compares against or lists one.
2. A toy estimator declared in this process with the spec's fields is picked up by the start checks (its own
   ``check_config``, its ``group_reason``), the start report (``trains_without_kl``, the mask-threshold warning of a
   section parsed by ``CapoConfig``), the run summary (``summary_metrics``) and CoDaPO's resampling (``resamples``),
   calling those functions directly (no trainer).
"""

from __future__ import annotations

import ast
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from capo_verl.compat import codapo_sampling, methods, run_summary, start_report
from capo_verl.estimators.capo import CapoConfig
from capo_verl.estimators.common import read_config_section
from capo_verl.estimators.registry import ESTIMATORS, register_estimator

PACKAGE = Path(__file__).resolve().parents[1] / "capo_verl"

#: modules that may name estimators: the estimators themselves, and the study tools' method tables and docs
ALLOWED = ("estimators/", "compare/", "demo.py", "evaluation/score.py", "compat/simko.py")

#: (module, literal) -> why that literal is not an estimator's name
NOT_A_METHOD = {("compat/preflight.py", "capo"): "the project's folder under ~/checkpoints in a suggested fix"}


def named_estimators(source: str, names) -> list[tuple[int, str]]:
    """``(line, literal)`` for each string literal of ``source``, docstrings aside, that equals one of ``names``."""
    tree = ast.parse(source)
    docstrings = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                docstrings.add(id(first.value))
    return sorted(
        (node.lineno, node.value)
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant) and node.value in names and id(node) not in docstrings
    )


def test_no_module_outside_the_estimators_names_an_estimator():
    names = set(ESTIMATORS)
    assert {"capo", "grpo_mask", "codapo", "cde"} <= names
    found = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(PACKAGE).as_posix()
        if rel.startswith(ALLOWED):
            continue
        hits = [(line, v) for line, v in named_estimators(path.read_text(), names) if (rel, v) not in NOT_A_METHOD]
        if hits:
            found[rel] = hits
    assert found == {}, f"branch on the estimator's declaration (EstimatorSpec), not its name: {found}"


def test_the_scan_sees_a_name_branch():
    """The control: the branches this replaced are found, in a comparison, a tuple and an f-string."""
    source = '''
"""capo: a docstring may name it"""
def f(name):
    """grpo_mask too"""
    if name == "capo":
        return f"{name if name else 'cde'}"
    return name in ("grpo_mask", "grpo")
'''
    assert named_estimators(source, set(ESTIMATORS)) == [(5, "capo"), (6, "cde"), (7, "grpo_mask")]


@dataclass(frozen=True)
class ToyConfig:
    limit: int = 3

    @classmethod
    def from_algorithm_config(cls, config):
        return read_config_section(cls, config, TOY)


TOY = "toy_declared_once"
TOY_MASKED = "toy_masked_once"
TOY_REASON = "the toy splits each group in halves, and one response makes no halves"


def _check_toy(config, toy: ToyConfig) -> None:
    if toy.limit > 5:
        raise ValueError(f"algorithm.{TOY}.limit={toy.limit}: the toy allows at most 5; set algorithm.{TOY}.limit=5")


def _forget(name: str) -> None:
    ESTIMATORS.pop(name, None)
    core_algos = sys.modules.get("verl.trainer.ppo.core_algos")  # registered there too when capo-verl's glue runs
    if core_algos is not None:
        core_algos.ADV_ESTIMATOR_REGISTRY.pop(name, None)


@pytest.fixture
def toy():
    """Two toys, declared as a user's module would: one with every new field, one reading CAPO's section."""

    @register_estimator(
        TOY,
        batch_keys=(),
        section=TOY,
        config_class=ToyConfig,
        check_config=_check_toy,
        group_reason=TOY_REASON,
        trains_without_kl=True,
        summary_metrics=(("share of halves", "toy/halves"), ("largest half", "toy/largest")),
        resamples=True,
    )
    def compute_toy(token_level_rewards, response_mask, index=None, config=None, **kwargs):
        return token_level_rewards, token_level_rewards

    @register_estimator(TOY_MASKED, batch_keys=(), section="capo", config_class=CapoConfig)
    def compute_toy_masked(token_level_rewards, response_mask, index=None, config=None, **kwargs):
        return token_level_rewards, token_level_rewards

    yield ESTIMATORS[TOY]
    _forget(TOY)
    _forget(TOY_MASKED)


def test_the_group_size_refusal_gives_the_declared_reason(toy):
    one = OmegaConf.create({"actor_rollout_ref": {"rollout": {"n": 1}}})
    with pytest.raises(ValueError) as declared:
        methods.check_group_size(one, TOY)
    assert str(declared.value).startswith("actor_rollout_ref.rollout.n=1:") and TOY_REASON in str(declared.value)
    with pytest.raises(ValueError) as generic:  # declared without a reason: the generic one
        methods.check_group_size(one, TOY_MASKED)
    assert str(generic.value).startswith("actor_rollout_ref.rollout.n=1:") and TOY_REASON not in str(generic.value)
    methods.check_group_size(OmegaConf.create({"actor_rollout_ref": {"rollout": {"n": 4}}}), TOY)


def test_the_start_check_runs_the_declared_check_config(toy, monkeypatch):
    monkeypatch.setattr(methods, "check_estimator", lambda config: TOY)  # verl's registry is not needed here
    config = OmegaConf.create({"algorithm": {"adv_estimator": TOY, TOY: {"limit": 9}}})
    with pytest.raises(ValueError) as refused:
        methods.check_method_configs(config)
    assert str(refused.value).startswith(f"algorithm.{TOY}.limit=9:"), refused.value


def test_the_start_report_reads_the_declaration(toy):
    kl_on = {"actor_rollout_ref": {"actor": {"use_kl_loss": True, "kl_loss_type": "low_var_kl", "kl_loss_coef": 0.1}}}
    loss = start_report.kl_lines(OmegaConf.create(kl_on), TOY)[0]
    assert loss.startswith("KL in loss: on") and "actor_rollout_ref.actor.use_kl_loss=false" in loss
    loss = start_report.kl_lines(OmegaConf.create(kl_on), TOY_MASKED)[0]  # declared without trains_without_kl
    assert loss.startswith("KL in loss: on") and "use_kl_loss=false" not in loss
    # the threshold warning follows the config class (CapoConfig), not the name
    paper = {"algorithm": {"capo": {"ref_low": 1.05, "ref_high": 2.5, "use_mask": True}}}
    cfg = OmegaConf.create({**paper, "actor_rollout_ref": {"model": {"path": "/models/SmolLM2-135M-Instruct"}}})
    warning = start_report.thresholds_warning(cfg, TOY_MASKED)
    assert warning is not None and "algorithm.capo.ref_low=1.05" in warning
    assert start_report.thresholds_warning(cfg, TOY) is None


def test_the_run_summary_prints_the_declared_metrics(toy, tmp_path, monkeypatch):
    rows = [(1, {"toy/halves": 0.25, "toy/largest": 2.0}), (2, {"toy/halves": 0.75, "toy/largest": 4.0})]
    monkeypatch.setattr(run_summary, "HISTORY", rows)
    trainer = {"total_training_steps": 2, "default_local_dir": str(tmp_path / "ckpt"), "logger": ["console"]}
    for name, declared in ((TOY, True), (TOY_MASKED, False)):
        cfg = OmegaConf.create({"algorithm": {"adv_estimator": name}, "trainer": trainer})
        lines = dict(line.strip().split(": ", 1) for line in run_summary.summary(cfg, 1.0, 2, None).splitlines()[1:])
        if declared:
            assert lines[f"{TOY} share of halves (toy/halves)"].startswith("0.5000 over 2 steps"), lines
            assert lines[f"{TOY} largest half (toy/largest)"].startswith("3.0000 over 2 steps"), lines
        else:
            assert not any("toy/" in key for key in lines), lines


def test_codapo_resampling_takes_an_estimator_declared_to_resample(toy):
    base = {
        "algorithm": {"adv_estimator": TOY, "codapo": {"resample": True}},
        "data": {"train_batch_size": 16, "gen_batch_size": None},
        "trainer": {"use_v1": True, "v1": {"trainer_mode": "sync", "sync": {"parameter_sync_step": 1}}},
    }
    codapo_sampling.check_resample_setup(OmegaConf.create(base))
    base["algorithm"]["adv_estimator"] = TOY_MASKED
    with pytest.raises(ValueError) as refused:
        codapo_sampling.check_resample_setup(OmegaConf.create(base))
    message = str(refused.value)
    assert message.startswith("algorithm.codapo.resample=true") and repr(TOY_MASKED) in message
    assert "algorithm.codapo.resample=false" in message
