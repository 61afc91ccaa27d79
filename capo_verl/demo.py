"""``capo-verl demo``: the ``capo`` estimator on a verl ``DataProto``, through verl's own ``compute_advantage``.

Builds one batch the way verl's trainer hands it over (two questions, ragged groups, padded responses,
``old_log_probs`` and ``ref_log_prob``), runs ``algorithm.adv_estimator=capo`` and ``grpo`` on it, and
prints each response's lpm, reference PPL, outcome and advantage, plus the ``capo/*`` step metrics.
"""

from __future__ import annotations

import argparse

import numpy as np
import torch
from omegaconf import OmegaConf

import capo_verl  # noqa: F401  (import verl -> the plugin registers `capo`)
from capo_verl import commands
from capo_verl.compat.advantage import pop_step_metrics


def build_batch(seed: int = 0):
    """The demo's verl ``DataProto`` (7 responses to two questions, T = 12 positions) and its rows
    ``(uid, correct, lpm, reference PPL, length)``; ``seed`` draws the per-token noise around each lpm."""
    from verl import DataProto

    rng = np.random.default_rng(seed)
    #            uid      correct  lpm    ref PPL  length
    rows = [
        ("q-easy", 1, -0.15, 1.30, 9),
        ("q-hard", 0, -0.10, 1.60, 12),  # confident and wrong: pushed down hardest
        ("q-easy", 0, -0.60, 1.90, 7),
        ("q-hard", 1, -0.70, 1.40, 12),  # right but unsure: pushed up hardest
        ("q-easy", 1, -0.40, 3.10, 5),  # a lucky guess (ref PPL > ref_high): masked
        ("q-hard", 0, -0.50, 1.02, 10),  # near-correct reasoning (ref PPL < ref_low): masked
        ("q-hard", 1, -0.30, 1.20, 8),
    ]
    T = 12
    bs = len(rows)
    mask = torch.zeros(bs, T, dtype=torch.int64)
    old_log_probs = torch.zeros(bs, T)
    ref_log_prob = torch.zeros(bs, T)
    rewards = torch.zeros(bs, T)
    for i, (_, correct, lpm, ppl, n) in enumerate(rows):
        mask[i, :n] = 1
        noise = torch.from_numpy(rng.normal(0, 0.05, n)).float()
        old_log_probs[i, :n] = lpm + noise - noise.mean()
        ref_log_prob[i, :n] = -float(np.log(ppl)) + noise - noise.mean()
        rewards[i, n - 1] = float(correct)
    batch = DataProto.from_dict(
        tensors={
            "token_level_rewards": rewards,
            "response_mask": mask,
            "old_log_probs": old_log_probs,
            "ref_log_prob": ref_log_prob,
        },
        non_tensors={"uid": np.array([r[0] for r in rows], dtype=object)},
    )
    return batch, rows


def _tau(text: str) -> float:
    """``--tau``: what :func:`capo_verl.estimators.capo.check_tau` accepts (finite, > 0, usable in float32)."""
    from capo_verl.estimators.capo import check_tau

    try:
        return check_tau(float(text))
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{text!r}: give a number > 0 that float32 holds, with its reciprocal (about 2.9e-39 < tau <= 3.4e38); "
            "the paper uses 0.5-1.0, e.g. --tau 0.6"
        ) from None


def build_parser() -> argparse.ArgumentParser:
    """The parser of ``capo-verl demo``."""
    p = commands.parser("demo", __doc__.split("\n\n")[0])
    p.add_argument("--tau", type=_tau, default=0.6, help="CAPO's surrogate temperature (default 0.6)")
    return p


def run(args: argparse.Namespace) -> int:
    """Print the demo batch's advantages under ``capo`` (``--tau``) and Dr. GRPO, and the ``capo/*`` metrics."""
    from verl.trainer.ppo.ray_trainer import compute_advantage

    batch, rows = build_batch()
    capo_cfg = OmegaConf.create({"adv_estimator": "capo", "capo": {"tau": args.tau}})
    grpo_cfg = OmegaConf.create({"adv_estimator": "grpo"})
    capo_adv = compute_advantage(batch.select(deepcopy=True), "capo", config=capo_cfg).batch["advantages"]
    metrics = pop_step_metrics()
    grpo_adv = compute_advantage(batch.select(deepcopy=True), "grpo", config=grpo_cfg, norm_adv_by_std_in_grpo=False)
    grpo_adv = grpo_adv.batch["advantages"]

    print(f"algorithm.adv_estimator=capo (tau={args.tau}, ref_high=2.5, ref_low=1.05) vs Dr. GRPO, one verl DataProto")
    print(f"{'uid':<8}{'correct':>8}{'lpm':>8}{'PPL_ref':>9}{'tokens':>8}{'A_grpo':>9}{'A_capo':>9}")
    for i, (uid, correct, _, _, n) in enumerate(rows):
        m = batch.batch["response_mask"][i].bool()
        lpm = batch.batch["old_log_probs"][i][m].mean().item()
        ppl = float(torch.exp(-batch.batch["ref_log_prob"][i][m].mean()))
        print(
            f"{uid:<8}{correct:>8}{lpm:>8.2f}{ppl:>9.2f}{n:>8}"
            f"{grpo_adv[i][m][0].item() + 0.0:>9.3f}{capo_adv[i][m][0].item() + 0.0:>9.3f}"
        )
    print("step metrics:", {k: round(v, 4) for k, v in sorted(metrics.items())})
    return 0


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``capo-verl demo``; returns the exit status (:func:`capo_verl.commands.main`)."""
    return commands.main(build_parser(), run, argv)


if __name__ == "__main__":
    raise SystemExit(main())
