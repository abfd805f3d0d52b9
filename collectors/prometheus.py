"""Prometheus exporter of the sampled metrics (`pkb-tui monitor --prometheus [HOST:]PORT`, and the
dashboard with `pkb-tui --prometheus [HOST:]PORT`).

Names: where a figure means what a dcgm-exporter field means, it has that field's name and unit
(DCGM_FI_DEV_GPU_UTIL in %, DCGM_FI_DEV_POWER_USAGE in W, DCGM_FI_DEV_FB_USED in MiB,
DCGM_FI_PROF_NVLINK_TX_BYTES and DCGM_FI_PROF_PCIE_TX_BYTES in bytes per second,
DCGM_FI_PROF_DRAM_ACTIVE as a 0..1 ratio...), so dashboards built for dcgm-exporter read it as they
are. Figures DCGM has no one name for (one series per NVLink link, where DCGM has a field per link
number; the host; the ranks' CPU) are pkb_* and say their DCGM counterpart in the help text.
Labels: gpu, host (and link, rank, modelName on the series that need them).

The registry reads the ring buffer's latest samples at scrape time (no thread of ours, no copy); a
figure the device cannot give is left out of the scrape, never exported as 0. The HTTP server is
prometheus-client's (a daemon thread).
"""

from __future__ import annotations

import socket
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector, CollectorRegistry

from pkb_tui.errors import PkbError

MIB = 1024 * 1024
DEFAULT_HOST = "127.0.0.1"  # only this machine unless asked: 0.0.0.0:PORT lets a Prometheus elsewhere scrape

# (metric name, sample field, scale, help). DCGM names keep DCGM's units.
GPU_METRICS: tuple[tuple[str, str, float, str], ...] = (
    ("DCGM_FI_DEV_GPU_UTIL", "sm_util_pct", 1.0,
     "SM utilisation (%): GPM SM activity where the GPU has GPM, else NVML's share of time a kernel ran."),
    ("DCGM_FI_DEV_MEM_COPY_UTIL", "mem_util_pct", 1.0, "Memory utilisation (%), NVML's share of time memory was read or written."),
    ("DCGM_FI_PROF_DRAM_ACTIVE", "dram_bw_util_pct", 0.01, "Share of DRAM bandwidth in use (ratio 0..1, GPM)."),
    ("DCGM_FI_PROF_PIPE_TENSOR_ACTIVE", "tensor_active_pct", 0.01, "Share of time a tensor pipe was active (ratio 0..1, GPM)."),
    ("DCGM_FI_DEV_POWER_USAGE", "power_w", 1.0, "Power draw (W)."),
    ("DCGM_FI_DEV_SM_CLOCK", "sm_clock_mhz", 1.0, "SM clock (MHz)."),
    ("DCGM_FI_DEV_MEM_CLOCK", "mem_clock_mhz", 1.0, "Memory clock (MHz)."),
    ("DCGM_FI_DEV_GPU_TEMP", "temperature_c", 1.0, "GPU temperature (C)."),
    ("DCGM_FI_DEV_FB_USED", "memory_used_bytes", 1.0 / MIB, "Device memory used (MiB)."),
    ("DCGM_FI_PROF_PCIE_TX_BYTES", "pcie_tx_bytes_per_s", 1.0, "PCIe bytes sent per second."),
    ("DCGM_FI_PROF_PCIE_RX_BYTES", "pcie_rx_bytes_per_s", 1.0, "PCIe bytes received per second."),
    ("DCGM_FI_PROF_NVLINK_TX_BYTES", "nvlink_tx_bytes_per_s", 1.0, "NVLink bytes sent per second, all links of the GPU."),
    ("DCGM_FI_PROF_NVLINK_RX_BYTES", "nvlink_rx_bytes_per_s", 1.0, "NVLink bytes received per second, all links of the GPU."),
)


def parse_address(value: str) -> tuple[str, int]:
    """'[HOST:]PORT' -> (host, port); IPv6 hosts in brackets ('[::1]:9400')."""
    text = value.strip()
    host, _, port_text = text.rpartition(":")
    host = host.strip("[]") or DEFAULT_HOST
    try:
        port = int(port_text)
    except ValueError:
        raise PkbError(f"--prometheus takes [HOST:]PORT (e.g. 9400 or 0.0.0.0:9400), not {value!r}.") from None
    if not 0 <= port <= 65535:
        raise PkbError(f"Port {port} is out of range; use 1-65535 (0 picks a free one).")
    return host, port


