"""Roofline: how close a measured time is to what the hardware allows.

    floor_us = max(messages x alpha + wire bytes / link bandwidth, memory bytes / memory bandwidth, FLOPs / peak)
    roofline_fraction = floor_us / median_us          (1.0 = at the limit)

alpha is the link's per-message latency: calibrated on this host (``pkb-tui calibrate``, from the
NCCL all-reduce sweep's smallest messages) or a stated default. Without it every small-message
run read "0.0%" of a bandwidth floor, which says nothing; with it a latency-bound call has a floor
of its own ("latency-bound"). cpu mode has no roofline at all: gloo on a shared host says nothing
about a GPU or an interconnect, and nominal host figures would only dress that up.

Bandwidths come from this host's calibration (``pkb-tui calibrate``) when it was measured, else
from the vendors' datasheets below; every figure carries a source string that says which, and the
result keeps the source of the figure that set the floor.

Units: GB/s is 10^9 bytes/s, one direction (links are full duplex; ``Traffic.wire_bytes`` is the
busier direction). TFLOP/s are dense (no structured sparsity).
"""

from __future__ import annotations

import math
import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from pkb_tui.engine.modes import CPU_MODE_LABEL
from pkb_tui.engine.topology import Topology
from pkb_tui.store.schema import host_pair
from tasks.base import Traffic, bus_factor


@dataclass(frozen=True)
class PcieGeneration:
    name: str
    x16_gbps: float  # per direction, after line encoding
    source: str


# Per direction for an x16 link: transfer rate x 16 lanes / 8 bits x encoding efficiency.
PCIE_GENERATIONS: dict[int, PcieGeneration] = {
    3: PcieGeneration("PCIe Gen3 x16", 15.75, "PCI-SIG PCIe 3.0 base spec: 8 GT/s, 128b/130b"),
    4: PcieGeneration("PCIe Gen4 x16", 31.5, "PCI-SIG PCIe 4.0 base spec: 16 GT/s, 128b/130b"),
    5: PcieGeneration("PCIe Gen5 x16", 63.0, "PCI-SIG PCIe 5.0 base spec: 32 GT/s, 128b/130b"),
    6: PcieGeneration("PCIe Gen6 x16", 121.0, "PCI-SIG PCIe 6.0 base spec: 64 GT/s PAM4, FLIT 242/256"),
}


@dataclass(frozen=True)
class GpuSpec:
    """One GPU's datasheet figures."""

    name: str
    hbm_gbps: float
    nvlink_gbps: float | None  # per GPU, one direction (half the datasheet's bidirectional figure)
    pcie_generation: int
    tflops: dict[str, float]  # dense, by dtype name
    source: str
    sxm: bool  # SXM/HGX parts sit on an NVLink switch; PCIe cards at most on a bridge

    @property
    def pcie_gbps(self) -> float:
        return PCIE_GENERATIONS[self.pcie_generation].x16_gbps


def _tflops(bf16: float, fp16: float, fp32: float, fp64: float, tf32: float) -> dict[str, float]:
    return {"bfloat16": bf16, "float16": fp16, "float32": fp32, "float64": fp64, "tf32": tf32}


