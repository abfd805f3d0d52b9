"""FSDP / ZeRO-3 step of one linear layer: all-gather the weight, forward and backward, reduce-scatter.

Signature: fsdp_layer_step(x: [T, in], weight_shard: [S], grad_output: [T, out])
    -> (y: [T, out], grad_x: [T, in], grad_weight_shard: [S])

The layer's weight W [out, in] is flattened, zero-padded to n*S elements (S = ceil(out*in / n)),
and rank r holds elements r*S .. (r+1)*S-1, as FSDP's FlatParameter and ZeRO-3's partitions do.
Each rank: all-gather the full W, y = x W^T, grad_x = grad_output W, local weight gradient
grad_output^T x, reduce-scatter it over ranks and divide by n (gradient averaging), keeping its own
shard (the padding's gradient is zero). x and grad_output are this rank's own micro-batch.
The weight stays gathered between forward and backward (reshard_after_forward=False, ZeRO-2's
choice for the parameters): one all-gather per step, the least traffic.
"""

from __future__ import annotations

import math

import torch

from tasks import _comm
from tasks.base import TaskContext, TaskSpec, Tolerance, Traffic, bus_factor

TASK = TaskSpec(
    id="fsdp_layer_step",
    title="FSDP layer step: weight all-gather, forward + backward GEMMs, gradient reduce-scatter",
    family="fsdp",
    source="PyTorch FSDP (FlatParameter, fully_shard) and DeepSpeed ZeRO stage 3",
    why="Every layer of a fully sharded model gathers its weights before use and reduce-scatters its "
        "gradients after: the communication must hide behind the layer's GEMMs or training stalls.",
    # out*in is not a multiple of the world size in small (padding path); default is a Llama-2-7B
    # MLP up-projection with 4k tokens per rank, large a Llama-2-70B one with 8k.
    sizes={
        "small": {"tokens": 24, "in_features": 67, "out_features": 45},
        "default": {"tokens": 4096, "in_features": 4096, "out_features": 11008},
        "large": {"tokens": 8192, "in_features": 8192, "out_features": 28672},
    },
    dtypes=("float32", "bfloat16", "float16"),
    # Outputs are O(1) by the input scaling below. y and grad_x are dot products of up to 28k terms
    # accumulated in fp32 (CPU and cuBLAS) and rounded once to the dtype; grad_weight_shard adds a sum
    # over up to 8 ranks in the dtype (up to 7 roundings of partial sums ~3x the result), then /n.
    # fp32: sqrt(K)*eps*|terms| ~ 1e-5 at K=28k; bf16: 1 rounding (2^-9 rel) + 7 * 2^-9 * 3 / 8 abs
    # on the gradient ~ 1e-2; fp16 8x tighter.
    tolerances={
        "float32": Tolerance(atol=5e-5, rtol=1e-4),
        "bfloat16": Tolerance(atol=2e-2, rtol=2e-2),
        "float16": Tolerance(atol=3e-3, rtol=3e-3),
    },
)


def _shard_numel(ctx: TaskContext) -> int:
    return math.ceil(ctx.params["out_features"] * ctx.params["in_features"] / ctx.world_size)


def _full_weight(ctx: TaskContext) -> torch.Tensor:
    """The layer's weight, the same on every rank (default init scale: y stays O(1))."""
    out_f, in_f = ctx.params["out_features"], ctx.params["in_features"]
    gen = ctx.shared_generator(stream=0)
    w = torch.randn(out_f, in_f, generator=gen, device=ctx.device) / math.sqrt(in_f)
    return w.to(ctx.dtype)


