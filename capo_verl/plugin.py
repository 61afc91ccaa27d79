"""Entry point of group ``verl.plugins`` (see pyproject.toml), loaded by ``import verl`` in every process.

verl's ``verl/__init__.py`` imports each ``verl.plugins`` entry point at ``import verl``, so the launcher,
the Ray TaskRunner (where ``compute_advantage`` runs) and every worker get the patches and the
registered estimators, with nothing for the user to import.
"""

from capo_verl import compat

compat.install()

import capo_verl.estimator  # noqa: E402,F401  registers `capo` and `grpo_mask` with verl
