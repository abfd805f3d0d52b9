"""Monitor: every GPU live, with no run going. A panel per GPU (bars for SM and memory-bandwidth use,
memory, power against its limit, temperature, clocks, PCIe; history graphs over 10 s, 1 min or
10 min, from the ring buffer and from runs.db beyond it), the NVLink heatmap with each GPU's total
against the link limit, the topology matrix, and the processes on the GPUs with a run's ranks marked.

The screen owns its own sampler while shown (recorded into runs.db only while `r` says so); while a
batch runs it shows the launcher's instead, so the GPUs are not sampled twice. Slow reads (topology
and limits once, processes every 2 s, database history when the window changes) run in thread
workers; a frame only reads the ring's new samples and draws text.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any, cast

from rich.text import Text
from textual import work
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, VerticalScroll
from textual.screen import Screen
from textual.widgets import Static

from pkb_tui.app.format import fmt_pct, fmt_rate
from pkb_tui.app.widgets.gpu_history import WINDOWS_S, RateHistory, database_buckets, window_label
from pkb_tui.app.widgets.keybar import KeyBar
from pkb_tui.app.widgets.monitor_views import (
    LinesView,
    MonitorModel,
    gpu_panel_lines,
    graph_columns,
    na_notes,
    nvlink_lines,
    panel_layout,
    process_lines,
    topology_lines,
)
from pkb_tui.app.widgets.nav import NavBar

if TYPE_CHECKING:
    from pkb_tui.app.app import PkbApp

PROCESS_REFRESH_TICKS = 8  # every 2 s at 4 Hz: NVML's process list and /proc cost ~1 ms per GPU
HISTORY_BUCKETS = 60  # until the first layout says how wide a panel's graphs are


class MonitorScreen(Screen):
    BINDINGS = [
        Binding("w", "next_window", "Window"),
        Binding("1", "window(0)", "10 s window", show=False),
        Binding("2", "window(1)", "1 min window", show=False),
        Binding("3", "window(2)", "10 min window", show=False),
        Binding("r", "record", "Record"),
        Binding("p", "pause", "Pause"),
        Binding("n", "jump('monitor-nvlink')", "NVLink"),
        Binding("o", "jump('monitor-processes')", "Processes", show=False),
        Binding("g", "jump('monitor-gpus')", "GPUs", show=False),
    ]

    def __init__(self) -> None:
        super().__init__()
        self.telemetry: Any = None  # ours, started while shown
        self.problem: str | None = None
        self.paused = False
        self.window_index = 0
        self.graph_width = HISTORY_BUCKETS  # one history bucket per graph column: a frame only looks up
        self.history = RateHistory(WINDOWS_S[0], HISTORY_BUCKETS)
        self._fed_ts: float | None = None  # None: the history needs a refill from the ring
        self._fed_source: Any = None
        self._filling = False
        self._history_generation = 0
        self._ticks = 0
        self.processes: list[Any] | None = None
        self.unsupported: dict[int, dict[str, str]] = {}
        self.topology: Any = None
        self.limits: dict[int, Any] = {}
        self._facts_source: Any = None
        self._facts_running = False
        self._shown: dict[str, Text] = {}

    @property
    def pkb(self) -> PkbApp:
        return cast("PkbApp", self.app)

    def compose(self) -> ComposeResult:
        yield NavBar("monitor")
        yield Static("", id="monitor-head")
        yield Static("", id="monitor-notes")
        with VerticalScroll(id="monitor-body"):
            yield LinesView(id="monitor-gpus")
            yield LinesView(id="monitor-host")
            yield LinesView(id="monitor-nvlink")
            with Horizontal(id="monitor-lower"):
                yield LinesView(id="monitor-topology")
                yield LinesView(id="monitor-processes")
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

    # ------------------------------------------------------------------ the sampler
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
        self.pkb.monitor_telemetry = telemetry  # the app's Prometheus exporter serves it too

    def _stop(self) -> None:
        telemetry, self.telemetry = self.telemetry, None
        if getattr(self.pkb, "monitor_telemetry", None) is telemetry:
            self.pkb.monitor_telemetry = None
        if telemetry is not None:
            try:
                telemetry.stop()
            except Exception:
                pass

    def source(self) -> Any:
        return self.pkb.batch.telemetry or self.telemetry

    @work(thread=True, group="monitor-facts")
    def _read_facts(self, source: Any, with_static: bool) -> None:
        """Topology and limits once per sampler; processes and n/a reasons every 2 s (one read at a
        time: a slow NVML does not pile them up)."""
        try:
            if with_static:
                topology = getattr(source, "topology", None)
                limits = getattr(source, "limits", None)
                self.topology = topology() if topology is not None else None
                self.limits = limits() if limits is not None else {}
            processes = getattr(source, "processes", None)
            self.processes = processes() if processes is not None else None
            unsupported = getattr(source, "unsupported", None)
            self.unsupported = unsupported() if unsupported is not None else {}
        except Exception as exc:  # a failed read leaves the last figures; the notes say why
            self.problem = f"could not read GPU facts: {exc}"
        finally:
            self._facts_running = False

    @work(thread=True, group="monitor-history")
    def _refill(self, ring: Any, history: RateHistory, generation: int) -> None:
        """Fold the window's samples into a new history off the app's thread (an hour of ring at
        10 Hz is ~36,000 samples: a few hundred ms), with the part older than the ring from runs.db
        (per-bucket means), then swap it in on the app's thread."""
        latest = ring.latest_per_gpu()
        samples: list[Any] = []
        if latest:
            since = max(s.ts for s in latest.values()) - history.window_s
            oldest = ring.oldest_ts() if hasattr(ring, "oldest_ts") else None
            if oldest is not None and oldest > since and self.pkb.config.db_path is not None:
                history.add_bucket_means(self._database_rows(history, since, oldest))
            samples = ring.snapshot(since_ts=since)
            history.feed(samples)
        last_ts = samples[-1].ts if samples else -float("inf")
        self.app.call_from_thread(self._refilled, history, last_ts, generation)

    def _database_rows(self, history: RateHistory, since: float, until: float) -> list[tuple[int, int, str, float, int]]:
        from pkb_tui.store.store import connect

        try:
            conn = connect(self.pkb.config.db_path, readonly=True)
        except Exception:
            return []  # no database yet: the ring is all there is
        try:
            return database_buckets(conn, history, since, until)
        except Exception:
            return []
        finally:
            conn.close()

    def _refilled(self, history: RateHistory, last_ts: float, generation: int) -> None:
        if generation != self._history_generation:
            return  # the window, the layout or the sampler changed meanwhile: a newer refill is coming
        self.history, self._fed_ts, self._filling = history, last_ts, False

    # ------------------------------------------------------------------ drawing
    def tick(self) -> None:
        if self.paused:
            return
        source = self.source()
        ring = getattr(source, "ring", None)
        if source is not None and source is not self._facts_source:
            self._facts_source, self._facts_running = source, True
            self.topology, self.limits, self.processes, self.unsupported = None, {}, None, {}
            self._read_facts(source, True)
        elif source is not None and self._ticks % PROCESS_REFRESH_TICKS == 0 and not self._facts_running:
            self._facts_running = True
            self._read_facts(source, False)
        self._ticks += 1
        width = self._body_width()
        gpus = len([g for g in (ring.latest_per_gpu() if ring is not None else {}) if g >= 0])
        graph_width = graph_columns(gpus, width) if gpus else self.graph_width
        if graph_width != self.graph_width:  # a new layout: the history is re-bucketed from the ring
            self.graph_width = graph_width
            self._reset_history()
            self._fed_source = None
        if ring is not None:
            self._feed(source, ring)
        latest = ring.latest_per_gpu() if ring is not None else {}
        now = max((s.ts for s in latest.values()), default=self.pkb.config.clock())
        host = latest.get(-1)
        model = MonitorModel(
            latest=latest, names=dict(getattr(source, "gpu_names", {}) or {}), limits=self.limits, topology=self.topology,
            processes=self.processes, rank_pids={r.pid: r.rank for r in host.ranks} if host is not None else {},
            history=self.history, now=now,
        )
        self._draw_head(source, model)
        self._draw_body(source, model)

    def _feed(self, source: Any, ring: Any) -> None:
        """Fold the samples that arrived since the last frame; after a reset, refill in a worker
        (frames meanwhile draw the history there is)."""
        if source is not self._fed_source:
            self._fed_source = source
            self._reset_history()
        if self._fed_ts is None:
            if not self._filling:
                self._filling = True
                self._refill(ring, RateHistory(self.history.window_s, self.history.buckets), self._history_generation)
            return
        fresh = ring.snapshot(since_ts=self._fed_ts)
        if fresh:
            self.history.feed(fresh)
            self._fed_ts = fresh[-1].ts
        if self._ticks % 40 == 0 and self.history.last_ts is not None:
            self.history.prune(self.history.last_ts)

    def _reset_history(self) -> None:
        self.history = RateHistory(WINDOWS_S[self.window_index], self.graph_width)
        self._fed_ts = None
        self._filling = False
        self._history_generation += 1

    def _draw_head(self, source: Any, model: MonitorModel) -> None:
        head = Text(no_wrap=True, overflow="ellipsis")
        batch = self.pkb.batch.telemetry is not None
        if self.pkb.config.telemetry is None and source is None:
            head.append("Telemetry is switched off for this session.", style="dim")
        elif self.problem and source is None:
            head.append(self.problem, style="yellow")
        else:
            kind = getattr(source, "source", None) or "?"
            head.append(f"telemetry: {kind}", style="bold")
            head.append(f" · window {window_label(self.history.window_s)}")
            if batch:
                head.append(" · ● recorded with the run", style="red")
            elif getattr(source, "recording", False):
                head.append(" · ● recording to runs.db", style="bold red")
            else:
                head.append(" · ○ not recorded", style="dim")
            if self.paused:
                head.append(" · paused", style="yellow")
            head.append(" · the running batch's sampler" if batch else " · sampled while shown", style="dim")
        self._update_static("#monitor-head", head)
        notes: list[str] = []
        reason = getattr(source, "reason", None)
        if reason:
            notes.append(reason)
        if self.problem and source is not None:
            notes.append(self.problem)
        notes += na_notes(self.unsupported, model.gpus)
        self._update_static("#monitor-notes", Text("\n".join(notes), style="dim", no_wrap=True, overflow="ellipsis"))
        self.query_one("#monitor-notes", Static).display = bool(notes)

    def _update_static(self, selector: str, text: Text) -> None:
        """Update a Static only when its text changed: an update costs a layout pass of the screen."""
        if self._shown.get(selector) != text:
            self._shown[selector] = text
            self.query_one(selector, Static).update(text)

    def _body_width(self) -> int:
        body = self.query_one("#monitor-body", VerticalScroll)
        return max(40, body.size.width - 1 if body.size.width else self.size.width - 2)

    def _draw_body(self, source: Any, model: MonitorModel) -> None:
        body = self.query_one("#monitor-body", VerticalScroll)
        width = self._body_width()
        height = max(10, body.size.height or self.size.height - 4)
        gpus = model.gpus
        has_links = any(model.latest[g].links for g in gpus)
        lower = self.query_one("#monitor-lower", Horizontal)
        side = width >= 150
        lower.set_class(not side, "narrow")
        if gpus:
            columns, _ = panel_layout(len(gpus), width)
            rows = math.ceil(len(gpus) / columns)
            share = 0.5 if has_links else 0.75
            per_panel = max(5, int(height * share) // rows)
            self.query_one("#monitor-gpus", LinesView).set_lines(gpu_panel_lines(model, width, per_panel))
        else:
            self.query_one("#monitor-gpus", LinesView).set_lines(
                [Text("no GPU samples yet" if source is not None else "no telemetry", style="dim")])
        self.query_one("#monitor-host", LinesView).set_lines(_host_lines(model))
        self.query_one("#monitor-nvlink", LinesView).set_lines(nvlink_lines(model, width) if gpus else [])
        half = width // 2 - 1 if side else width
        self.query_one("#monitor-topology", LinesView).set_lines(topology_lines(model, half) if has_links else [])
        self.query_one("#monitor-processes", LinesView).set_lines(process_lines(model, half) if gpus else [])

    # ------------------------------------------------------------------ actions
    def action_pause(self) -> None:
        self.paused = not self.paused
        self.notify("Paused." if self.paused else "Resumed.")
        self.tick() if not self.paused else self._draw_head(self.source(), MonitorModel(latest={}))

    def action_window(self, index: int) -> None:
        self.window_index = index % len(WINDOWS_S)
        self._reset_history()
        self.tick()

    def action_next_window(self) -> None:
        self.action_window(self.window_index + 1)

    def action_jump(self, widget_id: str) -> None:
        self.query_one(f"#{widget_id}").scroll_visible(top=True, animate=False)

    def action_record(self) -> None:
        if self.pkb.batch.telemetry is not None:
            self.notify("The running batch's samples are recorded with the run already.")
            return
        telemetry = self.telemetry
        setter = getattr(telemetry, "set_recording", None)
        if setter is None:
            self.notify("Nothing to record: no sampler is running.", severity="warning")
            return
        if getattr(telemetry, "recording", False):
            setter(None)
            self.notify("Recording stopped.")
        else:
            try:
                setter(self.pkb.config.db_path)
            except Exception as exc:
                self.notify(f"Cannot record into {self.pkb.config.db_path}: {exc}", severity="error")
                return
            self.notify(f"Recording the samples into {self.pkb.config.db_path}.")
        self.tick()


def _host_lines(model: MonitorModel) -> list[Text]:
    host = model.latest.get(-1)
    if host is None:
        return []
    line = Text(no_wrap=True, overflow="ellipsis")
    line.append("host ", style="bold")
    line.append(f"CPU {fmt_pct(host.cpu_pct)} · memory used {fmt_rate(host.host_memory_used_bytes)[:-2]} · "
                f"loopback {fmt_rate(host.loopback_bytes_per_s)}")
    if host.ranks:
        line.append("  ranks' CPU (100% = a core) ", style="dim")
        line.append("  ".join(f"r{r.rank} {fmt_pct(r.cpu_pct)}" for r in host.ranks))
    return [line]
