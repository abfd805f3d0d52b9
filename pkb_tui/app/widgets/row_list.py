"""A fast list of rows with a header and a cursor, for tables that can hold thousands of rows
(History). Textual's DataTable renders every cell through Rich and rebuilds on each change: ~0.5 ms
a cell here. This draws each visible row once into a Strip (the line API) and keeps it until the
row, the width or the cursor changes; rows off screen cost nothing to draw."""

from __future__ import annotations

from dataclasses import dataclass

from rich.cells import cell_len, set_cell_size
from rich.control import strip_control_codes
from rich.segment import Segment
from rich.style import Style
from rich.text import Text
from textual.binding import Binding
from textual.events import Click
from textual.geometry import Size
from textual.message import Message
from textual.reactive import reactive
from textual.scroll_view import ScrollView
from textual.strip import Strip

from pkb_tui.app.widgets.strips import text_segments

Cell = Text | str


@dataclass(frozen=True)
class Column:
    key: str
    label: str
    width: int  # cells; the last column takes what is left
    justify: str = "left"
    grow_to: int = 0  # on a wide screen the column widens up to this many cells (0: fixed)


class RowList(ScrollView, can_focus=True):
    COMPONENT_CLASSES = {"row-list--header", "row-list--cursor"}
    DEFAULT_CSS = """
    RowList { height: 1fr; }
    RowList > .row-list--header { text-style: bold; background: $panel; }
    RowList > .row-list--cursor { background: $block-cursor-blurred-background; }
    RowList:focus > .row-list--cursor { background: $block-cursor-background; color: $block-cursor-foreground; text-style: bold; }
    """
    BINDINGS = [
        Binding("up", "move(-1)", "Up", show=False),
        Binding("down", "move(1)", "Down", show=False),
        Binding("pageup", "page(-1)", "Page up", show=False),
        Binding("pagedown", "page(1)", "Page down", show=False),
        Binding("home", "jump(0)", "First", show=False),
        Binding("end", "jump(-1)", "Last", show=False),
        Binding("enter", "select", "Open", show=False),
    ]

    cursor: reactive[int] = reactive(0, always_update=True)

    class Highlighted(Message):
        def __init__(self, row_list: RowList, index: int) -> None:
            super().__init__()
            self.row_list, self.index = row_list, index

        @property
        def control(self) -> RowList:
            return self.row_list

    class Selected(Highlighted):
        pass

    class HeaderClicked(Message):
        def __init__(self, row_list: RowList, column: str) -> None:
            super().__init__()
            self.row_list, self.column = row_list, column

        @property
        def control(self) -> RowList:
            return self.row_list

    def __init__(self, columns: list[Column], *, id: str | None = None) -> None:
        super().__init__(id=id)
        self.columns = columns
        self.rows: list[list[Cell]] = []
        self._cache: dict[tuple[int, bool], Strip] = {}
        self._cache_width = -1

    # ------------------------------------------------------------------ data
    @property
    def row_count(self) -> int:
        return len(self.rows)

    def set_rows(self, rows: list[list[Cell]], *, cursor: int = 0) -> None:
        self.rows = list(rows)
        self._cache.clear()
        self._resize()
        self.cursor = max(0, min(cursor, len(self.rows) - 1))
        self.refresh()

    def append_rows(self, rows: list[list[Cell]]) -> None:
        self.rows.extend(rows)
        self._resize()
        self.refresh()

    def update_row(self, index: int, row: list[Cell]) -> None:
        self.rows[index] = row
        self._cache.pop((index, False), None)
        self._cache.pop((index, True), None)
        self.refresh()

    def _resize(self) -> None:
        # Width 0: rows are cut to the width on screen, never scrolled sideways. Tracking the
        # widget's width here made every resize (and the first layout, and the vertical scrollbar
        # appearing) change the virtual size, which asks for another layout and a full redraw.
        self.virtual_size = Size(0, len(self.rows) + 1)

    # ------------------------------------------------------------------ cursor
    def validate_cursor(self, cursor: int) -> int:
        return max(0, min(cursor, len(self.rows) - 1)) if self.rows else 0

    def watch_cursor(self, old: int, new: int) -> None:
        for index in (old, new):
            self._cache.pop((index, True), None)
        self._scroll_to_cursor()
        self.refresh()
        if self.rows:
            self.post_message(self.Highlighted(self, new))

    def _scroll_to_cursor(self) -> None:
        visible = max(1, self.size.height - 1)
        top = int(self.scroll_offset.y)
        if self.cursor < top:
            self.scroll_to(y=self.cursor, animate=False)
        elif self.cursor >= top + visible:
            self.scroll_to(y=self.cursor - visible + 1, animate=False)

    def action_move(self, step: int) -> None:
        self.cursor += step

    def action_page(self, direction: int) -> None:
        self.cursor += direction * max(1, self.size.height - 2)

    def action_jump(self, where: int) -> None:
        self.cursor = where if where >= 0 else len(self.rows) - 1

    def action_select(self) -> None:
        if self.rows:
            self.post_message(self.Selected(self, self.cursor))

    def on_focus(self) -> None:
        self._cache.clear()  # the cursor row is drawn brighter while focused
        self.refresh()

    def on_blur(self) -> None:
        self._cache.clear()
        self.refresh()

    def on_click(self, event: Click) -> None:
        if event.y == 0:
            x = 0
            for column, width in zip(self.columns, self._widths(self.size.width), strict=True):
                if x <= event.x < x + width + 1:
                    self.post_message(self.HeaderClicked(self, column.key))
                    return
                x += width + 1
            return
        index = int(self.scroll_offset.y) + event.y - 1
        if 0 <= index < len(self.rows):
            if index == self.cursor:
                self.action_select()
            else:
                self.cursor = index

    # ------------------------------------------------------------------ drawing
    def _widths(self, width: int) -> list[int]:
        widths = [c.width for c in self.columns]
        # Room beyond the natural widths widens the growing columns (long task and model names)
        # first, evenly, each up to its grow_to; the last column takes the rest.
        spare = width - (sum(widths) + len(widths) - 1)
        growing = [i for i, c in enumerate(self.columns[:-1]) if c.grow_to > c.width]
        while spare > 0 and growing:
            step = max(1, spare // len(growing))
            for i in list(growing):
                add = min(step, self.columns[i].grow_to - widths[i], spare)
                widths[i] += add
                spare -= add
                if widths[i] >= self.columns[i].grow_to:
                    growing.remove(i)
        used = sum(widths[:-1]) + len(widths) - 1
        widths[-1] = max(widths[-1], width - used)
        return widths

    def _strip(self, cells: list[Cell], style: Style, width: int) -> Strip:
        # Plain cells (most of them) and the padding between cells are joined into one segment in
        # the row's style: building a rich Text per cell and a segment per pad made this the most
        # expensive part of drawing History, and Textual's per-line work grows with the segments.
        console = self.app.console
        segments: list[Segment] = []
        plain: list[str] = []

        def flush() -> None:
            if plain:
                segments.append(Segment("".join(plain), style))
                plain.clear()

        for column, cell_width, cell in zip(self.columns, self._widths(width), cells, strict=False):
            right = column.justify == "right"
            if isinstance(cell, Text):
                text = cell
                if text.cell_len > cell_width:
                    text = text.copy()
                    text.truncate(cell_width, overflow="ellipsis")
                pad = " " * (cell_width - text.cell_len)
                if right:
                    plain.append(pad)
                flush()
                segments.extend(text_segments(text, console, style))
                if not right:
                    plain.append(pad)
            else:
                value = strip_control_codes(str(cell))  # as Text(value) would
                length = cell_len(value)
                if length > cell_width:  # as Text.truncate(cell_width, overflow="ellipsis")
                    value = set_cell_size(value, cell_width - 1) + "…"
                    length = cell_len(value)
                pad = " " * (cell_width - length)
                plain.append(pad + value if right else value + pad)
            plain.append(" ")
        flush()
        return Strip(segments).adjust_cell_length(width, style)

    def render_line(self, y: int) -> Strip:
        width = self.size.width
        if width != self._cache_width:
            self._cache.clear()
            self._cache_width = width
        base = self.rich_style
        if y == 0:  # the header stays put while the rows scroll under it
            style = base + self.get_component_rich_style("row-list--header")
            return self._strip([c.label for c in self.columns], style, width)
        index = int(self.scroll_offset.y) + y - 1
        if index >= len(self.rows):
            return Strip.blank(width, base)
        is_cursor = index == self.cursor
        key = (index, is_cursor)
        strip = self._cache.get(key)
        if strip is None:
            style = base + self.get_component_rich_style("row-list--cursor") if is_cursor else base
            strip = self._strip(self.rows[index], style, width)
            self._cache[key] = strip
        return strip
