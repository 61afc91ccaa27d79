"""``capo-verl compare`` (also ``python -m capo_verl.compare``): the command line.

Everything that can be checked is checked before anything is written or trained (:func:`make_plan`, then
:func:`capo_verl.compare.outdir.prepare_out`); a refusal is one line on stderr and exit code 2. A failed training
or evaluation exits 1.
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import functools
import json
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from capo_verl import commands
from capo_verl.compare import teacher_forced
from capo_verl.compare.config import (
    DEFAULT_CONFIG,
    MIN_VAL_QUESTIONS,
    MIN_VAL_SAMPLES,
    VAL_ALL,
    VAL_ALL_HELDOUT_AFTER,
    UsageError,
    as_record,
    checked_config,
    find_config_dir,
)
from capo_verl.compare.methods import METHODS
from capo_verl.compare.outdir import MARKER, check_method_dir, prepare_out
from capo_verl.compare.report import write_report
from capo_verl.compare.running import (
    STEP0_DIR,
    STEP0_OVERRIDES,
    check_step0_source,
    evaluate,
    generate_heldout,
    run_method,
    share_step0,
)
from capo_verl.compare.seeds import write_seeds_summary
from capo_verl.compare.verdict import PlanError, StudyPlan, load_plan
from capo_verl.outputs import write_atomic

#: at most this many training seeds in one command: each is a folder of trained runs
MAX_SEEDS = 100


def _seed_list(text: str) -> list[int]:
    """``--seeds``: comma-separated integers >= 0 and ranges ``a-b`` (inclusive), e.g. ``0,1,2`` or ``0-2,5``; at
    most :data:`MAX_SEEDS` seeds."""
    seeds: list[int] = []
    for part in text.split(","):
        lo, sep, hi = part.strip().partition("-")
        try:
            first, last = int(lo), int(hi) if sep else int(lo)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r}: give seeds as 0,1,2 or 0-2 (integers >= 0)") from None
        if first > last:
            raise argparse.ArgumentTypeError(f"{text!r}: range {part.strip()} runs backwards")
        if len(seeds) + last - first + 1 > MAX_SEEDS:
            raise argparse.ArgumentTypeError(
                f"{text!r}: more than {MAX_SEEDS} seeds; each trains every method, give at most {MAX_SEEDS} (e.g. 0-9)"
            )
        seeds += range(first, last + 1)
    return seeds


def _val_questions(text: str) -> int | str:
    """``--val-questions``: an integer >= 1, or ``all``."""
    return VAL_ALL if text == VAL_ALL else commands.positive_int(text)


#: what a training seed sets: verl's dataloader shuffle and the base of every rollout request's seed
#: (:func:`capo_verl.cpu.vllm_cpu.request_seed`)
SEED_KEYS = ("data.seed", "actor_rollout_ref.rollout.seed")


def seed_overrides(seed: int) -> list[str]:
    """The overrides of training seed ``seed``: every key of :data:`SEED_KEYS` set to ``seed``."""
    return [f"++{key}={seed}" for key in SEED_KEYS]


def build_parser() -> argparse.ArgumentParser:
    """The argument parser (:func:`capo_verl.commands.parser`: its errors are one line, exit 2)."""
    p = commands.parser(
        "compare",
        description="Train several methods with verl's trainer under identical settings and compare their "
        "calibration (validation AUC-mean, accuracy, training AUC-mean, entropy) with bootstrap intervals.",
        epilog="methods: " + "; ".join(f"{k}: {v.description}" for k, v in METHODS.items()),
    )
    p.add_argument(
        "--methods",
        nargs="+",
        default=["grpo", "capo"],
        choices=sorted(METHODS),
        help="methods to train, in order; differences are reported against the first (default: grpo capo)",
    )
    p.add_argument(
        "--out",
        required=True,
        help="output folder (one sub-folder per method, summary, figures); compare marks a folder it "
        "makes with .capo-verl-compare.json and refuses a non-empty folder without it",
    )
    p.add_argument(
        "--reuse-out",
        action="store_true",
        help="write into a non-empty --out that compare did not make (nothing there is deleted; refused "
        "if it holds a file compare would overwrite or a method folder compare did not make)",
    )
    p.add_argument(
        "--config",
        default=DEFAULT_CONFIG,
        help=f"config name in --config-dir (default {DEFAULT_CONFIG}); with another config, give "
        "data.train_files / data.val_files (and actor_rollout_ref.model.path) as overrides",
    )
    p.add_argument(
        "--config-dir",
        default=None,
        help="folder of the config (default: the configs shipped with capo-verl, a checkout's configs/)",
    )
    p.add_argument(
        "--steps",
        type=commands.positive_int,
        default=None,
        help="trainer.total_training_steps, >= 1 (default: the config's)",
    )
    p.add_argument(
        "--data-dir", default=None, help="where the default config's data is written (default ~/data/capo/compare)"
    )
    p.add_argument(
        "--val-questions",
        type=_val_questions,
        default=MIN_VAL_QUESTIONS,
        metavar="N|all",
        help=f"validation problems the default config's data holds (default {MIN_VAL_QUESTIONS}); another number "
        "writes its data to its own default --data-dir (~/data/capo/compare_val<N>), and the held-out set is the "
        f"64 problems after them. 'all': every GSM8K test calculation outside the held-out set of "
        f"--val-questions {VAL_ALL_HELDOUT_AFTER} whose expression is no training row's (~/data/capo/compare_valall)",
    )
    p.add_argument("--plot-only", action="store_true", help="only redraw figures and summary from existing logs")
    p.add_argument(
        "--prepare-only",
        action="store_true",
        help="write the data, convert the default model and draw and score the teacher-forced pool (--teacher-forced),"
        " then stop before any training: what every later unit of a study shares, made once",
    )
    p.add_argument("--no-eval", action="store_true", help="skip `capo-verl eval` of the final checkpoints")
    p.add_argument(
        "--eval-k",
        type=commands.positive_int,
        default=8,
        help="samples per held-out problem in the evaluation (default 8)",
    )
    p.add_argument("--n-boot", type=commands.positive_int, default=2000, help="bootstrap resamples (default 2000)")
    _add_study_options(p.add_argument_group("a study across training seeds"))
    p.add_argument("overrides", nargs="*", help="Hydra overrides for every method, e.g. trainer.test_freq=5")
    return p


def _add_study_options(g: argparse._ArgumentGroup) -> None:
    """``--seeds``, ``--teacher-forced``, ``--plan``, ``--share-step0``, ``--step0-only``: what a study across seeds
    adds."""
    g.add_argument(
        "--seeds",
        type=_seed_list,
        default=None,
        metavar="K[,K...]",
        help="training seeds, e.g. 0,1,2 or 0-2: seed K trains every method in <out>/seedK/ with data.seed=K and "
        "actor_rollout_ref.rollout.seed=K (the same data order and rollout seeds for every method of a seed: "
        "paired), seed by seed; <out>/seeds_summary.md compares across seeds (default: one run per method in "
        "<out>/ with the config's seeds)",
    )
    g.add_argument(
        "--teacher-forced",
        type=commands.positive_int,
        default=None,
        metavar="K",
        help="teacher-forced calibration: draw a pool of K base-model responses per validation question once "
        "(<out>/teacher_forced/), score it in float32 with the base model and every checkpoint with Hugging Face "
        "weights, then prune each finished run's checkpoints to those weights (needs the default config's data, "
        "trainer.save_freq and hf_model in actor_rollout_ref.actor.checkpoint.save_contents)",
    )
    g.add_argument(
        "--plan",
        default=None,
        metavar="PATH",
        help="the study's plan file (YAML: methods, seeds, steps, co-primary endpoints with their margins, verdict "
        "rule; capo_verl/compare/verdict.py): with --seeds, seeds_summary.md reads the endpoints and gives the "
        "verdict by its rule; --methods must be the plan's and --seeds among the plan's",
    )
    g.add_argument(
        "--share-step0",
        action="store_true",
        help="with --seeds: the base model is validated once per seed, in <out>/seedK/step0/ (verl's trainer with "
        "the first method's config and trainer.val_only=true), and every method of the seed takes that pass "
        "(val_generations/0.jsonl, marked as shared) instead of validating the same weights with the same rollout "
        "seeds itself (trainer.val_before_train=false)",
    )
    g.add_argument(
        "--step0-only",
        action="store_true",
        help="with --share-step0: make each seed's step-0 pass (and the data, model and teacher-forced pool) and "
        "train nothing",
    )


@dataclass
class Plan:
    """A comparison, checked before anything is written or trained.

    Attributes:
        config_dir: the folder of the config (resolved).
        overrides: Hydra overrides every method shares (the default config's data and model paths first).
        data_dir: where the default config's data is written; None for another config (no held-out evaluation).
        default_model: the model is the SmolLM2 checkpoint, converted on first use.
        settings: what every method shares, recorded in the output folder's marker.
        method_settings: per method, everything that determines its run, recorded in its ``done.json``.
        step0_settings: with ``--share-step0``, the same for the seed's step-0 pass (:data:`STEP0_DIR`): the first
            method's config with :data:`STEP0_OVERRIDES`; else None.
        max_new_tokens: ``data.max_response_length``, for the held-out evaluation and the teacher-forced pool.
        model_path: ``actor_rollout_ref.model.path``: the base model every run starts from.
        dtype: ``actor_rollout_ref.rollout.dtype``: the held-out evaluation and the teacher-forced pool generate in
            the precision of the training rollout.
    """

    config_dir: Path
    overrides: list[str]
    data_dir: Path | None
    default_model: bool
    settings: dict
    method_settings: dict[str, dict]
    max_new_tokens: int
    model_path: Path
    dtype: str
    step0_settings: dict | None = None


def make_plan(args: argparse.Namespace, extra_overrides: list[str] = ()) -> Plan:
    """Check the arguments and compose every method's config (verl's checks included); writes nothing.

    Raises:
        UsageError: a method listed twice, no such config, or a method's config that does not compose or that
            verl's checks refuse (see :func:`capo_verl.compare.config.checked_config`).
    """
    repeated = sorted({m for m in args.methods if args.methods.count(m) > 1})
    if repeated:
        raise UsageError(f"--methods lists {', '.join(repeated)} more than once")
    config_dir = find_config_dir(args.config, args.config_dir)
    overrides, data_dir, default_model = _overrides(args, extra_overrides)

    base = checked_config("the shared config", args.config, config_dir, overrides, validate=False)
    settings = {"config": args.config, "overrides": overrides, "composed": as_record(base)}
    if data_dir is not None and args.val_questions != MIN_VAL_QUESTIONS:  # recorded when not the default
        settings["val_questions"] = args.val_questions
    if args.teacher_forced is not None:  # recorded when asked for
        _check_teacher_forced(base, data_dir)
        settings["teacher_forced"] = args.teacher_forced
    method_settings = {}  # --share-step0 is recorded in the methods' own overrides, not in what every seed shares
    for m in args.methods:
        own = list(METHODS[m].overrides) + share_step0_overrides(args)
        cfg = checked_config(f"method {m}", args.config, config_dir, own + overrides)
        method_settings[m] = {**settings, "method": m, "method_overrides": own, "composed": as_record(cfg)}
    step0_settings = None
    if args.share_step0:  # the step-0 pass validates and trains nothing: no pool to score, no held-out generation
        first = args.methods[0]
        own = list(METHODS[first].overrides) + list(STEP0_OVERRIDES)
        step0 = checked_config("the step-0 pass", args.config, config_dir, own + overrides)
        step0_settings = {k: v for k, v in settings.items() if k != "teacher_forced"}
        step0_settings.update(method=first, step0=True, method_overrides=own, composed=as_record(step0))
    val_n = int(cfg.actor_rollout_ref.rollout.val_kwargs.n)
    if val_n < MIN_VAL_SAMPLES:
        print(
            f"[compare] warning: actor_rollout_ref.rollout.val_kwargs.n={val_n} < {MIN_VAL_SAMPLES}: "
            "few samples per question for a per-question AUC",
            flush=True,
        )
    return Plan(
        config_dir,
        overrides,
        data_dir,
        default_model,
        settings,
        method_settings,
        int(base.data.max_response_length),
        Path(str(base.actor_rollout_ref.model.path)),
        str(base.actor_rollout_ref.rollout.dtype),
        step0_settings,
    )


def share_step0_overrides(args: argparse.Namespace) -> list[str]:
    """Every method's own overrides for ``--share-step0``: it skips the validation before training (it takes the
    seed's step-0 pass, :func:`capo_verl.compare.running.share_step0`)."""
    return ["++trainer.val_before_train=false"] if args.share_step0 else []


