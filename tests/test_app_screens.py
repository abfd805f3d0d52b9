"""The dashboard driven through Textual's pilot on a real SQLite file of known runs: history lists
and filters them, two runs compare, the leaderboard's figures match those computed here from the
same rows, the result screen shows a run (and a failed run its error), help lists every key,
Monitor owns its sampler only while shown, and q quits."""

from __future__ import annotations

import asyncio
import math
from collections.abc import Awaitable, Callable

import pytest
from textual.widgets import DataTable, Input, Select

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
        tasks = [row[0][2:] for row in table_rows(app.screen.query_one("#tasks", DataTable))]
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
        assert [r[0][2:] for r in table_rows(table)] == ["ring_attention"]
        # Back to the table, then "/" again selects the filter's text: backspace clears it.
        await pilot.press("escape", "slash", "backspace", "escape", "f")
        await pilot.pause()
        assert app.screen.query_one("#family", Select).value == "collective"
        assert [r[0][2:] for r in table_rows(table)] == ["all_reduce", "all_gather", "reduce_scatter"]

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
        from rich.console import Console

        from pkb_tui.app.screens.help import key_table

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


def test_marking_is_explicit_and_enter_never_launches(seeded):
    app = PkbApp(config=app_config(seeded[0], defaults={"models": ["torch-p2p", "gpt-x-kernels"]}))

    async def body(pilot):
        table = app.screen.query_one("#tasks", DataTable)
        await pilot.press("space")
        await pilot.pause()
        assert table.cursor_row == 0  # marking does not move
        cell = table.get_row_at(0)[0]
        assert cell.plain.startswith("☒ all_reduce")  # a box, not only a colour
        assert table.get_row_at(1)[0].plain.startswith("☐ ")
        await pilot.press("down", "space", "down", "space", "enter")
        await pilot.pause()
        assert isinstance(app.screen, LaunchScreen) and not app.batch.busy and not app.batch.pending
        # 3 tasks x 2 models, of which gpt-x-kernels has only all_reduce: 4 runs, 2 pairs left out.
        summary = str(app.screen.query_one("#launch-summary").render())
        assert "3 marked tasks × 2 models = 4 runs" in summary, summary
        assert "2 pairs without a solution left out" in summary
        assert app.screen.planned_runs() == (4, 2)

    drive(app, body, size=(120, 40))


def test_the_filter_matches_ids_and_families_and_descriptions_only_when_asked(seeded):
    app = PkbApp(config=app_config(seeded[0]))

    async def body(pilot):
        table = app.screen.query_one("#tasks", DataTable)
        await pilot.press("slash", *"fsdp")  # in all_gather's and reduce_scatter's sources only
        await pilot.pause()
        assert table.row_count == 0
        box = app.screen.query_one("#task-filter", Input)
        box.value = ""
        await pilot.press("question_mark", *"fsdp")
        await pilot.pause()
        assert [r[0][2:] for r in table_rows(table)] == ["all_gather", "reduce_scatter"]
        box.value = ""
        await pilot.press(*"context")  # a family
        await pilot.pause()
        assert [r[0][2:] for r in table_rows(table)] == ["ring_attention"]

    drive(app, body)


def test_launch_options_and_marks_outlive_the_session(seeded):
    from pkb_tui.app import preset
    from pkb_tui.engine.request import RunRequest

    db = seeded[0]
    first = PkbApp(config=app_config(db))

    async def mark_and_save(pilot):
        await pilot.press("down", "space")
        await pilot.pause()
        request = RunRequest(tasks=["all_gather"], models=["gpt-x-kernels"], world_size=4, mode="cpu",
                             dtype="bfloat16", trials=7)
        first.screen.save_preset(request)  # what a launch saves

    drive(first, mark_and_save)
    assert preset.load(db)["marked"] == ["all_gather"]
    second = PkbApp(config=app_config(db))

    async def check(pilot):
        screen = second.screen
        assert screen.marked == {"all_gather"}
        assert screen.query_one("#world-size", Select).value == 4
        assert screen.query_one("#dtype", Select).value == "bfloat16"
        assert screen.chosen_models() == ["gpt-x-kernels"]
        assert "☒ all_gather" in screen_text(second)

    drive(second, check)


def test_a_run_is_deleted_from_history_after_asking(seeded):
    from pkb_tui.app.screens.confirm import ConfirmScreen
    from pkb_tui.store import Store

    db, ids = seeded
    app = PkbApp(config=app_config(db))

    async def body(pilot):
        await pilot.press("h")
        await pilot.pause()
        newest = max(ids)
        await pilot.press("d")
        await pilot.pause()
        assert isinstance(app.screen, ConfirmScreen) and f"#{newest}" in screen_text(app)
        await pilot.press("n")
        await pilot.pause()
        assert newest in [r["id"] for r in app.store.runs()]
        await pilot.press("d", "y")
        await pilot.pause()
        assert isinstance(app.screen, HistoryScreen)
        rows = table_rows(app.screen.query_one("#runs", RowList))
        assert newest not in [int(r[1]) for r in rows] and len(rows) == len(ids) - 1

    drive(app, body)
    with Store(db) as store:
        assert newest_gone(store, max(ids))


