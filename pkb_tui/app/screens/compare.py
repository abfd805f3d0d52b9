"""Compare: two runs side by side (run A = the first marked), with B against A for the figures."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, cast

from rich.table import Table
from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import VerticalScroll
from textual.screen import Screen
from textual.widgets import Static

from pkb_tui.app.format import (
    NA,
    STATUS_STYLES,
    correct_mark,
    fmt_bytes,
    fmt_error,
    fmt_fraction,
    fmt_gbps,
    fmt_speedup,
    fmt_time,
    fmt_us,
    status_label,
)
from pkb_tui.app.widgets.keybar import KeyBar
from pkb_tui.errors import PkbError

if TYPE_CHECKING:
    from pkb_tui.app.app import PkbApp


def _result(run: dict[str, Any], variant: str, key: str) -> Any:
    return ((run.get("results") or {}).get(variant) or {}).get(key)


def ratio_text(a: float | None, b: float | None, *, lower_is_better: bool) -> Text:
    """B against A as a ratio with a mark saying which way is better (not colour alone)."""
    if a is None or b is None or a <= 0 or b <= 0:
        return Text("–", style="dim")
    ratio = b / a
    if abs(ratio - 1.0) < 0.005:
        return Text("= same", style="dim")
    better = ratio < 1.0 if lower_is_better else ratio > 1.0
    return Text(f"{ratio:.2f}× {'▲ better' if better else '▼ worse'}", style="green" if better else "red")


# (label, value getter, formatter, lower is better or None for no comparison)
Row = tuple[str, Callable[[dict[str, Any]], Any], Callable[[Any], Any], bool | None]

ROWS: list[Row] = [
    ("task", lambda r: r["task_id"], str, None),
    ("model", lambda r: r["model"], str, None),
    ("status", lambda r: r["status"],
     lambda s: Text(status_label(s), style=STATUS_STYLES.get(s, "")), None),
    ("setup", lambda r: f"ws {r['world_size']} · {r['mode']} · {r['dtype']} · {r['size']}", str, None),
    ("host", lambda r: (r.get("host") or {}).get("hostname") or NA, str, None),
    ("correct", lambda r: (_result(r, "candidate", "correct"), _result(r, "candidate", "trials_passed"),
                           _result(r, "candidate", "trials_total")),
     lambda v: Text(f"{correct_mark(v[0])} {v[1] or 0}/{v[2] or 0}", style="green" if v[0] else "red"), None),
    ("max abs err", lambda r: _result(r, "candidate", "max_abs_error"), fmt_error, None),
    ("cand median", lambda r: _result(r, "candidate", "median_us"), fmt_us, True),
    ("base median", lambda r: _result(r, "baseline", "median_us"), fmt_us, True),
    ("cand p90", lambda r: _result(r, "candidate", "p90_us"), fmt_us, True),
    ("speedup", lambda r: _result(r, "candidate", "speedup"), fmt_speedup, False),
    ("roofline", lambda r: _result(r, "candidate", "roofline_fraction"), fmt_fraction, False),
    ("bus bw", lambda r: _result(r, "candidate", "bus_bandwidth_gbps"), fmt_gbps, False),
    ("NVLink/iter", lambda r: _result(r, "candidate", "link_bytes_per_iter"), fmt_bytes, True),
]


def compare_table(run_a: dict[str, Any], run_b: dict[str, Any], *, utc: bool) -> Table:
    table = Table(expand=True, box=None, padding=(0, 1), header_style="bold", pad_edge=False)
    table.add_column("", style="bold", no_wrap=True)
    table.add_column(f"A  #{run_a['id']}", ratio=1, overflow="fold")
    table.add_column(f"B  #{run_b['id']}", ratio=1, overflow="fold")
    table.add_column("B vs A", no_wrap=True)
    rows = ROWS + [("when", lambda r: r["created_at"], lambda t: fmt_time(t, utc=utc), None)]
    for label, get, show, lower_is_better in rows:
        a, b = get(run_a), get(run_b)
        versus = ratio_text(a, b, lower_is_better=lower_is_better) if lower_is_better is not None else Text("")
        table.add_row(label, show(a) if a is not None else Text(NA, style="dim"),
                      show(b) if b is not None else Text(NA, style="dim"), versus)
    return table


class CompareScreen(Screen):
    BINDINGS = [
        Binding("escape,backspace", "app.pop_screen", "Back"),
        Binding("a", "open(0)", "Open A"),
        Binding("b", "open(1)", "Open B"),
        Binding("w", "swap", "Swap A/B"),
    ]

    def __init__(self, run_a: int, run_b: int) -> None:
        super().__init__()
        self.run_ids = [run_a, run_b]

    @property
    def pkb(self) -> PkbApp:
        return cast("PkbApp", self.app)

    def compose(self) -> ComposeResult:
        with VerticalScroll():
            yield Static("", id="compare-title")
            yield Static("", id="compare-table")
        yield KeyBar()

    def on_mount(self) -> None:
        self.load()

    def load(self) -> None:
        try:
            run_a, run_b = (self.pkb.store.run(r) for r in self.run_ids)
        except PkbError as exc:
            self.query_one("#compare-title", Static).update(Text(str(exc), style="bold red"))
            return
        title = Text.assemble(("Compare ", "bold"), (f"#{run_a['id']}", "bold"), " (A) with ",
                              (f"#{run_b['id']}", "bold"), " (B)")
        if run_a["task_id"] != run_b["task_id"]:
            title.append("\n⚠ different tasks: times do not compare", style="yellow")
        elif (run_a["world_size"], run_a["size"], run_a["dtype"]) != (run_b["world_size"], run_b["size"], run_b["dtype"]):
            title.append("\n⚠ different world size, size or dtype", style="yellow")
        self.query_one("#compare-title", Static).update(title)
        self.query_one("#compare-table", Static).update(compare_table(run_a, run_b, utc=self.pkb.config.utc))

    def action_open(self, index: int) -> None:
        self.pkb.open_result(self.run_ids[index])

    def action_swap(self) -> None:
        self.run_ids.reverse()
        self.load()
