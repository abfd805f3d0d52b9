"""Vocab-parallel log-probabilities of the chosen tokens (the GRPO / PPO building block).

Signature: vocab_parallel_logprobs(logits_shard: [B, S, Vr], input_ids: [B, S] int64)
    -> token_logprobs: [B, S-1] float32

Logits of B sequences of S positions, split along the vocabulary as in Megatron (Vr = ceil(V / n)
columns per rank, rank r holding ids r*Vr .. (r+1)*Vr-1, padding columns included in the softmax).
input_ids is the same on every rank. Output [b, t] = log_softmax(logits[b, t])[input_ids[b, t+1]]:
the log-probability the policy gave to the token that was sampled next, which GRPO's ratio and KL
terms need for every generated token. Computed as NeMo-RL does, in float32: all-reduce (max) of
the row maxima, the local log-softmax with an all-reduced (sum) normaliser, the target's
log-probability picked where this rank owns it and all-reduced (sum).
"""

from __future__ import annotations

import math

import torch

from tasks import _comm
from tasks.base import TaskContext, TaskSpec, Tolerance, Traffic, accumulate_dtype, bus_factor

TASK = TaskSpec(
    id="vocab_parallel_logprobs",
    title="Vocab-parallel log-probabilities of chosen tokens (GRPO)",
    family="vocab",
    source="NeMo-RL distributed/model_utils.py (DistributedLogprob, from_parallel_logits_to_logprobs); "
           "Megatron-LM vocab-parallel LM head",
    why="RL post-training scores every generated token under the policy and the reference model; "
        "with a sharded LM head that is three all-reduces per micro-batch instead of a gather of "
        "[B, S, V] logits.",
    sizes={
        "small": {"batch": 3, "seq": 17, "vocab": 1001},
        # GRPO micro-batches of Qwen2.5 rollouts (151,936-token vocabulary): 4 x 4k and 4 x 8k tokens.
        "default": {"batch": 4, "seq": 4096, "vocab": 151936},
        "large": {"batch": 4, "seq": 8192, "vocab": 151936},
    },
    dtypes=("float32", "bfloat16"),
    # float32 arithmetic whatever the logits' dtype; log-probabilities down to ~-20 carry the error
    # of a float32 sum of up to 152k exps in another order (~sqrt(V)*eps ~ 2e-5 relative).
    tolerances={
        "float32": Tolerance(atol=2e-4, rtol=1e-5),
        "bfloat16": Tolerance(atol=2e-4, rtol=1e-5),
    },
)


def _shard_vocab(ctx: TaskContext) -> int:
    return math.ceil(ctx.params["vocab"] / ctx.world_size)


def make_inputs(ctx: TaskContext) -> tuple[torch.Tensor, torch.Tensor]:
    b, s = ctx.params["batch"], ctx.params["seq"]
    logits_shard = (2.0 * ctx.randn(b, s, _shard_vocab(ctx), stream=0, dtype=torch.float32)).to(ctx.dtype)
    input_ids = torch.randint(0, ctx.params["vocab"], (b, s), generator=ctx.shared_generator(stream=1),
                              device=ctx.device)
    return logits_shard, input_ids


def baseline(logits_shard: torch.Tensor, input_ids: torch.Tensor) -> torch.Tensor:
    rank = torch.distributed.get_rank()
    shard_vocab = logits_shard.shape[-1]
    target = input_ids.roll(-1, dims=-1)  # position t scores the token at t+1 (the last is dropped)

    logits_max = logits_shard.amax(dim=-1, keepdim=True).to(accumulate_dtype(logits_shard))
    _comm.all_reduce(logits_max, op=_comm.MAX)
    # One float32 working copy, updated in place (the input stays intact): [B, S, Vr] is the largest
    # tensor of an RL step, so NeMo-RL keeps its temporaries few.
    log_probs = logits_shard.to(logits_max.dtype, copy=True).sub_(logits_max)
    sum_exp = log_probs.exp().sum(dim=-1, keepdim=True)
    _comm.all_reduce(sum_exp)
    log_probs.sub_(sum_exp.log())

    vocab_start = rank * shard_vocab
    outside = (target < vocab_start) | (target >= vocab_start + shard_vocab)
    local_target = (target - vocab_start).masked_fill(outside, 0)
    token_logprobs = log_probs.gather(-1, local_target.unsqueeze(-1)).squeeze(-1).masked_fill(outside, 0.0)
    _comm.all_reduce(token_logprobs)
    return token_logprobs[:, :-1].contiguous()


def reference(inputs_per_rank: list[tuple], ctx: TaskContext) -> list[torch.Tensor]:
    logits = torch.cat([inputs[0].double() for inputs in inputs_per_rank], dim=-1)
    input_ids = inputs_per_rank[0][1]
    log_probs = torch.log_softmax(logits[:, :-1], dim=-1)
    chosen = log_probs.gather(-1, input_ids[:, 1:].unsqueeze(-1)).squeeze(-1)
    return [chosen.to(accumulate_dtype(ctx.dtype)) for _ in inputs_per_rank]


def traffic(ctx: TaskContext) -> Traffic:
    # Three all-reduces of B*S float32 (maxima, normalisers, chosen log-probs): payload 12*B*S bytes,
    # ring traffic 2(n-1)/n of it each way. Memory: the logits shard read once (max, normaliser and
    # the chosen entry can be fused in one online pass), ids read, B*(S-1) float32 written.
    # FLOPs: ~4 per logit.
    n = ctx.world_size
    positions = ctx.params["batch"] * ctx.params["seq"]
    payload = 12 * positions
    wire = 2 * (n - 1) * payload // n
    shard_elems = positions * _shard_vocab(ctx)
    return Traffic(
        send_bytes=wire, recv_bytes=wire,
        memory_bytes=shard_elems * ctx.dtype.itemsize + 8 * positions + 4 * positions,
        flops=4 * shard_elems,
        payload_bytes=payload, bus_factor=bus_factor("all_reduce", n),
    )
