"""val-calib/<data_source>/auc_mean in verl's validation pass (capo_verl/compat/validation.py).

The small parts, in verl's real code as the plugin patches it at ``import verl``: ``AgentLoopWorker._compute_score``
(attaches each response's mean log-prob) and the v1 and legacy trainers' ``_val_metrics_update`` (logs the
metrics next to ``val-core``), with the skip/raise rules. A real validation pass of verl's trainer, whose logged
AUC-mean is checked against its dumped responses, is in tests/test_e2e_capo.py.
"""

from __future__ import annotations

import asyncio
import logging
import math
import re
from types import SimpleNamespace

import numpy as np
import pytest
import verl  # noqa: F401  installs capo_verl.compat (the plugin entry point)

from capo_verl import compat
from capo_verl.compat import validation
from capo_verl.compat.validation import LPM_KEY, validation_calibration_metrics


def _trainer(val_calib: bool | str | None = True, adv_estimator: str = "grpo"):
    """A stand-in trainer with verl's struct config; ``val_calib=None`` leaves the key out (verl's own configs)."""
    from omegaconf import OmegaConf

    trainer_cfg = {} if val_calib is None else {"val_calib": val_calib}
    config = OmegaConf.create({"trainer": trainer_cfg, "algorithm": {"adv_estimator": adv_estimator}})
    OmegaConf.set_struct(config, True)
    return SimpleNamespace(config=config)


def _outputs(n_questions=3, n=4, seed=0):
    """Per-response lists as verl's _validate builds them: 2 sources, n responses per question."""
    rng = np.random.default_rng(seed)
    sources, uids, acc, lpm = [], [], [], []
    for src in ("aime24", "math500"):
        for q in range(n_questions):
            for i in range(n):
                sources.append(src)
                uids.append(f"{src}-{q}")
                acc.append(float(i % 2 == 0) if q < n_questions - 1 else 1.0)  # last question: all correct
                lpm.append(float(rng.normal(-0.5, 0.2)))
    return sources, uids, {"reward": list(acc), "score": list(acc), "acc": acc, "pred": ["1"] * len(acc), LPM_KEY: lpm}


def test_plugin_installed_the_patches():
    from verl.experimental.agent_loop.agent_loop import AgentLoopWorker
    from verl.trainer.ppo.ray_trainer import RayPPOTrainer
    from verl.trainer.ppo.v1.trainer_base import PPOTrainer

    assert compat.patching.INSTALL_ERROR is None
    for fn in (AgentLoopWorker._compute_score, PPOTrainer._val_metrics_update, RayPPOTrainer._val_metrics_update):
        assert fn.__code__.co_filename == validation.__file__


# --- 1. lpm attached by verl's agent-loop worker ----------------------------------------------------------
def test_real_agent_loop_worker_attaches_lpm():
    from verl.experimental.agent_loop.agent_loop import AgentLoopMetrics, AgentLoopOutput, AgentLoopWorker

    worker = object.__new__(AgentLoopWorker)
    worker.reward_loop_worker_handles = None  # reward computed elsewhere: verl's part does nothing

    def output(logprobs, mask, extra=None):
        return AgentLoopOutput(
            prompt_ids=[1, 2],
            response_ids=list(range(len(mask))),
            response_mask=mask,
            response_logprobs=logprobs,
            metrics=AgentLoopMetrics(),
            extra_fields=extra or {},
        )

    # tool tokens (mask 0) do not count; an existing reward_extra_info keeps its keys
    a = output([-0.2, -9.0, -0.4], [1, 0, 1], {"reward_extra_info": {"acc": 1.0}})
    asyncio.run(worker._compute_score([a], kwargs={}))
    assert a.extra_fields["reward_extra_info"] == {"acc": 1.0, LPM_KEY: pytest.approx(-0.3)}
    # multi-output trajectory: the final output is the one verl scores
    first, last = output([-1.0], [1]), output([-0.5, -0.5], [1, 1])
    asyncio.run(worker._compute_score([first, last], kwargs={}))
    assert "reward_extra_info" not in first.extra_fields
    assert last.extra_fields["reward_extra_info"][LPM_KEY] == pytest.approx(-0.5)
    # no rollout log-probs (calculate_log_probs=False): nothing attached
    b = output(None, [1, 1])
    asyncio.run(worker._compute_score([b], kwargs={}))
    assert "reward_extra_info" not in b.extra_fields
    # undefined (no generated token): NaN, so that every response has the same keys
    c = output([-0.1], [0])
    asyncio.run(worker._compute_score([c], kwargs={}))
    assert math.isnan(c.extra_fields["reward_extra_info"][LPM_KEY])


