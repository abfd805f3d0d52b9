"""The dashboard driven through Textual's pilot on a real SQLite file of known runs: history lists
and filters them, two runs compare, the leaderboard's figures match those computed here from the
same rows, the result screen shows a run (and a failed run its error), help lists every key,
Monitor owns its sampler only while shown, and q quits."""

from __future__ import annotations

import asyncio
import math
from typing import Awaitable, Callable

import pytest
from textual.widgets import DataTable, Select

from pkb_tui.app import PkbApp
from pkb_tui.app.screens.compare import CompareScreen
from pkb_tui.app.screens.filters import FilterScreen, RunFilters
from pkb_tui.app.screens.help import HelpScreen
from pkb_tui.app.screens.history import HistoryScreen
from pkb_tui.app.screens.launch import LaunchScreen
from pkb_tui.app.screens.live import LiveScreen
from pkb_tui.app.screens.monitor import MonitorScreen
from pkb_tui.app.screens.result import ResultScreen
from pkb_tui.app.widgets.row_list import RowList
from tests.app_fixtures import KNOWN_RUNS, FakeTelemetry, app_config, gpu_ring, screen_text, seed_runs


@pytest.fixture
def seeded(tmp_path):
    db = tmp_path / "runs.db"
    ids = seed_runs(db)
    return db, ids


def drive(app: PkbApp, body: Callable[..., Awaitable[None]], size: tuple[int, int] = (80, 24)) -> None:
    async def main() -> None:
        async with app.run_test(size=size) as pilot:
            await pilot.app.workers.wait_for_complete()
            await pilot.pause()
            await body(pilot)
    asyncio.run(main())


def table_rows(table: DataTable | RowList) -> list[list[str]]:
    rows = table.rows if isinstance(table, RowList) else [table.get_row_at(i) for i in range(table.row_count)]
    return [[getattr(c, "plain", str(c)) for c in row] for row in rows]


def test_the_app_opens_on_the_tasks_list(seeded):
    app = PkbApp(config=app_config(seeded[0]))

    async def body(pilot):
        assert isinstance(app.screen, LaunchScreen)
        assert app.focused is app.screen.query_one("#tasks", DataTable)
        tasks = [row[0].strip() for row in table_rows(app.screen.query_one("#tasks", DataTable))]
        assert tasks == ["all_reduce", "all_gather", "reduce_scatter", "tp_gemm_rs", "ring_attention"]
        # The last result of each task comes from the database, with its mark.
        text = screen_text(app)
        assert "⏱ timeout" in text  # all_reduce's newest run
        assert "✓ 2.50× ▲" in text  # reduce_scatter's newest run

    drive(app, body)


def test_launch_filters_tasks_by_text_and_family(seeded):
    app = PkbApp(config=app_config(seeded[0]))

    async def body(pilot):
        table = app.screen.query_one("#tasks", DataTable)
        await pilot.press("slash", *"ring")
        await pilot.pause()
        assert [r[0].strip() for r in table_rows(table)] == ["ring_attention"]
        # Back to the table, then "/" again selects the filter's text: backspace clears it.
        await pilot.press("escape", "slash", "backspace", "escape", "f")
        await pilot.pause()
        assert app.screen.query_one("#family", Select).value == "collective"
        assert [r[0].strip() for r in table_rows(table)] == ["all_reduce", "all_gather", "reduce_scatter"]

    drive(app, body)


def test_history_lists_every_run_newest_first_with_marks(seeded):
    db, ids = seeded
    app = PkbApp(config=app_config(db))

    async def body(pilot):
        await pilot.press("h")
        await pilot.pause()
        assert isinstance(app.screen, HistoryScreen)
        rows = table_rows(app.screen.query_one("#runs", RowList))
        assert [int(r[1]) for r in rows] == sorted(ids, reverse=True)
        by_id = {int(r[1]): r for r in rows}
        for run_id, known in zip(ids, KNOWN_RUNS):
            assert by_id[run_id][3] == known.task and by_id[run_id][4] == known.model
            assert by_id[run_id][2] == {"passed": "✓", "failed": "✗", "error": "‼", "timeout": "⏱"}[known.status]
        assert "Runs: 8 of 8" in screen_text(app)

    drive(app, body)


