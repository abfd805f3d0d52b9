"""Live telemetry drawn as text: one row per GPU with NVLink transmit/receive sparklines, PCIe, SM
use and power, and optionally a strip with one cell per NVLink link. Everything is one widget
rendering one Text, so a refresh of 8 GPUs x 18 links costs one render, not dozens of widgets.

Reads a ring buffer with latest_per_gpu() and series(gpu, column, n). A None is drawn as '·' and
written 'n/a': the device could not measure it, which is not the same as zero.
"""

from __future__ import annotations

from typing import Any

from rich.text import Text
from textual.strip import Strip
from textual.widget import Widget

from pkb_tui.app.format import fmt_pct, fmt_rate, fmt_watts, level_char, spark
from pkb_tui.app.widgets.strips import text_segments

TX_STYLE = "cyan"
RX_STYLE = "magenta"


def _max(values: list[float | None]) -> float:
    return max((v for v in values if v is not None), default=0.0)


class TelemetryPanel(Widget):
    """Call update_from(telemetry) at the refresh rate; it reads the ring and redraws."""

    DEFAULT_CSS = """
    TelemetryPanel { height: auto; width: 1fr; }
    """

    def __init__(self, *, detail: bool = False, id: str | None = None) -> None:
        super().__init__(id=id)
        self.detail = detail  # Monitor: memory, temperature, clocks and a links row per GPU
        self._lines: list[Text] = [Text("waiting for telemetry…", style="dim")]
        self._strips: list[Strip] | None = None
        self._strips_width = 0

    def update_from(self, telemetry: Any) -> None:
        previous = len(self._lines)
        self._lines = self.build_lines(telemetry, max(20, self.size.width or 80))
        self._strips = None
        # A new GPU or link row changes the height: only then is a layout pass needed.
        self.refresh(layout=len(self._lines) != previous)

    def show_message(self, message: str) -> None:
        if len(self._lines) == 1 and self._lines[0].plain == message:
            return
        previous = len(self._lines)
        self._lines, self._strips = [Text(message, style="dim")], None
        self.refresh(layout=previous != 1)

    def render_line(self, y: int) -> Strip:
        # The line API: each Text row becomes a Strip directly, skipping the generic
        # Text -> Content -> strips path (the bulk of a refresh's cost with 8 GPUs).
        width = self.size.width
        base = self.rich_style
        if self._strips is None or self._strips_width != width:
            console = self.app.console
            self._strips = [
                Strip(text_segments(line, console, base)).adjust_cell_length(width, base)
                for line in self._lines
            ]
            self._strips_width = width
        if y < len(self._strips):
            return self._strips[y]
        return Strip.blank(width, base)

    def get_content_height(self, container, viewport, width: int) -> int:
        return len(self._lines)

    # ------------------------------------------------------------------ text
    def build_lines(self, telemetry: Any, width: int) -> list[Text]:
        if telemetry is None:
            return [Text("no live telemetry (none started for this run)", style="dim")]
        ring = getattr(telemetry, "ring", None)
        if ring is None:
            return [Text("no live telemetry", style="dim")]
        latest = ring.latest_per_gpu()
        source = getattr(telemetry, "source", None) or "?"
        reason = getattr(telemetry, "reason", None)
        header = Text(f"telemetry: {source}", style="dim", no_wrap=True, overflow="ellipsis")
        if reason:
            header.append(f" ({reason})")
        gpus = sorted(g for g in latest if g >= 0)
        if gpus:
            header.append(" · GB/s: NVLink TX/RX, PCIe ↑tx/↓rx")
        lines = [header]
        if not gpus and -1 not in latest:
            lines.append(Text("no samples yet", style="dim"))
            return lines
        n_links = max((len(latest[g].links) for g in gpus), default=0)
        extra = 24 if self.detail and width >= 120 else 0
        # The fixed columns take ROW_FIXED cells; the two sparklines share the rest, then the link
        # strip goes on the same row if there is room, else (Monitor) on a row of its own.
        links_inline = n_links > 0 and width - ROW_FIXED - extra - (n_links + 2) >= 2 * 12
        room = width - ROW_FIXED - extra - ((n_links + 2) if links_inline else 0)
        spark_width = max(4, min(60, room // 2))
        series = {
            g: (ring.series(g, "nvlink_tx_bytes_per_s", spark_width), ring.series(g, "nvlink_rx_bytes_per_s", spark_width))
            for g in gpus
        }
        # One scale for every GPU, so rows compare at a glance.
        top = max([_max(tx) for tx, _ in series.values()] + [_max(rx) for _, rx in series.values()] + [0.0])
        link_top = max(
            (max((s.tx_bytes_per_s or 0.0) + (s.rx_bytes_per_s or 0.0) for s in latest[g].links) for g in gpus if latest[g].links),
            default=0.0,
        )
        for gpu in gpus:
            sample = latest[gpu]
            tx, rx = series[gpu]
            line = Text(no_wrap=True, overflow="crop")
            line.append(f"GPU{gpu}".ljust(5), style="bold")
            line.append("TX ")
            line.append(spark(tx, spark_width, top), style=TX_STYLE)
            line.append(f" {_gb(sample.nvlink_tx_bytes_per_s)} RX ")
            line.append(spark(rx, spark_width, top), style=RX_STYLE)
            line.append(f" {_gb(sample.nvlink_rx_bytes_per_s)}")
            line.append(f" PCIe {_gb(sample.pcie_tx_bytes_per_s, 4)}↑{_gb(sample.pcie_rx_bytes_per_s, 4)}↓")
            line.append(f" SM {fmt_pct(sample.sm_util_pct):>4} {fmt_watts(sample.power_w):>6}")
            if extra:
                line.append(f" mem {fmt_pct(sample.mem_util_pct):>4} {_temp(sample.temperature_c):>5} {_mhz(sample.sm_clock_mhz):>8}")
            if links_inline:
                line.append(" │")
                line.append(_link_strip(sample.links, link_top), style=TX_STYLE)
            lines.append(line)
            if self.detail and sample.links and not links_inline:
                strip = Text(no_wrap=True, overflow="crop")
                strip.append(f"     {len(sample.links)} links ", style="dim")
                strip.append(_link_strip(sample.links, link_top), style=TX_STYLE)
                lines.append(strip)
        host = latest.get(-1)
        if host is not None:
            line = Text(no_wrap=True, overflow="crop")
            line.append("host ", style="bold")
            line.append(f"CPU {fmt_pct(host.cpu_pct):>4}  mem {_short_bytes(host.host_memory_used_bytes)}  loopback ")
            loop = ring.series(-1, "loopback_bytes_per_s", max(4, min(40, width - 50)))
            line.append(spark(loop, max(4, min(40, width - 50))), style=TX_STYLE)
            line.append(f" {fmt_rate(host.loopback_bytes_per_s)}")
            lines.append(line)
            if host.ranks:
                ranks = Text("     ranks' CPU (100% = a core) ", style="dim", no_wrap=True, overflow="crop")
                ranks.append("  ".join(f"r{r.rank} {fmt_pct(r.cpu_pct)}" for r in host.ranks), style="")
                lines.append(ranks)
        return lines


# "GPU0 " TX " 123.4 RX " 123.4 PCIe 12.3↑ 0.4↓ SM  40% 300 W": everything but the two sparklines.
ROW_FIXED = 5 + 3 + 10 + 6 + 17 + 15


def _gb(value: float | None, width: int = 5) -> str:
    """A rate in GB/s in `width` cells; 'n/a' when the device could not count it."""
    if value is None:
        return "n/a".rjust(width)
    gb = value / 1e9
    return (f"{gb:.1f}" if gb < 1000 else f"{gb:.0f}").rjust(width)


def _link_strip(links: list, top: float) -> str:
    return "".join(
        level_char(None if (link.tx_bytes_per_s is None and link.rx_bytes_per_s is None)
                   else (link.tx_bytes_per_s or 0.0) + (link.rx_bytes_per_s or 0.0), top)
        for link in links
    )


def _short_bytes(value: float | None) -> str:
    return "n/a" if value is None else f"{value / 1e9:.1f} GB"


def _temp(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.0f}°C"


def _mhz(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.0f} MHz"
