"""Launch: pick tasks and models, set the run options, queue the batch.

Opens on the tasks list. Space marks or unmarks the highlighted task and stays on it (none marked:
the highlighted one runs); `a` marks every listed task. `/` filters by task id and family (start the
filter with `?` to search titles and sources too), `f` cycles the family. Only `r` launches tasks x
models: Enter on the list never does. Options and marks are kept in a preset file next to the
database (app/preset.py), so the next session starts where this one left off.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, cast

from rich.text import Text
from textual import on, work
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.coordinate import Coordinate
from textual.screen import Screen
from textual.widgets import Checkbox, DataTable, Input, Label, Select, SelectionList, Static

from pkb_tui.app import preset
from pkb_tui.app.catalog import Catalog, TaskInfo
from pkb_tui.app.format import STATUS_STYLES, fmt_speedup, status_mark, truncate
from pkb_tui.app.widgets.keybar import KeyBar
from pkb_tui.app.widgets.nav import NavBar
from pkb_tui.app.widgets.toggles import TickBox, TickList
from pkb_tui.engine.modes import DTYPES, MODE_CHOICES
from pkb_tui.engine.request import RunRequest

if TYPE_CHECKING:
    from pkb_tui.app.app import PkbApp

ALL = "all"
WORLD_SIZES = (1, 2, 3, 4, 6, 8)
SIZES = ("small", "default", "large")
MARKED, UNMARKED = "☒ ", "☐ "  # a crossed and an empty box: marked tasks differ by shape, not colour alone
OTHER_COLUMNS_WIDTH = 5 + 9 + 10 + 4 * 2  # ranks, last, family, and each column's padding
MIN_TITLE_WIDTH = 20  # below this the title column is left out (the line under the list has it)
DESCRIPTIONS = "?"  # a filter starting with this searches titles and sources too


class LaunchScreen(Screen):
    BINDINGS = [
        Binding("space", "toggle_task", "Mark/unmark"),
        Binding("a", "toggle_all", "Mark all"),
        Binding("r", "launch", "Run"),
        Binding("slash", "focus_filter", "Filter", key_display="/"),
        Binding("f", "next_family", "Family"),
        Binding("o", "focus_options", "Options"),
        Binding("escape", "focus_tasks", "Tasks", show=False),
    ]

    def __init__(self) -> None:
        super().__init__()
        self.marked: set[str] = set()
        self.catalog: Catalog | None = None
        self._preset: dict = {}
        self.defaults: dict = {}  # the options shown first: the app's, over the saved preset
        self._data_version: int | None = None

    @property
    def pkb(self) -> PkbApp:
        return cast("PkbApp", self.app)

    def compose(self) -> ComposeResult:
        # The preset saved by the last launch, under what the app was given (tests pin that).
        self._preset = preset.load(self.pkb.config.db_path)
        defaults = self.defaults = {**self._preset, **self.pkb.config.defaults}
        self.marked = set(defaults.get("marked") or [])
        yield NavBar("launch")
        with Horizontal(id="launch-body"):
            with Vertical(id="tasks-pane"):
                with Horizontal(id="task-filter-row"):
                    yield Input(placeholder="/ id or family (?…: titles too)", id="task-filter", compact=True)
                    yield Select([(ALL, ALL)], value=ALL, allow_blank=False, id="family", compact=True)
                yield DataTable(id="tasks", cursor_type="row", zebra_stripes=True)
                yield Static("loading the tasks…", id="task-detail")
            with Vertical(id="side-pane"):
                yield Label("Models [dim](space marks)[/]", classes="pane-title")
                yield TickList(id="models", compact=True)
                yield Label("Options", classes="pane-title")
                yield _option("world size", Select(
                    [(str(n), n) for n in WORLD_SIZES], value=defaults.get("world_size", 2), allow_blank=False,
                    id="world-size", compact=True))
                yield _option("mode", Select(
                    [(m, m) for m in MODE_CHOICES], value=defaults.get("mode", "auto"), allow_blank=False,
                    id="mode", compact=True))
                yield _option("dtype", Select(
                    [(d, d) for d in DTYPES], value=defaults.get("dtype", "float32"), allow_blank=False,
                    id="dtype", compact=True))
                yield _option("size", Select(
                    [(s, s) for s in SIZES], value=defaults.get("size", "small"), allow_blank=False,
                    id="size", compact=True))
                yield _option("trials", Input(
                    str(defaults.get("trials", 3)), type="integer", id="trials", compact=True))
                yield TickBox("timing", value=defaults.get("timing", True), id="timing", compact=True)
                yield TickBox("oversubscribe", value=defaults.get("oversubscribe", False), id="oversubscribe",
                               compact=True, tooltip="more ranks than this box's CPU cores / GPUs")
                yield Static("", id="launch-summary")
        yield KeyBar()

    def on_mount(self) -> None:
        self._task_width = self._title_width = 0
        self._add_columns(20)
        self.query_one("#tasks", DataTable).focus()
        if self.pkb.catalog is not None:
            self._fill(self.pkb.catalog)
        else:
            self._load_catalog()

    def _fit_columns(self) -> bool:
        """The task column as wide as the longest id, but never so wide that family is cut: on a
        narrow terminal long ids end in an ellipsis (the line under the list names the task)."""
        longest = len(MARKED) + max((len(t.id) for t in (self.catalog.tasks if self.catalog else [])), default=10)
        # The region inside the scrollbar, when the list is long enough to have one.
        available = self.query_one("#tasks", DataTable).scrollable_content_region.width - OTHER_COLUMNS_WIDTH
        width = max(12, min(longest, available)) if available > 0 else longest
        title_width = available - width - 2 if available - width - 2 >= MIN_TITLE_WIDTH else 0
        if (width, title_width) == (self._task_width, self._title_width):
            return False
        self._task_width = width
        self._add_columns(width, title_width)
        return True

    def on_resize(self) -> None:
        if self.catalog is not None:
            self.call_after_refresh(self._refit)

    def _refit(self) -> None:
        if self._fit_columns():
            self._refill_tasks()

    def _add_columns(self, task_width: int, title_width: int = 0) -> None:
        # Fixed widths (a DataTable column never shrinks once a long id was seen). A wide terminal
        # also gets each task's title, in what is left after family.
        table = self.query_one("#tasks", DataTable)
        table.clear(columns=True)
        table.add_column("  task", key="task", width=task_width)
        table.add_column("ranks", key="ranks", width=5)
        table.add_column("last", key="last", width=9)
        table.add_column("family", key="family", width=10)
        self._title_width = title_width
        if title_width:
            table.add_column("title", key="title", width=title_width)

    def on_screen_resume(self) -> None:
        # The "last" column may have changed if a run finished meanwhile.
        version = self.pkb.store.data_version()
        if self.catalog is not None and version != self._data_version:
            self._data_version = version
            self._refill_tasks()

    def reload(self) -> None:
        if self.catalog is not None:
            self._refill_tasks()

    @work(thread=True, exclusive=True, group="catalog")
    def _load_catalog(self) -> None:
        try:
            catalog = self.pkb.config.catalog()
        except Exception as exc:  # a broken task module must not take the dashboard down
            catalog = Catalog(problem=f"Could not list tasks: {exc}")
        self.app.call_from_thread(self._fill, catalog)

    def _fill(self, catalog: Catalog) -> None:
        self.pkb.catalog = catalog
        self.catalog = catalog
        family = self.query_one("#family", Select)
        family.set_options([(ALL, ALL)] + [(f, f) for f in catalog.families])
        family.value = ALL
        models = self.query_one("#models", SelectionList)
        models.clear_options()
        wanted = self.defaults.get("models")
        if wanted is None:  # the solution set covering the most tasks, else the baseline self-check
            real = sorted((m for m in catalog.models if m.name != "baseline" and m.covered), key=lambda m: -m.covered)
            wanted = [real[0].name] if real else ["baseline"]
        for model in catalog.models:
            label = Text(f"{truncate(model.name, 20):<20} {model.covered:>2}/{model.total}")
            models.add_option((label, model.name, model.name in wanted))
        if catalog.problem:
            self.notify(catalog.problem, title="Task catalogue", severity="warning", timeout=10)
        self.marked &= {t.id for t in catalog.tasks}  # a preset may name tasks that are gone
        self._fit_columns()
        self._refill_tasks()
        self.on_resize()  # again once the rows are in: a long list brings a scrollbar

    # ------------------------------------------------------------------ the tasks table
    def visible_tasks(self) -> list[TaskInfo]:
        if self.catalog is None:
            return []
        text = self.query_one("#task-filter", Input).value.strip().lower()
        everywhere = text.startswith(DESCRIPTIONS)
        text = text.removeprefix(DESCRIPTIONS).strip()
        family = self.query_one("#family", Select).value
        out = []
        for task in self.catalog.tasks:
            if family not in (ALL, Select.BLANK) and task.family != family:
                continue
            haystack = f"{task.id} {task.family}" + (f" {task.title} {task.source}" if everywhere else "")
            if text and text not in haystack.lower():
                continue
            out.append(task)
        return out

    def _refill_tasks(self) -> None:
        table = self.query_one("#tasks", DataTable)
        keep = None
        if table.row_count and table.cursor_row is not None and table.cursor_row < table.row_count:
            keep = table.coordinate_to_cell_key(Coordinate(table.cursor_row, 0)).row_key.value
        latest = self.pkb.store.latest_run_per_task()
        table.clear()
        for task in self.visible_tasks():
            table.add_row(*self._row(task, latest.get(task.id)), key=task.id)
        if keep is not None and keep in [t.id for t in self.visible_tasks()]:
            table.move_cursor(row=table.get_row_index(keep))
        self._update_detail()
        self._update_summary()

    def _task_cell(self, task_id: str) -> Text:
        text = (Text.assemble((MARKED, "bold magenta"), (task_id, "bold")) if task_id in self.marked
                else Text.assemble((UNMARKED, "dim"), task_id))
        text.truncate(self._task_width or 30, overflow="ellipsis")
        return text

    def _row(self, task: TaskInfo, last: dict | None) -> tuple:
        if last is None:
            last_text = Text("–", style="dim")
        else:
            status = last["status"]
            figure = fmt_speedup(last["speedup"]) if last["speedup"] is not None else status
            last_text = Text(f"{status_mark(status)} {figure}", style=STATUS_STYLES.get(status, ""))
        row = (self._task_cell(task.id), task.world_sizes_label, last_text, task.family)
        if self._title_width:
            return (*row, Text(task.title, style="dim", no_wrap=True, overflow="ellipsis"))
        return row

    def highlighted_task(self) -> str | None:
        table = self.query_one("#tasks", DataTable)
        if not table.row_count:
            return None
        return table.coordinate_to_cell_key(Coordinate(table.cursor_row, 0)).row_key.value

    @on(DataTable.RowHighlighted, "#tasks")
    def _highlighted(self) -> None:
        self._update_detail()

    def _update_detail(self) -> None:
        detail = self.query_one("#task-detail", Static)
        task_id = self.highlighted_task()
        task = next((t for t in (self.catalog.tasks if self.catalog else []) if t.id == task_id), None)
        if task is None:
            detail.update("")
            return
        first = Text.assemble((task.title, "bold"), f" · {task.family} · {', '.join(task.dtypes)} · {', '.join(task.modes)}")
        first.no_wrap, first.overflow = True, "ellipsis"
        second = Text(task.source, style="dim", no_wrap=True, overflow="ellipsis")
        detail.update(Text("\n").join([first, second]))

    # ------------------------------------------------------------------ choosing
    def chosen_tasks(self) -> list[str]:
        if self.marked:
            order = [t.id for t in (self.catalog.tasks if self.catalog else [])]
            return [t for t in order if t in self.marked]
        task = self.highlighted_task()
        return [task] if task else []

    def chosen_models(self) -> list[str]:
        return list(self.query_one("#models", SelectionList).selected)

    def planned_runs(self) -> tuple[int, int]:
        """(runs the engine will start, task x model pairs left out for want of a solution)."""
        tasks, models = self.chosen_tasks(), self.chosen_models()
        infos = {m.name: m for m in (self.catalog.models if self.catalog else [])}
        runs = sum(1 for t in tasks for m in models if m not in infos or infos[m].covers(t))
        return runs, len(tasks) * len(models) - runs

    def _update_summary(self) -> None:
        tasks, models = self.chosen_tasks(), self.chosen_models()
        summary = self.query_one("#launch-summary", Static)
        if not tasks:
            summary.update(Text("no task", style="dim"))
            return
        what = f"{len(tasks)} marked task{'s' * (len(tasks) != 1)}" if self.marked else tasks[0]
        runs, missing = self.planned_runs()
        text = Text.assemble(
            (f"{what} × {len(models)} model{'s' * (len(models) != 1)} = {runs} run{'s' * (runs != 1)}", "bold"),
        )
        if missing:
            text.append(f"\n{missing} pair{'s' * (missing != 1)} without a solution left out", style="dim")
        text.append("\nr: run", style="dim")
        summary.update(text)

    @on(SelectionList.SelectedChanged, "#models")
    def _models_changed(self) -> None:
        self._update_summary()

    @on(Input.Changed, "#task-filter")
    def _filter_changed(self) -> None:
        self._refill_tasks()

    @on(Input.Submitted, "#task-filter")
    def _filter_submitted(self) -> None:
        self.action_focus_tasks()

    @on(Select.Changed, "#family")
    def _family_changed(self) -> None:
        self._refill_tasks()

    def action_toggle_task(self) -> None:
        task = self.highlighted_task()
        if task is None:
            return
        self.marked ^= {task}
        # The cursor stays on the task: marking is one key, moving another.
        self.query_one("#tasks", DataTable).update_cell(task, "task", self._task_cell(task))
        self._update_summary()

    def action_toggle_all(self) -> None:
        visible = {t.id for t in self.visible_tasks()}
        self.marked = self.marked - visible if visible <= self.marked else self.marked | visible
        self._refill_tasks()

    def action_focus_filter(self) -> None:
        self.query_one("#task-filter", Input).focus()

    def action_focus_tasks(self) -> None:
        self.query_one("#tasks", DataTable).focus()

    def action_focus_options(self) -> None:
        self.query_one("#world-size", Select).focus()

    def action_next_family(self) -> None:
        select = self.query_one("#family", Select)
        families = [ALL] + (self.catalog.families if self.catalog else [])
        current = select.value if select.value in families else ALL
        select.value = families[(families.index(current) + 1) % len(families)]

    # ------------------------------------------------------------------ launching
    def request(self) -> RunRequest | None:
        tasks, models = self.chosen_tasks(), self.chosen_models()
        if not tasks:
            self.notify("No task to run: highlight or mark one.", severity="warning")
            return None
        if not models:
            self.notify("No model chosen: mark one in Models (baseline runs the baseline itself).", severity="warning")
            return None
        trials_text = self.query_one("#trials", Input).value.strip()
        try:
            trials = int(trials_text)
        except ValueError:
            self.notify(f"Trials must be a whole number (got {trials_text!r}).", severity="error")
            return None
        mode = self.query_one("#mode", Select).value
        request = RunRequest(
            tasks=tasks, models=models,
            world_size=int(cast(int, self.query_one("#world-size", Select).value)),
            mode=None if mode == "auto" else str(mode),
            dtype=str(self.query_one("#dtype", Select).value),
            size=str(self.query_one("#size", Select).value),
            trials=trials,
            timing=self.query_one("#timing", Checkbox).value,
            oversubscribe=self.query_one("#oversubscribe", Checkbox).value,
        )
        for key in ("timeout_s", "iterations", "warmup", "profile"):
            if key in self.pkb.config.defaults:
                setattr(request, key, self.pkb.config.defaults[key])
        return request

    def action_launch(self) -> None:
        request = self.request()
        if request is not None and self.pkb.launch(request):
            # Marks stay (a batch is often run again); the options and marks outlive the session.
            self.save_preset(request)

    def save_preset(self, request: RunRequest) -> None:
        preset.save(self.pkb.config.db_path, {
            "world_size": request.world_size, "mode": request.mode or "auto", "dtype": request.dtype,
            "size": request.size, "trials": request.trials, "timing": request.timing,
            "oversubscribe": request.oversubscribe,
            "models": list(request.models), "marked": sorted(self.marked),
        })


def _option(label: str, widget) -> Horizontal:
    return Horizontal(Label(label, classes="option-label"), widget, classes="option-row")
