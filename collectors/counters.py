"""Bytes on the wire per timed phase, read inside each rank around its timed loop.

    counters = PhaseCounters(device_index)      # CUDA device index of this rank
    counters.start()                            # just before the timed loop
    ...timed iteration; counters.tick()...       # tick between iterations, outside their timing
    counters.stop(iterations) -> dict           # just after the loop

``stop`` returns bytes moved by this rank's GPU over the phase (None where NVML cannot count):
nvlink_tx_bytes / nvlink_rx_bytes (all links summed), nvlink_bytes = the busier direction (links
are full duplex, so this is what compares with a task's Traffic.wire_bytes), the same for PCIe,
the per-iteration figures, and "links": {link: tx + rx bytes}. start and stop each cost one
batched field read plus one GPM sample (a few hundred microseconds), outside the timed loop.

PCIe byte counters are 32-bit and wrap every 4 GiB (~68 ms at Gen5 x16 line rate): two reads
further apart than that may hide a second wrap. So a long phase is read in steps: ``tick()``,
called between timed iterations (outside the timed window, the GPU idle), reads the PCIe
counters again once half the wrap-safe window has gone by (one ~300 us read per ~30 ms), and
every step is unwrapped modulo 2^32 and summed. The figure stays exact however long the phase
runs, as long as no single gap between reads outgrows the window (one iteration longer than
~60 ms at Gen5); then the bytes come from GPM's PCIe rates times the phase length where GPM
exists (Hopper and newer), else None with the reason.

GPM lags the traffic. Measured on an H200 (bench/gpu_collectors_check.py part 4b): 6 GiB copied
host-to-device in 117 ms, GPM sampled just before and just after, counts 0 bytes; sampled 50 ms
after the copy ends, 44-50% of them; 100-200 ms after, 0.9-1.4x. Under steady traffic its rate over
any span >= 100 ms agrees with the counters to 0.6%. So over a phase GPM misses up to ~150 ms at
the end and counts as much from just before the start (the warm-up, which precedes the timed loop
directly, moves the same traffic): fair for phases of a second or more, wrong for short ones.
``gpm_min_phase_s`` (1 s) is where GPM starts to be trusted; below it there is no GPM figure.

``traffic_flag`` compares measured bytes per iteration with the task's traffic model.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from typing import Any

from collectors import nvml as N
from collectors.nvml import CounterSnapshot, Gpm, NvmlSampler, counter_delta

# The shortest phase whose bytes GPM's rates may give: GPM lags the traffic by ~100-150 ms (see above).
GPM_MIN_PHASE_S = 1.0

# One NVML session and GPM buffer pair per process and GPU for the real library: the worker makes a
# PhaseCounters per variant, and NVML init / GPM allocation need not be repeated each time.
_shared: dict[int, tuple[NvmlSampler, Gpm | None]] = {}


def nvml_index_for_cuda_device(cuda_index: int, nvml: Any, uuid: str | None = None) -> int:
    """The NVML index of CUDA device ``cuda_index`` of this process.

    CUDA numbers only the visible GPUs (CUDA_VISIBLE_DEVICES) and may order them differently from
    NVML, which numbers all of them by PCI bus. The GPU's UUID settles it; without one (no torch
    CUDA), CUDA_VISIBLE_DEVICES is read, and failing that the indices are taken to agree.
    """
    if uuid is None:
        try:
            import torch

            if torch.cuda.is_available():
                uuid = str(torch.cuda.get_device_properties(cuda_index).uuid)
        except Exception:
            uuid = None
    if uuid:
        for candidate in (uuid, f"GPU-{uuid}", f"MIG-{uuid}"):
            try:
                return int(nvml.nvmlDeviceGetIndex(nvml.nvmlDeviceGetHandleByUUID(candidate)))
            except Exception:
                continue
    visible = [p.strip() for p in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if p.strip()]
    if visible and all(p.isdigit() for p in visible) and cuda_index < len(visible):
        return int(visible[cuda_index])
    return cuda_index


class PhaseCounters:
    """NVLink / PCIe bytes moved by one GPU between ``start()`` and ``stop()``."""

    def __init__(
        self, device_index: int | None, nvml: Any = None, *, uuid: str | None = None,
        clock: Callable[[], float] = time.monotonic, gpm_min_phase_s: float = GPM_MIN_PHASE_S,
    ) -> None:
        self.clock = clock
        self.gpm_min_phase_s = max(gpm_min_phase_s, N.GPM_MIN_INTERVAL_S)
        self.reason: str | None = None
        self._sampler: NvmlSampler | None = None
        self._gpm: Gpm | None = None
        self._start: CounterSnapshot | None = None
        self._started_at: float | None = None
        self._nvml_index: int | None = None
        self._pcie: N.PcieSteps | None = None  # the phase's PCIe counters, read in wrap-safe steps
        if device_index is None:
            self.reason = "no GPU: nothing to count"
            return
        opened = self._open(device_index, nvml, uuid)
        if opened is not None:
            self._sampler, self._gpm = opened

    def _open(self, device_index: int, nvml: Any, uuid: str | None) -> tuple[NvmlSampler, Gpm | None] | None:
        try:
            library = nvml if nvml is not None else N.load_nvml()
            library.nvmlInit()
        except BaseException as exc:
            if isinstance(exc, KeyboardInterrupt):
                raise
            self.reason = N.describe_init_error(exc)
            return None
        try:
            index = nvml_index_for_cuda_device(device_index, library, uuid)
        finally:
            library.nvmlShutdown()  # the sampler below holds its own reference
        self._nvml_index = index
        if nvml is None and index in _shared:
            return _shared[index]
        sampler = NvmlSampler(nvml=library, indices=[index], gpm=False, pcie_counters=True, clock=self.clock)
        if not sampler.available():
            self.reason = sampler.reason
            return None
        gpm = None
        handle = sampler.gpus[0].handle
        if Gpm.supported(sampler.nvml, handle):
            try:
                gpm = Gpm(sampler.nvml, handle, clock=self.clock)
            except Exception:
                gpm = None
        if nvml is None:
            _shared[index] = (sampler, gpm)
        return sampler, gpm

    def available(self) -> bool:
        return self._sampler is not None

    def start(self) -> None:
        self._start = None
        if self._sampler is None:
            return
        if self._gpm is not None:
            try:
                self._sampler.nvml.nvmlGpmSampleGet(self._gpm.handle, self._gpm.buffers[0])
            except Exception:
                self._gpm = None
        gpu = self._sampler.gpus[0]
        self._start = gpu.read_counters()
        self._started_at = self._start.host_monotonic_s
        safe_s = N.pcie_wrap_safe_s(gpu.pcie_generation, gpu.pcie_width)
        self._pcie = N.PcieSteps(self._start, safe_s) if gpu.pcie_counters else None

    def tick(self) -> None:
        """Between timed iterations: read the PCIe counters if the last read is half a wrap old.

        Costs nothing (a clock read) until then; one batched read (~300 us) when due.
        """
        if self._sampler is None or self._start is None or self._pcie is None:
            return
        if self.clock() - self._pcie.read_at >= self._pcie.safe_s / 2:
            self._pcie.add(self._sampler.gpus[0].read_counters(include_nvlink=False))

    def stop(self, iterations: int) -> dict[str, Any]:
        out: dict[str, Any] = {
            "iterations": iterations, "elapsed_s": None,
            "nvlink_bytes": None, "nvlink_tx_bytes": None, "nvlink_rx_bytes": None, "nvlink_bytes_per_iter": None,
            "pcie_bytes": None, "pcie_tx_bytes": None, "pcie_rx_bytes": None, "pcie_bytes_per_iter": None,
            "pcie_source": None, "links": {}, "reason": self.reason,
        }
        if self._sampler is None or self._start is None or self._started_at is None:
            if self._sampler is not None:
                out["reason"] = "stop() without start()"
            return out
        gpu = self._sampler.gpus[0]
        end = gpu.read_counters()
        elapsed_s = end.host_monotonic_s - self._started_at
        pcie_exact = None
        if self._pcie is not None:
            self._pcie.add(end)
            pcie_exact = self._pcie.exact_bytes()
        # GPM only where a figure needs it (and the phase is long enough to trust its rates).
        gpm_values = None
        wants_gpm = (not gpu.nvlink_counters and gpu.active_links) or pcie_exact is None
        if self._gpm is not None and wants_gpm and elapsed_s >= self.gpm_min_phase_s - 1e-6:
            try:
                self._sampler.nvml.nvmlGpmSampleGet(self._gpm.handle, self._gpm.buffers[1])
                gpm_values = self._gpm.metrics_between(self._gpm.buffers[0], self._gpm.buffers[1])
            except Exception:
                gpm_values = None
        start, self._start = self._start, None
        out["elapsed_s"] = elapsed_s

        # NVLink: 64-bit KiB counters per link; a link whose counter went back spoils the sum.
        if gpu.nvlink_counters:
            tx_total: int | None = 0
            rx_total: int | None = 0
            for link in gpu.links:
                tx = counter_delta(start.nvlink_tx_kib.get(link), end.nvlink_tx_kib.get(link))
                rx = counter_delta(start.nvlink_rx_kib.get(link), end.nvlink_rx_kib.get(link))
                tx_total = tx_total + tx * N.KIB if tx_total is not None and tx is not None else None
                rx_total = rx_total + rx * N.KIB if rx_total is not None and rx is not None else None
                out["links"][link] = (tx + rx) * N.KIB if tx is not None and rx is not None else None
            out["nvlink_tx_bytes"], out["nvlink_rx_bytes"] = tx_total, rx_total
        elif gpm_values is not None and gpu.active_links:
            # GPM reads 0 B/s NVLink on a GPU with no active link: that is "no NVLink", not "idle".
            out["nvlink_tx_bytes"] = _bytes(gpm_values.nvlink_tx_bytes_per_s, elapsed_s)
            out["nvlink_rx_bytes"] = _bytes(gpm_values.nvlink_rx_bytes_per_s, elapsed_s)

        # PCIe: the counters, read in wrap-safe steps (tick), else GPM's rates over the phase.
        if pcie_exact is not None:
            out["pcie_tx_bytes"], out["pcie_rx_bytes"] = pcie_exact
            out["pcie_source"] = "counters"
        elif gpm_values is not None:
            out["pcie_tx_bytes"] = _bytes(gpm_values.pcie_tx_bytes_per_s, elapsed_s)
            out["pcie_rx_bytes"] = _bytes(gpm_values.pcie_rx_bytes_per_s, elapsed_s)
            out["pcie_source"] = "gpm"
        _busier_per_iteration(out, iterations)
        out["reason"] = self._why_missing(gpu, out, elapsed_s)
        return out

    def _why_missing(self, gpu: Any, out: dict[str, Any], elapsed_s: float) -> str | None:
        """One sentence per figure that is None, joined; None if every figure is there."""
        gpm_short = self._gpm is not None and elapsed_s < self.gpm_min_phase_s - 1e-6
        short = (f"the phase ({elapsed_s * 1e3:.0f} ms) is shorter than the {self.gpm_min_phase_s:.1f} s "
                 "GPM's lagging rates need")
        reasons = []
        if out["nvlink_bytes"] is None and not gpu.nvlink_counters:
            if gpu.active_links and gpm_short:
                reasons.append(f"NVLink counters unsupported and {short}")
            elif not gpu.active_links:
                reasons.append("NVML counts no NVLink traffic on this GPU (no NVLink, or the counters are not supported)")
        elif out["nvlink_bytes"] is None:
            reasons.append("an NVLink counter went backwards (reset) during the phase")
        if out["pcie_bytes"] is None:
            counters = (f"PCIe counters were read further apart than their wrap-safe {self._pcie.safe_s * 1e3:.0f} ms"
                        if self._pcie is not None else "no PCIe counters")
            gpm = "no GPM" if self._gpm is None else short if gpm_short else "GPM gave no PCIe rate"
            reasons.append(f"{counters} and {gpm}: no PCIe figure")
        return "; ".join(reasons) or None


def _busier_per_iteration(out: dict[str, Any], iterations: int) -> None:
    """Fill nvlink_bytes / pcie_bytes (the busier direction: links are full duplex) and their
    per-iteration figures from the tx / rx sums; no PCIe bytes, no PCIe source."""
    if out["pcie_tx_bytes"] is None and out["pcie_rx_bytes"] is None:
        out["pcie_source"] = None
    for kind in ("nvlink", "pcie"):
        tx, rx = out[f"{kind}_tx_bytes"], out[f"{kind}_rx_bytes"]
        busier = max(tx, rx) if tx is not None and rx is not None else None
        out[f"{kind}_bytes"] = busier
        out[f"{kind}_bytes_per_iter"] = busier / iterations if busier is not None and iterations > 0 else None


def _bytes(rate: float | None, seconds: float) -> int | None:
    return int(round(rate * seconds)) if rate is not None else None


def traffic_flag(
    measured_bytes_per_iter: float | None, model_bytes: int, tolerance: float = 0.1, *, mode: str = "nccl",
    wasteful_factor: float = 2.0,
) -> str | None:
    """'below_model', 'wasteful' or None, for NVLink bytes per iteration against the traffic model.

    ``model_bytes``: the least bytes per call over this rank's busier link direction that any
    correct algorithm needs (Traffic.wire_bytes). Measuring less than that (beyond ``tolerance``)
    is impossible for a correct candidate, so it is suspicious ('below_model'): skipped work,
    results cached between iterations, or traffic over another path. Measuring more than
    ``wasteful_factor`` times the model is 'wasteful'. Other traffic on the GPU only adds bytes.

    Only nccl mode (one GPU per rank) puts rank-to-rank traffic on NVLink. In shared-gpu mode
    the ranks share one GPU and in cpu mode there is none, so the flag never fires there.
    """
    if mode != "nccl" or measured_bytes_per_iter is None or model_bytes is None or model_bytes <= 0:
        return None
    if measured_bytes_per_iter < model_bytes * (1.0 - tolerance):
        return "below_model"
    if measured_bytes_per_iter > model_bytes * wasteful_factor:
        return "wasteful"
    return None


def combine_phases(phases: list[dict[str, Any]], iterations: int) -> dict[str, Any]:
    """One phase's figures from several ``stop()`` results (timing runs in interleaved blocks).

    Bytes add up where every block has them, else they are None; a link's bytes likewise. The
    PCIe source is "counters" only if every block counted with them.
    """
    if not phases:
        return PhaseCounters(None).stop(iterations)
    out: dict[str, Any] = {"iterations": iterations, "links": {}}
    for key in ("elapsed_s", "nvlink_tx_bytes", "nvlink_rx_bytes", "pcie_tx_bytes", "pcie_rx_bytes"):
        values = [p.get(key) for p in phases]
        out[key] = sum(values) if all(v is not None for v in values) else None
    for link in sorted({name for p in phases for name in p.get("links", {})}):
        link_values = [p.get("links", {}).get(link) for p in phases]
        out["links"][link] = sum(v for v in link_values if v is not None) if None not in link_values else None
    sources = {p.get("pcie_source") for p in phases}
    out["pcie_source"] = sources.pop() if len(sources) == 1 else ("mixed" if None not in sources else None)
    _busier_per_iteration(out, iterations)
    reasons = list(dict.fromkeys(p["reason"] for p in phases if p.get("reason")))
    out["reason"] = "; ".join(reasons) or None
    return out
