"""History: every run, filterable by task, model, status, date and host, sortable, opened with
Enter; two runs compared side by side; and the leaderboard per model (`b`)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, cast

from rich.text import Text
from textual import on
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal
from textual.screen import Screen
from textual.widgets import ContentSwitcher, DataTable, Footer, Label, Select, Static

from pkb_tui.app.format import (
    STATUS_STYLES, correct_mark, fmt_speedup, fmt_time, fmt_us, status_label, status_mark, truncate,
)
from pkb_tui.app.widgets.nav import NavBar
from pkb_tui.store.schema import RUN_STATUSES

if TYPE_CHECKING:
    from pkb_tui.app.app import PkbApp

ANY = "any"
SORTS = (  # (Store.runs order_by, label)
    ("id", "run"), ("created", "date"), ("task", "task"), ("model", "model"), ("status", "status"),
    ("speedup", "speedup"), ("candidate_us", "cand time"), ("baseline_us", "base time"),
)
COLUMN_SORT = {"id": "id", "task": "task", "model": "model", "status": "status", "speedup": "speedup",
               "cand": "candidate_us", "base": "baseline_us", "when": "created"}
PERIODS = ((ANY, "any time"), ("1d", "last 24 h"), ("7d", "last 7 days"), ("30d", "last 30 days"))
PERIOD_S = {"1d": 86_400.0, "7d": 7 * 86_400.0, "30d": 30 * 86_400.0}


def leaderboard_rows(board: list[dict[str, Any]]) -> list[tuple[str, ...]]:
    """The leaderboard as the table shows it: counts out of the tasks each model ran."""
    rows = []
    for entry in board:
        tasks = entry["tasks"]
        geomean = entry["geomean_speedup"]
        rows.append((
            entry["model"], str(tasks), f"{entry['correct']}/{tasks}", f"{entry['fast_1']}/{tasks}",
            f"{entry['fast_1_5']}/{tasks}", "n/a" if geomean is None else f"{geomean:.2f}×",
        ))
    return rows


class HistoryScreen(Screen):
    BINDINGS = [
        Binding("enter", "open", "Open", show=False),
        Binding("space", "mark", "Mark"),
        Binding("c", "compare", "Compare"),
        Binding("s", "next_sort", "Sort"),
        Binding("r", "reverse", "Reverse order", show=False),
        Binding("b", "toggle_board", "Leaderboard"),
        Binding("f", "focus_filters", "Filters"),
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

    @property
    def pkb(self) -> "PkbApp":
        return cast("PkbApp", self.app)

    def compose(self) -> ComposeResult:
        yield NavBar("history")
        with Horizontal(id="history-filters"):
            yield Select([(ANY, ANY)], value=ANY, allow_blank=False, id="filter-task", compact=True, prompt="task")
            yield Select([(ANY, ANY)], value=ANY, allow_blank=False, id="filter-model", compact=True)
            yield Select([(ANY, ANY)] + [(f"{status_mark(s)} {s}", s) for s in RUN_STATUSES], value=ANY,
                         allow_blank=False, id="filter-status", compact=True)
            yield Select([(label, key) for key, label in PERIODS], value=ANY, allow_blank=False,
                         id="filter-period", compact=True)
            yield Select([(ANY, ANY)], value=ANY, allow_blank=False, id="filter-host", compact=True)
        yield Label("", id="history-title")
        with ContentSwitcher(initial="runs", id="history-switcher"):
            yield DataTable(id="runs", cursor_type="row", zebra_stripes=True)
            yield DataTable(id="leaderboard", cursor_type="row", zebra_stripes=True)
        yield Static("", id="history-preview")
        yield Footer()

    def on_mount(self) -> None:
        runs = self.query_one("#runs", DataTable)
        for label, key in ((" ", "mark"), ("run", "id"), ("", "status"), ("task", "task"), ("model", "model"),
                           ("speedup", "speedup"), ("cand", "cand"), ("base", "base"), ("ok", "ok"),
                           ("when", "when"), ("host", "host")):
            runs.add_column(label, key=key)
        board = self.query_one("#leaderboard", DataTable)
        for label, key in (("model", "model"), ("tasks", "tasks"), ("correct", "correct"), ("fast_1", "fast_1"),
                           ("fast_1.5", "fast_1_5"), ("geomean speedup", "geomean")):
            board.add_column(label, key=key)
        self._fill_filter_choices()
        self.reload()
        runs.focus()

    def on_screen_resume(self) -> None:
        self._fill_filter_choices()
        self.reload()

    # ------------------------------------------------------------------ filters
    def _fill_filter_choices(self) -> None:
        store = self.pkb.store
        for select_id, values in (("#filter-task", store.run_values("task")), ("#filter-model", store.run_values("model"))):
            select = self.query_one(select_id, Select)
            current = select.value
            with self.prevent(Select.Changed):
                select.set_options([(ANY, ANY)] + [(truncate(v, 22), v) for v in values])
                select.value = current if current in values else ANY
        hosts = self.query_one("#filter-host", Select)
        current = hosts.value
        choices = [(ANY, ANY)] + [(truncate(h["hostname"], 20), h["id"]) for h in store.hosts()]
        with self.prevent(Select.Changed):
            hosts.set_options(choices)
            hosts.value = current if current in [c[1] for c in choices] else ANY

    def filters(self) -> dict[str, Any]:
        """The Store.runs() keyword filters the selects stand for."""
        def value(select_id: str) -> Any:
            v = self.query_one(select_id, Select).value
            return None if v in (ANY, Select.BLANK) else v

        out: dict[str, Any] = {
            "task": value("#filter-task"), "model": value("#filter-model"), "status": value("#filter-status"),
            "host_id": value("#filter-host"),
        }
        period = value("#filter-period")
        out["since"] = self.pkb.config.clock() - PERIOD_S[period] if period else None
        return out

    @on(Select.Changed)
    def _filter_changed(self, event: Select.Changed) -> None:
        if event.select.id and event.select.id.startswith("filter-"):
            self.reload()

    # ------------------------------------------------------------------ loading
    def reload(self) -> None:
        """Reload the first page of runs (and the leaderboard) for the current filters and order."""
        table = self.query_one("#runs", DataTable)
        keep = self._row_ids[table.cursor_row] if self._row_ids and table.cursor_row < len(self._row_ids) else None
        table.clear()
        self._row_ids = []
        self._runs = {}
        self.loaded = 0
        filters = self.filters()
        self.total = self.pkb.store.count_runs_where(**filters)
        self._load_page()
        if keep in self._row_ids:
            table.move_cursor(row=self._row_ids.index(keep))
        self._fill_leaderboard(filters.get("task"))
        self._update_title()
        self._update_preview()

    def _load_page(self) -> None:
        rows = self.pkb.store.runs(
            **self.filters(), order_by=self.order_by, descending=self.descending,
            limit=self.pkb.config.history_page, offset=self.loaded,
        )
        table = self.query_one("#runs", DataTable)
        utc = self.pkb.config.utc
        for run in rows:
            status = run["status"]
            style = STATUS_STYLES.get(status, "")
            speedup = run.get("speedup")
            table.add_row(
                Text("●", style="bold yellow") if run["id"] in self.marked else Text(" "),
                str(run["id"]), Text(status_mark(status), style=style), truncate(run["task_id"], 18),
                truncate(run["model"], 16),
                Text(fmt_speedup(speedup), style="green" if (speedup or 0) > 1 else ""),
                fmt_us(run.get("candidate_median_us")), fmt_us(run.get("baseline_median_us")),
                Text(correct_mark(run.get("candidate_correct")),
                     style="green" if run.get("candidate_correct") else "red"),
                fmt_time(run["created_at"], utc=utc)[5:], truncate(run.get("hostname") or "–", 14),
                key=str(run["id"]),
            )
            self._row_ids.append(run["id"])
            self._runs[run["id"]] = run
        self.loaded += len(rows)

    def _fill_leaderboard(self, task: str | None) -> None:
        board = self.query_one("#leaderboard", DataTable)
        board.clear()
        entries = self.pkb.store.leaderboard(task_ids=[task] if task else None)
        for row in leaderboard_rows(entries):
            board.add_row(*row, key=row[0])

    def _update_title(self) -> None:
        label = dict(SORTS)[self.order_by]
        arrow = "↓" if self.descending else "↑"
        if self.query_one("#history-switcher", ContentSwitcher).current == "leaderboard":
            title = "Leaderboard (latest run per task): fast_p = correct and > p× the baseline"
        else:
            title = f"Runs: {self.loaded:,} of {self.total:,} · sorted by {label} {arrow}"
            if self.marked:
                title += " · marked " + ", ".join(f"#{r}" for r in self.marked)
        self.query_one("#history-title", Label).update(title)

    @on(DataTable.RowHighlighted, "#runs")
    def _highlighted(self, event: DataTable.RowHighlighted) -> None:
        # Page in more runs when the cursor nears the end of what is loaded.
        if event.cursor_row >= self.loaded - 5 and self.loaded < self.total:
            self._load_page()
            self._update_title()
        self._update_preview()

    def _update_preview(self) -> None:
        preview = self.query_one("#history-preview", Static)
        run_id = self.highlighted()
        if run_id is None:
            preview.update(Text("No runs match. Launch one with l, or widen the filters.", style="dim")
                           if not self.total else "")
            return
        run = self._runs.get(run_id)
        if run is None:
            preview.update("")
            return
        text = Text(no_wrap=True, overflow="ellipsis")
        text.append(f"#{run_id} {status_label(run['status'])}", style=STATUS_STYLES.get(run["status"], ""))
        text.append(f"  ws {run['world_size']} · {run['mode']} · {run['dtype']} · {run['size']}", style="dim")
        if run["status_detail"]:
            text.append(f"  {run['status_detail'].splitlines()[0]}", style="red")
        preview.update(text)

    # ------------------------------------------------------------------ actions
    def highlighted(self) -> int | None:
        table = self.query_one("#runs", DataTable)
        if not self._row_ids or table.cursor_row >= len(self._row_ids):
            return None
        return self._row_ids[table.cursor_row]

    def action_open(self) -> None:
        if self.query_one("#history-switcher", ContentSwitcher).current == "leaderboard":
            self._filter_to_leaderboard_model()
            return
        run_id = self.highlighted()
        if run_id is not None:
            self.pkb.open_result(run_id)

    @on(DataTable.RowSelected, "#runs")
    def _selected(self) -> None:
        self.action_open()

    @on(DataTable.RowSelected, "#leaderboard")
    def _board_selected(self) -> None:
        self._filter_to_leaderboard_model()

    def _filter_to_leaderboard_model(self) -> None:
        board = self.query_one("#leaderboard", DataTable)
        if not board.row_count:
            return
        model = board.coordinate_to_cell_key((board.cursor_row, 0)).row_key.value
        self.query_one("#history-switcher", ContentSwitcher).current = "runs"
        self.query_one("#filter-model", Select).value = model
        self.query_one("#runs", DataTable).focus()

    def action_mark(self) -> None:
        run_id = self.highlighted()
        if run_id is None:
            return
        if run_id in self.marked:
            self.marked.remove(run_id)
        else:
            self.marked.append(run_id)
            self.marked = self.marked[-2:]
        table = self.query_one("#runs", DataTable)
        for rid in self._row_ids:
            mark = Text("●", style="bold yellow") if rid in self.marked else Text(" ")
            if table.get_cell(str(rid), "mark").plain != mark.plain:
                table.update_cell(str(rid), "mark", mark)
        if table.cursor_row < table.row_count - 1:
            table.move_cursor(row=table.cursor_row + 1)
        self._update_title()

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

    @on(DataTable.HeaderSelected, "#runs")
    def _header_selected(self, event: DataTable.HeaderSelected) -> None:
        order = COLUMN_SORT.get(str(event.column_key.value))
        if order is None:
            return
        if order == self.order_by:
            self.descending = not self.descending
        else:
            self.order_by = order
        self.reload()

    def action_toggle_board(self) -> None:
        switcher = self.query_one("#history-switcher", ContentSwitcher)
        switcher.current = "leaderboard" if switcher.current == "runs" else "runs"
        self.query_one(f"#{switcher.current}", DataTable).focus()
        self._update_title()

    def action_focus_filters(self) -> None:
        self.query_one("#filter-task", Select).focus()

    def action_focus_table(self) -> None:
        switcher = self.query_one("#history-switcher", ContentSwitcher)
        self.query_one(f"#{switcher.current}", DataTable).focus()
