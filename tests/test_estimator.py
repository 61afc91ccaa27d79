"""The CAPO estimator against hand computations of Eq. 14, against autograd of the pairwise logistic surrogate
(Eqs. 12-14), its limits in tau, its memory on ragged groups, and its errors. Pure: nothing here imports verl."""

import math
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import torch

from capo_verl.estimators import pop_step_metrics
from capo_verl.estimators.capo import CapoConfig, capo_pairwise_advantages, check_tau, compute_capo_outcome_advantage


def sig(x):
    return 1.0 / (1.0 + math.exp(-x))


def capo(rewards, mask, index, log_probs, ref=None, **capo_cfg):
    capo_cfg.setdefault("use_mask", ref is not None)
    adv, ret = compute_capo_outcome_advantage(
        token_level_rewards=rewards,
        response_mask=mask,
        index=np.asarray(index, dtype=object),
        config={"capo": capo_cfg},
        old_log_probs=log_probs,
        ref_log_prob=ref,
    )
    assert adv is ret
    return adv


def test_hand_computed_group_of_four(constant_batch, seq):
    # correct: lpm -0.1, -0.5 ; incorrect: -0.2, -0.3 ; tau = 0.6
    lpms, correct, tau = [-0.1, -0.5, -0.2, -0.3], [1, 1, 0, 0], 0.6
    r, m, lp = constant_batch(lpms, correct)
    got = seq(capo(r, m, ["q"] * 4, lp, tau=tau), m)
    w = {(i, j): sig(-(lpms[i] - lpms[j]) / tau) for i in (0, 1) for j in (2, 3)}
    expected = [w[0, 2] + w[0, 3], w[1, 2] + w[1, 3], -(w[0, 2] + w[1, 2]), -(w[0, 3] + w[1, 3])]
    np.testing.assert_allclose(got, expected, rtol=1e-6)
    # the misranked correct response (-0.5 < both incorrect) gets the larger push
    assert got[1] > got[0] > 0


def test_two_groups_interleaved_ragged_and_group_normalize(constant_batch, seq):
    # group a: 3 responses (1 correct), group b: 2 responses (1 correct), interleaved
    lpms = [-1.0, -0.2, -0.4, -0.9, -0.7]
    correct = [1, 1, 0, 0, 0]
    index = ["a", "b", "a", "b", "a"]
    r, m, lp = constant_batch(lpms, correct)
    tau = 0.5
    got = seq(capo(r, m, index, lp, tau=tau, normalize="group"), m)
    wa2, wa4 = sig(-(-1.0 + 0.4) / tau), sig(-(-1.0 + 0.7) / tau)
    wb = sig(-(-0.2 + 0.9) / tau)
    expected = [(wa2 + wa4) / 3, wb / 2, -wa2 / 3, -wb / 2, -wa4 / 3]
    np.testing.assert_allclose(got, expected, rtol=1e-6)


def test_unmixed_groups_and_empty_responses_get_zero(constant_batch, seq):
    lpms = [-0.1, -0.2, -0.3, -0.4, -0.5, -0.6]
    correct = [1, 1, 0, 0, 1, 0]
    index = ["all_right", "all_right", "all_wrong", "all_wrong", "mixed", "mixed"]
    r, m, lp = constant_batch(lpms, correct, lengths=[6, 6, 6, 6, 6, 0])
    lp[5] = float("nan")  # an empty response's log-probs are never used
    got = seq(capo(r, m, index, lp), m)
    assert np.all(got == 0.0)  # the only mixed group's incorrect member has no valid token: no pair


def test_tau_to_infinity_is_half_dr_grpo(constant_batch, seq):
    rng = np.random.default_rng(0)
    bs, G = 32, 8
    lpms = rng.normal(-1, 0.5, bs).tolist()
    correct = rng.integers(0, 2, bs).tolist()
    index = [f"q{i // G}" for i in range(bs)]
    r, m, lp = constant_batch(lpms, correct)
    got = seq(capo(r, m, index, lp, tau=1e7, normalize="group"), m)
    R = np.array(correct, dtype=float).reshape(-1, G)
    dr_grpo = (R - R.mean(1, keepdims=True)).reshape(-1)
    np.testing.assert_allclose(got, dr_grpo / 2, atol=1e-5)