DATASHEET: dict[str, GpuSpec] = {
    "H100 SXM": GpuSpec(
        "NVIDIA H100 SXM", 3350.0, 450.0, 5, _tflops(989.5, 989.5, 67.0, 34.0, 494.7),
        "datasheet: NVIDIA H100 Tensor Core GPU (SXM5 80GB: 3.35 TB/s HBM3, NVLink 900 GB/s)", True,
    ),
    "H100 PCIe": GpuSpec(
        "NVIDIA H100 PCIe", 2000.0, 300.0, 5, _tflops(756.0, 756.0, 51.0, 26.0, 378.0),
        "datasheet: NVIDIA H100 Tensor Core GPU (PCIe 80GB: 2 TB/s HBM2e, NVLink bridge 600 GB/s)", False,
    ),
    "H100 NVL": GpuSpec(
        "NVIDIA H100 NVL", 3900.0, 300.0, 5, _tflops(835.0, 835.0, 60.0, 30.0, 417.5),
        "datasheet: NVIDIA H100 Tensor Core GPU (H100 NVL 94GB: 3.9 TB/s, NVLink bridge 600 GB/s)", False,
    ),
    "H200 SXM": GpuSpec(
        "NVIDIA H200 SXM", 4800.0, 450.0, 5, _tflops(989.5, 989.5, 67.0, 34.0, 494.7),
        "datasheet: NVIDIA H200 Tensor Core GPU (SXM 141GB: 4.8 TB/s HBM3e, NVLink 900 GB/s)", True,
    ),
    "H200 NVL": GpuSpec(
        "NVIDIA H200 NVL", 4800.0, 450.0, 5, _tflops(835.5, 835.5, 60.0, 30.0, 417.5),
        "datasheet: NVIDIA H200 Tensor Core GPU (H200 NVL: 4.8 TB/s, NVLink bridge 900 GB/s)", False,
    ),
    "B200": GpuSpec(
        "NVIDIA B200", 8000.0, 900.0, 6, _tflops(2250.0, 2250.0, 75.0, 37.0, 1100.0),
        "datasheet: NVIDIA HGX B200 (per GPU: 8 TB/s HBM3e, NVLink 5 1.8 TB/s)", True,
    ),
    "A100 SXM 80GB": GpuSpec(
        "NVIDIA A100 SXM4 80GB", 2039.0, 300.0, 4, _tflops(312.0, 312.0, 19.5, 9.7, 156.0),
        "datasheet: NVIDIA A100 Tensor Core GPU (SXM4 80GB: 2,039 GB/s HBM2e, NVLink 600 GB/s)", True,
    ),
    "A100 SXM 40GB": GpuSpec(
        "NVIDIA A100 SXM4 40GB", 1555.0, 300.0, 4, _tflops(312.0, 312.0, 19.5, 9.7, 156.0),
        "datasheet: NVIDIA A100 Tensor Core GPU (SXM4 40GB: 1,555 GB/s HBM2, NVLink 600 GB/s)", True,
    ),
    "A100 PCIe 80GB": GpuSpec(
        "NVIDIA A100 PCIe 80GB", 1935.0, 300.0, 4, _tflops(312.0, 312.0, 19.5, 9.7, 156.0),
        "datasheet: NVIDIA A100 Tensor Core GPU (PCIe 80GB: 1,935 GB/s HBM2e, NVLink bridge 600 GB/s)", False,
    ),
    "A100 PCIe 40GB": GpuSpec(
        "NVIDIA A100 PCIe 40GB", 1555.0, 300.0, 4, _tflops(312.0, 312.0, 19.5, 9.7, 156.0),
        "datasheet: NVIDIA A100 Tensor Core GPU (PCIe 40GB: 1,555 GB/s HBM2, NVLink bridge 600 GB/s)", False,
    ),
}

# (words that must all appear in the upper-cased model name, datasheet key), most specific first.
# Names as NVML and torch report them: 'NVIDIA H200', 'NVIDIA H100 80GB HBM3', 'NVIDIA H100 PCIe',
# 'NVIDIA A100-SXM4-80GB', 'NVIDIA A100 80GB PCIe', 'NVIDIA B200'.
_MODEL_RULES: list[tuple[tuple[str, ...], str]] = [
    (("H200", "NVL"), "H200 NVL"),
    (("H200",), "H200 SXM"),
    (("H100", "NVL"), "H100 NVL"),
    (("H100", "PCIE"), "H100 PCIe"),
    (("H100",), "H100 SXM"),
    (("B200",), "B200"),
    (("A100", "PCIE", "80GB"), "A100 PCIe 80GB"),
    (("A100", "PCIE"), "A100 PCIe 40GB"),
    (("A100", "80GB"), "A100 SXM 80GB"),
    (("A100",), "A100 SXM 40GB"),
]

CPU_NO_ROOFLINE = (f"{CPU_MODE_LABEL} (gloo through host memory on a shared CPU: no roofline and no bus "
                   "bandwidth are claimed from nominal CPU figures)")

