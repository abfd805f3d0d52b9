"""Ring all-reduce from point-to-point sends: a reduce-scatter ring, then an all-gather ring.

The flattened tensor is cut into n chunks (chunk c spans elements c*N//n .. (c+1)*N//n, so lengths
that n does not divide give chunks differing by one element; empty chunks are skipped on both ends
alike). Each rank sends and receives 2(n-1)/n of the tensor, the bandwidth-optimal amount.
Self-contained on purpose: the engine stores each solution file's text to trace a result.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from tasks import _comm


def _sendrecv(send: torch.Tensor, dst: int, recv: torch.Tensor, src: int) -> None:
    # A message exists only for a non-empty chunk; both ends compute the same bounds, so they agree.
    _comm.sendrecv(send if send.numel() else None, dst, recv if recv.numel() else None, src)


def solution(x: torch.Tensor) -> torch.Tensor:
    rank, n = dist.get_rank(), dist.get_world_size()
    out = x.reshape(-1).clone()
    if n == 1:
        return out.view(x.shape)
    bounds = [c * out.numel() // n for c in range(n + 1)]
    chunk = [out[bounds[c]:bounds[c + 1]] for c in range(n)]
    right, left = (rank + 1) % n, (rank - 1) % n
    incoming = torch.empty_like(out[: bounds[1] - bounds[0] + 1])

    # Reduce-scatter: after step s, chunk (rank - s - 1) holds the sum of s + 2 ranks' values;
    # after n-1 steps this rank owns the full sum of chunk (rank + 1).
    for step in range(n - 1):
        send_c, recv_c = (rank - step) % n, (rank - step - 1) % n
        buf = incoming[: chunk[recv_c].numel()]
        _sendrecv(chunk[send_c], right, buf, left)
        chunk[recv_c].add_(buf)

    # All-gather: pass the finished chunks around the ring, straight into place.
    for step in range(n - 1):
        send_c, recv_c = (rank + 1 - step) % n, (rank - step) % n
        _sendrecv(chunk[send_c], right, chunk[recv_c], left)
    return out.view(x.shape)
