"""Column-parallel linear + all-gather of the outputs (Megatron-LM, gather_output=True).

Signature: tp_column_linear_allgather(x: [T, K], weight_shard: [N/n, K], bias_shard: [N/n]) -> y: [T, N]

Every tensor-parallel rank holds the same input x (the replicated output of the layer before) and
rows r*N/n .. (r+1)*N/n - 1 of the full weight [N, K] and bias [N]. It computes its columns of the
output, x @ weight_shard.T + bias_shard, and an all-gather along the last dimension gives every
rank the whole y = x @ weight.T + bias.
"""

from __future__ import annotations

import math

import torch
import torch.distributed as dist
import torch.nn.functional as F

from tasks import _comm
from tasks.base import TaskContext, TaskSpec, Tolerance, Traffic, bus_factor

TASK = TaskSpec(
    id="tp_column_linear_allgather",
    title="Column-parallel linear + all-gather of outputs",
    family="tensor",
    source="Megatron-LM core/tensor_parallel/layers.py ColumnParallelLinear(gather_output=True), "
           "gather_from_tensor_model_parallel_region",
    why="Used where the next op needs every output column (an un-sharded LM head, a non-parallel "
        "consumer): the all-gather of [T, N] activations follows the GEMM and cannot start before it.",
    sizes={
        "small": {"tokens": 13, "in_features": 40, "out_features": 56},
        # Llama-3-8B MLP up-projection over 4k tokens; large: Llama-3-70B's over 8k tokens.
        "default": {"tokens": 4096, "in_features": 4096, "out_features": 14336},
        "large": {"tokens": 8192, "in_features": 8192, "out_features": 28672},
    },
    dtypes=("float32", "bfloat16"),
    # Outputs are O(1) (weights scaled by 1/sqrt(K)). fp32: a K-term dot product accumulates
    # ~sqrt(K) * 6e-8 of rounding, ~1e-5 at K = 8192. bf16: the GEMM accumulates in fp32 and rounds
    # once (2^-9 relative), the bias add rounds again, relative to |x @ w| which can exceed |y|.
    tolerances={
        "float32": Tolerance(atol=5e-5, rtol=1e-4),
        "bfloat16": Tolerance(atol=2e-2, rtol=1e-2),
    },
    world_sizes=(1, 2, 4, 8),  # out_features splits evenly, as Megatron requires
)


def make_inputs(ctx: TaskContext) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    p = ctx.params
    rows = p["out_features"] // ctx.world_size
    # The same x on every rank; this rank's own slice of the weight and bias.
    x = torch.randn(p["tokens"], p["in_features"], generator=ctx.shared_generator(), device=ctx.device)
    weight_shard = ctx.randn(rows, p["in_features"], stream=0, dtype=torch.float32) / math.sqrt(p["in_features"])
    bias_shard = ctx.randn(rows, stream=1)
    return x.to(ctx.dtype), weight_shard.to(ctx.dtype), bias_shard


def baseline(x: torch.Tensor, weight_shard: torch.Tensor, bias_shard: torch.Tensor) -> torch.Tensor:
    n = dist.get_world_size()
    local = F.linear(x, weight_shard, bias_shard)  # [T, N/n]
    gathered = torch.empty((n * local.shape[0], local.shape[1]), dtype=local.dtype, device=local.device)
    _comm.all_gather_single(gathered, local)
    # [n, T, N/n] -> [T, N]: Megatron's torch.cat(tensor_list, dim=-1)
    return gathered.view(n, *local.shape).permute(1, 0, 2).reshape(local.shape[0], -1)


def reference(inputs_per_rank: list[tuple], ctx: TaskContext) -> list[torch.Tensor]:
    x = inputs_per_rank[0][0].double()
    weight = torch.cat([inputs[1].double() for inputs in inputs_per_rank])
    bias = torch.cat([inputs[2].double() for inputs in inputs_per_rank])
    y = (x @ weight.T + bias).to(ctx.dtype)
    return [y for _ in inputs_per_rank]


def traffic(ctx: TaskContext) -> Traffic:
    # Each rank computes T x N/n of y and must receive the other n-1 slices: (n-1)/n * T*N*b in.
    # Every slice has to reach n-1 ranks, so the ranks together send what they receive; a ring
    # spreads it evenly: (n-1)/n * T*N*b out. Memory: read x, the weight and bias slices, write y.
    p, n, b = ctx.params, ctx.world_size, ctx.dtype.itemsize
    tokens, k, n_out = p["tokens"], p["in_features"], p["out_features"]
    y_bytes = tokens * n_out * b
    wire = (n - 1) * y_bytes // n
    return Traffic(
        send_bytes=wire, recv_bytes=wire,
        memory_bytes=(tokens * k + (n_out // n) * (k + 1)) * b + y_bytes,
        flops=2 * tokens * k * (n_out // n) + tokens * (n_out // n),
        payload_bytes=y_bytes, bus_factor=bus_factor("all_gather", n),
    )
