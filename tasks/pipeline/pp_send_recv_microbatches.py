"""Pipeline forward: micro-batch activations sent stage to stage (GPipe fill-and-drain forward pass).

Signature: pp_send_recv_microbatches(micro_batches: [M, T, H or 0], weight: [H, H], bias: [H])
    -> activations: [M, T, H]

Rank r is pipeline stage r, with its own layer y = gelu(x W_r^T + b_r). Stage 0 holds the M
micro-batches (on the other stages micro_batches is a [M, T, 0] placeholder carrying only the
schedule's shape, as Megatron's p2p code knows tensor_shape from its config). For each micro-batch
in order, stage r receives x from stage r-1, computes y and sends it to stage r+1; it returns its
own activations for every micro-batch (the tensors a real stage keeps for its backward pass), so
the last stage returns the pipeline's output. Sends of micro-batch m and the receive of m+1 are
posted together (Megatron's send_forward_recv_forward), so stages overlap in the steady state.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from tasks import _comm
from tasks.base import TaskContext, TaskSpec, Tolerance, Traffic, bus_factor

# Weights ~ N(0, (GAIN^2)/H): gelu of a unit-variance input has RMS ~0.65, so a gain of 1.5 keeps the
# activations O(1) through any number of stages (a well-initialised network), and errors comparable.
GAIN = 1.5

TASK = TaskSpec(
    id="pp_send_recv_microbatches",
    title="Pipeline forward: micro-batch activations sent between stages",
    family="pipeline",
    source="GPipe; Megatron-LM core/pipeline_parallel/p2p_communication.py (batch_isend_irecv)",
    why="Pipeline parallelism moves every micro-batch's activations across each stage boundary; the "
        "point-to-point latency and its overlap with compute set the pipeline bubble.",
    sizes={
        "small": {"micro_batches": 5, "tokens": 6, "hidden": 37},
        # micro-batches of 4k tokens of hidden 4096 (Llama-7B-sized); large: 8k tokens of hidden 8192.
        "default": {"micro_batches": 8, "tokens": 4096, "hidden": 4096},
        "large": {"micro_batches": 16, "tokens": 8192, "hidden": 8192},
    },
    dtypes=("float32", "bfloat16"),
    # Each stage is a dot product of H terms accumulated in fp32 and rounded once to the dtype, and
    # feeds the next stage a rounded input: errors add up over up to 8 stages with gain ~1 per stage.
    # bf16: ~sqrt(8) * 1.5 roundings of 2^-9 on O(1) values -> ~1e-2; two ulps of the largest
    # outputs (~7) are 6e-2 (measured at 8 stages: 6.3e-2 abs on a 7.06, <= 2.5e-2 below 2).
    tolerances={
        "float32": Tolerance(atol=2e-5, rtol=1e-4),
        "bfloat16": Tolerance(atol=5e-2, rtol=5e-2),
    },
)


def make_inputs(ctx: TaskContext) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    m, t, h = ctx.params["micro_batches"], ctx.params["tokens"], ctx.params["hidden"]
    first_stage = ctx.rank == 0
    micro_batches = ctx.randn(m, t, h if first_stage else 0, stream=0)
    weight = (ctx.randn(h, h, stream=1, dtype=torch.float32) * (GAIN / math.sqrt(h))).to(ctx.dtype)
    bias = (0.1 * ctx.randn(h, stream=2, dtype=torch.float32)).to(ctx.dtype)
    return micro_batches, weight, bias


def baseline(micro_batches: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    n = torch.distributed.get_world_size()
    rank = torch.distributed.get_rank()
    prev_stage = rank - 1 if rank > 0 else None
    next_stage = rank + 1 if rank < n - 1 else None
    count, tokens = micro_batches.shape[:2]
    hidden = weight.shape[0]
    activations = torch.empty(count, tokens, hidden, dtype=weight.dtype, device=weight.device)

    def new_buffer() -> torch.Tensor:
        return torch.empty(tokens, hidden, dtype=weight.dtype, device=weight.device)

    received = None
    if prev_stage is not None:
        received = new_buffer()
        _comm.sendrecv(None, None, received, prev_stage)
    for m in range(count):
        x = micro_batches[m] if prev_stage is None else received
        activations[m] = F.gelu(torch.addmm(bias, x, weight.t()))
        received = new_buffer() if (prev_stage is not None and m + 1 < count) else None
        if next_stage is not None or received is not None:
            _comm.sendrecv(
                activations[m] if next_stage is not None else None, next_stage,
                received, prev_stage if received is not None else None,
            )
    return activations


def reference(inputs_per_rank: list[tuple], ctx: TaskContext) -> list[torch.Tensor]:
    x = inputs_per_rank[0][0].double()
    results = []
    for _, weight, bias in inputs_per_rank:
        x = F.gelu(x @ weight.double().t() + bias.double())
        results.append(x.to(ctx.dtype))
    return results


def traffic(ctx: TaskContext) -> Traffic:
    # Each stage boundary carries all M*T*H activations once; stage r sends them to r+1 (unless last)
    # and receives them from r-1 (unless first). Point-to-point: nccl-tests' sendrecv counts
    # busbw = algbw, factor 1, over the bytes one rank sends. Memory: the input and weight read, the
    # activations written. FLOPs: the GEMM of each micro-batch (plus the bias and gelu).
    # Messages: the last stage's output needs the data to cross n-1 boundaries one after another
    # (each stage computes before it can send), however the micro-batches are grouped.
    n, r = ctx.world_size, ctx.rank
    p = ctx.params
    b = ctx.dtype.itemsize
    act_elems = p["micro_batches"] * p["tokens"] * p["hidden"]
    act_bytes = act_elems * b
    return Traffic(
        send_bytes=act_bytes if r < n - 1 else 0,
        recv_bytes=act_bytes if r > 0 else 0,
        memory_bytes=2 * act_bytes + (p["hidden"] ** 2 + p["hidden"]) * b,
        flops=2 * act_elems * p["hidden"] + 10 * act_elems,
        payload_bytes=act_bytes if n > 1 else 0, bus_factor=bus_factor("sendrecv", n),
        messages=max(1, n - 1),
    )
