"""capo-verl's log records reach the console in every process of a Ray run, printed once.

Why: in verl's TaskRunner (where the trainer runs), importing vLLM's OpenAI server imports
``model_hosting_container_standards`` (``logging_config.py``), which sets the root logger and its handlers to
``SAGEMAKER_CONTAINER_LOG_LEVEL``, ERROR by default. A ``capo_verl`` logger left at NOTSET inherits that level, so
its warnings (e.g. ``capo_verl/compat/advantage.py``'s reference-policy line) were dropped before any handler saw
them.

What :func:`install` does, once per process (``capo_verl/__init__.py`` calls it at ``import capo_verl``, which the
``verl.plugins`` entry point triggers in the launcher, the TaskRunner and every worker):

- sets the ``capo_verl`` logger to INFO if it is NOTSET (a level set by the user is kept);
- adds :class:`ConsoleHandler` to it, which writes ``LEVEL capo_verl...: message`` to stderr only for a record that
  no other handler on the record's way up (its own logger, then its parents as long as ``propagate`` holds) would
  print at its level. When the root logger does print (a launcher that configured logging), the record is printed
  there once, not twice; when the root logger's handlers are at ERROR, this handler prints it. Propagation is left
  on, so a user's handlers (files, structured logs) still receive every record.
"""

from __future__ import annotations

import logging
import sys

__all__ = ["LOGGER_NAME", "ConsoleHandler", "install"]

#: The logger every capo-verl module logs under (``capo_verl`` or a child of it).
LOGGER_NAME = "capo_verl"


class ConsoleHandler(logging.StreamHandler):
    """A stderr handler that stays silent for a record another handler on its propagation path will print."""

    def __init__(self):
        super().__init__(sys.stderr)
        self.setFormatter(logging.Formatter("%(levelname)s %(name)s: %(message)s"))

    def _printed_elsewhere(self, record: logging.LogRecord) -> bool:
        node: logging.Logger | None = logging.getLogger(record.name)
        while node is not None:
            for handler in node.handlers:
                if handler is not self and record.levelno >= handler.level:
                    return True
            if not node.propagate:
                return False
            node = node.parent
        return False

    def emit(self, record: logging.LogRecord) -> None:
        if self._printed_elsewhere(record):
            return
        self.stream = sys.stderr  # pytest's capsys and Ray's log redirection replace sys.stderr
        super().emit(record)


def install() -> logging.Logger:
    """Give the ``capo_verl`` logger its :class:`ConsoleHandler` and, if NOTSET, level INFO. Idempotent.

    Returns:
        the ``capo_verl`` logger.
    """
    logger = logging.getLogger(LOGGER_NAME)
    if logger.level == logging.NOTSET:
        logger.setLevel(logging.INFO)
    if not any(isinstance(h, ConsoleHandler) for h in logger.handlers):
        logger.addHandler(ConsoleHandler())
    return logger