def test_tau_to_zero_counts_misranked_pairs(constant_batch, seq):
    lpms = [-0.1, -0.9, -0.5, -0.3, -0.95]
    correct = [1, 1, 0, 0, 0]
    r, m, lp = constant_batch(lpms, correct)
    got = seq(capo(r, m, ["q"] * 5, lp, tau=1e-6), m)
    # correct i: number of incorrect j ranked above it; incorrect j: -number of correct ranked below it
    expected = [0, 2, -1, -1, 0]
    np.testing.assert_allclose(got, expected, atol=1e-6)


def test_permutation_equivariance_and_signs(constant_batch, seq):
    rng = np.random.default_rng(1)
    bs = 40
    lpms = rng.normal(-1, 0.3, bs).tolist()
    correct = rng.integers(0, 2, bs).tolist()
    index = [f"q{rng.integers(0, 6)}" for _ in range(bs)]  # ragged, interleaved groups
    lengths = rng.integers(1, 7, bs).tolist()
    r, m, lp = constant_batch(lpms, correct, lengths=lengths)
    base = seq(capo(r, m, index, lp), m)
    perm = rng.permutation(bs)
    permuted = seq(capo(r[perm], m[perm], [index[i] for i in perm], lp[perm]), m[perm])
    np.testing.assert_allclose(permuted, base[perm], rtol=1e-6, atol=1e-7)
    c = np.array(correct, bool)
    assert np.all(base[c] >= 0) and np.all(base[~c] <= 0)


def test_shift_of_all_lpm_in_a_group_changes_nothing(constant_batch, seq):
    rng = np.random.default_rng(2)
    lpms = rng.normal(-1, 0.3, 8)
    correct = [1, 0, 1, 0, 0, 1, 0, 1]
    r, m, lp = constant_batch(lpms.tolist(), correct)
    r2, m2, lp2 = constant_batch((lpms - 0.75).tolist(), correct)
    np.testing.assert_allclose(seq(capo(r, m, ["q"] * 8, lp), m), seq(capo(r2, m2, ["q"] * 8, lp2), m2), atol=1e-5)


def test_plus_minus_one_rewards_match_zero_one(constant_batch, seq):
    lpms, correct = [-0.3, -0.6, -0.2, -0.8], [1, 0, 0, 1]
    r01, m, lp = constant_batch(lpms, correct)
    rpm, _, _ = constant_batch(lpms, [1.0 if c else -1.0 for c in correct])
    np.testing.assert_allclose(seq(capo(r01, m, ["q"] * 4, lp), m), seq(capo(rpm, m, ["q"] * 4, lp), m))


def test_noise_mask_zeroes_own_advantage_but_keeps_opponent(constant_batch, seq):
    lpms, correct = [-0.2, -0.4, -0.3, -0.5], [1, 1, 0, 0]
    r, m, lp = constant_batch(lpms, correct)
    # reference PPL: 3.0 (correct, > ref_high -> masked), 1.5, 1.02 (incorrect, < ref_low -> masked), 1.5
    ref_ppl = torch.tensor([3.0, 1.5, 1.02, 1.5])
    ref = (-torch.log(ref_ppl)).unsqueeze(1).expand_as(lp).clone()
    unmasked = seq(capo(r, m, ["q"] * 4, lp, tau=0.6), m)
    masked = seq(capo(r, m, ["q"] * 4, lp, ref=ref, tau=0.6, ref_high=2.5, ref_low=1.05), m)
    np.testing.assert_allclose(masked, unmasked * np.array([0, 1, 0, 1]), rtol=1e-6)
    metrics = pop_step_metrics()
    assert metrics["capo/mask_frac_correct"] == 0.5 and metrics["capo/mask_frac_incorrect"] == 0.5
    np.testing.assert_allclose(metrics["capo/ref_ppl_correct_q75"], np.quantile([3.0, 1.5], 0.75), rtol=1e-5)
    np.testing.assert_allclose(metrics["capo/ref_ppl_incorrect_q25"], np.quantile([1.02, 1.5], 0.25), rtol=1e-5)


