"""Where samples go: a bounded in-memory ring for live readers, and one SQLite writer per database.

- RingBuffer: the last N samples in memory. The TUI and `monitor` read it (latest per GPU, a column's
  recent values) without touching the disk.
- SampleSink: ``put()`` never blocks the sampler; a writer thread with its own connection writes
  whatever has queued up in one transaction (executemany into samples and link_samples), every
  ``flush_interval_s`` or as soon as ``batch_rows`` are waiting.
- retention (pkb_tui.store.samples.apply_retention, which owns the SQL, as the inserts): raw
  samples older than ``raw_keep_s`` become per-second averages (resolution '1s'), so a database
  that has monitored for weeks stays small and fast. NULLs stay NULL through averaging.
"""

from __future__ import annotations

import math
import operator
import sqlite3
import threading
import time
from collections import deque
from collections.abc import Iterable
from pathlib import Path
from typing import Protocol

from collectors.sample import SAMPLE_COLUMNS, GpuSample
from pkb_tui.store.samples import LINK_WIDTH, apply_retention, insert_samples, open_sample_writer

__all__ = ["RingBuffer", "SampleSink", "SampleWriter", "apply_retention", "write_samples"]  # apply_retention: the store's

_sample_fields = operator.attrgetter("run_id", "gpu", *SAMPLE_COLUMNS)


# ------------------------------------------------------------------------------------ ring buffer
class RingBuffer:
    """The last ``capacity`` samples (all GPUs interleaved), safe to read while a sampler appends."""

    def __init__(self, capacity: int = 36_000) -> None:
        self.capacity = capacity
        self._samples: deque[GpuSample] = deque(maxlen=capacity)
        self._latest: dict[int, GpuSample] = {}
        self._lock = threading.Lock()
        self.appended = 0  # samples ever appended: readers can tell whether anything is new

    def __len__(self) -> int:
        return len(self._samples)

    def append(self, samples: Iterable[GpuSample]) -> None:
        with self._lock:
            for sample in samples:
                self._samples.append(sample)
                self._latest[sample.gpu] = sample
                self.appended += 1

    def snapshot(self, since_ts: float | None = None) -> list[GpuSample]:
        """Samples in time order; with ``since_ts`` only those strictly newer (for incremental reads)."""
        with self._lock:
            if since_ts is None:
                return list(self._samples)
            newer = []
            for sample in reversed(self._samples):
                if sample.ts <= since_ts:
                    break
                newer.append(sample)
        newer.reverse()
        return newer

    def oldest_ts(self) -> float | None:
        """The time of the oldest sample held (None: empty): older history is in the database."""
        with self._lock:
            return self._samples[0].ts if self._samples else None

    def latest_per_gpu(self) -> dict[int, GpuSample]:
        with self._lock:
            return dict(sorted(self._latest.items()))

    def series(self, gpu: int, column: str, n: int) -> list[float | None]:
        """The last ``n`` values of ``column`` for ``gpu``, oldest first (None: not available)."""
        if column not in SAMPLE_COLUMNS:
            raise ValueError(f"unknown sample column {column!r}; one of {', '.join(SAMPLE_COLUMNS)}")
        out: list[float | None] = []
        with self._lock:
            for sample in reversed(self._samples):
                if sample.gpu == gpu:
                    out.append(getattr(sample, column))
                    if len(out) >= n:
                        break
        out.reverse()
        return out


# ------------------------------------------------------------------------------------ SQLite sink
def write_samples(conn: sqlite3.Connection, samples: list[GpuSample], host_id: int | None = None) -> tuple[int, int]:
    """Insert samples, their links and their ranks in one transaction; returns (sample rows, link rows)."""
    values: list = []
    link_values: list = []
    rank_values: list = []
    extend, extend_links = values.extend, link_values.extend
    for s in samples:
        extend((s.ts, host_id if s.host_id is None else s.host_id, s.node))
        extend(_sample_fields(s))
        if s.links:
            for link in s.links:
                extend_links((s.ts, s.node, s.run_id, s.gpu, link.link, link.tx_bytes_per_s, link.rx_bytes_per_s))
        if s.ranks:
            for rank in s.ranks:
                rank_values.extend((s.ts, s.run_id, rank.rank, rank.pid, rank.cpu_pct))
    insert_samples(conn, values, link_values, rank_values)
    return len(samples), len(link_values) // LINK_WIDTH


