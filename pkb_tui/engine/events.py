"""Worker events: JSON lines, one object per line, typed by "event". Unknown fields are ignored.

Judge 0 sends them over the uplink (engine.uplink); the launcher receives them, stores what they carry and
passes them on to whoever watches (the CLI's progress line, the TUI's live screen). ``item`` is the
index of the (task, model) pair in the batch; the launcher maps it to a run id.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from typing import Any, ClassVar


@dataclass
class Event:
    name: ClassVar[str] = ""

    def to_json(self) -> str:
        return json.dumps({"event": self.name, **dataclasses.asdict(self)}, default=str)


@dataclass
class BatchStarted(Event):
    """The ranks are up: what they found (host facts, mode, MPS)."""

    name: ClassVar[str] = "batch_started"
    world_size: int
    mode: str
    host: dict[str, Any] = field(default_factory=dict)
    timings_representative: bool = True
    mps_enabled: bool | None = None
    notes: list[str] = field(default_factory=list)
    rank_pids: list[int] = field(default_factory=list)  # rank_pids[r]: the process of rank r (on its node)
    rank_nodes: list[int] = field(default_factory=list)  # rank_nodes[r]: the node rank rank r runs on


@dataclass
class RunStarted(Event):
    name: ClassVar[str] = "run_started"
    item: int
    task: str
    model: str
    trials: int


@dataclass
class Progress(Event):
    name: ClassVar[str] = "progress"
    item: int
    phase: str  # trial, timing, profile
    variant: str | None = None
    trial: int | None = None
    trials: int | None = None


@dataclass
class RunNote(Event):
    """A sentence for one run's notes, learnt while it runs (e.g. its runner's sandbox was not in force)."""

    name: ClassVar[str] = "run_note"
    item: int
    note: str


@dataclass
class TrialResult(Event):
    name: ClassVar[str] = "trial_result"
    item: int
    trial: int  # -1: the outputs of the timed iterations
    correct: bool
    max_abs_error: float | None = None
    max_rel_error: float | None = None
    worst_rank: int | None = None
    message: str | None = None
    ranks: list[dict[str, Any]] = field(default_factory=list)


@dataclass
class Timing(Event):
    name: ClassVar[str] = "timing"
    item: int
    variant: str
    median_us: float
    p10_us: float
    p90_us: float
    mean_us: float
    min_us: float
    max_us: float
    iterations: int
    per_rank_median_us: list[float] = field(default_factory=list)
    input_copies: int = 1  # calls per timed block: each its own fresh inputs
    # The figures by method. "eager": the calls back to back as an eager program makes them;
    # "graph": the same calls captured in one CUDA graph and replayed (None with graph_note when
    # not capturable). Each: median_us, p10_us, p90_us, mean_us, min_us, max_us, iterations and
    # rounds_us (per interleaved round, the per-call figures of its blocks).
    eager: dict[str, Any] | None = None
    graph: dict[str, Any] | None = None
    graph_note: str | None = None
    overhead_us: dict[str, float] = field(default_factory=dict)  # per block, subtracted (null calls)


@dataclass
class BlockTimes(Event):
    """While an item is timed: judge 0's per-call figures of the round just timed (its own clock,
    the harness share of the rounds so far subtracted), for the Live screen. The stored figures
    are the Timing event's (the slowest rank per block)."""

    name: ClassVar[str] = "block_times"
    item: int
    variant: str
    method: str  # eager or graph
    per_call_us: list[float] = field(default_factory=list)


@dataclass
class Kernels(Event):
    name: ClassVar[str] = "kernels"
    item: int
    variant: str
    rank: int
    kernels: list[dict[str, Any]] = field(default_factory=list)
    trace_path: str | None = None


@dataclass
class LinkBytes(Event):
    name: ClassVar[str] = "link_bytes"
    item: int
    variant: str
    iterations: int
    nvlink_bytes_per_iter: float | None = None  # max over ranks; None: NVML could not count
    pcie_bytes_per_iter: float | None = None
    per_rank: list[dict[str, Any]] = field(default_factory=list)


@dataclass
class Error(Event):
    name: ClassVar[str] = "error"
    item: int | None
    where: str
    message: str
    traceback: str = ""
    rank: int | None = None


@dataclass
class RunFinished(Event):
    name: ClassVar[str] = "run_finished"
    item: int
    status: str  # passed, failed, error, timeout, interrupted
    detail: str | None = None


@dataclass
class Heartbeat(Event):
    name: ClassVar[str] = "heartbeat"
    ts: float
    item: int | None = None


@dataclass
class BatchFinished(Event):
    name: ClassVar[str] = "batch_finished"
    status: str


# The launcher's own events, passed to whoever watches with the judges' (never read from the event
# file, so not in EVENT_TYPES: a judge cannot send them).
@dataclass
class SharedMachine(Event):
    """Another batch on this database runs on this machine (said once per other batch)."""

    name: ClassVar[str] = "shared_machine"
    pid: int
    started_at: float
    message: str


@dataclass
class DatabaseLost(Event):
    """The database was deleted, moved, replaced or made read-only (or a write failed): the rest of
    the batch goes to the recovery file (None: none could be written, said in message)."""

    name: ClassVar[str] = "database_lost"
    message: str
    recovery_path: str | None = None


@dataclass
class NodeStatus(Event):
    """Every node of a multi-node batch as the head sees it, about once a second, for Live: per
    node (engine.nodes.live_node) its host, when it was last heard from (``heard_at``, Unix seconds
    on the head's clock), its GPUs' link and its NICs' bytes/s (None with ``*_na``: not measured)."""

    name: ClassVar[str] = "node_status"
    ts: float
    node_timeout_s: float
    nodes: list[dict[str, Any]] = field(default_factory=list)


EVENT_TYPES: dict[str, type[Event]] = {
    cls.name: cls for cls in (
        BatchStarted, RunStarted, RunNote, Progress, TrialResult, Timing, BlockTimes, Kernels, LinkBytes, Error, RunFinished,
        Heartbeat, BatchFinished,
    )
}


def parse_event(line: str) -> Event | None:
    """One JSON line to its event; None for a line that is not an event we know."""
    try:
        data = json.loads(line)
    except json.JSONDecodeError:
        return None
    if not isinstance(data, dict):
        return None
    cls = EVENT_TYPES.get(data.get("event", ""))
    if cls is None:
        return None
    names = {f.name for f in dataclasses.fields(cls)}
    try:
        return cls(**{k: v for k, v in data.items() if k in names})
    except TypeError:
        return None
