"""Live: the batch in progress. What runs now (task, model), progress bars for the run and the batch
with the time left (from the runs this batch finished), on a multi-node batch one line per node
(host, heartbeat age or "silent for N s", its GPUs' link and its NICs' bytes/s), the per-iteration timing as it streams
(running medians with their intervals, the speedup), the telemetry sparklines at 4 Hz, the kernel
table as soon as a profile is in, the runs of the batch with their marks, and the tail of the
run's log. `x` cancels (the run is recorded as interrupted)."""

from __future__ import annotations

from typing import TYPE_CHECKING, cast

from rich.text import Text
from textual import on
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical, VerticalScroll
from textual.coordinate import Coordinate
from textual.screen import ModalScreen, Screen
from textual.widgets import DataTable, Label, Static

from pkb_tui.app.format import STATUS_STYLES, bar, fmt_duration, fmt_fraction, fmt_us, status_mark, truncate
from pkb_tui.app.live_state import LiveState
from pkb_tui.app.widgets.keybar import KeyBar
from pkb_tui.app.widgets.log_tail import LogTail
from pkb_tui.app.widgets.monitor_views import LinesView
from pkb_tui.app.widgets.nav import NavBar
from pkb_tui.app.widgets.telemetry import TelemetryPanel
from pkb_tui.app.widgets.timing_stream import TimingStream

if TYPE_CHECKING:
    from pkb_tui.app.app import PkbApp

KERNEL_ROWS = 12
KERNEL_FIGURES_WIDTH = 4 + 2 + 5 + 8 + 5  # variant, rank, calls, total, share
KERNEL_EXTRA_WIDTH = 13 + 8  # kind, mean: shown when the name still gets KERNEL_NAME_WIDE
KERNEL_NAME_WIDE = 32


