"""Scatter from rank 0: rank r ends with chunk r of rank 0's tensor.

Signature: scatter(x: [n*m, k]) -> [m, k], rows r*m .. (r+1)*m-1 of rank 0's x. Every rank passes a
tensor of the same shape (non-root values are ignored); every rank, rank 0 too, returns a new tensor.

Handing one rank's data out in shards: a data loader on rank 0 feeding batches, rank 0 loading a
checkpoint and sharding it.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from tasks import _comm
from tasks.base import TaskContext, TaskSpec, Traffic, bus_factor
from tasks.collective._common import CHUNKED_SIZES, EXACT_OUTPUTS, EXACT_TOLERANCES

ROOT = 0

TASK = TaskSpec(
    id="scatter",
    title="Scatter (root 0)",
    family="collective",
    source="torch.distributed.scatter; NCCL send/recv scatter (nccl-tests scatter_perf)",
    why="One-to-many: the root's outgoing links are the bottleneck, every other link idles.",
    sizes=CHUNKED_SIZES,  # rows_per_rank is the output's rows; the input has world_size times more
    dtypes=("float32", "bfloat16", "float16"),
    tolerances=EXACT_TOLERANCES,
    output_tolerances=EXACT_OUTPUTS,
)


def make_inputs(ctx: TaskContext) -> tuple[torch.Tensor]:
    return (ctx.randn(ctx.world_size * ctx.params["rows_per_rank"], ctx.params["cols"]),)


def baseline(x: torch.Tensor) -> torch.Tensor:
    n = dist.get_world_size()
    out = x.new_empty(x.shape[0] // n, *x.shape[1:])
    chunks = list(x.split(out.shape[0])) if dist.get_rank() == ROOT else None
    _comm.scatter(out, chunks, src=ROOT)
    return out


def reference(inputs_per_rank: list[tuple], ctx: TaskContext) -> list[torch.Tensor]:
    chunks = inputs_per_rank[ROOT][0].split(ctx.params["rows_per_rank"])
    return [chunk.clone() for chunk in chunks]


def traffic(ctx: TaskContext) -> Traffic:
    # The root sends the n-1 foreign chunks (S bytes each); every other rank receives one.
    # nccl-tests: algbw = scattered size (n*S) / time, busbw = algbw * (n-1)/n.
    n = ctx.world_size
    chunk_bytes = ctx.params["rows_per_rank"] * ctx.params["cols"] * ctx.dtype.itemsize
    is_root = ctx.rank == ROOT
    return Traffic(
        send_bytes=(n - 1) * chunk_bytes if is_root else 0,
        recv_bytes=0 if is_root else chunk_bytes,
        memory_bytes=(n * chunk_bytes + chunk_bytes) if is_root else chunk_bytes,
        payload_bytes=n * chunk_bytes, bus_factor=bus_factor("scatter", n),
    )
