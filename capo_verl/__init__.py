"""capo-verl: CAPO (Calibration-Aware Policy Optimization) for verl.

Importing this package, or its pure modules (:mod:`capo_verl.estimators`, :mod:`capo_verl.metrics`,
:mod:`capo_verl.losses.simko`, :mod:`capo_verl.reward`, :mod:`capo_verl.evaluation.score`,
:mod:`capo_verl.cpu.precision`), imports neither verl nor Ray, and importing it loads neither the CPU port
(:mod:`capo_verl.cpu`) nor the study tools (:mod:`capo_verl.compare`, :mod:`capo_verl.evaluation`); see
``docs/architecture.md``. verl finds capo-verl by itself: ``import verl`` loads the ``verl.plugins`` entry point
(:mod:`capo_verl.plugin`), which installs :mod:`capo_verl.compat` (and the CPU port where verl finds no accelerator)
and registers the estimators.

Importing it also gives the ``capo_verl`` logger its console handler (:mod:`capo_verl.logs`), so that capo-verl's
warnings are shown in every process of a Ray run, also where vLLM has set the root logger to ERROR.
"""

from capo_verl import logs as _logs

__version__ = "0.1.0"

_logs.install()
