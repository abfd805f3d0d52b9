"""Calibration: what this host's memory, links and NCCL actually deliver, measured and stored.

Kinds written to the calibrations table (bandwidth in GB/s = 1e9 bytes/s, one direction):
- device_copy: a large device-to-device copy on one GPU, counting bytes read + written (an H200
  moves ~4.3 TB/s so counted: its HBM's 4.8 TB/s datasheet figure is the same kind of number).
  The best GPU's figure; every GPU's in detail.
- host_copy: the same on host memory (the ceiling cpu-mode runs are judged against).
- peer_copy_engine (gpu_a -> gpu_b): cudaMemcpy between two GPUs (DMA engines, no SMs), bytes moved.
- peer_sm (gpu_a -> gpu_b): a kernel on gpu_b pulling gpu_a's memory with 16-byte loads.
- allreduce_busbw: an NCCL all-reduce sweep over message sizes at world size = GPU count; the
  figure is the best bus bandwidth (nccl-tests convention), the sweep is in detail. Each size is
  timed nccl-tests' way: many calls back to back between one event pair, so a small message's time
  is the collective's and not the host's launch cost.
- link_latency (latency_us): the per-message latency alpha of the roofline, from the sweep's
  smallest message (see link_latency_from_sweep).
- noise_floor (noise_floor_fraction, per mode): the baseline timed against itself through the
  normal launcher (``--model baseline``) on a few tasks; how far the self-checks stray from 1.0x,
  for each timing method: the eager floor in the column, the graph floor in detail (in the H200
  VM's self-check of all 35 tasks, eager medians were within 3% for 3 tasks, graph for 23 of 28;
  stats.noise_floor_for picks).
- network_busbw (host_a <-> host_b): the network between two hosts, one rank a side, written by
  `pkb-tui calibrate --network` (engine.netcal), read by Store.network_pairs.
roofline.bandwidths_for reads them back through Store.latest_calibration / latest_link_latency;
the launcher judges "within noise" by Store.latest_noise_floor.
"""

from __future__ import annotations

import importlib.util
import json
import os
import platform
import shutil
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Callable, TextIO

import torch

from pkb_tui.errors import EXIT_OK, EXIT_USAGE, PkbError

MiB = 1024 * 1024
GiB = 1024 * MiB
# The small sizes give the per-message latency; the large ones the bandwidth.
LATENCY_SIZES = (8, 1024, 8 * 1024)
DEFAULT_ALLREDUCE_SIZES = (*LATENCY_SIZES, 64 * 1024, 1 * MiB, 16 * MiB, 128 * MiB, 512 * MiB, 1 * GiB)
QUICK_ALLREDUCE_SIZES = (*LATENCY_SIZES, 16 * MiB, 256 * MiB)
# The self-check of the noise floor: the baseline as its own candidate at size small. On a GPU every
# task: the eight collectives alone under-read the spread between two processes running the same
# code (H100, 2026-12-06: their floor +-1.0% graph, while gather, reduce_scatter, scatter and
# tp_allgather_gemm read 0.981-1.014 in the all-task self-check, their rounds' intervals +-0.1-0.4%).
# cpu (gloo on a small box, minutes a task): the eight collectives (`--noise-tasks` picks either way).
NOISE_TASKS = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all", "broadcast", "reduce", "gather", "scatter")
NO_GPU_MESSAGE = (
    "pkb-tui calibrate measures GPU memory, peer links and NCCL, and this machine has no GPU visible "
    "to torch (torch.cuda.is_available() is False); nothing was measured. Run it on the GPU box; "
    "cpu-mode results have no roofline. `pkb-tui calibrate --noise-only` measures this box's cpu-mode noise floor."
)
# Never switch NVLink multicast (NVLS) on: on a shared host it can take the GPUs out of service.
SAFE_NCCL_ENV = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}


def noise_tasks_for(mode: str, spec: str | None = None) -> tuple[str, ...]:
    """The self-check's tasks: ``spec`` "all" (every task, ("all",)), "collectives" (NOISE_TASKS)
    or a comma list of task ids; None: every task on a GPU, the collectives in cpu mode.
    An unknown id is a usage error (PkbError) before anything runs."""
    from tasks.base import load_task

    spec = (spec or ("collectives" if mode == "cpu" else "all")).strip()
    if spec == "all":
        return ("all",)
    if spec == "collectives":
        return NOISE_TASKS
    ids = tuple(dict.fromkeys(t.strip() for t in spec.split(",") if t.strip()))
    if not ids:
        raise PkbError("--noise-tasks takes all, collectives or task ids separated by commas (got nothing).")
    for task_id in ids:
        load_task(task_id)  # "Unknown task ...; `pkb-tui tasks` lists ..."
    return ids