# --- 2. the metrics -------------------------------------------------------------------------------------
def test_metrics_match_sklearn_per_question_auc():
    from sklearn.metrics import roc_auc_score

    sources, uids, infos = _outputs(n_questions=5, n=8, seed=3)
    metrics = validation_calibration_metrics(sources, uids, infos)
    for src in ("aime24", "math500"):
        aucs = []
        for q in range(5):
            idx = [i for i, u in enumerate(uids) if u == f"{src}-{q}"]
            y = [infos["acc"][i] for i in idx]
            if 0 < sum(y) < len(y):
                aucs.append(roc_auc_score(y, [infos[LPM_KEY][i] for i in idx]))
        assert metrics[f"val-calib/{src}/auc_mean"] == pytest.approx(np.mean(aucs))
        assert metrics[f"val-calib/{src}/mixed_group_frac"] == pytest.approx(4 / 5)
        correct = [infos[LPM_KEY][i] for i, (s, a) in enumerate(zip(sources, infos["acc"])) if s == src and a]
        assert metrics[f"val-calib/{src}/lpm_correct_mean"] == pytest.approx(np.mean(correct))


def test_metrics_edge_cases():
    # perfectly calibrated / anti-calibrated questions
    sources = ["a"] * 4 + ["b"] * 4
    uids = ["q1"] * 4 + ["q2"] * 4
    acc = [1.0, 1.0, 0.0, 0.0] * 2
    lpm = [-0.1, -0.2, -1.0, -2.0, -1.0, -2.0, -0.1, -0.2]
    m = validation_calibration_metrics(sources, uids, {"acc": acc, LPM_KEY: lpm, "reward": acc})
    assert m["val-calib/a/auc_mean"] == 1.0 and m["val-calib/b/auc_mean"] == 0.0
    # no mixed question: auc_mean left out (not NaN), the fraction says why
    infos = {"acc": [1.0, 1.0], LPM_KEY: [-1.0, -2.0], "reward": [1, 1]}
    m = validation_calibration_metrics(["a"] * 2, ["q"] * 2, infos)
    assert "val-calib/a/auc_mean" not in m and m["val-calib/a/mixed_group_frac"] == 0.0
    # without `acc`, correctness is reward > 0.5 (verl's own val-core choice)
    m = validation_calibration_metrics(["a"] * 2, ["q"] * 2, {"reward": [1.0, 0.0], LPM_KEY: [-2.0, -1.0]})
    assert m["val-calib/a/auc_mean"] == 0.0
    # responses without a finite lpm are left out and counted
    infos = {"acc": [1.0, 0.0, 1.0, 0.0], LPM_KEY: [-0.1, -1.0, None, float("nan")], "reward": [0] * 4}
    m = validation_calibration_metrics(["a"] * 4, ["q"] * 4, infos)
    assert m["val-calib/a/auc_mean"] == 1.0 and m["val-calib/a/lpm_missing_frac"] == 0.5
    assert validation_calibration_metrics([], [], {"reward": []}) == {}


def test_no_lpm_at_all_is_a_clear_error():
    with pytest.raises(RuntimeError, match="calculate_log_probs=true.*trainer.val_calib=false"):
        validation_calibration_metrics(["a", "a"], ["q", "q"], {"reward": [1.0, 0.0], "acc": [1.0, 0.0]})
    with pytest.raises(RuntimeError, match="no validation response carries"):
        validation_calibration_metrics(["a"], ["q"], {"reward": [1.0], LPM_KEY: [None]})
    with pytest.raises(ValueError, match="entries for 2 validation responses"):
        validation_calibration_metrics(["a", "a"], ["q", "q"], {"reward": [1.0], LPM_KEY: [-1.0]})


