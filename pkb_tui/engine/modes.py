"""Run modes: nccl (a GPU per rank), shared-gpu (several ranks on one GPU), cpu (gloo on CPU)."""

from __future__ import annotations

import os
from dataclasses import dataclass

from pkb_tui.errors import PkbError

MODES = ("nccl", "shared-gpu", "cpu")
# What every cpu-mode figure is labelled with (CLI, JSON, screens): gloo on a shared CPU box.
CPU_MODE_LABEL = "cpu: for development, not a measurement"
# The dtype names a request may carry, in the order screens list them; tasks.base.DTYPES maps
# exactly these to torch dtypes (a test holds the two together). Here so that choosing one needs no torch.
DTYPES = ("float32", "bfloat16", "float16", "float64")
MODE_CHOICES = ("auto", *MODES)  # what a user may ask for (auto: chosen from the GPUs present)
# Ranks sharing one GPU in shared-gpu mode: past this they only time-slice (and each holds a CUDA
# context of several hundred MiB), so the figures say nothing and the box may run out of memory.
SHARED_GPU_MAX_RANKS = 8


def visible_gpu_count() -> int:
    """GPUs this process may use. No CUDA context is created, but torch's count (cudaGetDeviceCount,
    unless PYTORCH_NVML_BASED_CUDA_CHECK=1) loads the driver, which keeps its device files open in
    this process from then on (the dashboard's, for one)."""
    if os.environ.get("PKB_FORCE_CPU"):
        return 0
    try:
        import torch

        return torch.cuda.device_count() if torch.cuda.is_available() else 0
    except Exception:  # a broken driver install must not stop cpu mode
        return 0


def choose_mode(world_size: int, requested: str | None, gpu_count: int | None = None) -> str:
    """The mode for a run: the one asked for if it can work here, else the best the box allows."""
    gpus = visible_gpu_count() if gpu_count is None else gpu_count
    if world_size < 1:
        raise PkbError(f"World size must be at least 1 (got {world_size}).")
    if requested is None or requested == "auto":
        if gpus >= world_size:
            return "nccl"
        return "shared-gpu" if gpus >= 1 else "cpu"
    if requested not in MODES:
        raise PkbError(f"Unknown mode {requested!r}; choose one of {', '.join(MODES)} or auto.")
    if requested == "nccl" and gpus < world_size:
        raise PkbError(
            f"nccl mode needs one GPU per rank: world size {world_size} but {gpus} GPU(s) visible; "
            f"lower --world-size, or use --mode shared-gpu (one GPU) or --mode cpu."
        )
    if requested == "shared-gpu" and gpus < 1:
        raise PkbError("shared-gpu mode needs a GPU and none is visible; use --mode cpu.")
    return requested


@dataclass(frozen=True)
class Mode:
    """What a run mode provides, asked of one object instead of comparing mode strings."""

    name: str
    backend: str  # the ranks' process group: nccl or gloo
    device_kind: str  # cuda or cpu
    one_device: bool  # every rank on cuda:0 (shared-gpu), else a device per local rank
    timings_representative: bool  # only nccl: shared-gpu time-slices one GPU, cpu is gloo on a shared host
    link_kind: str  # what carries the ranks' bytes on a node, for the roofline

    def device_for(self, local_rank: int) -> str:
        """The torch device string of a rank (its local rank on its node)."""
        if self.device_kind == "cpu":
            return "cpu"
        return "cuda:0" if self.one_device else f"cuda:{local_rank}"


MODE_INFO: dict[str, Mode] = {
    "nccl": Mode("nccl", "nccl", "cuda", False, True, "nvlink-or-pcie"),
    "shared-gpu": Mode("shared-gpu", "gloo", "cuda", True, False, "shared-device-memory"),
    "cpu": Mode("cpu", "gloo", "cpu", False, False, "host-shared-memory"),
}


def mode_info(mode: str) -> Mode:
    try:
        return MODE_INFO[mode]
    except KeyError:
        raise PkbError(f"Unknown mode {mode!r}; choose one of {', '.join(MODES)} or auto.") from None


def backend_for(mode: str) -> str:
    return mode_info(mode).backend


def timings_representative(mode: str) -> bool:
    """Whether a mode's timings stand for the real thing: only nccl. shared-gpu ranks time-slice
    one GPU; cpu is gloo on a shared host (for development, not a measurement)."""
    return mode_info(mode).timings_representative

def rank_capacity(mode: str, gpu_count: int | None = None, cpu_count: int | None = None) -> tuple[int, str]:
    """The most ranks the mode holds on this box, and the reason (for the error message)."""
    if mode == "cpu":
        cores = cpu_count if cpu_count is not None else (len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1)
        return cores, f"this box has {cores} CPU core(s) and cpu mode runs one busy rank process per core"
    if mode == "nccl":
        gpus = visible_gpu_count() if gpu_count is None else gpu_count
        return gpus, f"nccl mode needs one GPU per rank and {gpus} GPU(s) are visible"
    return SHARED_GPU_MAX_RANKS, f"shared-gpu mode time-slices one GPU; past {SHARED_GPU_MAX_RANKS} ranks the figures mean nothing"


def check_world_size(world_size: int, mode: str, *, oversubscribe: bool = False,
                     gpu_count: int | None = None, cpu_count: int | None = None) -> None:
    """Refuse more ranks than the mode holds here (each would wait on the others), unless asked."""
    capacity, why = rank_capacity(mode, gpu_count, cpu_count)
    if world_size > capacity and not oversubscribe:
        raise PkbError(
            f"World size {world_size} is more than {mode} mode holds here ({capacity}): {why}; "
            f"lower --world-size, or pass --oversubscribe (the dashboard's oversubscribe box) to run it anyway."
        )
