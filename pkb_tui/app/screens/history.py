"""History: every run, filterable by task, model, status, date and host, sortable, opened with
Enter; two runs compared side by side; and the leaderboard per model (`b`)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, cast

from rich.text import Text
from textual import on
from textual.app import ComposeResult
from textual.binding import Binding
from textual.screen import Screen
from textual.widgets import ContentSwitcher, Label, Static

from pkb_tui.app.format import (
    STATUS_STYLES,
    fmt_speedup,
    fmt_time,
    fmt_us,
    status_label,
    status_mark,
)
from pkb_tui.app.screens.filters import FilterScreen, RunFilters
from pkb_tui.app.widgets.keybar import KeyBar
from pkb_tui.app.widgets.nav import NavBar
from pkb_tui.app.widgets.row_list import Column, RowList
from pkb_tui.engine.modes import CPU_MODE_LABEL
from pkb_tui.errors import PkbError

if TYPE_CHECKING:
    from pkb_tui.app.app import PkbApp


def _show(widget: Static, content: Text | str) -> None:
    """Update a line only when what it says changed: Static.update always asks for a new layout
    and a redraw, and the preview is set twice on open (by reload, then by the cursor's message)."""
    if getattr(widget, "_pkb_shown", None) != content:
        widget._pkb_shown = content  # type: ignore[attr-defined]
        widget.update(content)

SORTS = (  # (Store.runs order_by, label)
    ("id", "run"), ("created", "date"), ("task", "task"), ("model", "model"), ("status", "status"),
    ("speedup", "speedup"), ("candidate_us", "cand time"), ("baseline_us", "base time"),
)
COLUMN_SORT = {"id": "id", "task": "task", "model": "model", "status": "status", "speedup": "speedup",
               "cand": "candidate_us", "base": "baseline_us", "when": "created"}
# Sized so that 80 columns show everything up to the date; the host gets what is left.
RUN_COLUMNS = [
    Column("mark", " ", 1), Column("id", "run", 5, "right"), Column("status", "", 1), Column("task", "task", 15, grow_to=30),
    Column("model", "model", 14, grow_to=30), Column("speedup", "speedup", 8, "right"), Column("cand", "cand", 8, "right"),
    Column("base", "base", 8, "right"), Column("when", "when", 11), Column("host", "host", 12),
]
BOARD_COLUMNS = [
    Column("model", "model", 22, grow_to=40), Column("tasks", "tasks", 5, "right"), Column("correct", "correct", 7, "right"),
    Column("fast_1", "fast_1", 7, "right"), Column("fast_1_5", "fast_1.5", 8, "right"),
    Column("geomean", "geomean speedup", 15, "right"), Column("rest", "", 0),
]


def leaderboard_rows(board: list[dict[str, Any]]) -> list[tuple[str, ...]]:
    """The leaderboard as the table shows it: counts out of the tasks each model ran."""
    rows: list[tuple[str, ...]] = []
    for entry in board:
        tasks = entry["tasks"]
        geomean = entry["geomean_speedup"]
        rows.append((
            entry["model"], str(tasks), f"{entry['correct']}/{tasks}", f"{entry['fast_1']}/{tasks}",
            f"{entry['fast_1_5']}/{tasks}",
            ("n/a" if geomean is None else f"{geomean:.2f}×")
            + (f" ({entry['read_eager']} eager)" if entry.get("read_eager") else ""),  # graph basis, not capturable
        ))
    return rows


class HistoryScreen(Screen):
    BINDINGS = [
        Binding("space", "mark", "Mark"),
        Binding("c", "compare", "Compare"),
        Binding("s", "next_sort", "Sort"),
        Binding("r", "reverse", "Reverse order", show=False),
        Binding("b", "toggle_board", "Leaderboard"),
        Binding("e", "toggle_basis", "Speedup: eager/graph"),
        Binding("f", "filters", "Filters"),
        Binding("d", "delete", "Delete"),
        Binding("escape", "focus_table", "Table", show=False),
    ]

    def __init__(self) -> None:
        super().__init__()
        self.order_by = "id"
        self.descending = True
        self.marked: list[int] = []
        self.loaded = 0
        self.total = 0
        self._row_ids: list[int] = []  # table row -> run id
        self._runs: dict[int, dict[str, Any]] = {}  # the loaded runs' rows, for the preview line
        self.run_filters = RunFilters()
        self._hosts: dict[int, str] = {}
        self._data_version: int | None = None
        self._board_stale = True

    @property
    def pkb(self) -> PkbApp:
        return cast("PkbApp", self.app)

    def compose(self) -> ComposeResult:
        yield NavBar("history")
        yield Static("", id="history-filters")
        yield Label("", id="history-title")
        with ContentSwitcher(initial="runs", id="history-switcher"):
            yield RowList(RUN_COLUMNS, id="runs")  # the leaderboard is mounted when first shown
        yield Static("", id="history-preview")
        yield KeyBar()

    def on_mount(self) -> None:
        self.query_one("#runs", RowList).focus()

    def on_screen_resume(self) -> None:
        # Also runs when first shown. Reload only if something was written since we last looked
        # (a run finished, samples arrived): redrawing thousands of rows for nothing is slow.
        version = self.pkb.store.data_version()
        if version != self._data_version:
            self._data_version = version
            self._hosts = {h["id"]: h["hostname"] for h in self.pkb.store.hosts()}
            self.reload()

    # ------------------------------------------------------------------ filters
    def filters(self) -> dict[str, Any]:
        """The Store.runs() keyword filters for what is shown."""
        return self.run_filters.store_kwargs(self.pkb.config.clock())

    def set_filters(self, run_filters: RunFilters) -> None:
        if run_filters != self.run_filters:
            self.run_filters = run_filters
            self.reload()

    def action_filters(self) -> None:
        store = self.pkb.store

        def chosen(run_filters: RunFilters | None) -> None:
            if run_filters is not None:
                self.set_filters(run_filters)

        self.pkb.show(FilterScreen(self.run_filters, tasks=store.run_values("task"),
                                          models=store.run_values("model"), hosts=self._hosts), chosen)

    # ------------------------------------------------------------------ loading
    def reload(self) -> None:
        """Reload the first page of runs (and the leaderboard) for the current filters and order."""
        table = self.query_one("#runs", RowList)
        keep = self.highlighted()
        self._row_ids = []
        self._runs = {}
        self.loaded = 0
        filters = self.filters()
        self.total = self.pkb.store.count_runs_where(**filters)
        rows = self._fetch_page()
        table.set_rows(rows, cursor=self._row_ids.index(keep) if keep in self._row_ids else 0)
        self._board_stale = True
        if self.query_one("#history-switcher", ContentSwitcher).current == "leaderboard":
            self._fill_leaderboard()
        self._update_title()
        self._update_preview()

    def _fetch_page(self) -> list[list]:
        """The next page of runs as table rows (and remember their ids)."""
        runs = self.pkb.store.runs(
            **self.filters(), order_by=self.order_by, descending=self.descending,
            limit=self.pkb.config.history_page, offset=self.loaded, basis=self.pkb.config.speedup_basis,
        )
        rows = []
        for run in runs:
            rows.append(self._row(run))
            self._row_ids.append(run["id"])
            self._runs[run["id"]] = run
        self.loaded += len(runs)
        return rows

    def _row(self, run: dict[str, Any]) -> list:
        status = run["status"]
        speedup = run.get("speedup")
        low = run.get("speedup_low")
        # green: faster with confidence (the interval's lower end above 1); dim: within the noise
        style = "dim" if run.get("within_noise") else ("green" if (low if low is not None else speedup or 0) > 1 else "")
        return [
            Text("●", style="bold yellow") if run["id"] in self.marked else " ",
            str(run["id"]), Text(status_mark(status), style=STATUS_STYLES.get(status, "")), run["task_id"],
            run["model"], Text(fmt_speedup(speedup), style=style),
            fmt_us(run.get("candidate_median_us")), fmt_us(run.get("baseline_median_us")),
            fmt_time(run["created_at"], utc=self.pkb.config.utc)[5:], run.get("hostname") or "–",
        ]

    def _fill_leaderboard(self) -> None:
        if not self._board_stale:
            return
        self._board_stale = False
        task = self.filters().get("task")
        entries = self.pkb.store.leaderboard(task_ids=[task] if task else None, basis=self.pkb.config.speedup_basis)
        self.query_one("#leaderboard", RowList).set_rows([list(row) for row in leaderboard_rows(entries)])
        self._sync_gen_board(True)

    def _sync_gen_board(self, visible: bool) -> None:
        """The model endpoints' board (generate) under the leaderboard; mounted only once there is one."""
        from pkb_tui.app.widgets.gen_board import GenBoard
        from pkb_tui.generate.report import endpoint_leaderboard

        present = self.query(GenBoard)
        if not visible:
            for widget in present:
                widget.display = False
            return
        board = endpoint_leaderboard(self.pkb.store)
        if not board:
            return
        if present:
            present.first().set_board(board)
            present.first().display = True
        else:
            self.mount(GenBoard(board, id="gen-board"), before=self.query_one("#history-preview"))

    def _update_title(self) -> None:
        bar = Text(no_wrap=True, overflow="ellipsis")
        bar.append(self.run_filters.describe(self._hosts), style="bold" if self.run_filters != RunFilters() else "dim")
        bar.append("  f: filters", style="dim")
        _show(self.query_one("#history-filters", Static), bar)
        label = dict(SORTS)[self.order_by]
        arrow = "↓" if self.descending else "↑"
        if self.query_one("#history-switcher", ContentSwitcher).current == "leaderboard":
            title = (f"Leaderboard (latest run per task, {self.pkb.config.speedup_basis}): "
                     "fast_p: correct, low/(1+noise) > p×")
        else:
            title = f"Runs: {self.loaded:,} of {self.total:,} · sorted by {label} {arrow}"
            if self.marked:
                title += " · marked " + ", ".join(f"#{r}" for r in self.marked)
        _show(self.query_one("#history-title", Label), title)

    @on(RowList.Highlighted, "#runs")
    def _highlighted(self, event: RowList.Highlighted) -> None:
        # Page in more runs when the cursor nears the end of what is loaded.
        if event.index >= self.loaded - 5 and self.loaded < self.total:
            self.query_one("#runs", RowList).append_rows(self._fetch_page())
            self._update_title()
        self._update_preview()

    def _update_preview(self) -> None:
        preview = self.query_one("#history-preview", Static)
        run_id = self.highlighted()
        if run_id is None:
            _show(preview, Text("No runs match. Launch one with l, or widen the filters.", style="dim")
                  if not self.total else "")
            return
        run = self._runs.get(run_id)
        if run is None:
            _show(preview, "")
            return
        text = Text(no_wrap=True, overflow="ellipsis")
        text.append(f"#{run_id} {status_label(run['status'])}", style=STATUS_STYLES.get(run["status"], ""))
        text.append(f"  ws {run['world_size']} · {run['mode']} · {run['dtype']} · {run['size']}", style="dim")
        if run.get("speedup_low") is not None and run.get("speedup_high") is not None:
            text.append(f"  speedup [{run['speedup_low']:.2f}, {run['speedup_high']:.2f}]"
                        f"{' within noise' if run.get('within_noise') else ''}")
        if run["status_detail"]:
            text.append(f"  {run['status_detail'].splitlines()[0]}", style="red")
        if run["mode"] == "cpu":
            text.append(f"  ({CPU_MODE_LABEL})", style="yellow")
        _show(preview, text)

    # ------------------------------------------------------------------ actions
    def action_toggle_basis(self) -> None:
        """Speedups, times and the leaderboard from the other timing method (eager <-> graph)."""
        config = self.pkb.config
        config.speedup_basis = "graph" if config.speedup_basis == "eager" else "eager"
        self.notify(f"Speedups now use the {config.speedup_basis} timing.")
        self.reload()

    def highlighted(self) -> int | None:
        table = self.query_one("#runs", RowList)
        if not self._row_ids or table.cursor >= len(self._row_ids):
            return None
        return self._row_ids[table.cursor]

    def action_open(self) -> None:
        if self.query_one("#history-switcher", ContentSwitcher).current == "leaderboard":
            self._filter_to_leaderboard_model()
            return
        run_id = self.highlighted()
        if run_id is not None:
            self.pkb.open_result(run_id)

    @on(RowList.Selected, "#runs")
    def _selected(self) -> None:
        self.action_open()

    @on(RowList.Selected, "#leaderboard")
    def _board_selected(self) -> None:
        self._filter_to_leaderboard_model()

    def _filter_to_leaderboard_model(self) -> None:
        board = self.query_one("#leaderboard", RowList)
        if not board.row_count:
            return
        model = board.rows[board.cursor][0]
        self.query_one("#history-switcher", ContentSwitcher).current = "runs"
        self._sync_gen_board(False)
        self.set_filters(self.run_filters.with_(model=model))
        self.query_one("#runs", RowList).focus()
        self._update_title()

    def action_mark(self) -> None:
        run_id = self.highlighted()
        if run_id is None:
            return
        if run_id in self.marked:
            self.marked.remove(run_id)
        else:
            self.marked.append(run_id)
            self.marked = self.marked[-2:]
        table = self.query_one("#runs", RowList)
        for index, rid in enumerate(self._row_ids):
            marked = rid in self.marked
            if (table.rows[index][0] != " ") != marked:
                table.update_row(index, self._row(self._runs[rid]))
        table.cursor += 1
        self._update_title()

    def action_delete(self) -> None:
        """Delete the marked runs, else the highlighted one, after asking."""
        from pkb_tui.app.screens.confirm import ConfirmScreen

        current = self.highlighted()
        ids = list(self.marked) or ([current] if current is not None else [])
        if not ids:
            return
        names = ", ".join(f"#{i}" for i in ids)

        def answered(yes: bool | None) -> None:
            if not yes:
                return
            try:
                self.pkb.delete_runs(ids)
            except PkbError as exc:
                self.notify(str(exc), title="Cannot delete", severity="error", timeout=10)
                return
            self.marked = []
            self.notify(f"Deleted run {names}.", title="History")
            self.reload()

        self.pkb.show(ConfirmScreen(f"Delete run {names} with its results, trials, kernels and samples? "
                                    "This cannot be undone.", yes="Delete", no="Keep"), answered)

    def action_compare(self) -> None:
        pair = list(self.marked)
        current = self.highlighted()
        if len(pair) == 1 and current is not None and current != pair[0]:
            pair.append(current)
        if len(pair) != 2:
            self.notify("Mark two runs with space (or mark one and highlight another), then press c.",
                        severity="warning")
            return
        self.pkb.open_compare(pair[0], pair[1])

    def action_next_sort(self) -> None:
        keys = [k for k, _ in SORTS]
        self.order_by = keys[(keys.index(self.order_by) + 1) % len(keys)]
        self.reload()

    def action_reverse(self) -> None:
        self.descending = not self.descending
        self.reload()

    @on(RowList.HeaderClicked, "#runs")
    def _header_selected(self, event: RowList.HeaderClicked) -> None:
        order = COLUMN_SORT.get(event.column)
        if order is None:
            return
        if order == self.order_by:
            self.descending = not self.descending
        else:
            self.order_by = order
        self.reload()

    async def action_toggle_board(self) -> None:
        switcher = self.query_one("#history-switcher", ContentSwitcher)
        if switcher.current == "runs" and not self.query("#leaderboard"):
            # Mounted on first use: a hidden table still costs its mount and styling on every
            # first open of History, and most visits never show it.
            await switcher.add_content(RowList(BOARD_COLUMNS, id="leaderboard"))
        switcher.current = "leaderboard" if switcher.current == "runs" else "runs"
        if switcher.current == "leaderboard":
            self._fill_leaderboard()
            self._sync_gen_board(True)
        else:
            self._sync_gen_board(False)
        self.query_one(f"#{switcher.current}").focus()
        self._update_title()

    def action_focus_table(self) -> None:
        switcher = self.query_one("#history-switcher", ContentSwitcher)
        self.query_one(f"#{switcher.current}").focus()