# No datasheet gives a link's per-message latency. 1 us is an order of magnitude for one peer write
# plus a flag seen by the peer over NVLink or PCIe; low on purpose, so the floor stays a floor.
DEFAULT_LINK_LATENCY_US = 1.0
DEFAULT_LATENCY_SOURCE = (
    f"default {DEFAULT_LINK_LATENCY_US:g} us per message (an order of magnitude, no datasheet states it); "
    "`pkb-tui calibrate` measures this host's"
)


# One 400 Gb/s NIC per GPU (NDR InfiniBand or 400GbE, as on DGX/HGX H100/H200 nodes): 50 GB/s one way.
DEFAULT_NETWORK_GBPS = 50.0
DEFAULT_NETWORK_SOURCE = "datasheet: one 400 Gb/s NIC per GPU (NDR InfiniBand / 400GbE), 50 GB/s one direction"


@dataclass(frozen=True)
class NetworkCeiling:
    """The network a run across nodes is judged against: one GPU's share, one direction, and why."""

    gbps: float
    source: str
    pair: tuple[str, str] | None = None  # the calibrated pair of hosts that set it (the slowest)


def network_ceiling(node_hosts: Sequence[str], pairs: Mapping[tuple[str, str], Mapping[str, Any]]) -> NetworkCeiling:
    """The network between a run's nodes (``node_hosts``: each node's hostname, node 0 first):
    the calibrated figure of the slowest pair of their hosts (``pairs``: Store.network_pairs()),
    the bottleneck of anything that crosses every pair; the datasheet default, saying which pair
    was not calibrated, when any pair lacks a figure. Nodes that share a host make the pair
    (host, host): what crosses between them goes over loopback, and that is what was measured."""
    wanted = sorted({host_pair(a, b) for i, a in enumerate(node_hosts) for b in node_hosts[i + 1:]})
    missing = [p for p in wanted if not (pairs.get(p) or {}).get("bandwidth_gbps")]
    if not wanted or missing:
        named = ", ".join(f"{a} <-> {b}" for a, b in missing) or "none: fewer than two nodes"
        return NetworkCeiling(DEFAULT_NETWORK_GBPS, f"{DEFAULT_NETWORK_SOURCE}; host pair(s) not calibrated: {named} "
                                                    "(`pkb-tui calibrate --network` measures them)")
    slowest = min(wanted, key=lambda p: float(pairs[p]["bandwidth_gbps"]))
    row = pairs[slowest]
    when = time.strftime("%Y-%m-%d", time.localtime(row["measured_at"])) if row.get("measured_at") else "undated"
    mode = f", {row['mode']} mode" if row.get("mode") else ""
    of = f", the slowest of {len(wanted)} pairs" if len(wanted) > 1 else ""
    return NetworkCeiling(float(row["bandwidth_gbps"]),
                          f"calibrated {when} (network_busbw, hosts {slowest[0]} <-> {slowest[1]}{mode}{of})", slowest)


def with_topology(bandwidths: Bandwidths, topology: Topology | None, network: NetworkCeiling | None = None) -> Bandwidths:
    """The ceilings of a run whose ranks span nodes: the same, plus the network between nodes
    (``network``, network_ceiling's answer for the run's hosts; None: the per-GPU NIC default) and
    the share of the traffic that crosses it. One node: unchanged."""
    if topology is None or not topology.multi_node or bandwidths.no_roofline_reason:
        return bandwidths
    if network is None:
        network = NetworkCeiling(DEFAULT_NETWORK_GBPS, f"{DEFAULT_NETWORK_SOURCE}; the run's hosts were not given")
    return replace(bandwidths, network_gbps=network.gbps, network_source=network.source,
                   cross_node_share=topology.cross_node_share(), ranks_per_node=topology.ranks_per_node)


def lookup_gpu(model: str | None) -> GpuSpec | None:
    """The datasheet entry for a GPU model name as NVML/torch report it, or None if unknown."""
    if not model:
        return None
    upper = model.upper().replace("-", " ")
    for words, key in _MODEL_RULES:
        if all(word in upper for word in words):
            return DATASHEET[key]
    return None


def nccl_tests_bus_factor(collective: str, world_size: int) -> float:
    """busbw = algbw x this factor; the one definition is tasks.base.bus_factor (0 at one rank)."""
    return bus_factor(collective, world_size)


