"""The Monitor's views, drawn as text: a panel per GPU (bars and history graphs), the NVLink heatmap
with per-GPU totals against the link limit, the topology matrix, and the processes on the GPUs.

Each view is one line-API widget (LinesView) whose lines are built by a plain function of a
MonitorModel, so 8 GPUs x 18 links is a handful of Text objects per frame, not hundreds of widgets,
and the functions are testable and benchmarkable without a terminal. A figure the device cannot
give is None: drawn as '·' and written 'n/a' (the reason is said once, in the screen's notes).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from rich.segment import Segment
from rich.style import Style
from rich.text import Text
from textual.strip import Strip
from textual.widget import Widget

from pkb_tui.app.format import NA, bar, truncate
from pkb_tui.app.widgets.gpu_history import RateHistory
from pkb_tui.app.widgets.strips import text_segments

TX_STYLE = "cyan"
RX_STYLE = "magenta"
# Heat from idle to the link's limit: dark to hot, readable on dark and light themes.
HEAT = ("#303446", "#1e4f7a", "#1f7a8c", "#2a9d8f", "#8ab17d", "#e9c46a", "#f4a261", "#e76f51", "#d62828")
MIN_PANEL_WIDTH = 38


@dataclass
class MonitorModel:
    """Everything one frame draws. None in a field: not known (yet) or not available."""

    latest: dict[int, Any]  # gpu -> GpuSample (host row: -1)
    names: dict[int, str] = field(default_factory=dict)
    limits: dict[int, Any] = field(default_factory=dict)  # gpu -> collectors.nvml.GpuLimits
    topology: Any = None  # collectors.nvml.NvLinkTopology
    processes: list[Any] | None = None  # collectors.nvml.GpuProcess
    rank_pids: dict[int, int] = field(default_factory=dict)  # pid -> rank of the pkb-tui run going on
    history: RateHistory | None = None
    now: float = 0.0

    @property
    def gpus(self) -> list[int]:
        return sorted(g for g in self.latest if g >= 0)

    def rank_of(self, process: Any) -> int | None:
        rank = self.rank_pids.get(process.pid)
        if rank is None and process.command and "pkb_tui.engine.worker" in process.command:
            return -1  # a pkb-tui rank whose number we do not know (another dashboard's run)
        return rank


class SegLine:
    """A line of (text, style) runs, for the views redrawn every frame: appending is a list append
    and drawing turns each run into one Segment with a cached style, where rich's Text keeps spans
    and re-resolves them on every render (most of a frame's cost with 8 GPUs x 18 links). Only
    single-cell characters are used in these views, so cells = characters."""

    __slots__ = ("parts",)

    def __init__(self, text: str = "", style: str = "") -> None:
        self.parts: list[tuple[str, str]] = [(text, style)] if text else []

    def append(self, text: str, style: str = "") -> SegLine:
        if text:
            self.parts.append((text, style))
        return self

    def append_text(self, other: SegLine | Text) -> SegLine:
        if isinstance(other, Text):
            self.parts.append((other.plain, str(other.style or "")))
        else:
            self.parts.extend(other.parts)
        return self

    @property
    def plain(self) -> str:
        return "".join(text for text, _ in self.parts)

    @property
    def cell_len(self) -> int:
        return sum(len(text) for text, _ in self.parts)

    def fit(self, width: int) -> SegLine:
        """Cropped or padded with spaces to exactly ``width`` cells (a new line)."""
        out = SegLine()
        left = width
        for text, style in self.parts:
            if left <= 0:
                break
            out.parts.append((text[:left], style))
            left -= min(len(text), left)
        if left > 0:
            out.parts.append((" " * left, ""))
        return out

    def __eq__(self, other: object) -> bool:
        return isinstance(other, SegLine) and other.parts == self.parts

    __hash__ = None  # type: ignore[assignment]

    def segments(self, console: Any, base: Style) -> list[Segment]:
        return [Segment(text, _style(console, base, style)) for text, style in self.parts]


_STYLES: dict[tuple[Style, str], Style] = {}


def _style(console: Any, base: Style, style: str) -> Style:
    key = (base, style)
    found = _STYLES.get(key)
    if found is None:
        found = _STYLES[key] = base + console.get_style(style) if style else base
    return found


class LinesView(Widget):
    """A widget showing a list of Text lines, through the line API (one Strip per line, cached)."""

    DEFAULT_CSS = """
    LinesView { height: auto; width: 1fr; }
    """

    def __init__(self, *, id: str | None = None, classes: str | None = None) -> None:
        super().__init__(id=id, classes=classes)
        self._lines: list[Text] | list[SegLine] = []
        self._strips: list[Strip] | None = None
        self._strips_width = 0
        self._base = Style()

    @property
    def lines(self) -> list[Text] | list[SegLine]:
        return self._lines

    def set_lines(self, lines: list[Text] | list[SegLine]) -> None:
        if lines == self._lines:
            return  # unchanged (topology, processes most frames): keep the strips, no repaint
        previous = len(self._lines)
        self._lines, self._strips = lines, None
        self.refresh(layout=len(lines) != previous)

    def render_line(self, y: int) -> Strip:
        width = self.size.width
        if self._strips is None or self._strips_width != width:
            # The base style is read once per rebuild, not per line (it walks the CSS each time).
            base = self._base = self.rich_style
            console = self.app.console
            self._strips = [
                Strip(line.segments(console, base) if isinstance(line, SegLine) else text_segments(line, console, base))
                .adjust_cell_length(width, base)
                for line in self._lines
            ]
            self._strips_width = width
        if y < len(self._strips):
            return self._strips[y]
        return Strip.blank(width, self._base)

    def get_content_height(self, container, viewport, width: int) -> int:
        return len(self._lines)


# ------------------------------------------------------------------------------ small pieces
def _fraction(value: float | None, limit: float | None) -> float | None:
    if value is None or not limit:
        return None
    return value / limit


def _level_style(fraction: float | None) -> str:
    if fraction is None:
        return "dim"
    return "green" if fraction < 0.6 else "yellow" if fraction < 0.85 else "red"


def _gbps(value: float | None) -> str:
    if value is None:
        return NA
    gb = value / 1e9
    return f"{gb:.0f}" if gb >= 100 else f"{gb:.1f}" if gb >= 1 else f"{gb:.2f}"


def _gb(value: float | None) -> str:
    return NA if value is None else f"{value / 1e9:.0f}" if value >= 100e9 else f"{value / 1e9:.1f}"


def heat_style(fraction: float | None) -> str:
    if fraction is None:
        return "dim"
    step = 0 if fraction <= 0.0 else 1 + min(len(HEAT) - 2, int(fraction * (len(HEAT) - 1)))
    return f"white on {HEAT[step]}"


def graph(values: list[float | None], width: int, rows: int, top: float | None) -> list[str]:
    """A bar graph ``rows`` cells tall (eighth blocks), newest on the right; None is a gap ('·')."""
    values = values[-width:]
    gap: list[float | None] = [None] * (width - len(values))
    values = gap + values
    if not top or top <= 0:
        top = max((v for v in values if v is not None), default=0.0) or 1.0
    levels: list[int | None] = []
    for v in values:
        if v is None:
            levels.append(None)
        else:
            levels.append(max(1, min(rows * 8, round(v / top * rows * 8))) if v > 0 else 0)
    out = []
    for row in range(rows - 1, -1, -1):  # top row first
        line = []
        for level in levels:
            if level is None:
                line.append("·" if row == 0 else " ")
            else:
                fill = min(8, max(0, level - row * 8))
                line.append(" ▁▂▃▄▅▆▇█"[fill] if fill or row else "▁")
        out.append("".join(line))
    return out


# ------------------------------------------------------------------------------ GPU panels
@dataclass
class _Cell:
    label: str
    value: str
    parts: list[tuple[float | None, str | None]]  # (fraction, style) per sub-bar; style None: by level


def _cells(model: MonitorModel, gpu: int) -> list[_Cell]:
    s = model.latest[gpu]
    lim = model.limits.get(gpu)
    mem_total = getattr(lim, "memory_total_bytes", None)
    power_limit = getattr(lim, "power_limit_w", None)
    slowdown = getattr(lim, "temperature_slowdown_c", None) or 100.0
    sm_max = getattr(lim, "sm_clock_max_mhz", None)
    mem_max = getattr(lim, "mem_clock_max_mhz", None)
    pcie_limit = lim.pcie_bytes_per_s if lim is not None else None
    nvl_limit = model.topology.gpu_bytes_per_s(gpu) if model.topology is not None else None
    membw = s.dram_bw_util_pct if s.dram_bw_util_pct is not None else s.mem_util_pct
    cells = [
        _Cell("SM", NA if s.sm_util_pct is None else f"{s.sm_util_pct:.0f}%", [(_fraction(s.sm_util_pct, 100), None)]),
        _Cell("MBW", NA if membw is None else f"{membw:.0f}%", [(_fraction(membw, 100), None)]),
        _Cell("MEM", NA if s.memory_used_bytes is None else f"{_gb(s.memory_used_bytes)}/{_gb(mem_total)}G" if mem_total
              else f"{_gb(s.memory_used_bytes)} GB",
              [(_fraction(s.memory_used_bytes, mem_total), None)]),
        _Cell("PWR", (f"{s.power_w:.0f}/{power_limit:.0f}W" if power_limit else f"{s.power_w:.0f}W") if s.power_w is not None else NA,
              [(_fraction(s.power_w, power_limit), None)]),
        _Cell("TMP", NA if s.temperature_c is None else f"{s.temperature_c:.0f}°C", [(_fraction(s.temperature_c, slowdown), None)]),
        _Cell("PCI", f"{_gbps(s.pcie_tx_bytes_per_s)}↑{_gbps(s.pcie_rx_bytes_per_s)}↓",
              [(_fraction(s.pcie_tx_bytes_per_s, pcie_limit), TX_STYLE), (_fraction(s.pcie_rx_bytes_per_s, pcie_limit), RX_STYLE)]),
    ]
    if s.links or s.nvlink_tx_bytes_per_s is not None:
        cells.append(_Cell("NVL", f"{_gbps(s.nvlink_tx_bytes_per_s)}↑{_gbps(s.nvlink_rx_bytes_per_s)}↓",
                           [(_fraction(s.nvlink_tx_bytes_per_s, nvl_limit), TX_STYLE),
                            (_fraction(s.nvlink_rx_bytes_per_s, nvl_limit), RX_STYLE)]))
    cells += [
        _Cell("SMC", NA if s.sm_clock_mhz is None else f"{s.sm_clock_mhz:.0f}MHz", [(_fraction(s.sm_clock_mhz, sm_max), None)]),
        _Cell("MMC", NA if s.mem_clock_mhz is None else f"{s.mem_clock_mhz:.0f}MHz", [(_fraction(s.mem_clock_mhz, mem_max), None)]),
    ]
    return cells


def _draw_cell(line: SegLine, cell: _Cell, width: int) -> None:
    value_width = max(len(cell.value), 9)
    bar_width = max(3, width - 4 - value_width - 1)
    line.append(cell.label.ljust(4), style="bold")
    per = bar_width // len(cell.parts)
    for k, (fraction, style) in enumerate(cell.parts):
        cells = per if k < len(cell.parts) - 1 else bar_width - per * (len(cell.parts) - 1)
        line.append(bar(fraction, cells), style=style if style and fraction is not None else _level_style(fraction))
    line.append(" " + cell.value.rjust(value_width - 0)[:value_width].ljust(value_width))


def _graph_specs(model: MonitorModel, gpu: int) -> list[tuple[str, str | tuple[str, str], str, float | None]]:
    """(label, column or (column, column) summed, style, top) of the history graphs, most useful first."""
    s = model.latest[gpu]
    lim = model.limits.get(gpu)
    pcie_limit = lim.pcie_bytes_per_s if lim is not None else None
    nvl_limit = model.topology.gpu_bytes_per_s(gpu) if model.topology is not None else None
    specs: list[tuple[str, Any, str, float | None]] = []
    if s.links or s.nvlink_tx_bytes_per_s is not None:
        specs += [("NVL↑", "nvlink_tx_bytes_per_s", TX_STYLE, nvl_limit), ("NVL↓", "nvlink_rx_bytes_per_s", RX_STYLE, nvl_limit)]
    specs += [("PCI↑", "pcie_tx_bytes_per_s", TX_STYLE, pcie_limit), ("PCI↓", "pcie_rx_bytes_per_s", RX_STYLE, pcie_limit),
              ("SM%", "sm_util_pct", "green", 100.0)]
    return specs


def panel_layout(n_gpus: int, width: int) -> tuple[int, int]:
    """(columns, panel width) of the GPU grid: as many columns as fit, rows balanced."""
    most = max(1, min(n_gpus, width // MIN_PANEL_WIDTH))
    rows = math.ceil(n_gpus / most)
    columns = math.ceil(n_gpus / rows)
    return columns, width // columns


def graph_columns(n_gpus: int, width: int) -> int:
    """How many columns a panel's history graphs have at this width (the history's bucket count)."""
    _, panel_width = panel_layout(n_gpus, width)
    return max(4, panel_width - 1 - 4 - 7)


def gpu_panel_lines(model: MonitorModel, width: int, lines_per_panel: int, *, graph_rows: int = 1) -> list[SegLine]:
    """The GPU grid: a panel per GPU (header, bars, history graphs), ``lines_per_panel`` tall at
    most (at least header + two lines of bars)."""
    gpus = model.gpus
    if not gpus:
        return []
    columns, panel_width = panel_layout(len(gpus), width)
    inner = panel_width - 1  # one column of space between panels
    per_line = max(1, inner // 18)
    panels: list[list[SegLine]] = []
    for gpu in gpus:
        cells = _cells(model, gpu)
        specs = _graph_specs(model, gpu)
        budget = max(3, lines_per_panel)
        # Bars first; graphs get what is left (at least one line), then fewer bars if need be.
        bar_lines = math.ceil(len(cells) / per_line)
        room = budget - 1 - bar_lines
        if room < 1:
            bar_lines = max(2, budget - 2)
            cells = cells[: bar_lines * per_line]
            room = max(1, budget - 1 - bar_lines)
        rows = graph_rows if room >= len(specs) * graph_rows else 1
        specs = specs[: max(1, room // rows)]
        panel = [_panel_header(model, gpu, inner)]
        per_line = math.ceil(len(cells) / math.ceil(len(cells) / per_line))  # even lines, wider bars
        cell_width = inner // per_line
        for k in range(0, len(cells), per_line):
            line = SegLine()
            for cell in cells[k:k + per_line]:
                _draw_cell(line, cell, cell_width - 1)
                line.append(" ")
            panel.append(line)
        panel += _panel_graphs(model, gpu, specs, inner, rows)
        panels.append(panel)
    out: list[SegLine] = []
    for start in range(0, len(panels), columns):
        row = panels[start:start + columns]
        height = max(len(p) for p in row)
        for y in range(height):
            line = SegLine()
            for panel in row:
                piece = panel[y] if y < len(panel) else SegLine()
                line.append_text(piece.fit(inner))
                line.append("│" if panel is not row[-1] else "", style="dim")
            out.append(line)
    return out


def _panel_header(model: MonitorModel, gpu: int, width: int) -> SegLine:
    head = SegLine()
    head.append(f"GPU{gpu} ", style="bold reverse")
    head.append(" " + (model.names.get(gpu) or getattr(model.limits.get(gpu), "name", "") or ""), style="bold")
    ranks = sorted({r for p in model.processes or () if p.gpu == gpu for r in [model.rank_of(p)] if r is not None})
    if ranks:
        head.append("  ▶ " + ",".join("rank ?" if r < 0 else f"r{r}" for r in ranks), style="cyan")
    if model.processes is not None:
        count = sum(1 for p in model.processes if p.gpu == gpu)
        head.append(f"  {count} proc", style="dim")
    return head


def _series(model: MonitorModel, gpu: int, column: str, width: int) -> list[float | None]:
    if model.history is None:
        return []
    return model.history.series(gpu, column, model.now, width)


def _panel_graphs(model: MonitorModel, gpu: int, specs: list, width: int, rows: int) -> list[SegLine]:
    out = []
    graph_width = max(4, width - 4 - 7)  # = graph_columns(): panel width - 1 - label - value
    sample = model.latest[gpu]
    for label, column, style, top in specs:
        values = _series(model, gpu, column, graph_width)
        current = getattr(sample, column)
        value = (NA if current is None else f"{current:.0f}%") if column == "sm_util_pct" else _gbps(current)
        for k, text in enumerate(graph(values, graph_width, rows, top)):
            line = SegLine()
            line.append((label if k == rows - 1 else "").ljust(4), style="bold")
            line.append(text, style=style)
            if k == rows - 1:
                line.append(" " + value.rjust(6))
            out.append(line)
    return out


# ------------------------------------------------------------------------------ NVLink
def nvlink_lines(model: MonitorModel, width: int) -> list[Text]:
    """Heatmap of TX and RX per link (each cell names the GPU the link reaches), and each GPU's
    total against its link limit."""
    topo = model.topology
    gpus = model.gpus
    title = Text("NVLink", style="bold")
    with_links = [g for g in gpus if model.latest[g].links]
    if not with_links:
        reason = getattr(topo, "reason", None) or "no NVLink link counters on these GPUs"
        title.append(f"  n/a: {reason}", style="dim")
        return [title]
    n_links = max(max(ln.link for ln in model.latest[g].links) for g in with_links) + 1
    reach: dict[tuple[int, int], str] = {}
    gens = set()
    if topo is not None:
        for ln in topo.links:
            reach[(ln.gpu, ln.link)] = str(ln.remote_gpu) if ln.remote_gpu is not None else ("S" if ln.remote_kind == "switch" else "?")
        gens = {topo.generation(g) for g in gpus if topo.generation(g) is not None}
    per_link = topo.link_bytes_per_s(with_links[0]) if topo is not None else None
    gen_text = f"gen {'/'.join(str(g) for g in sorted(gens))}" if gens else "generation n/a"
    limit_text = f"{per_link / 1e9:.0f} GB/s per link and direction" if per_link else "link limit n/a"
    title.append(f"  {gen_text} · {limit_text} · cell: the GPU the link reaches, colour: rate / limit", style="dim")
    aggregate_width = 36
    cell = 3 if width >= 2 * (6 + 3 * n_links) + aggregate_width + 4 else 2 if width >= 2 * (6 + 2 * n_links) + aggregate_width + 4 else 1
    side_by_side = width >= 2 * (6 + cell * n_links) + 2 + aggregate_width
    grid_width = 6 + cell * n_links
    out: list[Any] = [title]

    def grid_row(gpu: int, direction: str) -> SegLine:
        line = SegLine()
        line.append(f"GPU{gpu}".ljust(6), style="bold")
        rates = {ln.link: (ln.tx_bytes_per_s if direction == "tx" else ln.rx_bytes_per_s) for ln in model.latest[gpu].links}
        limit = topo.link_bytes_per_s(gpu) if topo is not None else None
        top = limit or max((r for r in rates.values() if r is not None), default=0.0) or 1.0
        for link in range(n_links):
            if link not in rates:
                line.append("·".rjust(cell), style="dim")  # link down or absent
                continue
            label = reach.get((gpu, link), " ")
            line.append(label.rjust(cell), style=heat_style(_fraction(rates[link], top)))
        return line

    def aggregate(gpu: int) -> SegLine:
        s = model.latest[gpu]
        limit = topo.gpu_bytes_per_s(gpu) if topo is not None else None
        line = SegLine()
        for arrow, value, style in (("↑", s.nvlink_tx_bytes_per_s, TX_STYLE), ("↓", s.nvlink_rx_bytes_per_s, RX_STYLE)):
            fraction = _fraction(value, limit)
            line.append(f" {arrow}")
            line.append(bar(fraction, 8), style=style if fraction is not None else "dim")
            line.append(f" {_gbps(value):>4}")
        line.append(f"/{_gbps(limit)} GB/s" if limit else " GB/s (limit n/a)", style="dim")
        return line

    header = Text(no_wrap=True, overflow="crop")
    label_tx = "TX per link".ljust(grid_width)
    label_rx = "RX per link".ljust(grid_width)
    if side_by_side:
        header.append(label_tx + "  " + label_rx, style="dim")
        header.append(" total ↑TX ↓RX of the GPU's limit", style="dim")
        out.append(header)
        for gpu in gpus:
            line = grid_row(gpu, "tx") if gpu in with_links else SegLine(f"GPU{gpu}".ljust(grid_width))
            line.append("  ")
            line.append_text(grid_row(gpu, "rx") if gpu in with_links else SegLine(" " * grid_width))
            line.append_text(aggregate(gpu))
            out.append(line)
    else:
        for direction, label in (("tx", label_tx), ("rx", label_rx)):
            out.append(Text(label, style="dim"))
            out += [grid_row(g, direction) for g in with_links]
        out.append(Text("total ↑TX ↓RX of the GPU's limit", style="dim"))
        for gpu in gpus:
            line = SegLine(f"GPU{gpu}".ljust(6), "bold")
            line.append_text(aggregate(gpu))
            out.append(line)
    legend = Text("scale ", style="dim", no_wrap=True, overflow="crop")
    for fraction in (0.0, 0.2, 0.4, 0.6, 0.8, 1.0):
        legend.append(f" {fraction * 100:.0f}% ", style=heat_style(fraction))
    legend.append("  · link down", style="dim")
    out.append(legend)
    return out


def topology_lines(model: MonitorModel, width: int) -> list[Text]:
    """GPU x GPU: NV<n> direct links, SW<n> through NVSwitch, - none; then links and generation."""
    topo = model.topology
    title = Text("Topology", style="bold", no_wrap=True, overflow="ellipsis")
    if topo is None:
        title.append("  n/a: not read yet", style="dim")
        return [title]
    if not topo.links:
        title.append(f"  n/a: {topo.reason}", style="dim")
        return [title]
    title.append("  NV<n>: n direct links · SW<n>: through NVSwitch · -: no NVLink path", style="dim")
    gpus = topo.gpus
    cell = 6
    out = [title]
    header = Text("      ", no_wrap=True, overflow="crop")
    for b in gpus:
        header.append(f"GPU{b}".rjust(cell), style="bold")
    header.append("  links  gen", style="bold")
    out.append(header)
    for a in gpus:
        line = Text(f"GPU{a}".ljust(6), style="bold", no_wrap=True, overflow="crop")
        for b in gpus:
            label = topo.pair_label(a, b)
            line.append(label.rjust(cell), style="dim" if label in ("X", "-") else "green" if label.startswith("NV") else "cyan")
        gen = topo.generation(a)
        line.append(f"  {len(topo.links_of(a)):>5}  {gen if gen is not None else NA:>3}")
        out.append(line)
    return out


def process_lines(model: MonitorModel, width: int, *, limit: int | None = None) -> list[Text]:
    title = Text("Processes", style="bold", no_wrap=True, overflow="ellipsis")
    if model.processes is None:
        title.append("  n/a: NVML does not list the processes on these GPUs", style="dim")
        return [title]
    title.append("  ▶ rN: rank N of the pkb-tui run going on", style="dim")
    out = [title, Text(f"{'GPU':>3} {'PID':>7} {'USER':<10} {'GPU MEM':>8}  COMMAND", style="bold", no_wrap=True)]
    if not model.processes:
        out.append(Text("  no compute process on any GPU", style="dim"))
    shown = sorted(model.processes, key=lambda p: (p.gpu, p.pid))
    if limit is not None and len(shown) > limit:
        shown = shown[:limit]
    for p in shown:
        line = Text(no_wrap=True, overflow="ellipsis")
        line.append(f"{p.gpu:>3} {p.pid:>7} ")
        line.append(truncate(p.user or NA, 10).ljust(10), style="" if p.user else "dim")
        line.append(f" {_gb(p.used_memory_bytes) + ' GB' if p.used_memory_bytes is not None else NA:>8}  ")
        rank = model.rank_of(p)
        if rank is not None:
            line.append("▶ rank ? " if rank < 0 else f"▶ r{rank} ", style="bold cyan")
        line.append(p.command or "(not visible from here)", style="" if p.command else "dim")
        out.append(line)
    if limit is not None and len(model.processes) > limit:
        out.append(Text(f"  … {len(model.processes) - limit} more", style="dim"))
    return out


def na_notes(unsupported: dict[int, dict[str, str]], gpus: list[int]) -> list[str]:
    """'n/a' reasons, each said once: figures with the same reason on several GPUs are grouped."""
    grouped: dict[tuple[str, str], list[int]] = {}
    for gpu, reasons in sorted(unsupported.items()):
        for figure, reason in reasons.items():
            grouped.setdefault((figure, reason), []).append(gpu)
    out = []
    for (figure, reason), on in grouped.items():
        where = "every GPU" if len(on) == len(gpus) and len(gpus) > 1 else ", ".join(f"GPU{g}" for g in on)
        out.append(f"{figure} n/a on {where}: {reason}")
    return out
