"""The run statuses, their marks and which of them count as finished: the one list of them.

The CLI, the dashboard and the store all read these; every status has a mark as well as a colour
(app/format.py colours them), so none is told apart by colour alone.
"""

from __future__ import annotations

# queued: planned, its launch not reached yet; running: its ranks are at it;
# passed / failed (a wrong answer) / error (an exception or a crash) / timeout: finished;
# interrupted: stopped while running (cancel, Ctrl-C, a launcher killed);
# cancelled: never started, because the batch was cancelled or stopped before reaching it.
STATUSES = ("queued", "running", "passed", "failed", "error", "timeout", "interrupted", "cancelled")
FINISHED_STATUSES = ("passed", "failed", "error", "timeout")  # a result to show as "last"
UNFINISHED_STATUSES = ("queued", "running")  # what a dead launcher leaves behind

STATUS_MARKS = {
    "passed": "✓",
    "failed": "✗",
    "error": "‼",
    "timeout": "⏱",
    "interrupted": "⊘",
    "cancelled": "⊖",
    "running": "▶",
    "queued": "…",
}


def status_mark(status: str | None) -> str:
    return STATUS_MARKS.get(status or "", "?")


def status_label(status: str | None) -> str:
    """Mark and word, e.g. '✓ passed'."""
    return f"{status_mark(status)} {status or 'unknown'}"


def sql_list(statuses: tuple[str, ...]) -> str:
    """The statuses as an SQL list literal, e.g. ('passed','failed') (fixed names, never user input)."""
    return "(" + ",".join(f"'{s}'" for s in statuses) + ")"
