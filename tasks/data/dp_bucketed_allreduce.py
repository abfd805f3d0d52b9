"""Bucketed DDP gradient all-reduce: gradients of odd sizes flattened into buckets and averaged.

Signature: dp_bucketed_allreduce(*grads: 13 tensors, one transformer block's parameter gradients)
           -> tuple of 13 tensors, each the average over ranks of that gradient

As torch DDP's Reducer does it: the gradients are assigned to buckets in reverse order (the order
backward produces them), the first bucket closing at 1 MiB and the others at 25 MiB
(bucket_cap_mb); each bucket is one flat buffer, divided by the world size and all-reduced, and
its slices copied back out. The gradients are those of a pre-norm transformer block (QKV,
projection, two norms, two MLP linears, biases) plus a one-element logit scale.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from tasks import _comm
from tasks.base import TaskContext, TaskSpec, Tolerance, Traffic, bus_factor

FIRST_BUCKET_CAP_BYTES = 1 * 2**20  # torch.distributed._DEFAULT_FIRST_BUCKET_BYTES
BUCKET_CAP_BYTES = 25 * 2**20  # DDP's default bucket_cap_mb

TASK = TaskSpec(
    id="dp_bucketed_allreduce",
    title="Bucketed DDP gradient all-reduce (average)",
    family="data",
    source="PyTorch DistributedDataParallel Reducer (torch/csrc/distributed/c10d/reducer.cpp, "
           "compute_bucket_assignment_by_size, default allreduce comm hook)",
    why="The data-parallel step's communication: ~2x the model's gradient bytes per rank per step, "
        "bucketed so the all-reduces overlap the rest of backward; packing and unpacking the "
        "buckets is memory traffic a fused kernel can avoid.",
    sizes={
        "small": {"hidden": 12, "ffn": 31},
        # A 2560-wide block (61.6M parameters, ~10 buckets in float32); large: 5120-wide (246M).
        "default": {"hidden": 2560, "ffn": 6912},
        "large": {"hidden": 5120, "ffn": 13824},
    },
    dtypes=("float32", "bfloat16"),
    # Averages of n randn values, O(1/sqrt(n)). fp32: the pre-division and n-1 additions, a few
    # ulps. bf16: the pre-division rounds each term (2^-9), then n-1 roundings of running sums
    # (DDP all-reduces bf16 gradients in bf16).
    tolerances={
        "float32": Tolerance(atol=1e-5, rtol=1e-5),
        "bfloat16": Tolerance(atol=2e-2, rtol=2e-2),
    },
)


def _grad_shapes(hidden: int, ffn: int) -> list[tuple[int, ...]]:
    return [
        (3 * hidden, hidden), (3 * hidden,),  # qkv weight, bias
        (hidden, hidden), (hidden,),  # attention out projection
        (hidden,), (hidden,),  # first norm
        (ffn, hidden), (ffn,),  # MLP up
        (hidden, ffn), (hidden,),  # MLP down
        (hidden,), (hidden,),  # second norm
        (1,),  # logit scale
    ]


def make_inputs(ctx: TaskContext) -> tuple[torch.Tensor, ...]:
    shapes = _grad_shapes(ctx.params["hidden"], ctx.params["ffn"])
    return tuple(ctx.randn_outliers(*shape, stream=i) for i, shape in enumerate(shapes))  # gradients with outliers


def bucket_assignment(grads: tuple[torch.Tensor, ...]) -> list[list[int]]:
    """Indices of the gradients in each bucket, in reverse order, closing a bucket at its cap."""
    buckets: list[list[int]] = []
    current: list[int] = []
    current_bytes, cap = 0, FIRST_BUCKET_CAP_BYTES
    for index in reversed(range(len(grads))):
        current.append(index)
        current_bytes += grads[index].numel() * grads[index].element_size()
        if current_bytes >= cap:
            buckets.append(current)
            current, current_bytes, cap = [], 0, BUCKET_CAP_BYTES
    if current:
        buckets.append(current)
    return buckets


def baseline(*grads: torch.Tensor) -> tuple[torch.Tensor, ...]:
    n = dist.get_world_size()
    averaged: list[torch.Tensor | None] = [None] * len(grads)
    for bucket in bucket_assignment(grads):
        flat = torch.cat([grads[i].reshape(-1) for i in bucket])
        flat.div_(n)  # DDP's allreduce hook divides first, then sums
        _comm.all_reduce(flat)
        for i, piece in zip(bucket, flat.split([grads[i].numel() for i in bucket])):
            averaged[i] = piece.view_as(grads[i]).clone()  # the copy back into .grad
    return tuple(averaged)


def reference(inputs_per_rank: list[tuple], ctx: TaskContext) -> list[tuple[torch.Tensor, ...]]:
    n = ctx.world_size
    mean = tuple(
        (sum(inputs[i].double() for inputs in inputs_per_rank) / n).to(ctx.dtype)
        for i in range(len(inputs_per_rank[0]))
    )
    return [mean for _ in inputs_per_rank]


def traffic(ctx: TaskContext) -> Traffic:
    """The least a rank moves to average S bytes of gradients.

    Wire: an all-reduce of S, 2(n-1)/n * S each way, bucketing or not.
    Memory, the minimum (as all_reduce's): the gradients read once and the averages written once,
    2S; the reduction happens in registers as peers' chunks are pulled, so nothing is staged (the
    baseline's flatten and copy-back add 2S of its own, its staged chunks another 2(n-1)/n * S).
    FLOPs: a division and (n-1)/n adds per element.
    """
    n, b = ctx.world_size, ctx.dtype.itemsize
    numel = sum(torch.Size(s).numel() for s in _grad_shapes(ctx.params["hidden"], ctx.params["ffn"]))
    size_bytes = numel * b
    wire = 2 * (n - 1) * size_bytes // n
    return Traffic(
        send_bytes=wire, recv_bytes=wire,
        memory_bytes=2 * size_bytes,
        flops=numel + (n - 1) * numel // n,
        payload_bytes=size_bytes, bus_factor=bus_factor("all_reduce", n),
    )
