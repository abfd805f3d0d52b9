"""What a candidate may take of the machine, and the judge's watch over it.

A candidate's processes (its runner, whatever that runner starts, and anything that escaped by a
double fork and came back to the judge, a child subreaper) share one allowance per rank:

- host memory: resident bytes of all of them together (--max-host-memory-gib; by default half the
  machine's memory shared by the ranks);
- tasks: threads and processes together (--max-tasks), which stops a fork or thread bomb before it
  takes the box;
- output: what they print is read by the judge through a pipe; the first and the last
  OUTPUT_HALF_BYTES are kept in the log with a line saying how much was dropped between.

The judge's guard thread samples /proc four times a second; past a limit it kills the candidate's
processes and the run ends with a verdict that names the limit. The baseline runner is trusted
and not limited. CPU time is bounded by the run's timeout; GPU memory is not limited here.
"""

from __future__ import annotations

import os
import threading
from collections import deque
from dataclasses import dataclass
from pathlib import Path

from pkb_tui.engine.procs import Usage

GIB = 2**30
DEFAULT_MAX_TASKS = 512
OUTPUT_HALF_BYTES = 1 << 20
GUARD_INTERVAL_S = 0.25


@dataclass(frozen=True)
class Limits:
    host_memory_bytes: int
    tasks: int

    @classmethod
    def from_request(cls, memory_gib: float | None, tasks: int | None, ranks_on_host: int) -> Limits:
        if memory_gib is None:
            memory = max(2 * GIB, int(host_memory_bytes() * 0.5 / max(1, ranks_on_host)))
        else:
            memory = int(float(memory_gib) * GIB)
        return cls(host_memory_bytes=memory, tasks=int(tasks or DEFAULT_MAX_TASKS))


def host_memory_bytes() -> int:
    try:
        return int(os.sysconf("SC_PHYS_PAGES")) * int(os.sysconf("SC_PAGE_SIZE"))
    except (OSError, ValueError):
        return 16 * GIB


def over_limit(usage: Usage, limits: Limits) -> str | None:
    """The sentence for a limit passed, or None."""
    if usage.resident_bytes > limits.host_memory_bytes:
        return (f"exceeded its host-memory limit: {usage.resident_bytes / GIB:.1f} GiB resident "
                f"> {limits.host_memory_bytes / GIB:.1f} GiB (--max-host-memory-gib)")
    if usage.tasks > limits.tasks:
        return (f"exceeded its limit of {limits.tasks} threads and processes: {usage.tasks} in "
                f"{usage.processes} process(es) (--max-tasks)")
    return None


class OutputCapture:
    """A runner's stdout and stderr: a pipe the judge drains in a thread of its own. The first
    OUTPUT_HALF_BYTES go to the log as they come; past that only the last OUTPUT_HALF_BYTES are
    held, written with a line saying how many bytes were dropped when the runner is closed."""

    def __init__(self, log_path: Path, half_bytes: int = OUTPUT_HALF_BYTES) -> None:
        self.read_fd, self.write_fd = os.pipe()
        self.half_bytes = half_bytes
        self._log = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW, 0o644)
        self._head = bytearray()
        self._tail: deque[bytes] = deque()
        self._tail_bytes = 0
        self._past_head_bytes = 0
        self._finished = False
        self.dropped_bytes = 0
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._drain, daemon=True, name="pkb-output")
        self._thread.start()

    def handed_over(self) -> None:
        """The runner has its copy of the write end: the judge's goes (EOF comes with the runner's)."""
        if self.write_fd >= 0:
            os.close(self.write_fd)
            self.write_fd = -1

    def _drain(self) -> None:
        try:
            while True:
                try:
                    chunk = os.read(self.read_fd, 1 << 16)
                except OSError:
                    return
                if not chunk:
                    return
                with self._lock:
                    if self._finished:  # a leftover process still writing after the run: ignored
                        continue
                    room = self.half_bytes - len(self._head)
                    if room > 0:
                        self._head += chunk[:room]
                        _write_all(self._log, chunk[:room])
                        chunk = chunk[room:]
                    if chunk:
                        self._past_head_bytes += len(chunk)
                        self._tail.append(chunk)
                        self._tail_bytes += len(chunk)
                        while self._tail_bytes - len(self._tail[0]) >= self.half_bytes:
                            self._tail_bytes -= len(self._tail.popleft())
        finally:
            os.close(self.read_fd)  # only here: the number is never reused under a blocked read

    def last_lines(self, count: int) -> str:
        """The last non-empty lines printed (for a verdict's 'last words')."""
        with self._lock:
            data = b"".join(self._tail) if self._tail else bytes(self._head)
        lines = [line.strip() for line in data[-8192:].decode(errors="replace").splitlines() if line.strip()]
        return " | ".join(lines[-count:])[:600]

    def close(self, wait_s: float = 1.0) -> None:
        """Take what is in the pipe (up to ``wait_s`` for the writers to go) and write the tail,
        with how much was dropped. Later output, from a process that outlived its runner, is
        ignored until the judge ends that process."""
        self.handed_over()
        self._thread.join(wait_s)
        with self._lock:
            if self._finished:
                return
            self._finished = True
            tail = b"".join(self._tail)[-self.half_bytes:]
            self.dropped_bytes = self._past_head_bytes - len(tail)
            if self.dropped_bytes > 0:
                _write_all(self._log, f"\n[pkb: {self.dropped_bytes:,} bytes of output dropped here; the first "
                                      f"and the last {self.half_bytes:,} are kept]\n".encode())
            _write_all(self._log, tail)
            self._tail.clear()
            os.close(self._log)


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    try:
        while view:
            view = view[os.write(fd, view):]
    except OSError:
        pass  # a full disk loses log lines, never the run