def test_lpm_is_masked_mean_and_float32_output(seq):
    T = 5
    lp = torch.tensor([[-1.0, -3.0, -100.0, -100.0, -100.0], [-2.0, -2.0, -2.0, -2.0, -2.0]], dtype=torch.bfloat16)
    mask = torch.tensor([[1, 1, 0, 0, 0], [1, 1, 1, 1, 1]])
    r = torch.zeros(2, T)
    r[0, 1] = 1.0
    adv = capo(r, mask, ["q", "q"], lp, tau=1.0)
    assert adv.dtype == torch.float32 and adv.shape == (2, T)
    # lpm = (-2, -2): w = sigmoid(0) = 0.5
    np.testing.assert_allclose(seq(adv, mask), [0.5, -0.5])


def test_step_metrics_recorded(constant_batch):
    lpms, correct = [-0.1, -0.5, -0.2, -0.3, -1.0, -1.1], [1, 1, 0, 0, 1, 1]
    r, m, lp = constant_batch(lpms, correct)
    pop_step_metrics()
    capo(r, m, ["a"] * 4 + ["b"] * 2, lp)
    metrics = pop_step_metrics()
    assert metrics["capo/auc_mean"] == pytest.approx(0.5)  # -0.1 beats both, -0.5 beats none
    assert metrics["capo/mixed_group_frac"] == pytest.approx(0.5)
    assert metrics["capo/lpm_correct_mean"] == pytest.approx(np.mean([-0.1, -0.5, -1.0, -1.1]), rel=1e-6)
    assert metrics["capo/lpm_incorrect_mean"] == pytest.approx(-0.25, rel=1e-6)
    assert "capo/mask_frac_correct" not in metrics  # mask off


# --- bad input: each error names the key and the fix (more values through verl's validate_config in
# tests/test_method_configs.py) --------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "cfg, match",
    [
        ({"tau": 0.0}, "algorithm.capo.tau"),
        ({"tau": -1.0}, "algorithm.capo.tau"),
        ({"tau": float("inf")}, "algorithm.capo.tau"),
        ({"ref_low": 0.0}, "algorithm.capo.ref_low"),
        ({"ref_high": -2.5}, "algorithm.capo.ref_high"),
        ({"normalize": "batch"}, "algorithm.capo.normalize"),
        ({"tua": 0.5}, "algorithm.capo.tua"),
        ({"reward_threshold": "0.5"}, "algorithm.capo.reward_threshold"),
        ({"reward_threshold": None}, "algorithm.capo.reward_threshold"),
        ({"reward_threshold": True}, "algorithm.capo.reward_threshold"),
    ],
)
def test_bad_config(cfg, match):
    with pytest.raises(ValueError, match=match):
        CapoConfig.from_algorithm_config({"capo": cfg})


def test_bad_reward_threshold_stops_before_any_tensor_work(constant_batch):
    """A non-numeric threshold used to fail inside the tensor comparison with a bare TypeError."""
    r, m, lp = constant_batch([-0.1, -0.2], [1, 0])
    with pytest.raises(ValueError, match=r"algorithm\.capo\.reward_threshold\b.*'high'"):
        capo(r, m, ["q", "q"], lp, reward_threshold="high")


def test_ref_high_of_one_is_accepted():
    # PPL_ref = 1 exactly (a response the reference model is certain of) stays unmasked at ref_high = 1
    assert CapoConfig.from_algorithm_config({"capo": {"ref_high": 1}}).ref_high == 1


