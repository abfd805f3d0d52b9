"""Halo feature exchange of a partitioned graph: every rank sends its boundary nodes' features to the
ranks whose edges point at them, with uneven counts per pair (all_to_all_single with split sizes).

Signature: gnn_halo_exchange(features: [N_r, F], send_indices: [sum_q C[r][q]] int64,
                             send_counts: [n] int64, recv_counts: [n] int64) -> halo: [sum_p C[p][r], F]

The partition is fixed by the graph, not by the trial (partition_plan): rank r owns N_r nodes and
sends C[r][q] of them to rank q (C[r][r] = 0; C differs per pair, and with three ranks or more one
pair shares no halo at all). send_indices lists, for q = 0..n-1 in turn, the local ids of the
C[r][q] distinct nodes rank q needs; send_counts = C[r][:], recv_counts = C[:][r] (exchanged once
when the partition was made, as DistDGL and PyG do). The halo holds the rows received from rank 0,
then rank 1, ..., each in the order the sender listed them.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from tasks import _comm
from tasks.base import EXACT_OUTPUT, TaskContext, TaskSpec, Tolerance, Traffic, bus_factor

TASK = TaskSpec(
    id="gnn_halo_exchange",
    title="GNN halo feature exchange (all-to-all with uneven per-pair counts)",
    family="graph",
    source="DistDGL / DGL distributed partition book, PyTorch Geometric distributed, CAGNET (SC'20)",
    why="Full-graph GNN training exchanges the features of boundary nodes before every layer; the "
        "counts are set by the partition (METIS) and uneven, so the all-to-all is irregular.",
    # Nodes owned per rank (about; the plan spreads them unevenly), feature width, and the fraction of
    # a rank's nodes each peer needs. default: ogbn-products (2.4M nodes) over 8 GPUs at hidden 128.
    sizes={
        "small": {"nodes_per_rank": 61, "features": 13, "halo_fraction": 0.15},
        "default": {"nodes_per_rank": 306_000, "features": 128, "halo_fraction": 0.03},
        "large": {"nodes_per_rank": 1_000_003, "features": 256, "halo_fraction": 0.03},
    },
    dtypes=("float32", "bfloat16", "float16"),
    # Pure data movement: bit-exact in every dtype.
    tolerances={name: Tolerance(atol=0.0, rtol=0.0) for name in ("float32", "bfloat16", "float16")},
    output_tolerances={"*": EXACT_OUTPUT},  # the float64 baseline moves/selects the same values: exact
)


@dataclass(frozen=True)
class PartitionPlan:
    nodes: list[int]  # nodes owned by each rank
    halo_counts: list[list[int]]  # halo_counts[src][dst]: nodes src sends to dst

    def sent_by(self, rank: int) -> int:
        return sum(self.halo_counts[rank])

    def received_by(self, rank: int) -> int:
        return sum(row[rank] for row in self.halo_counts)


def partition_plan(params: dict, world_size: int) -> PartitionPlan:
    """The graph's partition: the same for every trial and rank, like a real one (seeded by n only)."""
    gen = torch.Generator().manual_seed(7919 + world_size)
    base = params["nodes_per_rank"]
    nodes = [base + int(torch.randint(-base // 5, base // 5 + 1, (1,), generator=gen)) for _ in range(world_size)]
    counts = [[0] * world_size for _ in range(world_size)]
    for src in range(world_size):
        for dst in range(world_size):
            if src != dst:
                spread = 0.25 + 1.5 * float(torch.rand((), generator=gen))
                counts[src][dst] = min(nodes[src], int(params["halo_fraction"] * nodes[src] * spread))
    if world_size > 2:
        counts[world_size - 1][0] = 0  # two partitions that share no edge
    return PartitionPlan(nodes, counts)


def make_inputs(ctx: TaskContext) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    plan = partition_plan(ctx.params, ctx.world_size)
    r, n = ctx.rank, ctx.world_size
    features = ctx.randn(plan.nodes[r], ctx.params["features"], stream=0)
    gen = ctx.generator(stream=1)
    send_indices = torch.cat([
        torch.randperm(plan.nodes[r], generator=gen, device=ctx.device)[: plan.halo_counts[r][q]] for q in range(n)
    ])
    send_counts = torch.tensor(plan.halo_counts[r], dtype=torch.int64, device=ctx.device)
    recv_counts = torch.tensor([plan.halo_counts[p][r] for p in range(n)], dtype=torch.int64, device=ctx.device)
    return features, send_indices, send_counts, recv_counts


def baseline(features: torch.Tensor, send_indices: torch.Tensor, send_counts: torch.Tensor,
             recv_counts: torch.Tensor) -> torch.Tensor:
    send_rows = features.index_select(0, send_indices)
    recv_splits = recv_counts.tolist()
    halo = torch.empty(sum(recv_splits), features.shape[1], dtype=features.dtype, device=features.device)
    _comm.all_to_all_single(halo, send_rows, recv_splits, send_counts.tolist())
    return halo


def halo_for_each_rank(inputs_per_rank: list[tuple]) -> list[torch.Tensor]:
    """Plain indexing: the rows each rank's peers send it, in rank order (no communication)."""
    n = len(inputs_per_rank)
    outgoing = []  # outgoing[src][dst]: the rows src sends dst
    for features, send_indices, send_counts, _ in inputs_per_rank:
        outgoing.append(features[send_indices].split(send_counts.tolist()))
    return [torch.cat([outgoing[src][dst] for src in range(n)]) for dst in range(n)]


def reference(inputs_per_rank: list[tuple], ctx: TaskContext) -> list[torch.Tensor]:
    return [halo.clone() for halo in halo_for_each_rank(inputs_per_rank)]


def traffic(ctx: TaskContext) -> Traffic:
    # Exact, since the partition is fixed: rank r must send sum_q C[r][q] rows and receive
    # sum_p C[p][r] rows of F values; nothing is sent to itself. Bus bandwidth: the bytes this rank
    # sends per second (no self chunk, so no (n-1)/n factor). Memory: the sent rows gathered (read,
    # written to a send buffer) and the received rows written; the int64 indices read.
    plan = partition_plan(ctx.params, ctx.world_size)
    row_bytes = ctx.params["features"] * ctx.dtype.itemsize
    send = plan.sent_by(ctx.rank) * row_bytes
    recv = plan.received_by(ctx.rank) * row_bytes
    return Traffic(
        send_bytes=send, recv_bytes=recv,
        memory_bytes=2 * send + recv + 8 * plan.sent_by(ctx.rank),
        payload_bytes=send, bus_factor=bus_factor("sendrecv", ctx.world_size),
    )