def _overrides(args: argparse.Namespace, extra_overrides: list[str] = ()) -> tuple[list[str], Path | None, bool]:
    """The Hydra overrides every method shares (the default config's data and model paths first, then the
    command line's, ``extra_overrides``, and ``--steps``), the default config's data folder (None for another
    config) and whether the model is the default SmolLM2 checkpoint."""
    overrides = list(args.overrides) + list(extra_overrides)
    if args.steps is not None:
        overrides.append(f"++trainer.total_training_steps={args.steps}")
    data_dir, default_model = None, False
    if args.config == DEFAULT_CONFIG:
        from capo_verl.cpu.models import SMOLLM2_NAME, cache_dir

        default_dir = "compare" if args.val_questions == MIN_VAL_QUESTIONS else f"compare_val{args.val_questions}"
        data_dir = Path(args.data_dir or Path.home() / "data" / "capo" / default_dir).expanduser().resolve()
        defaults = [
            f"data.train_files={data_dir / 'gsm8k_calc_train.parquet'}",
            f"data.val_files={data_dir / 'gsm8k_calc_val.parquet'}",
        ]
        if not any(o.lstrip("+").startswith("actor_rollout_ref.model.path=") for o in overrides):
            defaults.append(f"actor_rollout_ref.model.path={cache_dir() / SMOLLM2_NAME}")
            default_model = True
        overrides = defaults + overrides
    return overrides, data_dir, default_model


