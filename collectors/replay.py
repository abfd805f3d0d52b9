"""A module-like NVML that replays a counter trace, and the recorder that makes such traces.

``ReplayNvml(trace)`` answers the calls NvmlSampler and PhaseCounters make, from a JSON-able trace
(one list of ticks per GPU); ``step()`` moves every GPU to its next tick. It behaves like NVML where
it matters to the maths: NVLink fields 138/139 answer per link by ``scopeId`` (a bare field id is
scope 0: link 0 only), scope 0xFFFFFFFF sums the links, unsupported fields come back with
NOT_SUPPORTED in their entry, unsupported calls raise NVMLError(NOT_SUPPORTED), and GPM metrics are
those recorded at the tick of the later of the two GPM samples.

``record_trace()`` reads a real NVML (on a GPU box) into the same format, so a fixture can be a
recording instead of a hand-made sequence.

Trace format::

    {"description": str, "source": str,
     "devices": [{"name": str,
                  "nvlink_link_count": int | null,       # field 91; null: NOT_SUPPORTED
                  "nvlink_active": [int] | null,          # links whose nvmlDeviceGetNvLinkState is 1;
                                                          # null: the call is NOT_SUPPORTED
                  "gpm_supported": bool,
                  "pcie_max_generation": int | null, "pcie_max_width": int | null,
                  "unsupported_fields": [int],            # field ids answering NOT_SUPPORTED
                  "unsupported_calls": [str],             # nvml functions raising NOT_SUPPORTED
                  # optional constants (absent or null: the call answers NOT_SUPPORTED):
                  "pci_bus_id": str, "memory_total_bytes": int, "power_limit_mw": int,
                  "max_sm_clock_mhz": int, "max_mem_clock_mhz": int, "temperature_slowdown_c": int,
                  "nvlink_remote": {"link": "bus id"},    # nvmlDeviceGetNvLinkRemotePciInfo per active link
                  "nvlink_remote_type": {"link": "gpu" | "switch" | "cpu"}, "nvlink_version": int,
                  "processes": [{"pid": int, "used_memory_bytes": int, "user": str, "command": str}],
                  "ticks": [{"t_us": int,                 # NVML timestamp of this tick
                             "fields": {"138:0": int, ...},  # "field:scope" -> cumulative value
                             "field_t_us": {"138:0": int},   # optional per-field timestamp
                             "util": [gpu_pct, mem_pct], "memory_used_bytes": int, "power_mw": int,
                             "sm_clock_mhz": int, "mem_clock_mhz": int, "temperature_c": int,
                             "gpm": {"61": float, ...}}]}]}  # metric id -> value (MiB/s, %)
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from collectors import nvml as N

NVML_SUCCESS = N.NVML_SUCCESS
NVML_ERROR_NOT_SUPPORTED = N.NVML_ERROR_NOT_SUPPORTED
NVML_GPM_METRICS_GET_VERSION = N.GPM_METRICS_GET_VERSION
NVML_NVLINK_MAX_LINKS = N.NVLINK_MAX_LINKS
_VALUE_TYPE_UINT = 1
_VALUE_TYPE_ULL = 3
_GPM_SLOTS = 512


class NVMLError(Exception):
    def __init__(self, value: int) -> None:
        super().__init__(f"NVML error {value}")
        self.value = value


class c_nvmlGpmMetricsGet_t:  # noqa: N801 - mirrors pynvml's name
    def __init__(self) -> None:
        self.version = 0
        self.numMetrics = 0
        self.sample1: Any = None
        self.sample2: Any = None
        self.metrics = [SimpleNamespace(metricId=0, nvmlReturn=0, value=0.0) for _ in range(_GPM_SLOTS)]


class ReplayHandle:
    """A device handle. Like the real library's (a ctypes pointer), it cannot be a dict key or a set
    member, so code that keys anything by handle fails here as it would on a GPU box."""

    __slots__ = ("index",)
    __hash__ = None  # type: ignore[assignment]

    def __init__(self, index: int) -> None:
        self.index = index

    def __eq__(self, other: object) -> bool:
        return isinstance(other, ReplayHandle) and other.index == self.index

    def __repr__(self) -> str:
        return f"ReplayHandle({self.index})"


class ReplayNvml:
    """Module-like NVML replaying ``trace`` (a dict in the format above)."""

    NVMLError = NVMLError
    c_nvmlGpmMetricsGet_t = c_nvmlGpmMetricsGet_t
    NVML_SUCCESS = NVML_SUCCESS
    NVML_NVLINK_MAX_LINKS = NVML_NVLINK_MAX_LINKS

    def __init__(self, trace: dict[str, Any]) -> None:
        self.trace = trace
        self.devices = trace["devices"]
        self.cursor = 0
        self.initialized = 0
        self.calls: dict[str, int] = {}  # function name -> calls, so tests can see what was asked
        self.field_requests: list[list[tuple[int, int]]] = []

    @classmethod
    def from_file(cls, path: str | Path) -> ReplayNvml:
        return cls(json.loads(Path(path).read_text()))

    # -- replay control
    @property
    def ticks(self) -> int:
        return min(len(d["ticks"]) for d in self.devices)

    def step(self, n: int = 1) -> None:
        self.cursor = min(self.cursor + n, self.ticks - 1)

    def clock(self) -> float:
        """Monotonic seconds of the current tick: device 0's NVML timestamp since its first tick."""
        ticks = self.devices[0]["ticks"]
        return (ticks[self.cursor]["t_us"] - ticks[0]["t_us"]) / 1e6

    def _tick(self, handle: ReplayHandle) -> dict[str, Any]:
        return self.devices[handle.index]["ticks"][self.cursor]

    def _count(self, name: str) -> None:
        self.calls[name] = self.calls.get(name, 0) + 1

    def _check(self, handle: ReplayHandle, name: str) -> dict[str, Any]:
        self._count(name)
        if not self.initialized:
            raise NVMLError(1)  # UNINITIALIZED
        device = self.devices[handle.index]
        if name in device.get("unsupported_calls", ()):
            raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
        return device

    # -- library
    def nvmlInit(self) -> None:
        self.initialized += 1

    def nvmlShutdown(self) -> None:
        self.initialized = max(0, self.initialized - 1)

    def nvmlDeviceGetCount(self) -> int:
        return len(self.devices)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> ReplayHandle:
        if not 0 <= index < len(self.devices):
            raise NVMLError(2)
        return ReplayHandle(index)

    def nvmlDeviceGetHandleByUUID(self, uuid: str | bytes) -> ReplayHandle:
        uuid = uuid.decode() if isinstance(uuid, bytes) else uuid
        for index, device in enumerate(self.devices):
            if device.get("uuid") == uuid:
                return ReplayHandle(index)
        raise NVMLError(6)  # NOT_FOUND

    def nvmlDeviceGetIndex(self, handle: ReplayHandle) -> int:
        return handle.index

    def nvmlDeviceGetName(self, handle: ReplayHandle) -> str:
        return self._check(handle, "nvmlDeviceGetName")["name"]

    def nvmlDeviceGetUUID(self, handle: ReplayHandle) -> str:
        return self._check(handle, "nvmlDeviceGetUUID").get("uuid", f"GPU-replay-{handle.index}")

    # -- fields
    def nvmlDeviceGetFieldValues(self, handle: ReplayHandle, requests: list[Any]) -> list[SimpleNamespace]:
        device = self._check(handle, "nvmlDeviceGetFieldValues")
        tick = self._tick(handle)
        parsed = [(r[0], r[1]) if isinstance(r, (tuple, list)) else (r, 0) for r in requests]
        self.field_requests.append(parsed)
        out = []
        for field_id, scope in parsed:
            entry = SimpleNamespace(
                fieldId=field_id, scopeId=scope, timestamp=tick["t_us"], latencyUsec=0,
                valueType=_VALUE_TYPE_ULL, nvmlReturn=NVML_SUCCESS, value=SimpleNamespace(ullVal=0, uiVal=0),
            )
            value = self._field(device, tick, field_id, scope, entry)
            if value is None:
                entry.nvmlReturn = NVML_ERROR_NOT_SUPPORTED
            elif entry.valueType == _VALUE_TYPE_UINT:
                entry.value.uiVal = value
            else:
                entry.value.ullVal = value
            out.append(entry)
        return out

    def _field(self, device: dict, tick: dict, field_id: int, scope: int, entry: SimpleNamespace) -> int | None:
        if field_id in device.get("unsupported_fields", ()):
            return None
        if field_id == N.FI_NVLINK_LINK_COUNT:
            entry.valueType = _VALUE_TYPE_UINT
            return device.get("nvlink_link_count")
        if field_id in (N.FI_PCIE_TX_BYTES, N.FI_PCIE_RX_BYTES):
            entry.valueType = _VALUE_TYPE_UINT
            value = tick["fields"].get(f"{field_id}:0")
            return None if value is None else int(value) % N.PCIE_COUNTER_MODULUS
        fields = tick["fields"]
        if scope == N.SCOPE_ALL_LINKS:
            parts = [v for k, v in fields.items() if k.startswith(f"{field_id}:")]
            return sum(parts) if parts else None
        key = f"{field_id}:{scope}"
        if key in tick.get("field_t_us", {}):
            entry.timestamp = tick["field_t_us"][key]
        return fields.get(key)

    # -- NVLink state, PCIe link
    def nvmlDeviceGetNvLinkState(self, handle: ReplayHandle, link: int) -> int:
        device = self._check(handle, "nvmlDeviceGetNvLinkState")
        active = device.get("nvlink_active")
        if active is None:
            raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
        count = device.get("nvlink_link_count") or max(active, default=-1) + 1
        if link >= count:
            raise NVMLError(2)  # INVALID_ARGUMENT, as NVML answers for a link the GPU lacks
        return 1 if link in active else 0

    def nvmlDeviceGetMaxPcieLinkGeneration(self, handle: ReplayHandle) -> int:
        value = self._check(handle, "nvmlDeviceGetMaxPcieLinkGeneration").get("pcie_max_generation")
        if value is None:
            raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
        return value

    def nvmlDeviceGetMaxPcieLinkWidth(self, handle: ReplayHandle) -> int:
        value = self._check(handle, "nvmlDeviceGetMaxPcieLinkWidth").get("pcie_max_width")
        if value is None:
            raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
        return value

    # -- gauges
    def _gauge(self, handle: ReplayHandle, name: str, key: str) -> Any:
        self._check(handle, name)
        value = self._tick(handle).get(key)
        if value is None:
            raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
        return value

    def nvmlDeviceGetUtilizationRates(self, handle: ReplayHandle) -> SimpleNamespace:
        gpu, memory = self._gauge(handle, "nvmlDeviceGetUtilizationRates", "util")
        return SimpleNamespace(gpu=gpu, memory=memory)

    def nvmlDeviceGetMemoryInfo(self, handle: ReplayHandle) -> SimpleNamespace:
        used = self._gauge(handle, "nvmlDeviceGetMemoryInfo", "memory_used_bytes")
        total = self.devices[handle.index].get("memory_total_bytes")  # not recorded: unknown, not a guess
        return SimpleNamespace(used=used, total=total, free=total - used if total is not None else None)

    def nvmlDeviceGetPowerUsage(self, handle: ReplayHandle) -> int:
        return self._gauge(handle, "nvmlDeviceGetPowerUsage", "power_mw")

    def nvmlDeviceGetClockInfo(self, handle: ReplayHandle, clock: int) -> int:
        key = {N.CLOCK_SM: "sm_clock_mhz", N.CLOCK_MEM: "mem_clock_mhz"}.get(clock)
        if key is None:
            raise NVMLError(2)
        return self._gauge(handle, "nvmlDeviceGetClockInfo", key)

    def nvmlDeviceGetTemperature(self, handle: ReplayHandle, sensor: int) -> int:
        return self._gauge(handle, "nvmlDeviceGetTemperature", "temperature_c")

    def nvmlDeviceGetPcieThroughput(self, handle: ReplayHandle, counter: int) -> int:
        self._count("nvmlDeviceGetPcieThroughput")
        time.sleep(0.02)  # the real one samples for ~20 ms: a sampler calling it is a bug
        raise NVMLError(NVML_ERROR_NOT_SUPPORTED)

    # -- topology, limits, processes (constant over the trace)
    def _constant(self, handle: ReplayHandle, name: str, key: str) -> Any:
        value = self._check(handle, name).get(key)
        if value is None:
            raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
        return value

    def nvmlDeviceGetPciInfo_v3(self, handle: ReplayHandle) -> SimpleNamespace:
        return SimpleNamespace(busId=self._constant(handle, "nvmlDeviceGetPciInfo_v3", "pci_bus_id"))

    def nvmlDeviceGetPciInfo(self, handle: ReplayHandle) -> SimpleNamespace:
        return SimpleNamespace(busId=self._constant(handle, "nvmlDeviceGetPciInfo", "pci_bus_id"))

    def _link_constant(self, handle: ReplayHandle, name: str, key: str, link: int) -> Any:
        table = self._check(handle, name).get(key)
        value = table.get(str(link)) if isinstance(table, dict) else None
        if value is None:
            raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
        return value

    def nvmlDeviceGetNvLinkRemotePciInfo(self, handle: ReplayHandle, link: int) -> SimpleNamespace:
        return SimpleNamespace(busId=self._link_constant(handle, "nvmlDeviceGetNvLinkRemotePciInfo", "nvlink_remote", link))

    def nvmlDeviceGetNvLinkRemoteDeviceType(self, handle: ReplayHandle, link: int) -> int:
        kind = self._link_constant(handle, "nvmlDeviceGetNvLinkRemoteDeviceType", "nvlink_remote_type", link)
        return {"gpu": 0, "cpu": 1, "switch": 2}.get(kind, 255)

    def nvmlDeviceGetNvLinkVersion(self, handle: ReplayHandle, link: int) -> int:
        self._link_constant(handle, "nvmlDeviceGetNvLinkVersion", "nvlink_remote", link)  # only active links answer
        return self._constant(handle, "nvmlDeviceGetNvLinkVersion", "nvlink_version")

    def nvmlDeviceGetEnforcedPowerLimit(self, handle: ReplayHandle) -> int:
        return self._constant(handle, "nvmlDeviceGetEnforcedPowerLimit", "power_limit_mw")

    def nvmlDeviceGetPowerManagementLimit(self, handle: ReplayHandle) -> int:
        return self._constant(handle, "nvmlDeviceGetPowerManagementLimit", "power_limit_mw")

    def nvmlDeviceGetMaxClockInfo(self, handle: ReplayHandle, clock: int) -> int:
        key = {N.CLOCK_SM: "max_sm_clock_mhz", N.CLOCK_MEM: "max_mem_clock_mhz"}.get(clock)
        if key is None:
            raise NVMLError(2)
        return self._constant(handle, "nvmlDeviceGetMaxClockInfo", key)

    def nvmlDeviceGetTemperatureThreshold(self, handle: ReplayHandle, threshold: int) -> int:
        return self._constant(handle, "nvmlDeviceGetTemperatureThreshold", "temperature_slowdown_c")

    def nvmlDeviceGetComputeRunningProcesses(self, handle: ReplayHandle) -> list[SimpleNamespace]:
        processes = self._constant(handle, "nvmlDeviceGetComputeRunningProcesses", "processes")
        return [SimpleNamespace(pid=p["pid"], usedGpuMemory=p.get("used_memory_bytes")) for p in processes]

    def describe_process(self, pid: int) -> tuple[str | None, str | None]:
        """(user, command) of a recorded process: a replay's pids are not this machine's."""
        for device in self.devices:
            for process in device.get("processes") or ():
                if process["pid"] == pid:
                    return process.get("user"), process.get("command")
        return None, None

    # -- GPM
    def nvmlGpmQueryDeviceSupport(self, handle: ReplayHandle) -> SimpleNamespace:
        device = self._check(handle, "nvmlGpmQueryDeviceSupport")
        return SimpleNamespace(version=1, isSupportedDevice=int(bool(device.get("gpm_supported"))))

    def nvmlGpmSampleAlloc(self) -> SimpleNamespace:
        self._count("nvmlGpmSampleAlloc")
        return SimpleNamespace(device=None, tick=None, freed=False)

    def nvmlGpmSampleFree(self, sample: SimpleNamespace) -> None:
        self._count("nvmlGpmSampleFree")
        sample.freed = True

    def nvmlGpmSampleGet(self, handle: ReplayHandle, sample: SimpleNamespace) -> SimpleNamespace:
        device = self._check(handle, "nvmlGpmSampleGet")
        if not device.get("gpm_supported"):
            raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
        sample.device, sample.tick = handle.index, self.cursor
        return sample

    def nvmlGpmMetricsGet(self, request: Any) -> Any:  # a c_nvmlGpmMetricsGet_t
        self._count("nvmlGpmMetricsGet")
        first, second = request.sample1, request.sample2
        if first is None or second is None or first.tick is None or second.tick is None or first.device != second.device:
            raise NVMLError(2)
        recorded = self.devices[second.device]["ticks"][second.tick].get("gpm", {})
        for slot in request.metrics[: request.numMetrics]:
            value = recorded.get(str(slot.metricId))
            if value is None:
                slot.nvmlReturn, slot.value = NVML_ERROR_NOT_SUPPORTED, 0.0
            else:
                slot.nvmlReturn, slot.value = NVML_SUCCESS, float(value)
        return request