def partial_floor_note(mode: str, tasks: tuple[str, ...] | None) -> str | None:
    """What to say of a GPU noise floor taken from fewer than every task; None otherwise (cpu mode
    takes the collectives by default: gloo on a small box takes minutes a task)."""
    if mode == "cpu" or not tasks or tasks == ("all",):
        return None
    return (f"note: this floor comes from {len(tasks)} task(s). On a GPU the steady offset between two runner "
            "processes differs by task, and the eight collectives' floor under-read the others' (H100, 2026-12-06 and "
            "2026-12-07: 4 of 28 and 5 of 29 graph self-check intervals then missed 1.0); leave --noise-tasks out "
            "to take every task.")


Progress = Callable[[str], None]


# ---------------------------------------------------------------------- host facts
def host_facts() -> dict[str, Any]:
    """What identifies this host's hardware and software (the hosts table's columns).

    Uses NVML for the GPUs (no CUDA context is created), nvidia-smi topo -m where present, and
    falls back to torch when NVML is missing. Every field that cannot be read is None.
    """
    facts: dict[str, Any] = {
        "hostname": socket.gethostname(),
        "python_version": platform.python_version(),
        "torch_version": torch.__version__,
        "cuda_version": torch.version.cuda,
        "nccl_version": _nccl_version(),
        "gpu_model": None, "gpu_count": 0, "driver_version": None, "topology": None,
    }
    visible = _visible_gpu_count()
    nvml = _nvml_facts()
    if nvml is not None:
        facts.update({k: v for k, v in nvml.items() if k != "gpus"})
        facts["topology"] = {"gpus": nvml["gpus"]}
        facts["gpu_count"] = visible if visible is not None else len(nvml["gpus"])
    elif visible:
        facts["gpu_count"] = visible
        facts["gpu_model"] = torch.cuda.get_device_name(0)
    if facts["gpu_count"] and shutil.which("nvidia-smi"):
        matrix = _run_text(["nvidia-smi", "topo", "-m"])
        if matrix:
            facts["topology"] = {**(facts["topology"] or {}), "nvidia_smi_topo": matrix}
    return facts


def _visible_gpu_count() -> int | None:
    try:
        return torch.cuda.device_count() if torch.cuda.is_available() else 0
    except Exception:
        return None


def _nccl_version() -> str | None:
    try:
        import torch.cuda.nccl as nccl

        version = nccl.version()
    except Exception:
        return None
    if isinstance(version, tuple):
        return ".".join(str(v) for v in version)
    return str(version)


def _run_text(cmd: list[str], timeout_s: float = 10.0) -> str | None:
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return proc.stdout.strip() if proc.returncode == 0 and proc.stdout.strip() else None


def _nvml_facts(nvml: Any = None) -> dict[str, Any] | None:
    """GPU model, driver and per-GPU links from NVML, or None when NVML is not there."""
    try:
        if nvml is None:
            import pynvml as nvml  # type: ignore[no-redef]
        nvml.nvmlInit()
    except Exception:
        return None
    try:
        count = nvml.nvmlDeviceGetCount()
        if count == 0:
            return None
        gpus = []
        for index in range(count):
            handle = nvml.nvmlDeviceGetHandleByIndex(index)
            gpus.append({
                "index": index,
                "name": _text(_try(nvml.nvmlDeviceGetName, handle)),
                "pci_bus_id": _text(getattr(_try(nvml.nvmlDeviceGetPciInfo, handle), "busId", None)),
                "nvlink_active_links": _active_nvlinks(nvml, handle),
                "pcie_generation": _try(nvml.nvmlDeviceGetCurrPcieLinkGeneration, handle),
                "pcie_max_generation": _try(nvml.nvmlDeviceGetMaxPcieLinkGeneration, handle),
                "pcie_width": _try(nvml.nvmlDeviceGetCurrPcieLinkWidth, handle),
            })
        return {
            "gpu_model": gpus[0]["name"],
            "driver_version": _text(_try(nvml.nvmlSystemGetDriverVersion)),
            "gpus": gpus,
        }
    finally:
        try:
            nvml.nvmlShutdown()
        except Exception:
            pass


