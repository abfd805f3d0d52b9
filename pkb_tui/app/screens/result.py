"""Result: one run, baseline | candidate side by side. Correctness (trials passed, largest error,
which rank), time (median and spread), a speedup gauge, a roofline gauge with where the bandwidth
figure came from, bytes on the wire against the traffic model, top kernels by category, and a
plotext chart of the timing spread or of the traffic recorded during the run (`g` switches)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, cast

from rich.console import Group
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
    bar,
    correct_mark,
    fmt_bytes,
    fmt_error,
    fmt_fraction,
    fmt_gbps,
    fmt_speedup,
    fmt_time,
    fmt_us,
    speedup_gauge,
    status_label,
)
from pkb_tui.app.widgets.chart import PlotextChart
from pkb_tui.app.widgets.keybar import KeyBar
from pkb_tui.engine.modes import CPU_MODE_LABEL
from pkb_tui.engine.timing import capped_at_alone
from pkb_tui.errors import PkbError
from pkb_tui.store.store import node_telemetry_line, node_wire_lines

if TYPE_CHECKING:
    from pkb_tui.app.app import PkbApp

VARIANTS = ("baseline", "candidate")
TOP_KERNELS = 5
GAUGE_WIDTH = 12


def run_title(run: dict[str, Any]) -> Text:
    status = run["status"]
    return Text.assemble(
        (f"Run #{run['id']}  ", "bold"), (run["task_id"], "bold"), " · ", run["model"], "  ",
        (status_label(status), f"bold {STATUS_STYLES.get(status, '')}"),
    )


def run_settings(run: dict[str, Any], *, utc: bool) -> str:
    host = run.get("host") or {}
    where = host.get("hostname") or "unknown host"
    if host.get("gpu_model"):
        where += f" ({host['gpu_model']} ×{host.get('gpu_count') or '?'})"
    trials = run.get("trials")
    return (f"ws {run['world_size']} · {run['mode']} · {run['dtype']} · {run['size']} · {trials or '?'} trials · "
            f"{fmt_time(run['created_at'], utc=utc)} · {where}")


def correctness_cell(result: dict[str, Any] | None) -> Text:
    if not result:
        return Text(NA, style="dim")
    correct = result.get("correct")
    text = Text(f"{correct_mark(correct)} {result.get('trials_passed') or 0}/{result.get('trials_total') or 0}",
                style="green" if correct else ("red" if correct is not None else "dim"))
    if result.get("max_abs_error") is not None:
        text.append(f"  err {fmt_error(result['max_abs_error'])}", style="")
        if result.get("worst_rank") is not None:
            text.append(f" (rank {result['worst_rank']})", style="dim")
    return text


def speedup_cell(result: dict[str, Any] | None, variant: str) -> Text:
    """The gauge, the speedup with its interval (1.52× [1.47, 1.58]), and whether this host's
    noise could explain it. Green only when the interval's lower end clears 1."""
    if variant == "baseline":
        return Text("1.00× (reference)", style="dim")
    result = result or {}
    speedup, low, high = result.get("speedup"), result.get("speedup_low"), result.get("speedup_high")
    faster = (low if low is not None else speedup or 0) > 1
    text = Text(speedup_gauge(speedup, GAUGE_WIDTH + 1), style="green" if faster else "yellow")
    text.append(f" {fmt_speedup(speedup)}", style="bold")
    if low is not None and high is not None:
        text.append(f" [{low:.2f}, {high:.2f}]")
    if result.get("within_noise"):
        floor = result.get("noise_floor_fraction")
        spread = f" (±{floor:.1%})" if floor else ""
        text.append(f"\nwithin this host's noise{spread}: not distinguishable from the baseline", style="yellow")
    if capped_at_alone(result.get("speedup_note")):
        text.append("\nthe speed of calls one at a time: in blocks it read more, which calls alone did not confirm",
                    style="yellow")
    return text


