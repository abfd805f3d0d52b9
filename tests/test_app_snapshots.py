"""Snapshots (pytest-textual-snapshot) of every screen with fixed data: the known runs in a real
SQLite file, a fixed clock and catalogue, UTC dates, and the real RingBuffer filled with a fixed
8-GPU x 18-link trace standing in for NVML. Regenerate with --snapshot-update, then look."""

from __future__ import annotations

import pytest

from pkb_tui.app import PkbApp
from pkb_tui.app.live_state import LiveState
from pkb_tui.engine import events as ev
from pkb_tui.store import Store
from tests.app_fixtures import FIXED_NOW, FakeTelemetry, app_config, gpu_ring, host_ring, seed_runs


@pytest.fixture(params=[(80, 24), (200, 50)], ids=["80x24", "200x50"])
def size(request) -> tuple[int, int]:
    """Every screen at the smallest terminal it must fit (80x24) and at a wide one (columns widen)."""
    return request.param


@pytest.fixture
def app_factory(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # log paths below are relative: the same text on every machine
    db = tmp_path / "runs.db"
    ids = seed_runs(db)

    def make(**overrides) -> PkbApp:
        app = PkbApp(config=app_config(db, **overrides))
        app.run_ids = ids
        return app

    return make


async def settle(pilot) -> None:
    await pilot.app.workers.wait_for_complete()
    await pilot.pause(0.3)


def test_launch_screen(app_factory, snap_compare, size):
    async def marked(pilot):
        await settle(pilot)
        await pilot.press("space", "down")  # mark all_reduce (the cursor stays), then highlight all_gather

    assert snap_compare(app_factory(), run_before=marked, terminal_size=size)


def test_history_screen(app_factory, snap_compare, size):
    assert snap_compare(app_factory(), press=["h"], run_before=settle, terminal_size=size)


def test_history_filters_picker(app_factory, snap_compare, size):
    assert snap_compare(app_factory(), press=["h", "f"], run_before=settle, terminal_size=size)


def test_leaderboard(app_factory, snap_compare, size):
    assert snap_compare(app_factory(), press=["h", "b"], run_before=settle, terminal_size=size)


def test_result_screen(app_factory, snap_compare, size):
    app = app_factory()

    async def open_run(pilot):
        await settle(pilot)
        app.open_result(app.run_ids[2])
        await pilot.pause(0.3)

    assert snap_compare(app, run_before=open_run, terminal_size=size)


def test_result_screen_with_chart(app_factory, snap_compare, size):
    app = app_factory()

    async def open_run(pilot):
        await settle(pilot)
        app.open_result(app.run_ids[1])
        await pilot.pause(0.3)
        await pilot.press("end")
        await pilot.pause(0.3)

    assert snap_compare(app, run_before=open_run, terminal_size=size)


def test_result_of_a_run_that_errored(app_factory, snap_compare, size):
    app = app_factory()

    async def open_run(pilot):
        await settle(pilot)
        app.open_result(app.run_ids[5])
        await pilot.pause(0.3)

    assert snap_compare(app, run_before=open_run, terminal_size=size)


def test_compare_screen(app_factory, snap_compare, size):
    app = app_factory()

    async def compare(pilot):
        await settle(pilot)
        app.open_compare(app.run_ids[1], app.run_ids[4])  # all_reduce: torch-p2p vs gpt-x-kernels
        await pilot.pause(0.3)

    assert snap_compare(app, run_before=compare, terminal_size=size)


def live_state(run_id: int) -> LiveState:
    """A batch of three runs, the first finished (in 60 s), the second in its timing phase for 20 s."""
    state = LiveState.for_batch(
        [("all_reduce", "torch-p2p"), ("all_gather", "torch-p2p"), ("reduce_scatter", "torch-p2p")],
        world_size=8, mode="nccl", dtype="bfloat16", size="default", started_at=1_767_225_600.0 - 95,
    )
    state.apply(ev.BatchStarted(world_size=8, mode="nccl"), None)
    state.apply(ev.RunStarted(item=0, task="all_reduce", model="torch-p2p", trials=3), run_id - 1, now=FIXED_NOW - 90)
    state.apply(ev.RunFinished(item=0, status="passed"), run_id - 1, now=FIXED_NOW - 30)
    state.apply(ev.RunStarted(item=1, task="all_gather", model="torch-p2p", trials=3), run_id, now=FIXED_NOW - 20)
    for trial in range(3):
        state.apply(ev.TrialResult(item=1, trial=trial, correct=True), run_id)
    state.apply(ev.Progress(item=1, phase="timing", variant="candidate"), run_id)
    state.apply(ev.Kernels(item=1, variant="baseline", rank=0, kernels=[
        {"name": "ncclDevKernel_AllGather_RING_LL", "category": "communication", "calls": 30, "total_us": 27_000.0,
         "mean_us": 900.0, "share_fraction": 0.97},
    ]), run_id)
    state.apply(ev.Error(item=1, where="candidate", message="rank 3 saw a stale flag; retried", rank=3), run_id)
    return state


def test_live_screen(app_factory, snap_compare, size):
    app = app_factory()

    async def running(pilot):
        await settle(pilot)
        run_id = app.run_ids[2]
        with Store(app.config.db_path) as store:
            store.update_run(run_id, log_path="run-live.log")
        with open("run-live.log", "w") as log:
            log.write("".join(f"[rank 0] trial {t}: correct, max abs err 0.0\n" for t in range(3)))
            log.write("[rank 0] timing candidate: 30 iterations\n")
        app.batch.state = live_state(run_id)
        app.batch.busy = True  # the nav bar and cancel see a batch going
        app._update_summary()
        app.batch.telemetry_override = FakeTelemetry(gpu_ring(gpus=8, links=18))
        await pilot.press("v")
        await pilot.pause(0.6)

    assert snap_compare(app, run_before=running, terminal_size=size)


def test_live_screen_before_any_run_on_a_cpu_box(app_factory, snap_compare, size):
    app = app_factory()

    async def idle(pilot):
        await settle(pilot)
        app.batch.telemetry_override = FakeTelemetry(host_ring(), source="host", reason="no NVIDIA GPU found")
        await pilot.press("v")
        await pilot.pause(0.6)

    assert snap_compare(app, run_before=idle, terminal_size=size)


def test_monitor_screen(app_factory, snap_compare, size):
    app = app_factory(telemetry=lambda db: FakeTelemetry(gpu_ring(gpus=8, links=18)))

    async def shown(pilot):
        await settle(pilot)
        await pilot.press("m")
        await settle(pilot)
        await pilot.pause(0.3)

    assert snap_compare(app, run_before=shown, terminal_size=size)


def test_help_screen(app_factory, snap_compare, size):
    assert snap_compare(app_factory(), press=["question_mark"], run_before=settle, terminal_size=size)


def test_quit_question_during_a_run(app_factory, snap_compare, size):
    app = app_factory()

    async def asked(pilot):
        await settle(pilot)
        app.batch.busy = True  # as if a batch were running: q must ask
        await pilot.press("q")
        await pilot.pause(0.3)
        app.batch.busy = False

    assert snap_compare(app, run_before=asked, terminal_size=size)