def _try(fn: Callable, *args: Any) -> Any:
    try:
        return fn(*args)
    except Exception:
        return None


def _text(value: Any) -> str | None:
    if isinstance(value, bytes):
        return value.decode(errors="replace")
    return value


def _active_nvlinks(nvml: Any, handle: Any) -> int | None:
    """Active NVLink links; None when NVML cannot say (0 means: it says there are none)."""
    active, answered = 0, False
    for link in range(getattr(nvml, "NVML_NVLINK_MAX_LINKS", 18)):
        try:
            state = nvml.nvmlDeviceGetNvLinkState(handle, link)
        except Exception as exc:
            # NOT_SUPPORTED on a GPU without NVLink; INVALID_ARGUMENT past its last link.
            if "Not Supported" in str(exc) or "NOT_SUPPORTED" in str(exc).upper().replace(" ", "_"):
                return 0 if not answered else active
            break
        answered = True
        active += int(bool(state))
    return active if answered else None


# ---------------------------------------------------------------------- measurements
def _median_gbps(bytes_counted: int, seconds: list[float]) -> float:
    return bytes_counted / statistics.median(seconds) / 1e9


def _time_device(fn: Callable[[], None], device: int, iterations: int, warmup: int = 3) -> list[float]:
    """Per-iteration seconds by CUDA events on ``device``'s current stream."""
    with torch.cuda.device(device):
        for _ in range(warmup):
            fn()
        torch.cuda.synchronize(device)
        times = []
        for _ in range(iterations):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end) / 1e3)
        return times


def measure_device_copy_gbps(device: int, nbytes: int, iterations: int = 20) -> float:
    """dst.copy_(src) on one GPU, bytes read + written over the time."""
    with torch.cuda.device(device):
        src = torch.randint(0, 255, (nbytes,), dtype=torch.uint8, device=device)  # never zeros
        dst = torch.empty_like(src)
        times = _time_device(lambda: dst.copy_(src), device, iterations)
    return _median_gbps(2 * nbytes, times)


def measure_host_copy_gbps(nbytes: int, iterations: int = 5) -> float:
    src = torch.randint(0, 255, (nbytes,), dtype=torch.uint8)
    dst = torch.empty_like(src)
    dst.copy_(src)
    times = []
    for _ in range(iterations):
        start = time.perf_counter()
        dst.copy_(src)
        times.append(time.perf_counter() - start)
    return _median_gbps(2 * nbytes, times)


def _time_wall(fn: Callable[[], None], devices: tuple[int, ...], iterations: int, warmup: int = 3) -> float:
    """Seconds per iteration for work that spans two devices (events on one would miss the other)."""
    for _ in range(warmup):
        fn()
    for d in devices:
        torch.cuda.synchronize(d)
    start = time.perf_counter()
    for _ in range(iterations):
        fn()
    for d in devices:
        torch.cuda.synchronize(d)
    return (time.perf_counter() - start) / iterations


def measure_peer_copy_engine_gbps(src_gpu: int, dst_gpu: int, nbytes: int, iterations: int = 20) -> float:
    """Bytes moved src_gpu -> dst_gpu by cudaMemcpyPeerAsync (copy engines), one direction."""
    src = torch.randint(0, 255, (nbytes,), dtype=torch.uint8, device=src_gpu)
    dst = torch.empty(nbytes, dtype=torch.uint8, device=dst_gpu)
    seconds = _time_wall(lambda: dst.copy_(src, non_blocking=True), (src_gpu, dst_gpu), iterations)
    return nbytes / seconds / 1e9


_PULL_SOURCE = r"""
extern "C" __global__ void pkb_pull(const uint4* __restrict__ src, uint4* __restrict__ dst, long long n) {
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (long long)gridDim.x * blockDim.x)
        dst[i] = src[i];
}
"""


