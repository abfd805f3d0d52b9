"""The History filters picker: task, model, status, date and host, in a modal opened with `f`.
Composed only when asked for, so History itself opens fast."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.screen import ModalScreen
from textual.widgets import Label, Select, Static

from pkb_tui.app.format import status_mark, truncate
from pkb_tui.store.statuses import STATUSES as RUN_STATUSES

ANY = "any"
PERIODS = ((ANY, "any time"), ("1d", "last 24 h"), ("7d", "last 7 days"), ("30d", "last 30 days"))
PERIOD_S = {"1d": 86_400.0, "7d": 7 * 86_400.0, "30d": 30 * 86_400.0}


@dataclass(frozen=True)
class RunFilters:
    """What History shows; None is "any"."""

    task: str | None = None
    model: str | None = None
    status: str | None = None
    period: str | None = None  # 1d, 7d, 30d
    host_id: int | None = None

    def store_kwargs(self, now: float) -> dict[str, Any]:
        """The Store.runs() / count_runs_where() keywords."""
        return {
            "task": self.task, "model": self.model, "status": self.status, "host_id": self.host_id,
            "since": now - PERIOD_S[self.period] if self.period else None,
        }

    def describe(self, hosts: dict[int, str]) -> str:
        period = dict(PERIODS).get(self.period or ANY, self.period)
        host = hosts.get(self.host_id, str(self.host_id)) if self.host_id is not None else ANY
        return (f"task {self.task or ANY} · model {self.model or ANY} · "
                f"status {f'{status_mark(self.status)} {self.status}' if self.status else ANY} · {period} · host {host}")

    def with_(self, **changes: Any) -> RunFilters:
        return replace(self, **changes)


class FilterScreen(ModalScreen[RunFilters | None]):
    BINDINGS = [
        Binding("escape", "dismiss(None)", "Cancel"),
        Binding("ctrl+s,a", "apply", "Apply"),
        Binding("c", "clear", "Clear all"),
    ]

    def __init__(self, current: RunFilters, *, tasks: list[str], models: list[str], hosts: dict[int, str]) -> None:
        super().__init__()
        self.current, self.tasks, self.models, self.hosts = current, tasks, models, hosts

    def compose(self) -> ComposeResult:
        def select(options: list[tuple[str, Any]], value: Any, id: str) -> Select:
            values = [v for _, v in options]
            return Select(options, value=value if value in values else ANY, allow_blank=False, id=id, compact=True)

        current = self.current
        with Vertical(id="filter-box"):
            yield Static("Show runs of", id="filter-title")
            rows = [
                ("task", select([(ANY, ANY)] + [(truncate(t, 30), t) for t in self.tasks], current.task or ANY, "filter-task")),
                ("model", select([(ANY, ANY)] + [(truncate(m, 30), m) for m in self.models], current.model or ANY, "filter-model")),
                ("status", select([(ANY, ANY)] + [(f"{status_mark(s)} {s}", s) for s in RUN_STATUSES],
                                  current.status or ANY, "filter-status")),
                ("date", select([(label, key) for key, label in PERIODS], current.period or ANY, "filter-period")),
                ("host", select([(ANY, ANY)] + [(truncate(h, 30), i) for i, h in self.hosts.items()],
                                current.host_id if current.host_id is not None else ANY, "filter-host")),
            ]
            for label, widget in rows:
                yield Horizontal(Label(label, classes="option-label"), widget, classes="option-row")
            yield Static("tab next · enter list · a apply · c clear · esc cancel", id="filter-help")

    def on_mount(self) -> None:
        self.query_one("#filter-task", Select).focus()

    def chosen(self) -> RunFilters:
        def value(select_id: str) -> Any:
            v = self.query_one(select_id, Select).value
            return None if v in (ANY, Select.BLANK) else v

        return RunFilters(task=value("#filter-task"), model=value("#filter-model"), status=value("#filter-status"),
                          period=value("#filter-period"), host_id=value("#filter-host"))

    def action_apply(self) -> None:
        self.dismiss(self.chosen())

    def action_clear(self) -> None:
        self.dismiss(RunFilters())
