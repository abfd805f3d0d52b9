"""Where the ranks sit: how many nodes, how many ranks on each, which pairs share a node.

torchrun numbers ranks node by node (global rank = node's group rank x ranks per node + local rank),
so a rank's node is its rank divided by the ranks per node. The roofline asks this object which
share of a rank's traffic crosses the network instead of the node's own links (NVLink, PCIe).
"""

from __future__ import annotations

from dataclasses import dataclass

from pkb_tui.errors import PkbError


@dataclass(frozen=True)
class Topology:
    nodes: int
    ranks_per_node: int

    @classmethod
    def of(cls, world_size: int, nodes: int = 1) -> Topology:
        """The topology of ``world_size`` ranks spread evenly over ``nodes``; PkbError otherwise."""
        if nodes < 1:
            raise PkbError(f"--nnodes must be at least 1 (got {nodes}).")
        if world_size < nodes or world_size % nodes:
            raise PkbError(f"World size {world_size} does not spread evenly over {nodes} node(s); "
                           f"give a multiple of {nodes} (ranks per node x nodes).")
        return cls(nodes=nodes, ranks_per_node=world_size // nodes)

    @property
    def world_size(self) -> int:
        return self.nodes * self.ranks_per_node

    @property
    def multi_node(self) -> bool:
        return self.nodes > 1

    def node_of(self, rank: int) -> int:
        return rank // self.ranks_per_node

    def same_node(self, a: int, b: int) -> bool:
        return self.node_of(a) == self.node_of(b)

    def pairs(self) -> list[tuple[int, int]]:
        return [(a, b) for a in range(self.world_size) for b in range(a + 1, self.world_size)]

    def cross_node_pairs(self) -> list[tuple[int, int]]:
        return [(a, b) for a, b in self.pairs() if not self.same_node(a, b)]

    def cross_node_share(self) -> float:
        """The share of a rank's peers on other nodes: the part of its traffic that crosses the
        network when it spreads evenly over its peers (exact for all-to-all and for a flat ring's
        average; a hierarchical algorithm sends less across, so the floor stays a floor only if
        the network term is not over-stated: see roofline.evaluate)."""
        if self.world_size <= 1:
            return 0.0
        return (self.world_size - self.ranks_per_node) / (self.world_size - 1)

    def describe(self) -> str:
        if not self.multi_node:
            return f"{self.ranks_per_node} rank(s) on one node"
        return f"{self.nodes} nodes x {self.ranks_per_node} rank(s)"