class TelemetryCollector(Collector):
    """A prometheus-client collector over ``source()``: the Telemetry sampling now (None: none)."""

    def __init__(self, source: Callable[[], Any], host: str | None = None) -> None:
        self.source = source
        self.host = host or socket.gethostname()

    def collect(self) -> Iterator[GaugeMetricFamily]:
        telemetry = self.source()
        info = GaugeMetricFamily("pkb_telemetry_info", "What is sampled: source nvml or host, or none (no sampler running).",
                                 labels=["host", "source", "reason"])
        ring = getattr(telemetry, "ring", None)
        info.add_metric([self.host, getattr(telemetry, "source", None) or "none", getattr(telemetry, "reason", None) or ""], 1.0)
        yield info
        if ring is None:
            return
        latest = ring.latest_per_gpu()
        gpus = sorted(g for g in latest if g >= 0)
        names = dict(getattr(telemetry, "gpu_names", {}) or {})
        model = GaugeMetricFamily("pkb_gpu_info", "The GPU's model name (dcgm-exporter's modelName label).",
                                  labels=["gpu", "host", "modelName"])
        age = GaugeMetricFamily("pkb_sample_age_seconds", "Seconds since the GPU's latest sample (stale data grows).",
                                labels=["gpu", "host"])
        now = time.time()
        for gpu in gpus:
            model.add_metric([str(gpu), self.host, names.get(gpu, "")], 1.0)
            age.add_metric([str(gpu), self.host], max(0.0, now - latest[gpu].ts))
        yield model
        yield age
        for name, column, scale, help_text in GPU_METRICS:
            family = GaugeMetricFamily(name, help_text, labels=["gpu", "host"])
            for gpu in gpus:
                value = getattr(latest[gpu], column)
                if value is not None:  # n/a stays out of the scrape: never a 0
                    family.add_metric([str(gpu), self.host], value * scale)
            yield family
        for direction in ("tx", "rx"):
            family = GaugeMetricFamily(
                f"pkb_nvlink_link_{direction}_bytes", f"NVLink bytes {'sent' if direction == 'tx' else 'received'} per "
                f"second on one link (dcgm-exporter: DCGM_FI_PROF_NVLINK_L<link>_{direction.upper()}_BYTES).",
                labels=["gpu", "link", "host"],
            )
            for gpu in gpus:
                for link in latest[gpu].links:
                    value = link.tx_bytes_per_s if direction == "tx" else link.rx_bytes_per_s
                    if value is not None:
                        family.add_metric([str(gpu), str(link.link), self.host], value)
            yield family
        limits_of = getattr(telemetry, "limits", None)
        limits = limits_of() if callable(limits_of) else {}
        power_limit = GaugeMetricFamily("DCGM_FI_DEV_POWER_MGMT_LIMIT", "Power limit (W).", labels=["gpu", "host"])
        memory_total = GaugeMetricFamily("DCGM_FI_DEV_FB_TOTAL", "Device memory (MiB).", labels=["gpu", "host"])
        for gpu, lim in sorted(limits.items()):
            if lim.power_limit_w is not None:
                power_limit.add_metric([str(gpu), self.host], lim.power_limit_w)
            if lim.memory_total_bytes is not None:
                memory_total.add_metric([str(gpu), self.host], lim.memory_total_bytes / MIB)
        yield power_limit
        yield memory_total
        host = latest.get(-1)
        if host is not None:
            for name, column, help_text in (
                ("pkb_host_cpu_pct", "cpu_pct", "Host CPU use (%, all cores; no DCGM counterpart)."),
                ("pkb_host_memory_used_bytes", "host_memory_used_bytes", "Host memory used (bytes)."),
                ("pkb_host_loopback_bytes", "loopback_bytes_per_s", "Loopback bytes per second (gloo traffic in cpu mode)."),
                ("pkb_host_nic_tx_bytes", "nic_tx_bytes_per_s",
                 "Bytes per second sent by the physical NICs and InfiniBand ports (traffic to other nodes)."),
                ("pkb_host_nic_rx_bytes", "nic_rx_bytes_per_s",
                 "Bytes per second received by the physical NICs and InfiniBand ports."),
            ):
                family = GaugeMetricFamily(name, help_text, labels=["host"])
                value = getattr(host, column)
                if value is not None:
                    family.add_metric([self.host], value)
                yield family
            ranks = GaugeMetricFamily("pkb_rank_cpu_pct", "CPU use of a rank process of the run going on (100 = one core).",
                                      labels=["rank", "pid", "host"])
            for rank in host.ranks:
                if rank.cpu_pct is not None:
                    ranks.add_metric([str(rank.rank), str(rank.pid), self.host], rank.cpu_pct)
            yield ranks


@dataclass
class Exporter:
    """A running exporter: ``url`` to scrape, ``close()`` to stop."""

    host: str
    port: int
    server: Any
    thread: Any

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}/metrics"

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(5)


def serve(address: str, source: Callable[[], Any], *, host_label: str | None = None) -> Exporter:
    """Serve the metrics of ``source()`` at address ([HOST:]PORT) until close()."""
    from prometheus_client import start_http_server

    bind, port = parse_address(address)
    registry = CollectorRegistry(auto_describe=False)
    registry.register(TelemetryCollector(source, host_label))
    try:
        server, thread = start_http_server(port, addr=bind, registry=registry)
    except OSError as exc:
        raise PkbError(f"Cannot serve Prometheus metrics on {bind}:{port} ({exc.strerror or exc}); pick another port.") from exc
    return Exporter(bind, int(server.server_address[1]), server, thread)
