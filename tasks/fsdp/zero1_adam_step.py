"""ZeRO-1/2 sharded AdamW step: reduce-scatter gradients, Adam on the local shard, all-gather parameters.

Signature: zero1_adam_step(params: [N], grads: [N], exp_avg_shard: [S], exp_avg_sq_shard: [S])
    -> (new_params: [N], new_exp_avg_shard: [S], new_exp_avg_sq_shard: [S])

params are replicated (the same on every rank), grads are this rank's own (unreduced) gradients.
The flat buffer is zero-padded to n*S elements, S = ceil(N / n); rank r owns elements
r*S .. (r+1)*S-1 and keeps the AdamW moments only for them (float32, whatever the parameter dtype).
Each rank: reduce-scatter the gradients and divide by n (average), run AdamW in float32 on its
shard (hyper-parameters below, step STEP for the bias correction), cast the updated shard to the
parameter dtype and all-gather the parameters. The moments of the padding are updated like the
rest (zero gradient), as DeepSpeed's padded partitions are.
"""

from __future__ import annotations

import math

import torch

from tasks import _comm
from tasks.base import TaskContext, TaskSpec, Tolerance, Traffic, bus_factor

# lr and weight decay are large on purpose: every step of AdamW must move the parameters by more
# than their bf16 rounding (median relative error ~eps/8 = 1e-3, the judge allows ~4e-3). With
# params ~N(0, 1) and these moments, the update is ~2.5% of a parameter, the bias correction
# changes it ~6x (8% of a parameter), the decay is lr * wd = 3%: a candidate skipping any of them
# fails in every dtype. The second moment's update (~0.1/n relative) shows in exp_avg_sq itself.
LR = 0.1
BETA1, BETA2 = 0.9, 0.999
EPS = 1e-8
WEIGHT_DECAY = 0.3
STEP = 5  # the optimizer step being taken (bias correction 1 - beta^STEP)

TASK = TaskSpec(
    id="zero1_adam_step",
    title="ZeRO-1 sharded AdamW step (reduce-scatter grads, local Adam, all-gather params)",
    family="fsdp",
    source="DeepSpeed ZeRO stage 1/2 (DeepSpeedZeroOptimizer), torch ZeroRedundancyOptimizer, "
           "Megatron-LM distributed optimizer",
    why="Sharding the optimizer state cuts its memory n-fold at the price of a reduce-scatter and an "
        "all-gather of the whole model per step: the optimizer step becomes a communication step.",
    # N is not a multiple of the world size (the padding path). default: the 350M parameters of a
    # GPT-2-medium-sized model in one flat buffer; large: 1.3B (GPT-3 XL).
    sizes={
        "small": {"numel": 10_007},
        "default": {"numel": 350_000_003},
        "large": {"numel": 1_300_000_001},
    },
    dtypes=("float32", "bfloat16"),
    # (compare_outputs; the judge uses the default output tolerances, k = 3 over the baseline's own
    # error.) Parameters: the update is computed in fp32, so new params carry one rounding to the dtype. Moments: computed in fp32 from a gradient
    # averaged in the dtype over up to 8 ranks (bf16: up to 7 roundings of partial sums ~3x the
    # result, /n -> ~1e-2 abs on a gradient of std 1/sqrt(n)); exp_avg sees 0.1x of that error,
    # exp_avg_sq 0.001x of twice the relative error.
    tolerances={
        "float32": Tolerance(atol=1e-5, rtol=1e-5),
        "bfloat16": Tolerance(atol=2e-2, rtol=2e-2),
    },
)


def _shard_numel(ctx: TaskContext) -> int:
    return math.ceil(ctx.params["numel"] / ctx.world_size)


def make_inputs(ctx: TaskContext) -> tuple[torch.Tensor, ...]:
    n_params, s = ctx.params["numel"], _shard_numel(ctx)
    params = torch.randn(n_params, generator=ctx.shared_generator(stream=0), device=ctx.device).to(ctx.dtype)
    grads = ctx.randn(n_params, stream=1)
    # Moments of a run in progress: exp_avg ~ a smoothed gradient, exp_avg_sq > 0 ~ gradient^2.
    exp_avg = 0.1 * ctx.randn(s, stream=2, dtype=torch.float32)
    exp_avg_sq = 0.01 * ctx.randn(s, stream=3, dtype=torch.float32).square() + 1e-4
    return params, grads, exp_avg, exp_avg_sq