def method_row(cells: dict[str, dict[str, Any] | None], method: str) -> tuple[str, ...] | None:
    """A row of the other timing method's medians (eager or graph), or None when neither side has
    one; an absent graph figure shows its reason ("not capturable: ...")."""
    texts = []
    for variant in VARIANTS:
        result = cells[variant] or {}
        median = result.get(f"{method}_median_us")
        note = result.get(f"{method}_note")
        texts.append(Text(fmt_us(median)) if median is not None else Text(note or NA, style="dim"))
    if all(t.plain == NA for t in texts):
        return None
    return (f"{method} med", *texts)  # type: ignore[return-value,arg-type]


def roofline_cell(result: dict[str, Any] | None, traffic_source: str | None = None) -> Text:
    result = result or {}
    fraction = result.get("roofline_fraction")
    text = Text(bar(fraction, GAUGE_WIDTH), style="cyan")
    text.append(f" {fmt_fraction(fraction)}", style="bold")
    if result.get("roofline_bound"):
        text.append(f" {result['roofline_bound']}-bound")
    text.append(f"\nfloor {fmt_us(result.get('roofline_floor_us'))} · {result.get('bandwidth_source') or 'no bandwidth figure'}",
                style="dim")
    source = (result.get("traffic") or {}).get("source") or traffic_source
    if source:
        text.append(f"\ntraffic {source}", style="dim")
    return text


def wire_cell(result: dict[str, Any] | None) -> Text:
    result = result or {}
    traffic = result.get("traffic") or {}
    measured = result.get("link_bytes_per_iter")
    model = max(traffic.get("send_bytes") or 0, traffic.get("recv_bytes") or 0) if traffic else None
    text = Text(f"NVLink {fmt_bytes(measured)}", style="bold" if measured is not None else "dim")
    text.append(f" vs model {fmt_bytes(model)}")
    flag = result.get("traffic_flag")
    if flag == "below_model":
        text.append("\n⚠ below the model: traffic took another path", style="yellow")
    elif flag == "wasteful":
        ratio = f" ({measured / model:.1f}×)" if measured and model else ""
        text.append(f"\n⚠ more than the model{ratio}", style="yellow")
    elif flag:
        text.append(f"\n{flag}", style="dim")
    if result.get("pcie_bytes_per_iter") is not None:
        text.append(f"\nPCIe {fmt_bytes(result['pcie_bytes_per_iter'])}")
    return text


def comparison_table(run: dict[str, Any]) -> Table:
    results = run.get("results") or {}
    table = Table(box=None, expand=True, pad_edge=False, show_edge=False, padding=(0, 1))
    table.add_column("", style="bold", no_wrap=True, width=10)
    for variant in VARIANTS:
        table.add_column(variant, ratio=1, overflow="fold")
    rows: list[tuple[Any, ...]] = []  # (label, baseline cell, candidate cell)
    cells = {v: results.get(v) for v in VARIANTS}
    rows.append(("correct", *(correctness_cell(cells[v]) for v in VARIANTS)))
    picked = next((c.get("timing_method") for c in cells.values() if c and c.get("eager_median_us") is not None), None)
    rows.append((f"{picked} med" if picked else "median",
                 *(Text(fmt_us((cells[v] or {}).get("median_us")), style="bold") for v in VARIANTS)))
    if picked:
        other = method_row(cells, "graph" if picked == "eager" else "eager")
        if other is not None:
            rows.append(other)
    rows.append(("p10–p90", *(Text(f"{fmt_us((cells[v] or {}).get('p10_us'))} – {fmt_us((cells[v] or {}).get('p90_us'))}")
                              for v in VARIANTS)))
    rows.append(("min–max", *(Text(f"{fmt_us((cells[v] or {}).get('min_us'))} – {fmt_us((cells[v] or {}).get('max_us'))}",
                                   style="dim") for v in VARIANTS)))
    rows.append(("speedup", *(speedup_cell(cells[v], v) for v in VARIANTS)))
    # ParallelKernelBench problems have no hand-written model: theirs is measured (engine/interposer.py)
    measured = "measured from the baseline's calls" if str(run.get("task_id", "")).startswith("pkb/") else None
    rows.append(("roofline", *(roofline_cell(cells[v], measured) for v in VARIANTS)))
    rows.append(("bus bw", *(Text(fmt_gbps((cells[v] or {}).get("bus_bandwidth_gbps"))) for v in VARIANTS)))
    rows.append(("wire/iter", *(wire_cell(cells[v]) for v in VARIANTS)))
    for label, *values in rows:
        table.add_row(label, *values)
    return table


