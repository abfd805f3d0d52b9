"""Vocab-parallel cross-entropy: softmax loss over logits sharded along the vocabulary.

Signature: vocab_parallel_cross_entropy(logits_shard: [T, Vr], target: [T] int64) -> loss: [T] float32

The LM head's output is split along the vocabulary, padded as Megatron pads it: Vr = ceil(V / n)
columns per rank, rank r holding vocabulary ids r*Vr .. (r+1)*Vr-1 (the padding columns are real
logits of unused rows, and take part in the softmax, as in Megatron). target (the same on every
rank) holds ids < V. Each rank returns the per-token loss logsumexp(logits) - logits[target],
computed in float32 (Megatron casts the logits to float32 first), without gathering the logits:
all-reduce (max) of the row maxima, then one all-reduce (sum) of [target logit; sum of exp].
"""

from __future__ import annotations

import math

import torch

from tasks import _comm
from tasks.base import TaskContext, TaskSpec, Tolerance, Traffic, accumulate_dtype, bus_factor

TASK = TaskSpec(
    id="vocab_parallel_cross_entropy",
    title="Vocab-parallel cross-entropy (max and sum-exp all-reduces)",
    family="vocab",
    source="Megatron-LM tensor_parallel/cross_entropy.py (_VocabParallelCrossEntropy)",
    why="Gathering [tokens, vocab] logits would move gigabytes per step; reducing three numbers per "
        "token instead makes the loss cheap, but its small all-reduces sit on the critical path.",
    sizes={
        "small": {"tokens": 37, "vocab": 1001},
        # 8k tokens per micro-batch, Llama-3 vocabulary; large: 16k tokens, Gemma's 256k vocabulary.
        "default": {"tokens": 8192, "vocab": 128256},
        "large": {"tokens": 16384, "vocab": 256000},
    },
    dtypes=("float32", "bfloat16"),
    # All arithmetic is float32 whatever the logits' dtype (the bf16 values are exact in fp32). The
    # sum of up to 256k exps in another order differs by ~sqrt(V)*eps ~ 3e-5 relative, which the log
    # turns into the same absolute error on a loss of ~log(V) ~ 12.
    tolerances={
        "float32": Tolerance(atol=2e-4, rtol=1e-5),
        "bfloat16": Tolerance(atol=2e-4, rtol=1e-5),
    },
)


def _shard_vocab(ctx: TaskContext) -> int:
    return math.ceil(ctx.params["vocab"] / ctx.world_size)


def make_inputs(ctx: TaskContext) -> tuple[torch.Tensor, torch.Tensor]:
    tokens = ctx.params["tokens"]
    logits_shard = (2.0 * ctx.randn(tokens, _shard_vocab(ctx), stream=0, dtype=torch.float32)).to(ctx.dtype)
    target = torch.randint(0, ctx.params["vocab"], (tokens,), generator=ctx.shared_generator(stream=1),
                           device=ctx.device)
    return logits_shard, target


def baseline(logits_shard: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    rank = torch.distributed.get_rank()
    logits_max = logits_shard.max(dim=-1).values.to(accumulate_dtype(logits_shard))  # exact in any dtype
    _comm.all_reduce(logits_max, op=_comm.MAX)
    logits = logits_shard.to(logits_max.dtype) - logits_max.unsqueeze(-1)  # a new tensor: the input stays intact

    vocab_start = rank * logits.shape[-1]
    outside = (target < vocab_start) | (target >= vocab_start + logits.shape[-1])
    local_target = (target - vocab_start).masked_fill(outside, 0)
    predicted = logits.gather(-1, local_target.unsqueeze(-1)).squeeze(-1).masked_fill(outside, 0.0)
    sum_exp = logits.exp_().sum(dim=-1)

    # One all-reduce for both (Megatron concatenates them).
    predicted_and_sum_exp = torch.cat([predicted, sum_exp])
    _comm.all_reduce(predicted_and_sum_exp)
    predicted, sum_exp = predicted_and_sum_exp.chunk(2)
    return torch.log(sum_exp) - predicted


def reference(inputs_per_rank: list[tuple], ctx: TaskContext) -> list[torch.Tensor]:
    logits = torch.cat([inputs[0].double() for inputs in inputs_per_rank], dim=-1)
    target = inputs_per_rank[0][1]
    loss = torch.logsumexp(logits, dim=-1) - logits.gather(-1, target.unsqueeze(-1)).squeeze(-1)
    return [loss.to(accumulate_dtype(ctx.dtype)) for _ in inputs_per_rank]


def traffic(ctx: TaskContext) -> Traffic:
    # Two all-reduces: T float32 maxima, then 2T float32 (target logit, sum of exps): payload 12T
    # bytes, ring traffic 2(n-1)/n of it each way. Memory: the logits shard read once (an online
    # softmax can fuse max and sum-exp), target read, loss written. FLOPs: ~4 per logit (max,
    # subtract, exp, add).
    n = ctx.world_size
    tokens = ctx.params["tokens"]
    payload = 12 * tokens
    wire = 2 * (n - 1) * payload // n
    shard_elems = tokens * _shard_vocab(ctx)
    return Traffic(
        send_bytes=wire, recv_bytes=wire,
        memory_bytes=shard_elems * ctx.dtype.itemsize + 8 * tokens + 4 * tokens,
        flops=4 * shard_elems,
        payload_bytes=payload, bus_factor=bus_factor("all_reduce", n),
    )
