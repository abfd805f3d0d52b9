"""NVML sampler: per-GPU NVLink, PCIe, utilisation, power, clocks, temperature, memory and GPM.

A thin layer over nvidia-ml-py (``import pynvml``). Every query that the device does not support, or
that fails, becomes None ("not available"), never 0 and never an exception to the caller. The NVML
module is injectable (``NvmlSampler(nvml=...)``) so tests replay recorded counter sequences
(collectors/replay.py).

What is read, and why this way:
- NVLink: fields 138/139 (``NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX/RX``) are cumulative KiB counters
  per link. The link goes in the field's ``scopeId``; a bare field id means scope 0 and reads link 0
  only (a known trap). We ask for every active link in one batched call and sum them per GPU.
- PCIe: fields 197/198 are cumulative byte counters, 32 bits wide: they wrap every 4 GiB (~70 ms at
  PCIe Gen5 line rate). We unwrap deltas modulo 2^32, which is right only if at most one wrap
  happened between two reads; so where GPM is available its PCIe rates are used instead and the
  slow (~320 us) counter fields are not read at all.
- Rates are counter deltas over NVML's own per-field timestamps (not our wall clock). A counter
  that goes backwards (reset) or yields an impossible rate gives None for that interval.
- nvmlDeviceGetPcieThroughput is never called: it sleeps ~20 ms inside NVML per call.
- GPM (Hopper and newer): two sample buffers per GPU; a new GPM sample is taken only when at least
  100 ms have passed since the last one, and the last GPM values are reused in between.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from collectors.sample import GpuSample, LinkRates, LinkSample

# NVML ABI numbers (nvml.h). They are stable across driver releases; tests check them against the
# installed pynvml. Kept here so an injected NVML needs only the functions.
NVML_SUCCESS = 0
NVML_ERROR_NOT_SUPPORTED = 3
NVML_ERROR_INVALID_ARGUMENT = 2
NVML_ERROR_FUNCTION_NOT_FOUND = 13
NVML_ERROR_LIBRARY_NOT_FOUND = 12
NVML_ERROR_DRIVER_NOT_LOADED = 9
NVML_ERROR_NO_PERMISSION = 4

FI_NVLINK_LINK_COUNT = 91
FI_NVLINK_DATA_TX_KIB = 138  # cumulative KiB, scopeId = link; scopeId 0xFFFFFFFF = all links
FI_NVLINK_DATA_RX_KIB = 139
FI_PCIE_TX_BYTES = 197  # cumulative bytes, 32-bit: wraps every 4 GiB
FI_PCIE_RX_BYTES = 198
SCOPE_ALL_LINKS = 0xFFFFFFFF

CLOCK_SM = 1
CLOCK_MEM = 2
TEMPERATURE_GPU = 0
NVLINK_MAX_LINKS = 36  # NVML_NVLINK_MAX_LINKS in NVML 12.8+ (18 before)

GPM_METRICS_GET_VERSION = 1
GPM_SM_UTIL = 2
GPM_ANY_TENSOR_UTIL = 5
GPM_DRAM_BW_UTIL = 10
GPM_PCIE_TX_PER_SEC = 20  # MiB/s
GPM_PCIE_RX_PER_SEC = 21
GPM_NVLINK_TOTAL_RX_PER_SEC = 60  # MiB/s
GPM_NVLINK_TOTAL_TX_PER_SEC = 61
GPM_MIN_INTERVAL_S = 0.1  # GPM needs samples >= 100 ms apart for meaningful rates

KIB = 1024
MIB = 1024 * 1024
PCIE_COUNTER_MODULUS = 2**32

# Rates above these are not physics but a counter reset or a misread: dropped (None).
MAX_NVLINK_LINK_BYTES_PER_S = 1e12
MAX_PCIE_BYTES_PER_S = 256e9

# PCIe payload bytes/s per lane by generation (after line encoding), for the wrap-safe window.
_PCIE_LANE_BYTES_PER_S = {1: 0.25e9, 2: 0.5e9, 3: 0.985e9, 4: 1.969e9, 5: 3.938e9, 6: 7.563e9}


def gpm_nvlink_link_metric_ids(link: int) -> tuple[int, int]:
    """(rx_id, tx_id) of the per-link GPM NVLink rate metrics (MiB/s) for links 0..35."""
    if 0 <= link < 18:
        return 62 + 2 * link, 63 + 2 * link
    if 18 <= link < 36:
        return 212 + 2 * (link - 18), 213 + 2 * (link - 18)
    raise ValueError(f"GPM has no per-link NVLink metric for link {link}")


def pcie_wrap_safe_s(generation: int | None, width: int | None) -> float:
    """Longest interval (s) over which a 32-bit PCIe byte counter cannot wrap twice, with 10% margin.

    Unknown link: assume Gen6 x16, the fastest there is, so the window errs short.
    """
    rate = _PCIE_LANE_BYTES_PER_S.get(generation or 6, _PCIE_LANE_BYTES_PER_S[6]) * (width or 16)
    return 0.9 * PCIE_COUNTER_MODULUS / rate


# ------------------------------------------------------------------------------------ records
@dataclass(frozen=True)
class CounterValue:
    timestamp_us: int  # NVML's timestamp of the reading (host clock fallback where NVML gives 0)
    value: int


@dataclass
class CounterSnapshot:
    """One batched read of a GPU's cumulative traffic counters. Missing key / None: not available."""

    gpu: int
    host_monotonic_s: float
    nvlink_tx_kib: dict[int, CounterValue] = field(default_factory=dict)
    nvlink_rx_kib: dict[int, CounterValue] = field(default_factory=dict)
    pcie_tx_bytes: CounterValue | None = None
    pcie_rx_bytes: CounterValue | None = None


