"""Run modes: nccl (a GPU per rank), shared-gpu (several ranks on one GPU), cpu (gloo on CPU)."""

from __future__ import annotations

import os

from pkb_tui.errors import PkbError

MODES = ("nccl", "shared-gpu", "cpu")
# What every cpu-mode figure is labelled with (CLI, JSON, screens): gloo on a shared CPU box.
CPU_MODE_LABEL = "cpu: for development, not a measurement"


def visible_gpu_count() -> int:
    """GPUs this process may use, without creating a CUDA context (NVML-based in torch)."""
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


def backend_for(mode: str) -> str:
    return "nccl" if mode == "nccl" else "gloo"


def timings_representative(mode: str) -> bool:
    """Whether a mode's timings stand for the real thing: only nccl. shared-gpu ranks time-slice
    one GPU; cpu is gloo on a shared host (for development, not a measurement)."""
    return mode == "nccl"
