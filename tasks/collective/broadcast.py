"""Broadcast from rank 0: every rank ends with a copy of rank 0's tensor.

Signature: broadcast(x: [numel]) -> [numel], rank 0's x on every rank. Every rank passes a tensor of
the same shape (non-root values are ignored) and every rank, rank 0 too, returns a new tensor.

Starts every data-parallel job (DDP broadcasts rank 0's parameters and buffers) and serves
pipeline and inference engines that fan one rank's state out.
"""

from __future__ import annotations

import torch

from tasks import _comm
from tasks.base import TaskContext, TaskSpec, Traffic, bus_factor
from tasks.collective._common import EXACT_OUTPUTS, EXACT_TOLERANCES, FLAT_SIZES

ROOT = 0

TASK = TaskSpec(
    id="broadcast",
    title="Broadcast (root 0)",
    family="collective",
    source="NCCL ncclBroadcast; torch.distributed.broadcast in DDP parameter sync",
    why="DDP start-up and weight refresh in RL/inference serving: one sender, bandwidth-bound when "
        "pipelined through a chain or tree.",
    sizes=FLAT_SIZES,
    dtypes=("float32", "bfloat16", "float16"),
    tolerances=EXACT_TOLERANCES,
    output_tolerances=EXACT_OUTPUTS,
)


def make_inputs(ctx: TaskContext) -> tuple[torch.Tensor]:
    return (ctx.randn(ctx.params["numel"]),)


def baseline(x: torch.Tensor) -> torch.Tensor:
    out = x.clone()
    _comm.broadcast(out, src=ROOT)
    return out


def reference(inputs_per_rank: list[tuple], ctx: TaskContext) -> list[torch.Tensor]:
    return [inputs_per_rank[ROOT][0].clone() for _ in inputs_per_rank]


def traffic(ctx: TaskContext) -> Traffic:
    # The root must send S bytes and every other rank receive S. A pipelined chain does just that
    # (inner ranks also forward S on their other link), so the floor is S / link bandwidth.
    # nccl-tests: algbw = busbw = S / time.
    size_bytes = ctx.params["numel"] * ctx.dtype.itemsize
    is_root = ctx.rank == ROOT
    many = ctx.world_size > 1
    return Traffic(
        send_bytes=size_bytes if (is_root and many) else 0,
        recv_bytes=0 if is_root else size_bytes,
        memory_bytes=2 * size_bytes,  # root: read x, write the copy; others: write what arrives (+ forward)
        payload_bytes=size_bytes, bus_factor=bus_factor("broadcast", ctx.world_size),
    )