# --- 3. verl's own _val_metrics_update, patched ------------------------------------------------------------
@pytest.mark.parametrize("trainer_cls", ["v1", "legacy"])
def test_real_val_metrics_update_logs_val_calib_next_to_val_core(trainer_cls):
    if trainer_cls == "v1":
        from verl.trainer.ppo.v1.trainer_base import PPOTrainer as cls
    else:
        from verl.trainer.ppo.ray_trainer import RayPPOTrainer as cls
    sources, uids, infos = _outputs()
    kwargs = {"expected_acc_counts": {(s, u): 4 for s, u in zip(sources, uids)}} if trainer_cls == "v1" else {}
    # num_turns: one list entry per response (v1), one array per batch (legacy)
    turns = [2] * len(sources) if trainer_cls == "v1" else [np.full(len(sources), 2)]
    metrics = cls._val_metrics_update(_trainer(True), sources, uids, infos, turns, **kwargs)
    for src in ("aime24", "math500"):
        assert f"val-core/{src}/acc/mean@4" in metrics  # verl's metric, unchanged
        assert metrics[f"val-calib/{src}/auc_mean"] == pytest.approx(
            validation_calibration_metrics(sources, uids, infos)[f"val-calib/{src}/auc_mean"]
        )
    assert not any("/lpm/" in k for k in metrics)  # lpm is not put through verl's mean@/maj@ statistics
    assert LPM_KEY in infos  # the caller's dict (dumped to validation_data_dir) keeps it
    # trainer.val_calib=false: verl's metrics only
    off = cls._val_metrics_update(_trainer(False), sources, uids, infos, turns, **kwargs)
    assert not any(k.startswith("val-calib/") for k in off)
    assert {k: v for k, v in metrics.items() if not k.startswith("val-calib/")} == off
    # a config without the key (auto): on when the responses carry lpm
    default = cls._val_metrics_update(_trainer(None), sources, uids, infos, turns, **kwargs)
    assert default == metrics


# --- 3b. without lpm: skipped (auto), or an error (asked for, or a capo-verl estimator) -----------------------
def _without_lpm(trainer_cls):
    """verl's _val_metrics_update of the v1 or legacy trainer and its arguments, for responses without lpm."""
    if trainer_cls == "v1":
        from verl.trainer.ppo.v1.trainer_base import PPOTrainer as cls
    else:
        from verl.trainer.ppo.ray_trainer import RayPPOTrainer as cls
    sources, uids, infos = _outputs()
    del infos[LPM_KEY]  # rollout.calculate_log_probs=false, or a colocated reward model
    kwargs = {"expected_acc_counts": {(s, u): 4 for s, u in zip(sources, uids)}} if trainer_cls == "v1" else {}
    turns = [2] * len(sources) if trainer_cls == "v1" else [np.full(len(sources), 2)]
    return cls._val_metrics_update, (sources, uids, infos, turns), kwargs


@pytest.fixture
def fresh_warning(monkeypatch, caplog):
    """A process that has not warned yet; every capo_verl log record captured."""
    monkeypatch.setattr(validation, "_warned_skipped", False)
    caplog.set_level(logging.WARNING, logger="capo_verl")
    return caplog


def _skip_warnings(caplog):
    return [
        r.getMessage()
        for r in caplog.records
        if r.name == "capo_verl"
        and r.levelno == logging.WARNING
        and "val-calib/* calibration metrics" in r.getMessage()
    ]


@pytest.mark.parametrize("trainer_cls", ["v1", "legacy"])
@pytest.mark.parametrize("val_calib", [None, "auto"])
def test_no_lpm_auto_skips_with_one_warning(trainer_cls, val_calib, fresh_warning):
    update, args, kwargs = _without_lpm(trainer_cls)
    off = update(_trainer(False), *args, **kwargs)  # verl's metrics alone
    assert not _skip_warnings(fresh_warning)
    trainer = _trainer(val_calib, adv_estimator="grpo")
    for _ in range(3):  # three validation passes of one run
        assert update(trainer, *args, **kwargs) == off
    (message,) = _skip_warnings(fresh_warning)
    assert message.startswith("capo-verl: ") and "val-calib/*" in message and "'lpm'" in message, message
    assert "calculate_log_probs=true" in message and "trainer.val_calib=false" in message


