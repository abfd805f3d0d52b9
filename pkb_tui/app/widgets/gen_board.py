"""The leaderboard of model endpoints (pkb_tui.generate.report) under History's leaderboard: pass@1,
pass@k and fast_p@1 per endpoint, and a plot of fast_p against p (the share of samples correct and
more than p times faster than the baseline) with one line per endpoint."""

from __future__ import annotations

from typing import Any

from rich.text import Text
from textual.app import ComposeResult
from textual.containers import Vertical
from textual.widgets import Static

from pkb_tui.app.widgets.chart import PlotextChart


def _pct(value: float | None) -> str:
    return "n/a" if value is None else f"{value * 100:.0f}%"


def board_text(board: list[dict[str, Any]]) -> Text:
    text = Text(no_wrap=True, overflow="ellipsis")
    text.append("Model endpoints (generate): pass@k over samples, fast_p = correct, low/(1+noise) > p× the baseline\n", style="bold")
    text.append(f"{'endpoint':<22} {'tasks':>5} {'samples':>7} {'pass@1':>7} {'pass@k':>7} {'k':>3} {'fast_1@1':>8} "
                f"{'fast_1.5@1':>10}  model\n", style="bold")
    for entry in board:
        text.append(f"{entry['endpoint'][:22]:<22} {entry['tasks']:>5} {entry['samples']:>7} {_pct(entry['pass@1']):>7} "
                    f"{_pct(entry['pass@k']):>7} {entry['k']:>3} {_pct(entry['fast_1@1']):>8} "
                    f"{_pct(entry['fast_1.5@1']):>10}  {entry['model']}\n")
    return text


def fast_p_draw(board: list[dict[str, Any]]):
    """plotext 6's figure API, as the Result screen's charts use it."""
    def draw(figure: Any) -> None:
        figure.title("fast_p (share of samples correct and > p× the baseline) against p")
        for entry in board:
            signal = figure.signal([p for p, _ in entry["curve"]], [share for _, share in entry["curve"]])
            signal.label(entry["endpoint"])
            signal.lines(True)
            figure.draw(signal)
        figure.ruler("y").lim(0.0, 1.0)

    return draw


class GenBoard(Vertical):
    DEFAULT_CSS = """
    GenBoard { height: auto; }
    GenBoard > #gen-board-table { height: auto; max-height: 6; }
    GenBoard > PlotextChart { height: 10; }
    """

    def __init__(self, board: list[dict[str, Any]], *, id: str | None = None) -> None:
        super().__init__(id=id)
        self.board = board

    def compose(self) -> ComposeResult:
        yield Static(board_text(self.board), id="gen-board-table")
        yield PlotextChart(fast_p_draw(self.board), id="gen-board-chart")

    def set_board(self, board: list[dict[str, Any]]) -> None:
        self.board = board
        if not self.query("#gen-board-table"):
            return  # not composed yet: compose() draws self.board
        self.query_one("#gen-board-table", Static).update(board_text(board))
        self.query_one("#gen-board-chart", PlotextChart).set_draw(fast_p_draw(board))
