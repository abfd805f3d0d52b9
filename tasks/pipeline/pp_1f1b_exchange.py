"""Pipeline 1F1B step: activations forward and their gradients backward between stages.

Signature: pp_1f1b_exchange(micro_batches: [M, T, H or 0], loss_grads: [M, T, H or 0],
                            weight: [H, H], bias: [H]) -> (grad_weight: [H, H] float32, grad_bias: [H] float32)

Rank r is stage r with its own layer y = gelu(x W_r^T + b_r); stage 0 holds the M micro-batches and
the last stage the gradient of the loss with respect to its output for each micro-batch, what the
loss head would hand it (elsewhere [M, T, 0] placeholders carrying the schedule's shape). The stages
run Megatron's non-interleaved one-forward-one-backward schedule: n-r-1
warm-up forwards, then alternate forward and backward, then drain the backwards; activations go to
r+1 and activation gradients to r-1, paired in one batch_isend_irecv where the schedule pairs them.
Each rank returns its layer's weight and bias gradients summed over micro-batches, accumulated in
float32 (Megatron's main_grad) whatever the activation dtype.
"""

from __future__ import annotations

import math
from collections import deque

import torch
import torch.nn.functional as F

from tasks import _comm
from tasks.base import TaskContext, TaskSpec, Tolerance, Traffic, accumulate_dtype, bus_factor

GAIN = 1.5  # as in pp_send_recv_microbatches: O(1) activations and gradients through any depth

TASK = TaskSpec(
    id="pp_1f1b_exchange",
    title="Pipeline 1F1B: activations forward, gradients backward, per micro-batch",
    family="pipeline",
    source="PipeDream-Flush / Megatron-LM forward_backward_pipelining_without_interleaving",
    why="1F1B bounds stashed activations by the pipeline depth; every steady-state step pairs a send "
        "of activations with a receive of gradients, so point-to-point latency is paid 2M times.",
    sizes={
        "small": {"micro_batches": 5, "tokens": 6, "hidden": 37},
        # 16 micro-batches of 2k tokens, hidden 4096; large: 32 of 4k tokens, hidden 8192.
        "default": {"micro_batches": 16, "tokens": 2048, "hidden": 4096},
        "large": {"micro_batches": 32, "tokens": 4096, "hidden": 8192},
    },
    dtypes=("float32", "bfloat16"),
    # Gradients are O(1) sums over M*T tokens, accumulated in fp32. fp32: a chain of 2n GEMMs of
    # <= 8192 terms, ~1e-6 relative. bf16: each stage rounds its activations and activation
    # gradients (2^-9) and each micro-batch's weight gradient before the fp32 sum; the errors add up
    # over 8 stages forward and 8 back to ~1.5% of the gradients' RMS (~0.8) on every element alike
    # (measured at 8 stages: RMS 1.3e-2, max 0.14 over 8 x 1369 elements). The 5-sigma tail of 67M
    # elements (large) and a candidate rounding differently from the baseline (x sqrt 2) need ~0.2;
    # a dropped or repeated micro-batch moves most gradients by ~0.3 and many by > 1.
    tolerances={
        "float32": Tolerance(atol=1e-4, rtol=1e-4),
        "bfloat16": Tolerance(atol=0.2, rtol=5e-2),
    },
)


def make_inputs(ctx: TaskContext) -> tuple[torch.Tensor, ...]:
    m, t, h = ctx.params["micro_batches"], ctx.params["tokens"], ctx.params["hidden"]
    first, last = ctx.rank == 0, ctx.rank == ctx.world_size - 1
    micro_batches = ctx.randn(m, t, h if first else 0, stream=0)
    # Zero-mean like a real loss gradient; 1/sqrt(M*T) keeps the summed weight gradients O(1).
    loss_grads = (ctx.randn(m, t, h if last else 0, stream=1, dtype=torch.float32) / math.sqrt(m * t)).to(ctx.dtype)
    weight = (ctx.randn(h, h, stream=2, dtype=torch.float32) * (GAIN / math.sqrt(h))).to(ctx.dtype)
    bias = (0.1 * ctx.randn(h, stream=3, dtype=torch.float32)).to(ctx.dtype)
    return micro_batches, loss_grads, weight, bias