class SampleWriter(Protocol):
    """Where Telemetry sends its samples: a SampleSink, or a batch's recovery file once its
    database is lost (pkb_tui.store.recovery.RecoverySampleSink)."""

    error: str | None

    def put(self, samples: list[GpuSample]) -> None: ...

    def close(self, timeout_s: float = ...) -> None: ...


class SampleSink:
    """One writer thread per database; ``put`` only queues.

    If the disk cannot keep up, the oldest queued samples are dropped beyond ``max_pending``
    (counted in ``dropped``), never the sampler slowed. A write error is kept in ``error`` and the
    batch counted as dropped; the sink keeps going.
    """

    def __init__(
        self, db_path: str | Path, *, host_id: int | None = None, batch_rows: int = 5_000,
        flush_interval_s: float = 0.5, max_pending: int = 1_000_000, raw_keep_s: float | None = None,
        retention_every_s: float = 600.0,
    ) -> None:
        self.db_path = Path(db_path)
        self.host_id = host_id
        self.batch_rows = batch_rows
        self.flush_interval_s = flush_interval_s
        self.max_pending = max_pending
        self.raw_keep_s = raw_keep_s
        self.retention_every_s = retention_every_s
        self.rows_written = 0
        self.link_rows_written = 0
        self.transactions = 0
        self.dropped = 0
        self.error: str | None = None
        self._pending: deque[GpuSample] = deque()
        self._queued = 0  # samples ever queued
        self._done = 0  # samples ever written or dropped
        self._cond = threading.Condition()
        self._closing = False
        self._conn = open_sample_writer(self.db_path)  # fail here, in the caller, if the db is unusable
        self._last_retention = -math.inf
        self._retained_until: float | None = None  # raw rows before this are folded already
        self._thread = threading.Thread(target=self._run, name=f"pkb-sample-sink:{self.db_path.name}", daemon=True)
        self._thread.start()

    def put(self, samples: list[GpuSample]) -> None:
        if not samples:
            return
        with self._cond:
            if self._closing:
                return
            self._pending.extend(samples)
            self._queued += len(samples)
            overflow = len(self._pending) - self.max_pending
            for _ in range(max(0, overflow)):
                self._pending.popleft()
                self.dropped += 1
                self._done += 1
            if len(self._pending) >= self.batch_rows:
                self._cond.notify_all()

    def flush(self, timeout_s: float | None = 30.0) -> bool:
        """Wait until everything queued so far is written; False on timeout."""
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        with self._cond:
            target = self._queued
            self._cond.notify_all()
            while self._done < target and self._thread.is_alive():
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    return False
                self._cond.wait(left)
            return self._done >= target

    def close(self, timeout_s: float = 30.0) -> None:
        with self._cond:
            if self._closing:
                return
            self._closing = True
            self._cond.notify_all()
        self._thread.join(timeout_s)

    def __enter__(self) -> SampleSink:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _take(self) -> list[GpuSample]:
        batch = list(self._pending)
        self._pending.clear()
        return batch

    def _run(self) -> None:
        try:
            while True:
                with self._cond:
                    if not self._pending and not self._closing:
                        self._cond.wait(self.flush_interval_s)
                    closing = self._closing
                    batch = self._take()
                if batch:
                    self._write(batch)
                self._maybe_retain()
                if closing:
                    with self._cond:
                        batch = self._take()
                    if batch:
                        self._write(batch)
                    return
        finally:
            with self._cond:
                self._cond.notify_all()
            self._conn.close()

    def _write(self, batch: list[GpuSample]) -> None:
        try:
            rows, links = write_samples(self._conn, batch, self.host_id)
            self.rows_written += rows
            self.link_rows_written += links
            self.transactions += 1
        except sqlite3.Error as exc:
            self.error = f"could not write {len(batch)} samples to {self.db_path}: {exc}"
            self.dropped += len(batch)
        with self._cond:
            self._done += len(batch)
            self._cond.notify_all()

    def _maybe_retain(self) -> None:
        if self.raw_keep_s is None or time.monotonic() - self._last_retention < self.retention_every_s:
            return
        self._last_retention = time.monotonic()
        now = time.time()
        try:
            apply_retention(self._conn, self.raw_keep_s, now, since=self._retained_until)
            self._retained_until = math.floor(now - self.raw_keep_s)
        except sqlite3.Error as exc:
            self.error = f"retention on {self.db_path} failed: {exc}"


