"""How figures read on screen: units, marks and small text gauges. No Textual here, so the
formatting is testable on its own and the CLI could share it.

A None is "not available" and reads "n/a", never 0. Every status has a mark as well as a colour.
"""

from __future__ import annotations

import math
import time

from pkb_tui.store.statuses import STATUS_MARKS, status_label, status_mark  # noqa: F401  (re-exported)

NA = "n/a"

STATUS_STYLES = {
    "passed": "green",
    "failed": "red",
    "error": "red",
    "timeout": "yellow",
    "interrupted": "yellow",
    "cancelled": "dim",
    "running": "cyan",
    "queued": "dim",
}


def correct_mark(correct: int | bool | None) -> str:
    if correct is None:
        return "–"
    return "✓" if correct else "✗"


def fmt_us(value_us: float | None) -> str:
    """A time in microseconds, in the unit that keeps 3-4 significant figures."""
    if value_us is None:
        return NA
    if value_us >= 1_000_000:
        return f"{value_us / 1_000_000:.3g} s" if value_us < 10_000_000 else f"{value_us / 1_000_000:.1f} s"
    if value_us >= 10_000:
        return f"{value_us / 1000:.1f} ms"
    if value_us >= 1000:
        return f"{value_us / 1000:.2f} ms"
    if value_us >= 100:
        return f"{value_us:.0f} µs"
    return f"{value_us:.1f} µs"


_BYTE_UNITS = ("B", "kB", "MB", "GB", "TB", "PB")


def fmt_bytes(value_bytes: float | None) -> str:
    """Decimal units (10^3), as bandwidth figures are quoted."""
    if value_bytes is None:
        return NA
    value = float(value_bytes)
    for unit in _BYTE_UNITS:
        if abs(value) < 1000 or unit == _BYTE_UNITS[-1]:
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.3g} {unit}"
        value /= 1000
    return NA  # unreachable


def fmt_rate(bytes_per_s: float | None) -> str:
    if bytes_per_s is None:
        return NA
    return fmt_bytes(bytes_per_s) + "/s"


def fmt_gbps(value_gbps: float | None) -> str:
    return NA if value_gbps is None else f"{value_gbps:.3g} GB/s"


def fmt_pct(value_pct: float | None) -> str:
    return NA if value_pct is None else f"{value_pct:.0f}%"


def fmt_fraction(value: float | None) -> str:
    return NA if value is None else f"{value * 100:.0f}%"


def fmt_speedup(speedup: float | None) -> str:
    """'1.25× ▲' (faster) / '0.80× ▼' (slower): the arrow carries the meaning without colour."""
    if speedup is None:
        return NA
    arrow = "▲" if speedup > 1.0 else ("▼" if speedup < 1.0 else "=")
    return f"{speedup:.2f}× {arrow}"


def fmt_error(value: float | None) -> str:
    return NA if value is None else f"{value:.2e}"


def fmt_watts(value_w: float | None) -> str:
    return NA if value_w is None else f"{value_w:.0f} W"


def fmt_time(ts: float | None, *, utc: bool = False) -> str:
    """A moment as 'YYYY-MM-DD HH:MM' (local time unless utc)."""
    if ts is None:
        return NA
    moment = time.gmtime(ts) if utc else time.localtime(ts)
    return time.strftime("%Y-%m-%d %H:%M", moment)


def fmt_duration(seconds: float | None) -> str:
    if seconds is None:
        return NA
    seconds = max(0, int(seconds))
    hours, rest = divmod(seconds, 3600)
    minutes, secs = divmod(rest, 60)
    return f"{hours}:{minutes:02d}:{secs:02d}" if hours else f"{minutes:02d}:{secs:02d}"


def bar(fraction: float | None, width: int) -> str:
    """A filled bar for 0..1 ('████▌░░░░'); eighth blocks for the partial cell."""
    if width <= 0:
        return ""
    if fraction is None:
        return "·" * width
    fraction = min(max(fraction, 0.0), 1.0)
    eighths = round(fraction * width * 8)
    full, part = divmod(eighths, 8)
    partial = "▏▎▍▌▋▊▉"[part - 1] if part else ""
    return ("█" * full + partial).ljust(width, "░")[:width]


def speedup_gauge(speedup: float | None, width: int, *, span: float = 4.0) -> str:
    """A gauge centred on 1× on a log scale from 1/span to span: left of '│' slower, right faster."""
    if width < 3:
        return ""
    half = (width - 1) // 2
    if speedup is None or speedup <= 0:
        return "·" * half + "│" + "·" * (width - 1 - half)
    position = max(-1.0, min(1.0, math.log(speedup) / math.log(span)))
    cells = round(abs(position) * half)
    if position >= 0:
        return " " * half + "│" + ("█" * cells).ljust(width - 1 - half, "░")
    return ("█" * cells).rjust(half, "░") + "│" + " " * (width - 1 - half)


SPARK_LEVELS = " ▁▂▃▄▅▆▇█"


def spark(values: list[float | None], width: int, top: float | None = None) -> str:
    """A sparkline of the last `width` values; a missing value is a gap ('·'), never a zero bar."""
    if width <= 0:
        return ""
    values = values[-width:]
    if top is None:
        top = max((v for v in values if v is not None), default=0.0)
    if top <= 0:
        line = "".join("·" if v is None else "▁" for v in values)
    else:
        scale = 7.0 / top  # levels 1..8: the lowest bar still shows that a value exists
        levels = SPARK_LEVELS
        line = "".join(
            "·" if v is None else levels[1 + (7 if v >= top else 0 if v <= 0 else round(v * scale))]
            for v in values
        )
    return line.rjust(width)


def level_char(value: float | None, top: float) -> str:
    """One cell for a per-link strip: its rate against the busiest link."""
    if value is None:
        return "·"
    if top <= 0 or value <= 0:
        return "▁"
    return SPARK_LEVELS[1 + round(min(value / top, 1.0) * 7)]


def truncate(text: str, width: int) -> str:
    return text if len(text) <= width else text[: max(0, width - 1)] + "…"
