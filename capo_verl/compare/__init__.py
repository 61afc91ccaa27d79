"""``capo-verl compare``: train several methods with verl's own trainer under identical settings, then compare
their calibration (paper section 5, Figure 1 b-c) on shared axes, with bootstrap intervals.

One command (or ``python -m capo_verl.compare ...``)::

    capo-verl compare --methods grpo capo --out runs/compare_cpu [HYDRA_OVERRIDE ...]

0. checks everything before writing or training anything (:mod:`.cli`, :mod:`.config`, :mod:`.outdir`): the
   arguments, every method's composed config (Hydra, verl's ``validate_config``), and the output folder, which
   compare marks as its own and never mixes settings in (a finished method is reused only with equal settings),
1. writes the data once (GSM8K one-step calculations: train / 64 validation / 64 held-out evaluation problems,
   :func:`capo_verl.data.write_gsm8k_calc_parquet`) unless ``--config`` names another config,
2. trains each method in turn with ``python -m verl.trainer.main_ppo`` on the same base config (default
   ``compare_smollm2_135m_cpu``, shipped in the package), data order, seeds, model, batch and step budget: the only
   difference between the runs is the method's overrides (:data:`METHODS`). verl's file logger writes one JSON
   line per step (``<out>/<method>/metrics.jsonl``); validation samples with their lpm are dumped to
   ``<out>/<method>/val_generations/<step>.jsonl`` (:mod:`.running`),
3. right after each method's training: scores its checkpoints on the teacher-forced pool (``--teacher-forced``)
   and runs ``capo-verl eval generate`` on its final checkpoint (held-out set), so that a finished method's small
   outputs are complete without its checkpoints; then ``capo-verl eval score`` on all methods together
   (``<out>/eval_report/``),
4. draws the figures and writes ``summary.md`` / ``summary.json`` (:func:`write_report`, :mod:`.report`);
   ``--plot-only`` does only this, from existing logs.

Per-question statistics (AUC-mean, accuracy) come with a 95% percentile-bootstrap interval over validation
questions (:func:`bootstrap_ci`, :mod:`.statistics`); the difference between two methods resamples the same
questions for both (paired: every method is validated on the same problems).
"""

from capo_verl.compare.cli import build_parser, main, make_plan
from capo_verl.compare.config import (
    CONFIG_DIR,
    DEFAULT_CONFIG,
    MIN_VAL_QUESTIONS,
    MIN_VAL_SAMPLES,
    UsageError,
    checked_config,
    compose,
    find_config_dir,
)
from capo_verl.compare.methods import METHODS, Method
from capo_verl.compare.outdir import MARKER, RUN_MARKER, prepare_out
from capo_verl.compare.report import read_metrics, read_validation_pass, series, validation_passes, write_report
from capo_verl.compare.running import (
    evaluate,
    final_hf_checkpoint,
    generate_heldout,
    run_method,
    train_command,
    train_env,
)
from capo_verl.compare.statistics import (
    MIN_MIXED_QUESTIONS,
    ValidationPass,
    bootstrap_ci,
    paired_difference,
    pass_summary,
)

__all__ = [
    "CONFIG_DIR",
    "DEFAULT_CONFIG",
    "MARKER",
    "METHODS",
    "MIN_MIXED_QUESTIONS",
    "MIN_VAL_QUESTIONS",
    "MIN_VAL_SAMPLES",
    "RUN_MARKER",
    "Method",
    "UsageError",
    "ValidationPass",
    "bootstrap_ci",
    "build_parser",
    "checked_config",
    "compose",
    "evaluate",
    "final_hf_checkpoint",
    "find_config_dir",
    "generate_heldout",
    "main",
    "make_plan",
    "paired_difference",
    "pass_summary",
    "prepare_out",
    "read_metrics",
    "read_validation_pass",
    "run_method",
    "series",
    "train_command",
    "train_env",
    "validation_passes",
    "write_report",
]