def counter_delta(prev: CounterValue | None, cur: CounterValue | None, *, modulus: int | None = None) -> int | None:
    """Counter increase between two reads; None if either is missing or a non-wrapping counter went back."""
    if prev is None or cur is None:
        return None
    delta = cur.value - prev.value
    if modulus is not None:
        return delta % modulus  # at most one wrap assumed: the caller reads often enough
    return delta if delta >= 0 else None


def counter_rate(
    prev: CounterValue | None, cur: CounterValue | None, *, unit_bytes: int = 1, modulus: int | None = None,
    max_bytes_per_s: float | None = None,
) -> float | None:
    """Bytes per second between two reads, over NVML's own timestamps; None when not computable."""
    delta = counter_delta(prev, cur, modulus=modulus)
    if delta is None or prev is None or cur is None:
        return None
    dt_us = cur.timestamp_us - prev.timestamp_us
    if dt_us <= 0:
        return None
    rate = delta * unit_bytes / (dt_us / 1e6)
    if max_bytes_per_s is not None and rate > max_bytes_per_s:
        return None
    return rate


# ------------------------------------------------------------------------------------ NVML access
def load_nvml() -> Any:
    """The real pynvml module, or raise ImportError."""
    import pynvml

    return pynvml


def _error_code(exc: BaseException) -> int | None:
    value = getattr(exc, "value", None)
    return value if isinstance(value, int) else None


def describe_init_error(exc: BaseException) -> str:
    """Why NVML could not start, in a sentence for the user."""
    code = _error_code(exc)
    if isinstance(exc, ImportError):
        return "nvidia-ml-py is not installed (pip install nvidia-ml-py), so NVIDIA GPUs cannot be read"
    if code == NVML_ERROR_LIBRARY_NOT_FOUND:
        return "no NVIDIA driver found (the NVML library libnvidia-ml.so is missing)"
    if code == NVML_ERROR_DRIVER_NOT_LOADED:
        return "the NVIDIA driver is not loaded"
    if code == NVML_ERROR_NO_PERMISSION:
        return "no permission to open the NVIDIA driver"
    return f"NVML failed to start ({exc})"


def nvml_call(nvml: Any, unsupported: set[str], function: str, *args: Any, handle: Any = None) -> Any:
    """nvml.<function>([handle,] *args), or None ("not available") when NVML lacks it, the device
    does not support it, or it fails. What answered NOT_SUPPORTED (or is missing) is remembered in
    ``unsupported`` (one set per device) and not asked again. NVML queries go through here."""
    key = f"{function}{args}"
    if key in unsupported:
        return None
    fn = getattr(nvml, function, None)
    if fn is None:
        unsupported.add(key)
        return None
    try:
        return fn(*args) if handle is None else fn(handle, *args)
    except Exception as exc:  # NVMLError and ctypes errors alike: the value is just unavailable
        if _error_code(exc) in (NVML_ERROR_NOT_SUPPORTED, NVML_ERROR_FUNCTION_NOT_FOUND, NVML_ERROR_INVALID_ARGUMENT):
            unsupported.add(key)
        return None


class Nvml:
    """The gateway to NVML for one-off questions (which processes use the GPUs, device facts):
    ``with Nvml() as nvml: nvml.device_call(0, "nvmlDeviceGetName")``. Where NVML cannot start,
    ``reason`` says why and every call answers None, as the sampler's queries do."""

    def __init__(self, nvml: Any = None) -> None:
        self.module: Any = None
        self.reason: str | None = None
        self.unsupported: set[str] = set()
        self._device_unsupported: dict[int, set[str]] = {}
        self._handles: dict[int, Any] = {}
        try:
            module = nvml if nvml is not None else load_nvml()
            module.nvmlInit()
            self.module = module
        except BaseException as exc:  # ImportError, NVMLError, OSError: all mean "no NVML here"
            if isinstance(exc, KeyboardInterrupt):
                raise
            self.reason = describe_init_error(exc)

    @property
    def available(self) -> bool:
        return self.module is not None

    def call(self, function: str, *args: Any) -> Any:
        return nvml_call(self.module, self.unsupported, function, *args) if self.module is not None else None

    def device_count(self) -> int:
        return int(self.call("nvmlDeviceGetCount") or 0)

    def handle(self, index: int) -> Any:
        if index not in self._handles:
            self._handles[index] = self.call("nvmlDeviceGetHandleByIndex", index)
        return self._handles[index]

    def device_call(self, index: int, function: str, *args: Any) -> Any:
        handle = self.handle(index)
        if handle is None:
            return None
        unsupported = self._device_unsupported.setdefault(index, set())
        return nvml_call(self.module, unsupported, function, *args, handle=handle)

    def compute_pids(self) -> set[int]:
        """Processes holding a compute context on any GPU (empty where NVML cannot say)."""
        pids: set[int] = set()
        for index in range(self.device_count()):
            for proc in self.device_call(index, "nvmlDeviceGetComputeRunningProcesses") or []:
                pid = getattr(proc, "pid", None)
                if isinstance(pid, int):
                    pids.add(pid)
        return pids

    def close(self) -> None:
        if self.module is not None:
            try:
                self.module.nvmlShutdown()
            except Exception:
                pass
            self.module = None

    def __enter__(self) -> Nvml:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _field_value(entry: Any) -> int | float | None:
    """The number inside an nvmlFieldValue_t, by its value type."""
    kind = int(entry.valueType)
    value = entry.value
    attr = {0: "dVal", 1: "uiVal", 2: "ulVal", 3: "ullVal", 4: "sllVal", 5: "siVal", 6: "usVal"}.get(kind)
    if attr is None:
        return None
    return getattr(value, attr)


