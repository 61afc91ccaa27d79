"""Reports of ``capo-verl compare``: reading verl's logs of each method (file logger metrics, validation dumps),
``summary.json`` / ``summary.md`` with bootstrap intervals, and the figures on shared axes."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import numpy as np

from capo_verl.compare.statistics import (
    MIN_MIXED_QUESTIONS,
    ValidationPass,
    paired_difference,
    pass_summary,
)
from capo_verl.curves import draw_series, finish_axes, png_bytes
from capo_verl.outputs import write_atomic
from capo_verl.stored import COMPRESSED, read_bytes, read_text, stored

#: files and folders that a report (and the held-out evaluation) writes into the output folder
REPORT_OUTPUTS = (
    "summary.json",
    "summary.md",
    "val_auc_mean.png",
    "val_accuracy.png",
    "train_auc_mean.png",
    "entropy.png",
    "eval_report",
)


#: marks a run's ``val_generations/0.jsonl`` as the seed's step-0 pass (``compare --share-step0``): ``{"from":
#: "<step-0 folder>/val_generations/0.jsonl", "sha256": ...}``, the path relative to the seed's folder
SHARED_STEP0 = "0.shared.json"


def validation_dump(folder: Path, step: int) -> Path:
    """The validation dump of ``step`` in a run's ``val_generations`` ``folder``: ``<step>.jsonl``, or
    ``<step>.jsonl.xz`` / ``.gz`` where only a compressed one exists (a committed unit's dumps are kept compressed:
    ``benchmarks/collect_compare.py --compress-dumps``); for step 0 of a run that took its seed's step-0 pass
    (:data:`SHARED_STEP0` beside it) and holds no copy of its own (a committed unit keeps the one file), the file
    the marker names, after checking that its SHA-256 is the recorded one.

    Returns ``<folder>/<step>.jsonl`` when there is no such file (``.exists()`` then tells).

    Raises:
        ValueError: the shared step-0 pass the marker names differs from the recorded SHA-256, or is missing.
    """
    dump = stored(folder / f"{step}.jsonl")
    marker = folder / SHARED_STEP0
    if dump.exists() or step != 0 or not marker.exists():
        return dump
    import hashlib

    record = json.loads(marker.read_text())
    named = folder.parent.parent / record["from"]  # the hash is of the file as named: compressed or not
    source = named if named.suffix in COMPRESSED else stored(named)
    if not source.exists():
        raise ValueError(f"{marker}: the step-0 pass it names, {source}, is missing")
    data = source.read_bytes() if named.suffix in COMPRESSED else read_bytes(source)
    if hashlib.sha256(data).hexdigest() != record["sha256"]:
        raise ValueError(f"{marker}: {source} is not the step-0 pass this run took (its SHA-256 differs)")
    return source


def plain_step0_record(marker: Path) -> dict:
    """The record of a :data:`SHARED_STEP0` ``marker`` as a committed unit keeps it: naming the plain dump
    (``step0/val_generations/0.jsonl``) with the SHA-256 of its text, which holds whichever form the dump is stored
    in. A marker that names a compressed file by that file's own SHA-256 (a run that took a committed pass,
    :func:`capo_verl.compare.running.share_step0`) is given so after checking the file; any other is returned as it
    is.

    Raises:
        ValueError: the compressed file it names is missing or is not the file it recorded (SHA-256).
    """
    import hashlib

    record = json.loads(marker.read_text())
    named = marker.parent.parent.parent / record["from"]
    if named.suffix not in COMPRESSED:
        return record
    if not named.exists() or hashlib.sha256(named.read_bytes()).hexdigest() != record["sha256"]:
        raise ValueError(f"{marker}: {named} is missing or not the file it recorded (SHA-256); left as it is")
    plain = str(Path(record["from"]).with_suffix(""))
    return {**record, "from": plain, "sha256": hashlib.sha256(read_bytes(named)).hexdigest()}


def validation_steps(folder: Path) -> list[int]:
    """The steps of a run's validation dumps in its ``val_generations`` ``folder`` (plain or compressed; step 0
    also where only its :data:`SHARED_STEP0` marker is kept), sorted."""
    if not folder.exists():
        return []
    dump = re.compile(r"(\d+)\.jsonl(\.xz|\.gz)?")
    steps = {int(m.group(1)) for p in folder.glob("*.jsonl*") if (m := dump.fullmatch(p.name))}
    if (folder / SHARED_STEP0).exists():
        steps.add(0)
    return sorted(steps)


def dump_lines(path: str | os.PathLike) -> list[str]:
    r"""The lines of a JSON-lines file (a validation dump, held-out generations, a metrics log), plain or
    compressed (``.xz``, ``.gz``; ``path`` without it reads ``path.xz`` or ``path.gz`` where only that exists,
    :func:`capo_verl.stored.stored`), split at ``"\n"`` only. ``path`` is a ``str`` or a path object.

    verl writes its dumps with ``json.dumps(..., ensure_ascii=False)`` (verl 0.9.1 ``trainer/ppo/ray_trainer.py``,
    ``_write_generations``), so a response may hold U+2028, U+2029 or U+0085 unescaped: ``str.splitlines`` would cut
    such a line in two.

    Returns:
        The file's lines without their ``"\n"``; the last one is ``""`` when the file ends with ``"\n"`` (callers
        skip blank lines).

    Raises:
        FileNotFoundError: no file at ``path`` (nor at ``path.xz``, ``path.gz``).
        UnicodeDecodeError: the text is not UTF-8.
        capo_verl.inputs.NotADataFile: a compressed file that is not of its format, is cut short or has a corrupt
            body.
    """
    return read_text(path).split("\n")


def read_validation_pass(path: Path) -> ValidationPass:
    """Read verl's validation dump (``trainer.validation_data_dir``/<step>.jsonl, one line per sample; or its
    compressed ``<step>.jsonl.xz`` / ``.gz``).

    Needs the fields ``input`` (prompt text: the question key), ``lpm`` (added by capo_verl.compat.validation) and
    ``acc`` (the reward's correctness) or else ``score`` (> 0.5 = correct).

    Raises:
        ValueError: a line without ``lpm``, or no line at all.
    """
    groups: dict[str, tuple[list[float], list[bool]]] = {}
    for line in dump_lines(path):
        if not line.strip():
            continue
        row = json.loads(line)
        if row.get("lpm") is None:
            raise ValueError(
                f"{path}: a validation sample has no 'lpm' (actor_rollout_ref.rollout.calculate_log_probs)"
            )
        outcome = row["acc"] if "acc" in row else row["score"]
        lp, c = groups.setdefault(str(row["input"]), ([], []))
        lp.append(float(row["lpm"]))
        c.append(float(outcome) > 0.5)
    if not groups:
        raise ValueError(f"{path}: no validation samples")
    keys = sorted(groups)
    return ValidationPass(
        step=int(path.name.split(".")[0]),
        questions=keys,
        lpm=[np.asarray(groups[k][0], dtype=np.float64) for k in keys],
        correct=[np.asarray(groups[k][1], dtype=bool) for k in keys],
    )


def read_metrics(path: Path) -> dict[int, dict]:
    """verl's file logger (``VERL_FILE_LOGGER_PATH``): ``{step: {metric: value}}``, lines of a step merged."""
    steps: dict[int, dict] = {}
    if not stored(path).exists():
        return steps
    for line in dump_lines(path):
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
    return [read_validation_pass(validation_dump(folder, step)) for step in validation_steps(folder)]


def _fmt_ci(value, ci, pct=False) -> str:
    if value is None:
        return "n/a"
    scale, unit, digits = (100.0, "%", 1) if pct else (1.0, "", 3)
    text = f"{value * scale:.{digits}f}{unit}"
    if ci is not None and all(np.isfinite(ci)):
        text += f" [{ci[0] * scale:.{digits}f}, {ci[1] * scale:.{digits}f}]"
    return text


def write_report(out: Path, methods: list[str], *, n_boot: int = 2000, plots: bool = True) -> dict:
    """Figures, ``summary.json`` and ``summary.md`` for the methods' runs under ``out``.

    Figures (PNG, all methods on shared axes): ``val_auc_mean.png`` (validation AUC-mean vs step, Figure 1 b-c),
    ``val_accuracy.png`` (validation mean@k), ``train_auc_mean.png`` (training batch ``capo/auc_mean``),
    ``entropy.png`` (``actor/entropy``). Every interval, in the tables and the figures' bands, uses ``n_boot``
    resamples.

    Returns:
        the summary dict written to ``summary.json``.

    Raises:
        FileNotFoundError: a method has neither metrics nor validation dumps under ``out/<method>``.
        ValueError: ``n_boot < 1``.
    """
    if n_boot < 1:
        raise ValueError(f"n_boot must be >= 1, got {n_boot}")
    runs = {}
    for m in methods:
        run_dir = out / m
        metrics = read_metrics(run_dir / "metrics.jsonl")
        passes = validation_passes(run_dir)
        if not metrics and not passes:
            raise FileNotFoundError(f"{run_dir}: no metrics.jsonl and no val_generations/ (run the method first)")
        runs[m] = {"metrics": metrics, "passes": passes}

    summary: dict = {"methods": {}, "differences": {}, "min_mixed_questions": MIN_MIXED_QUESTIONS, "n_boot": n_boot}
    for m, r in runs.items():
        passes = r["passes"]
        entry = {"passes": [pass_summary(p, n_boot=n_boot) for p in passes]}
        done = out / m / "done.json"
        if done.exists():  # without the recorded settings (the composed config: long, and in done.json anyway)
            entry["run"] = {k: v for k, v in json.loads(done.read_text()).items() if k != "settings"}
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
            "methods": {
                m: {
                    k: scored[m]["all"].get(k)
                    for k in (
                        "n_questions",
                        "k",
                        "mean_acc",
                        "pass_at_k",
                        "auc_mean",
                        "n_mixed_questions",
                        "its_accuracy",
                    )
                }
                | {"precision_coverage_area": scored[m]["all"]["precision_coverage"]["area"]}
                for m in methods
                if m in scored
            },
        }
    # each file whole (a temporary sibling, then one rename): a reader never sees a half-written summary
    write_atomic(out / "summary.json", json.dumps(summary, indent=2, default=float))
    write_atomic(out / "summary.md", _summary_markdown(summary, methods))
    if plots:
        _plots(out, runs, n_boot=n_boot)
    return summary


