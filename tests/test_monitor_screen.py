"""The Monitor screen on a real Telemetry sampling replayed NVML traces (CI has no GPU): eight GPUs x
18 NVLink links wired directly (tests/fixtures/nvml_trace_8x18.json) and the recorded one-GPU H200
(no NVLink). Pilot tests read the screen as text; snapshots pin the layout at 80x24 and 200x50.
Regenerate snapshots with --snapshot-update, then look at them."""

from __future__ import annotations

import json
import sqlite3
import time

import pytest

from collectors.sample import GpuSample, LinkSample
from collectors.sink import write_samples
from pkb_tui.app import PkbApp
from pkb_tui.app.widgets.gpu_history import RateHistory
from pkb_tui.app.widgets.monitor_views import graph, na_notes
from pkb_tui.store import Store
from tests.app_fixtures import FIXED_NOW, app_config, screen_text, seed_runs
from tests.monitor_fixtures import TRACE_8X18, TRACE_H200, replayed


@pytest.fixture
def db(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    path = tmp_path / "runs.db"
    seed_runs(path)
    return path


def monitor_app(db, telemetry) -> PkbApp:
    return PkbApp(config=app_config(db, telemetry=lambda path: telemetry))


async def show_monitor(pilot) -> None:
    await pilot.press("m")
    for _ in range(3):  # the sampler starts in a worker, then the facts are read in another
        await pilot.app.workers.wait_for_complete()
        await pilot.pause(0.3)


def drive(app: PkbApp, body, size=(200, 50)) -> None:
    import asyncio

    async def main():
        async with app.run_test(size=size) as pilot:
            await show_monitor(pilot)
            await body(pilot)

    asyncio.run(main())


def expected_pairs(trace_path) -> dict[tuple[int, int], int]:
    """Links per GPU pair, read straight from the trace's link table (remote PCI bus ids)."""
    trace = json.loads(trace_path.read_text())
    bus = {d["pci_bus_id"].lower(): i for i, d in enumerate(trace["devices"])}
    pairs: dict[tuple[int, int], int] = {}
    for a, device in enumerate(trace["devices"]):
        for link in device["nvlink_active"]:
            b = bus[device["nvlink_remote"][str(link)].lower()]
            pairs[(a, b)] = pairs.get((a, b), 0) + 1
    return pairs


# ------------------------------------------------------------------------------ pilot tests
def test_topology_matrix_matches_the_replayed_link_table(db):
    telemetry = replayed(TRACE_8X18)
    pairs = expected_pairs(TRACE_8X18)
    topology = telemetry.topology()
    for a in range(8):
        for b in range(8):
            want = "X" if a == b else f"NV{pairs[(a, b)]}" if (a, b) in pairs else "-"
            assert topology.pair_label(a, b) == want, (a, b)
    assert topology.pair_label(3, 7) == "NV1"  # the cable between them that is down
    app = monitor_app(db, telemetry)

    async def body(pilot):
        await pilot.press("o")
        await pilot.pause(0.3)
        rows = {line.split()[0]: line.split()[1:9] for line in screen_text(app).splitlines()
                if line.startswith("GPU") and len(line.split()) > 9 and line.split()[1] in ("X", "NV1", "NV2", "NV3")}
        assert len(rows) == 8
        for a in range(8):
            shown = rows[f"GPU{a}"]
            assert shown == ["X" if a == b else f"NV{pairs[(a, b)]}" for b in range(8)], a

    drive(app, body)


def test_a_figure_nvml_does_not_support_reads_na_not_zero(db):
    telemetry = replayed(TRACE_8X18)
    assert telemetry.ring.latest_per_gpu()[5].temperature_c is None  # GPU 5: NOT_SUPPORTED in the trace
    app = monitor_app(db, telemetry)

    async def body(pilot):
        text = screen_text(app)
        assert "temperature n/a on GPU5: NVML answers NOT_SUPPORTED" in text  # the reason, said once
        assert text.count("NOT_SUPPORTED") == 1
        gpu5 = next(line for line in text.splitlines() if "TMP" in line and "│" in line and "n/a" in line)
        assert "0°C" not in gpu5.split("│")[1]  # GPU5 is the second panel of its row
        assert "TMP ·········" in gpu5 or "TMP ····" in gpu5  # an empty bar, not a zero one

    drive(app, body)


def test_one_gpu_without_nvlink_says_why_once(db):
    telemetry = replayed(TRACE_H200, ticks=10, ranks=0)
    app = monitor_app(db, telemetry)

    async def body(pilot):
        text = screen_text(app)
        assert "NVLink n/a on GPU0: no active link" in text
        assert "NVLink  n/a: no active NVLink link" in text
        assert "NVL↑" not in text  # no graph of a rate that does not exist
        assert "58.9" in text  # the recorded PCIe RX (GPM) of its last tick, in GB/s
        assert "Processes  n/a" in text  # not recorded in that trace: unknown, not "none"

    drive(app, body)


def test_processes_show_the_ranks_of_a_run(db):
    app = monitor_app(db, replayed(TRACE_8X18))

    async def body(pilot):
        await pilot.press("o")
        await pilot.pause(0.3)
        lines = screen_text(app).splitlines()
        rank0 = next(line for line in lines if " 41000 " in line)
        assert "▶ r0 python -m pkb_tui.engine.worker --rank 0" in rank0 and "alice" in rank0
        notebook = next(line for line in lines if " 3001 " in line)
        assert "▶" not in notebook and "bob" in notebook and "12.9 GB" in notebook

    drive(app, body)


def test_the_record_key_writes_what_is_shown_into_runs_db(db):
    start = time.time()
    telemetry = replayed(TRACE_8X18, ticks=5, db_path=db, start_ts=start)
    app = monitor_app(db, telemetry)

    async def body(pilot):
        assert "○ not recorded" in screen_text(app)
        await pilot.press("r")
        await pilot.pause(0.3)
        assert telemetry.recording and "● recording to runs.db" in screen_text(app)
        telemetry.advance(4)
        await pilot.press("r")
        await pilot.pause(0.3)
        assert not telemetry.recording and "○ not recorded" in screen_text(app)
        telemetry.advance(2)  # not recorded

    drive(app, body)
    conn = sqlite3.connect(db)
    rows = conn.execute("SELECT COUNT(*), MIN(ts), MAX(ts) FROM samples WHERE gpu >= 0").fetchone()
    links = conn.execute("SELECT COUNT(*) FROM link_samples").fetchone()[0]
    assert rows[0] == 4 * 8 and links == 4 * (8 * 18 - 2)
    assert rows[1] == pytest.approx(start + 5 * 0.25) and rows[2] == pytest.approx(start + 8 * 0.25)


def test_the_ten_minute_window_reads_older_samples_from_the_database(db):
    # Recorded earlier (by `pkb-tui monitor` or a run): 400 GB/s on GPU 0 five minutes ago.
    with Store(db) as store:
        write_samples(store.conn, [
            GpuSample(ts=FIXED_NOW - 300 + k, gpu=0, nvlink_tx_bytes_per_s=400e9, links=[LinkSample(0, 1e9, 1e9)])
            for k in range(60)
        ])
    telemetry = replayed(TRACE_8X18)
    app = monitor_app(db, telemetry)

    async def body(pilot):
        await pilot.press("3")
        for _ in range(3):
            await app.workers.wait_for_complete()
            await pilot.pause(0.3)
        screen = app.screen
        assert "window 10 min" in screen_text(app)
        history, now = screen.history, FIXED_NOW + 39 * 0.25
        values = history.series(0, "nvlink_tx_bytes_per_s", now)  # one value per graph column
        five_minutes_ago = history.bucket_of(FIXED_NOW - 270) - (history.bucket_of(now) - history.buckets + 1)
        assert values[five_minutes_ago] == pytest.approx(400e9)  # from runs.db
        assert values[0] is None  # 10 minutes ago: nothing recorded, a gap (not 0)
        assert values[-1] is not None and values[-1] < 400e9  # now, from the ring
        await pilot.press("w")
        await pilot.pause(0.3)
        assert "window 10 s" in screen_text(app)

    drive(app, body)


# ------------------------------------------------------------------------------ the pieces
def test_history_buckets_average_and_hold_short_gaps_only():
    history = RateHistory(10.0, 10)  # 1 s buckets
    history.feed([GpuSample(ts=100.2, gpu=0, sm_util_pct=10.0), GpuSample(ts=100.7, gpu=0, sm_util_pct=30.0),
                  GpuSample(ts=105.5, gpu=0, sm_util_pct=50.0)])
    values = history.series(0, "sm_util_pct", now=105.9)
    # buckets 96..105: nothing before 100, 20 at 100 held one second (HOLD_S), gap, 50 at 105
    assert values == [None, None, None, None, 20.0, 20.0, None, None, None, 50.0]
    assert history.series(0, "pcie_tx_bytes_per_s", now=105.9) == [None] * 10  # never measured: no zeros


def test_graph_draws_gaps_and_levels():
    assert graph([None, 0.0, 50.0, 100.0], 4, 1, 100.0) == ["·▁▄█"]
    assert graph([100.0, None], 2, 2, 100.0) == ["█ ", "█·"]


def test_na_notes_group_one_reason_on_every_gpu():
    notes = na_notes({0: {"DRAM bandwidth": "GPM metrics need Hopper or newer"},
                      1: {"DRAM bandwidth": "GPM metrics need Hopper or newer", "temperature": "NVML answers NOT_SUPPORTED"}},
                     [0, 1])
    assert notes == ["DRAM bandwidth n/a on every GPU: GPM metrics need Hopper or newer",
                     "temperature n/a on GPU1: NVML answers NOT_SUPPORTED"]


def test_links_to_an_nvswitch_count_as_a_switched_path():
    from collectors import nvml as N
    from collectors.replay import ReplayNvml

    def device(index):
        return {"name": "NVIDIA H100", "nvlink_link_count": 2, "nvlink_active": [0, 1], "gpm_supported": False,
                "pci_bus_id": f"0000:{0x10 + index:02x}:00.0", "nvlink_version": 6,
                "nvlink_remote": {"0": "0000:a0:00.0", "1": "0000:a1:00.0"},
                "nvlink_remote_type": {"0": "switch", "1": "switch"},
                "ticks": [{"t_us": 1, "fields": {"138:0": 0, "139:0": 0, "138:1": 0, "139:1": 0}}]}

    replay = ReplayNvml({"devices": [device(0), device(1)]})
    sampler = N.NvmlSampler(nvml=replay, clock=replay.clock)
    topology = N.read_topology(sampler)
    assert topology.pair_label(0, 1) == "SW2" and topology.switch_links(0) == 2
    assert topology.gpu_bytes_per_s(0) == 2 * 25e9  # NVLink 4: 25 GB/s per link and direction


# ------------------------------------------------------------------------------ snapshots
def _snapshot(db, snap_compare, trace, size, *, press=(), ranks=8):
    telemetry = replayed(trace, ranks=ranks) if trace == TRACE_8X18 else replayed(trace, ticks=10, ranks=ranks)
    app = monitor_app(db, telemetry)

    async def shown(pilot):
        await show_monitor(pilot)
        for key in press:
            await pilot.press(key)
            await pilot.pause(0.3)

    return snap_compare(app, run_before=shown, terminal_size=size)


def test_monitor_8x18_at_80x24(db, snap_compare):
    assert _snapshot(db, snap_compare, TRACE_8X18, (80, 24))


def test_monitor_8x18_nvlink_at_80x24(db, snap_compare):
    assert _snapshot(db, snap_compare, TRACE_8X18, (80, 24), press=("n",))


def test_monitor_8x18_at_200x50(db, snap_compare):
    assert _snapshot(db, snap_compare, TRACE_8X18, (200, 50))


def test_monitor_h200_recorded_at_80x24(db, snap_compare):
    assert _snapshot(db, snap_compare, TRACE_H200, (80, 24), ranks=0)


def test_monitor_h200_recorded_at_200x50(db, snap_compare):
    assert _snapshot(db, snap_compare, TRACE_H200, (200, 50), ranks=0)
