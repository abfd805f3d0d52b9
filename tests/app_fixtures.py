"""Fixed data for the dashboard's tests and snapshots: a catalogue, runs written through the real
Store into a real SQLite file, and a telemetry source standing in for NVML (which CI lacks)."""

from __future__ import annotations

import math
import io
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from collectors.sample import GpuSample, LinkSample
from collectors.sink import RingBuffer
from pkb_tui.app.catalog import Catalog, ModelInfo, TaskInfo
from pkb_tui.app.config import AppConfig
from pkb_tui.store import Store

FIXED_NOW = 1_767_225_600.0  # 2026-01-01 00:00 UTC: every snapshot shows the same dates

TASKS = [
    TaskInfo("all_reduce", "All-reduce (sum)", "collective", "NCCL ncclAllReduce; DDP", None, 1,
             ("float32", "bfloat16", "float16"), ("small", "default", "large"), ("nccl", "shared-gpu", "cpu")),
    TaskInfo("all_gather", "All-gather", "collective", "FSDP parameter gather", None, 1,
             ("float32", "bfloat16"), ("small", "default", "large"), ("nccl", "shared-gpu", "cpu")),
    TaskInfo("reduce_scatter", "Reduce-scatter (sum)", "collective", "FSDP gradient reduce", None, 2,
             ("float32", "bfloat16"), ("small", "default", "large"), ("nccl", "shared-gpu", "cpu")),
    TaskInfo("tp_gemm_rs", "TP GEMM + reduce-scatter", "tensor", "Megatron-LM row-parallel linear",
             (2, 4, 8), 2, ("bfloat16",), ("small", "default"), ("nccl", "shared-gpu")),
    TaskInfo("ring_attention", "Ring attention", "context", "Ring Attention (Liu et al.)", (2, 4, 8), 2,
             ("bfloat16", "float32"), ("small", "default"), ("nccl", "shared-gpu", "cpu")),
]
MODELS = [
    ModelInfo("baseline", 5, 5, "the task's own baseline"),
    ModelInfo("torch-p2p", 3, 5, "point-to-point rings", frozenset({"all_reduce", "all_gather", "reduce_scatter"})),
    ModelInfo("gpt-x-kernels", 2, 5, "", frozenset({"all_reduce", "tp_gemm_rs"})),
]


def fixed_catalog() -> Catalog:
    return Catalog(tasks=list(TASKS), models=list(MODELS))


@dataclass
class KnownRun:
    """A run as the tests write it: what the leaderboard and history must show back."""

    task: str
    model: str
    status: str
    correct: bool | None
    baseline_us: float | None
    candidate_us: float | None
    created_at: float
    host: str = "h200-box"
    detail: str | None = None

    @property
    def speedup(self) -> float | None:
        if self.baseline_us and self.candidate_us:
            return self.baseline_us / self.candidate_us
        return None


# Two models, three tasks; model torch-p2p ran all_reduce twice (the later run counts).
KNOWN_RUNS = [
    KnownRun("all_reduce", "torch-p2p", "failed", False, 1200.0, 1500.0, FIXED_NOW - 5 * 86400),
    KnownRun("all_reduce", "torch-p2p", "passed", True, 1200.0, 600.0, FIXED_NOW - 4 * 86400),
    KnownRun("all_gather", "torch-p2p", "passed", True, 900.0, 750.0, FIXED_NOW - 3 * 86400),
    KnownRun("reduce_scatter", "torch-p2p", "failed", False, 800.0, 400.0, FIXED_NOW - 3 * 86400 + 60),
    KnownRun("all_reduce", "gpt-x-kernels", "passed", True, 1200.0, 1300.0, FIXED_NOW - 2 * 86400),
    KnownRun("all_gather", "gpt-x-kernels", "error", None, None, None, FIXED_NOW - 3600, host="laptop",
             detail="solution.py line 12: NameError: name 'peer_ptr' is not defined"),
    KnownRun("reduce_scatter", "gpt-x-kernels", "passed", True, 800.0, 320.0, FIXED_NOW - 1800),
    KnownRun("all_reduce", "baseline", "timeout", None, None, None, FIXED_NOW - 600, host="laptop",
             detail="the run took longer than its timeout (300 s); the ranks were killed"),
]