def _summary_markdown(summary: dict, methods: list[str]) -> str:
    lines = ["# capo-verl compare", ""]
    lines += [
        "Validation: per question, ROC-AUC of the response's lpm against correctness over its samples, "
        "averaged over questions with both outcomes (AUC-mean), and mean accuracy (mean@k). Brackets: 95% "
        f"percentile bootstrap over validation questions ({summary['n_boot']} resamples). AUC-mean over fewer "
        f"than {MIN_MIXED_QUESTIONS} mixed questions is marked *too few to judge*.",
        "",
    ]
    lines += ["| method | step | questions (mixed) | AUC-mean | accuracy |", "|---|---|---|---|---|"]
    for m in methods:
        passes = summary["methods"][m]["passes"]
        for p in [passes[0], passes[-1]] if len(passes) > 1 else passes:
            auc = _fmt_ci(p["auc_mean"], p["auc_mean_ci"])
            if not p["auc_judgeable"]:
                auc += " *too few to judge*"
            lines.append(
                f"| {m} | {p['step']} | {p['n_questions']} ({p['n_mixed']}) | {auc} | "
                f"{_fmt_ci(p['accuracy'], p['accuracy_ci'], pct=True)} |"
            )
    if summary["differences"]:
        lines += [
            "",
            "Differences at the last common validation step (paired bootstrap over the same questions):",
            "",
            "| difference | step | AUC-mean | accuracy (points) |",
            "|---|---|---|---|",
        ]
        for name, d in summary["differences"].items():
            lines.append(
                f"| {name} | {d['step']} | {_fmt_ci(d['auc_mean_diff'], d['auc_mean_diff_ci'])} | "
                f"{_fmt_ci(d['accuracy_diff'], d['accuracy_diff_ci'], pct=True)} |"
            )
    held_out = summary.get("held_out_eval")
    if held_out:
        lines += [
            "",
            f"Held-out evaluation of the final checkpoints (`capo-verl eval`; full report: "
            f"[{held_out['report']}]({held_out['report']}), with precision-coverage and inference-time scaling):",
            "",
            "| method | questions x k (mixed) | AUC-mean | mean@k | pass@k | precision-coverage area | "
            "ITS: perplexity consistency | ITS: majority vote |",
            "|---|---|---|---|---|---|---|---|",
        ]
        for m, e in held_out["methods"].items():
            auc = "n/a" if e["auc_mean"] is None else f"{e['auc_mean']:.3f}"
            its = e.get("its_accuracy") or {}
            pk = e.get("pass_at_k") or {}  # unbiased pass@k at k = the responses per question (none: older scores)
            top = max(pk, key=int) if pk else None
            pass_k = "n/a" if top is None or pk[top] is None else f"{100 * pk[top]:.1f}%"
            lines.append(
                f"| {m} | {e['n_questions']} x {e['k']} ({e['n_mixed_questions']}) | {auc} | "
                f"{100 * e['mean_acc']:.1f}% | {pass_k} | {e['precision_coverage_area']:.3f} | "
                f"{100 * its.get('ppl_consistency', float('nan')):.1f}% | "
                f"{100 * its.get('majority_vote', float('nan')):.1f}% |"
            )
    runs = [(m, summary["methods"][m].get("run")) for m in methods]
    if any(r for _, r in runs):
        lines += ["", "Runs:", ""]
        for m, r in runs:
            if r:
                minutes = r.get("wall_s", 0) / 60
                lines.append(
                    f"- {m}: {minutes:.1f} min in verl's trainer, its validation passes included "
                    f"(command in {m}/done.json)"
                )
    return "\n".join(lines) + "\n"


def _plots(out: Path, runs: dict, *, n_boot: int) -> None:
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
                draw_series(ax, xs, ys, m, lo, hi, smooth=smooth)
        finish_axes(ax, title, ylabel, drawn)
        write_atomic(out / name, png_bytes(fig))

    def val_getter(key, ci_key):
        def get(r):
            ps = [pass_summary(p, n_boot=n_boot) for p in r["passes"]]
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

    figure(
        "val_auc_mean.png",
        "validation AUC-mean (95% bootstrap band)",
        "AUC-mean",
        val_getter("auc_mean", "auc_mean_ci"),
    )
    figure(
        "val_accuracy.png",
        "validation accuracy mean@k (95% bootstrap band)",
        "accuracy",
        val_getter("accuracy", "accuracy_ci"),
    )
    figure(
        "train_auc_mean.png",
        "training batch AUC-mean (capo/auc_mean)",
        "AUC-mean",
        metric_getter("capo/auc_mean"),
        smooth=5,
    )
    figure("entropy.png", "actor entropy", "entropy (nats)", metric_getter("actor/entropy"), smooth=5)
