"""Runs launched from the dashboard for real: the engine's launcher starts torchrun with two gloo
ranks on the CPU. A run goes from the Launch screen to its result and into History; cancelling
records it as interrupted; quitting during a run asks first, then stops it cleanly."""

from __future__ import annotations

import asyncio
import os
import time

import pytest
from textual.widgets import DataTable, Select

from pkb_tui.app import PkbApp
from pkb_tui.app.screens.confirm import ConfirmScreen
from pkb_tui.app.screens.history import HistoryScreen
from pkb_tui.app.screens.live import LiveScreen
from pkb_tui.app.screens.result import ResultScreen
from pkb_tui.app.widgets.row_list import RowList
from pkb_tui.store import Store
from tests.app_fixtures import app_config, screen_text

pytestmark = pytest.mark.timeout(600)

CPU_RUN = {"mode": "cpu", "world_size": 2, "size": "small", "trials": 2, "models": ["baseline"],
           "iterations": 10, "warmup": 2}


def real_app(tmp_path, **defaults) -> PkbApp:
    from pkb_tui.app.catalog import load_catalog

    return PkbApp(config=app_config(tmp_path / "runs.db", catalog=load_catalog, defaults={**CPU_RUN, **defaults}))


async def until(predicate, pilot, timeout_s: float = 420.0, what: str = "condition") -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await pilot.pause(0.2)


async def pick_all_reduce(app: PkbApp, pilot) -> None:
    await app.workers.wait_for_complete()  # the task catalogue (imports torch)
    await pilot.pause()
    await pilot.press("slash", *"all_reduce", "enter")  # filter, then Enter goes back to the list
    await pilot.pause()
    table = app.screen.query_one("#tasks", DataTable)
    assert [table.get_row_at(i)[0].plain[2:] for i in range(table.row_count)] == ["all_reduce"]


def descendants() -> list[int]:
    import psutil

    return [p.pid for p in psutil.Process(os.getpid()).children(recursive=True)]


def test_a_cpu_run_goes_from_launch_to_result_and_into_history(tmp_path):
    app = real_app(tmp_path)

    async def body(pilot):
        await pick_all_reduce(app, pilot)
        await pilot.press("r")
        await pilot.pause()
        assert isinstance(app.screen, LiveScreen)
        await until(lambda: app.batch.state.current is not None, pilot, what="the run to start")
        assert "all_reduce" in screen_text(app)
        await until(lambda: not app.batch.busy, pilot, what="the batch to end")
        await pilot.pause(0.5)
        # One run in the batch: its result opens by itself.
        assert isinstance(app.screen, ResultScreen), app.screen
        text = screen_text(app)
        assert "all_reduce" in text and "baseline" in text and "✓ passed" in text, text
        assert "✓ 2/2" in text  # both trials correct
        run_id = app.screen.run_id
        await pilot.press("escape", "h")
        await pilot.pause()
        assert isinstance(app.screen, HistoryScreen)
        first = app.screen.query_one("#runs", RowList).rows[0]
        assert first[1] == str(run_id) and first[2].plain == "✓" and first[3] == "all_reduce"
        await pilot.press("q")

    asyncio.run(_drive(app, body))
    with Store(tmp_path / "runs.db") as store:
        runs = store.runs()
        assert len(runs) == 1 and runs[0]["status"] == "passed" and runs[0]["candidate_correct"] == 1


