"""Vocab-parallel embedding lookup: masked local lookup + all-reduce (Megatron VocabParallelEmbedding).

Signature: tp_vocab_embedding(token_ids: [T] int64, weight_shard: [Vp/n, H]) -> embeddings: [T, H]

The embedding table [Vp, H] is split along the vocabulary: rank r holds rows r*Vp/n .. (r+1)*Vp/n - 1.
Vp is the vocabulary V padded up (Megatron's make_vocab_size_divisible_by), so the last rank holds
padding rows that no token uses. Every rank gets the same token ids (all < V), looks up the ones in
its range, writes zeros for the rest, and an all-reduce (one non-zero term per element) gives
every rank the embeddings of all T tokens.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn.functional as F

from tasks import _comm
from tasks.base import TaskContext, TaskSpec, Tolerance, Traffic, bus_factor

TASK = TaskSpec(
    id="tp_vocab_embedding",
    title="Vocab-parallel embedding (masked lookup + all-reduce)",
    family="tensor",
    source="Megatron-LM core/tensor_parallel/layers.py VocabParallelEmbedding",
    why="The first op of every step: a [T, H] all-reduce where each element has exactly one "
        "non-zero contribution, so half of the all-reduce's bytes (and all its adds) are waste a "
        "gather-style kernel can skip.",
    sizes={
        # V = 203 padded to 224; GPT-2's 50257 padded to 51200 (128 x 8 ranks x 50); Llama-3's 128256
        # padded to 129024. Vp is divisible by 1, 2, 4 and 8.
        "small": {"tokens": 29, "hidden": 24, "vocab": 203, "vocab_padded": 224},
        "default": {"tokens": 8192, "hidden": 4096, "vocab": 50257, "vocab_padded": 51200},
        "large": {"tokens": 16384, "hidden": 8192, "vocab": 128256, "vocab_padded": 129024},
    },
    dtypes=("float32", "bfloat16"),
    # Each output element is one table entry plus n-1 exact zeros: bit-exact in every dtype.
    tolerances={
        "float32": Tolerance(atol=0.0, rtol=0.0),
        "bfloat16": Tolerance(atol=0.0, rtol=0.0),
    },
    world_sizes=(1, 2, 4, 8),  # the padded vocabulary splits evenly
)


def _token_ids(ctx: TaskContext) -> torch.Tensor:
    # The same ids on every tensor-parallel rank; uniform over the real (unpadded) vocabulary.
    return torch.randint(0, ctx.params["vocab"], (ctx.params["tokens"],),
                         generator=ctx.shared_generator(), device=ctx.device)


def make_inputs(ctx: TaskContext) -> tuple[torch.Tensor, torch.Tensor]:
    p = ctx.params
    weight_shard = ctx.randn(p["vocab_padded"] // ctx.world_size, p["hidden"], stream=0)
    return _token_ids(ctx), weight_shard


def baseline(token_ids: torch.Tensor, weight_shard: torch.Tensor) -> torch.Tensor:
    rows = weight_shard.shape[0]
    vocab_start = dist.get_rank() * rows
    outside = (token_ids < vocab_start) | (token_ids >= vocab_start + rows)
    local_ids = (token_ids - vocab_start).masked_fill(outside, 0)
    embeddings = F.embedding(local_ids, weight_shard)
    embeddings.masked_fill_(outside.unsqueeze(-1), 0.0)
    _comm.all_reduce(embeddings)
    return embeddings


def reference(inputs_per_rank: list[tuple], ctx: TaskContext) -> list[torch.Tensor]:
    table = torch.cat([inputs[1].double() for inputs in inputs_per_rank])
    embeddings = table[inputs_per_rank[0][0]].to(ctx.dtype)
    return [embeddings for _ in inputs_per_rank]


def traffic(ctx: TaskContext) -> Traffic:
    """The least a rank moves for a vocabulary-parallel embedding lookup of T tokens.

    Wire: ids are uniform over the vocabulary, so a rank owns ~1/n of the looked-up rows and must
    receive the other (n-1)/n * T*H*b; the rows it owns must reach n-1 peers, and a ring spreads
    that evenly: (n-1)/n * T*H*b out. (The baseline's all-reduce moves twice that.)
    Memory, the minimum: the ids and the owned rows read, the whole output written once (rows
    from peers land straight in it; nothing is staged and read again, which the former "+ wire"
    counted).
    """
    p, n, b = ctx.params, ctx.world_size, ctx.dtype.itemsize
    out_bytes = p["tokens"] * p["hidden"] * b
    wire = (n - 1) * out_bytes // n
    return Traffic(
        send_bytes=wire, recv_bytes=wire,
        memory_bytes=8 * p["tokens"] + out_bytes // n + out_bytes,
        flops=0,
        payload_bytes=out_bytes, bus_factor=bus_factor("all_reduce", n),
    )
