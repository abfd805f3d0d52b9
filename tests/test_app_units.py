"""The dashboard's pure parts: figures as they read, gauges, sparklines with gaps, the live state
folding engine events, the telemetry rows, the log tail. No terminal needed."""

from __future__ import annotations

from pkb_tui.app.format import (
    bar, fmt_bytes, fmt_rate, fmt_speedup, fmt_us, spark, speedup_gauge, status_label,
)
from pkb_tui.app.live_state import LiveState
from pkb_tui.app.widgets.log_tail import tail_lines
from pkb_tui.app.widgets.telemetry import TelemetryPanel
from pkb_tui.engine import events as ev
from tests.app_fixtures import FakeTelemetry, gpu_ring, host_ring


def test_times_and_bytes_read_in_the_unit_that_fits():
    assert fmt_us(12.34) == "12.3 µs"
    assert fmt_us(950) == "950 µs"
    assert fmt_us(1234.5) == "1.23 ms"
    assert fmt_us(25_000) == "25.0 ms"
    assert fmt_us(2_500_000) == "2.5 s"
    assert fmt_bytes(512) == "512 B"
    assert fmt_bytes(235_000_000) == "235 MB"
    assert fmt_rate(1.5e9) == "1.5 GB/s"


def test_a_missing_figure_reads_na_never_zero():
    assert fmt_us(None) == fmt_bytes(None) == fmt_rate(None) == fmt_speedup(None) == "n/a"
    assert bar(None, 5) == "·····"
    # A gap in a sparkline is a dot, a zero is the lowest bar: the two must differ.
    line = spark([0.0, None, 10.0], 3)
    assert line == "▁·█"


def test_statuses_and_speedups_carry_a_mark_not_only_a_colour():
    assert status_label("passed") == "✓ passed"
    assert status_label("failed") == "✗ failed"
    assert status_label("timeout") == "⏱ timeout"
    assert status_label("interrupted").startswith("⊘")
    assert fmt_speedup(1.25) == "1.25× ▲"
    assert fmt_speedup(0.8) == "0.80× ▼"


def test_gauges_fill_in_proportion():
    assert bar(0.5, 8) == "████░░░░"
    assert bar(1.5, 4) == "████"  # clamped
    slower, faster = speedup_gauge(0.5, 11), speedup_gauge(2.0, 11)
    assert slower.index("│") == faster.index("│") == 5
    assert "█" in slower[:5] and "█" not in slower[6:]
    assert "█" in faster[6:] and "█" not in faster[:5]


def test_live_state_follows_a_run_through_its_events():
    state = LiveState.for_batch([("all_reduce", "torch-p2p"), ("all_gather", "torch-p2p")], world_size=2,
                                mode="cpu", dtype="float32", size="small", started_at=100.0)
    assert state.running and [r.status for r in state.runs] == ["queued", "queued"]
    version = state.version
    state.apply(ev.BatchStarted(world_size=2, mode="cpu", timings_representative=False), None)
    state.apply(ev.RunStarted(item=0, task="all_reduce", model="torch-p2p", trials=3), 7)
    assert state.current.run_id == 7 and state.current.status == "running" and state.trials == 3
    state.apply(ev.Progress(item=0, phase="trial", trial=1, trials=3), 7)
    state.apply(ev.TrialResult(item=0, trial=0, correct=True), 7)
    state.apply(ev.Kernels(item=0, variant="candidate", rank=0, kernels=[
        {"name": "small", "category": "copy", "calls": 1, "total_us": 5.0, "mean_us": 5.0},
        {"name": "big", "category": "candidate", "calls": 1, "total_us": 50.0, "mean_us": 50.0},
    ]), 7)
    assert [k["name"] for k in state.kernels] == ["big", "small"]  # by total time
    state.apply(ev.Error(item=0, where="candidate", message="boom", rank=1), 7)
    state.apply(ev.RunFinished(item=0, status="failed", detail="trial 2 wrong"), 7)
    assert state.runs[0].status == "failed" and not state.timings_representative
    assert state.errors[0].message == "boom" and state.version > version
    # Cancelled while the second run waited: never started, it ends cancelled (not interrupted).
    state.finish(status="interrupted", finished_at=130.0)
    assert not state.running
    assert [r.status for r in state.runs] == ["failed", "cancelled"]
    assert state.counts() == {"failed": 1, "cancelled": 1}


def test_telemetry_rows_for_8_gpus_and_18_links_fit_the_width():
    panel = TelemetryPanel(detail=True)
    telemetry = FakeTelemetry(gpu_ring(gpus=8, links=18))
    for width in (80, 120, 200):
        lines = panel.build_lines(telemetry, width)
        gpu_rows = [line for line in lines if line.plain.startswith("GPU")]
        assert len(gpu_rows) == 8
        assert all(line.cell_len <= width for line in lines), width
    wide = panel.build_lines(telemetry, 200)
    assert "│" in wide[1].plain  # the link strip rides on the GPU's row when there is room
    narrow = panel.build_lines(telemetry, 80)
    assert narrow[2].plain.strip().startswith("18 links")  # else on a row of its own


def test_a_host_without_gpus_shows_its_own_row_and_says_why():
    panel = TelemetryPanel()
    lines = panel.build_lines(FakeTelemetry(host_ring(), source="host", reason="no NVIDIA GPU found"), 80)
    assert "no NVIDIA GPU found" in lines[0].plain
    assert lines[-1].plain.startswith("host")
    assert panel.build_lines(None, 80)[0].plain.startswith("no live telemetry")


def test_each_ranks_cpu_use_shows_under_the_host_row():
    from collectors.sample import GpuSample, RankCpu
    from collectors.sink import RingBuffer

    ring = RingBuffer()
    ring.append([GpuSample(ts=1.0, gpu=-1, cpu_pct=80.0, ranks=[RankCpu(0, 11, 97.4), RankCpu(1, 12, None)])])
    lines = TelemetryPanel().build_lines(FakeTelemetry(ring, source="host", reason="no NVIDIA GPU found"), 80)
    assert lines[-2].plain.startswith("host")
    assert lines[-1].plain.strip().startswith("ranks' CPU") and "r0 97%" in lines[-1].plain and "r1 n/a" in lines[-1].plain


def test_log_tail_reads_only_the_end(tmp_path):
    log = tmp_path / "run.log"
    log.write_text("".join(f"line {i}\n" for i in range(10_000)))
    assert tail_lines(log, 3) == ["line 9997", "line 9998", "line 9999"]
    assert tail_lines(tmp_path / "missing.log", 3) == []
    assert tail_lines(None, 3) == []
