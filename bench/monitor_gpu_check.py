"""GPU check of the Monitor, Live and the Prometheus exporter on real NVML (run on a GPU box):

  1. reads topology (remote PCI bus ids, remote device type, NVLink version), limits and processes
     through collectors.nvml and prints them, with the figures NVML leaves n/a and why;
  2. records a replay trace with those constants (collectors.replay.record_trace) into --out, so a
     test fixture can be made from a multi-GPU box (tests/fixtures/nvml_trace_*_recorded.json);
  3. serves the metrics on 127.0.0.1 and scrapes them once (prometheus-client's parser);
  4. saves SVG screenshots of Monitor (and Live while a tiny batch runs on this box, unless
     --no-run) through Textual's headless driver, at 160x46 and 200x50.

    python bench/monitor_gpu_check.py --out /tmp/monitor-check [--no-run]

Prints what it did; the SVGs and the trace land in --out.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from collectors import nvml as N  # noqa: E402
from collectors.replay import record_trace  # noqa: E402
from collectors.telemetry import Telemetry  # noqa: E402


def facts(out: Path) -> None:
    sampler = N.NvmlSampler()
    if not sampler.available():
        print(f"no NVML here: {sampler.reason}")
        return
    try:
        sampler.sample()
        time.sleep(0.2)
        sampler.sample()
        topology = N.read_topology(sampler)
        print(f"topology: {len(topology.links)} active links; reason: {topology.reason}")
        for a in topology.gpus:
            print(f"  GPU{a}: " + " ".join(topology.pair_label(a, b).rjust(5) for b in topology.gpus)
                  + f"   gen {topology.generation(a)}  limit {topology.gpu_bytes_per_s(a)}")
        for gpu, limits in N.read_limits(sampler).items():
            print(f"  limits {limits}")
        processes = N.read_processes(sampler)
        print(f"processes: {processes}")
        print(f"n/a figures: {json.dumps(N.unsupported_figures(sampler), indent=1)}")
    finally:
        sampler.close()
    trace = record_trace(ticks=20, interval_s=0.1, source="bench/monitor_gpu_check.py")
    path = out / "nvml_trace_recorded.json"
    path.write_text(json.dumps(trace, indent=1) + "\n")
    print(f"trace recorded: {path}")


def scrape() -> None:
    from prometheus_client.parser import text_string_to_metric_families

    from collectors.prometheus import serve

    telemetry = Telemetry(None, interval_s=0.1, record=False).start()
    exporter = serve("127.0.0.1:0", lambda: telemetry)
    try:
        time.sleep(1.0)
        with urllib.request.urlopen(exporter.url, timeout=10) as response:
            text = response.read().decode()
        families = {f.name: f.samples for f in text_string_to_metric_families(text)}
        for name in ("DCGM_FI_DEV_GPU_UTIL", "DCGM_FI_DEV_POWER_USAGE", "DCGM_FI_PROF_PCIE_RX_BYTES",
                     "DCGM_FI_PROF_NVLINK_TX_BYTES", "pkb_nvlink_link_tx_bytes"):
            print(f"  {name}: {[(s.labels.get('gpu'), s.labels.get('link'), round(s.value, 1)) for s in families.get(name, [])][:8]}")
    finally:
        exporter.close()
        telemetry.stop()


async def screenshots(out: Path, run: bool) -> None:
    from pkb_tui.app import AppConfig, PkbApp
    from pkb_tui.engine.request import RunRequest

    db = out / "runs.db"
    for size in ((160, 46), (200, 50)):
        app = PkbApp(config=AppConfig(db_path=db, runs_dir=out / "runs"))
        async with app.run_test(size=size) as pilot:
            await pilot.press("m")
            await app.workers.wait_for_complete()
            await pilot.pause(3.0)  # a few seconds of history
            app.save_screenshot(str(out / f"monitor-{size[0]}x{size[1]}.svg"))
            await pilot.press("n")
            await pilot.pause(0.5)
            app.save_screenshot(str(out / f"monitor-nvlink-{size[0]}x{size[1]}.svg"))
            if run:
                app.launch(RunRequest(tasks=["all_reduce"], models=["torch-p2p"], world_size=2, size="small", trials=3))
                await pilot.pause(15.0)
                app.save_screenshot(str(out / f"live-{size[0]}x{size[1]}.svg"))
                while app.batch.busy:
                    await pilot.pause(1.0)
        print(f"screenshots at {size[0]}x{size[1]} in {out}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=Path("/tmp/monitor-check"))
    parser.add_argument("--no-run", action="store_true", help="no batch (no Live screenshot)")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    print("== 1-2. topology, limits, processes, n/a reasons; a recorded trace")
    facts(args.out)
    print("== 3. Prometheus scrape on 127.0.0.1")
    scrape()
    print("== 4. screenshots")
    asyncio.run(screenshots(args.out, not args.no_run))


if __name__ == "__main__":
    main()
