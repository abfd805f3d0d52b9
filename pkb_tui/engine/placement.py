"""Where a node's judges and runners run on the CPU, and a check that nobody moved them.

Measured on the H200 VM (self-check, nccl x1, 2026-12-04): with the judge, its spinning wait and
both runners left to the scheduler, the same code read up to 1.5x faster or slower in the
candidate's runner than in the baseline's, consistently over 40 rounds of one item and with a
sign that changed from item to item: the runners are new per item and land on whatever CPU the
scheduler picks, next to the judge's busy wait on a sibling hyperthread or not. Pinning fixes
where they run: per local rank one physical core for the judge (and its fork server) and one or
two for the runners, the *same* cores for the baseline's runner and the candidate's (only one of
them runs at a time: the other is stopped), and the first core left to the launcher and the
collectors. Every rank of a node computes the same plan from the same sysfs, so no rank needs to
ask another.

A candidate can move processes of its own uid: ``sched_setaffinity``/``setpriority``/
``sched_setscheduler`` on the baseline's runner or the judge need no capability. ``moved`` says
whether that happened; the judge checks before every timed baseline block and fails such a run
as "timing tampered". The candidate moving *itself* is not checked (it could only leave the
cores it shares with the baseline for others, which the placement keeps free of harness work).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

SYSFS_CPU = Path("/sys/devices/system/cpu")


@dataclass(frozen=True)
class Placement:
    """One local rank's CPUs. ``judge`` and ``runners`` empty: not pinned (``note`` says why)."""

    judge: frozenset[int]
    runners: frozenset[int]
    note: str

    @property
    def pinned(self) -> bool:
        return bool(self.judge and self.runners)


@dataclass(frozen=True)
class Scheduling:
    """What a process's main thread runs with: the fields a candidate could change."""

    cpus: frozenset[int]
    nice: int
    policy: int

    @classmethod
    def of(cls, pid: int) -> Scheduling:
        return cls(frozenset(os.sched_getaffinity(pid)), os.getpriority(os.PRIO_PROCESS, pid), os.sched_getscheduler(pid))

    def describe(self) -> str:
        return f"CPUs {_ranges(self.cpus)}, nice {self.nice}, policy {self.policy}"


def physical_cores(allowed: set[int], sysfs: Path = SYSFS_CPU) -> list[tuple[int, ...]]:
    """The allowed logical CPUs grouped into physical cores (hyperthread siblings together),
    ordered by package and core. A CPU whose topology sysfs does not tell is a core of its own."""
    cores: dict[tuple[int, int], list[int]] = {}
    for cpu in sorted(allowed):
        topo = sysfs / f"cpu{cpu}" / "topology"
        try:
            key = (int((topo / "physical_package_id").read_text()), int((topo / "core_id").read_text()))
        except (OSError, ValueError):
            key = (1 << 30, cpu)
        cores.setdefault(key, []).append(cpu)
    return [tuple(cpus) for _, cpus in sorted(cores.items())]


def plan(local_rank: int, local_world: int, allowed: set[int] | None = None, sysfs: Path = SYSFS_CPU,
         enabled: bool | None = None) -> Placement:
    """This local rank's judge and runner CPUs, the same answer on every rank of the node."""
    if enabled is None:
        enabled = os.environ.get("PKB_PIN", "1") != "0"
    if not enabled:
        return Placement(frozenset(), frozenset(), "CPU placement: not pinned (PKB_PIN=0)")
    if allowed is None:
        allowed = set(os.sched_getaffinity(0))
    cores = physical_cores(allowed, sysfs)
    spare = cores[1:]  # the first core: the launcher, the collectors, the rest of the machine
    if len(spare) >= 3 * local_world:
        per_runner = 2
    elif len(spare) >= 2 * local_world:
        per_runner = 1
    else:
        return Placement(frozenset(), frozenset(), (
            f"CPU placement: not pinned ({len(cores)} physical cores for {local_world} ranks; pinning needs "
            f"2 per rank and 1 more): the scheduler places judges and runners, timings are noisier"))
    first = local_rank * (1 + per_runner)
    judge = frozenset(spare[first])
    runners = frozenset(cpu for core in spare[first + 1:first + 1 + per_runner] for cpu in core)
    return Placement(judge, runners, (
        f"CPU placement: each rank's judge on one physical core and both its runners on the same "
        f"{per_runner} other{'s' if per_runner > 1 else ''} (rank {local_rank}: judge {_ranges(judge)}, "
        f"runners {_ranges(runners)})"))


def pin_process(cpus: frozenset[int], pid: int = 0) -> None:
    """Every thread of a process (``pid`` 0: this one) onto ``cpus``; threads it starts later
    inherit it from the thread that starts them."""
    for tid in _threads(pid or os.getpid()) or [pid or os.getpid()]:
        try:
            os.sched_setaffinity(tid, cpus)
        except OSError:  # a thread that ended meanwhile
            pass


def moved(pid: int, expected: Scheduling, who: str) -> str | None:
    """The sentence when ``pid``'s main thread no longer runs as ``expected``; None when it does
    (or the process is gone: its end is reported elsewhere)."""
    try:
        now = Scheduling.of(pid)
    except OSError:
        return None
    if now == expected:
        # Its other threads (NCCL's proxy, CUDA's): their priority and policy, which no library
        # changes; not their CPUs, which NCCL may narrow to the GPU's own.
        for tid in _threads(pid):
            try:
                nice, policy = os.getpriority(os.PRIO_PROCESS, tid), os.sched_getscheduler(tid)
            except OSError:
                continue  # ended meanwhile
            if (nice, policy) != (expected.nice, expected.policy):
                return (f"timing tampered: {who}'s thread {tid} had its scheduling changed while the candidate "
                        f"ran (nice {nice}, policy {policy}; it had nice {expected.nice}, policy {expected.policy})")
        return None
    return (f"timing tampered: {who}'s scheduling was changed while the candidate ran "
            f"({now.describe()}; it had {expected.describe()})")


def _threads(pid: int) -> list[int]:
    try:
        return [int(t) for t in os.listdir(f"/proc/{pid}/task")]
    except OSError:
        return []


def restore(pid: int, expected: Scheduling, who: str) -> str | None:
    """Put ``pid`` (every thread) back as ``expected`` where this process may (its CPUs always;
    a lower nice or another policy needs CAP_SYS_NICE); the sentence when it still differs."""
    if moved(pid, expected, who) is None:
        return None
    pin_process(expected.cpus, pid)
    for tid in _threads(pid) or [pid]:
        try:
            os.setpriority(os.PRIO_PROCESS, tid, expected.nice)
        except OSError:
            pass
        try:
            os.sched_setscheduler(tid, expected.policy, os.sched_param(0))
        except OSError:
            pass
    return moved(pid, expected, who)


def _ranges(cpus: frozenset[int]) -> str:
    """{0, 1, 2, 5} -> '0-2,5'."""
    runs: list[list[int]] = []
    for cpu in sorted(cpus):
        if runs and runs[-1][1] == cpu - 1:
            runs[-1][1] = cpu
        else:
            runs.append([cpu, cpu])
    return ",".join(str(a) if a == b else f"{a}-{b}" for a, b in runs)
