"""Monitor: live NVLink / PCIe / utilisation for every GPU with no run going. The screen owns its
own sampler (not recorded) while it is shown; while a batch runs it shows the launcher's instead,
so the GPUs are not sampled twice."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, cast

from rich.text import Text
from textual import work
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import VerticalScroll
from textual.screen import Screen
from textual.widgets import Static

from pkb_tui.app.widgets.keybar import KeyBar
from pkb_tui.app.widgets.nav import NavBar
from pkb_tui.app.widgets.telemetry import TelemetryPanel

if TYPE_CHECKING:
    from pkb_tui.app.app import PkbApp


class MonitorScreen(Screen):
    BINDINGS = [
        Binding("p", "pause", "Pause/resume"),
    ]

    def __init__(self) -> None:
        super().__init__()
        self.telemetry: Any = None  # ours, started while shown
        self.problem: str | None = None
        self.paused = False

    @property
    def pkb(self) -> PkbApp:
        return cast("PkbApp", self.app)

    def compose(self) -> ComposeResult:
        yield NavBar("monitor")
        yield Static("", id="monitor-head")
        with VerticalScroll():
            yield TelemetryPanel(detail=True, id="monitor-telemetry")
        yield KeyBar()

    def on_mount(self) -> None:
        self._timer = self.set_interval(self.pkb.config.live_refresh_s, self.tick)

    def on_screen_resume(self) -> None:
        self._timer.resume()
        self._start()
        self.tick()

    def on_screen_suspend(self) -> None:
        self._timer.pause()
        self._stop()

    def on_unmount(self) -> None:
        self._stop()

    @work(thread=True, exclusive=True, group="monitor")
    def _start(self) -> None:
        """NVML start-up can take a while: off the app's thread."""
        factory = self.pkb.config.telemetry
        if factory is None or self.telemetry is not None:
            return
        try:
            telemetry = factory(self.pkb.config.db_path)
            telemetry.start()
        except Exception as exc:  # no collectors, no NVML, no permission: say so, keep going
            self.problem = f"telemetry unavailable: {exc}"
            return
        self.telemetry, self.problem = telemetry, None

    def _stop(self) -> None:
        telemetry, self.telemetry = self.telemetry, None
        if telemetry is not None:
            try:
                telemetry.stop()
            except Exception:
                pass

    def source(self) -> Any:
        return self.pkb.batch.telemetry or self.telemetry

    def tick(self) -> None:
        if self.paused:
            return
        head = Text(no_wrap=True, overflow="ellipsis")
        if self.pkb.config.telemetry is None:
            head.append("Telemetry is switched off for this session.", style="dim")
        elif self.problem:
            head.append(self.problem, style="yellow")
        elif self.pkb.batch.telemetry is not None:
            head.append("Showing the running batch's sampler (recorded with the run).", style="dim")
        else:
            head.append("Every GPU, sampled while this screen is shown (not recorded).", style="dim")
        self.query_one("#monitor-head", Static).update(head)
        self.query_one("#monitor-telemetry", TelemetryPanel).update_from(self.source())

    def action_pause(self) -> None:
        self.paused = not self.paused
        self.notify("Paused." if self.paused else "Resumed.")
