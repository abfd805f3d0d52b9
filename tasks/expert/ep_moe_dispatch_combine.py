"""MoE token dispatch + expert GEMM + combine with uneven per-expert counts.

Signature: ep_moe_dispatch_combine(x: [T_r, H], topk_idx: [T_r, k] int64, topk_weight: [T_r, k] float32,
                                   expert_weight: [E/n, H, H]) -> out: [T_r, H]

E experts, rank r owning experts r*E/n .. (r+1)*E/n - 1 (expert_weight[e] is local expert e's
[H_in, H_out] matrix). Each rank routes its own T_r tokens (T_r differs between ranks, as with
data-parallel attention in inference) to k distinct experts, some experts much more popular than
others. out[t] = sum_j topk_weight[t, j] * (x[t] @ W[topk_idx[t, j]]), the expert maths done on
the rank owning the expert: the tokens go there (dispatch) and the results come back (combine).
The baseline is Megatron's all-to-all token dispatcher: sort the (token, slot) pairs by expert,
exchange the per-expert counts with an all-to-all, all_to_all_single with those split sizes, one
GEMM per local expert, the reverse all-to-all, and a weighted scatter-add in float32.
"""

from __future__ import annotations

import math

import torch
import torch.distributed as dist

from tasks import _comm
from tasks.base import TaskContext, TaskSpec, Tolerance, Traffic, accumulate_dtype, bus_factor

TASK = TaskSpec(
    id="ep_moe_dispatch_combine",
    title="MoE dispatch + expert GEMM + combine (uneven all-to-all)",
    family="expert",
    source="Megatron-LM core/transformer/moe/token_dispatcher.py MoEAlltoAllTokenDispatcher; "
           "DeepEP dispatch/combine (DeepSeek-V3)",
    why="Two all-to-alls per MoE layer with sizes known only after routing (a count exchange and a "
        "host sync first); their bytes rival the expert GEMMs', and skew makes some ranks the "
        "stragglers.",
    sizes={
        "small": {"tokens": 17, "hidden": 24, "experts": 8, "top_k": 3},
        # Qwen3-30B-A3B-like routing (128 experts, top-8, hidden 2048), 4096 tokens per rank;
        # large: 16384 tokens per rank, hidden 4096. Ranks hold tokens - 5 * (rank % 3) tokens.
        "default": {"tokens": 4096, "hidden": 2048, "experts": 128, "top_k": 8},
        "large": {"tokens": 16384, "hidden": 4096, "experts": 128, "top_k": 8},
    },
    dtypes=("float32", "bfloat16"),
    # Expert outputs are O(1) (weights scaled by 1/sqrt(H)) and out is a convex combination of k of
    # them. fp32: H-term dot products, ~sqrt(H) * 6e-8. bf16: each expert output rounds once
    # (2^-9 relative), the weighted sum runs in fp32 and rounds once more.
    tolerances={
        "float32": Tolerance(atol=5e-5, rtol=1e-4),
        "bfloat16": Tolerance(atol=2e-2, rtol=2e-2),
    },
    world_sizes=(1, 2, 4, 8),  # experts split evenly
)


def _num_tokens(ctx: TaskContext) -> int:
    return ctx.params["tokens"] - 5 * (ctx.rank % 3)


def _routing(ctx: TaskContext) -> tuple[torch.Tensor, torch.Tensor]:
    """This rank's router decision: top-k experts per token and their softmax weights (float32)."""
    p = ctx.params
    # Some experts are popular on every rank: uneven per-expert counts, some possibly zero.
    popularity = torch.randn(p["experts"], generator=ctx.shared_generator(stream=1), device=ctx.device)
    logits = ctx.randn(_num_tokens(ctx), p["experts"], stream=1, dtype=torch.float32) + popularity
    top_logits, topk_idx = logits.topk(p["top_k"], dim=-1)
    return topk_idx, torch.softmax(top_logits, dim=-1)


def make_inputs(ctx: TaskContext) -> tuple[torch.Tensor, ...]:
    p = ctx.params
    x = ctx.randn(_num_tokens(ctx), p["hidden"], stream=0)
    topk_idx, topk_weight = _routing(ctx)
    local_experts = p["experts"] // ctx.world_size
    expert_weight = ctx.randn(local_experts, p["hidden"], p["hidden"], stream=2, dtype=torch.float32)
    # Outlier output channels (the same for every expert and rank), so int8 transport of the
    # expert outputs on the way back shows (TaskContext.randn_outliers).
    expert_weight = expert_weight * ctx.outlier_scales(p["hidden"], stream=2)
    return x, topk_idx, topk_weight, (expert_weight / math.sqrt(p["hidden"])).to(ctx.dtype)


