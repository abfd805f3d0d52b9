"""What the Live screen shows, built from the engine's events. No Textual here: the app feeds it
on the main thread and the screen reads it; tests feed it events directly.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from pkb_tui.engine import events as ev


@dataclass
class RunLine:
    """One (task, model) run of a batch as the Live screen lists it."""

    item: int
    task: str
    model: str
    run_id: int | None = None
    status: str = "queued"
    detail: str | None = None


@dataclass
class LiveState:
    """The batch in progress (or the last one), event by event. `version` grows with every change
    so a screen redraws only what changed."""

    runs: list[RunLine] = field(default_factory=list)
    world_size: int | None = None
    mode: str | None = None
    dtype: str | None = None
    size: str | None = None
    notes: list[str] = field(default_factory=list)
    timings_representative: bool = True
    current_item: int | None = None
    trial: int | None = None
    trials: int | None = None
    phase: str | None = None
    variant: str | None = None
    kernels: list[dict[str, Any]] = field(default_factory=list)  # the current run's, all variants and ranks
    trial_results: list[ev.TrialResult] = field(default_factory=list)
    timings: dict[str, ev.Timing] = field(default_factory=dict)
    errors: list[ev.Error] = field(default_factory=list)
    started_at: float | None = None
    finished_at: float | None = None
    batch_status: str | None = None  # None while running; the batch's end otherwise
    failure: str | None = None  # the launcher itself failed (a sentence)
    item_started_at: float | None = None  # when the current run started (Unix seconds)
    item_seconds: list[float] = field(default_factory=list)  # how long each finished run of the batch took
    # Per-iteration times of the current run as they stream (variant -> µs per call, in order).
    timing_samples: dict[str, list[float]] = field(default_factory=dict)
    # A multi-node batch: every node as the head last saw it (engine.nodes.live_node), and how long
    # a node may stay silent before the head gives it up. Empty on one node.
    nodes: list[dict[str, Any]] = field(default_factory=list)
    node_timeout_s: float | None = None
    version: int = 0

    # ------------------------------------------------------------------ lifecycle
    @classmethod
    def for_batch(cls, items: list[tuple[str, str]], *, world_size: int, mode: str | None, dtype: str,
                  size: str, started_at: float) -> LiveState:
        return cls(
            runs=[RunLine(index, task, model) for index, (task, model) in enumerate(items)],
            world_size=world_size, mode=mode, dtype=dtype, size=size, started_at=started_at,
        )

    @property
    def running(self) -> bool:
        return self.started_at is not None and self.batch_status is None

    @property
    def current(self) -> RunLine | None:
        if self.current_item is None or not 0 <= self.current_item < len(self.runs):
            return None
        return self.runs[self.current_item]

    def line_for(self, item: int | None, run_id: int | None) -> RunLine | None:
        if item is not None and 0 <= item < len(self.runs):
            return self.runs[item]
        if run_id is not None:
            for line in self.runs:
                if line.run_id == run_id:
                    return line
        return None

    def counts(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for line in self.runs:
            out[line.status] = out.get(line.status, 0) + 1
        return out

    def finish(self, *, status: str, finished_at: float, statuses: dict[int, str] | None = None,
               failure: str | None = None) -> None:
        """The batch ended (normally, by cancel, or because the launcher failed)."""
        for line in self.runs:
            if statuses and line.run_id in statuses:
                line.status = statuses[line.run_id]
            elif line.status in ("queued", "running") and status in ("interrupted", "error"):
                # Started and stopped: interrupted; never reached: cancelled (no partial result).
                line.status = "interrupted" if line.status == "running" else "cancelled"
        self.batch_status = status
        self.finished_at = finished_at
        self.failure = failure
        self.phase = None
        self.version += 1

    # ------------------------------------------------------------------ progress and time left
    def item_fraction(self, now: float) -> float | None:
        """How far the current run is, 0..1: by time where earlier runs of the batch say how long one
        takes, else by phase (trials first half, timing and profile the rest). None: no run going."""
        if self.current is None or not self.running:
            return None
        if self.item_seconds and self.item_started_at is not None:
            mean = sum(self.item_seconds) / len(self.item_seconds)
            return min(0.99, max(0.0, (now - self.item_started_at) / mean)) if mean > 0 else None
        trials = self.trials or 0
        if self.phase == "trial" or self.phase == "starting":
            return 0.5 * min(self.trial or 0, trials) / trials if trials else 0.0
        return {"timing": 0.75 if self.variant == "candidate" else 0.6, "profile": 0.9, "finished": 1.0}.get(self.phase or "", 0.5)

    def time_left_s(self, now: float) -> tuple[float | None, float | None]:
        """(the current run, the whole batch) seconds left, from the mean duration of the runs this
        batch finished; (None, None) until one has finished."""
        if not self.running or not self.item_seconds:
            return None, None
        mean = sum(self.item_seconds) / len(self.item_seconds)
        item_left = max(0.0, mean - (now - self.item_started_at)) if self.item_started_at is not None else mean
        queued = sum(1 for line in self.runs if line.status == "queued")
        return item_left, item_left + mean * queued

    def add_timing_samples(self, variant: str, samples_us: list[float]) -> None:
        """Per-iteration times (µs per call) of the current run, as the engine streams them."""
        self.timing_samples.setdefault(variant, []).extend(float(v) for v in samples_us)
        self.version += 1

    # ------------------------------------------------------------------ events
    def apply(self, event: ev.Event, run_id: int | None, now: float | None = None) -> None:
        """Fold one engine event in (``now``: when it arrived, Unix seconds). Unknown events only
        bump the version."""
        now = time.time() if now is None else now
        item = getattr(event, "item", None)
        if isinstance(event, ev.BatchStarted):
            self.world_size = event.world_size
            self.mode = event.mode
            self.notes = list(event.notes)
            self.timings_representative = event.timings_representative
        elif isinstance(event, ev.RunStarted):
            line = self.line_for(item, run_id)
            if line is None:  # a run the plan did not list: show it anyway
                line = RunLine(event.item, event.task, event.model)
                self.runs.append(line)
            line.run_id = run_id if run_id is not None else line.run_id
            line.status = "running"
            self.current_item = self.runs.index(line)
            self.trial, self.trials = 0, event.trials
            self.phase, self.variant = "starting", None
            self.kernels, self.trial_results, self.timings = [], [], {}
            self.item_started_at, self.timing_samples = now, {}
        elif isinstance(event, ev.Progress):
            self.phase = event.phase
            self.variant = event.variant
            if event.trial is not None:
                self.trial = event.trial
            if event.trials is not None:
                self.trials = event.trials
        elif isinstance(event, ev.TrialResult):
            self.trial_results.append(event)
            if event.trial >= 0:
                self.trial = max(self.trial or 0, event.trial + 1)
        elif isinstance(event, ev.BlockTimes):
            if event.method == "eager":
                self.add_timing_samples(event.variant, event.per_call_us)
        elif isinstance(event, ev.Timing):
            self.timings[event.variant] = event
        elif isinstance(event, ev.Kernels):
            self.kernels.extend({**k, "variant": event.variant, "rank": event.rank} for k in event.kernels)
            self.kernels.sort(key=lambda k: -(k.get("total_us") or 0.0))
        elif isinstance(event, ev.Error):
            self.errors.append(event)
        elif isinstance(event, ev.NodeStatus):
            self.nodes = [dict(node) for node in event.nodes]
            self.node_timeout_s = event.node_timeout_s
        elif isinstance(event, ev.RunFinished):
            line = self.line_for(item, run_id)
            if line is not None:
                line.status = event.status
                line.detail = event.detail
                if run_id is not None:
                    line.run_id = run_id
            if self.item_started_at is not None:
                self.item_seconds.append(max(0.0, now - self.item_started_at))
                self.item_started_at = None
            self.phase = "finished"
        self.version += 1
