"""The records every sampler produces and every reader (sink, TUI, monitor) consumes.

A field that the device or host cannot measure is None ("not available"), never 0.
Field names match the samples / link_samples / rank_samples columns of pkb_tui/store/schema.py.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field


@dataclass
class LinkSample:
    link: int
    tx_bytes_per_s: float | None = None
    rx_bytes_per_s: float | None = None


@dataclass
class RankCpu:
    """CPU use of one rank process (100 = one full core, as top shows it)."""

    rank: int
    pid: int
    cpu_pct: float | None = None


@dataclass
class GpuSample:
    ts: float  # Unix seconds
    gpu: int  # GPU index; -1 for the host sampler's row
    nvlink_tx_bytes_per_s: float | None = None
    nvlink_rx_bytes_per_s: float | None = None
    pcie_tx_bytes_per_s: float | None = None
    pcie_rx_bytes_per_s: float | None = None
    sm_util_pct: float | None = None
    mem_util_pct: float | None = None
    dram_bw_util_pct: float | None = None
    tensor_active_pct: float | None = None
    power_w: float | None = None
    sm_clock_mhz: float | None = None
    mem_clock_mhz: float | None = None
    temperature_c: float | None = None
    memory_used_bytes: float | None = None
    cpu_pct: float | None = None
    host_memory_used_bytes: float | None = None
    loopback_bytes_per_s: float | None = None
    nic_tx_bytes_per_s: float | None = None  # host rows: physical NICs and InfiniBand ports together
    nic_rx_bytes_per_s: float | None = None
    links: list[LinkSample] = field(default_factory=list)
    run_id: int | None = None
    ranks: list[RankCpu] = field(default_factory=list)  # host rows only: the run's rank processes
    host_id: int | None = None  # the host it was taken on, where not the sink's own (another node's)
    node: int | None = None  # the node rank of a multi-node batch; None on one node


SAMPLE_COLUMNS = (
    "nvlink_tx_bytes_per_s", "nvlink_rx_bytes_per_s", "pcie_tx_bytes_per_s", "pcie_rx_bytes_per_s",
    "sm_util_pct", "mem_util_pct", "dram_bw_util_pct", "tensor_active_pct", "power_w", "sm_clock_mhz",
    "mem_clock_mhz", "temperature_c", "memory_used_bytes", "cpu_pct", "host_memory_used_bytes",
    "loopback_bytes_per_s", "nic_tx_bytes_per_s", "nic_rx_bytes_per_s",
)


def sample_to_dict(sample: GpuSample) -> dict:
    """A sample as plain JSON values (a node agent sends its samples to the head this way)."""
    return dataclasses.asdict(sample)


def sample_from_dict(data: dict) -> GpuSample:
    """The inverse of sample_to_dict; unknown keys are ignored, so the record can grow."""
    names = {f.name for f in dataclasses.fields(GpuSample)}
    fields = {k: v for k, v in data.items() if k in names}
    fields["links"] = [LinkSample(**link) for link in fields.get("links") or []]
    fields["ranks"] = [RankCpu(**rank) for rank in fields.get("ranks") or []]
    return GpuSample(**fields)


def sample_to_row(sample: GpuSample) -> list:
    """A sample as one compact JSON array (what a node agent sends the head): ts, gpu, the
    SAMPLE_COLUMNS in order, links as [link, tx, rx], ranks as [rank, pid, cpu]. Measured against
    sample_to_dict by bench/uplink_cost.py: the head decodes it several times faster."""
    return [sample.ts, sample.gpu, *[getattr(sample, c) for c in SAMPLE_COLUMNS],
            [[k.link, k.tx_bytes_per_s, k.rx_bytes_per_s] for k in sample.links],
            [[r.rank, r.pid, r.cpu_pct] for r in sample.ranks]]


_ROW_WIDTH = 2 + len(SAMPLE_COLUMNS) + 2


def sample_from_row(row: list) -> GpuSample:
    """The inverse of sample_to_row; ValueError for a row that is not one."""
    if not isinstance(row, list) or len(row) != _ROW_WIDTH:
        raise ValueError("not a sample row")
    sample = GpuSample(float(row[0]), int(row[1]), **dict(zip(SAMPLE_COLUMNS, row[2:2 + len(SAMPLE_COLUMNS)], strict=True)))
    sample.links = [LinkSample(int(k[0]), k[1], k[2]) for k in row[-2]]
    sample.ranks = [RankCpu(int(r[0]), int(r[1]), r[2]) for r in row[-1]]
    return sample
