"""Help: every key of every screen, read from the bindings themselves so the list cannot drift."""

from __future__ import annotations

from typing import Any

from rich.table import Table
from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Static

from pkb_tui.store.statuses import STATUS_MARKS, STATUSES

MARKS = ("Marks: " + "  ".join(f"{STATUS_MARKS[s]} {s}" for s in STATUSES)
         + "  ✓/✗ correct/incorrect  ▲ faster/better  ▼ slower/worse  · n/a (not measured)  ● marked for compare"
         + "  ☒ task marked to run")


def _key_label(binding: Binding) -> str:
    if binding.key_display:
        return binding.key_display
    names = {"question_mark": "?", "slash": "/", "escape": "esc", "space": "space", "enter": "enter"}
    return ", ".join(names.get(k, k) for k in binding.key.split(","))


def key_table() -> Table:
    from pkb_tui.app.app import PkbApp
    from pkb_tui.app.screens.compare import CompareScreen
    from pkb_tui.app.screens.filters import FilterScreen
    from pkb_tui.app.screens.generate import GenerateScreen, ReplyScreen
    from pkb_tui.app.screens.history import HistoryScreen
    from pkb_tui.app.screens.launch import LaunchScreen
    from pkb_tui.app.screens.live import LiveScreen
    from pkb_tui.app.screens.monitor import MonitorScreen
    from pkb_tui.app.screens.result import ResultScreen

    sections: list[tuple[str, Any]] = [("Everywhere", PkbApp), ("Launch", LaunchScreen), ("Live", LiveScreen), ("History", HistoryScreen),
                ("History filters", FilterScreen), ("Result", ResultScreen), ("Compare", CompareScreen), ("Monitor", MonitorScreen),
                ("Generate (G)", GenerateScreen), ("Generate: a reply", ReplyScreen)]
    extra = {
        "Launch": [("tab", "next field (filter, family, tasks, models, options)"),
                   ("enter", "in Models: mark (on the tasks list Enter does nothing: r runs)"),
                   ("?text", "in the filter: search titles and sources too")],
        "History": [("enter", "open the highlighted run (in the leaderboard: that model's runs)"),
                    ("click header", "sort by that column")],
        "Everywhere": [("↑ ↓ pgup pgdn", "move in lists and tables"), ("ctrl+p", "command palette: actions by name")],
        "Generate (G)": [("enter", "the highlighted request's reply and its extracted code")],
    }
    rows: list[tuple[str, str] | str] = []  # a str is a section title
    for title, owner in sections:
        rows.append(title)
        for item in owner.BINDINGS:
            binding = item if isinstance(item, Binding) else Binding(*item)
            rows.append((_key_label(binding), binding.description or binding.action))
        rows.extend(extra.get(title, []))
    table = Table(box=None, padding=(0, 1), show_header=False, expand=True)
    # The key column as wide as its widest key (not a fixed width that cuts "↑ ↓ pgup pgdn").
    key_width = max(Text(row[0]).cell_len for row in rows if isinstance(row, tuple))
    table.add_column("key", style="bold cyan", no_wrap=True, width=key_width)
    table.add_column("does", ratio=1)
    for row in rows:
        if isinstance(row, str):
            table.add_row(Text(row, style="bold underline"), "")
        else:
            table.add_row(*row)
    return table


class HelpScreen(ModalScreen[None]):
    BINDINGS = [Binding("escape,question_mark,f1", "app.pop_screen", "Close")]

    def compose(self) -> ComposeResult:
        with VerticalScroll(id="help-box"):
            yield Static(Text("Keys", style="bold"), id="help-title")
            yield Static(key_table())
            yield Static(Text(MARKS, style="dim"))
