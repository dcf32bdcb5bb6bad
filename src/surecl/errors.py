"""User-facing errors.

Anything a user can cause (bad file, bad option, missing data) raises :class:`SureclError`
with a one-line message; the CLI prints it and exits with code 2 instead of a traceback.
"""


class SureclError(Exception):
    """An error caused by the user's input or environment, reported in one line."""


class RunBusy(SureclError):
    """Another live process holds the run folder's lock (:func:`surecl.checkpoint.run_lock`);
    ``holder`` names it (``another surecl process (host H, pid P)``)."""

    def __init__(self, message: str, holder: str = "another surecl process") -> None:
        super().__init__(message)
        self.holder = holder