def seed_plan(plan: Plan, args: argparse.Namespace, seed: int) -> Plan:
    """The plan of training seed ``seed``, from ``plan = make_plan(args)``: the same as
    ``make_plan(args, seed_overrides(seed))`` without composing and checking every method's config again (the keys
    of :data:`SEED_KEYS` enter none of the checks).

    Returns:
        a new Plan: the overrides with :func:`seed_overrides` where ``make_plan`` puts them, and every recorded
        composed config with the keys of :data:`SEED_KEYS` set to ``seed``.
    """
    overrides, _, _ = _overrides(args, seed_overrides(seed))

    def seeded(record: dict) -> dict:
        record = copy.deepcopy(record)
        for key in SEED_KEYS:
            *parents, leaf = key.split(".")
            node = record
            for part in parents:
                node = node.setdefault(part, {})
            node[leaf] = seed
        return record

    def settings(recorded: dict) -> dict:
        return {**recorded, "overrides": overrides, "composed": seeded(recorded["composed"])}

    return dataclasses.replace(
        plan,
        overrides=overrides,
        settings=settings(plan.settings),
        method_settings={m: settings(s) for m, s in plan.method_settings.items()},
        step0_settings=None if plan.step0_settings is None else settings(plan.step0_settings),
    )


def _check_teacher_forced(cfg, data_dir: Path | None) -> None:
    """Raises: UsageError unless ``--teacher-forced`` can score checkpoints: the default config's data (the pool is
    drawn from its validation set), ``trainer.save_freq`` > 0 and ``hf_model`` among the checkpoint's contents."""
    if data_dir is None:
        raise UsageError("--teacher-forced draws its pool from the default config's validation data; drop --config")
    contents = list(cfg.actor_rollout_ref.actor.checkpoint.get("save_contents") or [])
    if "hf_model" not in contents:
        raise UsageError(
            f"--teacher-forced scores Hugging Face weights, but actor_rollout_ref.actor.checkpoint.save_contents is "
            f"{contents}; add hf_model, e.g. 'actor_rollout_ref.actor.checkpoint.save_contents=[model,optimizer,"
            "extra,hf_model]'"
        )
    if int(cfg.trainer.save_freq) <= 0:
        raise UsageError(f"--teacher-forced needs checkpoints: trainer.save_freq is {cfg.trainer.save_freq}; set >= 1")


