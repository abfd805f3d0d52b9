"""Is anything else timing on this box? Two batches on one machine time each other: before a batch
starts, say what else runs (another pkb-tui batch, processes on the GPUs, a busy CPU); after it,
the host's load during the run goes into the run's notes, so a slow figure can be explained.

No Textual here: the CLI and the dashboard both call it. Every NVML question goes through the
gateway (collectors.nvml.Nvml), so a box without NVML just has nothing to say about GPUs.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

WORKER_MODULE = "pkb_tui.engine.worker"
BUSY_LOAD_FRACTION = 0.5  # a 1-minute load average above half the cores means ranks will queue


def cpu_count() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def _ancestors(pid: int) -> set[int]:
    out: set[int] = set()
    while pid > 1 and pid not in out:
        out.add(pid)
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
            pid = int(stat.rsplit(") ", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            break
    return out


def other_batch_ranks(me: int | None = None, *, skip_under: Iterable[int] = ()) -> list[int]:
    """pids of pkb-tui rank processes on this host that are not this process's own (nor started
    by a process in ``skip_under``)."""
    me = os.getpid() if me is None else me
    skip = {me, *skip_under}
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit() and int(entry) != me and WORKER_MODULE in _cmdline(int(entry)):
            if not skip & _ancestors(int(entry)):
                found.append(int(entry))
    return sorted(found)


def competing_load(*, nvml_factory: Callable[[], Any] | None = None, load_average: Callable[[], float] | None = None,
                   me: int | None = None, known_batch_pids: Iterable[int] = ()) -> list[str]:
    """Sentences naming what else is running that would skew a batch's timings; [] when nothing.
    ``known_batch_pids``: launchers of batches the caller names itself (the database's batches
    table, see Launcher): their ranks are not named again here."""
    me = os.getpid() if me is None else me
    known = set(known_batch_pids)
    warnings = []
    ranks = other_batch_ranks(me, skip_under=known)
    if ranks:
        warnings.append(f"another pkb-tui batch is running on this host ({len(ranks)} rank process(es), pid "
                        f"{', '.join(map(str, ranks[:4]))}{'…' if len(ranks) > 4 else ''}); the two will time each other")
    gpu_pids = set(gpu_processes(nvml_factory=nvml_factory, me=me, exclude=known)) - set(ranks)
    if gpu_pids:
        warnings.append(f"{len(gpu_pids)} other process(es) use the GPUs (pid {', '.join(map(str, sorted(gpu_pids)[:4]))})")
    load = (load_average or (lambda: os.getloadavg()[0]))()
    cores = cpu_count()
    if load > BUSY_LOAD_FRACTION * cores:
        warnings.append(f"the CPU is busy (1-minute load average {load:.1f} on {cores} core(s))")
    return warnings


def _nvml() -> Any:
    from collectors.nvml import Nvml

    return Nvml()


def gpu_processes(*, nvml_factory: Callable[[], Any] | None = None, me: int | None = None,
                  exclude: Iterable[int] = ()) -> dict[int, str]:
    """Processes holding a compute context on this host's GPUs, but for this process, its
    descendants and those of ``exclude``: pid -> its command line (shortened; "" where /proc does
    not show it, e.g. a pid of another namespace). {} where NVML cannot say."""
    me = os.getpid() if me is None else me
    skip = {me, *exclude}
    with (nvml_factory or _nvml)() as nvml:
        pids = nvml.compute_pids()
    found = {}
    for pid in sorted(pids):
        if not skip & _ancestors(pid):
            command = _cmdline(pid).strip()
            found[pid] = command if len(command) <= 60 else command[:59] + "…"
    return found


def gpu_sharing_note(at_start: dict[int, str], at_end: dict[int, str]) -> str | None:
    """A run note naming the other processes that held a compute context on this host's GPUs when
    the batch started and when it ended (a GPU shared with another job times both); None when none did."""
    if not at_start and not at_end:
        return None

    def named(found: dict[int, str]) -> str:
        shown = [f"{pid} ({command})" if command else str(pid) for pid, command in list(found.items())[:4]]
        return ", ".join(shown) + ("…" if len(found) > 4 else "")

    when = [f"at the start: pid {named(at_start)}"] if at_start else []
    when += [f"at the end: pid {named(at_end)}"] if at_end else []
    return (f"other processes held this host's GPUs beside the batch ({'; '.join(when)}): the timings may "
            f"include their work")


def host_load_note(started_load: float | None = None) -> str:
    """A run note: the host's load averages at the end of the batch (and at its start, if given)."""
    one, five, _ = os.getloadavg()
    start = f", {started_load:.1f} at the start" if started_load is not None else ""
    return f"host load during the batch: 1-minute load average {one:.1f} at the end{start} (5-minute {five:.1f}) on {cpu_count()} core(s)"
