"""The batch queue: requests the user launched, run one after another by the engine's Launcher in
a thread worker, so the interface never waits on a run.

Engine events are posted to the app as messages (post_message is thread-safe) and folded into the
LiveState on the app's thread. Cancel sets the launcher's cancel event: it kills the ranks and
records the run as interrupted; batches still queued are dropped.
"""

from __future__ import annotations

import logging
import threading
import traceback
from collections import deque
from typing import TYPE_CHECKING, Any

from pkb_tui.app.live_state import LiveState
from pkb_tui.app.messages import BatchBegan, BatchEnded, EngineEvent, QueueIdle
from pkb_tui.engine.request import RunRequest
from pkb_tui.errors import PkbError

if TYPE_CHECKING:
    from pkb_tui.app.app import PkbApp

log = logging.getLogger("pkb_tui.app")


class BatchQueue:
    def __init__(self, app: PkbApp) -> None:
        self.app = app
        self.pending: deque[RunRequest] = deque()
        self.cancel_event = threading.Event()
        self.launcher: Any = None  # the Launcher of the batch running now
        self.state = LiveState()
        self.busy = False  # a thread worker is draining the queue
        self.telemetry_override: Any = None  # tests: a fixed telemetry source for the Live screen

    # ------------------------------------------------------------------ main thread
    def submit(self, request: RunRequest) -> int:
        """Check the request (raises PkbError with the sentence to show), queue it, start the
        worker if idle. Returns the number of runs it plans."""
        items = self.app.config.launcher(self.app.config.db_path, self.app.config.runs_dir).plan(request)
        self.pending.append(request)
        if not self.busy:
            self.busy = True
            self.cancel_event = threading.Event()
            self.app.run_worker(self._drain, thread=True, group="batch", name="batch", exit_on_error=False)
        return len(items)

    def cancel(self) -> bool:
        """Stop the batch running now and drop the queued ones. False if nothing runs."""
        if not self.busy:
            return False
        self.pending.clear()
        self.cancel_event.set()
        return True

    @property
    def telemetry(self) -> Any:
        if self.telemetry_override is not None:
            return self.telemetry_override
        launcher = self.launcher
        return getattr(launcher, "telemetry", None) if launcher is not None else None

    # ------------------------------------------------------------------ batch thread
    def _drain(self) -> None:
        app = self.app
        try:
            while self.pending and not self.cancel_event.is_set():
                request = self.pending.popleft()
                launcher = app.config.launcher(app.config.db_path, app.config.runs_dir)
                self.launcher = launcher
                try:
                    items = launcher.plan(request)
                    app.post_message(BatchBegan([(i.task, i.model) for i in items], request))
                    outcome = launcher.run(
                        request, on_event=lambda event, run_id: app.post_message(EngineEvent(event, run_id)),
                        cancel=self.cancel_event,
                    )
                except PkbError as exc:
                    app.post_message(BatchEnded({}, status="error", failure=str(exc)))
                    continue
                except Exception as exc:  # the app must outlive any launcher bug
                    log.error("batch failed:\n%s", traceback.format_exc())
                    app.post_message(BatchEnded({}, status="error", failure=f"The launcher failed: {exc!r}."))
                    continue
                finally:
                    self.launcher = None
                status = "interrupted" if self.cancel_event.is_set() else "finished"  # the batch's, not a run's
                app.post_message(BatchEnded(dict(outcome.statuses), status=status, failure=outcome.not_stored_sentence))
        finally:
            # A message, not call_from_thread: it must arrive after the BatchEnded posted above.
            app.post_message(QueueIdle())
