"""A plotext chart inside a Textual widget.

plotext 6 dropped the module-level API textual-plotext drove, so this draws on plotext's master
figure (plt.figure: clear, plot_size, signals, build) and shows the built string through
rich.text.Text.from_ansi. plotext's figure is process-global, so builds are serialised by a lock
and made on the app's thread. A build costs ~10 ms: it is redone only when the data or the size
changes, and never more often than `min_interval_s` (2 Hz by default).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

from rich.text import Text
from textual.timer import Timer
from textual.widget import Widget

_FIGURE_LOCK = threading.Lock()

Draw = Callable[[Any], None]  # draw(figure): add signals, title, limits


def build_chart(draw: Draw, width: int, height: int) -> Text:
    import plotext

    with _FIGURE_LOCK:
        figure = plotext.figure
        figure.clear()
        figure.plot_size(width, height)
        figure.theme("dark")
        draw(figure)
        out = figure.build().string()
        figure.clear()
    return Text.from_ansi(out, no_wrap=True)


class PlotextChart(Widget):
    DEFAULT_CSS = """
    PlotextChart { height: 12; width: 1fr; }
    """

    def __init__(self, draw: Draw | None = None, *, min_interval_s: float = 0.5, id: str | None = None) -> None:
        super().__init__(id=id)
        self._draw = draw
        self._text = Text("")
        self.min_interval_s = min_interval_s
        self._last_build = 0.0
        self._pending: Timer | None = None
        self._built_for: tuple[int, int] | None = None
        self.builds = 0  # how many times plotext ran (tests check the rate limit)

    def set_draw(self, draw: Draw | None) -> None:
        self._draw = draw
        self._built_for = None
        self._schedule()

    def on_resize(self) -> None:
        self._schedule()

    def on_mount(self) -> None:
        self._schedule()

    def _schedule(self) -> None:
        if self._pending is not None:
            return
        wait = self._last_build + self.min_interval_s - time.monotonic()
        if wait <= 0:
            self._rebuild()
        else:
            self._pending = self.set_timer(wait, self._rebuild)

    def _rebuild(self) -> None:
        self._pending = None
        width, height = self.size.width, self.size.height
        if width < 10 or height < 4:
            return
        if self._built_for == (width, height):
            return
        self._last_build = time.monotonic()
        self._built_for = (width, height)
        if self._draw is None:
            self._text = Text("")
        else:
            try:
                self._text = build_chart(self._draw, width, height)
            except Exception as exc:  # a chart must never take the screen down
                self._text = Text(f"chart unavailable: {exc!r}", style="dim")
        self.builds += 1
        self.refresh()

    def render(self) -> Text:
        return self._text