class _Gpu:
    """One GPU as NVML sees it: handle, active links, and which queries it answers."""

    def __init__(self, nvml: Any, index: int, *, clock: Callable[[], float]) -> None:
        self.nvml = nvml
        self.index = index
        self.clock = clock
        self.handle = nvml.nvmlDeviceGetHandleByIndex(index)
        self.name = self._name()
        self.unsupported: set[str] = set()  # calls that answered NOT_SUPPORTED: not asked again
        self.active_links = self._discover_links()  # links NVML reports up
        self.links = list(self.active_links)  # of those, the ones whose counters answer
        self.nvlink_counters = bool(self.links)
        self.pcie_counters = True
        self.pcie_generation = self.call("nvmlDeviceGetMaxPcieLinkGeneration")
        self.pcie_width = self.call("nvmlDeviceGetMaxPcieLinkWidth")
        self._probe_counters()

    # -- generic call with "unavailable" semantics
    def call(self, function: str, *args: Any) -> Any:
        """nvml.<function>(handle, *args), or None if unsupported / failing (nvml_call)."""
        return nvml_call(self.nvml, self.unsupported, function, *args, handle=self.handle)

    def _name(self) -> str:
        try:
            name = self.nvml.nvmlDeviceGetName(self.handle)
        except Exception:
            return f"GPU {self.index}"
        return name.decode() if isinstance(name, bytes) else str(name)

    def _discover_links(self) -> list[int]:
        count = None
        entries = self._field_values([(FI_NVLINK_LINK_COUNT, 0)])
        if entries and int(entries[0].nvmlReturn) == NVML_SUCCESS:
            count = int(_field_value(entries[0]) or 0)
        most = count if count is not None else int(getattr(self.nvml, "NVML_NVLINK_MAX_LINKS", NVLINK_MAX_LINKS))
        active, state_answered = [], False
        for link in range(most):
            fn = getattr(self.nvml, "nvmlDeviceGetNvLinkState", None)
            if fn is None:
                break
            try:
                state = fn(self.handle, link)
            except Exception as exc:
                if _error_code(exc) == NVML_ERROR_NOT_SUPPORTED:
                    break  # the GPU has no NVLink (or NVML cannot tell): no point asking per link
                continue
            state_answered = True
            if int(state) == 1:
                active.append(link)
        if not state_answered and count:
            return list(range(count))
        return active

    def _field_values(self, requests: list[tuple[int, int]]) -> list[Any] | None:
        try:
            return list(self.nvml.nvmlDeviceGetFieldValues(self.handle, requests))
        except Exception:
            return None

    def _probe_counters(self) -> None:
        """Drop counter groups the device refuses, so the hot path asks only what it answers."""
        if self.links:
            snap = self.read_counters(include_pcie=False)
            self.links = [link for link in self.links if link in snap.nvlink_tx_kib or link in snap.nvlink_rx_kib]
            self.nvlink_counters = bool(self.links)
        snap = self.read_counters(include_nvlink=False)
        self.pcie_counters = snap.pcie_tx_bytes is not None or snap.pcie_rx_bytes is not None

    def read_counters(self, *, include_nvlink: bool = True, include_pcie: bool = True) -> CounterSnapshot:
        """One batched nvmlDeviceGetFieldValues call for the cumulative traffic counters."""
        snap = CounterSnapshot(gpu=self.index, host_monotonic_s=self.clock())
        requests: list[tuple[int, int]] = []
        if include_nvlink and self.nvlink_counters:
            for link in self.links:
                requests += [(FI_NVLINK_DATA_TX_KIB, link), (FI_NVLINK_DATA_RX_KIB, link)]
        if include_pcie and self.pcie_counters:
            requests += [(FI_PCIE_TX_BYTES, 0), (FI_PCIE_RX_BYTES, 0)]
        if not requests:
            return snap
        entries = self._field_values(requests)
        if entries is None:
            return snap
        fallback_us = int(snap.host_monotonic_s * 1e6)
        for (field_id, scope), entry in zip(requests, entries, strict=False):
            if int(entry.nvmlReturn) != NVML_SUCCESS:
                continue
            raw = _field_value(entry)
            if raw is None:
                continue
            reading = CounterValue(int(entry.timestamp) or fallback_us, int(raw))
            if field_id == FI_NVLINK_DATA_TX_KIB:
                snap.nvlink_tx_kib[scope] = reading
            elif field_id == FI_NVLINK_DATA_RX_KIB:
                snap.nvlink_rx_kib[scope] = reading
            elif field_id == FI_PCIE_TX_BYTES:
                snap.pcie_tx_bytes = reading
            elif field_id == FI_PCIE_RX_BYTES:
                snap.pcie_rx_bytes = reading
        return snap

    def gauges(self) -> dict[str, Any]:  # GpuSample's gauge fields by name, None where not available
        """Utilisation, power, clocks, temperature, memory: ~10 us together."""
        util = self.call("nvmlDeviceGetUtilizationRates")
        memory = self.call("nvmlDeviceGetMemoryInfo")
        power_mw = self.call("nvmlDeviceGetPowerUsage")
        sm_clock = self.call("nvmlDeviceGetClockInfo", CLOCK_SM)
        mem_clock = self.call("nvmlDeviceGetClockInfo", CLOCK_MEM)
        temperature = self.call("nvmlDeviceGetTemperature", TEMPERATURE_GPU)
        return {
            "sm_util_pct": float(util.gpu) if util is not None else None,
            "mem_util_pct": float(util.memory) if util is not None else None,
            "memory_used_bytes": float(memory.used) if memory is not None else None,
            "power_w": power_mw / 1000.0 if power_mw is not None else None,
            "sm_clock_mhz": float(sm_clock) if sm_clock is not None else None,
            "mem_clock_mhz": float(mem_clock) if mem_clock is not None else None,
            "temperature_c": float(temperature) if temperature is not None else None,
        }