def test_history_filters_by_status_and_model_and_sorts(seeded):
    db, ids = seeded
    app = PkbApp(config=app_config(db))

    async def body(pilot):
        await pilot.press("h", "f")  # the filters picker
        await pilot.pause()
        assert isinstance(app.screen, FilterScreen)
        app.screen.query_one("#filter-status", Select).value = "passed"
        await pilot.press("a")  # apply
        await pilot.pause()
        screen = app.screen
        assert isinstance(screen, HistoryScreen)
        table = screen.query_one("#runs", RowList)
        expected = [i for i, k in zip(ids, KNOWN_RUNS) if k.status == "passed"]
        assert sorted(int(r[1]) for r in table_rows(table)) == sorted(expected)
        assert "status ✓ passed" in screen_text(app)
        screen.set_filters(screen.run_filters.with_(model="torch-p2p"))
        await pilot.pause()
        expected = [i for i, k in zip(ids, KNOWN_RUNS) if k.status == "passed" and k.model == "torch-p2p"]
        assert sorted(int(r[1]) for r in table_rows(table)) == sorted(expected)
        # Clear the filters, sort by speedup (highest first), then reverse.
        await pilot.press("f", "c")
        await pilot.pause()
        assert len(table_rows(table)) == len(ids)
        while screen.order_by != "speedup":
            await pilot.press("s")
        await pilot.pause()
        speedups = {i: k.speedup for i, k in zip(ids, KNOWN_RUNS)}
        first = int(table_rows(table)[0][1])
        assert speedups[first] == max(s for s in speedups.values() if s is not None)
        await pilot.press("r")
        await pilot.pause()
        assert screen.descending is False

    drive(app, body)


def test_history_filters_by_date_and_host(seeded):
    db, ids = seeded
    app = PkbApp(config=app_config(db))

    async def body(pilot):
        await pilot.press("h")
        await pilot.pause()
        screen = app.screen
        table = screen.query_one("#runs", RowList)
        screen.set_filters(RunFilters(period="1d"))
        await pilot.pause()
        now = app.config.clock()
        expected = [i for i, k in zip(ids, KNOWN_RUNS) if k.created_at >= now - 86400]
        assert sorted(int(r[1]) for r in table_rows(table)) == sorted(expected)
        laptop = next(h["id"] for h in app.store.hosts() if h["hostname"] == "laptop")
        screen.set_filters(RunFilters(host_id=laptop))
        await pilot.pause()
        expected = [i for i, k in zip(ids, KNOWN_RUNS) if k.host == "laptop"]
        assert sorted(int(r[1]) for r in table_rows(table)) == sorted(expected)
        assert "host laptop" in screen_text(app)

    drive(app, body)


def test_two_marked_runs_compare_side_by_side(seeded):
    db, ids = seeded
    app = PkbApp(config=app_config(db))

    async def body(pilot):
        await pilot.press("h")
        await pilot.pause()
        table = app.screen.query_one("#runs", RowList)
        # Runs are newest first: mark ids[1]; marking moves the cursor down (to ids[0]), so three
        # ups reach ids[3].
        table.cursor = len(ids) - 2
        await pilot.press("space", "up", "up", "up", "space", "c")
        await pilot.pause()
        assert isinstance(app.screen, CompareScreen)
        assert app.screen.run_ids == [ids[1], ids[3]]
        text = screen_text(app)
        assert f"A  #{ids[1]}" in text and f"B  #{ids[3]}" in text
        # all_reduce 600 µs (A) against reduce_scatter 400 µs (B): different tasks are flagged.
        assert "different tasks" in text
        assert "600 µs" in text and "400 µs" in text and "0.67× ▲ better" in text
        await pilot.press("a")
        await pilot.pause()
        assert isinstance(app.screen, ResultScreen) and app.screen.run_id == ids[1]

    drive(app, body)


def test_history_pages_in_more_runs_as_the_cursor_nears_the_end(tmp_path):
    db = tmp_path / "runs.db"
    many = [KNOWN_RUNS[i % len(KNOWN_RUNS)] for i in range(130)]
    ids = seed_runs(db, many)
    app = PkbApp(config=app_config(db, history_page=50))

    async def body(pilot):
        await pilot.press("h")
        await pilot.pause()
        screen = app.screen
        table = screen.query_one("#runs", RowList)
        assert (screen.loaded, screen.total, table.row_count) == (50, 130, 50)
        await pilot.press("end")  # the last loaded row: the next page comes in
        await pilot.pause()
        assert table.row_count == 100
        await pilot.press("end", "end")
        await pilot.pause()
        assert table.row_count == 130
        assert int(table_rows(table)[-1][1]) == ids[0]  # newest first: the oldest run is last
        assert "Runs: 130 of 130" in screen_text(app)

    drive(app, body)


