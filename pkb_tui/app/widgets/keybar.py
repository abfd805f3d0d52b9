"""The keys line at the bottom of every screen. One widget drawing one line, instead of Textual's
Footer (a widget per key, rebuilt on every screen switch: most of the cost of showing a screen)."""

from __future__ import annotations

from rich.text import Text
from textual.events import Click
from textual.widget import Widget


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
        text = Text(no_wrap=True, overflow="crop")
        self._spans = []
        seen: set[str] = set()
        for _node, binding, enabled, _tooltip in self.screen.active_bindings.values():
            if not binding.show or binding.action in seen:
                continue
            seen.add(binding.action)
            start = text.cell_len
            text.append(f" {self.app.get_key_display(binding)} ", style="bold reverse" if enabled else "dim reverse")
            text.append(f" {binding.description} ", style="" if enabled else "dim")
            self._spans.append((start, text.cell_len, binding.action))
        return text

    async def on_click(self, event: Click) -> None:
        for start, end, action in self._spans:
            if start <= event.x < end:
                await self.app.run_action(action, self.screen)
                return
