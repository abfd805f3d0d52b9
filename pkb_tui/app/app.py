"""PkbApp: the dashboard. Four screens as modes (Launch, Live, History, Monitor), each keeping its
state while another is shown; Result, Compare, Help and the quit question are pushed on top."""

from __future__ import annotations

import gc
import logging
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from textual import on
from textual.app import App, SystemCommand
from textual.binding import Binding
from textual.reactive import reactive
from textual.screen import Screen
from textual.widget import AwaitMount

from pkb_tui.app.batch import BatchQueue
from pkb_tui.app.catalog import Catalog
from pkb_tui.app.config import AppConfig
from pkb_tui.app.format import status_mark
from pkb_tui.app.live_state import LiveState
from pkb_tui.app.messages import BatchBegan, BatchEnded, EngineEvent, QueueIdle
from pkb_tui.engine import events as ev
from pkb_tui.engine.request import RunRequest
from pkb_tui.errors import PkbError
from pkb_tui.store import Store

FULL_COLLECTION_S = 30.0  # how often the dashboard runs Python's full collection, between frames

log = logging.getLogger("pkb_tui.app")


class PkbApp(App[int]):
    TITLE = "pkb-tui"
    CSS_PATH = str(Path(__file__).with_name("app.tcss"))  # absolute: subclasses (tests) find it too
    ENABLE_COMMAND_PALETTE = True  # ctrl+p: the main actions by name (get_system_commands)

    BINDINGS = [
        Binding("l", "show('launch')", "Launch", show=False),
        Binding("v", "show('live')", "Live", show=False),
        Binding("h", "show('history')", "History", show=False),
        Binding("m", "show('monitor')", "Monitor", show=False),
        Binding("G", "show('generate')", "Generate", show=False),
        Binding("question_mark,f1", "help", "Help", key_display="?"),
        Binding("q", "quit", "Quit"),
        Binding("ctrl+q", "quit", "Quit", show=False, priority=True),
    ]

    # One line the nav bar shows on every screen: what the batch is doing.
    batch_summary: reactive[str] = reactive("idle")

    def __init__(self, db_path: Path | str | None = None, *, config: AppConfig | None = None) -> None:
        if config is None:
            if db_path is None:
                raise ValueError("PkbApp needs a db_path or a config")
            config = AppConfig(db_path=Path(db_path))
        self.config = config
        self.store = Store(config.db_path)  # reads only; the launcher has its own connection
        self.batch = BatchQueue(self)
        self.catalog: Catalog | None = None
        self._quit_when_idle = False
        self._end_mode_hold: Callable[[bool], None] | None = None  # see delay_update
        self._switching_mode = False
        self.monitor_telemetry: Any = None  # the Monitor screen's own sampler while it runs
        self.exporter: Any = None  # the Prometheus exporter (config.prometheus)
        super().__init__()

    # ------------------------------------------------------------------ screens
    def get_default_screen(self) -> Screen:  # the screen under the modes: never shown
        return Screen()

    def on_mount(self) -> None:
        from pkb_tui.app.screens.generate import GenerateScreen
        from pkb_tui.app.screens.history import HistoryScreen
        from pkb_tui.app.screens.launch import LaunchScreen
        from pkb_tui.app.screens.live import LiveScreen
        from pkb_tui.app.screens.monitor import MonitorScreen

        for mode, screen_class in (("launch", LaunchScreen), ("live", LiveScreen), ("history", HistoryScreen),
                                   ("monitor", MonitorScreen), ("generate", GenerateScreen)):
            self.add_mode(mode, self._fresh(screen_class))
        self.switch_mode("launch")
        if self.config.prometheus:
            self._serve_metrics(self.config.prometheus)
        if self.config.freeze_startup:
            self.call_after_refresh(self._freeze_startup)

    def _freeze_startup(self) -> None:
        """Start-up's garbage collected, the rest (alive for the app's life) frozen, and Python's
        full collection taken out of the frames (AppConfig.freeze_startup): it walks every live
        object (24-43 ms with a full 8 x 18 ring on a 2-core box, bench/tui_render.py), so it runs
        every FULL_COLLECTION_S right after a refresh, when the next 4 Hz frame is ~250 ms away."""
        gc.collect()
        gc.freeze()
        young, middle, _ = gc.get_threshold()
        gc.set_threshold(young, middle, 1_000_000)  # no automatic full pass (a million gen-1 passes)
        self.set_interval(FULL_COLLECTION_S, lambda: self.call_after_refresh(gc.collect))

    def live_telemetry(self) -> Any:
        """The sampler running now: the batch's, else the Monitor's (None: neither)."""
        return self.batch.telemetry or self.monitor_telemetry

    def _serve_metrics(self, address: str) -> None:
        from collectors.prometheus import serve

        try:
            self.exporter = serve(address, self.live_telemetry)
        except PkbError as exc:
            self.notify(str(exc), title="Prometheus", severity="error", timeout=10)
            return
        self.notify(f"Metrics at {self.exporter.url} while a batch runs or Monitor is shown.", title="Prometheus")

    def _fresh(self, screen_class: type[Screen]) -> Callable[[], Screen]:
        """A factory for a mode's screen. Textual re-parses every stylesheet of the app when a new
        screen first shows (to load the screen's own CSS); ours have none (one app stylesheet, and
        new widgets' default CSS is parsed lazily anyway), so the screen is stamped as up to date:
        that re-parse was ~40% of the time History took to open the first time."""

        def make() -> Screen:
            return self._up_to_date(screen_class())

        return make

    def _up_to_date(self, screen: Screen) -> Screen:
        screen._css_update_count = self._css_update_count
        return screen

    def show(self, screen: Screen, callback: Callable[[Any], None] | None = None) -> None:
        """Push a screen over the current one (see _fresh for why it is stamped)."""
        self.push_screen(self._up_to_date(screen), callback)

    def delay_update(self, delay: float = 0.05) -> None:
        """Textual's switch_mode calls this first: it holds every paint for a fixed 50 ms, so that
        a screen half built never shows, then repaints the whole screen. switch_mode (below) ends
        the hold instead once the new screen has handled its ScreenResume, i.e. when it is whole
        (compose, mount and the data read come before that in its queue). Ending it there, ahead
        of the draw that the screen queues while resuming, means that draw is shown rather than
        thrown away and redone: History's first open drew its whole screen twice, and any mode
        showed 50 ms late. The timer stays as a backstop, longer than Textual's so a slow first
        build is not drawn half done; it repaints everything as Textual's does. Called from
        anywhere else (the command palette, say), Textual's own is kept."""
        if not self._switching_mode:
            super().delay_update(delay)
            return
        self._begin_batch()
        ended = False

        def end(refresh: bool) -> None:
            nonlocal ended
            if ended:
                return
            ended = True
            self._end_batch()
            if refresh and not self._batch_count:
                self.screen.refresh()

        self._end_mode_hold = end
        self.set_timer(max(delay, 0.5), lambda: end(True), name="delay_update")

    def switch_mode(self, mode: str) -> AwaitMount:
        self._end_mode_hold = None
        self._switching_mode = True
        try:
            await_mount = super().switch_mode(mode)
        finally:
            self._switching_mode = False
        end, self._end_mode_hold = self._end_mode_hold, None
        if end is not None:
            # Queued behind the ScreenResume switch_mode just posted. No repaint of our own: the
            # resume asks for a full one, after any draw thrown away during the hold.
            if not self.screen.call_later(end, False):
                end(True)
        return await_mount

    def get_system_commands(self, screen: Screen) -> Iterable[SystemCommand]:
        """The command palette (ctrl+p): the main actions by name, then Textual's own."""
        for mode, what in (("launch", "pick tasks and models, set options, run"),
                           ("live", "the batch in progress"), ("history", "every run, compare, leaderboard"),
                           ("monitor", "live GPU telemetry with no run")):
            yield SystemCommand(f"Show {mode.title()}", f"Open the {mode.title()} screen: {what}",
                                lambda mode=mode: self.action_show(mode))
        screen_actions = (("launch", "Run the batch", "Launch the marked tasks x the chosen models"),
                          ("cancel", "Cancel the run", "Stop the run in progress (queued ones are cancelled)"),
                          ("delete", "Delete runs", "Delete the marked or highlighted runs"),
                          ("compare", "Compare two runs", "Side by side: mark two runs first"),
                          ("toggle_board", "Leaderboard", "Per model: correct, fast_1, fast_1.5, geomean"))
        for action, title, help_text in screen_actions:
            if hasattr(screen, f"action_{action}"):
                yield SystemCommand(title, help_text, lambda action=action: self.call_later(screen.run_action, action))
        yield SystemCommand("Help", "Every key of this screen", self.action_help)
        yield SystemCommand("Quit", "Close the dashboard (asks first while a run is in progress)",
                            lambda: self.call_later(self.action_quit))
        for command in super().get_system_commands(screen):
            if command.title != "Quit":
                yield command

    def action_show(self, mode: str) -> None:
        if self.current_mode != mode:
            self.switch_mode(mode)
        else:
            # Already here: close whatever is pushed on top (a result, a comparison).
            while len(self.screen_stack) > 1:
                self.pop_screen()

    def action_help(self) -> None:
        from pkb_tui.app.screens.help import HelpScreen

        if not isinstance(self.screen, HelpScreen):
            self.show(HelpScreen())

    def open_result(self, run_id: int) -> None:
        from pkb_tui.app.screens.result import ResultScreen

        self.show(ResultScreen(run_id))

    def open_compare(self, run_a: int, run_b: int) -> None:
        from pkb_tui.app.screens.compare import CompareScreen

        self.show(CompareScreen(run_a, run_b))

    # ------------------------------------------------------------------ batches
    def launch(self, request: RunRequest) -> bool:
        """Queue a batch; False (and the reason shown) when the request cannot run."""
        try:
            planned = self.batch.submit(request)
        except PkbError as exc:
            self.notify(str(exc), title="Cannot launch", severity="error", timeout=10)
            return False
        ahead = len(self.batch.pending) - 1 + (1 if self.batch.state.running else 0)
        where = f" (queued behind {ahead} batch(es))" if ahead > 0 else ""
        self.notify(f"{planned} run(s) launched{where}.", title="Launch")
        if ahead <= 0 and self.config.contention_check is not None:
            warnings = self.config.contention_check()
            if warnings:
                self.notify("; ".join(warnings) + ". Timings will suffer.", title="Something else is running",
                            severity="warning", timeout=15)
        self._update_summary()
        self.switch_mode("live")
        return True

    @on(BatchBegan)
    def _batch_began(self, message: BatchBegan) -> None:
        request = message.request
        self.batch.state = LiveState.for_batch(
            message.items, world_size=request.world_size, mode=request.mode, dtype=request.dtype,
            size=request.size, started_at=self.config.clock(),
        )
        self._update_summary()

    @on(EngineEvent)
    def _engine_event(self, message: EngineEvent) -> None:
        event = message.event
        if isinstance(event, ev.SharedMachine):
            self.notify(event.message + ".", title="Another batch", severity="warning", timeout=15)
        elif isinstance(event, ev.DatabaseLost):
            self.notify(event.message + ".", title="Database lost", severity="error", timeout=30)
        self.batch.state.apply(event, message.run_id)
        self._update_summary()

    @on(BatchEnded)
    def _batch_ended(self, message: BatchEnded) -> None:
        state = self.batch.state
        state.finish(status=message.status, finished_at=self.config.clock(), statuses=message.statuses,
                     failure=message.failure)
        if message.failure:
            self.notify(message.failure, title="Batch failed", severity="error", timeout=15)
        else:
            counts = state.counts()
            text = ", ".join(f"{status_mark(s)} {n} {s}" for s, n in sorted(counts.items()))
            self.notify(text or "no runs", title=f"Batch {message.status}")
        self._update_summary()
        self.refresh_history()
        # A batch of one run, watched to its end: show its result (failures included).
        from pkb_tui.app.screens.live import LiveScreen

        if (len(state.runs) == 1 and state.runs[0].run_id is not None and message.status != "interrupted"
                and isinstance(self.screen, LiveScreen) and not self._quit_when_idle):
            self.open_result(state.runs[0].run_id)

    @on(QueueIdle)
    def _queue_idle(self, message: QueueIdle) -> None:
        self.batch.busy = False
        if self._quit_when_idle:
            self.exit(0)
            return
        if self.batch.pending:  # submitted while the worker was returning
            self.batch.busy = True
            self.run_worker(self.batch._drain, thread=True, group="batch", name="batch", exit_on_error=False)
        self._update_summary()

    def _update_summary(self) -> None:
        state = self.batch.state
        if self._quit_when_idle:
            self.batch_summary = "stopping…"
        elif state.running:
            line = state.current
            done = sum(1 for r in state.runs if r.status not in ("queued", "running"))
            what = f" {line.task}·{line.model}" if line else " starting"
            queued = f" +{len(self.batch.pending)} queued" if self.batch.pending else ""
            self.batch_summary = f"▶ {done}/{len(state.runs)}{what}{queued}"
        elif self.batch.busy:
            self.batch_summary = "▶ starting"
        else:
            self.batch_summary = "idle"

    def delete_runs(self, run_ids: list[int]) -> list[int]:
        """Delete runs (the app's store only reads; a short-lived writer does it). Raises PkbError."""
        with Store(self.config.db_path, recover=False) as store:
            deleted = store.delete_runs(run_ids)
        self.refresh_history()
        return deleted

    def refresh_history(self) -> None:
        """Screens that list runs reload when shown; the one on view now reloads at once."""
        reload = getattr(self.screen, "reload", None)
        if reload is not None:
            reload()

    # ------------------------------------------------------------------ quitting
    async def action_quit(self) -> None:
        if not self.batch.busy:
            self.exit(0)
            return
        from pkb_tui.app.screens.confirm import ConfirmScreen

        if isinstance(self.screen, ConfirmScreen):
            return  # already asking

        def answered(stop: bool | None) -> None:
            if not stop:
                return
            if not self.batch.busy:  # the batch ended while the question was open: nothing to stop
                self.exit(0)
                return
            self._quit_when_idle = True
            self.batch.cancel()
            self._update_summary()
            self.notify("Stopping the run; the app closes when its ranks are down.", title="Quitting")

        self.show(
            ConfirmScreen("A run is in progress. Stop it and quit? The run in progress is recorded as "
                          "interrupted, runs not started yet as cancelled.", yes="Stop and quit", no="Keep running"),
            answered,
        )

    def _handle_exception(self, error: Exception) -> None:
        # An error the user can act on (a database damaged past its header shows only when a
        # screen reads a damaged page) closes the app with its one sentence, not a traceback.
        if isinstance(error, PkbError):
            log.error("closing on: %s", error)
            self.exit(return_code=error.exit_code, message=f"pkb-tui: {error}")
            return
        super()._handle_exception(error)

    def on_unmount(self) -> None:
        if self.exporter is not None:
            self.exporter.close()
        self.store.close()
