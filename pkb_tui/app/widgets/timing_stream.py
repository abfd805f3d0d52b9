"""Live timing of the run in progress: per variant the running median of the per-iteration times with
its 95% interval, a sparkline of the latest calls, and the speedup with its interval.

Fed with ``add_timing_samples(variant, samples_us)`` (the engine's per-iteration timing stream; the
Live screen passes on what LiveState collected), ``reset()`` for a new run. Without a stream it shows
the final figures of the run's timing events (``show_final``). The interval of a median comes from
order statistics (no resampling): ranks n/2 -/+ 1.96 sqrt(n)/2 of the sorted samples, so it is
cheap enough to recompute every frame; the speedup's interval divides the ends crosswise
(conservative).
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Mapping
from dataclasses import dataclass

from rich.text import Text

from pkb_tui.app.format import NA, fmt_speedup, fmt_us, spark
from pkb_tui.app.widgets.monitor_views import LinesView

VARIANTS = ("baseline", "candidate")
STYLES = {"baseline": "cyan", "candidate": "magenta"}
SPARK_CALLS = 40  # latest calls in the sparkline


@dataclass(frozen=True)
class MedianInterval:
    count: int
    median_us: float
    low_us: float
    high_us: float


def median_interval(sorted_us: list[float]) -> MedianInterval | None:
    """Median and its ~95% distribution-free interval (order statistics) of sorted samples."""
    n = len(sorted_us)
    if n == 0:
        return None
    middle = (sorted_us[(n - 1) // 2] + sorted_us[n // 2]) / 2
    half = 1.96 * math.sqrt(n) / 2
    low = max(0, math.floor(n / 2 - half))
    high = min(n - 1, math.ceil(n / 2 + half) - 1)
    return MedianInterval(n, middle, sorted_us[low], sorted_us[max(low, high)])


def speedup_interval(baseline: MedianInterval | None, candidate: MedianInterval | None) -> tuple[float, float, float] | None:
    """(speedup, low, high): baseline median / candidate median, ends divided crosswise."""
    if baseline is None or candidate is None or candidate.median_us <= 0 or candidate.low_us <= 0:
        return None
    return (baseline.median_us / candidate.median_us, baseline.low_us / candidate.high_us,
            baseline.high_us / candidate.low_us)


class TimingStream(LinesView):
    """Two or three lines: one per variant, then the speedup."""

    def __init__(self, *, id: str | None = None) -> None:
        super().__init__(id=id)
        self._sorted: dict[str, list[float]] = {}
        self._recent: dict[str, list[float]] = {}
        self._final: dict[str, object] = {}

    def reset(self) -> None:
        self._sorted, self._recent, self._final = {}, {}, {}
        self._redraw()

    def add_timing_samples(self, variant: str, samples_us: list[float]) -> None:
        """More per-iteration times (µs per call, max over ranks) of ``variant`` for this run."""
        ordered = self._sorted.setdefault(variant, [])
        for value in samples_us:
            bisect.insort(ordered, float(value))
        recent = self._recent.setdefault(variant, [])
        recent.extend(float(v) for v in samples_us)
        del recent[:-SPARK_CALLS]
        self._redraw()

    def show_final(self, timings: Mapping[str, object]) -> None:
        """The run's timing events (median, p10, p90 per variant), shown while no stream came."""
        self._final = dict(timings)
        self._redraw()

    def stats(self) -> dict[str, MedianInterval | None]:
        return {variant: median_interval(self._sorted.get(variant, [])) for variant in VARIANTS}

    def _redraw(self) -> None:
        self.set_lines(self.build_lines(max(40, self.size.width or 80)))

    def on_resize(self) -> None:
        self._redraw()

    def build_lines(self, width: int) -> list[Text]:
        stats = self.stats()
        if not any(stats.values()):
            return self._final_lines()
        lines = []
        for variant in VARIANTS:
            stat = stats[variant]
            line = Text(no_wrap=True, overflow="crop")
            line.append(f"{variant:<9} ", style=f"bold {STYLES[variant]}")
            if stat is None:
                line.append("no iterations yet", style="dim")
            else:
                line.append(f"n={stat.count:<5} median {fmt_us(stat.median_us):>8} ")
                line.append(f"[{fmt_us(stat.low_us)}, {fmt_us(stat.high_us)}] ", style="dim")
                room = width - line.cell_len - 1
                if room >= 8:
                    # Scaled from the fastest call of the window up, so a few % of jitter shows.
                    recent = self._recent.get(variant, [])
                    floor = min(recent) * 0.99 if recent else 0.0
                    line.append(spark([v - floor for v in recent], min(SPARK_CALLS, room)), style=STYLES[variant])
            lines.append(line)
        speedup = speedup_interval(stats["baseline"], stats["candidate"])
        line = Text(no_wrap=True, overflow="crop")
        line.append("speedup   ", style="bold")
        if speedup is None:
            line.append(NA + " (needs both variants)", style="dim")
        else:
            value, low, high = speedup
            line.append(fmt_speedup(value), style="green" if low > 1 else "red" if high < 1 else "yellow")
            line.append(f"  95% [{low:.2f}×, {high:.2f}×]", style="dim")
            if low <= 1 <= high:
                line.append("  not yet distinguishable from 1×", style="dim")
        lines.append(line)
        return lines

    def _final_lines(self) -> list[Text]:
        if not self._final:
            return [Text("timing: per-iteration times show here while the variants are timed", style="dim")]
        line = Text(no_wrap=True, overflow="crop")
        line.append("timing    ", style="bold")
        medians = {}
        for variant in VARIANTS:
            timing = self._final.get(variant)
            median = getattr(timing, "median_us", None)
            if timing is None:
                continue
            medians[variant] = median
            line.append(f"{variant} ", style=f"bold {STYLES[variant]}")
            line.append(f"{fmt_us(median)} [p10 {fmt_us(getattr(timing, 'p10_us', None))}, "
                        f"p90 {fmt_us(getattr(timing, 'p90_us', None))}]  ")
        base, cand = medians.get("baseline"), medians.get("candidate")
        if base and cand:
            line.append(f"speedup {fmt_speedup(base / cand)}", style="bold")
        return [line]
