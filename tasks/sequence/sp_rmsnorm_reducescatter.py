"""Reduce-scatter fused with residual add + RMSNorm (sequence-parallel block boundary).

Signature: sp_rmsnorm_reducescatter(partial: [T, H], residual_shard: [T/n, H], gamma: [H])
           -> (normed_shard: [T/n, H], residual_out_shard: [T/n, H])

After a row-parallel projection every rank holds a partial [T, H] (its share of the sum over the
tensor-parallel ranks). The reduce-scatter sums the partials and leaves rank r tokens
r*T/n .. (r+1)*T/n - 1; the residual stream shard is added (residual_out = sum + residual) and the
result normalised as Llama's RMSNorm does: float32 x * rsqrt(mean(x^2) + 1e-6), cast back, times
gamma. Both the new residual and the normed activations are returned (the next block needs both).
"""

from __future__ import annotations

import math

import torch
import torch.distributed as dist

from tasks import _comm
from tasks.base import TaskContext, TaskSpec, Tolerance, Traffic, accumulate_dtype, bus_factor

EPS = 1e-6

TASK = TaskSpec(
    id="sp_rmsnorm_reducescatter",
    title="Reduce-scatter + residual add + RMSNorm",
    family="sequence",
    source="Megatron-LM sequence parallelism (reduce_scatter_to_sequence_parallel_region before "
           "the norm); TensorRT-LLM / vLLM fused all-reduce + residual + RMSNorm kernels",
    why="Twice per layer the reduced activations go straight into a residual add and a norm; fusing "
        "the norm into the collective saves a full read and write of [T/n, H] and a kernel launch.",
    sizes={
        "small": {"tokens": 24, "hidden": 40},
        # 4k tokens of a 5120-wide model (Llama-2-13B); large: 16k tokens of GPT-3 175B's 12288.
        "default": {"tokens": 4096, "hidden": 5120},
        "large": {"tokens": 16384, "hidden": 12288},
    },
    dtypes=("float32", "bfloat16"),
    # The partials are O(1/sqrt(n)), their sum O(1) and residual_out O(sqrt(2)), up to ~6 in the
    # tails. bf16: n-1 roundings of running sums plus the residual add (~(n+1) * 2^-9 * 6 at worst
    # for n = 8); the norm divides that by rms ~ 1.4 and rounds once more. fp32: a few roundings.
    tolerances={
        "float32": Tolerance(atol=2e-5, rtol=2e-5),
        "bfloat16": Tolerance(atol=6e-2, rtol=2e-2),
    },
    world_sizes=(1, 2, 4, 8),  # tokens split evenly, as Megatron requires
)


def make_inputs(ctx: TaskContext) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    p, n = ctx.params, ctx.world_size
    # Outlier channels in the residual stream (as in LLMs), the same on every rank: int8 transport
    # of the partials shows (TaskContext.randn_outliers).
    channels = ctx.outlier_scales(p["hidden"], stream=0)
    partial = ctx.randn(p["tokens"], p["hidden"], stream=0, dtype=torch.float32) * channels / math.sqrt(n)
    residual_shard = (ctx.randn(p["tokens"] // n, p["hidden"], stream=1, dtype=torch.float32) * channels).to(ctx.dtype)
    # Norm weights are replicated and stay near 1 in trained models.
    gamma = 1.0 + 0.1 * torch.randn(p["hidden"], generator=ctx.shared_generator(), device=ctx.device)
    return partial.to(ctx.dtype), residual_shard, gamma.to(ctx.dtype)


def baseline(
    partial: torch.Tensor, residual_shard: torch.Tensor, gamma: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    n = dist.get_world_size()
    reduced = torch.empty((partial.shape[0] // n, partial.shape[1]), dtype=partial.dtype, device=partial.device)
    _comm.reduce_scatter_single(reduced, partial)
    residual_out = reduced.add_(residual_shard)
    x = residual_out.to(accumulate_dtype(residual_out))
    normed = (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + EPS)).to(partial.dtype) * gamma
    return normed, residual_out


def reference(inputs_per_rank: list[tuple], ctx: TaskContext) -> list[tuple[torch.Tensor, torch.Tensor]]:
    total = torch.stack([inputs[0].double() for inputs in inputs_per_rank]).sum(0)
    out = []
    for shard, inputs in zip(total.chunk(ctx.world_size), inputs_per_rank):
        residual_out = shard + inputs[1].double()
        normed = residual_out * torch.rsqrt(residual_out.pow(2).mean(-1, keepdim=True) + EPS) * inputs[2].double()
        out.append((normed.to(ctx.dtype), residual_out.to(ctx.dtype)))
    return out


def traffic(ctx: TaskContext) -> Traffic:
    """The least a rank moves for reduce-scatter + residual add + RMSNorm of its rows.

    Wire: rank r needs the other n-1 partials of its T/n rows, (n-1)/n * T*H*b in, and owes each
    peer its partial of theirs, (n-1)/n * T*H*b out.
    Memory, the minimum: its [T, H] partial read once (its own rows by itself, the others by the
    peer that pulls them into registers to add), the residual shard and gamma read, two shards
    written. Incoming chunks need not be staged (the former model read them again: "+ wire").
    FLOPs: the n-1 adds per owned element, then add, square, mean, scale and gamma (~5 each).
    """
    p, n, b = ctx.params, ctx.world_size, ctx.dtype.itemsize
    tokens, hidden = p["tokens"], p["hidden"]
    partial_bytes = tokens * hidden * b
    wire = (n - 1) * partial_bytes // n
    shard_elems = tokens * hidden // n
    return Traffic(
        send_bytes=wire, recv_bytes=wire,
        memory_bytes=partial_bytes + 3 * shard_elems * b + hidden * b,
        flops=(n - 1) * shard_elems + 5 * shard_elems,
        payload_bytes=partial_bytes, bus_factor=bus_factor("reduce_scatter", n),
    )