def test_history_shows_runs_written_while_it_was_hidden(seeded):
    db, ids = seeded
    app = PkbApp(config=app_config(db))

    async def body(pilot):
        await pilot.press("h")
        await pilot.pause()
        await pilot.press("l")
        await pilot.pause()
        # Another process (the launcher) writes a run meanwhile.
        new_id = seed_runs(db, [KNOWN_RUNS[2]])[0]
        await pilot.press("h")
        await pilot.pause()
        rows = table_rows(app.screen.query_one("#runs", RowList))
        assert int(rows[0][1]) == new_id and len(rows) == len(ids) + 1

    drive(app, body)


def test_result_chart_switches_to_the_traffic_recorded_during_the_run(seeded):
    from collectors.sample import GpuSample
    from collectors.sink import write_samples
    from pkb_tui.store import Store

    db, ids = seeded
    with Store(db) as store:
        write_samples(store.conn, [
            GpuSample(ts=1000.0 + i * 0.1, gpu=g, nvlink_tx_bytes_per_s=1e11 * (i % 5), run_id=ids[1])
            for i in range(30) for g in range(2)
        ])
    app = PkbApp(config=app_config(db, chart_refresh_s=0.0))

    async def body(pilot):
        app.open_result(ids[1])
        await pilot.pause()
        chart = app.screen.query_one("#result-chart")
        builds = chart.builds
        await pilot.press("g")
        await pilot.pause(0.2)
        assert app.screen.chart_kind == "traffic" and chart.builds > builds
        await pilot.press("end")
        await pilot.pause()
        assert "NVLink TX GB/s during the run" in screen_text(app)
        await pilot.press("escape")
        app.open_result(ids[2])  # nothing recorded for this one: the timing chart stays
        await pilot.pause()
        await pilot.press("g")
        await pilot.pause()
        assert app.screen.chart_kind == "timing"

    drive(app, body, size=(100, 40))


def test_compare_needs_two_runs(seeded):
    app = PkbApp(config=app_config(seeded[0]))

    async def body(pilot):
        await pilot.press("h", "c")
        await pilot.pause()
        assert isinstance(app.screen, HistoryScreen)  # nothing marked: stays, says what to do

    drive(app, body)


def expected_leaderboard() -> dict[str, tuple]:
    """The leaderboard computed here from KNOWN_RUNS: the latest run of each (model, task)."""
    latest = {}
    for known in KNOWN_RUNS:  # written in order: later ones replace earlier ones
        latest[(known.model, known.task)] = known
    board: dict[str, list] = {}
    for (model, _), known in latest.items():
        entry = board.setdefault(model, [0, 0, 0, 0, []])
        entry[0] += 1
        if known.correct:
            entry[1] += 1
            entry[2] += known.speedup > 1.0
            entry[3] += known.speedup > 1.5
            entry[4].append(known.speedup)
    return {
        model: (f"{t}", f"{c}/{t}", f"{f1}/{t}", f"{f15}/{t}",
                f"{math.exp(sum(map(math.log, s)) / len(s)):.2f}×" if s else "n/a")
        for model, (t, c, f1, f15, s) in board.items()
    }


def test_leaderboard_figures_match_the_known_rows(seeded):
    app = PkbApp(config=app_config(seeded[0]))

    async def body(pilot):
        await pilot.press("h", "b")
        await pilot.pause()
        rows = table_rows(app.screen.query_one("#leaderboard", RowList))
        shown = {row[0]: tuple(row[1:]) for row in rows}
        assert shown == expected_leaderboard()
        assert shown["torch-p2p"] == ("3", "2/3", "2/3", "1/3", "1.55×")  # by hand: sqrt(2.0 * 1.2)
        # Enter on a model shows that model's runs.
        await pilot.press("enter")
        await pilot.pause()
        assert app.screen.run_filters.model == rows[0][0]

    drive(app, body)


