"""Errors a user can cause or meet. The CLI prints these as one line, never a traceback."""


class RingSGDError(Exception):
    """Base class: a failure ringsgd can explain in one sentence."""


class UsageError(RingSGDError, ValueError):
    """Bad input from the user (arguments, files, environment)."""


class DataError(UsageError):
    """A data set file is missing, truncated or not in the expected format."""


class CheckpointError(UsageError):
    """A checkpoint is missing, truncated or corrupt."""


class WorkerFailure(RingSGDError, RuntimeError):
    """One or more worker processes failed; the message names the ranks and why."""


class CommError(RingSGDError, RuntimeError):
    """A collective failed or timed out (usually: a peer worker died)."""
