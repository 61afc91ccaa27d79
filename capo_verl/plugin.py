"""Entry point of group ``verl.plugins`` (see pyproject.toml), loaded by ``import verl`` in every process.

verl's ``verl/__init__.py`` imports each ``verl.plugins`` entry point at ``import verl``, so the launcher,
the Ray TaskRunner (where ``compute_advantage`` runs) and every worker get the patches and the
registered estimators, with nothing for the user to import.
"""

from capo_verl import compat

try:
    compat.install()
finally:
    # Registered even when install() failed: a run that asks for `capo` then stops with the install error
    # (verl's plugin loader hides plugin exceptions at DEBUG level; compat.install logs it at ERROR).
    import capo_verl.estimators  # noqa: F401  registers capo-verl's estimators (capo, grpo_mask, ...) with verl
