"""All-gather: every rank ends with every rank's block, concatenated in rank order.

Signature: all_gather(x: [m, k]) -> [n*m, k], rows r*m .. (r+1)*m-1 hold rank r's x.

FSDP / ZeRO-3 gather each layer's sharded parameters with it before the forward and backward
passes; Megatron-LM's sequence parallelism gathers activations along the sequence before a
column-parallel GEMM.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from tasks import _comm
from tasks.base import TaskContext, TaskSpec, Traffic, bus_factor
from tasks.collective._common import CHUNKED_SIZES, EXACT_OUTPUTS, EXACT_TOLERANCES

TASK = TaskSpec(
    id="all_gather",
    title="All-gather",
    family="collective",
    source="NCCL ncclAllGather; torch.distributed.all_gather_into_tensor in FSDP and Megatron-LM sequence parallelism",
    why="FSDP parameter gathering before every layer: on the critical path unless overlapped, "
        "bandwidth-bound for large layers.",
    sizes=CHUNKED_SIZES,
    dtypes=("float32", "bfloat16", "float16"),
    tolerances=EXACT_TOLERANCES,  # data movement only: bit-exact
    output_tolerances=EXACT_OUTPUTS,
)


def make_inputs(ctx: TaskContext) -> tuple[torch.Tensor]:
    return (ctx.randn(ctx.params["rows_per_rank"], ctx.params["cols"]),)


def baseline(x: torch.Tensor) -> torch.Tensor:
    n = dist.get_world_size()
    out = x.new_empty(n * x.shape[0], *x.shape[1:])
    _comm.all_gather_single(out, x)
    return out


def reference(inputs_per_rank: list[tuple], ctx: TaskContext) -> list[torch.Tensor]:
    gathered = torch.cat([inputs[0] for inputs in inputs_per_rank])
    return [gathered.clone() for _ in inputs_per_rank]


def traffic(ctx: TaskContext) -> Traffic:
    # Each rank holds a block of S bytes and must receive the other n-1 blocks: (n-1)*S in. In all,
    # n*(n-1)*S bytes arrive somewhere, so a balanced algorithm (ring, direct) also sends (n-1)*S.
    # nccl-tests: algbw = total output (n*S) / time, busbw = algbw * (n-1)/n.
    n = ctx.world_size
    block_bytes = ctx.params["rows_per_rank"] * ctx.params["cols"] * ctx.dtype.itemsize
    wire = (n - 1) * block_bytes
    return Traffic(
        send_bytes=wire, recv_bytes=wire,
        memory_bytes=block_bytes + n * block_bytes,  # read the block, write the whole output
        payload_bytes=n * block_bytes, bus_factor=bus_factor("all_gather", n),
    )
