"""The line at the top of every main screen: where you are, the keys to go elsewhere, and what the
batch is doing."""

from __future__ import annotations

from rich.text import Text
from textual.widget import Widget

from pkb_tui.app.format import truncate

TABS = (("l", "launch", "Launch"), ("v", "live", "Live"), ("h", "history", "History"), ("m", "monitor", "Monitor"))


class NavBar(Widget):
    DEFAULT_CSS = """
    NavBar { height: 1; width: 1fr; }
    """

    def __init__(self, current: str) -> None:
        super().__init__()
        self.current = current

    def on_mount(self) -> None:
        self.watch(self.app, "batch_summary", lambda _: self._summary_changed())

    def _summary_changed(self) -> None:
        self.refresh()

    def render(self) -> Text:
        text = Text(no_wrap=True, overflow="ellipsis")
        text.append(" pkb ", style="bold reverse")
        for key, mode, label in TABS:
            text.append(" ")
            if mode == self.current:
                text.append(f"[{key}] {label}", style="bold reverse")
            else:
                text.append(f"{key}", style="bold")
                text.append(f" {label}")
        text.append("  ? Help  q Quit", style="dim")
        summary = getattr(self.app, "batch_summary", "")
        room = self.size.width - text.cell_len - 2
        if summary and room > 6:
            right = truncate(summary, room)
            text.append(" " * (room - len(right) + 1))
            text.append(right, style="bold" if summary != "idle" else "dim")
        return text