def test_missing_inputs_raise_named_errors(constant_batch):
    r, m, lp = constant_batch([-0.1, -0.2], [1, 0])
    idx = np.array(["q", "q"], dtype=object)
    with pytest.raises(ValueError, match="uid"):
        compute_capo_outcome_advantage(r, m, None, {"capo": {"use_mask": False}}, old_log_probs=lp)
    with pytest.raises(ValueError, match="old_log_probs"):
        compute_capo_outcome_advantage(r, m, idx, {"capo": {"use_mask": False}})
    with pytest.raises(ValueError, match="ref_log_prob.*use_mask=false"):
        compute_capo_outcome_advantage(r, m, idx, None, old_log_probs=lp)
    bad = lp.clone()
    bad[1, 2] = float("inf")
    with pytest.raises(ValueError, match="old_log_probs has NaN or inf"):
        compute_capo_outcome_advantage(r, m, idx, {"capo": {"use_mask": False}}, old_log_probs=bad)
    with pytest.raises(ValueError, match="ref_log_prob has NaN or inf"):
        compute_capo_outcome_advantage(r, m, idx, None, old_log_probs=lp, ref_log_prob=bad)


def test_rollout_log_probs_used_when_old_absent(constant_batch):
    r, m, lp = constant_batch([-0.1, -0.5], [0, 1])
    idx, cfg = np.array(["q", "q"]), {"capo": {"use_mask": False}}
    a = compute_capo_outcome_advantage(r, m, idx, cfg, rollout_log_probs=lp)[0]
    b = compute_capo_outcome_advantage(r, m, idx, cfg, old_log_probs=lp)[0]
    assert torch.equal(a, b)


def test_uid_with_none_is_rejected(constant_batch):
    r, m, lp = constant_batch([-0.1, -0.2], [1, 0])
    with pytest.raises(ValueError, match="None or NaN"):
        compute_capo_outcome_advantage(
            r, m, np.array(["q", None], dtype=object), {"capo": {"use_mask": False}}, old_log_probs=lp
        )


def test_row_sweep_over_several_blocks_matches_plain_masked_mean():
    from capo_verl.estimators.common import _CPU_ROW_BLOCK, row_sweep

    g = torch.Generator().manual_seed(0)
    bs, T = 2 * _CPU_ROW_BLOCK + 37, 50
    values = torch.randn(bs, T, generator=g, dtype=torch.float64).to(torch.bfloat16)
    lengths = torch.randint(0, T + 1, (bs,), generator=g)
    mask = (torch.arange(T) < lengths.unsqueeze(1)).to(torch.int64)
    _, n_valid, sums, _ = row_sweep(mask, {"old_log_probs": values})
    mean = sums["old_log_probs"] / n_valid.clamp_min(1.0)
    expected = (values.double() * mask).sum(-1) / lengths.clamp_min(1)
    assert torch.equal(n_valid, lengths.float())
    torch.testing.assert_close(mean.double(), expected, rtol=1e-5, atol=1e-6)
    assert mean.dtype == torch.float32


# --- limits in tau: never NaN for a tau that passes the check ------------------------------------------------------
F32_MAX = float(np.finfo(np.float32).max)


@pytest.mark.parametrize(
    "tau, ok",
    [
        (3e-39, True),  # float32 subnormal, 1/tau = 3.3e38 still finite
        (2.9e-39, False),  # 1/tau = 3.45e38 overflows float32
        (1e-45, False),  # the smallest float32 subnormal: 1/tau overflows
        (1e-50, False),  # 0 in float32
        (F32_MAX, True),
        (3.5e38, False),  # inf in float32
    ],
)
def test_tau_range_is_float32s(tau, ok):
    if ok:
        assert check_tau(tau) == tau and CapoConfig(tau=tau).tau == tau
    else:
        with pytest.raises(ValueError, match="algorithm.capo.tau=.* is outside float32's range"):
            CapoConfig(tau=tau)
        with pytest.raises(ValueError, match="algorithm.capo.tau"):
            capo_pairwise_advantages(
                torch.zeros(2),
                torch.tensor([True, False]),
                torch.ones(2, dtype=torch.bool),
                torch.zeros(2, dtype=torch.int64),
                1,
                tau,
            )


