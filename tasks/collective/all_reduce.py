"""All-reduce (sum): every rank ends with the element-wise sum of every rank's tensor.

The collective behind data-parallel gradient averaging (DDP, FSDP's no-shard path) and behind the
row-parallel linear layers of tensor parallelism (Megatron-LM): the single most timed kernel of
multi-GPU training.
"""

from __future__ import annotations

import torch

from tasks import _comm
from tasks.base import TaskContext, TaskSpec, Traffic
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
    # Each rank holds S bytes. Any algorithm must get every other rank's contribution to each
    # element into this rank: the ring (reduce-scatter + all-gather) sends and receives
    # 2(n-1)/n * S per rank, which is the lower bound for bandwidth-optimal all-reduce.
    n = ctx.world_size
    size_bytes = ctx.params["numel"] * ctx.dtype.itemsize
    wire = 2 * (n - 1) * size_bytes // n
    return Traffic(
        send_bytes=wire, recv_bytes=wire,
        # read the input, write the output, read the n-1 incoming chunks twice (reduce, then store)
        memory_bytes=2 * size_bytes + 2 * wire,
        flops=(n - 1) * ctx.params["numel"] // n,
        payload_bytes=size_bytes, bus_factor=2 * (n - 1) / n,  # nccl-tests: 0 at one rank, like the others
    )
