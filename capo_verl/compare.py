"""``capo-verl compare``: train several methods with verl's own trainer under identical settings, then compare
their calibration (paper section 5, Figure 1 b-c) on shared axes, with bootstrap intervals.

One command::

    capo-verl compare --methods grpo capo --out runs/compare_cpu [HYDRA_OVERRIDE ...]

1. writes the data once (GSM8K one-step calculations: train / 64 validation / 64 held-out evaluation problems,
   :func:`capo_verl.models.write_gsm8k_calc_parquet`) unless ``--config`` names another config,
2. trains each method in turn with ``python -m verl.trainer.main_ppo`` on the same base config (default
   ``configs/compare_smollm2_135m_cpu.yaml``), data order, seeds, model, batch and step budget: the only
   difference between the runs is the method's overrides (:data:`METHODS`). verl's file logger writes one JSON
   line per step (``<out>/<method>/metrics.jsonl``); validation samples with their lpm are dumped to
   ``<out>/<method>/val_generations/<step>.jsonl``. A method whose ``done.json`` exists is not trained again.
3. runs ``capo-verl eval generate`` on each final checkpoint (held-out set) and ``capo-verl eval score`` on all
   of them together (``<out>/eval_report/``),
4. draws the figures and writes ``summary.md`` / ``summary.json`` (:func:`write_report`); ``--plot-only`` does
   only this, from existing logs.

Per-question statistics (AUC-mean, accuracy) come with a 95% percentile-bootstrap interval over validation
questions (:func:`bootstrap_ci`); the difference between two methods resamples the same questions for both
(paired: every method is validated on the same problems).
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from capo_verl.metrics import auc_mean

REPO = Path(__file__).resolve().parents[1]
CONFIG_DIR = REPO / "configs"
DEFAULT_CONFIG = "compare_smollm2_135m_cpu"
#: AUC-mean over fewer mixed questions than this is reported as "too few to judge"
MIN_MIXED_QUESTIONS = 20
#: validation at least this many problems x samples (warned about below it)
MIN_VAL_QUESTIONS, MIN_VAL_SAMPLES = 64, 8


@dataclass(frozen=True)
class Method:
    """A method of the comparison: Hydra overrides applied on top of the shared base config.

    ``++key=value`` adds or replaces, so a method works on any verl config.
    """

    description: str
    overrides: tuple[str, ...]


#: method name -> the paper run it stands for. Every method keeps the base config's loss aggregation, clip,
#: learning rate, batch and data; only what is listed changes.
METHODS: dict[str, Method] = {
    "grpo": Method(
        "Dr. GRPO: verl's grpo estimator, A_i = R_i - mean(R) (no std), PPO-clip (configs/grpo_*.yaml)",
        ("++algorithm.adv_estimator=grpo", "++algorithm.norm_adv_by_std_in_grpo=false"),
    ),
    "capo": Method(
        "CAPO: capo estimator (Eq. 14, tau from algorithm.capo.tau) with the reference-PPL noise mask",
        ("++algorithm.adv_estimator=capo", "++algorithm.capo.use_mask=true"),
    ),
    "capo_no_mask": Method(
        "CAPO without the noise mask (ablation no_mask): no reference model",
        ("++algorithm.adv_estimator=capo", "++algorithm.capo.use_mask=false"),
    ),
    "grpo_mask": Method(
        "Dr. GRPO advantages x CAPO's noise mask (ablation grpo_mask)",
        ("++algorithm.adv_estimator=grpo_mask", "++algorithm.norm_adv_by_std_in_grpo=false",
         "++algorithm.capo.use_mask=true"),
    ),
    "gspo": Method(
        "GSPO: verl's gspo loss mode, clip 3e-4/4e-4, (R_i - mean)/std advantages (configs/gspo_*.yaml)",
        ("++algorithm.adv_estimator=grpo", "++algorithm.norm_adv_by_std_in_grpo=true",
         "++actor_rollout_ref.actor.policy_loss.loss_mode=gspo",
         "++actor_rollout_ref.actor.clip_ratio_low=3e-4", "++actor_rollout_ref.actor.clip_ratio_high=4e-4"),
    ),
    "codapo": Method(
        "CoDaPO: codapo estimator (confidence- and difficulty-weighted GRPO advantage)",
        ("++algorithm.adv_estimator=codapo", "++algorithm.norm_adv_by_std_in_grpo=true"),
    ),
    "cde": Method(
        "CDE: cde estimator (GRPO advantage of the perplexity-bonus-shaped reward)",
        ("++algorithm.adv_estimator=cde", "++algorithm.norm_adv_by_std_in_grpo=true"),
    ),
    "simko": Method(
        "SimKO: grpo estimator with the simko policy loss (top-K smoothing, top-1 penalty)",
        ("++algorithm.adv_estimator=grpo", "++algorithm.norm_adv_by_std_in_grpo=true",
         "++actor_rollout_ref.actor.policy_loss.loss_mode=simko"),
    ),
}


# ----------------------------------------------------------------------------------------------- statistics
def bootstrap_ci(
    values_fn, n_questions: int, *, n_boot: int = 2000, seed: int = 0, level: float = 0.95
) -> tuple[float, float]:
    """Percentile bootstrap interval of a statistic of questions.

    Args:
        values_fn: ``f(idx) -> float``, the statistic on the questions ``idx`` (an int array of length
            ``n_questions``, drawn with replacement; repeated questions count repeatedly). NaN results (e.g. no
            mixed question in the draw) are dropped.
        n_questions: number of questions to resample.
        n_boot: number of resamples. seed: numpy seed. level: coverage (0.95: 2.5% and 97.5% quantiles).

    Returns:
        ``(low, high)``; ``(nan, nan)`` when every resample is NaN.
    """
    rng = np.random.default_rng(seed)
    stats = np.array([values_fn(rng.integers(0, n_questions, n_questions)) for _ in range(n_boot)], dtype=np.float64)
    stats = stats[np.isfinite(stats)]
    if stats.size == 0:
        return float("nan"), float("nan")
    alpha = (1.0 - level) / 2.0
    return float(np.quantile(stats, alpha)), float(np.quantile(stats, 1.0 - alpha))


@dataclass
class ValidationPass:
    """One validation pass of one method, as question-level arrays.

    Attributes:
        questions: ``(Q,)`` question keys (prompt text), sorted.
        lpm: list of Q ``(k_q,)`` float64 arrays, mean token log-prob (nats) of each sample.
        correct: list of Q ``(k_q,)`` bool arrays.
    """

    step: int
    questions: list[str]
    lpm: list[np.ndarray]
    correct: list[np.ndarray]

    def per_question(self) -> tuple[np.ndarray, np.ndarray]:
        """``(acc (Q,), auc (Q,))``: per-question accuracy, and per-question ROC-AUC (NaN unless mixed)."""
        acc = np.array([c.mean() for c in self.correct])
        auc = np.full(len(self.questions), np.nan)
        for q, (lp, c) in enumerate(zip(self.lpm, self.correct)):
            if c.any() and not c.all():
                auc[q] = auc_mean(lp, c, np.zeros(len(c), dtype=np.int64))[0]
        return acc, auc


def read_validation_pass(path: Path) -> ValidationPass:
    """Read verl's validation dump (``trainer.validation_data_dir``/<step>.jsonl, one line per sample).

    Needs the fields ``input`` (prompt text: the question key), ``lpm`` (added by capo_verl.compat.validation) and
    ``acc`` (the reward's correctness) or else ``score`` (> 0.5 = correct).

    Raises:
        ValueError: a line without ``lpm``, or no line at all.
    """
    groups: dict[str, tuple[list[float], list[bool]]] = {}
    with open(path) as f:
        for line in f:
            if not line.strip():
                continue
            row = json.loads(line)
            if row.get("lpm") is None:
                raise ValueError(f"{path}: a validation sample has no 'lpm' (actor_rollout_ref.rollout.calculate_log_probs)")
            outcome = row["acc"] if "acc" in row else row["score"]
            lp, c = groups.setdefault(str(row["input"]), ([], []))
            lp.append(float(row["lpm"]))
            c.append(float(outcome) > 0.5)
    if not groups:
        raise ValueError(f"{path}: no validation samples")
    keys = sorted(groups)
    return ValidationPass(
        step=int(path.stem),
        questions=keys,
        lpm=[np.asarray(groups[k][0], dtype=np.float64) for k in keys],
        correct=[np.asarray(groups[k][1], dtype=bool) for k in keys],
    )


def pass_summary(vp: ValidationPass, *, n_boot: int = 2000, seed: int = 0) -> dict:
    """AUC-mean and accuracy (mean@k) of one validation pass with 95% bootstrap intervals over questions."""
    acc, auc = vp.per_question()
    mixed = np.isfinite(auc)
    n_mixed = int(mixed.sum())

    def auc_of(idx):
        a = auc[idx]
        a = a[np.isfinite(a)]
        return float(a.mean()) if a.size else float("nan")

    out = {
        "step": vp.step,
        "n_questions": len(vp.questions),
        "n_samples": int(sum(len(c) for c in vp.correct)),
        "n_mixed": n_mixed,
        "accuracy": float(acc.mean()),
        "accuracy_ci": bootstrap_ci(lambda i: acc[i].mean(), len(acc), n_boot=n_boot, seed=seed),
        "auc_mean": float(auc[mixed].mean()) if n_mixed else None,
        "auc_mean_ci": bootstrap_ci(auc_of, len(auc), n_boot=n_boot, seed=seed) if n_mixed else None,
        "auc_judgeable": n_mixed >= MIN_MIXED_QUESTIONS,
    }
    return out


def paired_difference(a: ValidationPass, b: ValidationPass, *, n_boot: int = 2000, seed: int = 0) -> dict:
    """``a - b`` of AUC-mean and accuracy over the questions both passes share, with a paired bootstrap interval.

    Each resample draws questions once and evaluates both methods on them (AUC-mean of each over its own mixed
    questions among the drawn ones).

    Raises:
        ValueError: the passes share no question.
    """
    common = sorted(set(a.questions) & set(b.questions))
    if not common:
        raise ValueError("the two validation passes share no question")
    ia = [a.questions.index(q) for q in common]
    ib = [b.questions.index(q) for q in common]
    acc_a, auc_a = (x[ia] for x in a.per_question())
    acc_b, auc_b = (x[ib] for x in b.per_question())

    def auc_diff(idx):
        x, y = auc_a[idx], auc_b[idx]
        x, y = x[np.isfinite(x)], y[np.isfinite(y)]
        return float(x.mean() - y.mean()) if x.size and y.size else float("nan")

    both = np.isfinite(auc_a).any() and np.isfinite(auc_b).any()
    full = np.arange(len(common))
    return {
        "n_questions": len(common),
        "accuracy_diff": float(acc_a.mean() - acc_b.mean()),
        "accuracy_diff_ci": bootstrap_ci(lambda i: acc_a[i].mean() - acc_b[i].mean(), len(common),
                                         n_boot=n_boot, seed=seed),
        "auc_mean_diff": auc_diff(full) if both else None,
        "auc_mean_diff_ci": bootstrap_ci(auc_diff, len(common), n_boot=n_boot, seed=seed) if both else None,
    }


# ------------------------------------------------------------------------------------------------- logs
def read_metrics(path: Path) -> dict[int, dict]:
    """verl's file logger (``VERL_FILE_LOGGER_PATH``): ``{step: {metric: value}}``, lines of a step merged."""
    steps: dict[int, dict] = {}
    if not path.exists():
        return steps
    for line in path.read_text().splitlines():
        if line.strip():
            record = json.loads(line)
            steps.setdefault(int(record["step"]), {}).update(record["data"])
    return steps


def series(steps: dict[int, dict], key_suffix: str, prefix: str = "") -> tuple[list[int], list[float]]:
    """``(steps, values)`` of the first metric whose name starts with ``prefix`` and ends with ``key_suffix``."""
    xs, ys = [], []
    for step in sorted(steps):
        for key, value in steps[step].items():
            if key.startswith(prefix) and key.endswith(key_suffix) and value is not None:
                xs.append(step)
                ys.append(float(value))
                break
    return xs, ys


def validation_passes(run_dir: Path) -> list[ValidationPass]:
    """Every validation dump of a method, by step."""
    folder = run_dir / "val_generations"
    files = sorted(folder.glob("*.jsonl"), key=lambda p: int(p.stem)) if folder.exists() else []
    return [read_validation_pass(p) for p in files]


# ------------------------------------------------------------------------------------------------ report
def _fmt_ci(value, ci, pct=False) -> str:
    if value is None:
        return "n/a"
    scale = 100.0 if pct else 1.0
    unit = "%" if pct else ""
    text = f"{value * scale:.3f}{unit}" if not pct else f"{value * scale:.1f}{unit}"
    if ci is not None and all(np.isfinite(ci)):
        text += f" [{ci[0] * scale:.3f}, {ci[1] * scale:.3f}]" if not pct else f" [{ci[0] * scale:.1f}, {ci[1] * scale:.1f}]"
    return text


def write_report(out: Path, methods: list[str], *, n_boot: int = 2000, plots: bool = True) -> dict:
    """Figures, ``summary.json`` and ``summary.md`` for the methods' runs under ``out``.

    Figures (PNG, all methods on shared axes): ``val_auc_mean.png`` (validation AUC-mean vs step, Figure 1 b-c),
    ``val_accuracy.png`` (validation mean@k), ``train_auc_mean.png`` (training batch ``capo/auc_mean``),
    ``entropy.png`` (``actor/entropy``).

    Returns:
        the summary dict written to ``summary.json``.

    Raises:
        FileNotFoundError: a method has neither metrics nor validation dumps under ``out/<method>``.
    """
    runs = {}
    for m in methods:
        run_dir = out / m
        metrics = read_metrics(run_dir / "metrics.jsonl")
        passes = validation_passes(run_dir)
        if not metrics and not passes:
            raise FileNotFoundError(f"{run_dir}: no metrics.jsonl and no val_generations/ (run the method first)")
        runs[m] = {"metrics": metrics, "passes": passes}

    summary: dict = {"methods": {}, "differences": {}, "min_mixed_questions": MIN_MIXED_QUESTIONS}
    for m, r in runs.items():
        passes = r["passes"]
        entry = {"passes": [pass_summary(p, n_boot=n_boot) for p in passes]}
        done = out / m / "done.json"
        if done.exists():
            entry["run"] = json.loads(done.read_text())
        summary["methods"][m] = entry
    # differences of every method against the first one at the last common validation step
    base = methods[0]
    for m in methods[1:]:
        pa = {p.step: p for p in runs[m]["passes"]}
        pb = {p.step: p for p in runs[base]["passes"]}
        common = sorted(set(pa) & set(pb))
        if common:
            step = common[-1]
            diff = paired_difference(pa[step], pb[step], n_boot=n_boot)
            summary["differences"][f"{m} - {base}"] = {"step": step, **diff}
    eval_metrics = out / "eval_report" / "metrics.json"
    if eval_metrics.exists():  # `capo-verl eval score` of the final checkpoints on the held-out set
        scored = json.loads(eval_metrics.read_text())
        summary["held_out_eval"] = {
            "report": "eval_report/report.md",
            "methods": {m: {k: scored[m]["all"].get(k) for k in ("n_questions", "k", "mean_acc", "auc_mean",
                                                                 "n_mixed_questions", "its_accuracy")}
                        | {"precision_coverage_area": scored[m]["all"]["precision_coverage"]["area"]}
                        for m in methods if m in scored},
        }
    (out / "summary.json").write_text(json.dumps(summary, indent=2, default=float))
    (out / "summary.md").write_text(_summary_markdown(summary, methods))
    if plots:
        _plots(out, runs)
    return summary


def _summary_markdown(summary: dict, methods: list[str]) -> str:
    lines = ["# capo-verl compare", ""]
    lines += ["Validation: per question, ROC-AUC of the response's lpm against correctness over its samples, "
              "averaged over questions with both outcomes (AUC-mean), and mean accuracy (mean@k). Brackets: 95% "
              f"percentile bootstrap over validation questions (2000 resamples). AUC-mean over fewer than "
              f"{MIN_MIXED_QUESTIONS} mixed questions is marked *too few to judge*.", ""]
    lines += ["| method | step | questions (mixed) | AUC-mean | accuracy |", "|---|---|---|---|---|"]
    for m in methods:
        passes = summary["methods"][m]["passes"]
        for p in ([passes[0], passes[-1]] if len(passes) > 1 else passes):
            auc = _fmt_ci(p["auc_mean"], p["auc_mean_ci"])
            if not p["auc_judgeable"]:
                auc += " *too few to judge*"
            lines.append(f"| {m} | {p['step']} | {p['n_questions']} ({p['n_mixed']}) | {auc} | "
                         f"{_fmt_ci(p['accuracy'], p['accuracy_ci'], pct=True)} |")
    if summary["differences"]:
        lines += ["", "Differences at the last common validation step (paired bootstrap over the same questions):", "",
                  "| difference | step | AUC-mean | accuracy (points) |", "|---|---|---|---|"]
        for name, d in summary["differences"].items():
            lines.append(f"| {name} | {d['step']} | {_fmt_ci(d['auc_mean_diff'], d['auc_mean_diff_ci'])} | "
                         f"{_fmt_ci(d['accuracy_diff'], d['accuracy_diff_ci'], pct=True)} |")
    held_out = summary.get("held_out_eval")
    if held_out:
        lines += ["", f"Held-out evaluation of the final checkpoints (`capo-verl eval`; full report: "
                  f"[{held_out['report']}]({held_out['report']}), with precision-coverage and inference-time scaling):",
                  "", "| method | questions x k (mixed) | AUC-mean | mean@k | precision-coverage area | "
                  "ITS: perplexity consistency | ITS: majority vote |", "|---|---|---|---|---|---|---|"]
        for m, e in held_out["methods"].items():
            auc = "n/a" if e["auc_mean"] is None else f"{e['auc_mean']:.3f}"
            its = e.get("its_accuracy") or {}
            lines.append(f"| {m} | {e['n_questions']} x {e['k']} ({e['n_mixed_questions']}) | {auc} | "
                         f"{100 * e['mean_acc']:.1f}% | {e['precision_coverage_area']:.3f} | "
                         f"{100 * its.get('ppl_consistency', float('nan')):.1f}% | "
                         f"{100 * its.get('majority_vote', float('nan')):.1f}% |")
    runs = [(m, summary["methods"][m].get("run")) for m in methods]
    if any(r for _, r in runs):
        lines += ["", "Runs:", ""]
        for m, r in runs:
            if r:
                lines.append(f"- {m}: {r.get('wall_s', 0) / 60:.1f} min of training (command in {m}/done.json)")
    return "\n".join(lines) + "\n"


def _plots(out: Path, runs: dict) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    def figure(name, title, ylabel, getter, smooth=0):
        fig, ax = plt.subplots(figsize=(5.5, 3.6))
        drawn = False
        for m, r in runs.items():
            xs, ys, lo, hi = getter(r)
            if xs:
                drawn = True
                if smooth and len(ys) >= smooth:  # raw per-step values faint, trailing moving average bold
                    line = ax.plot(xs, ys, lw=0.8, alpha=0.35)[0]
                    avg = np.convolve(ys, np.ones(smooth) / smooth, mode="valid")
                    ax.plot(xs[smooth - 1:], avg, color=line.get_color(), lw=2, label=f"{m} ({smooth}-step mean)")
                    continue
                line = ax.plot(xs, ys, marker="o", ms=3, label=m)[0]
                if lo is not None:
                    ax.fill_between(xs, lo, hi, color=line.get_color(), alpha=0.15)
        ax.set_xlabel("training step")
        ax.set_ylabel(ylabel)
        ax.set_title(title)
        if drawn:
            ax.legend()
        ax.grid(alpha=0.3)
        fig.tight_layout()
        fig.savefig(out / name, dpi=120)
        plt.close(fig)

    def val_getter(key, ci_key):
        def get(r):
            ps = [pass_summary(p, n_boot=500) for p in r["passes"]]
            ps = [p for p in ps if p[key] is not None]
            xs = [p["step"] for p in ps]
            ys = [p[key] for p in ps]
            lo = [p[ci_key][0] for p in ps]
            hi = [p[ci_key][1] for p in ps]
            return xs, ys, lo, hi
        return get

    def metric_getter(suffix, prefix=""):
        def get(r):
            xs, ys = series(r["metrics"], suffix, prefix)
            return xs, ys, None, None
        return get

    figure("val_auc_mean.png", "validation AUC-mean (95% bootstrap band)", "AUC-mean",
           val_getter("auc_mean", "auc_mean_ci"))
    figure("val_accuracy.png", "validation accuracy mean@k (95% bootstrap band)", "accuracy",
           val_getter("accuracy", "accuracy_ci"))
    figure("train_auc_mean.png", "training batch AUC-mean (capo/auc_mean)", "AUC-mean",
           metric_getter("capo/auc_mean"), smooth=5)
    figure("entropy.png", "actor entropy", "entropy (nats)", metric_getter("actor/entropy"), smooth=5)


# ---------------------------------------------------------------------------------------------- training
def train_env(metrics_path: Path) -> dict[str, str]:
    """Environment of a ``verl.trainer.main_ppo`` child process: this one's, plus verl's file logger writing to
    ``metrics_path``, CPU thread counts (``OMP_NUM_THREADS``, ``TQ_NUM_THREADS``) unless already set, and full
    Hydra errors."""
    import psutil

    env = dict(os.environ)
    env.setdefault("OMP_NUM_THREADS", str(len(os.sched_getaffinity(0))))
    env.setdefault("TQ_NUM_THREADS", str(min(8, psutil.cpu_count(logical=False) or 1)))
    env.setdefault("TOKENIZERS_PARALLELISM", "false")
    env.update(VERL_FILE_LOGGER_PATH=str(metrics_path), HYDRA_FULL_ERROR="1", PYTHONUNBUFFERED="1")
    return env


def train_command(method: str, config_name: str, config_dir: Path, run_dir: Path, overrides: list[str]) -> list[str]:
    """The ``python -m verl.trainer.main_ppo`` command of one method (see :data:`METHODS`)."""
    return [
        sys.executable, "-m", "verl.trainer.main_ppo",
        f"--config-path={config_dir}", f"--config-name={config_name}",
        *METHODS[method].overrides,
        f"++trainer.experiment_name={method}",
        "++trainer.logger=[console,file]",
        f"++trainer.default_local_dir={run_dir / 'ckpt'}",
        f"++trainer.validation_data_dir={run_dir / 'val_generations'}",
        *overrides,
    ]


def run_method(method: str, out: Path, config_name: str, config_dir: Path, overrides: list[str]) -> Path:
    """Train one method (skipped when ``<out>/<method>/done.json`` exists); returns its run folder.

    Raises:
        RuntimeError: verl's trainer exited non-zero (the log's path is in the message).
    """
    run_dir = out / method
    done = run_dir / "done.json"
    if done.exists():
        print(f"[compare] {method}: finished earlier ({done}), not trained again", flush=True)
        return run_dir
    if run_dir.exists():  # an interrupted run: start it over, so every method runs the same steps
        shutil.rmtree(run_dir)
    run_dir.mkdir(parents=True)
    cmd = train_command(method, config_name, config_dir, run_dir, overrides)
    log_path = run_dir / "train.log"
    print(f"[compare] {method}: training ({METHODS[method].description}); log {log_path}", flush=True)
    t0 = time.time()
    with open(log_path, "w") as log:
        proc = subprocess.run(cmd, cwd=run_dir, env=train_env(run_dir / "metrics.jsonl"), stdout=log,
                              stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    wall = time.time() - t0
    if proc.returncode != 0:
        tail = "".join(log_path.read_text(errors="replace").splitlines(keepends=True)[-25:])
        raise RuntimeError(f"{method}: verl's trainer exited with {proc.returncode} after {wall:.0f} s; "
                           f"log {log_path}; last lines:\n{tail}")
    done.write_text(json.dumps({"method": method, "wall_s": wall, "command": shlex.join(cmd)}, indent=2))
    print(f"[compare] {method}: done in {wall / 60:.1f} min", flush=True)
    return run_dir


def final_hf_checkpoint(run_dir: Path) -> Path:
    """``<run>/ckpt/global_step_<last>/actor/huggingface`` (needs ``checkpoint.save_contents`` with hf_model).

    Raises:
        FileNotFoundError: no checkpoint with Hugging Face weights.
    """
    steps = sorted((run_dir / "ckpt").glob("global_step_*"), key=lambda p: int(p.name.rsplit("_", 1)[1]))
    for step in reversed(steps):
        hf = step / "actor" / "huggingface"
        if any(hf.glob("*.safetensors")):
            return hf
    raise FileNotFoundError(
        f"{run_dir / 'ckpt'}: no checkpoint with Hugging Face weights; set "
        "actor_rollout_ref.actor.checkpoint.save_contents=[model,hf_model] and trainer.save_freq (or --no-eval)"
    )


def evaluate(out: Path, methods: list[str], eval_data: Path, *, k: int, max_new_tokens: int) -> Path:
    """``capo-verl eval generate`` on every method's final checkpoint, then ``eval score`` on all of them."""
    files = []
    for m in methods:
        target = out / m / "eval_generations.jsonl"
        if not (out / m / "eval_done").exists():
            model = final_hf_checkpoint(out / m)
            cmd = [sys.executable, "-m", "capo_verl.cli", "eval", "generate", "--model", str(model),
                   "--data", str(eval_data), "-k", str(k), "--max-new-tokens", str(max_new_tokens),
                   "--temperature", "1.0", "--seed", "0", "--dtype", "bfloat16", "--no-progress", "--out", str(target)]
            print(f"[compare] {m}: eval generate on {eval_data.name} (k={k})", flush=True)
            subprocess.run(cmd, check=True, stdin=subprocess.DEVNULL)
            (out / m / "eval_done").write_text(shlex.join(cmd) + "\n")
        files.append(f"{m}={target}")
    report = out / "eval_report"
    subprocess.run([sys.executable, "-m", "capo_verl.cli", "eval", "score", "--generations", *files,
                    "--out", str(report)], check=True, stdin=subprocess.DEVNULL)
    return report


# -------------------------------------------------------------------------------------------------- CLI
def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="capo-verl compare",
        description="Train several methods with verl's trainer under identical settings and compare their "
        "calibration (validation AUC-mean, accuracy, training AUC-mean, entropy) with bootstrap intervals.",
        epilog="methods: " + "; ".join(f"{k}: {v.description}" for k, v in METHODS.items()),
    )
    p.add_argument("--methods", nargs="+", default=["grpo", "capo"], choices=sorted(METHODS),
                   help="methods to train, in order; differences are reported against the first (default: grpo capo)")
    p.add_argument("--out", required=True, help="output folder (one sub-folder per method, summary, figures)")
    p.add_argument("--config", default=DEFAULT_CONFIG,
                   help=f"config name in --config-dir (default {DEFAULT_CONFIG}); with another config, give "
                   "data.train_files / data.val_files (and actor_rollout_ref.model.path) as overrides")
    p.add_argument("--config-dir", default=str(CONFIG_DIR), help="folder of the config (default: configs/)")
    p.add_argument("--steps", type=int, default=None, help="trainer.total_training_steps (default: the config's)")
    p.add_argument("--data-dir", default=None,
                   help="where the default config's data is written (default ~/data/capo/compare)")
    p.add_argument("--plot-only", action="store_true", help="only redraw figures and summary from existing logs")
    p.add_argument("--no-eval", action="store_true", help="skip `capo-verl eval` of the final checkpoints")
    p.add_argument("--eval-k", type=int, default=8, help="samples per held-out problem in the evaluation (default 8)")
    p.add_argument("--n-boot", type=int, default=2000, help="bootstrap resamples (default 2000)")
    p.add_argument("overrides", nargs="*", help="Hydra overrides for every method, e.g. trainer.test_freq=5")
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    out = Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    if args.plot_only:
        write_report(out, args.methods, n_boot=args.n_boot)
        print((out / "summary.md").read_text())
        return 0

    overrides = list(args.overrides)
    if args.steps is not None:
        overrides.append(f"++trainer.total_training_steps={args.steps}")
    eval_data = None
    if args.config == DEFAULT_CONFIG:
        from capo_verl.models import smollm2_checkpoint, write_gsm8k_calc_parquet

        data_dir = Path(args.data_dir or Path.home() / "data" / "capo" / "compare").resolve()
        train, val = write_gsm8k_calc_parquet(data_dir, n_train=1024, n_val=MIN_VAL_QUESTIONS, n_test=64, seed=0)
        eval_data = data_dir / "gsm8k_calc_test.parquet"
        defaults = [f"data.train_files={train}", f"data.val_files={val}"]
        if not any(o.lstrip("+").startswith("actor_rollout_ref.model.path=") for o in overrides):
            defaults.append(f"actor_rollout_ref.model.path={smollm2_checkpoint()}")
        overrides = defaults + overrides
    _check_validation_size(args.config, Path(args.config_dir), overrides)

    (out / "compare.json").write_text(json.dumps(
        {"argv": sys.argv[1:] if argv is None else argv, "methods": args.methods, "config": args.config,
         "overrides": overrides}, indent=2))
    for m in args.methods:
        run_method(m, out, args.config, Path(args.config_dir), overrides)
    if not args.no_eval:
        if eval_data is None:
            print("[compare] no held-out evaluation set for a custom --config: skipping `capo-verl eval`", flush=True)
        else:
            report = evaluate(out, args.methods, eval_data, k=args.eval_k,
                              max_new_tokens=_composed(args.config, Path(args.config_dir), overrides).data.max_response_length)
            print(f"[compare] held-out evaluation: {report / 'report.md'}", flush=True)
    write_report(out, args.methods, n_boot=args.n_boot)
    print((out / "summary.md").read_text())
    return 0


def _composed(config_name: str, config_dir: Path, overrides: list[str]):
    import verl  # noqa: F401  loads the capo-verl plugin, as verl's launcher does
    from hydra import compose, initialize_config_dir

    with initialize_config_dir(config_dir=str(config_dir.resolve()), version_base=None):
        return compose(config_name=config_name, overrides=overrides)


def _check_validation_size(config_name: str, config_dir: Path, overrides: list[str]) -> None:
    """Warn when validation cannot measure AUC-mean well (fewer than 64 problems x 8 samples, or greedy)."""
    cfg = _composed(config_name, config_dir, overrides)
    val = cfg.actor_rollout_ref.rollout.val_kwargs
    if not val.do_sample or float(val.temperature) <= 0:
        raise ValueError("capo-verl compare needs sampled validation: set actor_rollout_ref.rollout.val_kwargs."
                         "do_sample=true and temperature > 0 (the paper: 1.0)")
    if int(val.n) < MIN_VAL_SAMPLES:
        print(f"[compare] warning: actor_rollout_ref.rollout.val_kwargs.n={val.n} < {MIN_VAL_SAMPLES}: "
              "few samples per question for a per-question AUC", flush=True)


if __name__ == "__main__":
    sys.exit(main())
