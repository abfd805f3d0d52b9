"""Ulysses attention: all-to-all from sequence shards to head shards, causal attention, and back.

Signature: cp_ulysses_attention(q: [S_local, H, D], k: [S_local, H, D], v: [S_local, H, D])
           -> out: [S_local, H, D]

Rank r holds tokens r*S_local .. (r+1)*S_local - 1 of every head. One all-to-all (q, k, v stacked)
turns that into the whole sequence of heads r*H/n .. (r+1)*H/n - 1; each rank runs ordinary causal
attention (scale 1/sqrt(D)) on its heads; a second all-to-all returns each rank its tokens of
every head.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn.functional as F

from tasks import _comm
from tasks.base import TaskContext, TaskSpec, Tolerance, Traffic, bus_factor

TASK = TaskSpec(
    id="cp_ulysses_attention",
    title="Ulysses all-to-all attention (sequence <-> heads)",
    family="context",
    source="DeepSpeed-Ulysses (Jacobs et al. 2023), deepspeed.sequence.layer.DistributedAttention; "
           "yunchang / USP unified sequence parallelism",
    why="Two all-to-alls per attention layer whose volume per rank shrinks as 1/n; they sit between "
        "the QKV projection and attention with nothing to overlap unless pipelined by head.",
    sizes={
        "small": {"tokens_per_rank": 6, "heads": 8, "head_dim": 8},
        # 4000 tokens per rank (32k on 8 GPUs), 24 heads of 128; large: 16000 per rank (128k), 32 heads.
        "default": {"tokens_per_rank": 4000, "heads": 24, "head_dim": 128},
        "large": {"tokens_per_rank": 16000, "heads": 32, "head_dim": 128},
    },
    dtypes=("float32", "bfloat16"),
    # As ring attention: outputs are convex combinations of v rows; bf16 leaves room for flash
    # attention's bf16 probabilities; the all-to-alls are exact.
    tolerances={
        "float32": Tolerance(atol=2e-5, rtol=1e-4),
        "bfloat16": Tolerance(atol=2e-2, rtol=2e-2),
    },
    world_sizes=(1, 2, 4, 8),  # heads split evenly
)


def make_inputs(ctx: TaskContext) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    p = ctx.params
    shape = (p["tokens_per_rank"], p["heads"], p["head_dim"])
    return tuple(ctx.randn(*shape, stream=i) for i in range(3))


def baseline(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    n = dist.get_world_size()
    rows, heads, head_dim = q.shape
    local_heads = heads // n
    # Block j of the send buffer holds this rank's tokens of rank j's heads: [n, 3, rows, H/n, D].
    send = torch.stack([q, k, v]).view(3, rows, n, local_heads, head_dim).permute(2, 0, 1, 3, 4).contiguous()
    received = torch.empty_like(send)  # block j: rank j's tokens of this rank's heads
    _comm.all_to_all_single(received, send)
    q_seq, k_seq, v_seq = received.permute(1, 3, 0, 2, 4).reshape(3, local_heads, n * rows, head_dim)
    out = F.scaled_dot_product_attention(q_seq, k_seq, v_seq, is_causal=True)  # [H/n, S, D]
    send_back = out.view(local_heads, n, rows, head_dim).permute(1, 2, 0, 3).contiguous()
    returned = torch.empty_like(send_back)  # block j: this rank's tokens of rank j's heads
    _comm.all_to_all_single(returned, send_back)
    return returned.permute(1, 0, 2, 3).reshape(rows, heads, head_dim)


def reference(inputs_per_rank: list[tuple], ctx: TaskContext) -> list[torch.Tensor]:
    q, k, v = (torch.cat([inputs[i].double() for inputs in inputs_per_rank]) for i in range(3))
    seq = q.shape[0]
    scores = torch.einsum("shd,thd->hst", q, k) / q.shape[-1] ** 0.5
    scores.masked_fill_(torch.ones(seq, seq, dtype=torch.bool).triu(1), float("-inf"))
    out = torch.einsum("hst,thd->shd", torch.softmax(scores, -1), v).to(ctx.dtype)
    return list(out.chunk(ctx.world_size))


def traffic(ctx: TaskContext) -> Traffic:
    # Each rank keeps 1/n of its q, k, v and sends the rest: (n-1)/n * 3*S_local*H*D*b out and as
    # much in; the output comes back the same way, (n-1)/n * S_local*H*D*b. (Passing kv around a
    # ring instead would move 2(n-1) * S_local*H*D*b, more for n > 2.) FLOPs: causal attention over
    # S = n*S_local tokens for H/n heads, 4*D per (query, key) pair. Memory: read q, k, v, write
    # and read both exchange buffers, write out.
    p, n, b = ctx.params, ctx.world_size, ctx.dtype.itemsize
    rows, heads, d = p["tokens_per_rank"], p["heads"], p["head_dim"]
    tensor_bytes = rows * heads * d * b
    wire = 4 * (n - 1) * tensor_bytes // n
    seq = n * rows
    return Traffic(
        send_bytes=wire, recv_bytes=wire,
        memory_bytes=4 * tensor_bytes + 2 * 4 * tensor_bytes + tensor_bytes,
        flops=4 * d * (heads // n) * seq * (seq + 1) // 2,
        payload_bytes=4 * tensor_bytes, bus_factor=bus_factor("all_to_all", n),
    )
