"""A real Telemetry sampling a replayed NVML trace (CI has no GPU), with fixed timestamps and a fixed
host row, so the Monitor's pilot tests and snapshots see the same figures on every machine."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from collectors.replay import ReplayNvml
from collectors.sample import GpuSample, RankCpu
from collectors.telemetry import Telemetry
from tests.app_fixtures import FIXED_NOW

FIXTURES = Path(__file__).parent / "fixtures"
TRACE_8X18 = FIXTURES / "nvml_trace_8x18.json"
TRACE_H200 = FIXTURES / "nvml_trace_h200_recorded.json"
TICK_S = 0.25  # the 8x18 trace's step (the recorded H200 one steps 0.1 s: only the graphs' spacing differs)


class FixedHost:
    """The host sampler's place: one row with the ranks of a run on GPUs 0-7 (pids as in the trace)."""

    def __init__(self, ranks: int = 8) -> None:
        self.ranks = [RankCpu(rank=r, pid=41000 + r, cpu_pct=97.0 + r) for r in range(ranks)]

    def sample(self) -> list[GpuSample]:
        return [GpuSample(ts=0.0, gpu=-1, cpu_pct=41.0, host_memory_used_bytes=96e9, loopback_bytes_per_s=2.5e9,
                          ranks=list(self.ranks))]

    def set_pids(self, pids: Any) -> None:
        pass


class ReplayedTelemetry(Telemetry):
    """Samples only when told (advance), never from a thread: what a frame shows is fixed."""

    def __init__(self, trace: Path, db_path: Path | None = None, *, ranks: int = 8, start_ts: float = FIXED_NOW) -> None:
        self.replay = ReplayNvml.from_file(trace)
        self.start_ts = start_ts
        super().__init__(db_path, interval_s=TICK_S, record=False, nvml=self.replay, clock=self.replay.clock)
        self.host = FixedHost(ranks)  # type: ignore[assignment]
        self.tick = 0

    def advance(self, ticks: int) -> None:
        for _ in range(ticks):
            self._host_sampled_at = -float("inf")  # the host row every tick, not by the wall clock
            for sample in self.sample_once():
                sample.ts = self.start_ts + self.tick * TICK_S
            self.tick += 1
            self.replay.step()

    def start(self) -> "ReplayedTelemetry":
        return self


def replayed(
    trace: Path = TRACE_8X18, ticks: int = 40, db_path: Path | None = None, *, ranks: int = 8, start_ts: float = FIXED_NOW,
) -> ReplayedTelemetry:
    """``start_ts``: the first sample's time (recorded samples older than an hour are folded into
    per-second averages by the sink's retention: a recording test stamps them now)."""
    telemetry = ReplayedTelemetry(trace, db_path, ranks=ranks, start_ts=start_ts)
    telemetry.advance(ticks)
    return telemetry
