"""How fast the dashboard draws: prints

  1. the time to open History on a database of 10,000 runs and 1,000,000 samples
     (target < 200 ms), cold (first time the screen is built) and warm (shown again): from the
     key press to the last frame drawn, and, for comparison, to Textual's test driver returning;
  2. the cost of one Live refresh with 8 GPUs x 18 NVLink links (target < 16 ms):
     reading the ring buffer and building the rows, and the whole tick with the redraw;
  3. the cost of one Monitor frame at 4 Hz with 8 GPUs x 18 links (target < 16 ms): the new samples
     of a 10 Hz sampler folded into the history, the GPU panels, NVLink heatmap, topology and
     processes built and turned into strips; and the one-off refill when the window changes to
     10 minutes (the whole ring read once).

The database is built once through the Store and the collectors' sample writer, then reused
(--db to keep it elsewhere). Headless: Textual's test driver, a 200x50 terminal.

    python bench/tui_render.py [--runs 10000] [--samples 1000000] [--repeat 5] [--only monitor]
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import math
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from collectors.sample import GpuSample, LinkSample  # noqa: E402
from collectors.sink import RingBuffer, write_samples  # noqa: E402
from pkb_tui.store import Store  # noqa: E402

TASKS = ["all_reduce", "all_gather", "reduce_scatter", "all_to_all", "broadcast", "reduce", "gather", "scatter"]
MODELS = ["torch-p2p", "gpt-x", "claude-y", "gemini-z", "baseline"]
STATUSES = ["passed"] * 7 + ["failed", "error", "timeout"]


def build_db(path: Path, runs: int, samples: int) -> None:
    t0 = time.perf_counter()
    with Store(path) as store:
        host = store.upsert_host({"hostname": "bench-box", "gpu_model": "NVIDIA H200", "gpu_count": 8})
        start = time.time() - runs * 60
        for i in range(runs):
            status = STATUSES[i % len(STATUSES)]
            run_id = store.create_run({
                "batch_id": f"b{i // 8}", "task_id": TASKS[i % len(TASKS)], "model": MODELS[(i // 8) % len(MODELS)],
                "world_size": 8, "mode": "nccl", "dtype": "bfloat16", "size": "default", "trials": 3,
                "timeout_s": 300.0, "request": "{}", "status": status, "host_id": host,
                "created_at": start + i * 60, "launcher_pid": 1, "launcher_host": "elsewhere",
            })
            base = 1000.0 + (i % 97)
            store.add_result(run_id, "baseline", {"correct": 1, "median_us": base, "p10_us": base * 0.9,
                                                  "p90_us": base * 1.1, "trials_passed": 3, "trials_total": 3})
            cand = base / (0.5 + (i % 13) / 6)
            store.add_result(run_id, "candidate", {
                "correct": int(status == "passed"), "median_us": cand, "speedup": base / cand,
                "roofline_fraction": 0.3 + (i % 7) / 10, "trials_passed": 3, "trials_total": 3,
            })
        print(f"  {runs:,} runs written in {time.perf_counter() - t0:.1f} s", flush=True)
        t0 = time.perf_counter()
        conn = store.conn
        batch = []
        per_gpu = samples // 8
        for step in range(per_gpu):
            for gpu in range(8):
                batch.append(GpuSample(ts=start + step * 0.1, gpu=gpu, nvlink_tx_bytes_per_s=1e11, nvlink_rx_bytes_per_s=9e10,
                                       sm_util_pct=50.0, power_w=400.0, run_id=1 + (step * 8 // 1000) % runs))
            if len(batch) >= 50_000:
                write_samples(conn, batch, host)
                batch = []
        if batch:
            write_samples(conn, batch, host)
        print(f"  {per_gpu * 8:,} samples written in {time.perf_counter() - t0:.1f} s", flush=True)


def full_ring(gpus: int, links: int) -> RingBuffer:
    """A ring at its full capacity (an hour at 10 Hz), 8 GPUs x 18 links plus the host row."""
    ring = RingBuffer()
    steps = ring.capacity // (gpus + 1)
    for step in range(steps):
        rate = 2e11 * (0.5 + 0.5 * math.sin(step / 7))
        ring.append([
            GpuSample(ts=step * 0.1, gpu=g, nvlink_tx_bytes_per_s=rate, nvlink_rx_bytes_per_s=rate, pcie_tx_bytes_per_s=1e9,
                      pcie_rx_bytes_per_s=1e9, sm_util_pct=60, power_w=500,
                      links=[LinkSample(l, rate / links, rate / links) for l in range(links)])
            for g in range(gpus)
        ] + [GpuSample(ts=step * 0.1, gpu=-1, cpu_pct=30.0)])
    return ring


class _Telemetry:
    def __init__(self, ring: RingBuffer) -> None:
        self.ring, self.source, self.reason = ring, "nvml", None


def ms(values: list[float]) -> str:
    return f"median {statistics.median(values) * 1e3:.1f} ms (min {min(values) * 1e3:.1f}, max {max(values) * 1e3:.1f}, n={len(values)})"


class Clock:
    """Wall time and this process's CPU time of a block. On a shared, loaded machine the wall
    time includes waiting for a core; the CPU time is what the work itself costs."""

    def __init__(self) -> None:
        self.wall: list[float] = []
        self.cpu: list[float] = []

    def __enter__(self) -> "Clock":
        self._wall, self._cpu = time.perf_counter(), time.process_time()
        return self

    def __exit__(self, *exc: object) -> None:
        self.wall.append(time.perf_counter() - self._wall)
        self.cpu.append(time.process_time() - self._cpu)

    def report(self) -> str:
        return f"wall {ms(self.wall)}\n      cpu  {ms(self.cpu)}"


class Frames:
    """When the app last drew a frame. Textual's test driver (pilot.press, pilot.pause) returns
    only after it has seen the process idle: it sleeps in 20 ms steps until one passes with
    (almost) no CPU used, three times per key press and pause, so a press-to-return time carries
    60 ms or more of the driver's own sleeping that no user waits for. The user sees the screen
    complete at the last frame drawn before the app went idle: that is what "drawn" times. The
    compositor renders a frame before handing it to App._display, so the frame's stamp includes
    the rendering. Waits Textual puts before a frame (its 60 fps pacing, a hold while a mode
    switches) count, since the user waits for those too."""

    def __init__(self, app) -> None:
        self.last_wall = self.last_cpu = 0.0
        display = app._display

        def stamped(screen, renderable) -> None:
            # A frame rendered while the app holds updates (a batch) is thrown away by _display:
            # the user never sees it, so it does not count as drawn.
            if renderable is not None and not app._batch_count:
                self.last_wall, self.last_cpu = time.perf_counter(), time.process_time()
            display(screen, renderable)

        app._display = stamped


class Drawn(Clock):
    """From the start of a block to the last frame the app drew in it (see Frames)."""

    def __init__(self, frames: Frames) -> None:
        super().__init__()
        self.frames = frames

    def __exit__(self, *exc: object) -> None:
        assert self.frames.last_wall > self._wall, "no frame drawn"
        self.wall.append(self.frames.last_wall - self._wall)
        self.cpu.append(self.frames.last_cpu - self._cpu)


def merged(clocks: list[Clock]) -> Clock:
    out = Clock()
    for clock in clocks:
        out.wall += clock.wall
        out.cpu += clock.cpu
    return out


async def bench_history(db: Path, repeat: int) -> None:
    from pkb_tui.app import AppConfig, PkbApp
    from pkb_tui.app.catalog import Catalog
    from pkb_tui.app.screens.history import HistoryScreen

    cold, warm, query = Clock(), Clock(), Clock()
    cold_drawn, warm_drawn = [], []
    for _ in range(repeat):
        app = PkbApp(config=AppConfig(db_path=db, catalog=Catalog, telemetry=None))
        frames = Frames(app)
        cold_drawn.append(Drawn(frames))
        warm_drawn.append(Drawn(frames))
        async with app.run_test(size=(200, 50)) as pilot:
            await app.workers.wait_for_complete()
            await pilot.pause()
            # The apps of earlier repeats are garbage by now; collected here so that a full
            # collection of them (100-170 ms measured) does not land, at random, inside a timing.
            # One app in a real session has no such pile; its own garbage is still collected in
            # the timed blocks as it would be.
            gc.collect()
            with cold, cold_drawn[-1]:  # compose and mount the screen, query, fill the table, draw
                await pilot.press("h")
                await pilot.pause()
            assert isinstance(app.screen, HistoryScreen) and app.screen.total > 0
            rows = app.screen.query_one("#runs").row_count
            await pilot.press("l")
            await pilot.pause()
            gc.collect()
            with warm, warm_drawn[-1]:  # shown again: nothing new in the database, so no reload; a full redraw
                await pilot.press("h")
                await pilot.pause()
            with query:
                app.store.count_runs_where()
                app.store.runs(limit=app.config.history_page)
    cold_d, warm_d = merged(cold_drawn), merged(warm_drawn)
    print(f"History open, first time (build the screen, query, {rows} rows, draw), key to last frame drawn:\n      {cold_d.report()}")
    print(f"  key to the test driver seeing the app idle (adds the driver's own idle sleeps, see Frames):\n      {cold.report()}")
    print(f"History shown again, key to last frame drawn:\n      {warm_d.report()}")
    print(f"  key to the test driver seeing the app idle:\n      {warm.report()}")
    print(f"  of which the database reads (count + first page):\n      {query.report()}")


async def bench_live(repeat: int) -> None:
    from pkb_tui.app import AppConfig, PkbApp
    from pkb_tui.app.catalog import Catalog
    from pkb_tui.app.screens.live import LiveScreen
    from pkb_tui.app.widgets.telemetry import TelemetryPanel
    from textual.geometry import Region

    ring = full_ring(8, 18)
    with tempfile.TemporaryDirectory() as tmp:
        app = PkbApp(config=AppConfig(db_path=Path(tmp) / "runs.db", catalog=Catalog, telemetry=None,
                                      live_refresh_s=3600))  # ticks driven by hand below
        app.batch.telemetry_override = _Telemetry(ring)
        async with app.run_test(size=(200, 50)) as pilot:
            await pilot.press("v")
            await pilot.pause()
            screen = app.screen
            assert isinstance(screen, LiveScreen)
            panel = screen.query_one(TelemetryPanel)
            build, tick = Clock(), Clock()
            region = Region(0, 0, panel.size.width, panel.size.height)
            for _ in range(repeat * 20):
                with build:
                    panel.build_lines(app.batch.telemetry, panel.size.width)
            for _ in range(repeat * 20):
                with tick:  # what a 4 Hz timer tick costs: read, build, turn into strips
                    screen.tick()
                    panel.render_lines(region)
            lines = len(panel.build_lines(app.batch.telemetry, panel.size.width))
    print(f"Live refresh, 8 GPUs x 18 links, ring at capacity ({len(ring):,} samples), panel {lines} lines at 200 columns:")
    print(f"  read the ring + build the rows:\n      {build.report()}")
    print(f"  one tick (read, build, render the panel's lines):\n      {tick.report()}")


class _MonitorTelemetry(_Telemetry):
    """A sampler's face for the Monitor: a ring at capacity, 8 x 18 links wired to peers, limits,
    ten processes. ``grow()`` appends what a 10 Hz sampler adds between two 4 Hz frames."""

    def __init__(self, ring: RingBuffer, gpus: int, links: int) -> None:
        from collectors.nvml import GpuLimits, GpuProcess, NvLinkLink, NvLinkTopology

        super().__init__(ring)
        self.gpus, self.links, self.step = gpus, links, len(ring) // (gpus + 1)
        self.gpu_names = {g: "NVIDIA H200" for g in range(gpus)}
        self._topology = NvLinkTopology(gpus=list(range(gpus)), links=[
            NvLinkLink(g, link, "gpu", (g + 1 + link % (gpus - 1)) % gpus, 4) for g in range(gpus) for link in range(links)])
        self._limits = {g: GpuLimits(g, "NVIDIA H200", 150e9, 700.0, 1980.0, 3201.0, 90.0, 5, 16) for g in range(gpus)}
        self._processes = [GpuProcess(g % gpus, 40000 + g, 30e9, "alice", f"python -m pkb_tui.engine.worker --rank {g}")
                           for g in range(10)]

    def start(self) -> "_MonitorTelemetry":
        return self

    def stop(self) -> None:
        pass

    def topology(self):
        return self._topology

    def limits(self):
        return self._limits

    def processes(self):
        return self._processes

    def unsupported(self):
        return {}

    def grow(self, ticks: int) -> None:
        for _ in range(ticks):
            self.step += 1
            rate = 2e11 * (0.5 + 0.5 * math.sin(self.step / 7))
            self.ring.append([
                GpuSample(ts=self.step * 0.1, gpu=g, nvlink_tx_bytes_per_s=rate, nvlink_rx_bytes_per_s=rate,
                          pcie_tx_bytes_per_s=1e9, pcie_rx_bytes_per_s=1e9, sm_util_pct=60, power_w=500,
                          memory_used_bytes=40e9, temperature_c=60, sm_clock_mhz=1980, mem_clock_mhz=3201,
                          links=[LinkSample(link, rate / self.links, rate / self.links) for link in range(self.links)])
                for g in range(self.gpus)
            ] + [GpuSample(ts=self.step * 0.1, gpu=-1, cpu_pct=30.0)])


async def bench_monitor(repeat: int) -> None:
    from textual.geometry import Region

    from pkb_tui.app import AppConfig, PkbApp
    from pkb_tui.app.catalog import Catalog
    from pkb_tui.app.screens.monitor import MonitorScreen
    from pkb_tui.app.widgets.gpu_history import WINDOWS_S, RateHistory
    from pkb_tui.app.widgets.monitor_views import LinesView

    for size in ((200, 50), (80, 24)):
        # The ring fills after the app has started (and frozen its start-up objects), as it does
        # in use: its samples stay in the collector's full passes.
        telemetry = _MonitorTelemetry(RingBuffer(), 8, 18)
        with tempfile.TemporaryDirectory() as tmp:
            app = PkbApp(config=AppConfig(db_path=Path(tmp) / "runs.db", catalog=Catalog, telemetry=lambda db, t=telemetry: t,
                                          live_refresh_s=3600, freeze_startup=True))  # frames driven by hand below
            async with app.run_test(size=size) as pilot:
                await pilot.pause()
                telemetry.grow(telemetry.ring.capacity // 9)  # 8 GPUs and the host row per tick: a full ring
                await pilot.press("m")
                await app.workers.wait_for_complete()
                await pilot.pause()
                screen = app.screen
                assert isinstance(screen, MonitorScreen)
                screen.tick()
                await app.workers.wait_for_complete()
                views = list(screen.query(LinesView))
                assert screen.source() is telemetry, screen.problem

                def frame() -> None:
                    telemetry.grow(3 if screen._ticks % 2 else 2)  # 10 Hz sampling between 4 Hz frames
                    screen.tick()
                    for view in views:  # what the compositor asks of each view: its lines as strips
                        view.render_lines(Region(0, 0, view.size.width, len(view.lines)))

                frame()  # the first layout sizes the history: its refill runs in a worker, awaited here
                await app.workers.wait_for_complete()
                await pilot.pause()
                tick = Clock()
                for _ in range(repeat * 20):
                    with tick:
                        frame()
                switch, fold = Clock(), Clock()
                for index in (2, 0) * repeat:  # 10 min (the whole ring), then back to 10 s
                    with switch:
                        screen.action_window(index)
                    await app.workers.wait_for_complete()
                    with fold:  # what the refill worker does off the app's thread
                        RateHistory(WINDOWS_S[index], screen.graph_width).feed(
                            telemetry.ring.snapshot(since_ts=telemetry.step * 0.1 - WINDOWS_S[index]))
                lines = sum(len(v.lines) for v in views)
                full = Clock()  # the app runs it between frames (PkbApp._freeze_startup), not in them
                for _ in range(3):
                    with full:
                        gc.collect()
        print(f"Monitor frame at {size[0]}x{size[1]}, 8 GPUs x 18 links, ring at capacity ({len(telemetry.ring):,} samples), "
              f"{lines} lines:")
        print(f"  one 4 Hz frame (fold new samples, build every view, render its strips):\n      {tick.report()}")
        print(f"  window key on the app's thread (the history refill then runs in a worker):\n      {switch.report()}")
        print(f"  the worker's refill (10 min: the whole ring; 10 s):\n      {fold.report()}")
        print(f"  Python's full collection, which the dashboard runs right after a refresh every 30 s:\n      {full.report()}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=10_000)
    parser.add_argument("--samples", type=int, default=1_000_000)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--db", type=Path, default=None, help="where to keep the bench database (default: a temp dir)")
    parser.add_argument("--only", choices=["history", "live", "monitor"], help="run one of the benchmarks")
    args = parser.parse_args()
    if args.only == "monitor":
        asyncio.run(bench_monitor(args.repeat))
        return
    if args.only == "live":
        asyncio.run(bench_live(args.repeat))
        return
    db = args.db or Path(tempfile.gettempdir()) / f"pkb-bench-{args.runs}-{args.samples}.db"
    if not db.exists():
        print(f"Building {db} ...", flush=True)
        build_db(db, args.runs, args.samples)
    with Store(db) as store:
        print(f"Database {db}: {store.count_runs():,} runs")
    asyncio.run(bench_history(db, args.repeat))
    if args.only is None:
        asyncio.run(bench_live(args.repeat))
        asyncio.run(bench_monitor(args.repeat))


if __name__ == "__main__":
    main()
