"""Reduce (sum) to rank 0: rank 0 ends with the element-wise sum of every rank's tensor.

Signature: reduce(x: [numel]) -> on rank 0 a new [numel] tensor holding the sum over ranks; on every
other rank an empty tensor of shape [0] (same dtype and device). Non-root ranks have no result in
NCCL's reduce; returning an empty tensor keeps the output well-defined and comparable on every rank
without making them pay for a copy.

Used where one rank owns the result: gradient accumulation onto a parameter server or pipeline
stage, loss and metric totals, the first half of a reduce + broadcast all-reduce.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from tasks import _comm
from tasks.base import TaskContext, TaskSpec, Traffic, bus_factor
from tasks.collective._common import FLAT_SIZES, SUM_OVER_RANKS_TOLERANCES

ROOT = 0

TASK = TaskSpec(
    id="reduce",
    title="Reduce (sum, root 0)",
    family="collective",
    source="NCCL ncclReduce; torch.distributed.reduce",
    why="One-owner reductions (metrics, parameter-server updates): the mirror of broadcast, "
        "bandwidth-bound when pipelined through a chain or tree.",
    sizes=FLAT_SIZES,
    dtypes=("float32", "bfloat16", "float16"),
    tolerances=SUM_OVER_RANKS_TOLERANCES,
)


def make_inputs(ctx: TaskContext) -> tuple[torch.Tensor]:
    return (ctx.randn_outliers(ctx.params["numel"]),)  # outlier elements: int8 transport shows


def baseline(x: torch.Tensor) -> torch.Tensor:
    out = x.clone()  # torch reduces in place and may use non-root buffers as scratch
    _comm.reduce(out, dst=ROOT)
    return out if dist.get_rank() == ROOT else x.new_empty(0)


def reference(inputs_per_rank: list[tuple], ctx: TaskContext) -> list[torch.Tensor]:
    total = torch.stack([inputs[0].double() for inputs in inputs_per_rank]).sum(0).to(ctx.dtype)
    return [total if rank == ROOT else inputs[0].new_empty(0) for rank, inputs in enumerate(inputs_per_rank)]


def traffic(ctx: TaskContext) -> Traffic:
    # Every non-root rank's contribution must leave it (S bytes, alone or summed with others) and
    # the root must receive at least S. A pipelined chain does just that, so the floor is
    # S / link bandwidth. nccl-tests: algbw = busbw = S / time.
    n = ctx.world_size
    numel = ctx.params["numel"]
    size_bytes = numel * ctx.dtype.itemsize
    is_root = ctx.rank == ROOT
    return Traffic(
        send_bytes=0 if is_root else size_bytes,
        recv_bytes=size_bytes if (is_root and n > 1) else 0,
        # root: read its input and what arrives (nothing at n=1), write the sum; others: read their input
        memory_bytes=(3 if n > 1 else 2) * size_bytes if is_root else size_bytes,
        flops=(n - 1) * numel // n,  # the (n-1)*numel additions, spread over the ranks
        payload_bytes=size_bytes, bus_factor=bus_factor("reduce", n),
    )
