"""Messages that cross from the batch thread to the screens. Small and typed, posted with
post_message (thread-safe), handled on the app's thread."""

from __future__ import annotations

from textual.message import Message

from pkb_tui.engine.events import Event
from pkb_tui.engine.request import RunRequest


class EngineEvent(Message):
    """One worker event, with the run it belongs to (None for batch-level events)."""

    def __init__(self, event: Event, run_id: int | None) -> None:
        super().__init__()
        self.event = event
        self.run_id = run_id


class BatchBegan(Message):
    """The batch thread took a request off the queue and the launcher is starting its ranks."""

    def __init__(self, items: list[tuple[str, str]], request: RunRequest) -> None:
        super().__init__()
        self.items = items
        self.request = request


class BatchEnded(Message):
    """A batch ended: statuses per run, or the sentence saying why the launcher failed."""

    def __init__(self, statuses: dict[int, str], *, status: str, failure: str | None = None) -> None:
        super().__init__()
        self.statuses = statuses
        self.status = status
        self.failure = failure


class QueueIdle(Message):
    """The batch thread has nothing left to run and has returned."""
