"""Gather to rank 0: rank 0 ends with every rank's block, concatenated in rank order.

Signature: gather(x: [m, k]) -> on rank 0 a new [n*m, k] tensor (rows r*m .. (r+1)*m-1 hold rank r's
x); on every other rank an empty tensor of shape [0, k] (same dtype and device), so the output is
well-defined and comparable on every rank.

Collecting per-rank results on one rank: evaluation outputs, checkpoint shards written by rank 0,
sampled tokens in inference.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from tasks import _comm
from tasks.base import TaskContext, TaskSpec, Traffic, bus_factor
from tasks.collective._common import CHUNKED_SIZES, EXACT_OUTPUTS, EXACT_TOLERANCES

ROOT = 0

TASK = TaskSpec(
    id="gather",
    title="Gather (root 0)",
    family="collective",
    source="torch.distributed.gather; NCCL send/recv gather (nccl-tests gather_perf)",
    why="Many-to-one: the root's incoming links are the bottleneck, every other link idles.",
    sizes=CHUNKED_SIZES,
    dtypes=("float32", "bfloat16", "float16"),
    tolerances=EXACT_TOLERANCES,
    output_tolerances=EXACT_OUTPUTS,
)


def make_inputs(ctx: TaskContext) -> tuple[torch.Tensor]:
    return (ctx.randn(ctx.params["rows_per_rank"], ctx.params["cols"]),)


def baseline(x: torch.Tensor) -> torch.Tensor:
    n = dist.get_world_size()
    if dist.get_rank() != ROOT:
        _comm.gather(x, None, dst=ROOT)
        return x.new_empty(0, *x.shape[1:])
    out = x.new_empty(n * x.shape[0], *x.shape[1:])
    _comm.gather(x, list(out.split(x.shape[0])), dst=ROOT)  # contiguous row blocks of out
    return out


def reference(inputs_per_rank: list[tuple], ctx: TaskContext) -> list[torch.Tensor]:
    gathered = torch.cat([inputs[0] for inputs in inputs_per_rank])
    return [
        gathered if rank == ROOT else inputs[0].new_empty(0, *inputs[0].shape[1:])
        for rank, inputs in enumerate(inputs_per_rank)
    ]


def traffic(ctx: TaskContext) -> Traffic:
    # Every non-root rank sends its block (S bytes); the root receives the other n-1 blocks.
    # nccl-tests: algbw = gathered size (n*S) / time, busbw = algbw * (n-1)/n.
    n = ctx.world_size
    block_bytes = ctx.params["rows_per_rank"] * ctx.params["cols"] * ctx.dtype.itemsize
    is_root = ctx.rank == ROOT
    return Traffic(
        send_bytes=0 if is_root else block_bytes,
        recv_bytes=(n - 1) * block_bytes if is_root else 0,
        memory_bytes=(block_bytes + n * block_bytes) if is_root else block_bytes,
        payload_bytes=n * block_bytes, bus_factor=bus_factor("gather", n),
    )
