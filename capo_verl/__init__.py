"""capo-verl: CAPO (Calibration-Aware Policy Optimization) for verl.

``import verl`` comes first: it loads this package's ``verl.plugins`` entry point (:mod:`capo_verl.plugin`),
which installs :mod:`capo_verl.compat` and registers the estimators, before any other module of this
package runs.
"""

import verl  # noqa: F401

__version__ = "0.1.0"