def baseline(micro_batches: torch.Tensor, loss_grads: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor):
    n = torch.distributed.get_world_size()
    rank = torch.distributed.get_rank()
    first, last = rank == 0, rank == n - 1
    count, tokens = micro_batches.shape[:2]
    hidden = weight.shape[0]
    grad_weight = torch.zeros(hidden, hidden, dtype=accumulate_dtype(weight), device=weight.device)
    grad_bias = torch.zeros(hidden, dtype=accumulate_dtype(weight), device=weight.device)
    stash: deque = deque()  # (input, pre-activation) of micro-batches awaiting their backward
    next_input = iter(range(count))
    next_loss_grad = iter(range(count))

    def buffer() -> torch.Tensor:
        return torch.empty(tokens, hidden, dtype=weight.dtype, device=weight.device)

    # The p2p helpers of Megatron's schedule; an absent peer makes them no-ops.
    def recv_forward():
        if first:
            return micro_batches[next(next_input)]
        x = buffer()
        _comm.sendrecv(None, None, x, rank - 1)
        return x

    def send_forward(y):
        if not last:
            _comm.sendrecv(y, rank + 1, None, None)

    def send_forward_recv_backward(y):
        if last:
            return None
        grad_y = buffer()
        _comm.sendrecv(y, rank + 1, grad_y, rank + 1)
        return grad_y

    def recv_backward():
        if last:
            return None
        grad_y = buffer()
        _comm.sendrecv(None, None, grad_y, rank + 1)
        return grad_y

    def send_backward(grad_x):
        if not first:
            _comm.sendrecv(grad_x, rank - 1, None, None)

    def send_backward_recv_forward(grad_x):
        if first:
            return micro_batches[next(next_input)]
        x = buffer()
        _comm.sendrecv(grad_x, rank - 1, x, rank - 1)
        return x

    def forward_step(x):
        pre = torch.addmm(bias, x, weight.t())
        y = F.gelu(pre)
        stash.append((x, pre))
        return y

    def backward_step(grad_y):
        x, pre = stash.popleft()
        if grad_y is None:  # last stage: the loss head's gradient
            grad_y = loss_grads[next(next_loss_grad)]
        grad_pre = torch.ops.aten.gelu_backward(grad_y, pre)
        grad_weight.add_(torch.mm(grad_pre.t(), x).to(grad_weight.dtype))
        grad_bias.add_(grad_pre.to(grad_bias.dtype).sum(0))
        return None if first else torch.mm(grad_pre, weight)

    warmup = min(n - rank - 1, count)
    remaining = count - warmup
    for _ in range(warmup):
        send_forward(forward_step(recv_forward()))
    x = recv_forward() if remaining > 0 else None
    for i in range(remaining):
        grad_y = send_forward_recv_backward(forward_step(x))
        grad_x = backward_step(grad_y)
        if i == remaining - 1:
            send_backward(grad_x)
        else:
            x = send_backward_recv_forward(grad_x)
    for _ in range(warmup):
        send_backward(backward_step(recv_backward()))
    return grad_weight, grad_bias


def reference(inputs_per_rank: list[tuple], ctx: TaskContext) -> list[tuple]:
    with torch.inference_mode(False), torch.enable_grad():
        params = [(w.detach().double().requires_grad_(), b.detach().double().requires_grad_())
                  for _, _, w, b in inputs_per_rank]
        y = inputs_per_rank[0][0].double()
        for weight, bias in params:
            y = F.gelu(y @ weight.t() + bias)
        y.backward(inputs_per_rank[-1][1].double())
    wide = accumulate_dtype(ctx.dtype)  # float32 (float64 for the truth)
    return [(weight.grad.to(wide), bias.grad.to(wide)) for weight, bias in params]


def traffic(ctx: TaskContext) -> Traffic:
    # Each boundary carries the M*T*H activations forward and as many gradients back. Stage r sends
    # activations to r+1 (unless last) and gradients to r-1 (unless first), and receives the same:
    # an inner stage moves 2*A bytes each way, the end stages A. Point-to-point: factor 1 over the
    # bytes one rank sends. Memory, per micro-batch element: forward reads x and writes pre and y;
    # backward reads grad_y, pre, x (twice) and writes grad_pre (read twice) and grad_x; plus the
    # weight read twice and the float32 gradients written once. FLOPs per micro-batch: the forward
    # GEMM and the weight-gradient GEMM, plus the input-gradient GEMM on every stage but the first
    # (stage 0 has no one to send it to; counting it there put an H200 at 109% of the floor).
    # Messages: stage 0's weight gradient needs activations forward through n-1 boundaries and their
    # gradients back through n-1, one after another: 2(n-1) dependent messages.
    n, r = ctx.world_size, ctx.rank
    p = ctx.params
    b = ctx.dtype.itemsize
    act_elems = p["micro_batches"] * p["tokens"] * p["hidden"]
    act_bytes = act_elems * b
    send = (act_bytes if r < n - 1 else 0) + (act_bytes if r > 0 else 0)
    h = p["hidden"]
    return Traffic(
        send_bytes=send, recv_bytes=send,
        memory_bytes=11 * act_bytes + 2 * (h * h + h) * b + 4 * (h * h + h),
        flops=(6 if r > 0 else 4) * act_elems * h + 20 * act_elems,
        payload_bytes=send, bus_factor=bus_factor("sendrecv", n),
        messages=max(1, 2 * (n - 1)),
    )