@pytest.mark.parametrize("tau", [3e-39, 1e-20, 0.6, 1e20, F32_MAX])
def test_extreme_lpm_gaps_never_give_nan(tau):
    """lpm gaps from 0 (a tie) to 3.4e38 (float32's largest: scaled by 1 / tau it overflows to inf), at both ends of
    tau's range: finite advantages; for a small tau the weights are the step function (1 misranked, 1/2 tied, 0
    ranked)."""
    lpm = torch.tensor([-1.0, -1.0, -2.0, 0.0, -F32_MAX, -F32_MAX, -1e-30, 0.0])
    correct = torch.tensor([True, False, True, True, False, True, False, False])
    gid = torch.tensor([0, 0, 1, 1, 1, 2, 2, 2])
    adv = capo_pairwise_advantages(lpm, correct, torch.ones(8, dtype=torch.bool), gid, 3, tau)
    assert torch.isfinite(adv).all()
    assert (adv[correct] >= 0).all() and (adv[~correct] <= 0).all()
    if tau < 1:
        # group 0: a tie; group 1: both correct above the incorrect -2e38; group 2: -2e38 below both incorrect
        step = [0.5, -0.5, 0.0, 0.0, 0.0, 2.0, -1.0, -1.0]
        np.testing.assert_allclose(adv.numpy(), step, atol=1e-6 if tau < 1e-10 else 0.03)


def test_huge_tau_is_half_of_every_pair():
    lpm = torch.tensor([-1.0, -2.0, -3.0])
    adv = capo_pairwise_advantages(
        lpm,
        torch.tensor([True, False, False]),
        torch.ones(3, dtype=torch.bool),
        torch.zeros(3, dtype=torch.int64),
        1,
        F32_MAX,
    )
    assert adv.tolist() == [1.0, -0.5, -0.5]


# --- the advantage is minus the surrogate's gradient (Eqs. 12-14), by autograd -------------------------------------
def surrogate_gradient(lpm, correct, valid, groups, tau):
    """d/dlpm of L = sum over each group's (correct i, incorrect j) pairs of log(1 + exp(-(lpm_i - lpm_j) / tau))
    (Eq. 12's phi_tau at t = (lpm_i - lpm_j)(R_i - R_j) with 0/1 outcomes), by torch autograd in float64."""
    x = torch.tensor(lpm, dtype=torch.float64, requires_grad=True)
    terms = [
        torch.nn.functional.softplus(-(x[i] - x[j]) / tau)
        for g in set(groups)
        for i in range(len(x))
        if groups[i] == g and correct[i] and valid[i]
        for j in range(len(x))
        if groups[j] == g and not correct[j] and valid[j]
    ]
    if not terms:
        return np.zeros(len(x))
    (grad,) = torch.autograd.grad(torch.stack(terms).sum(), x)
    return grad.numpy()


