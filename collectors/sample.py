"""The records every sampler produces and every reader (sink, TUI, monitor) consumes.

A field that the device or host cannot measure is None ("not available"), never 0.
Field names match the samples / link_samples / rank_samples columns of pkb_tui/store/schema.py.
"""

from __future__ import annotations

import math
from array import array
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple, overload

# Memory and the garbage collector: the dashboard's ring holds 36,000 samples, each with up to 18
# links. With a dataclass per link that was ~700,000 objects that every full pass of Python's
# collector walked: pauses of 100-280 ms, one Monitor frame in ~fifty (bench/tui_render.py on the
# 2-core box). A sample's links are packed in one array (LinkRates),
# and a sample has slots.


class LinkSample(NamedTuple):
    link: int
    tx_bytes_per_s: float | None = None
    rx_bytes_per_s: float | None = None


class RankCpu(NamedTuple):
    """CPU use of one rank process (100 = one full core, as top shows it)."""

    rank: int
    pid: int
    cpu_pct: float | None = None


class LinkRates(Sequence[LinkSample]):
    """One sample's per-link rates, packed in one array of (link, tx, rx) triples (None kept as
    NaN): a sequence of LinkSample to its readers, made on access, and two objects for the
    garbage collector instead of one per link."""

    __slots__ = ("_data",)

    def __init__(self, links: Iterable[LinkSample | tuple[Any, ...]] = ()) -> None:
        self._data = array("d")
        for link in links:
            self.append(link)

    def append(self, link: LinkSample | tuple[Any, ...]) -> None:
        number, tx, rx = LinkSample(*link)
        self._data.extend((number, math.nan if tx is None else tx, math.nan if rx is None else rx))

    def __len__(self) -> int:
        return len(self._data) // 3

    @overload
    def __getitem__(self, index: int) -> LinkSample: ...

    @overload
    def __getitem__(self, index: slice) -> list[LinkSample]: ...

    def __getitem__(self, index: int | slice) -> LinkSample | list[LinkSample]:
        if isinstance(index, slice):
            return [self[i] for i in range(*index.indices(len(self)))]
        count = len(self)
        if not -count <= index < count:
            raise IndexError("link index out of range")
        return self._link(3 * (index % count))

    def _link(self, at: int) -> LinkSample:
        data = self._data
        tx, rx = data[at + 1], data[at + 2]
        return LinkSample(int(data[at]), None if math.isnan(tx) else tx, None if math.isnan(rx) else rx)

    def __iter__(self) -> Iterator[LinkSample]:
        for at in range(0, len(self._data), 3):
            yield self._link(at)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, (LinkRates, list, tuple)):
            return list(self) == list(other)
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]  # mutable (append)

    def __repr__(self) -> str:
        return f"LinkRates({list(self)!r})"

    def __reduce__(self) -> tuple[Any, ...]:
        return LinkRates, (list(self),)


@dataclass(slots=True)
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
    links: LinkRates = field(default_factory=LinkRates)  # a list of LinkSample is packed on construction
    run_id: int | None = None
    ranks: Sequence[RankCpu] = ()  # host rows only: the run's rank processes
    host_id: int | None = None  # the host it was taken on, where not the sink's own (another node's)
    node: int | None = None  # the node rank of a multi-node batch; None on one node

    def __post_init__(self) -> None:
        if not isinstance(self.links, LinkRates):
            self.links = LinkRates(self.links)


def sample_dict(sample: GpuSample) -> dict[str, Any]:
    """A sample as plain data (JSON lines of `monitor --json`, recovery files, a node agent's
    samples): its fields, links and ranks as lists of objects."""
    out = {name: getattr(sample, name) for name in sample.__dataclass_fields__}
    out["links"] = [link._asdict() for link in sample.links]
    out["ranks"] = [rank._asdict() for rank in sample.ranks]
    return out


SAMPLE_COLUMNS = (
    "nvlink_tx_bytes_per_s", "nvlink_rx_bytes_per_s", "pcie_tx_bytes_per_s", "pcie_rx_bytes_per_s",
    "sm_util_pct", "mem_util_pct", "dram_bw_util_pct", "tensor_active_pct", "power_w", "sm_clock_mhz",
    "mem_clock_mhz", "temperature_c", "memory_used_bytes", "cpu_pct", "host_memory_used_bytes",
    "loopback_bytes_per_s", "nic_tx_bytes_per_s", "nic_rx_bytes_per_s",
)


def sample_from_dict(data: dict) -> GpuSample:
    """The inverse of sample_dict; unknown keys are ignored, so the record can grow."""
    names = set(GpuSample.__dataclass_fields__)
    fields = {k: v for k, v in data.items() if k in names}
    fields["links"] = LinkRates(LinkSample(**link) for link in fields.get("links") or [])
    fields["ranks"] = tuple(RankCpu(**rank) for rank in fields.get("ranks") or [])
    return GpuSample(**fields)


def sample_to_row(sample: GpuSample) -> list:
    """A sample as one compact JSON array (what a node agent sends the head): ts, gpu, the
    SAMPLE_COLUMNS in order, links as [link, tx, rx], ranks as [rank, pid, cpu]. Measured against
    sample_dict by bench/uplink_cost.py: the head decodes it several times faster."""
    return [sample.ts, sample.gpu, *[getattr(sample, c) for c in SAMPLE_COLUMNS],
            [[k.link, k.tx_bytes_per_s, k.rx_bytes_per_s] for k in sample.links],
            [[r.rank, r.pid, r.cpu_pct] for r in sample.ranks]]


_ROW_WIDTH = 2 + len(SAMPLE_COLUMNS) + 2


def sample_from_row(row: list) -> GpuSample:
    """The inverse of sample_to_row; ValueError for a row that is not one."""
    if not isinstance(row, list) or len(row) != _ROW_WIDTH:
        raise ValueError("not a sample row")
    sample = GpuSample(float(row[0]), int(row[1]), **dict(zip(SAMPLE_COLUMNS, row[2:2 + len(SAMPLE_COLUMNS)], strict=True)))
    sample.links = LinkRates(LinkSample(int(k[0]), k[1], k[2]) for k in row[-2])
    sample.ranks = tuple(RankCpu(int(r[0]), int(r[1]), r[2]) for r in row[-1])
    return sample
