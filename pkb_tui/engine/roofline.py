"""Roofline: how close a measured time is to what the hardware allows.

    floor_us = max(wire bytes / link bandwidth, memory bytes / memory bandwidth, FLOPs / peak)
    roofline_fraction = floor_us / median_us          (1.0 = at the limit)

Bandwidths come from this host's calibration (``pkb-tui calibrate``) when it was measured, else
from the vendors' datasheets below; every figure carries a source string that says which, and the
result keeps the source of the figure that set the floor.

Units: GB/s is 10^9 bytes/s, one direction (links are full duplex; ``Traffic.wire_bytes`` is the
busier direction). TFLOP/s are dense (no structured sparsity).
"""

from __future__ import annotations

import math
import time
from dataclasses import asdict, dataclass, field
from typing import Any

from tasks.base import Traffic


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

# cpu mode has no datasheet: an order of magnitude for a desktop/server memory system, said as such.
HOST_MEMORY_NOMINAL_GBPS = 20.0
HOST_TFLOPS_NOMINAL = 0.5


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
    """busbw = algbw x this factor (nccl-tests PERFORMANCE.md), so figures compare with that tool.

    algbw is the payload over the time, where the payload is nccl-tests' "size": the whole buffer
    for all-reduce / broadcast / reduce, the whole gathered (all-gather) or whole input
    (reduce-scatter) buffer, and the whole send buffer for all-to-all / gather / scatter.
    """
    n = world_size
    if n < 1:
        raise ValueError(f"world size must be >= 1, got {n}")
    if n == 1:
        return 1.0
    factors = {
        "all_reduce": 2 * (n - 1) / n,
        "all_gather": (n - 1) / n,
        "reduce_scatter": (n - 1) / n,
        "all_to_all": (n - 1) / n,
        "gather": (n - 1) / n,
        "scatter": (n - 1) / n,
        "broadcast": 1.0,
        "reduce": 1.0,
        "sendrecv": 1.0,
    }
    if collective not in factors:
        raise KeyError(f"no nccl-tests bus factor for {collective!r}; known: {', '.join(factors)}")
    return factors[collective]


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
    *, calibrated_at: float | None = None,
) -> Bandwidths:
    """The link / memory / compute ceilings for a run on ``host`` in ``mode``.

    ``calibration`` is Store.latest_calibration(host_id): kind or 'kind:a-b' -> GB/s, with the kinds
    engine.calibrate writes (device_copy, peer_copy_engine:a-b, peer_sm:a-b, allreduce_busbw,
    host_copy). Calibrated figures win over the datasheet; ``calibrated_at`` (Unix seconds) only
    dates the source string.
    """
    calibration = calibration or {}
    spec = lookup_gpu(host.get("gpu_model"))

    if mode == "cpu":
        if calibration.get("host_copy"):
            memory, memory_source = float(calibration["host_copy"]), _calibrated_label("host_copy", calibrated_at)
        else:
            memory = HOST_MEMORY_NOMINAL_GBPS
            memory_source = (
                f"nominal host memory ({HOST_MEMORY_NOMINAL_GBPS:.0f} GB/s, an order of magnitude, no datasheet): "
                "cpu-mode timings do not represent a GPU or an interconnect"
            )
        peak = {k: HOST_TFLOPS_NOMINAL for k in ("float32", "float64", "bfloat16", "float16")}
        return Bandwidths(
            link_gbps=memory, memory_gbps=memory, peak_tflops=peak,
            link_source=f"ranks exchange data through host shared memory (gloo); {memory_source}",
            memory_source=memory_source, link_kind="host-shared-memory",
            compute_source=f"nominal host ({HOST_TFLOPS_NOMINAL} TFLOP/s, an order of magnitude)",
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
    return Bandwidths(
        link_gbps=link, memory_gbps=memory, peak_tflops=peak, link_source=link_source,
        memory_source=memory_source, link_kind=link_kind, compute_source=compute_source,
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
    bound: str | None  # wire, memory or compute: the term that set the floor
    bus_bandwidth_gbps: float | None  # nccl-tests convention
    algo_bandwidth_gbps: float | None
    bandwidth_source: str
    terms_us: dict[str, float] = field(default_factory=dict)

    def result_fields(self) -> dict[str, Any]:
        """The columns of a results row this fills."""
        return {
            "roofline_floor_us": self.floor_us, "roofline_fraction": self.fraction,
            "roofline_bound": self.bound, "bus_bandwidth_gbps": self.bus_bandwidth_gbps,
            "bandwidth_source": self.bandwidth_source,
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
    """The roofline of one measured time: floor, achieved fraction, bound, bus bandwidth."""
    terms: dict[str, float] = {}
    sources: dict[str, str] = {}
    if traffic.wire_bytes > 0 and bandwidths.link_gbps:
        terms["wire"] = traffic.wire_bytes / (bandwidths.link_gbps * 1e3)  # GB/s = 1e3 bytes/us
        sources["wire"] = bandwidths.link_source
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
    algo = traffic.payload_bytes / (median_us * 1e3) if (traffic.payload_bytes and valid_time) else None
    bus = algo * traffic.bus_factor if algo is not None else None
    return Roofline(
        floor_us=floor, fraction=fraction, bound=bound, bus_bandwidth_gbps=bus,
        algo_bandwidth_gbps=algo, bandwidth_source=source, terms_us=terms,
    )