def _adamw(param: torch.Tensor, grad: torch.Tensor, exp_avg: torch.Tensor, exp_avg_sq: torch.Tensor):
    """torch.optim.AdamW's single-tensor update, into new tensors, in the dtype of its arguments."""
    exp_avg = exp_avg.mul(BETA1).add_(grad, alpha=1 - BETA1)
    exp_avg_sq = exp_avg_sq.mul(BETA2).addcmul_(grad, grad, value=1 - BETA2)
    bias1, bias2 = 1 - BETA1 ** STEP, 1 - BETA2 ** STEP
    denom = exp_avg_sq.sqrt().div_(math.sqrt(bias2)).add_(EPS)
    param = param.mul(1 - LR * WEIGHT_DECAY).addcdiv_(exp_avg, denom, value=-LR / bias1)
    return param, exp_avg, exp_avg_sq


def baseline(params: torch.Tensor, grads: torch.Tensor, exp_avg_shard: torch.Tensor, exp_avg_sq_shard: torch.Tensor):
    n = torch.distributed.get_world_size()
    rank = torch.distributed.get_rank()
    s = exp_avg_shard.numel()
    numel = params.numel()

    padded_grads = torch.zeros(n * s, dtype=grads.dtype, device=grads.device)
    padded_grads[:numel] = grads
    grad_shard = torch.empty(s, dtype=grads.dtype, device=grads.device)
    _comm.reduce_scatter_single(grad_shard, padded_grads)

    # float32 (float64 when the judge runs this on float64 copies for the truth), the last one padded
    param_shard = torch.zeros(s, dtype=exp_avg_shard.dtype, device=params.device)
    owned = params[rank * s:(rank + 1) * s]
    param_shard[: owned.numel()] = owned
    new_param_shard, new_exp_avg, new_exp_avg_sq = _adamw(
        param_shard, grad_shard.to(exp_avg_shard.dtype) / n, exp_avg_shard, exp_avg_sq_shard,
    )

    gathered = torch.empty(n * s, dtype=params.dtype, device=params.device)
    _comm.all_gather_single(gathered, new_param_shard.to(params.dtype))
    return gathered[:numel], new_exp_avg, new_exp_avg_sq


def reference(inputs_per_rank: list[tuple], ctx: TaskContext) -> list[tuple]:
    n = len(inputs_per_rank)
    numel = ctx.params["numel"]
    s = _shard_numel(ctx)
    params = torch.zeros(n * s, dtype=torch.float64)
    params[:numel] = inputs_per_rank[0][0].double()
    grad = torch.zeros(n * s, dtype=torch.float64)
    grad[:numel] = sum(inputs[1].double() for inputs in inputs_per_rank) / n
    exp_avg = torch.cat([inputs[2].double() for inputs in inputs_per_rank])
    exp_avg_sq = torch.cat([inputs[3].double() for inputs in inputs_per_rank])
    new_params, new_avg, new_avg_sq = _adamw(params, grad, exp_avg, exp_avg_sq)
    new_params = new_params[:numel].to(ctx.dtype)
    moments = inputs_per_rank[0][2].dtype  # float32 (float64 for the truth)
    return [
        (new_params.clone(), new_avg[r * s:(r + 1) * s].to(moments), new_avg_sq[r * s:(r + 1) * s].to(moments))
        for r in range(n)
    ]


def traffic(ctx: TaskContext) -> Traffic:
    """The least a rank moves for one ZeRO-1 step of N parameters (shard S = ceil(N/n), b bytes each).

    Wire: G = n*S*b bytes of padded gradients/parameters. Reduce-scatter: (n-1)/n*G out and in;
    all-gather of the parameters: the same again -- the traffic of one all-reduce (hence
    DeepSpeed's claim that ZeRO-1/2 costs no more communication than DDP). Payload G with the
    all-reduce factor.
    Memory, the minimum: every gradient read once (N*b: this rank's contribution to every shard,
    read by itself or pulled by the peer that owns the shard), the owned parameter shard read
    (S*b), the fp32 moments read and written (16 B per shard element), every new parameter
    written once (N*b: a fused kernel stores the updated shard straight into every rank's output).
    Padding buffers, staged chunks and the fp32 parameter copy the baseline makes are its own
    choices, not needed (the former model counted them: 1.3-2.5x this).
    FLOPs: the reduction plus ~12 per element of AdamW.
    """
    n = ctx.world_size
    b = ctx.dtype.itemsize
    s = _shard_numel(ctx)
    full_bytes = n * s * b
    wire = 2 * (n - 1) * full_bytes // n
    numel_bytes = ctx.params["numel"] * b
    memory = 2 * numel_bytes + s * (16 + b)
    return Traffic(
        send_bytes=wire, recv_bytes=wire, memory_bytes=memory,
        flops=(n - 1) * s + 12 * s,
        payload_bytes=full_bytes, bus_factor=bus_factor("all_reduce", n),
    )