def test_a_failing_solution_shows_its_error_and_the_app_stays_up(tmp_path, monkeypatch):
    # A solution set of our own whose all_reduce raises: run next to the baseline in one batch.
    sets = tmp_path / "solution-sets"
    (sets / "broken-set").mkdir(parents=True)
    (sets / "broken-set" / "all_reduce.py").write_text(
        "def solution(x):\n    raise RuntimeError('deliberately broken all_reduce')\n"
    )
    monkeypatch.setenv("PKB_SOLUTIONS", str(sets))
    app = real_app(tmp_path, models=["baseline", "broken-set"], trials=1)

    async def body(pilot):
        await pick_all_reduce(app, pilot)
        await pilot.press("r")
        await until(lambda: app.batch.state.runs and not app.batch.busy, pilot, what="the batch to end")
        await pilot.pause(0.5)
        assert isinstance(app.screen, LiveScreen)  # two runs: no result opens by itself
        statuses = {line.model: line.status for line in app.batch.state.runs}
        assert statuses["baseline"] == "passed" and statuses["broken-set"] in ("failed", "error"), statuses
        text = screen_text(app)
        assert "✓" in text and ("✗" in text or "‼" in text)
        await pilot.press("b", "down", "enter")  # the batch list: open the broken run
        await pilot.pause()
        assert isinstance(app.screen, ResultScreen)
        text = screen_text(app)
        assert "broken-set" in text and "deliberately broken all_reduce" in text, text
        assert app.is_running

    asyncio.run(_drive(app, body))


def test_cancel_leaves_an_interrupted_run_and_no_processes(tmp_path):
    app = real_app(tmp_path, trials=500)  # long enough to be cancelled mid-way

    async def body(pilot):
        await pick_all_reduce(app, pilot)
        await pilot.press("r")
        await until(lambda: app.batch.state.current is not None and app.batch.state.current.run_id is not None,
                    pilot, what="the run to start")
        run_id = app.batch.state.current.run_id
        # A second batch launched meanwhile waits in the queue.
        await pilot.press("l")
        await pilot.pause()
        await pilot.press("r")
        await pilot.pause()
        assert isinstance(app.screen, LiveScreen) and len(app.batch.pending) == 1
        assert "+1 queued" in screen_text(app)
        await pilot.press("x")
        await pilot.pause()
        assert isinstance(app.screen, ConfirmScreen)
        await pilot.press("y")
        await until(lambda: not app.batch.busy, pilot, timeout_s=60, what="the batch to stop")
        assert not app.batch.pending  # cancelling drops the queued batch too
        assert [r["id"] for r in app.store.runs()] == [run_id]
        assert app.is_running  # cancelling stops the run, not the app
        assert app.batch.state.runs[0].status == "interrupted"
        await pilot.pause(0.5)  # the Live screen redraws at 4 Hz
        assert "interrupted" in screen_text(app)
        assert app.store.run(run_id)["status"] == "interrupted"
        await pilot.press("q")

    asyncio.run(_drive(app, body))
    assert not [p for p in descendants() if _is_rank(p)]


def test_quitting_during_a_run_asks_then_stops_it_cleanly(tmp_path):
    app = real_app(tmp_path, trials=500)

    async def body(pilot):
        await pick_all_reduce(app, pilot)
        await pilot.press("r")
        await until(lambda: app.batch.state.current is not None and app.batch.state.current.run_id is not None,
                    pilot, what="the run to start")
        await pilot.press("q")
        await pilot.pause()
        assert isinstance(app.screen, ConfirmScreen)
        await pilot.press("n")  # keep running
        await pilot.pause()
        assert app.batch.busy and app.is_running
        await pilot.press("q")
        await pilot.pause()
        await pilot.press("y")
        await until(lambda: not app.is_running, pilot, timeout_s=60, what="the app to close")

    asyncio.run(_drive(app, body))
    with Store(tmp_path / "runs.db") as store:
        assert [r["status"] for r in store.runs()] == ["interrupted"]
    assert not [p for p in descendants() if _is_rank(p)]