def newest_gone(store, run_id: int) -> bool:
    return run_id not in [r["id"] for r in store.runs(limit=None)]


@pytest.mark.parametrize("screen_key", ["l", "v", "h", "m"])
def test_quit_and_help_stay_in_the_key_bar_at_80_columns(seeded, screen_key):
    from pkb_tui.app.widgets.keybar import KeyBar

    app = PkbApp(config=app_config(seeded[0]))

    async def body(pilot):
        await pilot.press(screen_key)
        await pilot.pause()
        bar = app.screen.query_one(KeyBar).render().plain
        assert bar.rstrip().endswith("Quit") and " ? " in bar, bar

    drive(app, body)


def test_the_command_palette_offers_the_main_actions(seeded):
    from textual.command import CommandPalette

    app = PkbApp(config=app_config(seeded[0]))

    async def body(pilot):
        titles = [c.title for c in app.get_system_commands(app.screen)]
        for title in ("Show Launch", "Show Live", "Show History", "Show Monitor", "Run the batch", "Help", "Quit"):
            assert title in titles
        await pilot.press("h")
        await pilot.pause()
        titles = [c.title for c in app.get_system_commands(app.screen)]
        assert "Delete runs" in titles and "Run the batch" not in titles
        await pilot.press("ctrl+p")
        await pilot.pause()
        assert isinstance(app.screen, CommandPalette)

    drive(app, body)


def test_help_sizes_its_key_column_to_the_widest_key(seeded):
    from pkb_tui.app.screens.help import key_table

    table = key_table()
    keys = [cell for cell in table.columns[0]._cells if isinstance(cell, str)]  # titles are Text
    assert "↑ ↓ pgup pgdn" in keys and "esc, backspace" in keys
    assert table.columns[0].width == max(len(key) for key in keys)


def test_ticked_and_unticked_boxes_differ_by_more_than_colour(seeded):
    app = PkbApp(config=app_config(seeded[0], defaults={"models": ["torch-p2p"]}))

    async def body(pilot):
        text = screen_text(app)
        assert "▐X▌ torch-p2p" in text and "▐ ▌ baseline" in text
        assert "▐X▌ timing" in text and "▐ ▌ oversubscribe" in text
        await pilot.press("o")  # options: tab to the oversubscribe box and tick it
        app.screen.query_one("#oversubscribe").value = True
        await pilot.pause()
        assert "▐X▌ oversubscribe" in screen_text(app)
        assert app.screen.request().oversubscribe

    drive(app, body)


def test_a_database_damaged_past_its_header_closes_the_app_with_one_sentence(tmp_path):
    from tests.test_store import _damaged_database

    db = _damaged_database(tmp_path)
    from pkb_tui.errors import PkbError

    try:  # opening it may already read the damaged pages (schema migrations): one sentence, exit 3
        app = PkbApp(config=app_config(db))
    except PkbError as exc:
        assert exc.exit_code == 3 and "damaged" in str(exc)
        return

    async def main() -> None:
        # Launch's "last" column reads the damaged pages as the app opens (before a pilot could
        # take over): the app must close by itself.
        await asyncio.wait_for(app.run_async(headless=True, size=(80, 24)), timeout=120)

    asyncio.run(main())
    assert app.return_code == 3 and app._exception is None  # closed with the sentence, no traceback


def test_result_says_what_each_node_of_a_multi_node_run_sampled(seeded):
    from collectors.sample import GpuSample
    from collectors.sink import write_samples
    from pkb_tui.store import Store

    db, ids = seeded
    with Store(db) as store:
        other = store.upsert_host({"hostname": "node-b"})
        write_samples(store.conn, [
            GpuSample(ts=1000.0 + i, gpu=-1, cpu_pct=40.0 + 10 * node, nic_tx_bytes_per_s=2e6, nic_rx_bytes_per_s=3e6,
                      run_id=ids[1], node=node, host_id=other if node else None)
            for i in range(5) for node in (0, 1)
        ])
    app = PkbApp(config=app_config(db, chart_refresh_s=0.0))

    async def body(pilot):
        app.open_result(ids[1])
        await pilot.pause()
        text = screen_text(app)
        assert "node 1 (node-b): 5 samples, host CPU 50/50%" in text, text
        assert "node 0 (" in text and "NIC 2.0 MB/s out / 3.0 MB/s in" in text
    drive(app, body, size=(160, 50))


def test_the_dashboard_keeps_pythons_full_collection_out_of_its_frames(tmp_path, monkeypatch):
    import gc

    import pkb_tui.app.app as app_module

    monkeypatch.setattr(app_module, "FULL_COLLECTION_S", 0.05)
    before = gc.get_threshold()
    app = PkbApp(config=app_config(tmp_path / "runs.db", freeze_startup=True))

    async def body(pilot):
        await pilot.pause()
        assert gc.get_threshold()[2] >= 1_000_000, gc.get_threshold()  # no automatic full pass
        assert gc.get_freeze_count() > 0  # start-up's objects left out of the passes
        collections = gc.get_stats()[2]["collections"]
        await pilot.pause(0.3)  # the app's own timer runs them, after a refresh
        assert gc.get_stats()[2]["collections"] > collections
    try:
        drive(app, body)
    finally:
        gc.set_threshold(*before)
        gc.unfreeze()
