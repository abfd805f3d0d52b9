"""LayerNorm backward on sequence-sharded activations, weight gradients all-reduced.

Signature: sp_layernorm_backward(x_shard: [T/n, H], grad_out_shard: [T/n, H], gamma: [H])
           -> (grad_x_shard: [T/n, H], grad_gamma: [H] float32, grad_beta: [H] float32)

With sequence parallelism the LayerNorm's input and output gradients are split along the tokens
while gamma and beta are replicated: each rank computes grad_x for its own tokens (no
communication) and partial weight gradients sum(grad_out * x_hat) and sum(grad_out) over its
tokens; these are all-reduced over the group so every rank holds the gradients of all T tokens.
As Megatron's main_grad, the weight gradients are accumulated and reduced in float32; grad_x is
in the activations' dtype. LayerNorm epsilon 1e-5; mean and rstd are recomputed from x.
"""

from __future__ import annotations

import torch

from tasks import _comm
from tasks.base import TaskContext, TaskSpec, Tolerance, Traffic, accumulate_dtype, bus_factor

EPS = 1e-5

TASK = TaskSpec(
    id="sp_layernorm_backward",
    title="LayerNorm backward, sequence-sharded, weight-grad all-reduce",
    family="sequence",
    source="Megatron-LM sequence parallelism: LayerNorm weights marked sequence_parallel, their "
           "grads all-reduced over the tensor-parallel group (_allreduce_layernorm_grads / "
           "finalize_model_grads)",
    why="A small, latency-bound all-reduce per norm per layer in the backward pass, behind a "
        "memory-bound kernel: the case for fusing the reduction into the backward kernel's epilogue.",
    sizes={
        "small": {"tokens": 24, "hidden": 40},
        # 8k tokens of a 5120-wide model; large: 32k tokens of GPT-3 175B's 12288.
        "default": {"tokens": 8192, "hidden": 5120},
        "large": {"tokens": 32768, "hidden": 12288},
    },
    dtypes=("float32", "bfloat16"),
    # grad_gamma and grad_beta are sums over T tokens of O(1) terms, so O(sqrt(T)) ~ 180 at
    # T = 32768; float32 accumulation in another order (tree vs. blocked) differs by ~eps * log T
    # * sqrt(T) ~ 1e-4 absolute. grad_x is O(1): float32 errors ~1e-6; bf16 rounds it once
    # (2^-9 relative), and the bf16 inputs are exact in float32, so the weight gradients are as
    # accurate as in float32.
    tolerances={
        "float32": Tolerance(atol=2e-4, rtol=2e-5),
        "bfloat16": Tolerance(atol=1e-2, rtol=1e-2),
    },
    world_sizes=(1, 2, 4, 8),  # tokens split evenly, as Megatron requires
)


def make_inputs(ctx: TaskContext) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    p = ctx.params
    rows = p["tokens"] // ctx.world_size
    # Activations with a per-token offset and scale, so the normalisation has work to do.
    x = (ctx.randn(rows, p["hidden"], stream=0, dtype=torch.float32) * 2.0
         + ctx.randn(rows, 1, stream=1, dtype=torch.float32))
    grad_out = ctx.randn(rows, p["hidden"], stream=2)
    gamma = 1.0 + 0.1 * torch.randn(p["hidden"], generator=ctx.shared_generator(), device=ctx.device)
    return x.to(ctx.dtype), grad_out, gamma.to(ctx.dtype)


def baseline(
    x_shard: torch.Tensor, grad_out_shard: torch.Tensor, gamma: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    x = x_shard.to(accumulate_dtype(x_shard))
    dy = grad_out_shard.to(x.dtype)
    mean = x.mean(-1, keepdim=True)
    rstd = torch.rsqrt(x.var(-1, unbiased=False, keepdim=True) + EPS)
    x_hat = (x - mean) * rstd
    # Both weight gradients in one flat float32 buffer, one all-reduce (as Megatron flattens them).
    weight_grads = torch.cat([(dy * x_hat).sum(0), dy.sum(0)])
    _comm.all_reduce(weight_grads)
    grad_gamma, grad_beta = (g.clone() for g in weight_grads.chunk(2))
    dx_hat = dy * gamma.to(x.dtype)
    grad_x = rstd * (dx_hat - dx_hat.mean(-1, keepdim=True) - x_hat * (dx_hat * x_hat).mean(-1, keepdim=True))
    return grad_x.to(x_shard.dtype), grad_gamma, grad_beta


def reference(inputs_per_rank: list[tuple], ctx: TaskContext) -> list[tuple[torch.Tensor, ...]]:
    grad_gamma = grad_beta = 0.0
    grad_xs = []
    for x_shard, grad_out_shard, gamma in inputs_per_rank:
        x, dy = x_shard.double(), grad_out_shard.double()
        x_hat = (x - x.mean(-1, keepdim=True)) / torch.sqrt(x.var(-1, unbiased=False, keepdim=True) + EPS)
        grad_gamma = grad_gamma + (dy * x_hat).sum(0)
        grad_beta = grad_beta + dy.sum(0)
        # d/dx of gamma * x_hat + beta, written from the definition
        h = x.shape[-1]
        dx_hat = dy * gamma.double()
        std = torch.sqrt(x.var(-1, unbiased=False, keepdim=True) + EPS)
        grad_x = (h * dx_hat - dx_hat.sum(-1, keepdim=True)
                  - x_hat * (dx_hat * x_hat).sum(-1, keepdim=True)) / (h * std)
        grad_xs.append(grad_x.to(ctx.dtype))
    wide = accumulate_dtype(ctx.dtype)  # float32 (float64 for the truth)
    return [(gx, grad_gamma.to(wide), grad_beta.to(wide)) for gx in grad_xs]


def traffic(ctx: TaskContext) -> Traffic:
    # All-reduce of 2H float32 weight gradients: 2(n-1)/n * 8H bytes each way (tiny: latency
    # bound). Memory: read x and grad_out shards and gamma, write grad_x and the two gradients.
    # FLOPs: ~17 per element (mean, variance, x_hat, the two products and sums, grad_x's formula).
    p, n, b = ctx.params, ctx.world_size, ctx.dtype.itemsize
    hidden = p["hidden"]
    shard_elems = p["tokens"] // n * hidden
    grads_bytes = 2 * hidden * 4
    wire = 2 * (n - 1) * grads_bytes // n
    return Traffic(
        send_bytes=wire, recv_bytes=wire,
        memory_bytes=3 * shard_elems * b + hidden * b + grads_bytes + wire,
        flops=17 * shard_elems + (n - 1) * 2 * hidden // n,
        payload_bytes=grads_bytes, bus_factor=bus_factor("all_reduce", n),
    )