def make_inputs(ctx: TaskContext) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    p = ctx.params
    s = _shard_numel(ctx)
    flat = torch.zeros(ctx.world_size * s, dtype=ctx.dtype, device=ctx.device)
    flat[: p["out_features"] * p["in_features"]] = _full_weight(ctx).flatten()
    weight_shard = flat[ctx.rank * s:(ctx.rank + 1) * s].clone()
    x = ctx.randn(p["tokens"], p["in_features"], stream=1)
    # 1/sqrt(T) keeps the weight gradient (a sum over T tokens) O(1).
    grad_output = (ctx.randn(p["tokens"], p["out_features"], stream=2, dtype=torch.float32)
                   / math.sqrt(p["tokens"])).to(ctx.dtype)
    return x, weight_shard, grad_output


def baseline(x: torch.Tensor, weight_shard: torch.Tensor, grad_output: torch.Tensor):
    n = torch.distributed.get_world_size()
    s = weight_shard.numel()
    out_f, in_f = grad_output.shape[1], x.shape[1]
    flat_weight = torch.empty(n * s, dtype=weight_shard.dtype, device=weight_shard.device)
    _comm.all_gather_single(flat_weight, weight_shard)
    weight = flat_weight[: out_f * in_f].view(out_f, in_f)

    y = x @ weight.t()
    grad_x = grad_output @ weight
    flat_grad = torch.zeros(n * s, dtype=weight_shard.dtype, device=weight_shard.device)
    torch.mm(grad_output.t(), x, out=flat_grad[: out_f * in_f].view(out_f, in_f))

    grad_shard = torch.empty(s, dtype=weight_shard.dtype, device=weight_shard.device)
    _comm.reduce_scatter_single(grad_shard, flat_grad)
    grad_shard.div_(n)
    return y, grad_x, grad_shard


def reference(inputs_per_rank: list[tuple], ctx: TaskContext) -> list[tuple]:
    n = len(inputs_per_rank)
    out_f, in_f = ctx.params["out_features"], ctx.params["in_features"]
    flat = torch.cat([inputs[1].double() for inputs in inputs_per_rank])
    weight = flat[: out_f * in_f].view(out_f, in_f)
    grad_w = sum(inputs[2].double().t() @ inputs[0].double() for inputs in inputs_per_rank) / n
    flat_grad = torch.zeros_like(flat)
    flat_grad[: out_f * in_f] = grad_w.flatten()
    s = flat.numel() // n
    results = []
    for r, (x, _, grad_output) in enumerate(inputs_per_rank):
        x64, go64 = x.double(), grad_output.double()
        results.append((
            (x64 @ weight.t()).to(ctx.dtype),
            (go64 @ weight).to(ctx.dtype),
            flat_grad[r * s:(r + 1) * s].to(ctx.dtype),
        ))
    return results


def traffic(ctx: TaskContext) -> Traffic:
    # F = n*S*b bytes of padded weight. All-gather: this rank must receive the other n-1 shards and
    # its shard must reach n-1 peers: (n-1)/n*F each way. Reduce-scatter of the F-byte gradient: the
    # same again. nccl-tests counts both collectives by their full size F with factor (n-1)/n, so
    # payload F with factor 2(n-1)/n gives the same bus bandwidth as timing them one by one.
    # Memory: x and grad_output read twice (two GEMMs each), the gathered weight written once and
    # read twice, y and grad_x written, the gradient written, and reduced chunks read and written.
    # FLOPs: three T x in x out GEMMs.
    n = ctx.world_size
    p = ctx.params
    b = ctx.dtype.itemsize
    t, fin, fout = p["tokens"], p["in_features"], p["out_features"]
    full_bytes = n * _shard_numel(ctx) * b
    wire = 2 * (n - 1) * full_bytes // n
    memory = b * (3 * t * fin + 3 * t * fout) + 3 * full_bytes + 2 * (n - 1) * full_bytes // n
    return Traffic(
        send_bytes=wire, recv_bytes=wire, memory_bytes=memory,
        flops=6 * t * fin * fout + (n - 1) * full_bytes // (n * b),
        payload_bytes=full_bytes, bus_factor=bus_factor("all_reduce", n),
    )
