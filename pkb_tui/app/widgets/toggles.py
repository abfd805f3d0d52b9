"""Checkboxes that differ by more than colour: Textual draws an "X" in every box, ticked or not,
and tells the two apart by colour alone. Here an unticked box is empty."""

from __future__ import annotations

from typing import Any

from rich.segment import Segment
from textual.content import Content
from textual.strip import Strip
from textual.widgets import Checkbox, SelectionList
from textual.widgets._toggle_button import ToggleButton

TICKED, EMPTY = ToggleButton.BUTTON_INNER, " "


class TickBox(Checkbox):
    @property
    def _button(self) -> Content:
        button = super()._button
        if self.value:
            return button
        # The same three cells with the middle one blank: "▐ ▌".
        return Content.assemble(*((EMPTY if span_text == TICKED else span_text, style)
                                  for span_text, style in _pieces(button)))


def _pieces(content: Content) -> list[tuple[str, Any]]:
    plain = content.plain
    styles: dict[int, Any] = {}
    for span in content.spans:
        for index in range(span.start, span.end):
            styles[index] = span.style
    return [(char, styles.get(index, "")) for index, char in enumerate(plain)]


class TickList(SelectionList[str]):
    def render_line(self, y: int) -> Strip:
        strip = super().render_line(y)
        _, scroll_y = self.scroll_offset
        try:
            selection = self.get_option_at_index(scroll_y + y)
        except Exception:  # past the last option
            return strip
        if selection.value in self._selected:
            return strip
        segments = list(strip)
        # [left side, inner, right side, space, prompt...] as SelectionList builds it.
        if len(segments) > 1 and segments[1].text == TICKED:
            segments[1] = Segment(EMPTY, segments[1].style, segments[1].control)
            return Strip(segments, strip.cell_length)
        return strip
