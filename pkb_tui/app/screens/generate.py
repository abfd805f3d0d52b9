"""Generate: ask a language-model endpoint to write candidates for some tasks, K samples and R refine
rounds each (pkb_tui.generate), and watch it: every request with its streamed token count, its
cost, its candidate's verdict and speedup, the cost so far and each task's best speedup. Enter shows
a reply and the code extracted from it; `o` opens the candidate's evaluation in the Result screen.

Opens on the newest generation run in the database. The loop runs in a thread worker and posts its
events as messages; rows are read back from the Store (the loop writes them), the streamed token
counts are kept here until the reply lands.
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING, Any, cast

from rich.text import Text
from textual import on, work
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical, VerticalScroll
from textual.message import Message
from textual.screen import ModalScreen, Screen
from textual.widgets import Input, Label, Select, Static

from pkb_tui.app.format import STATUS_STYLES, fmt_speedup, status_mark, truncate
from pkb_tui.app.widgets.keybar import KeyBar
from pkb_tui.app.widgets.nav import NavBar
from pkb_tui.app.widgets.row_list import Column, RowList
from pkb_tui.errors import PkbError

if TYPE_CHECKING:
    from pkb_tui.app.app import PkbApp
    from pkb_tui.generate.loop import GenEvent

WORLD_SIZES = (1, 2, 3, 4, 6, 8)
MODES = ("auto", "cpu", "shared-gpu", "nccl")
SIZES = ("small", "default", "large")
NO_ENDPOINT = "(none)"

# Sized for 80 columns beside the form; what is left shows the cost and the extraction or error.
REQUEST_COLUMNS = [
    Column("task", "task", 12), Column("sample", "s", 1, "right"), Column("round", "r", 1, "right"),
    Column("tokens", "tokens", 6, "right"), Column("state", "state", 8), Column("verdict", "verdict", 9),
    Column("speedup", "speedup", 7, "right"), Column("rest", "", 0),
]
REQUEST_WORDS = {"pending": "queued", "sent": "sending", "failed": "failed"}
CANDIDATE_WORDS = {"pending": "to run", "no_code": "no code", "invalid": "invalid", "request_failed": "no reply",
                   "evaluated": "ran"}


class GenUpdate(Message):
    """One event of the generation loop, posted from its thread."""

    def __init__(self, event: GenEvent) -> None:
        super().__init__()
        self.event = event


class GenDone(Message):
    def __init__(self, gen_run_id: int | None, failure: str | None) -> None:
        super().__init__()
        self.gen_run_id, self.failure = gen_run_id, failure


def request_row(row: dict[str, Any], streamed: int | None = None) -> list:
    """One request as the table shows it."""
    status = row["status"]
    tokens = row.get("completion_tokens")
    token_text = str(tokens) if tokens is not None else (f"~{streamed}" if streamed else "–")
    if status == "replied" or row.get("candidate_status"):
        state = Text(CANDIDATE_WORDS.get(row.get("candidate_status") or "", "replied"),
                     style="yellow" if row.get("candidate_status") in ("no_code", "invalid", "request_failed") else "")
    else:
        state = Text(REQUEST_WORDS.get(status, status), style={"failed": "red", "sent": "cyan"}.get(status, "dim"))
    run_status = row.get("run_status")
    verdict: Text | str = "–"
    if run_status:
        verdict = Text(f"{status_mark(run_status)} {run_status}", style=STATUS_STYLES.get(run_status, ""))
    speedup = row.get("speedup") if run_status == "passed" else None
    why = row.get("error") or row.get("candidate_detail") or row.get("extraction") or ""
    cost = f"${row['cost_usd']:.4f}" if row.get("cost_usd") is not None else ""
    rest = " · ".join(part for part in (cost, why.splitlines()[0] if why else "") if part)
    return [
        row["task_id"], str(row["sample"]), str(row["round"]), token_text, state, verdict,
        Text(fmt_speedup(speedup), style="green" if (speedup or 0) > 1 else ""), Text(truncate(rest, 80), style="dim"),
    ]


def best_by_task(rows: list[dict[str, Any]]) -> dict[str, float | None]:
    best: dict[str, float | None] = {}
    for row in rows:
        best.setdefault(row["task_id"], None)
        if row.get("run_status") == "passed" and row.get("speedup") is not None:
            current = best[row["task_id"]]
            best[row["task_id"]] = row["speedup"] if current is None else max(current, row["speedup"])
    return best


class GenerateScreen(Screen):
    BINDINGS = [
        Binding("r", "start", "Generate"),
        Binding("x", "stop", "Stop"),
        Binding("enter", "view", "Reply", show=False),
        Binding("o", "open_run", "Open run"),
        Binding("escape", "focus_requests", "Requests", show=False),
    ]

    def __init__(self) -> None:
        super().__init__()
        self.gen_run_id: int | None = None
        self.rows: list[dict[str, Any]] = []
        self.streamed: dict[int, int] = {}  # request id -> streamed pieces, until its reply lands
        self.cancel = threading.Event()
        self.running = False
        self.endpoints: dict[str, Any] = {}
        self.config_problem: str | None = None

    @property
    def pkb(self) -> PkbApp:
        return cast("PkbApp", self.app)

    def compose(self) -> ComposeResult:
        defaults = self.pkb.config.defaults
        self._load_endpoints()
        names = list(self.endpoints) or [NO_ENDPOINT]
        yield NavBar("generate")
        with Horizontal(id="gen-body"):
            with Vertical(id="gen-form"):
                yield Label("Generate", classes="pane-title")
                yield _option("tasks", Input(defaults.get("gen_tasks", "all_reduce"), placeholder="id,id or all",
                                             id="gen-tasks", compact=True))
                yield _option("endpoint", Select([(n, n) for n in names], value=names[0], allow_blank=False,
                                                 id="gen-endpoint", compact=True))
                yield _option("samples", Input(str(defaults.get("gen_samples", 1)), type="integer", id="gen-samples",
                                                 compact=True))
                yield _option("rounds", Input(str(defaults.get("gen_rounds", 1)), type="integer", id="gen-rounds",
                                                compact=True))
                yield _option("ranks", Select([(str(n), n) for n in WORLD_SIZES], value=defaults.get("world_size", 2),
                                                   allow_blank=False, id="gen-world-size", compact=True))
                yield _option("mode", Select([(m, m) for m in MODES], value=defaults.get("mode", "auto"),
                                             allow_blank=False, id="gen-mode", compact=True))
                yield _option("size", Select([(s, s) for s in SIZES], value=defaults.get("size", "small"),
                                             allow_blank=False, id="gen-size", compact=True))
                yield Static("", id="gen-form-note")
            with Vertical(id="gen-main"):
                yield Label("", id="gen-title")
                yield RowList(REQUEST_COLUMNS, id="gen-requests")
                yield Static("", id="gen-best")
        yield KeyBar()

    def _load_endpoints(self) -> None:
        from pkb_tui.generate.config import config_path, load_endpoints

        try:
            self.endpoints = load_endpoints()
            self.config_problem = None
        except PkbError as exc:
            self.endpoints = {}
            self.config_problem = str(exc)
        self._config_file = config_path()

    def on_mount(self) -> None:
        note = self.config_problem or f"endpoints from {self._config_file}"
        self.query_one("#gen-form-note", Static).update(Text(note, style="red" if self.config_problem else "dim"))
        self.pkb.store.recover_gen_runs()  # a generate killed elsewhere reads as interrupted, not running
        runs = self.pkb.store.gen_runs(limit=1)
        if runs:
            self.gen_run_id = runs[0]["id"]
        self.reload()
        self.query_one("#gen-requests", RowList).focus()

    def on_screen_resume(self) -> None:
        self.reload()

    # ------------------------------------------------------------------ showing
    def reload(self) -> None:
        table = self.query_one("#gen-requests", RowList)
        if self.gen_run_id is None:
            self.rows = []
            table.set_rows([])
            self.query_one("#gen-title", Label).update("No generation yet: fill in the form, then press r.")
            self.query_one("#gen-best", Static).update("")
            return
        store = self.pkb.store
        info = next((g for g in store.gen_runs(limit=None) if g["id"] == self.gen_run_id), None)
        self.rows = store.gen_requests(self.gen_run_id)
        for row in self.rows:
            if row.get("completion_tokens") is not None:
                self.streamed.pop(row["id"], None)
        table.set_rows([request_row(r, self.streamed.get(r["id"])) for r in self.rows], cursor=table.cursor)
        if info is not None:
            cost = sum(r.get("cost_usd") or 0 for r in self.rows)
            tokens = sum(r.get("completion_tokens") or 0 for r in self.rows) + sum(self.streamed.values())
            request = info["request"]
            title = Text(no_wrap=True, overflow="ellipsis")
            title.append(f"#{info['id']} {info['endpoint']}", style="bold")
            title.append(f" · {info['status']} · ${cost:.4f} · {tokens:,} tok · K {request['samples']} R {request['rounds']}"
                         f" · {info['model_id']}", style="dim" if info["status"] == "finished" else "")
            self.query_one("#gen-title", Label).update(title)
        best = Text(no_wrap=True, overflow="ellipsis")
        best.append("best: ", style="dim")
        for index, (task, speedup) in enumerate(best_by_task(self.rows).items()):
            best.append(("  " if index else "") + f"{task} ")
            best.append(fmt_speedup(speedup), style="green" if (speedup or 0) > 1 else "dim")
        self.query_one("#gen-best", Static).update(best)

    @on(GenUpdate)
    def _update(self, message: GenUpdate) -> None:
        event = message.event
        if self.gen_run_id is None or event.gen_run_id != self.gen_run_id:
            self.gen_run_id = event.gen_run_id
        if event.kind == "tokens" and event.request_id is not None:
            self.streamed[event.request_id] = event.tokens
            for index, row in enumerate(self.rows):
                if row["id"] == event.request_id:
                    self.query_one("#gen-requests", RowList).update_row(index, request_row(row, event.tokens))
                    return
        self.reload()

    @on(GenDone)
    def _done(self, message: GenDone) -> None:
        self.running = False
        if message.failure:
            self.notify(message.failure, title="Generation stopped", severity="error", timeout=15)
        else:
            self.notify(f"Generation #{message.gen_run_id} finished.", title="Generate")
        self.reload()

    # ------------------------------------------------------------------ actions
    def action_start(self) -> None:
        from pkb_tui.generate.loop import GenerateRequest

        if self.running:
            self.notify("A generation is running; stop it with x first.", severity="warning")
            return
        name = self.query_one("#gen-endpoint", Select).value
        if name not in self.endpoints:
            self.notify(self.config_problem or "Pick an endpoint.", title="Cannot generate", severity="error", timeout=10)
            return
        try:
            samples = int(self.query_one("#gen-samples", Input).value or 0)
            rounds = int(self.query_one("#gen-rounds", Input).value or 0)
        except ValueError:
            self.notify("K and R must be whole numbers.", severity="error")
            return
        mode = self.query_one("#gen-mode", Select).value
        tasks = [t.strip() for t in self.query_one("#gen-tasks", Input).value.split(",") if t.strip()]
        request = GenerateRequest(
            tasks=tasks, samples=samples, rounds=rounds, world_size=int(cast(Any, self.query_one("#gen-world-size", Select).value)),
            mode=None if mode == "auto" else str(mode), size=str(self.query_one("#gen-size", Select).value),
        )
        self.cancel = threading.Event()
        self.running = True
        self.streamed = {}
        self._generate(self.endpoints[name], request)

    @work(thread=True, exclusive=True, group="generate", exit_on_error=False)
    def _generate(self, endpoint: Any, request: Any) -> None:
        from pkb_tui.generate.loop import GenerationLoop

        gen_run_id = None

        def post(event: GenEvent) -> None:
            self.post_message(GenUpdate(event))

        try:
            loop = GenerationLoop(
                self.pkb.config.db_path, endpoint, out_root=self.pkb.config.defaults.get("gen_out"),
                runs_dir=self.pkb.config.runs_dir, on_event=post, cancel=self.cancel,
            )
            try:
                gen_run_id = loop.start(request)
                self.post_message(GenUpdate(_started(gen_run_id)))
                loop.run(gen_run_id)
            finally:
                loop.client.close()
            self.post_message(GenDone(gen_run_id, None))
        except PkbError as exc:
            self.post_message(GenDone(gen_run_id, str(exc)))
        except Exception as exc:  # shown, never a crash of the dashboard
            self.post_message(GenDone(gen_run_id, f"{type(exc).__name__}: {exc}"))

    def on_unmount(self) -> None:
        self.cancel.set()  # the app is closing: send nothing more, stop the evaluation's ranks

    def action_stop(self) -> None:
        if self.running:
            self.cancel.set()
            self.notify("Stopping: requests in flight finish, nothing new is sent.", title="Generate")

    def highlighted(self) -> dict[str, Any] | None:
        table = self.query_one("#gen-requests", RowList)
        return self.rows[table.cursor] if self.rows and table.cursor < len(self.rows) else None

    @on(RowList.Selected, "#gen-requests")
    def action_view(self) -> None:
        row = self.highlighted()
        if row is not None:
            self.pkb.show(ReplyScreen(row))

    def action_open_run(self) -> None:
        row = self.highlighted()
        if row is None:
            return
        if row.get("run_id") is None:
            self.notify("This candidate was not evaluated (" + (row.get("candidate_detail") or row.get("candidate_status")
                        or row["status"]) + ").", severity="warning")
            return
        self.pkb.open_result(row["run_id"])

    def action_focus_requests(self) -> None:
        self.query_one("#gen-requests", RowList).focus()


def _started(gen_run_id: int) -> GenEvent:
    from pkb_tui.generate.loop import GenEvent

    return GenEvent("started", gen_run_id)


def _option(label: str, widget: Any) -> Horizontal:
    return Horizontal(Label(label, classes="option-label"), widget, classes="option-row")


class ReplyScreen(ModalScreen[None]):
    """One reply, whole, beside the code taken from it (the file that was evaluated)."""

    BINDINGS = [Binding("escape,q", "app.pop_screen", "Close"), Binding("o", "open_run", "Open run")]

    def __init__(self, row: dict[str, Any]) -> None:
        super().__init__()
        self.row = row

    def compose(self) -> ComposeResult:
        store = cast("PkbApp", self.app).store
        row = self.row
        reply = store.gen_reply(row["id"])
        source = store.source(row["source_hash"]) if row.get("source_hash") else None
        head = Text(no_wrap=True, overflow="ellipsis")
        head.append(f"{row['task_id']} · sample {row['sample']} · round {row['round']}", style="bold")
        if reply:
            latency = f"{reply['latency_us'] / 1e6:.1f} s" if reply.get("latency_us") else "n/a"
            head.append(f"  finish {reply.get('finish_reason') or '?'} · {reply.get('prompt_tokens') or 0}+"
                        f"{reply.get('completion_tokens') or 0} tok · {latency} · {reply.get('resolved_model') or '?'}",
                        style="dim")
        with Vertical(id="reply-box"):
            yield Static(head, id="reply-head")
            with Horizontal(id="reply-panes"):
                with VerticalScroll(id="reply-raw"):
                    yield Label("Reply (raw)", classes="pane-title")
                    yield Static(Text(reply["text"]) if reply else Text(row.get("error") or "no reply", style="red"))
                with VerticalScroll(id="reply-code"):
                    yield Label(f"Code: {row.get('extraction') or 'none'}", classes="pane-title")
                    yield Static(Text(source["text"]) if source else Text(row.get("candidate_detail") or "no code", style="dim"))
            yield KeyBar()

    def action_open_run(self) -> None:
        if self.row.get("run_id") is not None:
            self.app.pop_screen()
            cast("PkbApp", self.app).open_result(self.row["run_id"])