def trials_table(run: dict[str, Any]) -> Table | Text:
    trials = run.get("trial_results") or []
    if not trials:
        return Text("no trials recorded", style="dim")
    table = Table(box=None, pad_edge=False, padding=(0, 1), header_style="bold")
    for column in ("trial", "", "max abs", "max rel", "rank", "message"):
        table.add_column(column, no_wrap=column != "message")
    for trial in trials:
        name = "timed" if trial["trial"] < 0 else str(trial["trial"] + 1)
        table.add_row(
            name, Text(correct_mark(trial["correct"]), style="green" if trial["correct"] else "red"),
            fmt_error(trial.get("max_abs_error")), fmt_error(trial.get("max_rel_error")),
            str(trial["worst_rank"]) if trial.get("worst_rank") is not None else "–",
            trial.get("message") or "",
        )
    return table


def verdicts_note(run: dict[str, Any]) -> Text | None:
    """Both verdicts, when a ParallelKernelBench run's two checks (this project's and PKB's
    allclose) disagree on some trial: the judging one and the other, trial by trial."""
    from pkb_tui.engine.compare import VERDICTS_DIFFER

    trials = [t for t in run.get("trial_results") or [] if t["trial"] >= 0]
    differing = [t for t in trials if VERDICTS_DIFFER in (t.get("message") or "")]
    if not differing:
        return None
    pkb = ((run.get("request") or {}).get("extra") or {}).get("pkb") or {}
    judge, other = ("PKB's allclose(1e-2, 1e-2)", "pkb-tui's check") if pkb.get("tolerance") == "pkb" \
        else ("pkb-tui's check", "PKB's allclose(1e-2, 1e-2)")
    judged_passed = sum(1 for t in trials if t["correct"])
    other_passed = judged_passed + sum(1 if not t["correct"] else -1 for t in differing)
    return Text(f"verdicts differ: {judge} (judging) {judged_passed}/{len(trials)} trials, "
                f"{other} {other_passed}/{len(trials)}", style="yellow")


def kernels_coverage(run: dict[str, Any]) -> str:
    """What the kernel table's calls and totals cover: how many profiled calls, which rank."""
    from collectors.profiler import PROFILE_CALLS

    kernels = run.get("kernels") or []
    if not kernels:
        return ""
    ranks = sorted({k["rank"] for k in kernels})
    shown = "rank 0" if 0 in ranks else f"rank {ranks[0]}"
    return (f"{shown} over {PROFILE_CALLS} profiled calls per variant (of {len(ranks)} rank(s) profiled; "
            "`pkb-tui show` lists them all)")