def _check_plan(args: argparse.Namespace) -> StudyPlan | None:
    """The study's plan file of ``--plan``, checked against the command (None without ``--plan``).

    Raises:
        UsageError: the plan file cannot be read, ``--plan`` without ``--seeds``, ``--methods`` not the plan's,
            a seed not among the plan's, or ``--steps`` not the plan's.
    """
    if args.plan is None:
        return None
    try:
        plan = load_plan(args.plan)
    except PlanError as exc:
        raise UsageError(str(exc)) from None
    if args.seeds is None:
        raise UsageError(f"--plan reads a comparison across seeds; add --seeds (the plan's: {_seeds_text(plan.seeds)})")
    if tuple(args.methods) != plan.methods:
        raise UsageError(f"--methods {' '.join(args.methods)}: the plan compares --methods {' '.join(plan.methods)}")
    extra = [k for k in args.seeds if k not in plan.seeds]
    if extra:
        raise UsageError(f"--seeds: seed {extra[0]} is not among the plan's seeds ({_seeds_text(plan.seeds)})")
    if args.steps is not None and args.steps != plan.steps:
        raise UsageError(f"--steps {args.steps}: the plan trains --steps {plan.steps}")
    return plan


def _seeds_text(seeds) -> str:
    return ",".join(map(str, seeds))


