"""What the telemetry costs: per-sample cost, CPU share, sink throughput, effect on a measured kernel.

    python bench/collector_overhead.py [--seconds 3] [--rows 200000] [--rounds 5] [--json PATH]

Prints, for the sampler this machine gets (NVML where there are NVIDIA GPUs, else the host sampler):
1. the cost of one sample per GPU (host mode: of the host row), in microseconds;
2. the CPU share of one core that the telemetry thread (sampling + SQLite sink) takes at 10 Hz and
   100 Hz, from the process's CPU time while the main thread sleeps;
3. the sink's batched throughput in rows per second (sample rows, and link rows at 18 links);
4. the change of a measured kernel time with the collector on vs off, in percent: a CUDA kernel
   (device copy) timed with CUDA events on a GPU, a CPU matmul timed with perf_counter elsewhere;
   the collector runs in its own process (as the launcher runs it beside the ranks), recording;
   off / 10 Hz / 100 Hz interleaved over several rounds, medians compared.
Every part runs on its own: a failing part prints one line and the rest go on.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
import _parts  # noqa: E402  (bench/, on sys.path as the script's folder)

from collectors.sample import GpuSample, LinkSample  # noqa: E402
from collectors.sink import SampleSink  # noqa: E402
from collectors.telemetry import Telemetry  # noqa: E402

results: dict[str, object] = {}
_failures = results  # a failed part is reported in the summary too


def part(name: str):
    return _parts.part(name, _failures, "--- {name}", key="{name}_error")


@part("sample cost")
def sample_cost(tmp: Path) -> None:
    telemetry = Telemetry(None, record=False)
    try:
        results["source"] = telemetry.source
        results["reason"] = telemetry.reason
        sampler = telemetry.gpu or telemetry.host
        gpus = max(1, len(telemetry.gpu.gpus)) if telemetry.gpu is not None else 1
        results["gpus"] = len(telemetry.gpu.gpus) if telemetry.gpu is not None else 0
        print(f"    source {telemetry.source}; GPUs {results['gpus']}; {telemetry.reason or ''}")
        for _ in range(5):
            sampler.sample()
        costs = []
        for _ in range(200):
            t0 = time.perf_counter()
            sampler.sample()
            costs.append((time.perf_counter() - t0) * 1e6)
            time.sleep(0.002)
        median = statistics.median(costs)
        results["sample_us_per_gpu"] = median / gpus
        results["sample_us_all"] = median
        print(f"    one sample: {median:.0f} us for all, {median / gpus:.0f} us per GPU (median of 200; p90 "
              f"{sorted(costs)[179]:.0f} us)")
        if telemetry.gpu is not None:
            gpu = telemetry.gpu.gpus[0]
            for label, fn in (
                ("NVLink+PCIe counter fields", lambda: gpu.read_counters()),
                ("NVLink counter fields only", lambda: gpu.read_counters(include_pcie=False)),
                ("gauges (util, memory, power, clocks, temp)", gpu.gauges),
            ):
                t = []
                for _ in range(100):
                    t0 = time.perf_counter()
                    fn()
                    t.append((time.perf_counter() - t0) * 1e6)
                results[f"cost_us:{label}"] = statistics.median(t)
                print(f"    {label}: {statistics.median(t):.0f} us")
    finally:
        telemetry.stop()


@part("CPU share")
def cpu_share(tmp: Path, seconds: float) -> None:
    for hz in (10, 100):
        telemetry = Telemetry(tmp / f"share{hz}.db", interval_s=1.0 / hz, record=True)
        telemetry.start()
        time.sleep(0.3)  # past the first samples and the sink's first transaction
        cpu0, wall0, n0 = time.process_time(), time.perf_counter(), telemetry.samples_taken
        time.sleep(seconds)
        cpu1, wall1, n1 = time.process_time(), time.perf_counter(), telemetry.samples_taken
        telemetry.stop()
        share = 100.0 * (cpu1 - cpu0) / (wall1 - wall0)
        rate = (n1 - n0) / (wall1 - wall0)
        results[f"cpu_pct_of_core_at_{hz}hz"] = share
        results[f"achieved_hz_at_{hz}hz"] = rate
        print(f"    {hz:3d} Hz: {share:.2f} % of one core (sampled at {rate:.1f} Hz, mean sample "
              f"{telemetry.mean_sample_cost_us or 0:.0f} us)")


@part("sink throughput")
def sink_throughput(tmp: Path, rows: int) -> None:
    """Rows per second through SampleSink into a fresh SQLite file: a run's sample rows, monitor
    rows (no run: `pkb-tui monitor` for weeks), and samples carrying 18 link rows each."""
    columns = dict(nvlink_tx_bytes_per_s=1.2e11, nvlink_rx_bytes_per_s=1.1e11, pcie_tx_bytes_per_s=2e8,
                   pcie_rx_bytes_per_s=3e8, sm_util_pct=71.0, mem_util_pct=40.0, dram_bw_util_pct=43.0,
                   tensor_active_pct=12.0, power_w=512.0, sm_clock_mhz=1980.0, mem_clock_mhz=2619.0,
                   temperature_c=48.0, memory_used_bytes=6e10)

    def through_sink(name: str, samples: list[GpuSample], per_put: int) -> tuple[float, float]:
        with SampleSink(tmp / f"{name}.db", batch_rows=20_000) as sink:
            t0, c0 = time.perf_counter(), time.process_time()
            for k in range(0, len(samples), per_put):
                sink.put(samples[k:k + per_put])
            sink.flush(timeout_s=None)
            return time.perf_counter() - t0, time.process_time() - c0

    # Rows per CPU-second too: on a shared, loaded machine the wall-clock figure measures the neighbours.
    for key, label, run_id in (("sink_rows_per_s", "sample rows of a run", 1),
                               ("sink_rows_per_s_monitor", "monitor sample rows (no run)", None)):
        plain = [GpuSample(ts=1e9 + i * 1e-3, gpu=i % 8, run_id=run_id, **columns) for i in range(rows)]
        elapsed, cpu = through_sink(key, plain, 1000)
        results[key] = rows / elapsed
        results[key.replace("_per_s", "_per_cpu_s")] = rows / cpu
        print(f"    {rows} {label} in {elapsed:.2f} s: {rows / elapsed:,.0f} rows/s ({rows / cpu:,.0f} per CPU-second)")
    linked_rows = rows // 19
    linked = [GpuSample(ts=2e9 + i * 1e-3, gpu=i % 8, run_id=1, **columns,
                        links=[LinkSample(l, 2.5e10, 2.4e10) for l in range(18)]) for i in range(linked_rows)]
    elapsed, cpu = through_sink("sink_links", linked, 100)
    total = linked_rows * 19
    results["sink_rows_per_s_with_links"] = total / elapsed
    results["sink_rows_per_cpu_s_with_links"] = total / cpu
    print(f"    {linked_rows} samples with 18 links each ({total} rows) in {elapsed:.2f} s: {total / elapsed:,.0f} rows/s "
          f"({total / cpu:,.0f} per CPU-second)")


def _kernel_timer():
    """(label, fn timing one batch -> us per iteration, batches per window)."""
    import torch

    if torch.cuda.is_available():
        device = torch.device("cuda", 0)
        src = torch.empty(256 * 2**20 // 4, dtype=torch.float32, device=device).normal_()
        dst = torch.empty_like(src)
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)

        def run(iterations: int = 50) -> float:
            dst.copy_(src)
            start.record()
            for _ in range(iterations):
                dst.copy_(src)
            end.record()
            end.synchronize()
            return start.elapsed_time(end) * 1000.0 / iterations

        return "CUDA device copy 256 MiB (CUDA events)", run, 20
    torch.set_num_threads(1)  # one core, so the sampler thread's share shows rather than thread contention
    a = torch.randn(256, 256)
    b = torch.randn(256, 256)

    def run(iterations: int = 10) -> float:
        t0 = time.perf_counter()
        for _ in range(iterations):
            torch.mm(a, b)
        return (time.perf_counter() - t0) * 1e6 / iterations

    return "CPU matmul 256x256, 1 thread (perf_counter)", run, 10


_COLLECTOR_CHILD = (
    "import sys\n"
    "from collectors.telemetry import Telemetry\n"
    "t = Telemetry(sys.argv[1], interval_s=float(sys.argv[2]), record=True)\n"
    "t.start()\n"
    "print('ready', flush=True)\n"
    "sys.stdin.read()\n"
    "t.stop()\n"
)


class _Collector:
    """Telemetry in its own process, as the launcher runs it beside the ranks."""

    def __init__(self, db: Path, interval_s: float) -> None:
        import os
        import subprocess

        env = {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
        self.proc = subprocess.Popen([sys.executable, "-c", _COLLECTOR_CHILD, str(db), str(interval_s)],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env)
        if self.proc.stdout.readline().strip() != "ready":
            raise RuntimeError("the collector process did not start")
        time.sleep(0.2)  # past its first samples

    def stop(self) -> None:
        self.proc.stdin.close()
        self.proc.wait(timeout=60)


@part("kernel time with the collector on vs off")
def kernel_effect(tmp: Path, rounds: int) -> None:
    label, run, batches = _kernel_timer()
    for _ in range(5):
        run()
    configs = {"off": None, "10 Hz": 0.1, "100 Hz": 0.01}
    times: dict[str, list[float]] = {k: [] for k in configs}
    for _ in range(rounds):
        for name, interval in configs.items():
            collector = _Collector(tmp / "effect.db", interval) if interval else None
            try:
                times[name] += [run() for _ in range(batches)]
            finally:
                if collector is not None:
                    collector.stop()
    off = statistics.median(times["off"])
    print(f"    {label}: off {off:.1f} us per iteration (median of {len(times['off'])} batches);"
          f" collector in its own process, recording")
    for name in ("10 Hz", "100 Hz"):
        on = statistics.median(times[name])
        change = 100.0 * (on - off) / off
        results[f"kernel_change_pct_at_{name.replace(' ', '').lower()}"] = change
        print(f"    {name}: {on:.1f} us per iteration, change {change:+.2f} %")
    results["kernel"] = label


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=3.0, help="CPU share window per rate")
    parser.add_argument("--rows", type=int, default=200_000, help="rows for the sink throughput")
    parser.add_argument("--rounds", type=int, default=5, help="interleaved off/10 Hz/100 Hz rounds")
    parser.add_argument("--json", default=None, help="also write the figures to this file")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as name:
        tmp = Path(name)
        sample_cost(tmp)
        cpu_share(tmp, args.seconds)
        sink_throughput(tmp, args.rows)
        kernel_effect(tmp, args.rounds)
    print("=== collector overhead summary")
    for key in ("source", "gpus", "sample_us_per_gpu", "cpu_pct_of_core_at_10hz", "cpu_pct_of_core_at_100hz",
                "sink_rows_per_s", "sink_rows_per_cpu_s", "sink_rows_per_s_monitor", "sink_rows_per_cpu_s_monitor",
                "sink_rows_per_s_with_links", "sink_rows_per_cpu_s_with_links", "kernel", "kernel_change_pct_at_10hz",
                "kernel_change_pct_at_100hz"):
        value = results.get(key)
        print(f"  {key:32s} {value:,.2f}" if isinstance(value, float) else f"  {key:32s} {value}")
    errors = [k for k in results if k.endswith("_error")]
    if errors:
        print(f"  failed parts: {', '.join(e[:-6] for e in errors)}")
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