@pytest.mark.parametrize("use_mask", [False, True])
@pytest.mark.parametrize("normalize", ["none", "group"])
@pytest.mark.parametrize("tau", [0.05, 0.6, 4.0])
def test_advantage_is_minus_tau_times_the_surrogate_gradient(tau, normalize, use_mask, constant_batch, seq):
    """A_i = -tau * dL/dlpm_i (divided by the group size G for normalize=group), times the mask m_i; a masked response
    still counts as an opponent in L, a response without valid tokens is in no pair."""
    rng = np.random.default_rng(int(tau * 100) + 7 * use_mask + 3 * (normalize == "group"))
    for _ in range(4):
        sizes = rng.integers(1, 11, rng.integers(2, 7))  # ragged, lone responses included
        groups = np.concatenate([[g] * s for g, s in enumerate(sizes)])[rng.permutation(sizes.sum())]
        bs = len(groups)
        lpm = np.minimum(rng.normal(-1.0, 0.4, bs), 0.0).astype(np.float32)  # log-probs: <= 0
        correct = rng.random(bs) < 0.5
        lengths = rng.integers(0, 6, bs)  # some responses without valid tokens
        ppl = rng.uniform(1.0, 3.0, bs)
        r, m, lp = constant_batch(lpm.tolist(), correct.tolist(), lengths=lengths.tolist(), T=6)
        ref = torch.from_numpy(-np.log(ppl)).float().unsqueeze(1).expand(bs, 6).clone()
        got = seq(
            capo(
                r,
                m,
                groups.astype(str),
                lp,
                ref=ref if use_mask else None,
                tau=tau,
                normalize=normalize,
                use_mask=use_mask,
                ref_high=2.0,
                ref_low=1.5,
            ),
            m,
        )

        valid = lengths > 0
        lpm_seen = lp[:, 0].double().numpy()  # the per-token value is the response's lpm
        expected = -tau * surrogate_gradient(lpm_seen, correct, valid, groups.tolist(), tau)
        if normalize == "group":
            expected /= np.bincount(groups)[groups]
        if use_mask:
            expected *= np.where(correct, ppl <= 2.0, ppl >= 1.5)
        np.testing.assert_allclose(got, expected, rtol=2e-5, atol=1e-6)


# --- memory: proportional to the pairs, not to n_groups * G_max^2 --------------------------------------------------
MEMORY_PROBE = textwrap.dedent(
    """
    import sys
    import numpy as np
    import torch

    from capo_verl.estimators.capo import compute_capo_outcome_advantage

    def rss(field):
        with open("/proc/self/status") as f:
            return next(int(line.split()[1]) * 1024 for line in f if line.startswith(field + ":"))

    def extra_peak(fn):
        # reset the high-water mark of the resident set (Linux >= 4.0), then run: the peak above the current RSS
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        before = rss("VmRSS")
        fn()
        return rss("VmHWM") - before

    torch.set_num_threads(1)
    sizes = [1000] + [2] * 2000
    uids = np.array([f"q{g}" for g, s in enumerate(sizes) for _ in range(s)], dtype=object)
    bs, T = len(uids), 8
    g = torch.Generator().manual_seed(0)
    rewards = torch.zeros(bs, T)
    rewards[:, -1] = (torch.rand(bs, generator=g) < 0.5).float()
    mask = torch.ones(bs, T, dtype=torch.int64)
    old = torch.randn(bs, T, generator=g) * 0.5 - 1.0
    config = {"capo": {"use_mask": False}}
    run = lambda: compute_capo_outcome_advantage(rewards, mask, uids, config, old_log_probs=old)
    adv = run()[0]
    assert torch.isfinite(adv).all() and adv[:1000].abs().sum() > 0
    control = extra_peak(lambda: torch.ones(50 * 2**20, dtype=torch.float32).sum())  # 200 MiB, seen?
    print(extra_peak(run), control)
    """
)


def test_one_large_group_among_many_pairs_stays_small():
    """1 group of 1000 + 2000 groups of 2: padding every group to (G_max, G_max) took 2001 * 1000^2 floats (> 19 GB);
    the pairs of this batch are 1000^2 + 2000 * 4, and the estimator's extra peak memory (RSS high-water mark in a
    fresh process, which sees torch's CPU allocations) stays far below 1 GB."""
    out = subprocess.run(
        [sys.executable, "-c", MEMORY_PROBE],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )
    assert out.returncode == 0, out.stderr[-3000:]
    peak, control = map(int, out.stdout.split())
    assert control > 150 * 2**20  # the measurement sees a 200 MiB torch tensor
    assert peak < 256 * 2**20, f"{peak / 2**20:.0f} MiB"