@dataclass
class GpmValues:
    """Rates over the last GPM interval; None: the metric is not available."""

    interval_s: float | None = None
    nvlink_tx_bytes_per_s: float | None = None
    nvlink_rx_bytes_per_s: float | None = None
    pcie_tx_bytes_per_s: float | None = None
    pcie_rx_bytes_per_s: float | None = None
    sm_util_pct: float | None = None
    dram_bw_util_pct: float | None = None
    tensor_active_pct: float | None = None
    links: dict[int, tuple[float | None, float | None]] = field(default_factory=dict)  # link: (tx, rx)


class Gpm:
    """GPM metrics of one GPU: two sample buffers, at most one new sample per 100 ms."""

    def __init__(self, nvml: Any, handle: Any, *, links: list[int] | None = None, clock: Callable[[], float]) -> None:
        self.nvml = nvml
        self.handle = handle
        self.clock = clock
        self.links = [link for link in (links or []) if link < 36]
        self.latest = GpmValues()
        self.buffers = [nvml.nvmlGpmSampleAlloc(), nvml.nvmlGpmSampleAlloc()]
        self._previous = 0  # index of the buffer holding the last sample
        nvml.nvmlGpmSampleGet(handle, self.buffers[0])
        self._previous_at = clock()

    @staticmethod
    def supported(nvml: Any, handle: Any) -> bool:
        try:
            return bool(nvml.nvmlGpmQueryDeviceSupport(handle).isSupportedDevice)
        except Exception:
            return False

    def _metric_ids(self) -> list[tuple[str, int]]:
        ids = [
            ("nvlink_tx_bytes_per_s", GPM_NVLINK_TOTAL_TX_PER_SEC), ("nvlink_rx_bytes_per_s", GPM_NVLINK_TOTAL_RX_PER_SEC),
            ("pcie_tx_bytes_per_s", GPM_PCIE_TX_PER_SEC), ("pcie_rx_bytes_per_s", GPM_PCIE_RX_PER_SEC),
            ("sm_util_pct", GPM_SM_UTIL), ("dram_bw_util_pct", GPM_DRAM_BW_UTIL),
            ("tensor_active_pct", GPM_ANY_TENSOR_UTIL),
        ]
        for link in self.links:
            rx_id, tx_id = gpm_nvlink_link_metric_ids(link)
            ids += [(f"link_tx:{link}", tx_id), (f"link_rx:{link}", rx_id)]
        return ids

    def sample(self, *, force: bool = False) -> GpmValues:
        """New values if >= 100 ms passed since the last GPM sample (or force), else the last ones."""
        now = self.clock()
        if not force and now - self._previous_at < GPM_MIN_INTERVAL_S - 1e-6:
            return self.latest
        current = 1 - self._previous
        try:
            self.nvml.nvmlGpmSampleGet(self.handle, self.buffers[current])
            values = self.metrics_between(self.buffers[self._previous], self.buffers[current])
        except Exception:
            return self.latest
        values.interval_s = now - self._previous_at
        self._previous, self._previous_at = current, now
        self.latest = values
        return values

    def metrics_between(self, first: Any, second: Any) -> GpmValues:
        ids = self._metric_ids()
        request = self.nvml.c_nvmlGpmMetricsGet_t()
        request.version = GPM_METRICS_GET_VERSION
        request.numMetrics = len(ids)
        request.sample1 = first
        request.sample2 = second
        for slot, (_, metric_id) in zip(request.metrics, ids, strict=False):
            slot.metricId = metric_id
        self.nvml.nvmlGpmMetricsGet(request)
        raw: dict[str, float | None] = {}
        for slot, (name, _) in zip(request.metrics, ids, strict=False):
            value = float(slot.value)
            ok = int(slot.nvmlReturn) == NVML_SUCCESS and value == value and value >= 0
            raw[name] = value if ok else None
        out = GpmValues()
        for name in ("nvlink_tx_bytes_per_s", "nvlink_rx_bytes_per_s", "pcie_tx_bytes_per_s", "pcie_rx_bytes_per_s"):
            mib = raw[name]
            setattr(out, name, mib * MIB if mib is not None else None)
        out.sm_util_pct = raw["sm_util_pct"]
        out.dram_bw_util_pct = raw["dram_bw_util_pct"]
        out.tensor_active_pct = raw["tensor_active_pct"]
        for link in self.links:
            tx, rx = raw[f"link_tx:{link}"], raw[f"link_rx:{link}"]
            out.links[link] = (tx * MIB if tx is not None else None, rx * MIB if rx is not None else None)
        return out

    def new_buffer(self) -> Any:
        return self.nvml.nvmlGpmSampleAlloc()

    def close(self) -> None:
        for buffer in self.buffers:
            try:
                self.nvml.nvmlGpmSampleFree(buffer)
            except Exception:
                pass
        self.buffers = []