def kernels_table(run: dict[str, Any]) -> Table | Text:
    kernels = run.get("kernels") or []
    if not kernels:
        return Text("no kernel profile recorded", style="dim")
    table = Table(box=None, pad_edge=False, padding=(0, 1), header_style="bold", expand=True)
    table.add_column("var", no_wrap=True)
    table.add_column("kernel", ratio=1, no_wrap=True, overflow="ellipsis")
    table.add_column("kind", no_wrap=True)
    table.add_column("calls", justify="right", no_wrap=True)
    table.add_column("total", justify="right", no_wrap=True)
    table.add_column("share", justify="right", no_wrap=True)
    for variant in VARIANTS:
        # Rank 0's profile stands for the run; other ranks' rows stay in the database.
        rows = [k for k in kernels if k["variant"] == variant and k["rank"] == 0] or [k for k in kernels if k["variant"] == variant]
        for kernel in sorted(rows, key=lambda k: -k["total_us"])[:TOP_KERNELS]:
            table.add_row(
                "cand" if variant == "candidate" else "base", kernel["name"], kernel["category"], str(kernel["calls"]),
                fmt_us(kernel["total_us"]), fmt_fraction(kernel.get("share_fraction")),
            )
    return table


def timing_chart(run: dict[str, Any]):
    """A box per variant drawn from the recorded quantiles: whiskers min–max, box p10–p90, a bar at the median."""
    results = run.get("results") or {}
    present = [(v, results[v]) for v in VARIANTS if results.get(v) and results[v].get("median_us") is not None]
    if not present:
        return None

    def draw(figure) -> None:
        low = min(r.get("min_us") or r["median_us"] for _, r in present)
        high = max(r.get("max_us") or r["median_us"] for _, r in present)
        pad = (high - low) * 0.08 or high * 0.05 or 1.0
        figure.title("time per call, µs: min–max ─, p10–p90 █, median ┃")
        for row, (_, r) in enumerate(present, start=1):
            figure.draw(figure.segment((r.get("min_us") or r["median_us"], r.get("max_us") or r["median_us"]), (row, row)))
        figure.draw(figure.bar(
            [v for v, _ in present], [r.get("p10_us") or r["median_us"] for _, r in present],
            [r.get("p90_us") or r["median_us"] for _, r in present], orientation="horizontal", width=0.4,
        ))
        for row, (_, r) in enumerate(present, start=1):
            figure.draw(figure.segment((r["median_us"], r["median_us"]), (row - 0.35, row + 0.35)))
        figure.ruler("x").lim(max(0.0, low - pad), high + pad)

    return draw


def traffic_chart(samples: list[dict[str, Any]]):
    """Bytes per second recorded during the run: NVLink transmit per GPU, else the host's loopback."""
    if not samples:
        return None
    start = min(s["ts"] for s in samples)
    by_gpu: dict[int, list[dict[str, Any]]] = {}
    for sample in samples:
        by_gpu.setdefault(sample["gpu"], []).append(sample)
    column, label = "nvlink_tx_bytes_per_s", "NVLink TX GB/s"
    if not any(s.get(column) is not None for s in samples):
        column, label = "loopback_bytes_per_s", "host loopback GB/s"
        if not any(s.get(column) is not None for s in samples):
            return None

    def draw(figure) -> None:
        figure.title(f"{label} during the run (s from start)")
        for gpu, rows in sorted(by_gpu.items()):
            points = [(s["ts"] - start, s[column] / 1e9) for s in rows if s.get(column) is not None]
            if not points:
                continue
            signal = figure.signal([p[0] for p in points], [p[1] for p in points])
            signal.label("host" if gpu < 0 else f"GPU{gpu}")
            signal.lines(True)
            figure.draw(signal)

    return draw


