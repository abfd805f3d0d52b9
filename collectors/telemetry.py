"""Telemetry: one sampling thread feeding a ring buffer (live readers) and, optionally, the database.

Picks the NVML sampler where NVML answers and sees GPUs, else the host sampler with a plain reason.
The thread samples, then sleeps until the next tick; a sample that overruns its tick makes the
next tick start late instead of piling up, so two samplings never overlap. The host row (gpu = -1:
CPU, memory, loopback) rides along at most every 100 ms: /proc counts CPU time in 10 ms jiffies,
so a faster host figure would be noise.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

from collectors import nvml as nvml_info
from collectors.host import HostSampler
from collectors.nvml import NvmlSampler
from collectors.sample import GpuSample
from collectors.sink import RingBuffer, SampleSink, SampleWriter
from pkb_tui.errors import PkbError

MIN_INTERVAL_S = 0.01  # 100 Hz: the counter fields cost ~0.4 ms per GPU, faster only burns a core
HOST_MIN_INTERVAL_S = 0.1
DEFAULT_RAW_KEEP_S = 3600.0  # raw samples for an hour, then per-second averages
STOP_WAIT_S = 10.0  # stop() waits this long for the sampling thread


class Telemetry:
    """``Telemetry(db_path, interval_s=0.1, record=True)``; ``start()`` ... ``stop()``.

    ``.ring`` holds the recent samples, ``.source`` is 'nvml' or 'host', ``.reason`` why there is
    no NVML (None when there is). ``set_run`` stamps a run id on the samples that follow;
    ``set_rank_pids`` names the rank processes whose CPU use the host sampler follows.
    """

    def __init__(
        self, db_path: str | Path | None, interval_s: float = 0.1, record: bool = True, nvml: Any = None, *,
        host_id: int | None = None, raw_keep_s: float | None = DEFAULT_RAW_KEEP_S, ring_capacity: int = 36_000,
        clock: Callable[[], float] | None = None,
    ) -> None:
        if not interval_s >= MIN_INTERVAL_S:
            raise PkbError(f"Sampling interval {interval_s} s is too short; use {MIN_INTERVAL_S} s (100 Hz) or more.")
        self.interval_s = float(interval_s)
        self.ring = RingBuffer(ring_capacity)
        self.samples_taken = 0
        self.sample_cost_us_total = 0.0
        self.last_sample_cost_us: float | None = None
        self.error: str | None = None
        self._run_id: int | None = None
        self.node: int | None = None  # stamped on every sample: this node's rank in a multi-node batch
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._host_sampled_at = -float("inf")

        self.gpu: NvmlSampler | None = None
        if os.environ.get("PKB_FORCE_CPU"):
            reason: str | None = "no NVIDIA GPU used: PKB_FORCE_CPU is set"
        else:
            sampler = NvmlSampler(nvml=nvml, **({"clock": clock} if clock is not None else {}))  # type: ignore[arg-type]  # clock: a replay's
            if sampler.available():
                self.gpu, reason = sampler, None
            else:
                sampler.close()
                reason = sampler.reason or "no NVIDIA GPU found"
                if not reason.lower().startswith("no nvidia gpu"):
                    reason = f"no NVIDIA GPU found: {reason}"
        self.source = "nvml" if self.gpu is not None else "host"
        self.reason = reason
        self.host = HostSampler(reason=reason or "")
        self.sink: SampleWriter | None = None
        if record and db_path is not None:
            self.sink = SampleSink(db_path, host_id=host_id, raw_keep_s=raw_keep_s)

    @property
    def gpu_names(self) -> dict[int, str]:
        return self.gpu.gpu_names if self.gpu is not None else {}

    @property
    def mean_sample_cost_us(self) -> float | None:
        return self.sample_cost_us_total / self.samples_taken if self.samples_taken else None

    def set_run(self, run_id: int | None) -> None:
        self._run_id = run_id

    def set_rank_pids(self, pids: Iterable[int] | Mapping[int, int]) -> None:
        with self._lock:
            self.host.set_pids(pids)

    # ---------------------------------------------------------------- sampling
    def sample_once(self) -> list[GpuSample]:
        """Take one sample now (the thread's body; also usable without the thread)."""
        started = time.perf_counter()
        samples: list[GpuSample] = []
        with self._lock:
            if self.gpu is not None:
                samples += self.gpu.sample()
            now = time.monotonic()
            if self.gpu is None or now - self._host_sampled_at >= HOST_MIN_INTERVAL_S:
                self._host_sampled_at = now
                samples += self.host.sample()
        cost_us = (time.perf_counter() - started) * 1e6
        run_id, node = self._run_id, self.node
        for sample in samples:
            sample.run_id, sample.node = run_id, node
        self.ring.append(samples)
        sink = self.sink  # read once: set_recording may swap it from another thread
        if sink is not None:
            sink.put(samples)
        self.samples_taken += 1
        self.sample_cost_us_total += cost_us
        self.last_sample_cost_us = cost_us
        return samples

    # ---------------------------------------------------------------- what the Monitor shows besides rates
    def topology(self) -> nvml_info.NvLinkTopology:
        """The NVLink links and what they reach (read once: cabling does not change while we run)."""
        if getattr(self, "_topology", None) is None:
            with self._lock:
                if self.gpu is None:
                    self._topology = nvml_info.NvLinkTopology(gpus=[], reason=self.reason or "no NVIDIA GPU")
                else:
                    self._topology = nvml_info.read_topology(self.gpu)
        return self._topology

    def limits(self) -> dict[int, nvml_info.GpuLimits]:
        """Memory size, power limit, top clocks, PCIe link per GPU (read once)."""
        if getattr(self, "_limits", None) is None:
            with self._lock:
                self._limits = nvml_info.read_limits(self.gpu) if self.gpu is not None else {}
        return self._limits

    def processes(self) -> list[nvml_info.GpuProcess] | None:
        """The compute processes on every GPU now (~1 ms per GPU and a /proc read each: callers ask
        about once a second); None: NVML cannot list them."""
        with self._lock:
            return nvml_info.read_processes(self.gpu) if self.gpu is not None else None

    def unsupported(self) -> dict[int, dict[str, str]]:
        """Per GPU: figure -> why it is n/a."""
        with self._lock:
            return nvml_info.unsupported_figures(self.gpu) if self.gpu is not None else {}

    @property
    def recording(self) -> bool:
        return self.sink is not None

    def set_recording(self, db_path: str | Path | None, *, host_id: int | None = None) -> None:
        """Start (db_path) or stop (None) writing the samples that follow into a database."""
        if db_path is not None:
            if self.sink is None:
                self.sink = SampleSink(db_path, host_id=host_id, raw_keep_s=DEFAULT_RAW_KEEP_S)
            return
        sink, self.sink = self.sink, None
        if sink is not None:
            sink.close()
            if sink.error and not self.error:
                self.error = sink.error

    def replace_sink(self, sink: SampleWriter | None) -> None:
        """Send the samples that follow to ``sink`` instead (the launcher's recovery file once its
        database is lost); the old sink writes what it holds and closes."""
        old, self.sink = self.sink, sink
        if old is not None:
            old.close()
            if old.error and not self.error:
                self.error = old.error

    def _run(self) -> None:
        # Straight away, unless a sample was just taken by hand (a caller priming the readings).
        next_at = time.monotonic() + (self.interval_s if self.samples_taken else 0.0)
        self._stop.wait(max(0.0, next_at - time.monotonic()))
        while not self._stop.is_set():
            try:
                self.sample_once()
            except Exception as exc:  # a broken reading must not end the telemetry of a run
                self.error = f"{type(exc).__name__}: {exc}"
            next_at += self.interval_s
            now = time.monotonic()
            if next_at < now:
                next_at = now  # overran: start the next sample late rather than bunch them up
            self._wait_until(next_at)

    def _wait_until(self, deadline: float) -> None:
        """Sleep until ``deadline`` (or stop); meanwhile keep 32-bit PCIe counters unwrapped on GPUs
        without GPM, whose counters may wrap twice between samples slower than ~10 Hz."""
        gpu = self.gpu
        step = gpu.pcie_step_interval_s() if gpu is not None else None
        while True:
            left = deadline - time.monotonic()
            if gpu is None or step is None or left <= step:
                self._stop.wait(max(0.0, left))
                return
            if self._stop.wait(step):
                return
            with self._lock:
                try:
                    gpu.pcie_step()
                except Exception as exc:  # a failed read only costs that step; the next sample says so
                    self.error = f"{type(exc).__name__}: {exc}"

    def start(self) -> Telemetry:
        if self._thread is None:
            self._stop.clear()
            self._thread = threading.Thread(target=self._run, name="pkb-telemetry", daemon=True)
            self._thread.start()
        return self

    def stop(self) -> None:
        """Stop sampling, write what is queued, release NVML. Safe to call twice."""
        self._stop.set()
        if self._thread is not None:
            # Bounded: a reading stuck in the kernel or the driver must not keep a Ctrl-C from
            # ending the monitor or a batch (the thread is a daemon: it goes with the process).
            self._thread.join(STOP_WAIT_S)
            if self._thread.is_alive() and not self.error:
                self.error = f"the sampling thread did not stop within {STOP_WAIT_S:g} s (a reading hung); left behind"
            self._thread = None
        if self.sink is not None:
            self.sink.close()
            if self.sink.error and not self.error:
                self.error = self.sink.error
            self.sink = None
        if self.gpu is not None:
            self.gpu.close()
            self.gpu = None

    def __enter__(self) -> Telemetry:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