def main(argv: list[str] | None = None) -> int:
    """Run ``capo-verl compare``; returns the exit code: 0, 1 (a training or evaluation failed), 2 (refused),
    130 (stopped by Ctrl-C: the same command goes on). One line on stderr for each but 0
    (:func:`capo_verl.commands.main`)."""
    # intermixed: Hydra overrides may stand before, between and after the options
    return commands.main(build_parser(), functools.partial(_run, argv=argv), argv, intermixed=True)


def _run(args: argparse.Namespace, argv: list[str] | None) -> int:
    """Check everything, then train, evaluate and summarize (see the module doc).

    Raises:
        UsageError: a refused request, before anything is written or trained.
        capo_verl.commands.RunFailed: a training or evaluation failed.
    """
    out = Path(args.out).expanduser().resolve()
    if args.seeds is not None and len(set(args.seeds)) != len(args.seeds):
        raise UsageError(f"--seeds lists a seed more than once: {_seeds_text(args.seeds)}")
    only = [flag for flag in ("prepare_only", "plot_only", "step0_only") if getattr(args, flag)]
    if len(only) > 1:
        raise UsageError(f"{' and '.join('--' + f.replace('_', '-') for f in only)}: give one of them")
    if args.share_step0 and args.seeds is None:
        raise UsageError("--share-step0 validates the base model once per seed for every method: it needs --seeds K")
    if args.step0_only and not args.share_step0:
        raise UsageError("--step0-only makes each seed's shared step-0 pass: add --share-step0 (and --seeds K)")
    study = _check_plan(args)
    if args.plot_only:
        return _plot_only(out, args, study)
    # every seed's plan and folder is checked before anything is written or trained
    units = {None: out} if args.seeds is None else {k: out / f"seed{k}" for k in args.seeds}
    plan = make_plan(args)  # every method's config composed and checked once; the seeds' plans follow from it
    plans = {k: plan if k is None else seed_plan(plan, args, k) for k in units}
    eval_k = args.eval_k if not args.no_eval and plan.data_dir is not None else None
    for k, folder in units.items():
        if plans[k].step0_settings is not None:  # the seed's step-0 pass: validated, no checkpoints, no evaluation
            check_method_dir(folder / STEP0_DIR, plans[k].step0_settings, None)
    if args.seeds is not None:  # the top folder holds the seed folders: marked with what every seed shares
        prepare_out(out, {**plan.settings, "layout": "seeds"}, {}, eval_k=None, reuse=args.reuse_out)
    for k, folder in units.items():
        reuse = args.reuse_out if k is None else False
        prepare_out(folder, plans[k].settings, plans[k].method_settings, eval_k=eval_k, reuse=reuse)

    argv = sys.argv[1:] if argv is None else list(argv)
    record = {
        "argv": argv,
        "methods": args.methods,
        "seeds": args.seeds,
        "config": args.config,
        "config_dir": str(plan.config_dir),
        "overrides": plan.overrides,
    }
    write_atomic(out / "compare.json", json.dumps(record, indent=2))
    try:
        _train_units(args, out, plan, plans, units, eval_k)
    except (RuntimeError, FileNotFoundError, ImportError, subprocess.CalledProcessError) as exc:
        raise commands.RunFailed(str(exc)) from exc
    except KeyboardInterrupt:
        print(
            "capo-verl compare: stopped. The same command goes on: finished methods are kept, a stopped one resumes "
            "from its last checkpoint (trainer.save_freq sets how often one is written)",
            file=sys.stderr,
        )
        return commands.INTERRUPTED
    if args.prepare_only or args.step0_only:
        made = "data, model and teacher-forced pool" if args.teacher_forced is not None else "data and model"
        made += ", each seed's step-0 pass" if args.step0_only else ""
        print(f"[compare] prepared {out}: {made}; nothing trained", flush=True)
        return 0
    _summarize(out, args, study)
    return 0


