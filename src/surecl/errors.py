"""User-facing errors, and the words they use for starting a run over.

Anything a user can cause (bad file, bad option, missing data) raises :class:`SureclError`
with a one-line message; the CLI prints it and exits with code 2 instead of a traceback.
"""

import contextlib
import contextvars


class SureclError(Exception):
    """An error caused by the user's input or environment, reported in one line."""


class RunBusy(SureclError):
    """Another live process holds the run folder's lock (:func:`surecl.checkpoint.run_lock`);
    ``holder`` names it (``another surecl process (host H, pid P)``)."""

    def __init__(self, message: str, holder: str = "another surecl process") -> None:
        super().__init__(message)
        self.holder = holder


START_OVER: contextvars.ContextVar[str | None] = contextvars.ContextVar("surecl_start_over", default=None)
"""How the command that opened the run folder starts its run over, where an error says so; None:
``--fresh`` (``surecl run``; ``fresh=True`` from Python). ``surecl sweep``, which has no ``--fresh``,
sets its own words while its runs open their folders."""


def start_over(default: str = "rerun with --fresh") -> str:
    """The remedy an error names for training the run again from the start: the command's own
    (:data:`START_OVER`), else ``default``."""
    return START_OVER.get() or default


@contextlib.contextmanager
def starting_over(words: str):
    """:data:`START_OVER` is ``words`` inside (a sweep's runs), as before after."""
    token = START_OVER.set(words)
    try:
        yield
    finally:
        START_OVER.reset(token)
