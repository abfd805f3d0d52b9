"""All-reduce (sum): every rank ends with the element-wise sum of every rank's tensor.

The collective behind data-parallel gradient averaging (DDP, FSDP's no-shard path) and behind the
row-parallel linear layers of tensor parallelism (Megatron-LM): the single most timed kernel of
multi-GPU training.
"""

from __future__ import annotations

import torch

from tasks import _comm
from tasks.base import TaskContext, TaskSpec, Traffic, bus_factor
from tasks.collective._common import FLAT_SIZES, SUM_OVER_RANKS_TOLERANCES

TASK = TaskSpec(
    id="all_reduce",
    title="All-reduce (sum)",
    family="collective",
    source="NCCL ncclAllReduce; torch.distributed.all_reduce in DDP and Megatron-LM row-parallel layers",
    why="Gradient averaging and tensor-parallel partial sums: bandwidth-bound at large sizes, "
        "latency-bound at small ones.",
    sizes=FLAT_SIZES,  # odd on purpose: chunking bugs hide behind powers of two
    dtypes=("float32", "bfloat16", "float16"),
    tolerances=SUM_OVER_RANKS_TOLERANCES,  # derived and measured in _common.py
)


def make_inputs(ctx: TaskContext) -> tuple[torch.Tensor]:
    return (ctx.randn_outliers(ctx.params["numel"]),)  # outlier elements: int8 transport shows


def baseline(x: torch.Tensor) -> torch.Tensor:
    out = x.clone()
    _comm.all_reduce(out)
    return out


def reference(inputs_per_rank: list[tuple], ctx: TaskContext) -> list[torch.Tensor]:
    total = torch.stack([inputs[0].double() for inputs in inputs_per_rank]).sum(0)
    return [total.to(ctx.dtype) for _ in inputs_per_rank]


def traffic(ctx: TaskContext) -> Traffic:
    """The least a rank moves for an all-reduce of S bytes per rank.

    Wire: every element's sum needs the other ranks' contributions; reduce-scatter + all-gather
    sends and receives 2(n-1)/n * S per rank, the lower bound of a bandwidth-optimal all-reduce.
    Memory: 2S, the input read once and the output written once. That is the minimum, and it is
    reachable: a kernel that pulls its chunk of the peers' inputs over the links into registers,
    adds, and stores the sum straight into every rank's output stages nothing, so each byte of a
    rank's HBM is read (by itself or by the one peer that reduces that chunk) or written once.
    (The former model added 2 x wire for staged incoming chunks: what NCCL's ring moves, 2-2.75x
    the minimum.)
    """
    n = ctx.world_size
    size_bytes = ctx.params["numel"] * ctx.dtype.itemsize
    wire = 2 * (n - 1) * size_bytes // n
    return Traffic(
        send_bytes=wire, recv_bytes=wire,
        memory_bytes=2 * size_bytes,
        flops=(n - 1) * ctx.params["numel"] // n,
        payload_bytes=size_bytes, bus_factor=bus_factor("all_reduce", n),
    )