class PcieSteps:
    """One GPU's PCIe byte counters read in wrap-safe steps (between two samples, or over one
    timed phase: collectors.counters.PhaseCounters).

    Each step is unwrapped modulo 2^32 over NVML's timestamps and summed; a step longer than the
    wrap-safe window (or a counter missing) spoils the interval, which then has no rate.
    """

    def __init__(self, reading: CounterSnapshot, safe_s: float) -> None:
        self.safe_s = safe_s
        self.last = (reading.pcie_tx_bytes, reading.pcie_rx_bytes)
        self.read_at = reading.host_monotonic_s
        self.restart()

    def restart(self) -> None:
        """Start a new interval at the last reading."""
        self.start = self.last
        self.sums: list[int | None] = [0, 0]
        self.spoiled = False

    def add(self, reading: CounterSnapshot) -> None:
        current = (reading.pcie_tx_bytes, reading.pcie_rx_bytes)
        for i, (before, after) in enumerate(zip(self.last, current, strict=False)):
            if before is None or after is None:
                self.sums[i] = None
                continue
            if after.timestamp_us == before.timestamp_us:
                continue  # NVML did not refresh it: nothing new, and the old reading still stands
            if after.timestamp_us - before.timestamp_us > self.safe_s * 1e6:
                self.spoiled = True  # a second wrap may hide in this step
            step = counter_delta(before, after, modulus=PCIE_COUNTER_MODULUS)
            total = self.sums[i]
            self.sums[i] = total + step if total is not None and step is not None else None
        tx, rx = (after if after is not None else before for before, after in zip(self.last, current, strict=True))
        self.last = (tx, rx)
        self.read_at = reading.host_monotonic_s

    def exact_bytes(self) -> tuple[int, int] | None:
        """(tx, rx) bytes since the interval began, or None if a step may hide a second wrap."""
        tx, rx = self.sums
        if self.spoiled or tx is None or rx is None:
            return None
        return tx, rx

    def rates(self, max_bytes_per_s: float) -> tuple[float | None, float | None]:
        out: list[float | None] = []
        for i in range(2):
            start, end, total = self.start[i], self.last[i], self.sums[i]
            rate = None
            if not self.spoiled and total is not None and start is not None and end is not None:
                dt_us = end.timestamp_us - start.timestamp_us
                if dt_us > 0:
                    rate = total / (dt_us / 1e6)
                    rate = rate if rate <= max_bytes_per_s else None
            out.append(rate)
        return out[0], out[1]