# ------------------------------------------------------------------------------------ recorder
def record_trace(nvml: Any = None, *, ticks: int = 20, interval_s: float = 0.1, source: str = "") -> dict[str, Any]:
    """Read a real NVML for ``ticks`` intervals into the replay format (GPU box only)."""
    import socket

    nvml = nvml or N.load_nvml()
    nvml.nvmlInit()
    try:
        devices = []
        for index in range(nvml.nvmlDeviceGetCount()):
            handle = nvml.nvmlDeviceGetHandleByIndex(index)
            unsupported: set[str] = set()  # this GPU's queries that answered NOT_SUPPORTED (the gateway's)
            device: dict[str, Any] = {
                "name": _text_or_none(N.nvml_call(nvml, unsupported, "nvmlDeviceGetName", handle=handle)),
                "uuid": _text_or_none(N.nvml_call(nvml, unsupported, "nvmlDeviceGetUUID", handle=handle)),
                "pcie_max_generation": N.nvml_call(nvml, unsupported, "nvmlDeviceGetMaxPcieLinkGeneration", handle=handle),
                "pcie_max_width": N.nvml_call(nvml, unsupported, "nvmlDeviceGetMaxPcieLinkWidth", handle=handle),
                "unsupported_fields": [], "unsupported_calls": [], "ticks": [],
            }
            entry = nvml.nvmlDeviceGetFieldValues(handle, [(N.FI_NVLINK_LINK_COUNT, 0)])[0]
            device["nvlink_link_count"] = int(entry.value.uiVal) if int(entry.nvmlReturn) == 0 else None
            active, answered = [], False
            for link in range(device["nvlink_link_count"] or getattr(nvml, "NVML_NVLINK_MAX_LINKS", 18)):
                try:
                    state = nvml.nvmlDeviceGetNvLinkState(handle, link)
                except Exception:
                    continue
                answered = True
                if state == 1:
                    active.append(link)
            device["nvlink_active"] = active if answered else None
            device["gpm_supported"] = N.Gpm.supported(nvml, handle)
            device.update(_record_constants(nvml, handle, active))
            devices.append((handle, device))
        # Keyed by position: real NVML handles (ctypes pointers) cannot be dict keys.
        gpms: dict[int, N.Gpm] = {}
        for position, (handle, device) in enumerate(devices):
            if device["gpm_supported"]:
                gpms[position] = N.Gpm(nvml, handle, links=device["nvlink_active"] or [], clock=time.monotonic)
        links_of = [d["nvlink_active"] or list(range(d["nvlink_link_count"] or 0)) for _, d in devices]
        for _ in range(ticks):
            time.sleep(interval_s)
            for position, (handle, device) in enumerate(devices):
                requests = [(f, link) for link in links_of[position] for f in (N.FI_NVLINK_DATA_TX_KIB, N.FI_NVLINK_DATA_RX_KIB)]
                requests += [(N.FI_PCIE_TX_BYTES, 0), (N.FI_PCIE_RX_BYTES, 0)]
                tick: dict[str, Any] = {"t_us": None, "fields": {}}
                for (field_id, scope), entry in zip(requests, nvml.nvmlDeviceGetFieldValues(handle, requests), strict=False):
                    if int(entry.nvmlReturn) != 0:
                        if field_id not in device["unsupported_fields"]:
                            device["unsupported_fields"].append(field_id)
                        continue
                    value = N._field_value(entry)
                    if value is None:  # a value type we do not read: as good as unsupported
                        continue
                    tick["fields"][f"{field_id}:{scope}"] = int(value)
                    tick["t_us"] = tick["t_us"] or int(entry.timestamp)
                tick["t_us"] = tick["t_us"] or int(time.monotonic() * 1e6)
                util = N.nvml_call(nvml, unsupported, "nvmlDeviceGetUtilizationRates", handle=handle)
                tick["util"] = [util.gpu, util.memory] if util is not None else None
                memory = N.nvml_call(nvml, unsupported, "nvmlDeviceGetMemoryInfo", handle=handle)
                tick["memory_used_bytes"] = memory.used if memory is not None else None
                tick["power_mw"] = N.nvml_call(nvml, unsupported, "nvmlDeviceGetPowerUsage", handle=handle)
                tick["sm_clock_mhz"] = N.nvml_call(nvml, unsupported, "nvmlDeviceGetClockInfo", N.CLOCK_SM, handle=handle)
                tick["mem_clock_mhz"] = N.nvml_call(nvml, unsupported, "nvmlDeviceGetClockInfo", N.CLOCK_MEM, handle=handle)
                tick["temperature_c"] = N.nvml_call(nvml, unsupported, "nvmlDeviceGetTemperature", N.TEMPERATURE_GPU, handle=handle)
                if position in gpms:
                    values = gpms[position].sample(force=True)
                    tick["gpm"] = _gpm_as_recorded(values)
                device["ticks"].append(tick)
        for gpm in gpms.values():
            gpm.close()
        return {
            "description": f"recorded with collectors.replay.record_trace, {ticks} ticks of {interval_s} s",
            "source": source or f"recorded on {socket.gethostname()}",
            "devices": [d for _, d in devices],
        }
    finally:
        nvml.nvmlShutdown()