def test_auto_skips_a_failing_computation_with_one_warning(fresh_warning, monkeypatch):
    sources, uids, infos = _outputs()

    def broken(*args):
        raise ValueError("something val-calib cannot read")

    monkeypatch.setattr(validation, "validation_calibration_metrics", broken)
    for _ in range(2):
        assert validation.calibration_metrics_for(_trainer(None), sources, uids, infos) == {}
    (message,) = _skip_warnings(fresh_warning)
    assert "computing them failed (ValueError: something val-calib cannot read)" in message
    with pytest.raises(ValueError, match="cannot read"):  # asked for: the error is the user's to see
        validation.calibration_metrics_for(_trainer(True), sources, uids, infos)


@pytest.mark.parametrize("trainer_cls", ["v1", "legacy"])
def test_no_lpm_with_val_calib_true_raises_naming_the_key_and_fix(trainer_cls, fresh_warning):
    update, args, kwargs = _without_lpm(trainer_cls)
    with pytest.raises(RuntimeError) as err:
        update(_trainer(True, adv_estimator="grpo"), *args, **kwargs)
    message = str(err.value)
    assert "'lpm'" in message and "(trainer.val_calib=true)" in message  # what is missing, what made it required
    assert "actor_rollout_ref.rollout.calculate_log_probs=true" in message
    assert "trainer.val_calib=false" in message
    assert not _skip_warnings(fresh_warning)


@pytest.mark.parametrize("estimator", ["capo", "grpo_mask", "codapo", "cde"])
def test_no_lpm_with_a_capo_verl_estimator_raises(estimator, fresh_warning):
    update, args, kwargs = _without_lpm("v1")
    for val_calib in (None, "auto"):
        with pytest.raises(
            RuntimeError,
            match=rf"\(algorithm\.adv_estimator={estimator}\b.*\bcapo-verl\b.*\btrainer\.val_calib=false\b",
        ):
            update(_trainer(val_calib, adv_estimator=estimator), *args, **kwargs)
    # turned off explicitly: verl's metrics, no error and no warning
    off = update(_trainer(False, adv_estimator=estimator), *args, **kwargs)
    assert off and not any(k.startswith("val-calib/") for k in off)
    assert not _skip_warnings(fresh_warning)


def test_val_calib_mode():
    from verl.trainer.ppo.core_algos import AdvantageEstimator

    mode = validation.val_calib_mode
    assert mode(_trainer(None).config) == ("auto", "trainer.val_calib is auto")
    assert mode(_trainer("AUTO").config)[0] == "auto"
    assert mode(_trainer(True).config) == ("required", "trainer.val_calib=true")
    assert mode(_trainer(False, adv_estimator="capo").config) == ("off", "trainer.val_calib=false")
    assert mode(_trainer(None, adv_estimator="capo").config)[0] == "required"
    assert mode(_trainer(None, adv_estimator=AdvantageEstimator.GRPO).config)[0] == "auto"  # verl's enum
    assert mode(_trainer(None, adv_estimator="not_registered").config)[0] == "auto"
    assert mode(None)[0] == "auto"
    for estimator in ("capo", "grpo_mask", "codapo", "cde"):
        assert validation.is_capo_verl_estimator(estimator)
    for estimator in ("grpo", "gae", "rloo", "reinforce_plus_plus", "opo", "gpg"):
        assert not validation.is_capo_verl_estimator(estimator)
    for bad in ("yes", "maybe", 1, 0.5):
        with pytest.raises(
            ValueError, match=rf"^trainer\.val_calib={re.escape(repr(bad))}: .*\btrue, false, auto or null\b"
        ):
            mode(_trainer(bad).config)
        with pytest.raises(
            ValueError, match=rf"^trainer\.val_calib={re.escape(repr(bad))}: .*\btrue, false, auto or null\b"
        ):
            validation.parse_val_calib(bad)
