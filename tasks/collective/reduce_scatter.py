"""Reduce-scatter (sum): rank r ends with the sum over ranks of chunk r of their inputs.

Signature: reduce_scatter(x: [n*m, k]) -> [m, k], the sum over ranks of rows r*m .. (r+1)*m-1.

FSDP / ZeRO-2/3 reduce-scatter gradients so each rank keeps only its shard; Megatron-LM's sequence
parallelism replaces the row-parallel all-reduce with it.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from tasks import _comm
from tasks.base import TaskContext, TaskSpec, Traffic, bus_factor
from tasks.collective._common import CHUNKED_SIZES, SUM_OVER_RANKS_TOLERANCES

TASK = TaskSpec(
    id="reduce_scatter",
    title="Reduce-scatter (sum)",
    family="collective",
    source="NCCL ncclReduceScatter; torch.distributed.reduce_scatter_tensor in FSDP gradient sharding",
    why="FSDP/ZeRO gradient reduction after every backward layer: half of an all-reduce's traffic, "
        "on the critical path of the optimizer step.",
    sizes=CHUNKED_SIZES,  # rows_per_rank is the output's rows; the input has world_size times more
    dtypes=("float32", "bfloat16", "float16"),
    tolerances=SUM_OVER_RANKS_TOLERANCES,
)


def make_inputs(ctx: TaskContext) -> tuple[torch.Tensor]:
    return (ctx.randn_outliers(ctx.world_size * ctx.params["rows_per_rank"], ctx.params["cols"]),)  # see randn_outliers


def baseline(x: torch.Tensor) -> torch.Tensor:
    n = dist.get_world_size()
    out = x.new_empty(x.shape[0] // n, *x.shape[1:])
    _comm.reduce_scatter_single(out, x)
    return out


def reference(inputs_per_rank: list[tuple], ctx: TaskContext) -> list[torch.Tensor]:
    total = torch.stack([inputs[0].double() for inputs in inputs_per_rank]).sum(0)
    chunks = total.split(ctx.params["rows_per_rank"])
    return [chunk.to(ctx.dtype) for chunk in chunks]


def traffic(ctx: TaskContext) -> Traffic:
    """The least a rank moves for a reduce-scatter of n chunks of S bytes.

    Wire: each rank's n-1 foreign chunks must leave it, alone or already summed with others: at
    least (n-1)*S out, and as many in on balance (the ring does exactly that). nccl-tests: algbw =
    input size (n*S) / time, busbw = algbw * (n-1)/n.
    Memory, the minimum: the input read once (n*S: each chunk by itself or by the one peer that
    pulls it over the link into registers to add it) and the output written once (S). Staging the
    incoming chunks (the former "+ wire") is an algorithm's choice, not needed.
    """
    n = ctx.world_size
    chunk_elems = ctx.params["rows_per_rank"] * ctx.params["cols"]
    chunk_bytes = chunk_elems * ctx.dtype.itemsize
    wire = (n - 1) * chunk_bytes
    return Traffic(
        send_bytes=wire, recv_bytes=wire,
        memory_bytes=n * chunk_bytes + chunk_bytes,
        flops=(n - 1) * chunk_elems,
        payload_bytes=n * chunk_bytes, bus_factor=bus_factor("reduce_scatter", n),
    )