def _record_constants(nvml: Any, handle: Any, active: list[int]) -> dict[str, Any]:
    """Topology, limits and processes of one GPU, in the trace's keys (None: not supported)."""
    pci = _try(lambda: nvml.nvmlDeviceGetPciInfo_v3(handle))
    memory = _try(lambda: nvml.nvmlDeviceGetMemoryInfo(handle))
    remote: dict[str, str] = {}
    kinds: dict[str, str] = {}
    version = None
    for link in active:
        info = _try(lambda link=link: nvml.nvmlDeviceGetNvLinkRemotePciInfo(handle, link))
        if info is not None:
            remote[str(link)] = _text(info.busId)
        kind = _try(lambda link=link: nvml.nvmlDeviceGetNvLinkRemoteDeviceType(handle, link))
        if kind is not None:
            kinds[str(link)] = N.NVLINK_REMOTE_KINDS.get(int(kind), "unknown")
        version = version or _try(lambda link=link: nvml.nvmlDeviceGetNvLinkVersion(handle, link))
    processes = []
    for entry in _try(lambda: nvml.nvmlDeviceGetComputeRunningProcesses(handle)) or []:
        user, command = N.describe_pid(int(entry.pid))
        processes.append({"pid": int(entry.pid), "used_memory_bytes": getattr(entry, "usedGpuMemory", None),
                          "user": user, "command": command})
    return {
        "pci_bus_id": _text(pci.busId) if pci is not None else None,
        "memory_total_bytes": memory.total if memory is not None else None,
        "nvlink_remote": remote or None, "nvlink_remote_type": kinds or None, "nvlink_version": version,
        "power_limit_mw": _try(lambda: nvml.nvmlDeviceGetEnforcedPowerLimit(handle)),
        "max_sm_clock_mhz": _try(lambda: nvml.nvmlDeviceGetMaxClockInfo(handle, N.CLOCK_SM)),
        "max_mem_clock_mhz": _try(lambda: nvml.nvmlDeviceGetMaxClockInfo(handle, N.CLOCK_MEM)),
        "temperature_slowdown_c": _try(lambda: nvml.nvmlDeviceGetTemperatureThreshold(handle, N.TEMPERATURE_THRESHOLD_SLOWDOWN)),
        "processes": processes,
    }


