"""The keys line at the bottom of every screen. One widget drawing one line, instead of Textual's
Footer (a widget per key, rebuilt on every screen switch: most of the cost of showing a screen)."""

from __future__ import annotations

from rich.text import Text
from textual.events import Click
from textual.widget import Widget

PINNED_ACTIONS = ("app.help", "app.quit", "help", "quit")


class KeyBar(Widget):
    DEFAULT_CSS = """
    KeyBar { height: 1; width: 1fr; background: $panel; dock: bottom; }
    """

    def __init__(self) -> None:
        super().__init__()
        self._spans: list[tuple[int, int, str]] = []  # (start, end, action) for clicks

    def on_mount(self) -> None:
        self.screen.bindings_updated_signal.subscribe(self, self._bindings_changed)

    def on_unmount(self) -> None:
        self.screen.bindings_updated_signal.unsubscribe(self)

    def _bindings_changed(self, screen) -> None:
        self.refresh()

    def render(self) -> Text:
        """The screen's keys, then the app's; Help and Quit are kept at the right end, always in
        view: on a narrow terminal the screen's last keys are cut, never the way out."""
        keys: list[tuple[str, str, bool, str]] = []  # (key, description, enabled, action)
        seen: set[str] = set()
        for _node, binding, enabled, _tooltip in self.screen.active_bindings.values():
            if not binding.show or binding.action in seen:
                continue
            seen.add(binding.action)
            keys.append((self.app.get_key_display(binding), binding.description, enabled, binding.action))
        pinned = [k for k in keys if k[3] in PINNED_ACTIONS]
        rest = [k for k in keys if k[3] not in PINNED_ACTIONS]
        width = self.size.width or 10_000
        tail = Text(no_wrap=True)
        for key in pinned:
            self._append(tail, *key)
        text = Text(no_wrap=True, overflow="crop")
        self._spans = []
        for key in rest:
            piece = Text()
            self._append(piece, *key)
            if text.cell_len + piece.cell_len + tail.cell_len > width:
                break
            self._spans.append((text.cell_len, text.cell_len + piece.cell_len, key[3]))
            text.append_text(piece)
        pad = max(0, width - text.cell_len - tail.cell_len) if self.size.width else 0
        text.append(" " * pad)
        offset = text.cell_len
        for key in pinned:
            piece = Text()
            self._append(piece, *key)
            self._spans.append((offset, offset + piece.cell_len, key[3]))
            offset += piece.cell_len
        text.append_text(tail)
        return text

    @staticmethod
    def _append(text: Text, key: str, description: str, enabled: bool, _action: str) -> None:
        text.append(f" {key} ", style="bold reverse" if enabled else "dim reverse")
        text.append(f" {description} ", style="" if enabled else "dim")

    async def on_click(self, event: Click) -> None:
        for start, end, action in self._spans:
            if start <= event.x < end:
                await self.app.run_action(action, self.screen)
                return
