"""What the user asks for: a batch of tasks x models with the run options."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any


@dataclass
class RunRequest:
    tasks: list[str]
    models: list[str]  # solution set names or paths; "baseline" runs the baseline as the candidate
    world_size: int = 2
    mode: str | None = None  # None: chosen from the GPUs present (engine.modes)
    dtype: str = "float32"
    size: str = "small"
    trials: int = 3
    timeout_s: float = 300.0  # per run (one task x model), wall time; a launch's first run counts its start-up
    timing: bool = True
    warmup: int = 5
    iterations: int = 30
    profile: bool = True  # per-kernel table after timing
    seed: int = 0
    speedup_basis: str = "eager"  # which timing method speedup and leaderboard use: eager or graph
    oversubscribe: bool = False  # allow more ranks than the mode can hold (engine.modes.rank_capacity)
    max_host_memory_gib: float | None = None  # per candidate per rank; None: engine.limits' default
    max_tasks: int | None = None  # threads and processes per candidate per rank; None: the default
    max_cpu_s: float | None = None  # CPU seconds per candidate per rank; None: engine.limits' default
    max_gpu_memory_gib: float | None = None  # GPU memory per candidate per rank; None: engine.limits' default
    extra: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> RunRequest:
        names = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in names})


@dataclass
class RunItem:
    """One (task, model) pair of a batch, resolved: what the worker needs to run it."""

    index: int
    task: str
    model: str
    model_path: str | None  # folder of the solution set; None for the baseline model
    solution_path: str | None  # the candidate's file; None for the baseline model
    # Why the candidate file cannot run (no `solution`, a syntax error, a wrong signature, empty):
    # such an item is recorded as a failed run with this reason and never launched.
    invalid_reason: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)