def _train_units(args: argparse.Namespace, out: Path, plan: Plan, plans: dict, units: dict, eval_k: int | None) -> None:
    """Write the data, then per seed: validate the base model once (``--share-step0``; all with ``--step0-only``),
    train every method, score its checkpoints (``--teacher-forced``), generate on the held-out set, and write the
    seed's report.

    Raises:
        RuntimeError, FileNotFoundError, ImportError, subprocess.CalledProcessError: a step failed.
        KeyboardInterrupt: Ctrl-C, after the training has stopped.
    """
    if plan.data_dir is not None:
        from capo_verl.data import write_gsm8k_calc_parquet

        every = args.val_questions == VAL_ALL
        n_val = VAL_ALL_HELDOUT_AFTER if every else args.val_questions
        write_gsm8k_calc_parquet(plan.data_dir, n_train=1024, n_val=n_val, n_test=64, seed=0, val_all=every)
        eval_data = plan.data_dir / "gsm8k_calc_test.parquet"
        val_data = plan.data_dir / "gsm8k_calc_val.parquet"
    if plan.default_model:
        from capo_verl.cpu.models import smollm2_checkpoint

        smollm2_checkpoint()  # converted on first use, into the folder the overrides name
    pool_dir = None
    if args.teacher_forced is not None:
        pool_dir = teacher_forced.make_pool(
            out, val_data, plan.model_path, k=args.teacher_forced, max_new_tokens=plan.max_new_tokens, dtype=plan.dtype
        )
    if args.prepare_only:
        return
    for k, folder in units.items():
        if k is not None:
            print(f"[compare] seed {k}: {folder}", flush=True)
        step0 = folder / STEP0_DIR
        if args.share_step0:  # the seed's step-0 pass, made once: its overrides last, so that none undoes them
            overrides = plans[k].overrides + list(STEP0_OVERRIDES)
            settings = plans[k].step0_settings
            run_method(
                args.methods[0], folder, args.config, plans[k].config_dir, overrides, settings=settings, name=STEP0_DIR
            )
        if args.step0_only:
            continue
        for m in args.methods:
            shared = share_step0_overrides(args)
            if shared:  # the seed's step-0 pass must be there before a method trains without its own
                check_step0_source(step0, folder / m)
            # after the shared overrides, so that none of them undoes it
            overrides = plans[k].overrides + shared
            run_dir = run_method(
                m, folder, args.config, plans[k].config_dir, overrides, settings=plans[k].method_settings[m]
            )
            if shared:
                share_step0(step0, run_dir)
            # everything that needs the run's checkpoints, now: its small outputs are then complete without them
            if pool_dir is not None:
                teacher_forced.score_run(run_dir, pool_dir, val_data, tokenizer=plan.model_path)
            if eval_k is not None:  # held-out generation seeded by the training seed
                generate_heldout(
                    run_dir, eval_data, k=eval_k, max_new_tokens=plan.max_new_tokens, dtype=plan.dtype, seed=k or 0
                )
        if eval_k is not None:
            report = evaluate(
                folder, args.methods, eval_data, k=eval_k, max_new_tokens=plan.max_new_tokens, dtype=plan.dtype
            )
            print(f"[compare] held-out evaluation: {report / 'report.md'}", flush=True)
        elif not args.no_eval:
            print("[compare] no held-out evaluation set for a custom --config: skipping `capo-verl eval`", flush=True)
        if k is not None:
            write_report(folder, args.methods, n_boot=args.n_boot)


