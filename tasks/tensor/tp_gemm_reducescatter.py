"""GEMM + reduce-scatter: a row-parallel GEMM whose partial sums are scattered along the tokens.

Signature: tp_gemm_reducescatter(x_shard: [T, K/n], weight_shard: [N, K/n]) -> y_shard: [T/n, N]

The sequence-parallel counterpart of the row-parallel linear: rank r holds features
r*K/n .. (r+1)*K/n - 1 of x and the matching columns of the weight [N, K]; its GEMM gives a partial
[T, N]; a reduce-scatter sums the partials and leaves rank r tokens r*T/n .. (r+1)*T/n - 1 of
y = x @ weight.T, ready for the sequence-sharded norm and residual that follow.
"""

from __future__ import annotations

import math

import torch
import torch.distributed as dist
import torch.nn.functional as F

from tasks import _comm
from tasks.base import TaskContext, TaskSpec, Tolerance, Traffic, bus_factor

TASK = TaskSpec(
    id="tp_gemm_reducescatter",
    title="GEMM + reduce-scatter (sequence parallel)",
    family="tensor",
    source="Megatron-LM sequence parallelism (Korthikanti et al. 2022), RowParallelLinear with "
           "sequence_parallel=True; PyTorch async-TP fused_matmul_reduce_scatter",
    why="Replaces the all-reduce after attention-out and MLP-down projections with half the bytes; "
        "overlapping the scatter with the GEMM tiles that produce it is what fused kernels win.",
    sizes={
        "small": {"tokens": 24, "in_features": 56, "out_features": 40},
        # Llama-2-13B MLP down-projection over 4k tokens; large: Llama-3-70B's over 16k tokens.
        "default": {"tokens": 4096, "in_features": 13824, "out_features": 5120},
        "large": {"tokens": 16384, "in_features": 28672, "out_features": 8192},
    },
    dtypes=("float32", "bfloat16"),
    # As the row-parallel all-reduce: partials O(1/sqrt(n)), y O(1); fp32 K-term dot products;
    # bf16 rounds each partial once and each of the n-1 additions once, relative to O(1) sums.
    tolerances={
        "float32": Tolerance(atol=5e-5, rtol=1e-4),
        "bfloat16": Tolerance(atol=6e-2, rtol=2e-2),
    },
    world_sizes=(1, 2, 4, 8),  # tokens and in_features split evenly
)


def make_inputs(ctx: TaskContext) -> tuple[torch.Tensor, torch.Tensor]:
    p, n = ctx.params, ctx.world_size
    x_shard = ctx.randn(p["tokens"], p["in_features"] // n, stream=0)
    weight_shard = ctx.randn(p["out_features"], p["in_features"] // n, stream=1, dtype=torch.float32)
    # Outlier output features (the same on every rank), so int8 transport of the partials shows.
    weight_shard = weight_shard * ctx.outlier_scales(p["out_features"], 1, stream=1)
    return x_shard, (weight_shard / math.sqrt(p["in_features"])).to(ctx.dtype)


def baseline(x_shard: torch.Tensor, weight_shard: torch.Tensor) -> torch.Tensor:
    n = dist.get_world_size()
    partial = F.linear(x_shard, weight_shard)  # [T, N] over this rank's features
    y_shard = torch.empty((partial.shape[0] // n, partial.shape[1]), dtype=partial.dtype, device=partial.device)
    _comm.reduce_scatter_single(y_shard, partial)
    return y_shard


def reference(inputs_per_rank: list[tuple], ctx: TaskContext) -> list[torch.Tensor]:
    x = torch.cat([inputs[0].double() for inputs in inputs_per_rank], dim=1)
    weight = torch.cat([inputs[1].double() for inputs in inputs_per_rank], dim=1)
    y = (x @ weight.T).to(ctx.dtype)
    return list(y.chunk(ctx.world_size))


def traffic(ctx: TaskContext) -> Traffic:
    # Rank r's T/n x N rows need the other n-1 ranks' partials of them: (n-1)/n * T*N*b in, and
    # it owes each peer its partial of their rows: (n-1)/n * T*N*b out (reduce-scatter bound).
    # Memory: read the shards, write the partial (or stream it), read incoming partials, write y.
    p, n, b = ctx.params, ctx.world_size, ctx.dtype.itemsize
    tokens, k, n_out = p["tokens"], p["in_features"], p["out_features"]
    partial_bytes = tokens * n_out * b
    wire = (n - 1) * partial_bytes // n
    return Traffic(
        send_bytes=wire, recv_bytes=wire,
        memory_bytes=(tokens + n_out) * (k // n) * b + partial_bytes + wire + partial_bytes // n,
        flops=2 * tokens * (k // n) * n_out + (n - 1) * tokens * n_out // n,
        payload_bytes=partial_bytes, bus_factor=bus_factor("reduce_scatter", n),
    )