class LiveScreen(Screen):
    BINDINGS = [
        Binding("x", "cancel", "Cancel run"),
        Binding("enter", "open_run", "Open result"),
        Binding("k", "focus_table('live-kernels')", "Kernels"),
        Binding("b", "focus_table('live-runs')", "Batch"),
    ]

    def __init__(self) -> None:
        super().__init__()
        self._seen_version = -1
        self._seen_state: LiveState | None = None
        self._ticks = 0
        self._log_paths: dict[int, str | None] = {}
        self._timing_fed: tuple[int | None, dict[str, int]] = (None, {})  # (run, samples passed on per variant)

    @property
    def pkb(self) -> PkbApp:
        return cast("PkbApp", self.app)

    def compose(self) -> ComposeResult:
        yield NavBar("live")
        yield Static("", id="live-head")
        yield LinesView(id="live-progress")
        yield LinesView(id="live-nodes")
        yield TimingStream(id="live-timing")
        with VerticalScroll(id="live-telemetry-box"):
            yield TelemetryPanel(id="live-telemetry")
        with Horizontal(id="live-lower"):
            with Vertical(id="live-runs-pane"):
                yield Label("Batch", classes="pane-title")
                yield DataTable(id="live-runs", cursor_type="row")
            with Vertical(id="live-kernels-pane"):
                yield Label("Kernels (by total time)", classes="pane-title")
                yield DataTable(id="live-kernels", cursor_type="row", zebra_stripes=True)
        yield Label("Log", classes="pane-title", id="live-log-title")
        yield LogTail(id="live-log")
        yield KeyBar()

    def on_mount(self) -> None:
        runs = self.query_one("#live-runs", DataTable)
        runs.add_column(" ", key="mark", width=1)
        runs.add_column("task", key="task")
        runs.add_column("model", key="model")
        runs.add_column("run", key="run")
        self._kernel_layout: tuple[int, bool] | None = None  # (name width, with kind and mean)
        self._fit_kernel_columns()
        self._timer = self.set_interval(self.pkb.config.live_refresh_s, self.tick)
        self.tick()

    def on_screen_resume(self) -> None:
        self._timer.resume()
        self.tick()

    def on_screen_suspend(self) -> None:
        # Under a dialog (the quit question) Live stays in view: keep it moving. Under a full
        # screen there is nothing to draw.
        if not isinstance(self.app.screen, ModalScreen):
            self._timer.pause()

    # ------------------------------------------------------------------ refresh
    def tick(self) -> None:
        """One refresh: telemetry every tick (4 Hz), the rest when the state changed, the log at 2 Hz."""
        panel = self.query_one("#live-telemetry", TelemetryPanel)
        if self.pkb.batch.telemetry is None and not self.pkb.batch.busy:
            panel.show_message("telemetry shows here while a batch runs; m (Monitor) shows it any time")
        else:
            panel.update_from(self.pkb.batch.telemetry)
        state = self.pkb.batch.state
        if state is not self._seen_state or state.version != self._seen_version:
            self._seen_state, self._seen_version = state, state.version
            self._draw_head(state)
            self._draw_runs(state)
            self._draw_kernels(state)
            self._feed_timing(state)
        self._draw_progress(state)
        self._draw_nodes(state)
        self._ticks += 1
        if self._ticks % 2 == 1:
            self._draw_log(state)

    def _draw_head(self, state: LiveState) -> None:
        head = self.query_one("#live-head", Static)
        now = self.pkb.config.clock()
        if state.started_at is None:
            head.update(Text.assemble(
                ("No run yet. ", "bold"), "Press ", ("l", "bold"), " to pick tasks and models and launch a batch.",
            ))
            return
        line = state.current
        first = Text(no_wrap=True, overflow="ellipsis")
        if state.running and line is not None:
            first.append(f"{status_mark('running')} {line.task}", style="bold")
            first.append(f" · {line.model}")
            if line.run_id is not None:
                first.append(f"  run #{line.run_id}", style="dim")
            first.append(f"  ({(state.current_item or 0) + 1}/{len(state.runs)})", style="dim")
        elif state.running:
            first.append("▶ starting the ranks…", style="bold")
        else:
            first.append(f"Batch {state.batch_status}", style="bold")
            counts = state.counts()
            first.append("  " + "  ".join(f"{status_mark(s)} {n} {s}" for s, n in sorted(counts.items())))
        second = Text(no_wrap=True, overflow="ellipsis")
        elapsed_to = state.finished_at if state.finished_at is not None else now
        second.append(
            f"ws {state.world_size} · {state.mode or 'auto'} · {state.dtype} · {state.size} · "
            f"{fmt_duration(elapsed_to - state.started_at)}",
            style="dim",
        )
        parts = [first, second]
        if self.pkb.batch.pending:
            parts.append(Text(f"… {len(self.pkb.batch.pending)} more batch(es) queued after this one", style="dim"))
        if not state.timings_representative:
            parts.append(Text("⚠ timings not representative in this mode", style="yellow"))
        if state.failure:
            parts.append(Text(f"‼ {state.failure}", style="bold red"))
        for error in state.errors[-2:]:
            where = f"rank {error.rank} " if error.rank is not None else ""
            parts.append(Text(f"‼ {where}{error.where}: {error.message}", style="red", no_wrap=True, overflow="ellipsis"))
        head.update(Text("\n").join(parts))

    def _draw_progress(self, state: LiveState) -> None:
        """Bars for the run and the batch, with the phase and the time left."""
        view = self.query_one("#live-progress", LinesView)
        if not state.running:
            view.set_lines([])
            return
        now = self.pkb.config.clock()
        width = max(40, view.size.width or self.size.width)
        bar_width = max(10, min(40, width // 3))
        item_left, batch_left = state.time_left_s(now)
        fraction = state.item_fraction(now)
        item = Text(no_wrap=True, overflow="ellipsis")
        item.append("run   ", style="bold")
        item.append(bar(fraction, bar_width), style="cyan")
        item.append(f" {fraction * 100:3.0f}% " if fraction is not None else "  n/a ")
        if state.current is not None:
            trial = f"trial {min((state.trial or 0) + (state.phase == 'trial'), state.trials or 0)}/{state.trials or '?'}"
            phase = state.phase or "?"
            if state.variant:
                phase += f" ({state.variant})"
            item.append(f" {trial} · {phase}", style="bold cyan")
        item.append(f"  {_left(item_left)}", style="dim")
        done = sum(1 for line in state.runs if line.status not in ("queued", "running"))
        total = len(state.runs) or 1
        batch_fraction = (done + (fraction or 0.0) * (state.current is not None and state.current.status == "running")) / total
        batch = Text(no_wrap=True, overflow="ellipsis")
        batch.append("batch ", style="bold")
        batch.append(bar(batch_fraction, bar_width), style="green")
        batch.append(f" {batch_fraction * 100:3.0f}%  {done}/{len(state.runs)} runs done  {_left(batch_left)}", style="")
        view.set_lines([item, batch])

    def _draw_nodes(self, state: LiveState) -> None:
        """One line per node of a multi-node batch while it runs; nothing on one node."""
        view = self.query_one("#live-nodes", LinesView)
        if not state.running or len(state.nodes) < 2:
            view.set_lines([])
            return
        view.set_lines(node_lines(state.nodes, self.pkb.config.clock(), state.node_timeout_s,
                                  view.size.width or self.size.width))

    def _feed_timing(self, state: LiveState) -> None:
        """Pass the timing samples that arrived since the last frame on to the timing widget."""
        widget = self.query_one("#live-timing", TimingStream)
        run = state.current.run_id if state.current is not None else None
        fed_run, fed = self._timing_fed
        if run != fed_run or any(len(state.timing_samples.get(v, ())) < n for v, n in fed.items()):
            widget.reset()
            fed = {}
        for variant, samples in state.timing_samples.items():
            new = samples[fed.get(variant, 0):]
            if new:
                widget.add_timing_samples(variant, new)
            fed[variant] = len(samples)
        self._timing_fed = (run, fed)
        if not state.timing_samples:
            widget.show_final(state.timings)

    def add_timing_samples(self, variant: str, samples_us: list[float]) -> None:
        """Per-iteration times (µs per call) of the run going on: kept in the batch's LiveState (so
        they survive a screen switch) and drawn at the next frame."""
        self.pkb.batch.state.add_timing_samples(variant, samples_us)

    def _draw_runs(self, state: LiveState) -> None:
        table = self.query_one("#live-runs", DataTable)
        cursor = table.cursor_row
        table.clear()
        for line in state.runs:
            style = STATUS_STYLES.get(line.status, "")
            table.add_row(
                Text(status_mark(line.status), style=style), truncate(line.task, 18), truncate(line.model, 14),
                f"#{line.run_id}" if line.run_id is not None else "–", key=str(line.item),
            )
        if table.row_count:
            table.move_cursor(row=min(cursor, table.row_count - 1))

    def _fit_kernel_columns(self) -> bool:
        """Fixed columns for the figures, the kernel's name in what is left; kind and mean only
        where there is room (at 80 columns: variant, rank, name, calls, total, share)."""
        table = self.query_one("#live-kernels", DataTable)
        room = table.scrollable_content_region.width or 40
        narrow = KERNEL_FIGURES_WIDTH + 6 * 2
        wide = narrow + KERNEL_EXTRA_WIDTH + 2 * 2
        full = room - wide >= KERNEL_NAME_WIDE
        name_width = max(8, room - (wide if full else narrow))
        if self._kernel_layout == (name_width, full):
            return False
        self._kernel_layout = (name_width, full)
        table.clear(columns=True)
        columns = [("v", "variant", 4), ("rk", "rank", 2), ("kernel", "name", name_width)]
        if full:
            columns.append(("kind", "category", 13))
        columns += [("calls", "calls", 5), ("total", "total", 8)]
        if full:
            columns.append(("mean", "mean", 8))
        columns.append(("share", "share", 5))
        for label, key, width in columns:
            table.add_column(label, key=key, width=width)
        return True

    def on_resize(self) -> None:
        def refit() -> None:
            if self._fit_kernel_columns():
                self._draw_kernels(self.pkb.batch.state)

        self.call_after_refresh(refit)

    def _draw_kernels(self, state: LiveState) -> None:
        table = self.query_one("#live-kernels", DataTable)
        table.clear()
        name_width, full = self._kernel_layout or (32, True)
        for kernel in state.kernels[:KERNEL_ROWS]:
            cells: list = [
                "cand" if kernel.get("variant") == "candidate" else "base", str(kernel.get("rank", "")),
                truncate(str(kernel.get("name", "")), name_width),
            ]
            if full:
                cells.append(kernel.get("category", ""))
            cells += [str(kernel.get("calls", "")), fmt_us(kernel.get("total_us"))]
            if full:
                cells.append(fmt_us(kernel.get("mean_us")))
            cells.append(fmt_fraction(kernel.get("share_fraction")))
            table.add_row(*cells)
        if not state.kernels:
            self.query_one("#live-kernels-pane Label", Label).update("Kernels (after timing)")
        else:
            self.query_one("#live-kernels-pane Label", Label).update(f"Kernels (by total time, {len(state.kernels)})")

    def _draw_log(self, state: LiveState) -> None:
        line = state.current
        if line is None or line.run_id is None:
            self.query_one("#live-log", LogTail).show(None)
            return
        # The path is fixed when the run is created; it moves to the merged log when the run ends.
        path = self._log_paths.get(line.run_id) if line.status == "running" else None
        if path is None:
            try:
                path = self.pkb.store.run(line.run_id).get("log_path")
            except Exception:
                path = None
            self._log_paths[line.run_id] = path
        self.query_one("#live-log-title", Label).update(f"Log  [dim]{path or ''}[/]")
        self.query_one("#live-log", LogTail).show(path)

    # ------------------------------------------------------------------ actions
    def action_focus_table(self, table_id: str) -> None:
        self.query_one(f"#{table_id}", DataTable).focus()

    def action_cancel(self) -> None:
        if not self.pkb.batch.busy:
            self.notify("No run in progress.", severity="warning")
            return
        from pkb_tui.app.screens.confirm import ConfirmScreen

        def answered(stop: bool | None) -> None:
            if stop and self.pkb.batch.cancel():
                self.notify("Cancelling: the ranks are being stopped.", title="Cancel")

        self.pkb.show(ConfirmScreen("Cancel the batch? The run going now is recorded as interrupted.",
                                           yes="Cancel the batch", no="Keep running"), answered)

    def action_open_run(self) -> None:
        table = self.query_one("#live-runs", DataTable)
        state = self.pkb.batch.state
        line = None
        if table.row_count:
            item = int(table.coordinate_to_cell_key(Coordinate(table.cursor_row, 0)).row_key.value or -1)
            line = state.line_for(item, None)
        if line is None or line.run_id is None:
            self.notify("That run has not started yet.", severity="warning")
            return
        if line.status in ("running", "queued"):
            self.notify("That run is still going; its result shows when it ends.", severity="warning")
            return
        self.pkb.open_result(line.run_id)

    @on(DataTable.RowSelected, "#live-runs")
    def _run_selected(self) -> None:
        self.action_open_run()


def _left(seconds: float | None) -> str:
    return "time left n/a (after the first run)" if seconds is None else f"~{fmt_duration(seconds)} left"


def _rate(value: float) -> str:
    for unit, scale in (("GB/s", 1e9), ("MB/s", 1e6), ("kB/s", 1e3)):
        if value >= scale:
            return f"{value / scale:.3g} {unit}"
    return f"{value:.0f} B/s"


def _pair(tx: float | None, rx: float | None, why: str | None) -> Text:
    if tx is None or rx is None:
        return Text(f"n/a: {why or 'not measured'}", style="dim")
    return Text(f"{_rate(tx)} / {_rate(rx)}")


def node_lines(nodes: list[dict], now: float, node_timeout_s: float | None, width: int) -> list[Text]:
    """The nodes of a multi-node batch (LiveState.nodes) as Live shows them: a header, then per
    node its host, how long ago the head heard from it ("silent for N s" once late), its GPUs'
    NVLink bytes/s out / in (summed; PCIe where NVML has no NVLink figure) and its NICs' bytes/s."""
    from pkb_tui.engine.nodes import LATE_AFTER_S

    host_width = max(8, min(24, width // 6))
    heard_width = 18
    column = max(16, (width - 6 - host_width - heard_width - 2) // 2)
    head = Text(no_wrap=True, overflow="ellipsis", style="bold")
    head.append("node  ")
    head.append(f"{'host':<{host_width}} ")
    head.append(f"{'heard':<{heard_width}}")
    head.append(f"{'GPU links out / in':<{column}} ")
    head.append("NIC out / in")
    lines = [head]
    for node in nodes:
        line = Text(no_wrap=True, overflow="ellipsis")
        line.append(f"{node.get('node', '?')!s:<6}")
        line.append(f"{truncate(str(node.get('host') or '?'), host_width):<{host_width}} ")
        heard_at = node.get("heard_at")
        if node.get("node") == 0:
            heard, style = "head", "dim"
        elif heard_at is None:
            heard, style = "not yet", "dim"
        else:
            age = max(0.0, now - float(heard_at))
            if node_timeout_s is not None and age >= node_timeout_s:
                heard, style = f"silent {age:.0f} s: lost", "bold red"
            elif age >= LATE_AFTER_S:
                heard, style = f"silent for {age:.0f} s", "bold yellow"
            else:
                heard, style = f"{age:.1f} s ago", ""
        line.append(f"{heard:<{heard_width}}", style=style)
        if node.get("link_tx_bytes_per_s") is None and node.get("pcie_tx_bytes_per_s") is not None:
            # no NVLink figure (a PCIe box, a VM): the GPUs' PCIe is their link to everything else
            links = Text("PCIe ", style="dim") + _pair(node.get("pcie_tx_bytes_per_s"), node.get("pcie_rx_bytes_per_s"), None)
        else:
            links = _pair(node.get("link_tx_bytes_per_s"), node.get("link_rx_bytes_per_s"), node.get("link_na"))
        gpus = node.get("gpus") or 0
        if gpus:
            links.append(f" ({gpus} GPU{'s' if gpus != 1 else ''})", style="dim")
        links.truncate(column, overflow="ellipsis", pad=True)
        line.append_text(links)
        line.append(" ")
        line.append_text(_pair(node.get("nic_tx_bytes_per_s"), node.get("nic_rx_bytes_per_s"), node.get("nic_na")))
        lines.append(line)
    return lines