def measure_peer_sm_gbps(src_gpu: int, dst_gpu: int, nbytes: int, iterations: int = 20) -> float:
    """Bytes moved by a kernel on dst_gpu that loads src_gpu's memory directly (peer access)."""
    import cupy

    nbytes -= nbytes % 16
    src = torch.randint(0, 255, (nbytes,), dtype=torch.uint8, device=src_gpu)
    dst = torch.empty(nbytes, dtype=torch.uint8, device=dst_gpu)
    with cupy.cuda.Device(dst_gpu):
        try:
            cupy.cuda.runtime.deviceEnablePeerAccess(src_gpu)
        except cupy.cuda.runtime.CUDARuntimeError as exc:
            if "AlreadyEnabled" not in str(exc) and "already" not in str(exc).lower():
                raise
        kernel = cupy.RawKernel(_PULL_SOURCE, "pkb_pull")
        sms = cupy.cuda.runtime.getDeviceProperties(dst_gpu)["multiProcessorCount"]
        stream = cupy.cuda.ExternalStream(torch.cuda.current_stream(dst_gpu).cuda_stream, dst_gpu)
        import numpy as np

        args = (np.uint64(src.data_ptr()), np.uint64(dst.data_ptr()), np.int64(nbytes // 16))

        def pull() -> None:
            with stream:
                kernel((4 * sms,), (512,), args)

        seconds = _time_wall(pull, (src_gpu, dst_gpu), iterations)
    return nbytes / seconds / 1e9


def _time_back_to_back(fn: Callable[[], None], device: int, calls: int, repeats: int = 5, warmup: int = 5) -> list[float]:
    """Seconds per call, nccl-tests' way: ``calls`` calls between one event pair, ``repeats`` times."""
    with torch.cuda.device(device):
        for _ in range(warmup):
            fn()
        torch.cuda.synchronize(device)
        per_call = []
        for _ in range(repeats):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            for _ in range(calls):
                fn()
            end.record()
            end.synchronize()
            per_call.append(start.elapsed_time(end) / 1e3 / calls)
        return per_call


def _allreduce_rank(rank: int, world: int, port: int, sizes: tuple[int, ...], iterations: int, queue) -> None:
    os.environ.update(SAFE_NCCL_ENV)
    import torch.distributed as dist

    torch.cuda.set_device(rank)
    dist.init_process_group("nccl", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    try:
        sweep = []
        for size in sizes:
            x = torch.randn(max(1, size // 4), device=rank)
            # small messages: enough calls back to back that the window holds ~ms of work
            calls = 200 if size <= 1 * MiB else iterations
            times = _time_back_to_back(lambda: dist.all_reduce(x), rank, calls)
            mean = torch.tensor([statistics.median(times)], device=rank, dtype=torch.float64)
            dist.all_reduce(mean, op=dist.ReduceOp.MAX)  # the slowest rank's time, as nccl-tests
            seconds = float(mean.item())
            algbw = size / seconds / 1e9
            sweep.append({"size_bytes": size, "time_us": seconds * 1e6, "algbw_gbps": algbw,
                          "busbw_gbps": algbw * 2 * (world - 1) / world})
        if rank == 0:
            queue.put(sweep)
    finally:
        dist.destroy_process_group()


def measure_allreduce_sweep(world: int, sizes: tuple[int, ...], iterations: int = 20, timeout_s: float = 300) -> list[dict]:
    """NCCL all-reduce (fp32 sum, out of place) at each size, one process per GPU."""
    import torch.multiprocessing as mp

    ctx = mp.get_context("spawn")
    queue = ctx.SimpleQueue()
    port = _free_port()
    saved = {k: os.environ.get(k) for k in SAFE_NCCL_ENV}
    os.environ.update(SAFE_NCCL_ENV)  # spawned children inherit it before NCCL initialises
    try:
        procs = [ctx.Process(target=_allreduce_rank, args=(r, world, port, sizes, iterations, queue)) for r in range(world)]
        for p in procs:
            p.start()
        deadline = time.monotonic() + timeout_s
        for p in procs:
            p.join(max(1.0, deadline - time.monotonic()))
        failed = [p for p in procs if p.is_alive() or p.exitcode != 0]
        for p in procs:
            if p.is_alive():
                p.kill()
        if failed or queue.empty():
            raise PkbError(f"The NCCL all-reduce sweep failed on {len(failed)} of {world} ranks (see the output above).")
        return queue.get()
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def link_latency_from_sweep(sweep: list[dict[str, Any]], world: int) -> tuple[float, dict[str, Any]] | None:
    """The per-message latency alpha (us) from an all-reduce sweep, or None without a small message.

    The smallest message's all-reduce time is pure latency; NCCL's ring spends it in 2(n-1)
    dependent steps of one message each (its tree fewer, longer ones), so that time over 2(n-1)
    is at most one message's latency on this link. Dividing by the most steps keeps alpha low,
    so a kernel that beats NCCL's small all-reduce still finds the floor under it.
    """
    small = [p for p in sweep if p["size_bytes"] <= max(LATENCY_SIZES)]
    if not small or world < 2:
        return None
    smallest = min(small, key=lambda p: p["size_bytes"])
    steps = 2 * (world - 1)
    return smallest["time_us"] / steps, {
        "from": "NCCL all-reduce sweep", "size_bytes": smallest["size_bytes"], "allreduce_time_us": smallest["time_us"],
        "steps": steps, "method": "smallest message's per-call time (back to back) / 2(n-1) ring steps",
    }


def measure_noise_floor(
    db_path: str, mode: str, world_size: int, *, tasks: tuple[str, ...] | None = None, size: str = "small",
    progress: Progress | None = None,
) -> dict[str, Any]:
    """Time the baseline against itself through the normal launcher and return a noise_floor row
    (host_id set to the host the runs recorded, which in cpu mode is the GPU-less view of this box).

    Per timing method, the floor is the least spread between processes with which every
    self-check's interval holds 1.0 (stats.noise_floor_from_selfchecks, on the rounds' intervals:
    these runs fold in no earlier floor). Later runs widen their intervals by it (stats.widened).
    ``tasks``: noise_tasks_for(mode) where None. On a GPU the speedups are read from the graph
    figure where a call can be captured, so after their least rounds those tasks stop once it is
    narrow (the eager figure comes with it; a task whose eager block is one call has 30 rounds at
    least, ~13 s on the H100); the rest take the eager figure's time budget.
    """
    from pkb_tui.engine.launcher import Launcher
    from pkb_tui.engine.request import RunRequest
    from pkb_tui.engine.worker import TIMING_BUDGET_S
    from pkb_tui.store.store import Store
    from tasks.base import all_tasks

    say = progress or (lambda _msg: None)
    tasks = tasks or noise_tasks_for(mode)
    count = len(all_tasks()) if tasks == ("all",) else len(tasks)
    say(f"noise floor: the baseline against itself, {count} tasks at size {size}, {mode} x{world_size} "
        f"(up to ~{TIMING_BUDGET_S['cpu' if mode == 'cpu' else 'cuda']:g} s of timing a task)")
    request = RunRequest(tasks=list(tasks), models=["baseline"], world_size=world_size, mode=mode, size=size,
                         trials=1, profile=False, timeout_s=600.0, speedup_basis="eager" if mode == "cpu" else "graph")
    outcome = Launcher(db_path, noise_floor=False).run(request)
    with Store(db_path) as store:
        runs = [store.run(run_id) for run_id in outcome.run_ids]
    per_task, floors = noise_floors_from_runs(runs)
    if floors["eager"] is None:
        statuses = ", ".join(f"{task}: {v.get('status')}" for task, v in per_task.items())
        raise PkbError(f"The noise-floor self-check ran no task to the end ({statuses}); see `pkb-tui runs --model baseline`.")
    host_id = next((run.get("host_id") for run in runs if run.get("host_id")), None)
    return {"kind": "noise_floor", "noise_floor_fraction": floors["eager"], "mode": mode, "host_id": host_id,
            "measured_at": time.time(), "gpu_a": None, "gpu_b": None, "size_bytes": None, "bandwidth_gbps": None,
            "detail": {"world_size": world_size, "size": size, "tasks": per_task,
                       "graph_noise_floor_fraction": floors["graph"],
                       "tasks_asked": list(tasks), "skipped": list(outcome.skipped or []),
                       "method": "baseline vs itself through the launcher, intervals from the rounds alone; per timing "
                                 "method (eager in the column, graph in detail) the least spread with which every "
                                 "self-check's interval, widened by it in quadrature, holds 1.0"}}


def noise_floors_from_runs(runs: list[dict[str, Any]]) -> tuple[dict[str, Any], dict[str, float | None]]:
    """The self-check runs (Store.run rows, the baseline as its own candidate) as per-task figures
    and a floor per timing method: {"eager": f, "graph": f or None where no task was capturable}."""
    from pkb_tui.engine import stats

    per_task: dict[str, Any] = {}
    estimates: dict[str, list[stats.SpeedupEstimate]] = {"eager": [], "graph": []}
    for run in runs:
        candidate = run["results"].get("candidate") or {}
        if run["status"] != "passed":
            per_task[run["task_id"]] = {"run_id": run["id"], "status": run["status"]}
            continue
        entry: dict[str, Any] = {"run_id": run["id"]}
        for method in ("eager", "graph"):
            # rows written before both figures were kept hold the eager figure in speedup only
            point = candidate.get(f"speedup_{method}") or (candidate.get("speedup") if method == "eager" else None)
            if not point:
                continue
            low = candidate.get(f"speedup_{method}_low") or point
            high = candidate.get(f"speedup_{method}_high") or point
            estimates[method].append(stats.SpeedupEstimate(point, low, high, "", candidate.get("rounds") or 0, 0.95))
            prefix = "" if method == "eager" else "graph_"
            entry.update({f"{prefix}speedup": point, f"{prefix}low": low, f"{prefix}high": high})
        if "speedup" not in entry:
            entry["status"] = run["status"]
        per_task[run["task_id"]] = entry
    return per_task, {method: stats.noise_floor_from_selfchecks(found) for method, found in estimates.items()}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# ---------------------------------------------------------------------- calibrate
def calibrate(
    store: Any, host_id: int, *, sizes: tuple[int, ...] | None = None, quick: bool = False,
    progress: Progress | None = None,
) -> list[dict[str, Any]]:
    """Measure this host and store the figures; returns every row, measured or skipped (with reason).

    ``sizes`` are the all-reduce sweep's message sizes in bytes. ``quick`` measures smaller buffers,
    GPU 0 only for the copy, and only the pairs with GPU 0.
    """
    if not torch.cuda.is_available() or torch.cuda.device_count() == 0:
        raise PkbError(NO_GPU_MESSAGE)
    say = progress or (lambda _msg: None)
    gpus = torch.cuda.device_count()
    copy_bytes = 256 * MiB if quick else 2 * GiB
    peer_bytes = 128 * MiB if quick else 512 * MiB
    rows: list[dict[str, Any]] = []

    per_gpu = {}
    for device in ([0] if quick else range(gpus)):
        say(f"device copy on GPU {device} ({copy_bytes // MiB} MiB)")
        per_gpu[device] = measure_device_copy_gbps(device, copy_bytes)
        torch.cuda.empty_cache()  # give the buffers back before the next GPU's or the sweep's
    best = max(per_gpu, key=per_gpu.get)
    rows.append(_row("device_copy", per_gpu[best], size_bytes=copy_bytes, detail={
        "counted": "bytes read + bytes written", "per_gpu_gbps": {str(k): v for k, v in per_gpu.items()},
        "method": "torch copy_, CUDA events, median of 20",
    }))

    say("host memory copy")
    rows.append(_row("host_copy", measure_host_copy_gbps(256 * MiB if not quick else 64 * MiB),
                     size_bytes=256 * MiB if not quick else 64 * MiB,
                     detail={"counted": "bytes read + bytes written", "method": "torch CPU copy_, median of 5"}))

    if gpus > 1:
        have_cupy = importlib.util.find_spec("cupy") is not None
        pairs = [(0, b) for b in range(1, gpus)] if quick else [(a, b) for a in range(gpus) for b in range(gpus) if a != b]
        for a, b in pairs:
            say(f"peer copies GPU {a} -> GPU {b}")
            rows.append(_row("peer_copy_engine", measure_peer_copy_engine_gbps(a, b, peer_bytes), a, b, peer_bytes,
                             {"method": "cudaMemcpyPeerAsync via torch copy_, wall clock over 20"}))
            if have_cupy:
                rows.append(_row("peer_sm", measure_peer_sm_gbps(a, b, peer_bytes), a, b, peer_bytes,
                                 {"method": f"kernel on GPU {b} loading GPU {a}'s memory, 16-byte loads"}))
        if not have_cupy:
            rows.append(_skipped("peer_sm", "CuPy is not installed: the SM-driven peer copy needs a raw kernel"))
        sweep_sizes = tuple(sizes) if sizes else (QUICK_ALLREDUCE_SIZES if quick else DEFAULT_ALLREDUCE_SIZES)
        say(f"NCCL all-reduce sweep at world size {gpus} ({len(sweep_sizes)} sizes)")
        sweep = measure_allreduce_sweep(gpus, sweep_sizes, iterations=10 if quick else 20)
        peak = max(sweep, key=lambda s: s["busbw_gbps"])
        rows.append(_row("allreduce_busbw", peak["busbw_gbps"], size_bytes=peak["size_bytes"], detail={
            "world_size": gpus, "sweep": sweep, "dtype": "float32",
            "convention": "nccl-tests: busbw = size / time x 2(n-1)/n, slowest rank's time, calls back to back",
        }))
        latency = link_latency_from_sweep(sweep, gpus)
        if latency is not None:
            rows.append({"kind": "link_latency", "latency_us": latency[0], "size_bytes": latency[1]["size_bytes"],
                         "gpu_a": None, "gpu_b": None, "bandwidth_gbps": None, "measured_at": time.time(),
                         "detail": latency[1]})
        else:
            rows.append(_skipped("link_latency", "the sweep had no message small enough to be latency"))
    else:
        reason = "one GPU: no peer pair to measure"
        rows.append(_skipped("peer_copy_engine", reason))
        rows.append(_skipped("peer_sm", reason))
        rows.append(_skipped("allreduce_busbw", "one GPU: an all-reduce over one rank moves nothing over a link"))
        rows.append(_skipped("link_latency", "one GPU: no link to measure"))

    store.add_calibration(host_id, [r for r in rows if not r.get("skipped")])
    return rows


def calibrate_noise(store: Any, host_id: int, mode: str, world_size: int, *, progress: Progress | None = None,
                    tasks: tuple[str, ...] | None = None) -> dict[str, Any]:
    """Measure and store this host's noise floor in ``mode`` (over ``tasks``: noise_tasks_for);
    returns the row (or a skipped row)."""
    try:
        row = measure_noise_floor(str(store.path), mode, world_size, tasks=tasks, progress=progress)
    except PkbError as exc:
        return _skipped("noise_floor", str(exc))
    store.add_calibration(row.pop("host_id") or host_id, [row])
    return row


def _row(kind: str, gbps: float, gpu_a: int | None = None, gpu_b: int | None = None, size_bytes: int | None = None,
         detail: dict | None = None) -> dict[str, Any]:
    return {"kind": kind, "gpu_a": gpu_a, "gpu_b": gpu_b, "size_bytes": size_bytes, "bandwidth_gbps": float(gbps),
            "measured_at": time.time(), "detail": detail}


def _skipped(kind: str, reason: str) -> dict[str, Any]:
    return {"kind": kind, "gpu_a": None, "gpu_b": None, "size_bytes": None, "bandwidth_gbps": None,
            "skipped": reason, "detail": None}


def _figure_text(row: dict[str, Any]) -> str:
    """A row's figure in its own unit: GB/s, us, or +-% for a noise floor."""
    if row.get("latency_us") is not None:
        return f"{row['latency_us']:.2f} us"
    if row.get("noise_floor_fraction") is not None:
        graph = (row.get("detail") or {}).get("graph_noise_floor_fraction")
        return f"+-{row['noise_floor_fraction']:.1%}" + (f" (graph +-{graph:.1%})" if graph is not None else "")
    return f"{row['bandwidth_gbps']:.1f}"


# ---------------------------------------------------------------------- the command
def datasheet_for(facts: dict[str, Any]) -> dict[str, Any]:
    """The datasheet figures to print beside each kind, with their sources."""
    from pkb_tui.engine import roofline

    spec = roofline.lookup_gpu(facts.get("gpu_model"))
    link = roofline.bandwidths_for({**facts, "gpu_count": max(2, facts.get("gpu_count") or 0)}, {}, "nccl", 2)
    memory = spec.hbm_gbps if spec else None
    return {
        "device_copy": {"gbps": memory, "source": spec.source if spec else "no datasheet entry"},
        "peer_copy_engine": {"gbps": link.link_gbps, "source": link.link_source},
        "peer_sm": {"gbps": link.link_gbps, "source": link.link_source},
        "allreduce_busbw": {"gbps": link.link_gbps, "source": link.link_source},
        "host_copy": {"gbps": None, "source": "no datasheet for host memory"},
    }


def calibrate_command(
    db_path: str | None, as_json: bool, quick: bool, out: TextIO = sys.stdout, *, noise: bool = True,
    noise_only: bool = False, noise_tasks: str | None = None,
) -> int:
    """`pkb-tui calibrate`: measure, store, print a table (or JSON). Returns the exit code.

    The GPU figures need a GPU; the noise floor (``noise``; alone with ``noise_only``) runs in nccl
    mode over the visible GPUs (at most 8), or in cpu mode at world size 2 on a box without one.
    """
    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if gpus == 0 and not noise_only:
        if as_json:
            print(json.dumps({"error": NO_GPU_MESSAGE}), file=out)
        else:
            print(NO_GPU_MESSAGE, file=out)
        return EXIT_USAGE
    from pkb_tui.store.recovery import read_only_database_sentence
    from pkb_tui.store.store import Store, default_db_path

    if (sentence := read_only_database_sentence(Path(db_path or default_db_path()), "measured")) is not None:
        raise PkbError(sentence)
    facts = host_facts()
    progress = None if as_json else (lambda msg: print(f"  measuring {msg} ...", file=sys.stderr, flush=True))
    mode, world = ("nccl", min(gpus, 8)) if gpus else ("cpu", 2)
    tasks = noise_tasks_for(mode, noise_tasks) if noise or noise_only else None  # a bad id: before anything runs
    with Store(db_path) as store:
        host_id = store.upsert_host(facts)
        rows = [] if noise_only else calibrate(store, host_id, quick=quick, progress=progress)
        if noise or noise_only:
            rows.append(calibrate_noise(store, host_id, mode, world, progress=progress, tasks=tasks))
        db = str(store.path)
    sheet = datasheet_for(facts)
    note = partial_floor_note(mode, tasks)
    if as_json:
        print(json.dumps({"host_id": host_id, "host": facts, "database": db, "rows": rows, "datasheet": sheet,
                          "notes": [note] if note else []}, default=str), file=out)
        return EXIT_OK
    print(format_table(facts, rows, sheet), file=out)
    print(f"\nStored for host {host_id} ({facts['hostname']}) in {db}; runs on this host now judge "
          "their roofline and noise against these figures.", file=out)
    if note:
        print(note, file=out)
    return EXIT_OK


def format_table(facts: dict[str, Any], rows: list[dict[str, Any]], sheet: dict[str, Any]) -> str:
    lines = [
        f"{facts.get('gpu_count')} x {facts.get('gpu_model')}  driver {facts.get('driver_version')}  "
        f"CUDA {facts.get('cuda_version')}  torch {facts.get('torch_version')}  NCCL {facts.get('nccl_version')}",
        "",
        f"{'kind':<18} {'GPUs':<7} {'size':>9} {'measured GB/s':>14} {'datasheet GB/s':>15} {'of datasheet':>13}",
    ]
    sources = {}
    for row in rows:
        gpus = f"{row['gpu_a']}->{row['gpu_b']}" if row.get("gpu_a") is not None else "-"
        size = f"{row['size_bytes'] / MiB:.0f} MiB" if row.get("size_bytes") else "-"
        ref = sheet.get(row["kind"], {})
        if row.get("skipped"):
            lines.append(f"{row['kind']:<18} {gpus:<7} {size:>9} {'skipped':>14}  {row.get('skipped')}")
            continue
        if row.get("bandwidth_gbps") is None:  # a latency or a noise floor: no datasheet to compare with
            mode = f"  ({row['mode']} mode)" if row.get("mode") else ""
            lines.append(f"{row['kind']:<18} {gpus:<7} {size:>9} {_figure_text(row):>14}{mode}")
            continue
        ref_gbps = ref.get("gbps")
        fraction = f"{row['bandwidth_gbps'] / ref_gbps:>12.0%}" if ref_gbps else f"{'-':>13}"
        ref_text = f"{ref_gbps:>15.1f}" if ref_gbps else f"{'-':>15}"
        lines.append(f"{row['kind']:<18} {gpus:<7} {size:>9} {row['bandwidth_gbps']:>14.1f} {ref_text} {fraction}")
        if ref.get("source"):
            sources[row["kind"]] = ref["source"]
        if row["kind"] == "allreduce_busbw" and row.get("detail"):
            for point in row["detail"]["sweep"]:
                lines.append(f"{'  sweep':<18} {'all':<7} {point['size_bytes'] / MiB:>5.0f} MiB "
                             f"{point['busbw_gbps']:>14.1f}   ({point['time_us']:.0f} us)")
    lines.append("")
    for kind, source in sources.items():
        lines.append(f"datasheet for {kind}: {source}")
    return "\n".join(lines)
