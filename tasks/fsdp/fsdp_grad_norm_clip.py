"""Global gradient-norm clipping over sharded gradients (FSDP clip_grad_norm_).

Signature: fsdp_grad_norm_clip(*grad_shards: [L_i]) -> (total_norm: [] float32, *clipped: [L_i])

Each of the k gradients (global sizes in params["numels"]) is sharded FSDP2-style (torch.chunk):
rank r holds elements r*C .. min((r+1)*C, N)-1 with C = ceil(N / n), so the last ranks hold fewer,
possibly none. Each rank: the float32 norm of its shards, squared, all-reduced (sum), square root;
clip coefficient min(1, MAX_NORM / (total_norm + 1e-6)); every shard scaled by it (new tensors).
Gradients are drawn so the global norm is ~2: clipping always acts, as in a loss spike.
"""

from __future__ import annotations

import math

import torch

from tasks import _comm
from tasks.base import TaskContext, TaskSpec, Tolerance, Traffic, accumulate_dtype, bus_factor

MAX_NORM = 1.0


def _layer_stack(vocab: int, hidden: int, kv_hidden: int, ffn: int, layers: int) -> list[int]:
    """A Llama-style model's gradients grouped in flat buffers (embedding, attention, MLP, norms) and
    one tiny odd-sized tensor, so some ranks hold an empty shard."""
    return [
        vocab * hidden,
        layers * (2 * hidden * hidden + 2 * hidden * kv_hidden),
        layers * 3 * hidden * ffn,
        (2 * layers + 1) * hidden,
        7,
    ]


TASK = TaskSpec(
    id="fsdp_grad_norm_clip",
    title="Global gradient-norm clipping over FSDP shards",
    family="fsdp",
    source="PyTorch FSDP FullyShardedDataParallel.clip_grad_norm_ and torch.nn.utils.clip_grad_norm_ "
           "on FSDP2 DTensors; DeepSpeed ZeRO's clip_grad",
    why="The norm needs every rank's shards: one tiny all-reduce sits between the backward pass and "
        "the optimizer step, so its latency (not bandwidth) is on the critical path of every step.",
    sizes={
        "small": {"numels": [67 * 45, 45, 1001, 5, 7]},
        # Llama-3.2-1B- and 3B-shaped gradients (1.2B and 3.2B elements).
        "default": {"numels": _layer_stack(128256, 2048, 512, 8192, 16)},
        "large": {"numels": _layer_stack(128256, 3072, 1024, 8192, 28)},
    },
    dtypes=("float32", "bfloat16"),
    # The norm is a float32 sum of squares (relative error ~1e-6 even over 1e9 terms, pairwise);
    # clipped values are one product rounded to the dtype, with the coefficient itself rounded to it
    # (as FSDP does): two results rounded differently can be 2 ulps apart, 2^-6 relative in bf16 at
    # the bottom of a binade (measured worst: 0.78e-2). No cancellation: relative bounds suffice.
    tolerances={
        "float32": Tolerance(atol=0.0, rtol=1e-5),
        "bfloat16": Tolerance(atol=0.0, rtol=2e-2),
    },
)


def _shard_length(numel: int, rank: int, world_size: int) -> int:
    chunk = math.ceil(numel / world_size)
    return max(0, min(numel, (rank + 1) * chunk) - rank * chunk)


def make_inputs(ctx: TaskContext) -> tuple[torch.Tensor, ...]:
    numels = ctx.params["numels"]
    scale = 2.0 / math.sqrt(sum(numels))  # global norm ~2
    return tuple(
        (ctx.randn(_shard_length(numel, ctx.rank, ctx.world_size), stream=i, dtype=torch.float32) * scale).to(ctx.dtype)
        for i, numel in enumerate(numels)
    )


def baseline(*grad_shards: torch.Tensor):
    wide = accumulate_dtype(grad_shards[0])  # float32 (float64 for the judge's truth)
    shard_norms = [torch.linalg.vector_norm(g, 2, dtype=wide) for g in grad_shards]
    total_sq = torch.linalg.vector_norm(torch.stack(shard_norms), 2, dtype=wide).square()
    _comm.all_reduce(total_sq)
    total_norm = total_sq.sqrt()
    clip_coef = torch.clamp(MAX_NORM / (total_norm + 1e-6), max=1.0)
    clipped = tuple(g * clip_coef.to(g.dtype) for g in grad_shards)
    return (total_norm, *clipped)


def reference(inputs_per_rank: list[tuple], ctx: TaskContext) -> list[tuple]:
    total_sq = sum(float(g.double().square().sum()) for inputs in inputs_per_rank for g in inputs)
    total_norm = math.sqrt(total_sq)
    coef = min(1.0, MAX_NORM / (total_norm + 1e-6))
    return [
        (torch.tensor(total_norm, dtype=accumulate_dtype(ctx.dtype)), *((g.double() * coef).to(ctx.dtype) for g in inputs))
        for inputs in inputs_per_rank
    ]


def traffic(ctx: TaskContext) -> Traffic:
    # The only traffic is the all-reduce of one float32 (ring: 2(n-1)/n * 4 bytes): latency-bound.
    # Memory dominates: the shards are read for the norm, read again and written scaled (3 passes).
    # FLOPs: a multiply-add per element for the norm, a multiply per element for the scaling.
    n = ctx.world_size
    local_elems = sum(_shard_length(numel, ctx.rank, n) for numel in ctx.params["numels"])
    wire = 2 * (n - 1) * 4 // n
    return Traffic(
        send_bytes=wire, recv_bytes=wire,
        memory_bytes=3 * local_elems * ctx.dtype.itemsize,
        flops=3 * local_elems,
        payload_bytes=4, bus_factor=bus_factor("all_reduce", n),
    )
