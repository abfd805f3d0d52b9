"""MoE load-balancing auxiliary loss and router z-loss over the global batch.

Signature: ep_load_balance_loss(router_logits: [T_r, E], topk_idx: [T_r, k] int64)
           -> {"aux_loss": [] float32, "z_loss": [] float32, "tokens_per_expert": [E] int64}

Each rank routes its own T_r tokens (T_r differs between ranks); topk_idx is the router's choice
(it need not be the top-k of the logits: DeepSeek-V3 adds a balancing bias first). Over the tokens
of all ranks, T in all, with probs = softmax(router_logits) in float32:
    tokens_per_expert[e] = number of (token, slot) pairs routed to e
    aux_loss = E / (k * T^2) * sum_e tokens_per_expert[e] * sum_t probs[t, e]   (Switch / GShard)
    z_loss   = mean_t logsumexp(router_logits[t])^2                             (ST-MoE)
The baseline packs the local counts, probability sums, token count and z sum into one float64
buffer (exact for counts) and all-reduces it once.
"""

from __future__ import annotations

import torch

from tasks import _comm
from tasks.base import TaskContext, TaskSpec, Tolerance, Traffic, accumulate_dtype, bus_factor

TASK = TaskSpec(
    id="ep_load_balance_loss",
    title="MoE load-balancing aux loss + z-loss over ranks",
    family="expert",
    source="Switch Transformer (Fedus et al. 2021) / GShard aux loss, ST-MoE router z-loss; "
           "Megatron-LM moe_utils.switch_load_balancing_loss_func with global token counts",
    why="Balancing over the global batch rather than per rank needs the counts and probability mass "
        "of every rank: a small all-reduce on the critical path of every MoE layer's router.",
    sizes={
        "small": {"tokens": 19, "experts": 12, "top_k": 3},
        # DeepSeek-V2 routing (160 experts, top-6), 4096 tokens per rank; large: DeepSeek-V3's
        # 256 experts, top-8, 16384 tokens per rank. Ranks hold tokens - 3 * (rank % 4) tokens.
        "default": {"tokens": 4096, "experts": 160, "top_k": 6},
        "large": {"tokens": 16384, "experts": 256, "top_k": 8},
    },
    dtypes=("float32", "bfloat16"),
    # The router maths is float32 whatever the logits' dtype (Megatron's moe_router_dtype; bf16
    # values are exact in float32), so both dtypes get float32 room: sums of T probabilities and
    # squared logsumexps (~30 each) in float32 carry ~sqrt(T) * 6e-8 relative error; the
    # counts are integers and must be exact.
    tolerances={
        "float32": Tolerance(atol=1e-5, rtol=1e-4),
        "bfloat16": Tolerance(atol=1e-5, rtol=1e-4),
    },
)


def _num_tokens(ctx: TaskContext) -> int:
    return ctx.params["tokens"] - 3 * (ctx.rank % 4)


def make_inputs(ctx: TaskContext) -> tuple[torch.Tensor, torch.Tensor]:
    p = ctx.params
    logits = ctx.randn(_num_tokens(ctx), p["experts"], stream=0, dtype=torch.float32)
    # Aux-loss-free balancing bias (DeepSeek-V3), the same on every rank, shifts the choice.
    balance_bias = 0.5 * torch.randn(p["experts"], generator=ctx.shared_generator(), device=ctx.device)
    topk_idx = (logits + balance_bias).topk(p["top_k"], dim=-1).indices
    return logits.to(ctx.dtype), topk_idx


def baseline(router_logits: torch.Tensor, topk_idx: torch.Tensor) -> dict[str, torch.Tensor]:
    tokens, experts = router_logits.shape
    top_k = topk_idx.shape[1]
    logits = router_logits.to(accumulate_dtype(router_logits))
    probs = torch.softmax(logits, dim=-1)
    counts = torch.bincount(topk_idx.reshape(-1), minlength=experts)
    token_count = torch.tensor(float(tokens), dtype=logits.dtype, device=logits.device)
    z_sum = torch.logsumexp(logits, -1).pow(2).sum()
    stats = torch.cat([counts.double(), probs.sum(0).double(), torch.stack([token_count, z_sum]).double()])
    _comm.all_reduce(stats)  # [counts (E) | probability sums (E) | T | sum of z]
    global_counts, prob_sums, (total_tokens, z_sum) = stats[:experts], stats[experts:2 * experts], stats[2 * experts:]
    aux_loss = experts / (top_k * total_tokens ** 2) * (global_counts * prob_sums).sum()
    return {
        "aux_loss": aux_loss.to(logits.dtype),  # float32 (float64 for the judge's truth)
        "z_loss": (z_sum / total_tokens).to(logits.dtype),
        "tokens_per_expert": global_counts.round().long(),
    }


def reference(inputs_per_rank: list[tuple], ctx: TaskContext) -> list[dict[str, torch.Tensor]]:
    logits = torch.cat([inputs[0].double() for inputs in inputs_per_rank])
    topk_idx = torch.cat([inputs[1] for inputs in inputs_per_rank])
    tokens, experts = logits.shape
    top_k = topk_idx.shape[1]
    counts = torch.zeros(experts, dtype=torch.int64)
    for e in range(experts):
        counts[e] = int((topk_idx == e).sum())
    fraction_routed = counts.double() / (tokens * top_k)
    mean_prob = torch.softmax(logits, -1).mean(0)
    result = {
        "aux_loss": (experts * (fraction_routed * mean_prob).sum()).to(accumulate_dtype(ctx.dtype)),
        "z_loss": torch.logsumexp(logits, -1).pow(2).mean().to(accumulate_dtype(ctx.dtype)),
        "tokens_per_expert": counts,
    }
    return [result for _ in inputs_per_rank]


def traffic(ctx: TaskContext) -> Traffic:
    # One all-reduce of 2E+2 float64 values: 2(n-1)/n * 8(2E+2) bytes each way - latency bound.
    # (Counts need only int32 and the sums float32, so half the bytes would do; the figure is the
    # baseline's packing.) Memory: read the logits and the routing, write E counts and two scalars.
    # FLOPs: ~6 per logit (max, subtract, exp, sum, divide, add to the column sum).
    p, n, b = ctx.params, ctx.world_size, ctx.dtype.itemsize
    tokens, experts, top_k = _num_tokens(ctx), p["experts"], p["top_k"]
    payload = 8 * (2 * experts + 2)
    wire = 2 * (n - 1) * payload // n
    return Traffic(
        send_bytes=wire, recv_bytes=wire,
        memory_bytes=tokens * experts * b + tokens * top_k * 8 + experts * 8 + 8,
        flops=6 * tokens * experts,
        payload_bytes=payload, bus_factor=bus_factor("all_reduce", n),
    )