@dataclass
class Bandwidths:
    """The ceilings a result is judged against, each with where it came from."""

    link_gbps: float | None  # None: unknown (no datasheet entry and nothing calibrated)
    memory_gbps: float | None
    peak_tflops: dict[str, float]
    link_source: str
    memory_source: str
    link_kind: str  # nvlink, pcie, shared-device-memory, host-shared-memory, none, unknown
    compute_source: str = ""
    latency_us: float | None = None  # per-message link latency (alpha); None: no latency term
    latency_source: str = ""
    no_roofline_reason: str | None = None  # set: no floor, fraction or bus bandwidth (cpu mode), and why
    # Across nodes (engine.topology): the network per GPU (its NIC), one direction, and the share
    # of the ranks' bytes that must cross it; None / 0 on one node.
    network_gbps: float | None = None
    network_source: str = ""
    cross_node_share: float = 0.0
    ranks_per_node: int = 1

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _calibrated_label(kind: str, calibrated_at: float | None) -> str:
    when = time.strftime("%Y-%m-%d", time.localtime(calibrated_at)) if calibrated_at else None
    return f"calibrated {when} ({kind})" if when else f"calibrated ({kind})"


def _best_link_calibration(calibration: dict[str, float]) -> tuple[str, float] | None:
    """The highest per-GPU one-direction figure measured: NCCL all-reduce bus bandwidth or a peer copy.

    An all-reduce's bus bandwidth is comparable to the per-GPU link bandwidth by construction
    (nccl-tests), and peer copies are one direction of one pair; the highest is the best this host
    showed it can do.
    """
    best: tuple[str, float] | None = None
    for key, gbps in calibration.items():
        kind = key.split(":", 1)[0]
        if kind in ("allreduce_busbw", "peer_copy_engine", "peer_sm") and gbps and gbps > 0:
            if best is None or gbps > best[1]:
                best = (key, float(gbps))
    return best


def _topology_link(topology: Any) -> tuple[str, int | None] | None:
    """(link kind, PCIe generation) from host_facts()'s topology, or None when it does not say."""
    if not isinstance(topology, dict):
        return None
    gpus = topology.get("gpus") or []
    if not gpus:
        return None
    nvlinks = [g.get("nvlink_active_links") for g in gpus if g.get("nvlink_active_links") is not None]
    generations = [g.get("pcie_max_generation") or g.get("pcie_generation") for g in gpus]
    generations = [int(g) for g in generations if g]
    generation = min(generations) if generations else None
    if nvlinks and min(nvlinks) > 0:
        return ("nvlink", generation)
    if nvlinks:
        return ("pcie", generation)
    return None