def add_run(store: Store, known: KnownRun, *, host_ids: dict[str, int], index: int) -> int:
    """Write one run with both results, trials and kernels, as the launcher would."""
    host_id = host_ids.get(known.host)
    if host_id is None:
        gpu = ("NVIDIA H200", 8) if known.host == "h200-box" else (None, 0)
        host_id = store.upsert_host({"hostname": known.host, "gpu_model": gpu[0], "gpu_count": gpu[1],
                                     "torch_version": "2.13.0"})
        host_ids[known.host] = host_id
    run_id = store.create_run({
        "batch_id": f"batch-{index}", "task_id": known.task, "model": known.model, "world_size": 8 if known.host == "h200-box" else 2,
        "mode": "nccl" if known.host == "h200-box" else "cpu", "dtype": "bfloat16", "size": "default", "trials": 3,
        "timeout_s": 300.0, "request": {"tasks": [known.task], "models": [known.model]}, "status": known.status,
        "status_detail": known.detail, "host_id": host_id, "created_at": known.created_at,
        "started_at": known.created_at + 1, "finished_at": known.created_at + 20, "launcher_pid": 1,
        "launcher_host": "elsewhere", "log_path": f"/tmp/pkb-runs/run-{index}.log",
    })
    wire = 2 * 7 * 64 * 1024 * 1024 * 2 // 8
    traffic = {"send_bytes": wire, "recv_bytes": wire, "memory_bytes": 4 * wire, "flops": 0}
    if known.baseline_us is not None:
        store.add_result(run_id, "baseline", {
            "correct": 1, "trials_passed": 3, "trials_total": 3, "median_us": known.baseline_us,
            "p10_us": known.baseline_us * 0.95, "p90_us": known.baseline_us * 1.08, "mean_us": known.baseline_us,
            "min_us": known.baseline_us * 0.9, "max_us": known.baseline_us * 1.3, "iterations": 30,
            "roofline_fraction": 0.42, "roofline_floor_us": known.baseline_us * 0.42, "roofline_bound": "wire",
            "bandwidth_source": "datasheet:H200", "bus_bandwidth_gbps": 180.0, "traffic": traffic,
            "link_bytes_per_iter": float(wire), "pcie_bytes_per_iter": 0.0,
        })
    if known.candidate_us is not None or known.correct is not None:
        cand = known.candidate_us
        store.add_result(run_id, "candidate", {
            "correct": None if known.correct is None else int(known.correct),
            "trials_passed": 3 if known.correct else 1, "trials_total": 3,
            "max_abs_error": 1.5e-3 if known.correct else 0.37, "max_rel_error": 2e-3 if known.correct else 1.2,
            "worst_rank": 0 if known.correct else 5,
            "median_us": cand, "p10_us": cand and cand * 0.97, "p90_us": cand and cand * 1.05,
            "mean_us": cand, "min_us": cand and cand * 0.93, "max_us": cand and cand * 1.2, "iterations": 30,
            "speedup": known.speedup,
            "roofline_fraction": 0.42 * known.speedup if known.speedup else None,
            "roofline_floor_us": known.baseline_us * 0.42 if known.baseline_us else None, "roofline_bound": "wire",
            "bandwidth_source": "datasheet:H200", "bus_bandwidth_gbps": 180.0 * (known.speedup or 1), "traffic": traffic,
            "link_bytes_per_iter": float(wire) * 1.6, "pcie_bytes_per_iter": 0.0, "traffic_flag": "wasteful",
        })
        store.add_trials(run_id, [
            {"trial": t, "correct": bool(known.correct) or t == 0, "max_abs_error": 1e-3 * (t + 1),
             "max_rel_error": 2e-3, "worst_rank": t, "message": None if known.correct or t == 0 else "mismatch at 4,096 elements",
             "detail": [{"rank": r, "max_abs_error": 1e-3} for r in range(2)]}
            for t in range(3)
        ])
        store.add_kernels(run_id, [
            {"variant": "candidate", "rank": 0, "name": "ring_allreduce_kernel<bf16>", "category": "candidate",
             "calls": 30, "total_us": (cand or 1) * 30 * 0.8, "mean_us": (cand or 1) * 0.8, "share_fraction": 0.8},
            {"variant": "candidate", "rank": 0, "name": "Memcpy DtoD (Device -> Device)", "category": "copy",
             "calls": 60, "total_us": (cand or 1) * 30 * 0.15, "mean_us": (cand or 1) * 0.075, "share_fraction": 0.15},
            {"variant": "baseline", "rank": 0, "name": "ncclDevKernel_AllReduce_Sum_bf16_RING_LL", "category": "communication",
             "calls": 30, "total_us": (known.baseline_us or 1) * 30 * 0.95, "mean_us": (known.baseline_us or 1) * 0.95,
             "share_fraction": 0.95},
        ])
    return run_id


