"""Ring attention forward, causal, with the load-balanced ("zigzag") sequence layout.

Signature: cp_ring_attention(q: [S_local, Hq, D], k: [S_local, Hkv, D], v: [S_local, Hkv, D])
           -> out: [S_local, Hq, D]

The sequence of S = n * S_local tokens is cut into 2n chunks of c = S_local / 2 tokens; rank r holds
chunks r and 2n-1-r (first half then second half of its rows), so every rank has the same causal
work (Megatron-LM / TransformerEngine context parallelism). Keys and values travel around the ring
(rank r sends to r+1, receives from r-1) for n-1 steps; each rank folds every block it sees into
an online softmax (running row max, row sum and weighted values, as in flash attention). Causal
mask by global position; scale 1/sqrt(D); grouped-query attention: q head h uses kv head
h // (Hq / Hkv). The baseline works in float32 and passes k and v in their own dtype.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from tasks import _comm
from tasks.base import TaskContext, TaskSpec, Tolerance, Traffic, accumulate_dtype, bus_factor

TASK = TaskSpec(
    id="cp_ring_attention",
    title="Ring attention forward (causal, zigzag layout, GQA)",
    family="context",
    source="Ring Attention (Liu et al. 2023); Megatron-LM context parallelism via TransformerEngine "
           "AttnFuncWithCPAndKVP2P (zigzag load balancing)",
    why="Long-context training: n-1 point-to-point hops of the KV shard per attention layer, which "
        "must hide behind the block computations or the ring stalls every step.",
    sizes={
        # chunk = tokens per half-shard: S_local = 2 * chunk, S = n * S_local.
        "small": {"chunk": 5, "q_heads": 4, "kv_heads": 2, "head_dim": 8},
        # Llama-3-8B attention (32 q / 8 kv heads, D 128): 6000 tokens per rank (48k on 8 GPUs);
        # large: 16000 per rank (128k on 8 GPUs). The baseline holds a [Hq, chunk, chunk] float32
        # score block at a time: 1.2 GB at default, 8.2 GB at large.
        "default": {"chunk": 3000, "q_heads": 32, "kv_heads": 8, "head_dim": 128},
        "large": {"chunk": 8000, "q_heads": 32, "kv_heads": 8, "head_dim": 128},
    },
    dtypes=("float32", "bfloat16"),
    # Outputs are convex combinations of v rows, |out| < ~3. fp32: D-term dot products and exps
    # of O(1) scores, a few roundings per block fold. bf16: one rounding of the output, and room
    # for flash-attention style kernels that round the probabilities to bf16 before P @ V.
    tolerances={
        "float32": Tolerance(atol=2e-5, rtol=1e-4),
        "bfloat16": Tolerance(atol=2e-2, rtol=2e-2),
    },
)


def make_inputs(ctx: TaskContext) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    p = ctx.params
    rows = 2 * p["chunk"]
    q = ctx.randn(rows, p["q_heads"], p["head_dim"], stream=0)
    k = ctx.randn(rows, p["kv_heads"], p["head_dim"], stream=1)
    v = ctx.randn(rows, p["kv_heads"], p["head_dim"], stream=2)
    return q, k, v


def _fold_block(row_max, row_sum, acc, scores, values) -> None:
    """Online softmax: fold one block of scores [.., rows, cols] and values [.., cols, D] in place."""
    new_max = torch.maximum(row_max, scores.amax(-1))
    correction = torch.exp(row_max - new_max)  # 0 where nothing was folded yet (row_max = -inf)
    probs = torch.exp(scores - new_max.unsqueeze(-1))
    row_sum.mul_(correction).add_(probs.sum(-1))
    acc.mul_(correction.unsqueeze(-1)).add_(probs @ values)
    row_max.copy_(new_max)


def baseline(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    rank, n = dist.get_rank(), dist.get_world_size()
    rows, q_heads, head_dim = q.shape
    kv_heads = k.shape[1]
    chunk = rows // 2
    # [Hkv, group, rows, D]: the q heads sharing a kv head broadcast against its [Hkv, 1, *, D] block.
    q_grouped = (q.to(accumulate_dtype(q)) * head_dim ** -0.5).permute(1, 0, 2).reshape(kv_heads, q_heads // kv_heads, rows, head_dim)
    row_max = torch.full(q_grouped.shape[:-1], float("-inf"), dtype=q_grouped.dtype, device=q.device)
    row_sum = torch.zeros(q_grouped.shape[:-1], dtype=q_grouped.dtype, device=q.device)
    acc = torch.zeros(q_grouped.shape, dtype=q_grouped.dtype, device=q.device)
    diagonal_mask = torch.ones(chunk, chunk, dtype=torch.bool, device=q.device).triu_(1)
    my_chunks = (rank, 2 * n - 1 - rank)

    kv = torch.stack([k, v])  # the ring payload, [2, rows, Hkv, D] in the input dtype
    for step in range(n):
        src = (rank - step) % n
        if step < n - 1:
            # TransformerEngine overlaps this hop with the block below; the baseline does not.
            incoming = torch.empty_like(kv)
            _comm.sendrecv(kv, (rank + 1) % n, incoming, (rank - 1) % n)
        keys, values = kv.to(q_grouped.dtype).permute(0, 2, 1, 3).unsqueeze(2)  # each [Hkv, 1, rows, D]
        for qi, q_chunk in enumerate(my_chunks):
            q_rows = slice(qi * chunk, (qi + 1) * chunk)
            for ki, kv_chunk in enumerate((src, 2 * n - 1 - src)):
                if kv_chunk > q_chunk:
                    continue  # entirely in the future: masked out
                kv_rows = slice(ki * chunk, (ki + 1) * chunk)
                scores = q_grouped[:, :, q_rows] @ keys[:, :, kv_rows].transpose(-1, -2)
                if kv_chunk == q_chunk:
                    scores.masked_fill_(diagonal_mask, float("-inf"))
                _fold_block(row_max[:, :, q_rows], row_sum[:, :, q_rows], acc[:, :, q_rows],
                            scores, values[:, :, kv_rows])
        if step < n - 1:
            kv = incoming
    out = (acc / row_sum.unsqueeze(-1)).reshape(q_heads, rows, head_dim).permute(1, 0, 2)
    return out.to(q.dtype).contiguous()


def _global_order(per_rank: list[torch.Tensor], chunk: int) -> torch.Tensor:
    """Rank-local [2*chunk, ...] tensors -> the whole sequence: global chunk j lives on rank j
    (first half) for j < n, on rank 2n-1-j (second half) otherwise."""
    n = len(per_rank)
    parts = [per_rank[j][:chunk] if j < n else per_rank[2 * n - 1 - j][chunk:] for j in range(2 * n)]
    return torch.cat(parts)


def reference(inputs_per_rank: list[tuple], ctx: TaskContext) -> list[torch.Tensor]:
    n, chunk = ctx.world_size, ctx.params["chunk"]
    q, k, v = (_global_order([inputs[i].double() for inputs in inputs_per_rank], chunk) for i in range(3))
    group = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
    seq = q.shape[0]
    scores = torch.einsum("shd,thd->hst", q, k) / q.shape[-1] ** 0.5
    scores.masked_fill_(torch.ones(seq, seq, dtype=torch.bool).triu(1), float("-inf"))
    out = torch.einsum("hst,thd->shd", torch.softmax(scores, -1), v)
    return [
        torch.cat([out[r * chunk:(r + 1) * chunk], out[(2 * n - 1 - r) * chunk:(2 * n - r) * chunk]]).to(ctx.dtype)
        for r in range(n)
    ]


def traffic(ctx: TaskContext) -> Traffic:
    """The least a rank moves for its share of causal ring attention (zigzag layout).

    Wire: keys+values of one chunk are c * 2*Hkv*D*b bytes (moving kv, not q, is the cheaper side
    with Hkv <= Hq). Rank r's queries need, from each rank s < r, only s's first chunk (its second
    lies in r's future), and from each s > r both chunks: r*c + 2c*(n-1-r) rows in. Its own first
    chunk is needed by all n-1 peers, its second by the r ranks below it: (n-1+r)*c rows out.
    (The ring moves 2c*(n-1) rows each way.)
    Memory, the minimum: q read and the output written once, its own k/v read once. Incoming k/v
    need not touch this rank's HBM: a kernel that loads the peers' rows over the links straight
    into shared memory consumes them there; and the peers' loads of this rank's rows are served by
    its L2 (remote reads go through the owner's L2) while they are resident after its own read
    (a rank's k/v is 25 MB at default size in bfloat16, under an H100/H200's 50 MB L2). The former
    model staged incoming k/v, written and read again: up to 3.8x this.
    FLOPs: the zigzag layout gives every rank (2n-1) full chunk pairs plus two causal diagonal
    ones, 4*D flops per (query, key) pair per q head.
    """
    p, n, r, b = ctx.params, ctx.world_size, ctx.rank, ctx.dtype.itemsize
    c, hq, hkv, d = p["chunk"], p["q_heads"], p["kv_heads"], p["head_dim"]
    kv_row_bytes = 2 * hkv * d * b
    recv = (r * c + 2 * c * (n - 1 - r)) * kv_row_bytes
    send = (n - 1 + r) * c * kv_row_bytes
    pairs = (2 * n - 1) * c * c + c * (c + 1)
    local_bytes = 2 * c * (2 * hq * d * b + kv_row_bytes)  # read q, k, v, write out
    return Traffic(
        send_bytes=send, recv_bytes=recv,
        memory_bytes=local_bytes,
        flops=4 * d * hq * pairs,
        payload_bytes=n * 2 * c * kv_row_bytes, bus_factor=bus_factor("all_gather", n),
    )
