"""Row-parallel linear + all-reduce of the partial outputs (Megatron-LM RowParallelLinear).

Signature: tp_row_linear_allreduce(x_shard: [T, K/n], weight_shard: [N, K/n], bias: [N]) -> y: [T, N]

The input arrives split along its features (it is the output of a column-parallel layer): rank r
holds columns r*K/n .. (r+1)*K/n - 1 of x and the matching columns of the weight [N, K]. Its GEMM
gives a partial y over its K/n features; the all-reduce sums the partials and the bias (the same on
every rank) is added after it, so every rank ends with y = x @ weight.T + bias.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from tasks import _comm
from tasks.base import TaskContext, TaskSpec, Tolerance, Traffic, bus_factor

TASK = TaskSpec(
    id="tp_row_linear_allreduce",
    title="Row-parallel linear + all-reduce",
    family="tensor",
    source="Megatron-LM core/tensor_parallel/layers.py RowParallelLinear(input_is_parallel=True), "
           "reduce_from_tensor_model_parallel_region",
    why="Closes every attention and MLP block in tensor parallelism: two [T, hidden] all-reduces "
        "per layer per pass, exposed unless overlapped with the GEMM.",
    sizes={
        "small": {"tokens": 13, "in_features": 56, "out_features": 40},
        # Llama-3-8B MLP down-projection over 4k tokens; large: Llama-3-70B's over 8k tokens.
        "default": {"tokens": 4096, "in_features": 14336, "out_features": 4096},
        "large": {"tokens": 8192, "in_features": 28672, "out_features": 8192},
    },
    dtypes=("float32", "bfloat16"),
    # Each partial is O(1/sqrt(n)) and y is O(1) (weights scaled by 1/sqrt(K)). fp32: K-term dot
    # products, ~sqrt(K) * 6e-8 ~ 1e-5 at K = 28672. bf16: each partial rounds once, then the sum
    # over n ranks rounds n-1 times relative to running sums of O(1), and the bias add once more:
    # ~(n+1) * 2^-9 * |running sum|, up to ~0.05 in the tails at n = 8.
    tolerances={
        "float32": Tolerance(atol=5e-5, rtol=1e-4),
        "bfloat16": Tolerance(atol=6e-2, rtol=2e-2),
    },
    world_sizes=(1, 2, 4, 8),  # in_features splits evenly, as Megatron requires
)


def make_inputs(ctx: TaskContext) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    p = ctx.params
    cols = p["in_features"] // ctx.world_size
    x_shard = ctx.randn(p["tokens"], cols, stream=0)
    weight_shard = ctx.randn(p["out_features"], cols, stream=1, dtype=torch.float32) / math.sqrt(p["in_features"])
    # Outlier output features (the same on every rank): the partial sums the ranks exchange then
    # have them too, and int8 transport of those partials shows (TaskContext.randn_outliers).
    weight_shard = weight_shard * ctx.outlier_scales(p["out_features"], 1, stream=1)
    bias = torch.randn(p["out_features"], generator=ctx.shared_generator(), device=ctx.device)
    return x_shard, weight_shard.to(ctx.dtype), bias.to(ctx.dtype)


def baseline(x_shard: torch.Tensor, weight_shard: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    partial = F.linear(x_shard, weight_shard)  # [T, N], this rank's K/n features only
    _comm.all_reduce(partial)
    return partial.add_(bias)  # bias after the reduction, so it is added once


def reference(inputs_per_rank: list[tuple], ctx: TaskContext) -> list[torch.Tensor]:
    x = torch.cat([inputs[0].double() for inputs in inputs_per_rank], dim=1)
    weight = torch.cat([inputs[1].double() for inputs in inputs_per_rank], dim=1)
    y = (x @ weight.T + inputs_per_rank[0][2].double()).to(ctx.dtype)
    return [y for _ in inputs_per_rank]


def traffic(ctx: TaskContext) -> Traffic:
    # All-reduce of the [T, N] partials: every rank needs every other rank's contribution to every
    # element, 2(n-1)/n * T*N*b each way (reduce-scatter + all-gather), the all-reduce bound.
    # Memory: read the x and weight shards, the bias, write y, read the incoming partial chunks.
    p, n, b = ctx.params, ctx.world_size, ctx.dtype.itemsize
    tokens, k, n_out = p["tokens"], p["in_features"], p["out_features"]
    y_bytes = tokens * n_out * b
    wire = 2 * (n - 1) * y_bytes // n
    return Traffic(
        send_bytes=wire, recv_bytes=wire,
        memory_bytes=(tokens + n_out) * (k // n) * b + n_out * b + y_bytes + wire,
        flops=2 * tokens * (k // n) * n_out + (n - 1) * tokens * n_out // n + tokens * n_out,
        payload_bytes=y_bytes, bus_factor=bus_factor("all_reduce", n),
    )