def _summarize(out: Path, args: argparse.Namespace, study: StudyPlan | None) -> None:
    """Write and print ``summary.md`` (one run per method) or ``seeds_summary.md`` (``--seeds``)."""
    if args.seeds is None:
        write_report(out, args.methods, n_boot=args.n_boot)
        print((out / "summary.md").read_text())
    else:
        write_seeds_summary(out, args.methods, args.seeds, plan=study, n_boot=args.n_boot)
        print((out / "seeds_summary.md").read_text())


def _plot_only(out: Path, args: argparse.Namespace, study: StudyPlan | None) -> int:
    """Redraw the report of existing runs in a folder compare made (or any folder, with ``--reuse-out``): only the
    report's files are written.

    Raises:
        UsageError: ``out`` is not a folder, compare did not make it (no marker) and ``--reuse-out`` is not given, or
            a method's logs are missing.
    """
    if not out.is_dir():
        raise UsageError(f"--plot-only: --out {out} is not a folder")
    folders = [out] if args.seeds is None else [out, *(out / f"seed{k}" for k in args.seeds)]
    unmarked = [f for f in folders if f.is_dir() and not (f / MARKER).is_file()]
    if unmarked and not args.reuse_out:
        raise UsageError(
            f"--plot-only: {unmarked[0]} was not made by capo-verl compare (no {MARKER}): its summary files would be "
            "overwritten; add --reuse-out to write them there anyway"
        )
    try:
        if args.seeds is not None:
            for k in args.seeds:
                write_report(out / f"seed{k}", args.methods, n_boot=args.n_boot)
        _summarize(out, args, study)
    except FileNotFoundError as exc:
        raise UsageError(f"--plot-only: {exc}") from exc
    except PlanError as exc:
        raise UsageError(str(exc)) from exc
    return 0
