"""GraphSAGE mean-aggregation layer on a partitioned graph: halo exchange, then neighbour mean and
the layer's two linear maps.

Signature: gnn_neighbor_aggregate(features: [N_r, F], send_indices, send_counts, recv_counts,
                                  edge_src: [E_r] int64, edge_dst: [E_r] int64,
                                  weight_self: [F_out, F], weight_neigh: [F_out, F]) -> out: [N_r, F_out]

The first four inputs and the partition are those of gnn_halo_exchange. Rank r holds the edges
pointing at its own nodes: edge_dst is a local node id, edge_src an id in the rank's feature table
[own nodes; halo rows] (0 .. N_r + H_r - 1), so about H_r / (N_r + H_r) of the messages come from
other ranks. Output: out[v] = x[v] W_self^T + mean_{(u, v)} table[u] W_neigh^T, the mean taken over
v's in-edges (0 for a node without any), as DGL's SAGEConv('mean') computes it; the sums are
accumulated in float32 and the mean rounded to the dtype before the linear maps.
"""

from __future__ import annotations

import math

import torch

from tasks.base import TaskContext, TaskSpec, Tolerance, Traffic, accumulate_dtype
from tasks.graph import gnn_halo_exchange as halo_exchange

TASK = TaskSpec(
    id="gnn_neighbor_aggregate",
    title="GraphSAGE mean aggregation with halo exchange",
    family="graph",
    source="DistDGL full-graph GraphSAGE (SAGEConv 'mean'); PyTorch Geometric distributed; CAGNET",
    why="The halo exchange must finish before any aggregation over cut edges: overlapping it with the "
        "local edges' aggregation is the classic optimisation of distributed GNN layers.",
    sizes={
        "small": {**halo_exchange.TASK.sizes["small"], "avg_degree": 5, "out_features": 9},
        # ogbn-products over 8 GPUs: ~25 in-edges per node after symmetrisation and sampling.
        "default": {**halo_exchange.TASK.sizes["default"], "avg_degree": 25, "out_features": 128},
        "large": {**halo_exchange.TASK.sizes["large"], "avg_degree": 15, "out_features": 256},
    },
    dtypes=("float32", "bfloat16"),
    # Outputs are O(1) (weights scaled 1/sqrt(F)). fp32: sums of <= ~60 neighbours and dot products of
    # <= 256 terms, ~1e-6. bf16: the mean is rounded once (2^-9) and each linear map's fp32-accumulated
    # result once, then added: ~3 roundings of O(1) values, <= ~1e-2 with the tails.
    tolerances={
        "float32": Tolerance(atol=1e-5, rtol=1e-5),
        "bfloat16": Tolerance(atol=2e-2, rtol=2e-2),
    },
)


def make_inputs(ctx: TaskContext) -> tuple[torch.Tensor, ...]:
    plan = halo_exchange.partition_plan(ctx.params, ctx.world_size)
    r = ctx.rank
    own, halo = plan.nodes[r], plan.received_by(r)
    edges = ctx.params["avg_degree"] * own
    gen = ctx.generator(stream=10)
    edge_src = torch.randint(0, own + halo, (edges,), generator=gen, device=ctx.device)
    edge_dst = torch.randint(0, own, (edges,), generator=gen, device=ctx.device)
    f, f_out = ctx.params["features"], ctx.params["out_features"]
    shared = ctx.shared_generator(stream=11)
    weight_self = (torch.randn(f_out, f, generator=shared, device=ctx.device) / math.sqrt(f)).to(ctx.dtype)
    weight_neigh = (torch.randn(f_out, f, generator=shared, device=ctx.device) / math.sqrt(f)).to(ctx.dtype)
    return (*halo_exchange.make_inputs(ctx), edge_src, edge_dst, weight_self, weight_neigh)


def _mean_over_in_edges(table: torch.Tensor, edge_src: torch.Tensor, edge_dst: torch.Tensor, nodes: int,
                        accumulate: torch.dtype) -> torch.Tensor:
    sums = torch.zeros(nodes, table.shape[1], dtype=accumulate, device=table.device)
    sums.index_add_(0, edge_dst, table.index_select(0, edge_src).to(accumulate))
    degree = torch.bincount(edge_dst, minlength=nodes).clamp_(min=1)
    return sums / degree.unsqueeze(1).to(accumulate)


def baseline(features: torch.Tensor, send_indices: torch.Tensor, send_counts: torch.Tensor,
             recv_counts: torch.Tensor, edge_src: torch.Tensor, edge_dst: torch.Tensor,
             weight_self: torch.Tensor, weight_neigh: torch.Tensor) -> torch.Tensor:
    halo = halo_exchange.baseline(features, send_indices, send_counts, recv_counts)
    table = torch.cat([features, halo])
    neigh_mean = _mean_over_in_edges(table, edge_src, edge_dst, features.shape[0], accumulate_dtype(features))
    return features @ weight_self.t() + neigh_mean.to(features.dtype) @ weight_neigh.t()


def reference(inputs_per_rank: list[tuple], ctx: TaskContext) -> list[torch.Tensor]:
    halos = halo_exchange.halo_for_each_rank([inputs[:4] for inputs in inputs_per_rank])
    results = []
    for inputs, halo in zip(inputs_per_rank, halos):
        features, edge_src, edge_dst, weight_self, weight_neigh = (t.double() if t.is_floating_point() else t
                                                                   for t in (inputs[0], *inputs[4:]))
        table = torch.cat([features, halo.double()])
        neigh_mean = _mean_over_in_edges(table, edge_src, edge_dst, features.shape[0], torch.float64)
        results.append((features @ weight_self.t() + neigh_mean @ weight_neigh.t()).to(ctx.dtype))
    return results


def traffic(ctx: TaskContext) -> Traffic:
    # Wire: exactly the halo exchange's (the partition is fixed). Memory: the halo exchange's, plus
    # for each edge one table row read and the int64 src/dst ids (a fused SpMM accumulates in
    # registers, so per node only the mean is written once), plus the own features read, the weights
    # and the output. FLOPs: an add per edge and feature, and two N x F x F_out GEMMs.
    halo_model = halo_exchange.traffic(ctx)
    plan = halo_exchange.partition_plan(ctx.params, ctx.world_size)
    b = ctx.dtype.itemsize
    p = ctx.params
    own = plan.nodes[ctx.rank]
    edges = p["avg_degree"] * own
    f, f_out = p["features"], p["out_features"]
    memory = (halo_model.memory_bytes + edges * (f * b + 16) + own * f * b * 3
              + 2 * f * f_out * b + own * f_out * b)
    return Traffic(
        send_bytes=halo_model.send_bytes, recv_bytes=halo_model.recv_bytes, memory_bytes=memory,
        flops=edges * f + 4 * own * f * f_out,
        payload_bytes=halo_model.payload_bytes, bus_factor=halo_model.bus_factor,
    )
