"""Top-k over vocabulary-sharded scores: local top-k, all-gather of the candidates, merge.

Signature: distributed_topk(scores_shard: [B, Vr]) -> (values: [B, K], indices: [B, K] int64)

Scores of B rows over a vocabulary (or database) of V entries, split as Megatron splits the LM
head: Vr = ceil(V / n) columns per rank, rank r holding ids r*Vr .. (r+1)*Vr-1; the padding columns
past V hold -inf (masked before sampling, as vLLM and Megatron inference do). Every rank returns
the K = 50 largest scores of each row over the whole vocabulary, in descending order, with their
global ids. Each rank takes its local top-K, the K candidates of every rank are all-gathered
(values and ids), and the n*K candidates are merged: K*(4+8) bytes per row per rank move instead
of the Vr scores.
"""

from __future__ import annotations

import math

import torch

from tasks import _comm
from tasks.base import EXACT_OUTPUT, TaskContext, TaskSpec, Tolerance, Traffic, bus_factor

K = 50  # the usual top-k of sampling (Hugging Face generate's default top_k)

TASK = TaskSpec(
    id="distributed_topk",
    title="Distributed top-k over vocabulary shards (local top-k, all-gather, merge)",
    family="other",
    source="Top-k sampling with a vocab-parallel LM head (Megatron-LM inference, TensorRT-LLM); "
           "sharded nearest-neighbour search (FAISS IndexShards merge)",
    why="Gathering the full [B, V] scores for sampling moves V values per row; a local top-k first "
        "cuts that to n*K, leaving a small latency-bound all-gather on every decoding step.",
    sizes={
        "small": {"batch": 5, "vocab": 1001},
        # A decoding batch of 256 over Qwen2.5's vocabulary; large: 1024 rows over Gemma's 256k.
        "default": {"batch": 256, "vocab": 151936},
        "large": {"batch": 1024, "vocab": 256000},
    },
    # Selection needs a strict order: bf16 scores tie at the K-th place too often for the indices to
    # be defined, and samplers work on float32 logits anyway.
    dtypes=("float32", "float64"),
    # Values are selected, not computed: bit-exact, as are the indices.
    tolerances={name: Tolerance(atol=0.0, rtol=0.0) for name in ("float32", "float64")},
    output_tolerances={"*": EXACT_OUTPUT},  # the float64 baseline moves/selects the same values: exact
)


def _shard_vocab(ctx: TaskContext) -> int:
    return math.ceil(ctx.params["vocab"] / ctx.world_size)


def make_inputs(ctx: TaskContext) -> tuple[torch.Tensor]:
    width = _shard_vocab(ctx)
    scores = 3.0 * ctx.randn(ctx.params["batch"], width, stream=0)
    real = max(0, min(width, ctx.params["vocab"] - ctx.rank * width))
    scores[:, real:] = float("-inf")  # padding of the vocabulary past V
    return (scores,)


def baseline(scores_shard: torch.Tensor):
    n = torch.distributed.get_world_size()
    rank = torch.distributed.get_rank()
    rows, width = scores_shard.shape
    per_rank = min(K, width)  # shards narrower than K (many ranks, small vocabulary) send all they have
    local_values, local_ids = torch.topk(scores_shard, per_rank, dim=1)
    local_ids += rank * width

    all_values = torch.empty(n * rows, per_rank, dtype=scores_shard.dtype, device=scores_shard.device)
    all_ids = torch.empty(n * rows, per_rank, dtype=torch.int64, device=scores_shard.device)
    _comm.all_gather_single(all_values, local_values)
    _comm.all_gather_single(all_ids, local_ids)
    # [n*B, k] rank-major -> [B, n*k] candidates per row.
    candidates = all_values.view(n, rows, per_rank).permute(1, 0, 2).reshape(rows, n * per_rank)
    candidate_ids = all_ids.view(n, rows, per_rank).permute(1, 0, 2).reshape(rows, n * per_rank)
    values, positions = torch.topk(candidates, K, dim=1)
    return values, candidate_ids.gather(1, positions)


def reference(inputs_per_rank: list[tuple], ctx: TaskContext) -> list[tuple]:
    scores = torch.cat([inputs[0] for inputs in inputs_per_rank], dim=1)
    values, ids = torch.topk(scores.double(), K, dim=1)
    return [(values.to(ctx.dtype), ids.clone()) for _ in inputs_per_rank]


def traffic(ctx: TaskContext) -> Traffic:
    # Each rank must deliver its K candidates per row (value + int64 id) to n-1 peers and receive
    # theirs: (n-1) * B * K * (b + 8) bytes each way (the all-gather's (n-1)/n of its n*B*K output).
    # Memory: the shard read once; candidates written and read. FLOPs: ~1 comparison per score.
    n = ctx.world_size
    rows = ctx.params["batch"]
    candidate_bytes = rows * min(K, _shard_vocab(ctx)) * (ctx.dtype.itemsize + 8)
    wire = (n - 1) * candidate_bytes
    shard = rows * _shard_vocab(ctx)
    return Traffic(
        send_bytes=wire, recv_bytes=wire,
        memory_bytes=shard * ctx.dtype.itemsize + 3 * n * candidate_bytes,
        flops=shard,
        payload_bytes=n * candidate_bytes, bus_factor=bus_factor("all_gather", n),
    )