def seed_runs(db_path: Path, runs: list[KnownRun] = KNOWN_RUNS) -> list[int]:
    host_ids: dict[str, int] = {}
    with Store(db_path) as store:
        return [add_run(store, known, host_ids=host_ids, index=i) for i, known in enumerate(runs)]


# ---------------------------------------------------------------- telemetry standing in for NVML
@dataclass
class FakeTelemetry:
    """A Telemetry without a sampling thread: the real RingBuffer, filled by the test (CI has no
    NVML). Counts start/stop so tests can see the Monitor screen own it."""

    ring: RingBuffer
    source: str = "nvml"
    reason: str | None = None
    started: int = 0
    stopped: int = 0

    def start(self) -> "FakeTelemetry":
        self.started += 1
        return self

    def stop(self) -> None:
        self.stopped += 1


def gpu_ring(gpus: int = 8, links: int = 18, points: int = 60, *, start_ts: float = FIXED_NOW) -> RingBuffer:
    """Deterministic waves of NVLink traffic on every GPU and link, PCIe, SM use and power."""
    samples = []
    for step in range(points):
        for gpu in range(gpus):
            phase = step / 6 + gpu
            rate = 200e9 * (0.5 + 0.5 * math.sin(phase))
            samples.append(GpuSample(
                ts=start_ts + step * 0.1, gpu=gpu, nvlink_tx_bytes_per_s=rate, nvlink_rx_bytes_per_s=rate * 0.9,
                pcie_tx_bytes_per_s=1.5e9, pcie_rx_bytes_per_s=0.4e9, sm_util_pct=40 + gpu * 5, mem_util_pct=30,
                power_w=300 + 10 * gpu, sm_clock_mhz=1980, temperature_c=55 + gpu, memory_used_bytes=20e9,
                links=[LinkSample(link, rate / links * (1 + (link % 3) / 2), rate / links) for link in range(links)],
            ))
    ring = RingBuffer()
    ring.append(samples)
    return ring


def host_ring(points: int = 40) -> RingBuffer:
    """What a machine with no GPU gives: the host row only; NVLink fields n/a."""
    ring = RingBuffer()
    ring.append([
        GpuSample(ts=FIXED_NOW + i * 0.1, gpu=-1, cpu_pct=50 + 40 * math.sin(i / 4), host_memory_used_bytes=3.2e9,
                  loopback_bytes_per_s=1e9 * (1 + math.sin(i / 3)))
        for i in range(points)
    ])
    return ring


def app_config(db_path: Path, **overrides: Any) -> AppConfig:
    """The config every test uses: fixed clock and catalogue, UTC dates, no live telemetry."""
    fields: dict[str, Any] = dict(
        db_path=db_path, clock=lambda: FIXED_NOW, utc=True, catalog=fixed_catalog, telemetry=None, contention_check=None,
        runs_dir=db_path.parent / "runs",
    )
    fields.update(overrides)
    return AppConfig(**fields)


def screen_text(app: Any) -> str:
    """What the terminal shows now, as plain text (the same render as Textual's screenshots)."""
    from rich.console import Console

    width, height = app.size
    console = Console(width=width, height=height, file=io.StringIO(), force_terminal=True, record=True,
                      color_system="truecolor", legacy_windows=False, safe_box=False)
    console.print(app.screen._compositor.render_update(full=True, screen_stack=app._background_screens))
    return console.export_text()
