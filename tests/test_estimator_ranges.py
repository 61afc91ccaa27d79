"""Values no estimator can use are refused (issue 65, section 6), with a ``ValueError`` naming the argument and the
range it must lie in: a ``response_mask`` outside {0, 1} (2.0 used to scale the advantages, -1 to zero them), complex
log-probs, a response whose mean log-prob is above 0 nats, a reference perplexity below 1. Every estimator, through
its verl signature, and the public functions that take sequence values."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from omegaconf import OmegaConf

from capo_verl.estimators import (
    capo_pairwise_advantages,
    cde_advantages,
    cde_shaped_rewards,
    codapo_advantages,
    codapo_group_weights,
    compute_capo_outcome_advantage,
    compute_cde_outcome_advantage,
    compute_codapo_outcome_advantage,
    compute_grpo_mask_outcome_advantage,
    grpo_group_advantages,
    pop_step_metrics,
    reference_ppl_mask,
)
from capo_verl.estimators.common import LOG_PROB_TOLERANCE, EstimatorInputError, check_log_prob_means

ESTIMATORS = {
    "capo": (compute_capo_outcome_advantage, {"capo": {"use_mask": True, "ref_high": 20.0, "ref_low": 1.0}}),
    "grpo_mask": (compute_grpo_mask_outcome_advantage, {"capo": {"use_mask": True, "ref_high": 20.0, "ref_low": 1.0}}),
    "codapo": (compute_codapo_outcome_advantage, {}),
    "cde": (compute_cde_outcome_advantage, {}),
}


def batch(bs: int = 4, T: int = 3, mask_dtype=torch.int64):
    """Two groups of two, one correct and one incorrect response each, every token valid."""
    rewards = torch.zeros(bs, T)
    rewards[::2, -1] = 1.0
    g = torch.Generator().manual_seed(0)
    return {
        "token_level_rewards": rewards,
        "response_mask": torch.ones(bs, T, dtype=mask_dtype),
        "index": np.array(["a", "a", "b", "b"][:bs], dtype=object),
        "old_log_probs": -torch.rand(bs, T, generator=g) - 0.1,
        "ref_log_prob": -torch.rand(bs, T, generator=g) - 0.1,
    }


def run(name, inputs):
    fn, cfg = ESTIMATORS[name]
    try:
        return fn(**inputs, config=OmegaConf.create(cfg))
    finally:
        pop_step_metrics()


@pytest.mark.parametrize("name", ESTIMATORS)
@pytest.mark.parametrize(
    "dtype, values",
    [
        (torch.float32, [2.0]),
        (torch.int64, [-1]),
        (torch.float32, [0.5]),
        (torch.int64, [2]),
        (torch.int64, [3, -1]),  # their sum is that of two ones
        (torch.int32, [2, -2]),
        (torch.float32, [2.0, 0.5, 0.5]),
    ],
)
def test_a_mask_outside_0_and_1_is_refused(name, dtype, values):
    inputs = batch(mask_dtype=dtype)
    inputs["response_mask"][1, : len(values)] = torch.tensor(values, dtype=dtype)
    with pytest.raises(EstimatorInputError, match=r"\bresponse_mask\b.*\b0 and 1\b.*rows \[1\]"):
        run(name, inputs)


@pytest.mark.parametrize("name", ESTIMATORS)
@pytest.mark.parametrize("dtype", [torch.bool, torch.int64, torch.int32, torch.float32, torch.bfloat16])
def test_a_0_1_mask_of_any_dtype_passes_and_gives_the_same_advantages(name, dtype):
    inputs = batch()
    inputs["response_mask"][0, 2] = 0  # padding
    want, _ = run(name, inputs)
    inputs["response_mask"] = inputs["response_mask"].to(dtype)
    got, _ = run(name, inputs)
    torch.testing.assert_close(got, want, rtol=0, atol=0)


#: the batch keys each estimator reads (grpo_mask reads no behaviour log-probs; codapo and cde no reference)
READS = {
    "capo": ("old_log_probs", "ref_log_prob", "token_level_rewards", "response_mask"),
    "grpo_mask": ("ref_log_prob", "token_level_rewards", "response_mask"),
    "codapo": ("old_log_probs", "token_level_rewards", "response_mask"),
    "cde": ("old_log_probs", "token_level_rewards", "response_mask"),
}


@pytest.mark.parametrize("name, key", [(name, key) for name, keys in READS.items() for key in keys])
def test_complex_inputs_are_refused_naming_the_key(name, key):
    inputs = batch()
    inputs[key] = inputs[key].to(torch.complex64)
    with pytest.raises(EstimatorInputError, match=rf"^{name}: {key}\b.*\bcomplex\b.*\(torch\.complex64\)"):
        run(name, inputs)


@pytest.mark.parametrize("name", ["capo", "codapo", "cde"])
@pytest.mark.parametrize("key", ["old_log_probs", "rollout_log_probs"])
def test_positive_log_probs_are_refused_naming_the_key_and_the_range(name, key):
    inputs = batch()
    if key == "rollout_log_probs":
        inputs["rollout_log_probs"] = inputs.pop("old_log_probs")
    inputs[key][3] = 0.4  # a probability, not a log-prob
    with pytest.raises(EstimatorInputError, match=rf"^{name}: {key}\b.*\babove 0\b.*rows \[3\]"):
        run(name, inputs)
    inputs[key][3] = LOG_PROB_TOLERANCE / 2  # 0 up to float rounding
    run(name, inputs)


@pytest.mark.parametrize("name", ["capo", "grpo_mask"])
def test_a_reference_perplexity_below_1_is_refused_where_the_mask_reads_it(name):
    inputs = batch()
    inputs["ref_log_prob"][2] = 0.3  # exp(-0.3) < 1
    with pytest.raises(EstimatorInputError, match=rf"^{name}: ref_log_prob\b.*\bperplexity below 1\b.*rows \[2\]"):
        run(name, inputs)
    fn, _ = ESTIMATORS[name]
    off = OmegaConf.create({"capo": {"use_mask": False}})
    fn(**batch(), config=off)
    reported = any("ref_ppl" in k for k in pop_step_metrics())  # capo reports an unused, sound reference
    assert reported == (name == "capo")
    fn(**inputs, config=off)  # not read with the mask off: no refusal, and left out of the metrics
    assert not any("ref_ppl" in k for k in pop_step_metrics())


def test_the_public_functions_of_sequence_values_refuse_them_too():
    lpm = torch.tensor([-1.0, 0.5, -2.0, -0.5])
    correct = torch.tensor([True, False, True, False])
    gid = torch.tensor([0, 0, 1, 1])
    valid = torch.ones(4, dtype=torch.bool)
    with pytest.raises(EstimatorInputError, match=r"^capo: lpm\b.*\babove 0\b.*rows \[1\]"):
        capo_pairwise_advantages(lpm, correct, valid, gid, 2, 0.6)
    capo_pairwise_advantages(lpm, correct, torch.tensor([True, False, True, True]), gid, 2, 0.6)  # not valid: unread
    with pytest.raises(EstimatorInputError, match=r"^codapo: lpm\b.*\babove 0\b"):
        codapo_group_weights(lpm, correct, gid, 2)
    with pytest.raises(EstimatorInputError, match=r"^cde: lpm\b.*\babove 0\b"):
        cde_advantages(correct, lpm, gid, 2, 0.5)
    with pytest.raises(EstimatorInputError, match=r"lpm is complex"):
        capo_pairwise_advantages(lpm.to(torch.complex64), correct, valid, gid, 2, 0.6)
    with pytest.raises(EstimatorInputError, match=r"\bperplexity\b.*\bbelow 1\b.*rows \[0\].*\[1, inf\)"):
        reference_ppl_mask(torch.tensor([0.9, 1.0, 2.0, 3.0]), correct, 2.5, 1.05)
    assert reference_ppl_mask(torch.tensor([1.0, 1.0, 2.0, 3.0]), correct, 2.5, 1.05).tolist() == [
        True,
        False,
        True,
        True,
    ]


def test_every_refusal_is_a_value_error():
    assert issubclass(EstimatorInputError, ValueError)


# --- the lower-level public functions (hostile round 4, L01-L21) --------------------------------------------------
LPM = torch.tensor([-1.0, -3.0, -1.0, -2.0])
CORRECT = torch.tensor([True, False, True, False])
VALID = torch.ones(4, dtype=torch.bool)
GID = torch.tensor([0, 0, 1, 1])
SCORES = torch.tensor([1.0, 0.0, 1.0, 0.0])


def call(fn, **changed):
    """``fn`` on the good inputs above, with ``changed`` ones replaced."""
    args = {"lpm": LPM, "correct": CORRECT, "valid": VALID, "gid": GID, "n_groups": 2, "scores": SCORES, **changed}
    if fn == "capo":
        return capo_pairwise_advantages(
            args["lpm"], args["correct"], args["valid"], args["gid"], args["n_groups"], args.get("tau", 0.6)
        )
    if fn == "cde":
        extra = {k: args[k] for k in ("kappa", "alpha", "epsilon") if k in args}
        return cde_advantages(args["correct"], args["lpm"], args["gid"], args["n_groups"], args.get("w", 1.0), **extra)
    if fn == "codapo":
        extra = {k: args[k] for k in ("weight_offset",) if k in args}
        return codapo_group_weights(args["lpm"], args["correct"], args["gid"], args["n_groups"], **extra)
    if fn == "codapo_advantages":
        extra = {k: args[k] for k in ("weight_offset", "epsilon") if k in args}
        return codapo_advantages(args["scores"], args["lpm"], args["correct"], args["gid"], args["n_groups"], **extra)
    if fn == "grpo":
        return grpo_group_advantages(args["scores"], args["gid"], args["n_groups"], True, args.get("epsilon", 1e-6))
    raise AssertionError(fn)


FUNCTIONS_OF_LPM = ["capo", "cde", "codapo", "codapo_advantages"]


@pytest.mark.parametrize("fn", FUNCTIONS_OF_LPM)
@pytest.mark.parametrize("bad", [float("nan"), -float("inf"), float("inf")])
def test_a_non_finite_lpm_is_refused(fn, bad):
    lpm = LPM.clone()
    lpm[1] = bad
    with pytest.raises(EstimatorInputError, match=r": lpm\b.*\bNaN or inf\b.*rows \[1\]"):
        call(fn, lpm=lpm)


def test_check_log_prob_means_names_the_argument_and_skips_invalid_rows():
    means = torch.tensor([-1.0, float("nan"), -float("inf")])
    with pytest.raises(EstimatorInputError, match=r"^capo: old_log_probs\b.*\bNaN or inf\b.*rows \[1, 2\]"):
        check_log_prob_means("capo", "old_log_probs", means)
    check_log_prob_means("capo", "old_log_probs", means, torch.tensor([True, False, False]))  # unread rows


@pytest.mark.parametrize("fn", [*FUNCTIONS_OF_LPM, "grpo"])
@pytest.mark.parametrize(
    "changed, named",
    [
        ({"gid": torch.tensor([0, 0, 5, 5])}, "gid"),  # beyond n_groups
        ({"gid": torch.tensor([0, 0, -1, -1])}, "gid"),
        ({"gid": torch.tensor([0.0, 0.0, 1.0, 1.0])}, "gid"),  # not integer
        ({"n_groups": 0}, "n_groups"),
        ({"n_groups": -1}, "n_groups"),
        ({"n_groups": 2.0}, "n_groups"),
        ({"gid": GID[:3]}, "gid"),  # 3 rows against 4
        ({"lpm": LPM[:3]}, "lpm"),
        ({"lpm": LPM[:, None]}, "lpm"),  # not (bs,)
        ({"correct": torch.tensor([0.7, 0.0, 1.0, 0.0])}, "correct"),  # not bool
        ({"valid": torch.ones(4)}, "valid"),
        ({"scores": SCORES[:3]}, "scores"),
        ({"scores": torch.tensor([1.0, float("nan"), 1.0, 0.0])}, "scores"),
    ],
)
def test_groups_shapes_and_dtypes_are_checked(fn, changed, named):
    reads = {
        "capo": {"lpm", "correct", "valid", "gid", "n_groups"},
        "cde": {"lpm", "correct", "gid", "n_groups"},
        "codapo": {"lpm", "correct", "gid", "n_groups"},
        "codapo_advantages": {"scores", "lpm", "correct", "gid", "n_groups"},
        "grpo": {"scores", "gid", "n_groups"},
    }[fn]
    if named not in reads:
        call(fn, **changed)  # an argument it does not take: unchanged result
        return
    with pytest.raises(EstimatorInputError, match=rf"\b{named}\b"):
        call(fn, **changed)


@pytest.mark.parametrize(
    "fn, changed",
    [
        ("cde", {"kappa": 0.0}),
        ("cde", {"kappa": float("inf")}),
        ("cde", {"alpha": -1.0}),
        ("cde", {"alpha": 0.0}),
        ("cde", {"w": float("nan")}),
        ("cde", {"w": -0.5}),
        ("cde", {"w": "1.0"}),
        ("cde", {"epsilon": -1e-6}),
        ("codapo", {"weight_offset": -5.0}),
        ("codapo", {"weight_offset": float("nan")}),
        ("codapo_advantages", {"weight_offset": -0.1}),
        ("codapo_advantages", {"epsilon": float("inf")}),
        ("grpo", {"epsilon": -1.0}),
        ("grpo", {"epsilon": float("nan")}),
    ],
)
def test_constants_outside_their_range_are_refused(fn, changed):
    (name,) = changed
    with pytest.raises(EstimatorInputError, match=rf": {name} must be a finite number in [\[(]"):
        call(fn, **changed)


@pytest.mark.parametrize("name, value", [("w", -1.0), ("kappa", 0.0), ("alpha", float("nan"))])
def test_cde_shaped_rewards_checks_its_constants(name, value):
    args = {"w": 1.0, "kappa": 3.0, "alpha": 1.0, name: value}
    with pytest.raises(EstimatorInputError, match=rf"^cde_shaped_rewards: {name}\b"):
        cde_shaped_rewards(torch.tensor([1.0, -1.0]), torch.tensor([0.5, 2.0]), **args)


def test_the_constants_at_their_bounds_pass():
    call("cde", w=0.0)
    call("codapo", weight_offset=0.0)
    # epsilon 0: a constant group gets 0 as documented (it used to be 0 / 0 = NaN)
    adv = grpo_group_advantages(torch.tensor([1.0, 1.0, 0.0, 1.0]), GID, 2, True, 0.0)
    assert adv[:2].tolist() == [0.0, 0.0] and torch.isfinite(adv).all()
    torch.testing.assert_close(grpo_group_advantages(SCORES, GID, 2, True, 0.0), call("grpo"), rtol=1e-5, atol=0)


@pytest.mark.parametrize(
    "ref_ppl, ref_high, ref_low, named",
    [
        ([float("nan"), 2.0, 2.0, 2.0], 2.5, 1.05, "ref_ppl"),
        ([1.5, 2.0, 2.0, 2.0], 1.05, 2.5, "ref_high"),  # swapped: ref_high < ref_low
        ([1.5, 2.0, 2.0, 2.0], 0.5, 0.4, "ref_high"),  # a perplexity threshold below 1
        ([1.5, 2.0, 2.0, 2.0], float("inf"), 1.05, "ref_high"),
        ([1.5, 2.0, 2.0, 2.0], 2.5, 0.0, "ref_low"),
        ([1.5, 2.0, 2.0, 2.0], 2.5, float("nan"), "ref_low"),
        ([1.5, 2.0, 2.0], 2.5, 1.05, "ref_ppl"),  # 3 rows against 4
    ],
)
def test_reference_ppl_mask_refuses_what_cannot_be_a_perplexity_or_a_window(ref_ppl, ref_high, ref_low, named):
    with pytest.raises(EstimatorInputError, match=rf"^reference_ppl_mask: .*\b{named}\b"):
        reference_ppl_mask(torch.tensor(ref_ppl), CORRECT, ref_high, ref_low)
