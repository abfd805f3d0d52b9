"""The collectors on a real GPU box: what NVML answers, what the sampler sees, what the profiler lists.

    python bench/gpu_collectors_check.py [--out DIR] [--seconds 1.5]

Parts (each on its own: a failing part prints one FAILED line and the rest go on; < 2 minutes):
 0. the box: GPUs, driver, torch, nvidia-ml-py;
 1. what NVML answers for NVLink (link count, link states, fields 138/139 at scope 0 / per link /
    all links), PCIe counters (197/198) and GPM, on every GPU (the first 4);
 2. cost per call in microseconds: one field, the NVLink batch, the PCIe counters, the gauges, a
    GPM sample, one NvmlSampler sample per GPU, PhaseCounters start+stop;
 3. a device-to-device copy of known size: the sampler's figures meanwhile (PCIe, GPM DRAM/SM) and
    PhaseCounters' bytes over the phase;
 4. host-to-device copies of known size (pinned): PCIe RX counted by the 32-bit counters (short
    phase; long phase read in steps by tick()) and by GPM (long phase, no tick) against the bytes
    really copied;
 4b. GPM's PCIe rate between samples 20 ms - 1 s apart under a steady H2D load against the
    counters' bytes over the same spans, and after a burst: when GPM over a phase can be trusted;
 5. GPU 0 -> GPU 1 peer copies of known size where there are two GPUs: NVLink bytes per link;
 6. a 1-rank NCCL all-reduce (torch.distributed, FileStore, world size 1) with a CuPy RawKernel
    standing in for a candidate: the sampler meanwhile, and the per-kernel table of profile_kernels;
 7. a short NVML recording in the replay format (collectors/replay.py) written to --out, so a test
    fixture can be a real recording.
Ends with a compact summary. Writes collectors_check.json (and the recording) to --out ($OUT).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

os.environ.setdefault("NCCL_NVLS_ENABLE", "0")  # never NVLink multicast
os.environ.setdefault("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1")
ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
import _parts  # noqa: E402  (bench/, on sys.path as the script's folder)

from collectors import nvml as N  # noqa: E402

summary: dict[str, object] = {}
_failures = summary  # a failed part is reported in the summary too
GiB = 2**30


def part(name: str):
    return _parts.part(name, _failures, "\n=== {name}", key="FAILED {name}")


def gbps(value: float | None) -> str:
    return "n/a" if value is None else f"{value / 1e9:.2f} GB/s"


def gib(value: float | None) -> str:
    return "n/a" if value is None else f"{value / GiB:.3f} GiB"


def timed_us(fn, reps: int = 50) -> float:
    fn()
    costs = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        costs.append((time.perf_counter() - t0) * 1e6)
    return statistics.median(costs)


class Load:
    """Repeats ``step`` in a background thread until stopped; counts the bytes it reports."""

    def __init__(self, step) -> None:
        self.step = step
        self.bytes = 0
        self.stop_event = threading.Event()
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        try:
            while not self.stop_event.is_set():
                self.bytes += self.step()
        except BaseException as exc:  # surfaces in __exit__, in the part that used the load
            self.error = exc

    def __enter__(self) -> "Load":
        self.started = time.perf_counter()
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop_event.set()
        self.thread.join()
        self.elapsed_s = time.perf_counter() - self.started
        if self.error is not None:
            raise RuntimeError(f"the background load failed: {type(self.error).__name__}: {self.error}")


def observe(seconds: float, interval_s: float = 0.1) -> list:
    """Run the real Telemetry for ``seconds`` and return its samples (the first second's rates need a baseline)."""
    from collectors.telemetry import Telemetry

    telemetry = Telemetry(None, interval_s=interval_s, record=False)
    telemetry.start()
    time.sleep(seconds)
    telemetry.stop()
    return telemetry.ring.snapshot()


def mean_of(samples: list, gpu: int, column: str, skip: int = 3) -> float | None:
    values = [getattr(s, column) for s in samples if s.gpu == gpu][skip:]
    values = [v for v in values if v is not None]
    return statistics.fmean(values) if values else None


def show_samples(samples: list, gpus: list[int], label: str) -> None:
    for gpu in gpus:
        figures = {c: mean_of(samples, gpu, c) for c in (
            "nvlink_tx_bytes_per_s", "nvlink_rx_bytes_per_s", "pcie_tx_bytes_per_s", "pcie_rx_bytes_per_s",
            "sm_util_pct", "dram_bw_util_pct", "tensor_active_pct", "power_w")}
        print(f"    sampler, GPU {gpu}, {label}: NVLink tx {gbps(figures['nvlink_tx_bytes_per_s'])} rx "
              f"{gbps(figures['nvlink_rx_bytes_per_s'])}; PCIe tx {gbps(figures['pcie_tx_bytes_per_s'])} rx "
              f"{gbps(figures['pcie_rx_bytes_per_s'])}; SM {figures['sm_util_pct']} %; DRAM bw "
              f"{figures['dram_bw_util_pct']} %; tensor {figures['tensor_active_pct']} %; power {figures['power_w']} W")
        summary[f"sampler GPU {gpu} {label}"] = {k: v for k, v in figures.items() if v is not None}


# ------------------------------------------------------------------------------------ parts
@part("0. the box")
def the_box() -> None:
    import torch

    pynvml = N.load_nvml()
    pynvml.nvmlInit()
    try:
        driver = pynvml.nvmlSystemGetDriverVersion()
        names = [pynvml.nvmlDeviceGetName(pynvml.nvmlDeviceGetHandleByIndex(i)) for i in range(pynvml.nvmlDeviceGetCount())]
    finally:
        pynvml.nvmlShutdown()
    from importlib.metadata import version

    print(f"    driver {driver}; torch {torch.__version__} (CUDA {torch.version.cuda}); nvidia-ml-py {version('nvidia-ml-py')}")
    print(f"    GPUs: {names}")
    summary["box"] = {"driver": str(driver), "torch": torch.__version__, "gpus": [str(n) for n in names]}


@part("1. what NVML answers (NVLink, PCIe counters, GPM)")
def nvml_answers() -> None:
    pynvml = N.load_nvml()
    pynvml.nvmlInit()
    answers = {}
    try:
        for index in range(min(4, pynvml.nvmlDeviceGetCount())):
            handle = pynvml.nvmlDeviceGetHandleByIndex(index)

            def fields(requests):
                try:
                    entries = pynvml.nvmlDeviceGetFieldValues(handle, requests)
                except Exception as exc:
                    return {str(r): f"call failed: {exc}" for r in requests}
                out = {}
                for (fid, scope), e in zip(requests, entries):
                    key = f"{fid}@{'all' if scope == N.SCOPE_ALL_LINKS else scope}"
                    out[key] = N._field_value(e) if int(e.nvmlReturn) == 0 else f"nvmlReturn {int(e.nvmlReturn)}"
                return out

            count = fields([(N.FI_NVLINK_LINK_COUNT, 0)])
            known = next(iter(count.values()))
            states = {}
            for link in range(known if isinstance(known, int) else 18):
                try:
                    states[link] = pynvml.nvmlDeviceGetNvLinkState(handle, link)
                except Exception as exc:
                    states[link] = f"{type(exc).__name__}"
                    if getattr(exc, "value", None) == N.NVML_ERROR_NOT_SUPPORTED:
                        break
            active = [l for l, s in states.items() if s == 1]
            scopes = [(f, 0) for f in (N.FI_NVLINK_DATA_TX_KIB, N.FI_NVLINK_DATA_RX_KIB)]
            scopes += [(f, N.SCOPE_ALL_LINKS) for f in (N.FI_NVLINK_DATA_TX_KIB, N.FI_NVLINK_DATA_RX_KIB)]
            scopes += [(f, l) for l in active[:4] for f in (N.FI_NVLINK_DATA_TX_KIB, N.FI_NVLINK_DATA_RX_KIB)]
            nvlink = fields(scopes)
            pcie = fields([(N.FI_PCIE_TX_BYTES, 0), (N.FI_PCIE_RX_BYTES, 0)])
            gpm = N.Gpm.supported(pynvml, handle)
            answers[index] = {"link_count": count, "link_states": states, "nvlink_fields": nvlink, "pcie_fields": pcie,
                              "gpm_supported": gpm}
            print(f"    GPU {index}: link count {count}; link states {states}")
            print(f"    GPU {index}: NVLink fields {nvlink}")
            print(f"    GPU {index}: PCIe fields {pcie}; GPM supported {gpm}")
    finally:
        pynvml.nvmlShutdown()
    summary["nvml answers"] = answers


@part("2. cost per call (us)")
def costs() -> None:
    from collectors.counters import PhaseCounters
    from collectors.nvml import NvmlSampler

    pynvml = N.load_nvml()
    pynvml.nvmlInit()
    try:
        handle = pynvml.nvmlDeviceGetHandleByIndex(0)
        figures = {
            "one field (NVLink TX, all links)": timed_us(lambda: pynvml.nvmlDeviceGetFieldValues(handle, [(138, N.SCOPE_ALL_LINKS)])),
            "36 fields (TX/RX, 18 links by scope)": timed_us(lambda: pynvml.nvmlDeviceGetFieldValues(
                handle, [(f, l) for l in range(18) for f in (138, 139)])),
            "PCIe counters (197/198)": timed_us(lambda: pynvml.nvmlDeviceGetFieldValues(handle, [(197, 0), (198, 0)]), reps=20),
        }
        if N.Gpm.supported(pynvml, handle):
            buffer = pynvml.nvmlGpmSampleAlloc()
            figures["GPM sample"] = timed_us(lambda: pynvml.nvmlGpmSampleGet(handle, buffer))
            pynvml.nvmlGpmSampleFree(buffer)
    finally:
        pynvml.nvmlShutdown()
    for pcie in (None, True):
        sampler = NvmlSampler(pcie_counters=pcie)
        gpus = len(sampler.gpus)
        figures["gauges (util, memory, power, clocks, temperature)"] = timed_us(sampler.gpus[0].gauges)
        label = "auto: GPM for PCIe where present" if pcie is None else "PCIe counters forced"
        figures[f"NvmlSampler.sample() per GPU ({label})"] = timed_us(sampler.sample, reps=30) / gpus
        sampler.close()
    counters = PhaseCounters(0)

    def start_stop() -> None:
        counters.start()
        counters.stop(1)

    figures["PhaseCounters start + stop"] = timed_us(start_stop, reps=20)
    for label, value in figures.items():
        print(f"    {label}: {value:.0f} us")
    summary["cost_us"] = figures


@part("3. device-to-device copy")
def device_copy(seconds: float) -> None:
    import torch

    from collectors.counters import PhaseCounters

    src = torch.empty(GiB // 4, dtype=torch.float32, device="cuda:0").normal_()
    dst = torch.empty_like(src)

    def step() -> int:
        dst.copy_(src)
        torch.cuda.synchronize(0)
        return GiB

    with Load(step) as load:
        samples = observe(seconds)
    print(f"    copied {load.bytes / GiB:.0f} GiB in {load.elapsed_s:.2f} s: {load.bytes / load.elapsed_s / 1e9:.0f} GB/s "
          "(read+write = twice that in DRAM traffic)")
    show_samples(samples, [0], "D2D copy")
    counters = PhaseCounters(0)
    counters.start()
    for _ in range(8):
        dst.copy_(src)
    torch.cuda.synchronize(0)
    out = counters.stop(8)
    print(f"    PhaseCounters over 8 x 1 GiB D2D: NVLink {gib(out['nvlink_bytes'])} PCIe tx {gib(out['pcie_tx_bytes'])} "
          f"rx {gib(out['pcie_rx_bytes'])} ({out['pcie_source']}, {out['elapsed_s']:.3f} s); {out['reason'] or ''}")
    summary["D2D phase"] = {k: out[k] for k in ("nvlink_bytes", "pcie_tx_bytes", "pcie_rx_bytes", "pcie_source", "elapsed_s")}


@part("4. host-to-device copies (PCIe counters vs GPM vs known bytes)")
def host_copy(seconds: float) -> None:
    import torch

    from collectors.counters import PhaseCounters

    host = torch.empty(GiB // 4, dtype=torch.float32, pin_memory=True)
    dev = torch.empty(GiB // 4, dtype=torch.float32, device="cuda:0")
    dev.copy_(host)
    torch.cuda.synchronize(0)
    counters = PhaseCounters(0)
    results = {}
    # short: one read pair; stepped: 6 x 1 GiB with tick() after each copy, as the timing loop
    # ticks between iterations; unstepped: the same with no tick, so past one wrap -> GPM's rates.
    for label, chunk, repeats, stepped in (("short: 1 x 256 MiB", GiB // 16, 1, False),
                                           ("long, ticked: 6 x 1 GiB", GiB // 4, 6, True),
                                           ("long, no tick: 6 x 1 GiB", GiB // 4, 6, False)):
        part_host = host[:chunk]
        part_dev = dev[:chunk]
        counters.start()
        for _ in range(repeats):
            part_dev.copy_(part_host, non_blocking=True)
            if stepped:
                torch.cuda.synchronize(0)
                counters.tick()
        torch.cuda.synchronize(0)
        out = counters.stop(repeats)
        known = chunk * 4 * repeats
        ratio = out["pcie_rx_bytes"] / known if out["pcie_rx_bytes"] is not None else None
        print(f"    {label}: copied {gib(known)} in {out['elapsed_s'] * 1e3:.1f} ms; PCIe RX counted {gib(out['pcie_rx_bytes'])} "
              f"via {out['pcie_source']} (ratio {ratio if ratio is None else round(ratio, 3)}); TX {gib(out['pcie_tx_bytes'])}"
              f"{'; ' + out['reason'] if out['pcie_source'] is None and out['reason'] else ''}")
        results[label] = {"known_bytes": known, "pcie_rx_bytes": out["pcie_rx_bytes"], "source": out["pcie_source"],
                          "elapsed_s": out["elapsed_s"], "ratio": ratio}

    def step() -> int:
        dev.copy_(host, non_blocking=True)
        torch.cuda.synchronize(0)
        return GiB

    with Load(step) as load:
        samples = observe(seconds)
    print(f"    H2D load: {load.bytes / load.elapsed_s / 1e9:.1f} GB/s really copied")
    show_samples(samples, [0], "H2D copy")
    results["copied_bytes_per_s"] = load.bytes / load.elapsed_s
    summary["H2D"] = results


@part("4b. GPM's PCIe rates against the PCIe counters, by interval length")
def gpm_probe(seconds: float) -> None:
    """Why GPM over a phase read ~0: every 10 ms one GPM sample and one PCIe counter reading under a
    steady H2D load; then GPM's rate between samples k ms apart against the counters' bytes."""
    import torch

    pynvml = N.load_nvml()
    pynvml.nvmlInit()
    handle = pynvml.nvmlDeviceGetHandleByIndex(0)
    if not N.Gpm.supported(pynvml, handle):
        print("    GPM not supported: skipped")
        return
    gpm = N.Gpm(pynvml, handle, clock=time.monotonic)
    host = torch.empty(GiB // 4, dtype=torch.float32, pin_memory=True)
    dev = torch.empty(GiB // 4, dtype=torch.float32, device="cuda:0")

    def counters() -> tuple[int, int]:
        entries = pynvml.nvmlDeviceGetFieldValues(handle, [(N.FI_PCIE_TX_BYTES, 0), (N.FI_PCIE_RX_BYTES, 0)])
        return int(N._field_value(entries[0])), int(N._field_value(entries[1]))

    def step() -> int:
        dev.copy_(host, non_blocking=True)
        torch.cuda.synchronize(0)
        return GiB

    readings = []  # (t, buffer, rx counter)
    buffers = [gpm.new_buffer() for _ in range(int(seconds / 0.01) + 5)]
    with Load(step):
        time.sleep(0.2)
        for buffer in buffers:
            t = time.monotonic()
            pynvml.nvmlGpmSampleGet(handle, buffer)
            readings.append((t, buffer, counters()[1]))
            time.sleep(0.01)
    rx_steps = [0] + [(readings[i + 1][2] - readings[i][2]) % N.PCIE_COUNTER_MODULUS for i in range(len(readings) - 1)]
    rx_cumulative = [sum(rx_steps[: i + 1]) for i in range(len(rx_steps))]
    rows = {}
    for gap_ms in (20, 50, 100, 120, 200, 500, 1000):
        ratios = []
        for i in range(len(readings)):
            j = next((j for j in range(i + 1, len(readings)) if readings[j][0] - readings[i][0] >= gap_ms / 1e3), None)
            if j is None:
                break
            try:
                values = gpm.metrics_between(readings[i][1], readings[j][1])
            except Exception as exc:  # noqa: BLE001 - the answer itself is the finding
                ratios.append(f"{type(exc).__name__}")
                continue
            counted = rx_cumulative[j] - rx_cumulative[i]
            gpm_bytes = (values.pcie_rx_bytes_per_s or 0.0) * (readings[j][0] - readings[i][0])
            ratios.append(gpm_bytes / counted if counted else None)
            if len(ratios) >= 12:
                break
        numeric = [r for r in ratios if isinstance(r, float)]
        rows[gap_ms] = {"ratios": [round(r, 3) if isinstance(r, float) else r for r in ratios],
                        "median": statistics.median(numeric) if numeric else None}
        print(f"    GPM/counters over {gap_ms:>4} ms: median {rows[gap_ms]['median']}; {rows[gap_ms]['ratios']}")
    # A burst after an idle period: GPM sampled once before it, once d ms after it ends (a fresh
    # pair per d). Does GPM lag the traffic, and by how much? "primed": one extra sample 150 ms
    # before the start sample, in case the first sample after a quiet spell is stale.
    burst = {}
    extra = [gpm.new_buffer() for _ in range(3)]
    for primed in (False, True):
        for delay_ms in (0, 50, 100, 150, 200, 300, 500):
            torch.cuda.synchronize(0)
            time.sleep(0.4)
            if primed:
                pynvml.nvmlGpmSampleGet(handle, extra[2])
                time.sleep(0.15)
            pynvml.nvmlGpmSampleGet(handle, extra[0])
            t0 = time.monotonic()
            for _ in range(6):
                dev.copy_(host, non_blocking=True)
            torch.cuda.synchronize(0)
            t1 = time.monotonic()
            time.sleep(delay_ms / 1e3)
            pynvml.nvmlGpmSampleGet(handle, extra[1])
            span = time.monotonic() - t0
            values = gpm.metrics_between(extra[0], extra[1])
            got = (values.pcie_rx_bytes_per_s or 0.0) * span
            label = f"{'primed, ' if primed else ''}end sample {delay_ms} ms after the burst"
            burst[label] = {"gpm_bytes": got, "known": 6 * GiB, "ratio": got / (6 * GiB), "burst_ms": (t1 - t0) * 1e3,
                            "span_ms": span * 1e3, "rate_gbps": (values.pcie_rx_bytes_per_s or 0.0) / 1e9}
            print(f"    {label}: 6 GiB in {(t1 - t0) * 1e3:.0f} ms; GPM rate {(values.pcie_rx_bytes_per_s or 0) / 1e9:.1f} GB/s "
                  f"x {span * 1e3:.0f} ms = {gib(got)} (ratio {got / (6 * GiB):.3f})")
    summary["GPM probe"] = {"by_gap_ms": rows, "burst": burst}
    for buffer in buffers + extra:
        pynvml.nvmlGpmSampleFree(buffer)
    gpm.close()
    pynvml.nvmlShutdown()


@part("5. peer copies GPU 0 -> GPU 1 (NVLink)")
def peer_copy(seconds: float) -> None:
    import torch

    from collectors.counters import PhaseCounters

    if torch.cuda.device_count() < 2:
        print("    one GPU only: skipped (no NVLink peer to copy to)")
        summary["peer"] = "skipped: one GPU"
        return
    print(f"    peer access 0->1: {torch.cuda.can_device_access_peer(0, 1)}")
    src = torch.empty(GiB // 4, dtype=torch.float32, device="cuda:0").normal_()
    dst = torch.empty(GiB // 4, dtype=torch.float32, device="cuda:1")
    dst.copy_(src)
    torch.cuda.synchronize(0)
    torch.cuda.synchronize(1)
    c0, c1 = PhaseCounters(0), PhaseCounters(1)
    c0.start()
    c1.start()
    for _ in range(4):
        dst.copy_(src)
    torch.cuda.synchronize(0)
    torch.cuda.synchronize(1)
    o0, o1 = c0.stop(4), c1.stop(4)
    known = 4 * GiB
    print(f"    4 x 1 GiB: GPU 0 NVLink tx {gib(o0['nvlink_tx_bytes'])} rx {gib(o0['nvlink_rx_bytes'])}; GPU 1 NVLink tx "
          f"{gib(o1['nvlink_tx_bytes'])} rx {gib(o1['nvlink_rx_bytes'])}; known {gib(known)}")
    print(f"    GPU 0 per link (tx+rx): { {l: gib(b) for l, b in o0['links'].items()} }")

    def step() -> int:
        dst.copy_(src)
        torch.cuda.synchronize(1)
        return GiB

    with Load(step) as load:
        samples = observe(seconds)
    print(f"    peer load: {load.bytes / load.elapsed_s / 1e9:.1f} GB/s really copied")
    show_samples(samples, [0, 1], "peer copy")
    summary["peer"] = {"known_bytes": known, "gpu0_tx": o0["nvlink_tx_bytes"], "gpu1_rx": o1["nvlink_rx_bytes"],
                       "gpu0_links": o0["links"]}


@part("6. 1-rank NCCL all-reduce: sampler and per-kernel table")
def nccl_all_reduce(seconds: float, out_dir: Path) -> None:
    import torch
    import torch.distributed as dist

    from collectors.counters import PhaseCounters
    from collectors.profiler import profile_kernels

    torch.cuda.set_device(0)
    store_dir = tempfile.mkdtemp()
    dist.init_process_group("nccl", store=dist.FileStore(os.path.join(store_dir, "store"), 1), rank=0, world_size=1)
    try:
        x = torch.randn(64 * 2**20, device="cuda:0")  # 256 MiB
        gathered = torch.empty_like(x)
        candidate_kernel = None
        try:
            import cupy as cp

            kernel = cp.RawKernel(r'''
            extern "C" __global__ void one_shot_all_reduce_kernel(const float* x, float* y, long long n) {
                long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
                if (i < n) y[i] = x[i];
            }''', "one_shot_all_reduce_kernel")
            cx, cy = cp.asarray(x), cp.asarray(gathered)
            blocks = (x.numel() + 255) // 256

            def launch() -> None:
                with cp.cuda.ExternalStream(torch.cuda.current_stream().cuda_stream):
                    kernel((blocks,), (256,), (cx, cy, cp.int64(x.numel())))

            launch()  # compiles here, so a CuPy problem shows now and not inside the timed loops
            torch.cuda.synchronize(0)
            candidate_kernel = launch
        except Exception as exc:
            print(f"    CuPy candidate kernel unavailable ({type(exc).__name__}: {exc}); profiling torch/NCCL only")

        def step() -> None:
            dist.all_reduce(x)
            dist.all_gather_into_tensor(gathered, x)
            x.mul_(0.5)
            if candidate_kernel is not None:
                candidate_kernel()

        step()
        torch.cuda.synchronize(0)

        def load_step() -> int:
            for _ in range(10):
                step()
            torch.cuda.synchronize(0)
            return 10 * x.numel() * 4

        with Load(load_step):
            samples = observe(seconds)
        show_samples(samples, [0], "NCCL all-reduce loop")
        counters = PhaseCounters(0)
        counters.start()
        for _ in range(20):
            step()
        torch.cuda.synchronize(0)
        phase = counters.stop(20)
        print(f"    PhaseCounters over 20 steps: NVLink {gib(phase['nvlink_bytes'])} PCIe {gib(phase['pcie_bytes'])} "
              f"({phase['pcie_source']}); {phase['reason'] or ''}")
        trace = out_dir / "nccl_all_reduce.trace.json"
        rows = profile_kernels(step, iterations=3, device=torch.device("cuda", 0), trace_path=str(trace))
        print(f"    per-kernel table (3 steps; trace {trace}):")
        print(f"    {'category':13s} {'calls':>5s} {'total us':>10s} {'mean us':>9s} {'share':>6s}  name")
        for row in rows[:15]:
            share = row["share_fraction"]
            print(f"    {row['category']:13s} {row['calls']:5d} {row['total_us']:10.1f} {row['mean_us']:9.1f} "
                  f"{'' if share is None else f'{share:6.1%}'}  {row['name'][:110]}")
        summary["kernels"] = [{k: r[k] for k in ("name", "category", "calls", "total_us")} for r in rows[:15]]
    finally:
        dist.destroy_process_group()


@part("7. a short NVML recording for the test fixtures")
def record(out_dir: Path) -> None:
    import torch

    from collectors.replay import record_trace

    host = torch.empty(GiB // 8, dtype=torch.float32, pin_memory=True)
    dev = torch.empty(GiB // 8, dtype=torch.float32, device="cuda:0")

    def step() -> int:
        dev.copy_(host, non_blocking=True)
        torch.cuda.synchronize(0)
        return GiB // 2

    with Load(step):
        trace = record_trace(ticks=10, interval_s=0.1)
    path = out_dir / "nvml_trace_recorded.json"
    path.write_text(json.dumps(trace, indent=1))
    devices = trace["devices"]
    print(f"    {len(devices)} GPU(s), {len(devices[0]['ticks'])} ticks -> {path}")
    print(f"    unsupported fields per GPU: {[d['unsupported_fields'] for d in devices]}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=os.environ.get("OUT") or ".", help="where to write the JSON and the recording")
    parser.add_argument("--seconds", type=float, default=1.5, help="sampling window per load")
    args = parser.parse_args()
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    the_box()
    nvml_answers()
    costs()
    device_copy(args.seconds)
    host_copy(args.seconds)
    gpm_probe(args.seconds)
    peer_copy(args.seconds)
    nccl_all_reduce(args.seconds, out_dir)
    record(out_dir)
    (out_dir / "collectors_check.json").write_text(json.dumps(summary, indent=1, default=str))
    print(f"\n=== collectors check summary ({time.perf_counter() - started:.0f} s)")
    costs_us = summary.get("cost_us", {})
    for label in ("NvmlSampler.sample() per GPU (auto: GPM for PCIe where present)",
                  "NvmlSampler.sample() per GPU (PCIe counters forced)", "PhaseCounters start + stop"):
        if label in costs_us:
            print(f"  {label}: {costs_us[label]:.0f} us")
    answers = summary.get("nvml answers", {})
    if 0 in answers:
        print(f"  NVLink on GPU 0: count {answers[0]['link_count']}, fields {answers[0]['nvlink_fields']}")
        print(f"  GPM on GPU 0: {answers[0]['gpm_supported']}")
    for label, figures in summary.get("H2D", {}).items():
        if isinstance(figures, dict):
            print(f"  H2D {label}: counted/known {figures['ratio']} via {figures['source']}")
    probe = summary.get("GPM probe")
    if isinstance(probe, dict):
        print("  GPM/counters PCIe RX by span: " + ", ".join(
            f"{gap} ms {row['median'] if row['median'] is None else round(row['median'], 3)}" for gap, row in probe["by_gap_ms"].items()))
        for label, row in probe["burst"].items():
            print(f"  GPM {label}: ratio {row['ratio']:.3f}")
    for key in ("sampler GPU 0 D2D copy", "sampler GPU 0 H2D copy", "sampler GPU 0 NCCL all-reduce loop"):
        if key in summary:
            print(f"  {key}: " + ", ".join(f"{k}={v:.3g}" for k, v in summary[key].items()))
    if isinstance(summary.get("peer"), dict):
        peer = summary["peer"]
        print(f"  peer 4 GiB: GPU0 tx {gib(peer['gpu0_tx'])}, GPU1 rx {gib(peer['gpu1_rx'])}")
    for row in summary.get("kernels", [])[:6]:
        print(f"  kernel {row['category']:13s} {row['calls']:3d} {row['total_us']:9.1f} us  {row['name'][:70]}")
    failed = [k for k in summary if k.startswith("FAILED")]
    print(f"  failed parts: {failed or 'none'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
