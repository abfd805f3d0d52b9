"""Binomial-tree scatter from rank 0 with point-to-point sends: the mirror of the tree gather.

With the root at 0, the subtree under rank r at round k is ranks r .. r + 2^k - 1, a contiguous run
of row blocks of the root's input. A parent sends each child its own block and then, as a second
message, the blocks of the child's subtree, which the child forwards the same way. Each rank's
block lands straight in its output. ceil(log2 n) rounds; the root still sends all n-1 foreign blocks.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from tasks import _comm

ROOT = 0


def _subtree_size(me: int, n: int) -> int:
    """Ranks under `me` (itself included): its lowest set bit's value, clipped to the world."""
    return min(_lowest_bit(me, n), n - me)


def _lowest_bit(me: int, n: int) -> int:
    """The value of me's lowest set bit; for the root, the power of two at or above n."""
    return me & -me if me else 1 << (n - 1).bit_length()


def solution(x: torch.Tensor) -> torch.Tensor:
    rank, n = dist.get_rank(), dist.get_world_size()
    me = (rank - ROOT) % n
    rows = x.shape[0] // n
    size = _subtree_size(me, n)
    # Blocks me+1 .. me+size-1 (the subtree below us), in order.
    if me == 0:
        out = x[:rows].clone()
        below = x[rows:]
    else:
        out = x.new_empty(rows, *x.shape[1:])
        below = x.new_empty((size - 1) * rows, *x.shape[1:])
        parent = (me - _lowest_bit(me, n) + ROOT) % n
        _comm.sendrecv(None, None, out, parent)
        if below.shape[0]:
            _comm.sendrecv(None, None, below, parent)
    mask = _lowest_bit(me, n) >> 1  # children are me + 2^k below our lowest set bit
    while mask > 0:  # largest subtree first: it has the most forwarding still to do
        child = me + mask
        if child < n:
            start = (child - me - 1) * rows
            child_rows = _subtree_size(child, n) * rows
            dst = (child + ROOT) % n
            _comm.sendrecv(below[start:start + rows], dst, None, None)
            if child_rows > rows:
                _comm.sendrecv(below[start + rows:start + child_rows], dst, None, None)
        mask >>= 1
    return out
