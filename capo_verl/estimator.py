"""Former single-module home of the estimators, kept so ``import capo_verl.estimator`` and its names keep working.

The estimators live in :mod:`capo_verl.estimators` (one module per method); importing this module registers
them all with verl, as importing that package does.
"""

from capo_verl.estimators import *  # noqa: F401,F403  (registers every estimator)
from capo_verl.estimators import __all__  # noqa: F401
from capo_verl.estimators.common import _CPU_ROW_BLOCK  # noqa: F401
