"""The library's messages go to ``logging.getLogger("surecl")``.

A program using surecl as a library configures logging as it does for any library (INFO shows
progress notes such as ``after <task>: ...``; warnings reach stderr through Python's default
handler even unconfigured). The ``surecl`` command attaches :func:`console` for its run: each
record is one ``surecl: ...`` line (``surecl: warning: ...`` from WARNING up) on stderr,
written through ``tqdm.write`` so it lands above the progress bars instead of through them.
"""

from __future__ import annotations

import contextlib
import logging
import sys
from collections.abc import Iterator

logger = logging.getLogger("surecl")


class _ConsoleFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        prefix = "surecl: warning: " if record.levelno >= logging.WARNING else "surecl: "
        return prefix + record.getMessage()


class TqdmHandler(logging.Handler):
    """Write each record with ``tqdm.write`` to the current ``sys.stderr``."""

    def emit(self, record: logging.LogRecord) -> None:
        try:
            from tqdm.auto import tqdm

            tqdm.write(self.format(record), file=sys.stderr)
        except Exception:  # logging's contract: a handler never raises
            self.handleError(record)


@contextlib.contextmanager
def console(level: int = logging.INFO) -> Iterator[logging.Handler]:
    """Show the ``surecl`` logger's records on the console while the block runs (the CLI)."""
    handler = TqdmHandler(level)
    handler.setFormatter(_ConsoleFormatter())
    old = logger.level
    logger.addHandler(handler)
    if logger.getEffectiveLevel() > level:
        logger.setLevel(level)
    try:
        yield handler
    finally:
        logger.removeHandler(handler)
        logger.setLevel(old)
