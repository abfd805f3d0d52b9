"""All-to-all (equal splits): chunk j of rank i's input lands as chunk i of rank j's output.

Signature: all_to_all(x: [n*m, k]) -> [n*m, k]; rows j*m .. (j+1)*m-1 of rank i's x become rows
i*m .. (i+1)*m-1 of rank j's output. Uneven splits belong to the expert-parallel (MoE) tasks.

Ulysses sequence parallelism (DeepSpeed) swaps the sequence and head dimensions with it around
attention; expert parallelism dispatches tokens with it.
"""

from __future__ import annotations

import torch

from tasks import _comm
from tasks.base import TaskContext, TaskSpec, Traffic, bus_factor
from tasks.collective._common import CHUNKED_SIZES, EXACT_OUTPUTS, EXACT_TOLERANCES

TASK = TaskSpec(
    id="all_to_all",
    title="All-to-all (equal splits)",
    family="collective",
    source="NCCL send/recv all-to-all; torch.distributed.all_to_all_single in DeepSpeed-Ulysses",
    why="Ulysses attention does four per layer; it stresses every link at once instead of a ring.",
    sizes=CHUNKED_SIZES,  # rows_per_rank rows go to each peer: the input has world_size times more
    dtypes=("float32", "bfloat16", "float16"),
    tolerances=EXACT_TOLERANCES,
    output_tolerances=EXACT_OUTPUTS,
)


def make_inputs(ctx: TaskContext) -> tuple[torch.Tensor]:
    return (ctx.randn(ctx.world_size * ctx.params["rows_per_rank"], ctx.params["cols"]),)


def baseline(x: torch.Tensor) -> torch.Tensor:
    out = torch.empty_like(x)
    _comm.all_to_all_single(out, x)
    return out


def reference(inputs_per_rank: list[tuple], ctx: TaskContext) -> list[torch.Tensor]:
    m = ctx.params["rows_per_rank"]
    chunks = [inputs[0].split(m) for inputs in inputs_per_rank]  # chunks[i][j]: rank i -> rank j
    n = len(inputs_per_rank)
    return [torch.cat([chunks[i][j] for i in range(n)]) for j in range(n)]


def traffic(ctx: TaskContext) -> Traffic:
    # Each rank keeps its own chunk (S bytes) and exchanges the other n-1 with their owners:
    # (n-1)*S out and (n-1)*S in, whatever the algorithm.
    # nccl-tests: algbw = per-rank buffer (n*S) / time, busbw = algbw * (n-1)/n.
    n = ctx.world_size
    chunk_bytes = ctx.params["rows_per_rank"] * ctx.params["cols"] * ctx.dtype.itemsize
    wire = (n - 1) * chunk_bytes
    return Traffic(
        send_bytes=wire, recv_bytes=wire,
        memory_bytes=2 * n * chunk_bytes,  # read the input, write the output
        payload_bytes=n * chunk_bytes, bus_factor=bus_factor("all_to_all", n),
    )
