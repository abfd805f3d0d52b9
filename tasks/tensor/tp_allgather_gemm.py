"""All-gather + GEMM: the sequence-parallel input gathered, then a column-parallel GEMM.

Signature: tp_allgather_gemm(x_shard: [T/n, K], weight_shard: [N/n, K]) -> y_shard: [T, N/n]

With Megatron's sequence parallelism the activations between blocks are split along the tokens:
rank r holds tokens r*T/n .. (r+1)*T/n - 1. Before a column-parallel linear (QKV or MLP
up-projection) they are all-gathered into the full [T, K] and multiplied by the rank's rows of the
weight [N, K], giving this rank's N/n output columns for all T tokens.
"""

from __future__ import annotations

import math

import torch
import torch.distributed as dist
import torch.nn.functional as F

from tasks import _comm
from tasks.base import TaskContext, TaskSpec, Tolerance, Traffic, bus_factor

TASK = TaskSpec(
    id="tp_allgather_gemm",
    title="All-gather (sequence parallel) + GEMM",
    family="tensor",
    source="Megatron-LM sequence parallelism (Korthikanti et al. 2022), ColumnParallelLinear with "
           "sequence_parallel=True; PyTorch async-TP fused_all_gather_matmul; TransformerEngine userbuffers",
    why="The gather sits right before the layer's largest GEMM; overlapping it chunk by chunk with "
        "the GEMM (async TP, userbuffers) is the classic fused communication kernel.",
    sizes={
        "small": {"tokens": 24, "in_features": 40, "out_features": 56},
        # Llama-2-13B hidden/FFN over 4k tokens; large: Llama-3-70B over 16k tokens.
        "default": {"tokens": 4096, "in_features": 5120, "out_features": 13824},
        "large": {"tokens": 16384, "in_features": 8192, "out_features": 28672},
    },
    dtypes=("float32", "bfloat16"),
    # y is O(1) (weights scaled by 1/sqrt(K)). fp32: K-term dot products, ~sqrt(K) * 6e-8.
    # bf16: fp32 accumulation, one rounding of the output (2^-9 relative) - gathering is exact.
    tolerances={
        "float32": Tolerance(atol=5e-5, rtol=1e-4),
        "bfloat16": Tolerance(atol=1e-2, rtol=1e-2),
    },
    world_sizes=(1, 2, 4, 8),  # tokens and out_features split evenly
)


def make_inputs(ctx: TaskContext) -> tuple[torch.Tensor, torch.Tensor]:
    p, n = ctx.params, ctx.world_size
    x_shard = ctx.randn(p["tokens"] // n, p["in_features"], stream=0)
    weight_shard = ctx.randn(p["out_features"] // n, p["in_features"], stream=1, dtype=torch.float32)
    return x_shard, (weight_shard / math.sqrt(p["in_features"])).to(ctx.dtype)


def baseline(x_shard: torch.Tensor, weight_shard: torch.Tensor) -> torch.Tensor:
    n = dist.get_world_size()
    x = torch.empty((n * x_shard.shape[0], x_shard.shape[1]), dtype=x_shard.dtype, device=x_shard.device)
    _comm.all_gather_single(x, x_shard)
    return F.linear(x, weight_shard)


def reference(inputs_per_rank: list[tuple], ctx: TaskContext) -> list[torch.Tensor]:
    x = torch.cat([inputs[0].double() for inputs in inputs_per_rank])
    return [(x @ inputs[1].double().T).to(ctx.dtype) for inputs in inputs_per_rank]


def traffic(ctx: TaskContext) -> Traffic:
    # Every rank needs the other n-1 token shards of x: (n-1)/n * T*K*b in; the ranks together
    # send what they receive, (n-1)/n * T*K*b out each on a ring. Memory: read x (own shard and
    # the incoming ones, which are also written once) and the weight shard, write y_shard.
    p, n, b = ctx.params, ctx.world_size, ctx.dtype.itemsize
    tokens, k, n_out = p["tokens"], p["in_features"], p["out_features"]
    x_bytes = tokens * k * b
    wire = (n - 1) * x_bytes // n
    return Traffic(
        send_bytes=wire, recv_bytes=wire,
        memory_bytes=x_bytes + wire + (n_out // n) * k * b + tokens * (n_out // n) * b,
        flops=2 * tokens * k * (n_out // n),
        payload_bytes=x_bytes, bus_factor=bus_factor("all_gather", n),
    )