class ResultScreen(Screen):
    BINDINGS = [
        Binding("escape,backspace", "app.pop_screen", "Back"),
        Binding("g", "toggle_chart", "Chart: time/traffic"),
        Binding("home", "scroll('home')", "Top", show=False),
        Binding("end", "scroll('end')", "Bottom", show=False),
    ]

    def __init__(self, run_id: int) -> None:
        super().__init__()
        self.run_id = run_id
        self.run: dict[str, Any] | None = None
        self.chart_kind = "timing"

    @property
    def pkb(self) -> PkbApp:
        return cast("PkbApp", self.app)

    def compose(self) -> ComposeResult:
        with VerticalScroll(id="result-body"):
            yield Static("", id="result-head")
            yield Static("", id="result-sides")
            yield Static("", id="result-trials")
            yield Static("", id="result-kernels")
            yield PlotextChart(id="result-chart", min_interval_s=self.pkb.config.chart_refresh_s)
        yield KeyBar()

    def on_mount(self) -> None:
        self.load()

    def load(self) -> None:
        try:
            run = self.pkb.store.run(self.run_id, basis=self.pkb.config.speedup_basis)
        except PkbError as exc:
            self.query_one("#result-head", Static).update(Text(str(exc), style="bold red"))
            return
        self.run = run
        head = [run_title(run), Text(run_settings(run, utc=self.pkb.config.utc), style="dim")]
        if run.get("status") != "passed" and run.get("status_detail"):
            head.append(Text(f"‼ {run['status_detail']}", style="red"))
        if run.get("mode") == "cpu":
            head.append(Text(f"⚠ {CPU_MODE_LABEL}: gloo on a shared CPU, no roofline or bus bandwidth", style="yellow"))
        elif not run.get("timings_representative", 1):
            head.append(Text("⚠ timings not representative: several ranks shared one GPU", style="yellow"))
        for note in run.get("notes") or []:
            head.append(Text(f"• {note}", style="dim"))
        if run.get("rank_cpu"):
            head.append(Text("CPU per rank, mean/peak (100% = one core): " + "  ".join(
                f"r{r['rank']} {r['mean_pct']:.0f}/{r['max_pct']:.0f}%" for r in run["rank_cpu"]), style="dim"))
        for node in run.get("node_telemetry") or []:  # a multi-node run: what each node sampled
            head.append(Text(node_telemetry_line(node), style="dim"))
        for line in node_wire_lines(run):  # and the bytes on its links and NICs against the traffic model
            head.append(Text(line, style="dim"))
        if run.get("log_path"):
            head.append(Text(f"log: {run['log_path']}", style="dim"))
        from pkb_tui.export import PERFETTO_HINT, trace_files

        traces = trace_files(run.get("trace_path"))
        for variant, path in traces.items():
            head.append(Text(f"{variant} trace: {path}", style="dim"))
        if traces:
            head.append(Text(f"  ({PERFETTO_HINT})", style="dim"))
        self.query_one("#result-head", Static).update(Text("\n").join(head))
        if run.get("results"):
            self.query_one("#result-sides", Static).update(comparison_table(run))
        else:
            self.query_one("#result-sides", Static).update(Text(
                "No figures: the run ended before any variant was timed (the reason is above; the log has the rest).",
                style="dim"))
        note = verdicts_note(run)
        self.query_one("#result-trials", Static).update(Group(
            Text("Trials", style="bold underline"), *([note] if note else []), trials_table(run)))
        self.query_one("#result-kernels", Static).update(Group(
            Text.assemble(("Top kernels", "bold underline"), *([(f"  {cover}", "dim")] if (cover := kernels_coverage(run)) else [])),
            kernels_table(run),
        ))
        self._draw_chart()

    def _draw_chart(self) -> None:
        assert self.run is not None
        chart = self.query_one("#result-chart", PlotextChart)
        if self.chart_kind == "traffic":
            draw = traffic_chart(self.pkb.store.run_samples(self.run_id))
            if draw is None:
                self.notify("No traffic samples were recorded for this run; showing the timing chart.")
                self.chart_kind = "timing"
        if self.chart_kind == "timing":
            draw = timing_chart(self.run)
        chart.display = draw is not None
        chart.set_draw(draw)

    def action_toggle_chart(self) -> None:
        if self.run is None:
            return
        self.chart_kind = "traffic" if self.chart_kind == "timing" else "timing"
        self._draw_chart()

    def action_scroll(self, where: str) -> None:
        body = self.query_one("#result-body", VerticalScroll)
        body.scroll_home() if where == "home" else body.scroll_end()
