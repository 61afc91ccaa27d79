"""See :mod:`capo_verl.compat`."""


def install() -> None:
    """Apply this module's patches (none yet)."""
