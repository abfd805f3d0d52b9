"""The last lines of a run's log file, re-read while the run goes on."""

from __future__ import annotations

from pathlib import Path

from rich.text import Text
from textual.widget import Widget

TAIL_BYTES = 16_384


def tail_lines(path: Path | str | None, count: int) -> list[str]:
    """The last `count` lines of a file, reading only its end. [] when missing."""
    if not path:
        return []
    try:
        with open(path, "rb") as f:
            f.seek(0, 2)
            size = f.tell()
            f.seek(max(0, size - TAIL_BYTES))
            data = f.read()
    except OSError:
        return []
    lines = data.decode(errors="replace").splitlines()
    if size > TAIL_BYTES and lines:
        lines = lines[1:]  # the first line was cut by the seek
    return lines[-count:]


class LogTail(Widget):
    DEFAULT_CSS = """
    LogTail { height: 1fr; width: 1fr; }
    """

    def __init__(self, *, id: str | None = None) -> None:
        super().__init__(id=id)
        self.path: str | None = None
        self._lines: list[str] = []

    def show(self, path: str | None) -> None:
        lines = tail_lines(path, max(1, self.size.height or 10))
        if path != self.path or lines != self._lines:
            self.path, self._lines = path, lines
            self.refresh()

    def render(self) -> Text:
        if not self.path:
            return Text("no log yet", style="dim")
        if not self._lines:
            return Text(f"{self.path}: empty so far", style="dim")
        return Text("\n".join(self._lines), no_wrap=True, overflow="ellipsis")