def baseline(
    x: torch.Tensor, topk_idx: torch.Tensor, topk_weight: torch.Tensor, expert_weight: torch.Tensor,
) -> torch.Tensor:
    n = dist.get_world_size()
    local_experts = expert_weight.shape[0]
    tokens, top_k = topk_idx.shape

    # Permute: (token, slot) pairs sorted by global expert id, hence by destination rank.
    flat_expert = topk_idx.reshape(-1)
    order = torch.argsort(flat_expert, stable=True)
    token_of_row = order // top_k
    permuted = x.index_select(0, token_of_row)

    # Count exchange: recv_counts[s * E/n + e] = rows rank s sends to local expert e.
    send_counts = torch.bincount(flat_expert, minlength=n * local_experts)
    recv_counts = torch.empty_like(send_counts)
    _comm.all_to_all_single(recv_counts, send_counts)
    send_splits = send_counts.view(n, local_experts).sum(1).tolist()  # host sync, as in Megatron
    recv_splits = recv_counts.view(n, local_experts).sum(1).tolist()

    received = x.new_empty((sum(recv_splits), x.shape[1]))
    _comm.all_to_all_single(received, permuted, recv_splits, send_splits)

    # Received rows are ordered (source rank, local expert); group them by expert for the GEMMs.
    expert_of_row = torch.arange(local_experts, device=x.device).repeat(n).repeat_interleave(recv_counts)
    by_expert = torch.argsort(expert_of_row, stable=True)
    rows_per_expert = recv_counts.view(n, local_experts).sum(0).tolist()
    grouped = received.index_select(0, by_expert).split(rows_per_expert)
    expert_out = torch.empty_like(received)
    expert_out[by_expert] = torch.cat([rows @ expert_weight[e] for e, rows in enumerate(grouped)])

    returned = x.new_empty((tokens * top_k, x.shape[1]))
    _comm.all_to_all_single(returned, expert_out, send_splits, recv_splits)

    # Un-permute: weight each returned row and add it to its token, in float32.
    row_weight = topk_weight.reshape(-1).index_select(0, order).unsqueeze(-1)
    out = torch.zeros((tokens, x.shape[1]), dtype=accumulate_dtype(x), device=x.device)
    out.index_add_(0, token_of_row, returned.to(out.dtype) * row_weight)
    return out.to(x.dtype)


def reference(inputs_per_rank: list[tuple], ctx: TaskContext) -> list[torch.Tensor]:
    all_experts = torch.cat([inputs[3].double() for inputs in inputs_per_rank])  # [E, H, H]
    outputs = []
    for x, topk_idx, topk_weight, _ in inputs_per_rank:
        x = x.double()
        out = torch.zeros_like(x)
        for slot in range(topk_idx.shape[1]):
            for expert in topk_idx[:, slot].unique().tolist():
                rows = topk_idx[:, slot] == expert
                out[rows] += topk_weight[rows, slot].double().unsqueeze(-1) * (x[rows] @ all_experts[expert])
        outputs.append(out.to(ctx.dtype))
    return outputs


def traffic(ctx: TaskContext) -> Traffic:
    # Exact for this trial's routing (remade from the seeds, as make_inputs makes it). A token
    # must reach each other rank holding one of its experts once (DeepEP de-duplicates; Megatron's
    # dispatcher sends one row per (token, slot)), and one pre-weighted row per such rank comes
    # back: send = recv = (pairs out + pairs in) * H*b, where pairs out are (own token, other rank)
    # and pairs in (other rank's token, this rank). Routing metadata (k ids and weights per row,
    # <1% of the bytes) is left out. FLOPs: 2*H*H per (token, slot) routed to a local expert, plus
    # the weighted combine. Payload: Megatron's T_r*k rows each way, all-to-all bus factor.
    p, n, r, b = ctx.params, ctx.world_size, ctx.rank, ctx.dtype.itemsize
    hidden, top_k = p["hidden"], p["top_k"]
    local_experts = p["experts"] // n
    pairs_out = pairs_in = rows_here = 0
    for s in range(n):
        dest = _routing(ctx.for_rank(s))[0] // local_experts
        reached = torch.zeros(dest.shape[0], n, dtype=torch.bool, device=dest.device).scatter_(1, dest, True)
        rows_here += int((dest == r).sum())
        if s == r:
            pairs_out = int(reached.sum()) - int(reached[:, r].sum())
        else:
            pairs_in += int(reached[:, r].sum())
    wire = (pairs_out + pairs_in) * hidden * b
    tokens = _num_tokens(ctx)
    return Traffic(
        send_bytes=wire, recv_bytes=wire,
        memory_bytes=2 * tokens * hidden * b + local_experts * hidden * hidden * b + 3 * rows_here * hidden * b,
        flops=2 * rows_here * hidden * hidden + 2 * tokens * top_k * hidden,
        payload_bytes=2 * tokens * top_k * hidden * b, bus_factor=bus_factor("all_to_all", n),
    )
