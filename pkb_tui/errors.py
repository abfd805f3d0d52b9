"""The one exception type a user can hit, and the CLI's exit codes."""

from __future__ import annotations

EXIT_OK = 0
EXIT_CANDIDATE_FAILED = 1
EXIT_USAGE = 2
EXIT_HARNESS = 3
EXIT_NOT_STORED = 4  # the batch ran, but its database went away: its results are in a recovery file


class PkbError(Exception):
    """An error the user can act on: its message is one or two sentences saying what to fix.

    The CLI and the TUI show the message without a traceback (the traceback goes to the log
    and to --verbose). ``exit_code`` says which CLI exit code it maps to.
    """

    exit_code = EXIT_USAGE

    def __init__(self, message: str, *, exit_code: int | None = None) -> None:
        super().__init__(message)
        if exit_code is not None:
            self.exit_code = exit_code


class HarnessError(PkbError):
    """Something in the harness or its environment broke (not the user's input)."""

    exit_code = EXIT_HARNESS