def bandwidths_for(
    host: dict[str, Any], calibration: dict[str, float], mode: str, world_size: int,
    *, calibrated_at: float | None = None, latency: dict[str, Any] | None = None,
) -> Bandwidths:
    """The link / memory / compute ceilings for a run on ``host`` in ``mode``.

    ``calibration`` is Store.latest_calibration(host_id): kind or 'kind:a-b' -> GB/s, with the kinds
    engine.calibrate writes (device_copy, peer_copy_engine:a-b, peer_sm:a-b, allreduce_busbw,
    host_copy). Calibrated figures win over the datasheet; ``calibrated_at`` (Unix seconds) only
    dates the source string. ``latency`` is Store.latest_link_latency(host_id) (latency_us,
    measured_at); without it links between GPUs get the stated default.
    """
    calibration = calibration or {}
    spec = lookup_gpu(host.get("gpu_model"))

    if mode == "cpu":
        return Bandwidths(
            link_gbps=None, memory_gbps=None, peak_tflops={}, link_source=CPU_NO_ROOFLINE,
            memory_source=CPU_NO_ROOFLINE, link_kind="host-shared-memory", compute_source=CPU_NO_ROOFLINE,
            no_roofline_reason=CPU_NO_ROOFLINE,
        )

    if calibration.get("device_copy"):
        memory, memory_source = float(calibration["device_copy"]), _calibrated_label("device_copy", calibrated_at)
    elif spec is not None:
        memory, memory_source = spec.hbm_gbps, spec.source
    else:
        memory, memory_source = None, _unknown(host)
    peak = dict(spec.tflops) if spec is not None else {}
    compute_source = spec.source if spec is not None else _unknown(host)

    if mode == "shared-gpu":
        # Every rank sits on the one GPU: a "peer" read is a read of the same HBM.
        return Bandwidths(
            link_gbps=memory, memory_gbps=memory, peak_tflops=peak,
            link_source=f"ranks share one GPU, so the 'link' is its own memory: {memory_source}",
            memory_source=memory_source, link_kind="shared-device-memory", compute_source=compute_source,
        )

    if world_size <= 1:
        return Bandwidths(
            link_gbps=None, memory_gbps=memory, peak_tflops=peak,
            link_source="one rank: nothing crosses a link", memory_source=memory_source,
            link_kind="none", compute_source=compute_source,
        )

    calibrated_link = _best_link_calibration(calibration)
    topo = _topology_link(host.get("topology"))
    if topo is not None:
        link_kind, generation = topo
        how = "per topology"
    elif spec is not None:
        link_kind, generation = ("nvlink" if spec.sxm else "pcie"), spec.pcie_generation
        how = "assumed from the GPU model (no topology)"
    else:
        link_kind, generation, how = "unknown", None, ""

    if calibrated_link is not None:
        key, link = calibrated_link
        link_source = _calibrated_label(key, calibrated_at)
    elif link_kind == "nvlink" and spec is not None and spec.nvlink_gbps:
        link = spec.nvlink_gbps
        link_source = f"{spec.source}; NVLink {how}, one direction"
    elif link_kind == "pcie" and (generation or spec is not None):
        gen = PCIE_GENERATIONS.get(generation or spec.pcie_generation)  # type: ignore[union-attr]
        link = gen.x16_gbps
        link_source = f"datasheet: {gen.name} {how} ({gen.source}), one direction"
    else:
        link, link_source = None, _unknown(host)
    if latency and latency.get("latency_us") is not None:
        alpha, alpha_source = float(latency["latency_us"]), _calibrated_label("link_latency", latency.get("measured_at"))
    else:
        alpha, alpha_source = DEFAULT_LINK_LATENCY_US, DEFAULT_LATENCY_SOURCE
    return Bandwidths(
        link_gbps=link, memory_gbps=memory, peak_tflops=peak, link_source=link_source,
        memory_source=memory_source, link_kind=link_kind, compute_source=compute_source,
        latency_us=alpha, latency_source=alpha_source,
    )


def _unknown(host: dict[str, Any]) -> str:
    return (
        f"unknown: no datasheet entry for GPU {host.get('gpu_model')!r} and nothing calibrated; "
        "run `pkb-tui calibrate`"
    )


@dataclass
class Roofline:
    floor_us: float | None  # None: no ceiling known for any term the traffic has
    fraction: float | None  # floor / median: 1.0 = at the limit
    bound: str | None  # latency, wire, memory or compute: the term that set the floor
    bus_bandwidth_gbps: float | None  # nccl-tests convention
    algo_bandwidth_gbps: float | None
    bandwidth_source: str
    terms_us: dict[str, float] = field(default_factory=dict)
    latency_us: float | None = None  # messages x alpha inside the wire term

    def result_fields(self) -> dict[str, Any]:
        """The columns of a results row this fills."""
        return {
            "roofline_floor_us": self.floor_us, "roofline_fraction": self.fraction,
            "roofline_bound": self.bound, "bus_bandwidth_gbps": self.bus_bandwidth_gbps,
            "bandwidth_source": self.bandwidth_source, "roofline_latency_us": self.latency_us,
        }


def _compute_us(traffic: Traffic, bandwidths: Bandwidths, dtype: str) -> float | None:
    """Least time for the task's arithmetic: FLOPs at the dtype's dense peak, except that in
    float32 the FLOPs PyTorch runs in TF32 by default (Traffic.tf32_flops: convolutions) go at
    the TF32 rate. Plain float32 matmuls stay at the float32 rate: PyTorch keeps TF32 off for them."""
    peak = bandwidths.peak_tflops.get(dtype)
    if traffic.flops <= 0 or not peak:
        return None
    tf32 = min(traffic.tf32_flops, traffic.flops) if dtype == "float32" else 0
    tf32_peak = bandwidths.peak_tflops.get("tf32") or peak
    return (traffic.flops - tf32) / (peak * 1e6) + tf32 / (tf32_peak * 1e6)  # TFLOP/s = 1e6 FLOP/us