def test_result_screen_shows_both_variants_side_by_side(seeded):
    db, ids = seeded
    app = PkbApp(config=app_config(db))

    async def body(pilot):
        app.open_result(ids[2])  # all_gather, torch-p2p: 900 µs -> 750 µs, correct
        await pilot.pause()
        text = screen_text(app)
        assert f"Run #{ids[2]}" in text and "all_gather" in text and "✓ passed" in text
        assert "baseline" in text and "candidate" in text
        assert "900 µs" in text and "750 µs" in text
        assert "1.20× ▲" in text
        assert "datasheet:H200" in text  # where the roofline's bandwidth came from
        assert "42%" in text and "wire-bound" in text
        assert "NVLink 376 MB vs model 235 MB" in text and "more than the model (1.6×)" in text
        assert "ws 8 · nccl · bfloat16 · default · 3 trials · 2025-12-29 00:00" in text
        await pilot.press("end")
        await pilot.pause()
        text = screen_text(app)
        assert "ring_allreduce_kernel<bf16>" in text and "candidate" in text  # top kernels with category
        assert app.screen.query_one("#result-chart").builds >= 1
        await pilot.press("escape")
        assert not isinstance(app.screen, ResultScreen)

    drive(app, body, size=(100, 40))


def test_a_failed_run_shows_its_error_and_which_rank(seeded):
    db, ids = seeded
    app = PkbApp(config=app_config(db))

    async def body(pilot):
        app.open_result(ids[5])  # error: the solution raised
        await pilot.pause()
        text = screen_text(app)
        assert "‼ error" in text and "NameError: name 'peer_ptr' is not defined" in text
        await pilot.press("escape")
        app.open_result(ids[0])  # failed: wrong on rank 5
        await pilot.pause()
        text = screen_text(app)
        assert "✗ 1/3" in text and "err 3.70e-01 (rank 5)" in text

    drive(app, body, size=(100, 40))


def test_opening_a_run_that_does_not_exist_says_so(seeded):
    app = PkbApp(config=app_config(seeded[0]))

    async def body(pilot):
        app.open_result(9999)
        await pilot.pause()
        assert "There is no run 9999" in screen_text(app)

    drive(app, body)


def test_help_lists_every_key_of_every_screen(seeded):
    app = PkbApp(config=app_config(seeded[0]))

    async def body(pilot):
        await pilot.press("question_mark")
        await pilot.pause()
        assert isinstance(app.screen, HelpScreen)
        from pkb_tui.app.screens.help import key_table
        from rich.console import Console

        console = Console(width=100, record=True, file=open("/dev/null", "w"))
        console.print(key_table())
        listed = console.export_text()
        for owner in (PkbApp, LaunchScreen, LiveScreen, HistoryScreen, FilterScreen, ResultScreen, CompareScreen,
                      MonitorScreen):
            for binding in owner.BINDINGS:
                assert binding.description in listed, (owner.__name__, binding.key)
        await pilot.press("escape")
        assert not isinstance(app.screen, HelpScreen)

    drive(app, body)


def test_monitor_owns_its_sampler_only_while_shown(seeded):
    telemetry = FakeTelemetry(gpu_ring(gpus=2, links=4))
    app = PkbApp(config=app_config(seeded[0], telemetry=lambda db: telemetry))

    async def body(pilot):
        await pilot.press("m")
        await app.workers.wait_for_complete()
        await pilot.pause(0.3)
        assert telemetry.started == 1 and telemetry.stopped == 0
        text = screen_text(app)
        assert "GPU0" in text and "GPU1" in text and "telemetry: nvml" in text
        await pilot.press("h")
        await pilot.pause()
        assert telemetry.stopped == 1

    drive(app, body)


def test_monitor_says_when_there_is_no_telemetry(seeded):
    def broken(db):
        raise RuntimeError("NVML Shared Library Not Found")

    app = PkbApp(config=app_config(seeded[0], telemetry=broken))

    async def body(pilot):
        await pilot.press("m")
        await app.workers.wait_for_complete()
        expected = "telemetry unavailable: NVML Shared Library Not Found"
        for _ in range(50):  # the message lands after the sampler worker fails: wait for it, bounded
            await pilot.pause(0.1)
            if expected in screen_text(app):
                break
        assert expected in screen_text(app)

    drive(app, body)


def test_q_quits_when_no_run_goes_on(seeded):
    app = PkbApp(config=app_config(seeded[0]))

    async def body(pilot):
        await pilot.press("h", "q")
        await pilot.pause()

    drive(app, body)
    assert app.return_code == 0


def test_typing_q_in_a_filter_types_it(seeded):
    app = PkbApp(config=app_config(seeded[0]))

    async def body(pilot):
        await pilot.press("slash", "q")
        await pilot.pause()
        assert app.is_running
        assert app.screen.query_one("#task-filter").value == "q"

    drive(app, body)