# ------------------------------------------------------------------------------------ the sampler
class NvmlSampler:
    """Samples every GPU (or the ones in ``indices``) into GpuSample records.

    ``pcie_counters``: read the 32-bit PCIe byte counters (~320 us per GPU per sample). None (auto):
    only on GPUs without GPM, whose PCIe rates then come from the counters.
    ``clock``: monotonic seconds, for the GPM spacing (tests pass the replay's clock).
    """

    def __init__(
        self, nvml: Any = None, *, indices: list[int] | None = None, gpm: bool = True,
        pcie_counters: bool | None = None, clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.reason: str | None = None
        self.gpus: list[_Gpu] = []
        self.gpm: dict[int, Gpm] = {}
        self._clock = clock
        self._pcie_counters = pcie_counters
        self._previous: dict[int, CounterSnapshot] = {}
        self._last_rates: dict[tuple[int, str, int], float | None] = {}
        self._pcie: dict[int, PcieSteps] = {}  # GPUs whose PCIe rates come from the 32-bit counters
        self._owns_init = False
        self.nvml = nvml
        try:
            if self.nvml is None:
                self.nvml = load_nvml()
            self.nvml.nvmlInit()
            self._owns_init = True
            count = int(self.nvml.nvmlDeviceGetCount())
        except BaseException as exc:  # ImportError, NVMLError, OSError: all mean "no NVML here"
            if isinstance(exc, KeyboardInterrupt):
                raise
            self.reason = describe_init_error(exc)
            return
        if count == 0:
            self.reason = "NVML found no NVIDIA GPU"
            return
        for index in (indices if indices is not None else range(count)):
            try:
                gpu = _Gpu(self.nvml, index, clock=clock)
            except Exception as exc:
                self.reason = f"GPU {index} could not be opened through NVML ({exc})"
                continue
            self.gpus.append(gpu)
            if gpm and Gpm.supported(self.nvml, gpu.handle):
                try:
                    # Per-link GPM rates only matter where the per-link counters are missing.
                    self.gpm[index] = Gpm(
                        self.nvml, gpu.handle, links=[] if gpu.nvlink_counters else gpu.active_links, clock=clock,
                    )
                except Exception:
                    pass
            if pcie_counters is False or (pcie_counters is None and index in self.gpm):
                gpu.pcie_counters = False
        if self.gpus:
            self.reason = None

    def available(self) -> bool:
        return bool(self.gpus)

    @property
    def gpu_names(self) -> dict[int, str]:
        return {gpu.index: gpu.name for gpu in self.gpus}

    def gpu(self, index: int) -> _Gpu:
        for gpu in self.gpus:
            if gpu.index == index:
                return gpu
        raise KeyError(f"GPU {index} is not sampled")

    def read_counters(self, index: int, *, include_pcie: bool = True) -> CounterSnapshot:
        gpu = self.gpu(index)
        return gpu.read_counters(include_pcie=include_pcie)

    def sample(self) -> list[GpuSample]:
        ts = time.time()
        return [self._sample_gpu(gpu, ts) for gpu in self.gpus]

    def pcie_step_interval_s(self) -> float | None:
        """How often pcie_step() must run between samples to keep every PCIe counter unwrapped
        (half the shortest wrap-safe window among GPUs read by counters); None: no GPU needs it."""
        windows = [pcie_wrap_safe_s(g.pcie_generation, g.pcie_width) for g in self.gpus if g.pcie_counters]
        return min(windows) / 2 if windows else None

    def pcie_step(self) -> None:
        """Between samples: re-read the 32-bit PCIe counters of GPUs that are due (half a wrap-safe
        window since their last read), so that samples further apart than one wrap still get exact
        PCIe rates. One batched read (~300 us) per GPU when due, nothing otherwise."""
        now = self._clock()
        for gpu in self.gpus:
            steps = self._pcie.get(gpu.index)
            if gpu.pcie_counters and steps is not None and now - steps.read_at >= steps.safe_s / 2:
                steps.add(gpu.read_counters(include_nvlink=False))

    def _rate(self, key: tuple[int, str, int], prev: CounterValue | None, cur: CounterValue | None, **kw: Any) -> float | None:
        if prev is not None and cur is not None and cur.timestamp_us == prev.timestamp_us:
            # NVML did not refresh the counter since our last read: the last rate still stands.
            return self._last_rates.get(key)
        rate = counter_rate(prev, cur, **kw)
        self._last_rates[key] = rate
        return rate

    def _sample_gpu(self, gpu: _Gpu, ts: float) -> GpuSample:
        snap = gpu.read_counters()
        prev = self._previous.get(gpu.index)
        if prev is not None:
            # Keep the previous reading of a counter that was not refreshed, so the next interval spans both.
            for kind in ("nvlink_tx_kib", "nvlink_rx_kib"):
                now_d, old_d = getattr(snap, kind), getattr(prev, kind)
                for link, value in now_d.items():
                    if link in old_d and old_d[link].timestamp_us == value.timestamp_us:
                        now_d[link] = old_d[link]
        out = GpuSample(ts=ts, gpu=gpu.index, **gpu.gauges())

        if gpu.nvlink_counters:
            tx_total: float | None = 0.0
            rx_total: float | None = 0.0
            for link in gpu.links:
                tx = rx = None
                if prev is not None:
                    limit = MAX_NVLINK_LINK_BYTES_PER_S
                    tx = self._rate((gpu.index, "tx", link), prev.nvlink_tx_kib.get(link), snap.nvlink_tx_kib.get(link),
                                    unit_bytes=KIB, max_bytes_per_s=limit)
                    rx = self._rate((gpu.index, "rx", link), prev.nvlink_rx_kib.get(link), snap.nvlink_rx_kib.get(link),
                                    unit_bytes=KIB, max_bytes_per_s=limit)
                out.links.append(LinkSample(link=link, tx_bytes_per_s=tx, rx_bytes_per_s=rx))
                tx_total = tx_total + tx if tx_total is not None and tx is not None else None
                rx_total = rx_total + rx if rx_total is not None and rx is not None else None
            out.nvlink_tx_bytes_per_s = tx_total if prev is not None else None
            out.nvlink_rx_bytes_per_s = rx_total if prev is not None else None

        if gpu.pcie_counters:
            # 32-bit counters, unwrapped modulo 2^32 step by step: right only if at most one wrap
            # happened between two reads, i.e. reads within pcie_wrap_safe_s (~61 ms at Gen5 x16,
            # ~120 ms at Gen4). Samples further apart keep exact rates when pcie_step() reads in
            # between (the telemetry thread does); else the count is ambiguous and there is no
            # figure. (GPUs with GPM, which is all Gen5 ones, take GPM's rates instead.)
            steps = self._pcie.get(gpu.index)
            if steps is None:
                self._pcie[gpu.index] = PcieSteps(snap, pcie_wrap_safe_s(gpu.pcie_generation, gpu.pcie_width))
            else:
                steps.add(snap)
                out.pcie_tx_bytes_per_s, out.pcie_rx_bytes_per_s = steps.rates(MAX_PCIE_BYTES_PER_S)
                steps.restart()
        if prev is not None:
            # A reading missing this time (a failed call) keeps the last one, so the next rate spans both.
            for link, value in prev.nvlink_tx_kib.items():
                snap.nvlink_tx_kib.setdefault(link, value)
            for link, value in prev.nvlink_rx_kib.items():
                snap.nvlink_rx_kib.setdefault(link, value)
        self._previous[gpu.index] = snap

        gpm = self.gpm.get(gpu.index)
        if gpm is not None:
            values = gpm.sample()
            # GPM answers 0 B/s for NVLink on a GPU with no active link (seen on a one-GPU H200):
            # that is "not available", not "idle", so only GPUs with links take its NVLink figures.
            if not gpu.nvlink_counters and gpm.links:
                out.nvlink_tx_bytes_per_s = values.nvlink_tx_bytes_per_s
                out.nvlink_rx_bytes_per_s = values.nvlink_rx_bytes_per_s
                out.links = LinkRates(LinkSample(link, tx, rx) for link, (tx, rx) in sorted(values.links.items()))
            if values.pcie_tx_bytes_per_s is not None or values.pcie_rx_bytes_per_s is not None:
                out.pcie_tx_bytes_per_s = values.pcie_tx_bytes_per_s
                out.pcie_rx_bytes_per_s = values.pcie_rx_bytes_per_s
            if values.sm_util_pct is not None:
                # GPM's SM activity is the real SM utilisation; NVML's "gpu" figure is only the share of
                # time any kernel ran, which is the fallback.
                out.sm_util_pct = values.sm_util_pct
            out.dram_bw_util_pct = values.dram_bw_util_pct
            out.tensor_active_pct = values.tensor_active_pct
        return out

    def close(self) -> None:
        for gpm in self.gpm.values():
            gpm.close()
        self.gpm = {}
        if self._owns_init and self.nvml is not None:
            try:
                self.nvml.nvmlShutdown()
            except Exception:
                pass
            self._owns_init = False

    def __enter__(self) -> NvmlSampler:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


# ------------------------------------------------------------------------------------ topology, limits, processes
# What the Monitor shows besides the rates: which GPU each NVLink link reaches, what each figure is
# measured against, and who uses each GPU. Slow-changing, so read once (topology, limits) or about
# once a second (processes), never in the sampling loop. Each reader takes an NvmlSampler and asks
# through its GPUs' ``call`` (None when unsupported), so it works on the real NVML and the replay.

# NVML_NVLINK_VERSION_* (nvmlDeviceGetNvLinkVersion) -> NVLink generation
NVLINK_VERSION_TO_GENERATION = {1: 1, 2: 2, 3: 2, 4: 3, 5: 3, 6: 4, 7: 5, 8: 6}
# Data bytes per second one link carries in one direction, by NVLink generation (datasheets:
# P100 20 GB/s; V100, A100, H100/H200 25 GB/s; B200 50 GB/s; generation 6 100 GB/s).
NVLINK_LINK_BYTES_PER_S = {1: 20e9, 2: 25e9, 3: 25e9, 4: 25e9, 5: 50e9, 6: 100e9}
NVLINK_REMOTE_KINDS = {0: "gpu", 1: "cpu", 2: "switch"}  # NVML_NVLINK_DEVICE_TYPE_*: GPU, IBMNPU, SWITCH
TEMPERATURE_THRESHOLD_SLOWDOWN = 1


def parse_bus_id(value: Any) -> tuple[int, int, int, int] | None:
    """'00000000:18:00.0' (or bytes, or a 4-digit domain) -> (domain, bus, device, function)."""
    if value is None:
        return None
    text = value.decode(errors="replace") if isinstance(value, bytes) else str(value)
    text = text.strip().strip("\x00").lower()
    try:
        head, function = text.rsplit(".", 1)
        parts = head.split(":")
        domain = int(parts[-3], 16) if len(parts) >= 3 else 0
        return domain, int(parts[-2], 16), int(parts[-1], 16), int(function, 16)
    except (ValueError, IndexError):
        return None


@dataclass(frozen=True)
class NvLinkLink:
    """One active NVLink link and what it reaches (remote_gpu None: a switch, a CPU or unknown)."""

    gpu: int
    link: int
    remote_kind: str  # gpu, switch, cpu or unknown
    remote_gpu: int | None
    generation: int | None


@dataclass
class NvLinkTopology:
    """The NVLink links of the sampled GPUs; ``reason`` says why there are none."""

    gpus: list[int]
    links: list[NvLinkLink] = field(default_factory=list)
    reason: str | None = None
    _by_gpu: dict[int, list[NvLinkLink]] | None = field(default=None, repr=False, compare=False)

    def links_of(self, gpu: int) -> list[NvLinkLink]:
        # Asked several times per GPU per frame by the Monitor: grouped once (links are set at read).
        if self._by_gpu is None or sum(len(v) for v in self._by_gpu.values()) != len(self.links):
            self._by_gpu = {}
            for ln in self.links:
                self._by_gpu.setdefault(ln.gpu, []).append(ln)
        return self._by_gpu.get(gpu, [])

    def direct_links(self, a: int, b: int) -> int:
        """Links from GPU a that reach GPU b directly."""
        return sum(1 for ln in self.links if ln.gpu == a and ln.remote_gpu == b)

    def switch_links(self, gpu: int) -> int:
        return sum(1 for ln in self.links if ln.gpu == gpu and ln.remote_kind == "switch")

    def pair_label(self, a: int, b: int) -> str:
        """nvidia-smi topo style: X (itself), NV<n> (n direct links), SW<n> (through NVSwitch, n
        links on the fewer side), - (no NVLink path)."""
        if a == b:
            return "X"
        direct = self.direct_links(a, b)
        if direct:
            return f"NV{direct}"
        switched = min(self.switch_links(a), self.switch_links(b))
        return f"SW{switched}" if switched else "-"

    def generation(self, gpu: int) -> int | None:
        gens = [ln.generation for ln in self.links_of(gpu) if ln.generation is not None]
        return max(gens) if gens else None

    def link_bytes_per_s(self, gpu: int) -> float | None:
        """One link's data rate in one direction on this GPU; None: generation unknown."""
        gen = self.generation(gpu)
        return NVLINK_LINK_BYTES_PER_S.get(gen) if gen is not None else None

    def gpu_bytes_per_s(self, gpu: int) -> float | None:
        """The GPU's NVLink limit in one direction: its active links x one link's rate."""
        per_link = self.link_bytes_per_s(gpu)
        count = len(self.links_of(gpu))
        return per_link * count if per_link is not None and count else None


def read_topology(sampler: NvmlSampler) -> NvLinkTopology:
    """Which GPU each active link reaches (remote PCI bus id against the GPUs' own), its remote
    device type and NVLink version."""
    topology = NvLinkTopology(gpus=[g.index for g in sampler.gpus])
    by_bus: dict[tuple[int, int, int, int], int] = {}
    for gpu in sampler.gpus:
        info = gpu.call("nvmlDeviceGetPciInfo_v3") or gpu.call("nvmlDeviceGetPciInfo")
        bus = parse_bus_id(getattr(info, "busId", None)) if info is not None else None
        if bus is not None:
            by_bus[bus] = gpu.index
    for gpu in sampler.gpus:
        for link in gpu.active_links:
            remote = gpu.call("nvmlDeviceGetNvLinkRemotePciInfo", link)
            remote_bus = parse_bus_id(getattr(remote, "busId", None)) if remote is not None else None
            remote_gpu = by_bus.get(remote_bus) if remote_bus is not None else None
            kind_code = gpu.call("nvmlDeviceGetNvLinkRemoteDeviceType", link)
            kind = NVLINK_REMOTE_KINDS.get(int(kind_code), "unknown") if kind_code is not None else None
            if kind is None:
                kind = "gpu" if remote_gpu is not None else "unknown"
            version = gpu.call("nvmlDeviceGetNvLinkVersion", link)
            generation = NVLINK_VERSION_TO_GENERATION.get(int(version)) if version is not None else None
            topology.links.append(NvLinkLink(gpu.index, link, kind, remote_gpu if kind == "gpu" else None, generation))
    if not topology.links:
        topology.reason = ("no active NVLink link on any sampled GPU (NVML answers NOT_SUPPORTED or link down)"
                           if sampler.gpus else (sampler.reason or "no NVIDIA GPU"))
    return topology


@dataclass(frozen=True)
class GpuLimits:
    """What a GPU's figures are measured against; None where NVML does not say."""

    gpu: int
    name: str
    memory_total_bytes: float | None = None
    power_limit_w: float | None = None
    sm_clock_max_mhz: float | None = None
    mem_clock_max_mhz: float | None = None
    temperature_slowdown_c: float | None = None
    pcie_generation: int | None = None
    pcie_width: int | None = None

    @property
    def pcie_bytes_per_s(self) -> float | None:
        """PCIe payload rate in one direction at the link's maximum generation and width."""
        if self.pcie_generation is None or self.pcie_width is None:
            return None
        lane = _PCIE_LANE_BYTES_PER_S.get(self.pcie_generation)
        return lane * self.pcie_width if lane is not None else None


def read_limits(sampler: NvmlSampler) -> dict[int, GpuLimits]:
    out: dict[int, GpuLimits] = {}
    for gpu in sampler.gpus:
        memory = gpu.call("nvmlDeviceGetMemoryInfo")
        total = getattr(memory, "total", None) if memory is not None else None
        power_mw = gpu.call("nvmlDeviceGetEnforcedPowerLimit") or gpu.call("nvmlDeviceGetPowerManagementLimit")
        sm_max = gpu.call("nvmlDeviceGetMaxClockInfo", CLOCK_SM)
        mem_max = gpu.call("nvmlDeviceGetMaxClockInfo", CLOCK_MEM)
        slowdown = gpu.call("nvmlDeviceGetTemperatureThreshold", TEMPERATURE_THRESHOLD_SLOWDOWN)
        out[gpu.index] = GpuLimits(
            gpu=gpu.index, name=gpu.name, memory_total_bytes=float(total) if total is not None else None,
            power_limit_w=power_mw / 1000.0 if power_mw else None,
            sm_clock_max_mhz=float(sm_max) if sm_max else None, mem_clock_max_mhz=float(mem_max) if mem_max else None,
            temperature_slowdown_c=float(slowdown) if slowdown else None,
            pcie_generation=gpu.pcie_generation, pcie_width=gpu.pcie_width,
        )
    return out


@dataclass(frozen=True)
class GpuProcess:
    """A process holding a CUDA context on a GPU. user/command None: the process is not visible
    from here (another container, gone since)."""

    gpu: int
    pid: int
    used_memory_bytes: float | None
    user: str | None = None
    command: str | None = None


def describe_pid(pid: int) -> tuple[str | None, str | None]:
    """(user, command line) of a local process, or (None, None)."""
    try:
        import psutil

        process = psutil.Process(pid)
        with process.oneshot():
            user = process.username()
            cmdline = process.cmdline()
            command = " ".join(cmdline) if cmdline else process.name()
        return user, command
    except Exception:  # gone, not ours to read, another pid namespace
        return None, None


def read_processes(
    sampler: NvmlSampler, describe: Callable[[int], tuple[str | None, str | None]] | None = None,
) -> list[GpuProcess] | None:
    """Compute processes on every sampled GPU (pid, GPU memory), named through /proc; None when no
    GPU answers the query. A replayed NVML names its own (its pids are not this machine's): it
    offers describe_process."""
    describe = describe or getattr(sampler.nvml, "describe_process", None) or describe_pid
    out: list[GpuProcess] = []
    answered = False
    for gpu in sampler.gpus:
        entries = gpu.call("nvmlDeviceGetComputeRunningProcesses")
        answered = answered or entries is not None
        for entry in entries or []:
            pid = int(entry.pid)
            used = getattr(entry, "usedGpuMemory", None)
            user, command = describe(pid)
            out.append(GpuProcess(gpu.index, pid, float(used) if used is not None else None, user, command))
    return out if answered else None


# Which sampled figure each NVML call gives, to name what is n/a and why.
_CALL_FIGURES = {
    "nvmlDeviceGetUtilizationRates()": "SM and memory utilisation",
    "nvmlDeviceGetMemoryInfo()": "memory used",
    "nvmlDeviceGetPowerUsage()": "power",
    f"nvmlDeviceGetClockInfo({CLOCK_SM},)": "SM clock",
    f"nvmlDeviceGetClockInfo({CLOCK_MEM},)": "memory clock",
    f"nvmlDeviceGetTemperature({TEMPERATURE_GPU},)": "temperature",
}


def unsupported_figures(sampler: NvmlSampler) -> dict[int, dict[str, str]]:
    """Per GPU: figure -> why it is n/a (asked once; NVML's answer does not change)."""
    out: dict[int, dict[str, str]] = {}
    for gpu in sampler.gpus:
        reasons: dict[str, str] = {}
        for key, figure in _CALL_FIGURES.items():
            if key in gpu.unsupported:
                reasons[figure] = "NVML answers NOT_SUPPORTED"
        if not gpu.active_links:
            reasons["NVLink"] = "no active link (NVML: NOT_SUPPORTED, or links down)"
        elif not gpu.nvlink_counters and gpu.index not in sampler.gpm:
            reasons["NVLink"] = "the link counters answer NOT_SUPPORTED and there is no GPM"
        if not gpu.pcie_counters and gpu.index not in sampler.gpm:
            reasons["PCIe"] = "the PCIe byte counters answer NOT_SUPPORTED and there is no GPM"
        if gpu.index not in sampler.gpm:
            reasons["DRAM bandwidth and tensor activity"] = "GPM metrics need Hopper or newer (MBW shows NVML's memory activity)"
        if reasons:
            out[gpu.index] = reasons
    return out