def test_quit_answered_after_the_batch_ended_quits_and_live_kept_drawing_behind_the_question(tmp_path):
    app = real_app(tmp_path, trials=1)

    async def body(pilot):
        await pick_all_reduce(app, pilot)
        await pilot.press("r")
        await pilot.pause()
        await pilot.press("q")  # while the ranks start: the question opens over Live
        await pilot.pause()
        assert isinstance(app.screen, ConfirmScreen) and app.batch.busy
        live = app.screen_stack[-2]
        assert isinstance(live, LiveScreen)
        await until(lambda: not app.batch.busy, pilot, what="the batch to end while the question is open")
        await pilot.pause(0.6)  # Live redraws at 4 Hz
        assert live._seen_version == app.batch.state.version  # it drew the batch's end behind the dialog
        assert "Batch finished" in str(live.query_one("#live-head").render())
        await pilot.press("y")  # nothing left to stop: the app closes at once
        await until(lambda: not app.is_running, pilot, timeout_s=30, what="the app to close")

    asyncio.run(_drive(app, body))
    with Store(tmp_path / "runs.db") as store:
        assert [r["status"] for r in store.runs()] == ["passed"]  # it finished; nothing claims otherwise


def test_a_request_the_engine_refuses_is_shown_and_nothing_runs(tmp_path):
    app = real_app(tmp_path, dtype="float64")  # all_reduce has no float64

    async def body(pilot):
        await pick_all_reduce(app, pilot)
        app.screen.query_one("#dtype", Select).value = "float64"
        await pilot.press("r")
        await pilot.pause()
        assert not app.batch.busy
        assert not isinstance(app.screen, LiveScreen)
        assert any("does not support dtype float64" in n.message for n in app._notifications)

    asyncio.run(_drive(app, body))


def test_the_dashboard_and_a_cli_batch_on_one_database_each_say_the_other_shares_the_machine(tmp_path):
    from tests.test_store_writers import SHARED, Batch, _gated_runs_running, _wait_for

    db, gate = tmp_path / "runs.db", tmp_path / "gate"
    cli_batch = Batch(tmp_path, db, "cli", gate)  # held in its gated run until the gate opens
    try:
        _wait_for("the CLI batch's gated run", lambda: _gated_runs_running(db) == 1, cli_batch)
        app = real_app(tmp_path, trials=1)
        said: list[str] = []
        notify = app.notify

        def recording_notify(message: str, **kwargs) -> None:
            said.append(message)
            notify(message, **kwargs)

        app.notify = recording_notify  # type: ignore[method-assign]

        async def body(pilot):
            await pick_all_reduce(app, pilot)
            await pilot.press("r")
            await until(lambda: not app.batch.busy, pilot, what="the dashboard's batch to end")
            await pilot.press("q")

        asyncio.run(_drive(app, body))
        warnings = [m for m in said if SHARED in m]
        assert len(warnings) == 1 and f"pid {cli_batch.proc.pid}," in warnings[0], said
        _wait_for("the CLI batch to see the dashboard's", lambda: SHARED in cli_batch.stderr(), cli_batch)
        gate.touch()
        assert cli_batch.wait() == 0, cli_batch.stderr()
    finally:
        if cli_batch.proc.poll() is None:
            cli_batch.proc.kill()
            cli_batch.proc.wait()
    assert f"another pkb-tui batch (pid {os.getpid()}, started " in cli_batch.stderr()  # the dashboard's launcher
    with Store(db) as store:
        runs = store.runs(order_by="id", descending=False)
        assert [r["status"] for r in runs] == ["passed"] * 3  # the CLI's two and the dashboard's one
        dashboard_runs = [r for r in runs if r["batch_id"] != runs[0]["batch_id"]]  # the CLI's were created first
        assert len(dashboard_runs) == 1
        notes = store.run(dashboard_runs[0]["id"])["notes"]
        assert any(f"pid {cli_batch.proc.pid}," in n and SHARED in n for n in notes), notes


async def _drive(app: PkbApp, body) -> None:
    async with app.run_test(size=(100, 32)) as pilot:
        await body(pilot)


def _is_rank(pid: int) -> bool:
    import psutil

    try:
        return "torch.distributed.run" in " ".join(psutil.Process(pid).cmdline()) or "pkb_tui.engine.worker" in " ".join(psutil.Process(pid).cmdline())
    except psutil.Error:
        return False