def evaluate(traffic: Traffic, median_us: float, bandwidths: Bandwidths, dtype: str) -> Roofline:
    """The roofline of one measured time: floor, achieved fraction, bound, bus bandwidth.

    The wire term is messages x alpha + wire bytes / link bandwidth; the bound reads "latency"
    when the alpha part of it is the larger and that term sets the floor.
    """
    if bandwidths.no_roofline_reason:
        return Roofline(floor_us=None, fraction=None, bound=None, bus_bandwidth_gbps=None, algo_bandwidth_gbps=None,
                        bandwidth_source=bandwidths.no_roofline_reason)
    terms: dict[str, float] = {}
    sources: dict[str, str] = {}
    latency_us = None
    bytes_us = 0.0
    network_us = 0.0
    if traffic.wire_bytes > 0 and bandwidths.link_gbps:
        # Across nodes the pairs on other nodes go over the network: their share of a rank's bytes,
        # which the node's ranks may combine before it crosses (a hierarchical all-reduce does),
        # over the node's NICs together. So the term stays a floor whatever the algorithm (for an
        # all-to-all, whose bytes cannot be combined, it is low by the ranks per node).
        cross_bytes = traffic.wire_bytes * bandwidths.cross_node_share
        if bandwidths.network_gbps and cross_bytes > 0:
            network_us = cross_bytes / (bandwidths.ranks_per_node * bandwidths.network_gbps * 1e3)
        bytes_us = (traffic.wire_bytes - cross_bytes) / (bandwidths.link_gbps * 1e3)  # GB/s = 1e3 bytes/us
        sources["wire"] = bandwidths.link_source
        if network_us > bytes_us:
            sources["wire"] = (f"{bandwidths.network_source} ({bandwidths.cross_node_share:.0%} of the bytes "
                               f"cross nodes, shared by {bandwidths.ranks_per_node} NIC(s) a node)")
        if bandwidths.latency_us:
            messages = max(1, traffic.messages)
            latency_us = bandwidths.latency_us * messages
            sources["wire"] += f"; latency {bandwidths.latency_us:g} us x {messages} message(s): {bandwidths.latency_source}"
        terms["wire"] = (latency_us or 0.0) + max(bytes_us, network_us)
    if traffic.memory_bytes > 0 and bandwidths.memory_gbps:
        terms["memory"] = traffic.memory_bytes / (bandwidths.memory_gbps * 1e3)
        sources["memory"] = bandwidths.memory_source
    compute_us = _compute_us(traffic, bandwidths, dtype)
    if compute_us is not None:
        terms["compute"] = compute_us
        tf32 = " with TF32 convolutions" if dtype == "float32" and traffic.tf32_flops else ""
        sources["compute"] = f"{bandwidths.compute_source} ({dtype} peak{tf32})"

    valid_time = median_us is not None and math.isfinite(median_us) and median_us > 0
    if terms:
        bound = max(terms, key=lambda k: (terms[k], k == "wire"))
        floor = terms[bound]
        fraction = floor / median_us if valid_time else None
        source = sources[bound]
    else:
        bound, floor, fraction = None, None, None
        source = bandwidths.link_source if traffic.wire_bytes > 0 else bandwidths.memory_source
    if bound == "wire" and latency_us is not None and latency_us > max(bytes_us, network_us):
        bound = "latency"
    elif bound == "wire" and network_us > bytes_us:
        bound = "network"
    algo = traffic.payload_bytes / (median_us * 1e3) if (traffic.payload_bytes and valid_time) else None
    # factor 0 (one rank): nothing crossed a link, so there is no bus bandwidth to state
    bus = algo * traffic.bus_factor if (algo is not None and traffic.bus_factor) else None
    return Roofline(
        floor_us=floor, fraction=fraction, bound=bound, bus_bandwidth_gbps=bus,
        algo_bandwidth_gbps=algo, bandwidth_source=source, terms_us=terms, latency_us=latency_us,
    )
