"""torch.distributed calls that work the same on torch 2.11 and 2.13, NCCL and gloo, CPU and CUDA.

Baselines and torch-level solutions call these instead of the raw API when they need a collective
whose name or backend support differs:
- torch 2.13 renames all_gather_into_tensor / reduce_scatter_tensor to *_single; 2.11 lacks those.
- gloo on CUDA tensors (shared-gpu mode) runs all_reduce and broadcast natively; for the rest we
  stage through host memory, which is correct, and shared-gpu timings are labelled unrepresentative.
"""

from __future__ import annotations

from typing import Sequence

import torch
import torch.distributed as dist

_all_gather_single = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
_reduce_scatter_single = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor
SUM = dist.ReduceOp.SUM
MAX = dist.ReduceOp.MAX


def _needs_staging(tensors: Sequence[torch.Tensor], group=None) -> bool:
    return any(t.is_cuda for t in tensors) and dist.get_backend(group) == "gloo"


def _to_host(tensors: Sequence[torch.Tensor]) -> list[torch.Tensor]:
    return [t.detach().to("cpu") for t in tensors]


def _copy_back(dst: Sequence[torch.Tensor], src: Sequence[torch.Tensor]) -> None:
    for d, s in zip(dst, src):
        d.copy_(s)


def all_reduce(tensor: torch.Tensor, op=SUM, group=None) -> torch.Tensor:
    dist.all_reduce(tensor, op=op, group=group)
    return tensor


def broadcast(tensor: torch.Tensor, src: int, group=None) -> torch.Tensor:
    dist.broadcast(tensor, src=src, group=group)
    return tensor


def all_gather_single(output: torch.Tensor, input: torch.Tensor, group=None) -> torch.Tensor:
    """Concatenate every rank's ``input`` along dim 0 into ``output``."""
    if _needs_staging([output, input], group) or dist.get_backend(group) == "gloo":
        # gloo's all_gather_into_tensor needs contiguous same-device buffers; a list gather is the
        # form every gloo build runs.
        host_in = input.detach().to("cpu").contiguous()
        parts = [torch.empty_like(host_in) for _ in range(dist.get_world_size(group))]
        dist.all_gather(parts, host_in, group=group)
        output.copy_(torch.cat(parts).view_as(output))
        return output
    _all_gather_single(output, input.contiguous(), group=group)
    return output


def reduce_scatter_single(output: torch.Tensor, input: torch.Tensor, op=SUM, group=None) -> torch.Tensor:
    """Reduce ``input`` over ranks and leave chunk ``rank`` (along dim 0) in ``output``."""
    if _needs_staging([output, input], group):
        host_out, host_in = _to_host([output, input])
        _reduce_scatter_single(host_out, host_in.contiguous(), op=op, group=group)
        output.copy_(host_out)
        return output
    _reduce_scatter_single(output, input.contiguous(), op=op, group=group)
    return output


def all_to_all_single(
    output: torch.Tensor, input: torch.Tensor,
    output_split_sizes: list[int] | None = None, input_split_sizes: list[int] | None = None, group=None,
) -> torch.Tensor:
    if _needs_staging([output, input], group):
        host_out, host_in = _to_host([output, input])
        dist.all_to_all_single(host_out, host_in.contiguous(), output_split_sizes, input_split_sizes, group=group)
        output.copy_(host_out)
        return output
    dist.all_to_all_single(output, input.contiguous(), output_split_sizes, input_split_sizes, group=group)
    return output


def all_gather(outputs: list[torch.Tensor], input: torch.Tensor, group=None) -> list[torch.Tensor]:
    if _needs_staging([input, *outputs], group):
        host_outs = _to_host(outputs)
        dist.all_gather(host_outs, input.detach().to("cpu").contiguous(), group=group)
        _copy_back(outputs, host_outs)
        return outputs
    dist.all_gather(outputs, input.contiguous(), group=group)
    return outputs


def reduce(tensor: torch.Tensor, dst: int, op=SUM, group=None) -> torch.Tensor:
    if _needs_staging([tensor], group):
        host = tensor.detach().to("cpu")
        dist.reduce(host, dst=dst, op=op, group=group)
        tensor.copy_(host)
        return tensor
    dist.reduce(tensor, dst=dst, op=op, group=group)
    return tensor


def gather(tensor: torch.Tensor, gather_list: list[torch.Tensor] | None, dst: int, group=None) -> None:
    if _needs_staging([tensor, *(gather_list or [])], group):
        host_list = _to_host(gather_list) if gather_list is not None else None
        dist.gather(tensor.detach().to("cpu").contiguous(), host_list, dst=dst, group=group)
        if gather_list is not None:
            _copy_back(gather_list, host_list)
        return
    dist.gather(tensor.contiguous(), gather_list, dst=dst, group=group)


def scatter(tensor: torch.Tensor, scatter_list: list[torch.Tensor] | None, src: int, group=None) -> None:
    if _needs_staging([tensor, *(scatter_list or [])], group):
        host = tensor.detach().to("cpu")
        host_list = [t.detach().to("cpu").contiguous() for t in scatter_list] if scatter_list is not None else None
        dist.scatter(host, host_list, src=src, group=group)
        tensor.copy_(host)
        return
    dist.scatter(tensor, [t.contiguous() for t in scatter_list] if scatter_list is not None else None, src=src, group=group)


def all_to_all(outputs: list[torch.Tensor], inputs: list[torch.Tensor], group=None) -> list[torch.Tensor]:
    if _needs_staging([*inputs, *outputs], group):
        host_outs = _to_host(outputs)
        dist.all_to_all(host_outs, [t.detach().to("cpu").contiguous() for t in inputs], group=group)
        _copy_back(outputs, host_outs)
        return outputs
    dist.all_to_all(outputs, [t.contiguous() for t in inputs], group=group)
    return outputs


def sendrecv(
    send: torch.Tensor | None, dst: int | None, recv: torch.Tensor | None, src: int | None, group=None,
) -> None:
    """Send to ``dst`` and receive from ``src`` at once (no ordering deadlock); either may be None."""
    staging = _needs_staging([t for t in (send, recv) if t is not None], group)
    send_buf = send.detach().to("cpu").contiguous() if (staging and send is not None) else send
    recv_buf = torch.empty_like(recv, device="cpu") if (staging and recv is not None) else recv
    ops = []
    if send_buf is not None and dst is not None:
        ops.append(dist.P2POp(dist.isend, send_buf.contiguous(), _global(dst, group), group=group))
    if recv_buf is not None and src is not None:
        ops.append(dist.P2POp(dist.irecv, recv_buf, _global(src, group), group=group))
    if ops:
        for work in dist.batch_isend_irecv(ops):
            work.wait()
    if staging and recv is not None and src is not None:
        recv.copy_(recv_buf)


def _global(rank: int, group) -> int:
    return rank if group is None else dist.get_global_rank(group, rank)
