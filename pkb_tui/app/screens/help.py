"""Help: every key of every screen, read from the bindings themselves so the list cannot drift."""

from __future__ import annotations

from rich.table import Table
from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Static

MARKS = "Marks: ✓ passed/correct  ✗ failed/incorrect  ‼ error  ⏱ timeout  ⊘ interrupted  ▶ running  … queued  " \
        "▲ faster/better  ▼ slower/worse  · n/a (not measured)  ● marked for compare"


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

    table = Table(box=None, padding=(0, 1), show_header=False, expand=True)
    table.add_column("key", style="bold cyan", no_wrap=True, width=12)
    table.add_column("does", ratio=1)
    sections = [("Everywhere", PkbApp), ("Launch", LaunchScreen), ("Live", LiveScreen), ("History", HistoryScreen),
                ("History filters", FilterScreen), ("Result", ResultScreen), ("Compare", CompareScreen), ("Monitor", MonitorScreen),
                ("Generate (G)", GenerateScreen), ("Generate: a reply", ReplyScreen)]
    extra = {
        "Launch": [("tab", "next field (filter, family, tasks, models, options)"),
                   ("enter", "on the tasks list: run; in Models: mark")],
        "History": [("enter", "open the highlighted run (in the leaderboard: that model's runs)"),
                    ("click header", "sort by that column")],
        "Everywhere": [("↑ ↓ pgup pgdn", "move in lists and tables")],
        "Generate (G)": [("enter", "the highlighted request's reply and its extracted code")],
    }
    for title, owner in sections:
        table.add_row(Text(title, style="bold underline"), "")
        for binding in owner.BINDINGS:
            if isinstance(binding, tuple):
                binding = Binding(*binding)
            table.add_row(_key_label(binding), binding.description or binding.action)
        for key, does in extra.get(title, []):
            table.add_row(key, does)
    return table


class HelpScreen(ModalScreen[None]):
    BINDINGS = [Binding("escape,question_mark,f1", "app.pop_screen", "Close")]

    def compose(self) -> ComposeResult:
        with VerticalScroll(id="help-box"):
            yield Static(Text("Keys", style="bold"), id="help-title")
            yield Static(key_table())
            yield Static(Text(MARKS, style="dim"))