def _gpm_as_recorded(values: N.GpmValues) -> dict[str, float]:
    out: dict[str, float] = {}
    per_mib = {
        N.GPM_NVLINK_TOTAL_TX_PER_SEC: values.nvlink_tx_bytes_per_s, N.GPM_NVLINK_TOTAL_RX_PER_SEC: values.nvlink_rx_bytes_per_s,
        N.GPM_PCIE_TX_PER_SEC: values.pcie_tx_bytes_per_s, N.GPM_PCIE_RX_PER_SEC: values.pcie_rx_bytes_per_s,
    }
    for metric, value in per_mib.items():
        if value is not None:
            out[str(metric)] = value / N.MIB
    for metric, value in ((N.GPM_SM_UTIL, values.sm_util_pct), (N.GPM_DRAM_BW_UTIL, values.dram_bw_util_pct),
                          (N.GPM_ANY_TENSOR_UTIL, values.tensor_active_pct)):
        if value is not None:
            out[str(metric)] = value
    for link, (tx, rx) in values.links.items():
        rx_id, tx_id = N.gpm_nvlink_link_metric_ids(link)
        if tx is not None:
            out[str(tx_id)] = tx / N.MIB
        if rx is not None:
            out[str(rx_id)] = rx / N.MIB
    return out


def _text_or_none(value: Any) -> str | None:
    return None if value is None else _text(value)


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _try(fn: Any) -> Any:
    """An NVML query's answer, or None where this GPU (or the library) has none."""
    try:
        return fn()
    except Exception:  # noqa: BLE001 - NVMLError of any kind, or a call the binding lacks
        return None
