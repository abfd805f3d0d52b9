"""Where samples go: a bounded in-memory ring for live readers, and one SQLite writer per database.

- RingBuffer: the last N samples in memory. The TUI and `monitor` read it (latest per GPU, a column's
  recent values) without touching the disk.
- SampleSink: ``put()`` never blocks the sampler; a writer thread with its own connection writes
  whatever has queued up in one transaction (executemany into samples and link_samples), every
  ``flush_interval_s`` or as soon as ``batch_rows`` are waiting.
- apply_retention: raw samples older than ``raw_keep_s`` become per-second averages
  (resolution '1s'), so a database that has monitored for weeks stays small and fast. NULLs stay
  NULL through averaging: "not available" never turns into 0.
"""

from __future__ import annotations

import math
import operator
import sqlite3
import threading
import time
from collections import deque
from pathlib import Path
from typing import Iterable

from collectors.sample import SAMPLE_COLUMNS, GpuSample

_SAMPLE_HEAD = f"INSERT INTO samples (ts, host_id, run_id, gpu, {', '.join(SAMPLE_COLUMNS)}) VALUES "
_SAMPLE_WIDTH = 4 + len(SAMPLE_COLUMNS)
_LINK_HEAD = "INSERT INTO link_samples (ts, run_id, gpu, link, tx_bytes_per_s, rx_bytes_per_s) VALUES "
_LINK_WIDTH = 6
_RANK_HEAD = "INSERT INTO rank_samples (ts, run_id, rank, pid, cpu_pct) VALUES "
_RANK_WIDTH = 5
_sample_fields = operator.attrgetter("run_id", "gpu", *SAMPLE_COLUMNS)
_ROWS_PER_STATEMENT = 500  # more buys nothing measurable


def _insert_many(conn: sqlite3.Connection, head: str, width: int, values: list) -> None:
    """INSERT of len(values) // width rows, several rows per statement.

    One statement per row (executemany) spends most of its time stepping and resetting the
    statement; a multi-row VALUES list does that once per chunk. Chunks stay under the
    connection's bound-parameter limit (32,766 by default, 999 before SQLite 3.32).
    """
    limit = conn.getlimit(sqlite3.SQLITE_LIMIT_VARIABLE_NUMBER)
    per = max(1, min(_ROWS_PER_STATEMENT, limit // width))
    row = "(" + ", ".join("?" * width) + ")"
    full = head + ", ".join([row] * per)
    step = per * width
    for k in range(0, len(values), step):
        chunk = values[k:k + step]
        sql = full if len(chunk) == step else head + ", ".join([row] * (len(chunk) // width))
        conn.execute(sql, chunk)


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
def _open_for_writing(db_path: str | Path) -> sqlite3.Connection:
    """A connection of our own on a migrated database, in WAL mode."""
    from pkb_tui.store.store import Store, connect

    Store(db_path, recover=False).close()  # creates / migrates the schema if needed
    conn = connect(db_path)
    conn.execute("PRAGMA journal_mode = WAL")
    conn.execute("PRAGMA synchronous = NORMAL")
    return conn


def write_samples(conn: sqlite3.Connection, samples: list[GpuSample], host_id: int | None = None) -> tuple[int, int]:
    """Insert samples, their links and their ranks in one transaction; returns (sample rows, link rows)."""
    values: list = []
    link_values: list = []
    rank_values: list = []
    extend, extend_links = values.extend, link_values.extend
    for s in samples:
        extend((s.ts, host_id))
        extend(_sample_fields(s))
        if s.links:
            for link in s.links:
                extend_links((s.ts, s.run_id, s.gpu, link.link, link.tx_bytes_per_s, link.rx_bytes_per_s))
        if s.ranks:
            for rank in s.ranks:
                rank_values.extend((s.ts, s.run_id, rank.rank, rank.pid, rank.cpu_pct))
    conn.execute("BEGIN IMMEDIATE")
    try:
        _insert_many(conn, _SAMPLE_HEAD, _SAMPLE_WIDTH, values)
        if link_values:
            _insert_many(conn, _LINK_HEAD, _LINK_WIDTH, link_values)
        if rank_values:
            _insert_many(conn, _RANK_HEAD, _RANK_WIDTH, rank_values)
    except BaseException:
        conn.execute("ROLLBACK")
        raise
    conn.execute("COMMIT")
    return len(samples), len(link_values) // _LINK_WIDTH


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
        self._conn = _open_for_writing(self.db_path)  # fail here, in the caller, if the db is unusable
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

    def __enter__(self) -> "SampleSink":
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


# ------------------------------------------------------------------------------------ retention
def apply_retention(
    conn_or_path: sqlite3.Connection | str | Path, raw_keep_s: float, now: float | None = None, *,
    since: float | None = None, slice_s: float = 30.0,
) -> int:
    """Replace raw samples older than ``raw_keep_s`` by per-second averages; returns raw sample rows replaced.

    Works through the old raw rows in slices of ``slice_s`` seconds, one short transaction each, so
    the launcher's own writes never wait long for the lock. ``since``: where the raw rows start, if
    known (the sink remembers its last cut); else it is looked up. Cuts fall on whole seconds, so no
    second is ever split between a raw and an averaged part. An averaged row's ts is the mean of its
    raw rows' ts (inside its second); averages skip NULLs, and a column that was NULL stays NULL.
    """
    own = not isinstance(conn_or_path, sqlite3.Connection)
    conn = _open_for_writing(conn_or_path) if own else conn_or_path
    cutoff = math.floor((time.time() if now is None else now) - raw_keep_s)
    averages = ", ".join(f"AVG({c})" for c in SAMPLE_COLUMNS)
    window = "resolution = 'raw' AND ts >= ? AND ts < ?"
    fold_samples = (
        f"INSERT INTO samples (ts, host_id, run_id, gpu, resolution, {', '.join(SAMPLE_COLUMNS)}) "
        f"SELECT AVG(ts), host_id, run_id, gpu, '1s', {averages} FROM samples "
        f"WHERE {window} GROUP BY host_id, run_id, gpu, CAST(ts AS INTEGER)"
    )
    fold_links = (
        "INSERT INTO link_samples (ts, run_id, gpu, link, resolution, tx_bytes_per_s, rx_bytes_per_s) "
        "SELECT AVG(ts), run_id, gpu, link, '1s', AVG(tx_bytes_per_s), AVG(rx_bytes_per_s) FROM link_samples "
        f"WHERE {window} GROUP BY run_id, gpu, link, CAST(ts AS INTEGER)"
    )
    fold_ranks = (
        "INSERT INTO rank_samples (ts, run_id, rank, pid, resolution, cpu_pct) "
        "SELECT AVG(ts), run_id, rank, pid, '1s', AVG(cpu_pct) FROM rank_samples "
        f"WHERE {window} GROUP BY run_id, rank, pid, CAST(ts AS INTEGER)"
    )

    def next_raw(after: float) -> float | None:
        found = [
            conn.execute(f"SELECT ts FROM {table} WHERE resolution = 'raw' AND ts >= ? ORDER BY ts LIMIT 1", (after,)).fetchone()
            for table in ("samples", "link_samples", "rank_samples")
        ]
        times = [row[0] for row in found if row is not None]
        return math.floor(min(times)) if times else None

    outer = conn.in_transaction  # a caller's transaction: fold inside it, no commits of ours
    replaced = 0
    try:
        start = next_raw(-math.inf if since is None else math.floor(since))
        while start is not None and start < cutoff:
            end = min(cutoff, start + max(1, math.ceil(slice_s)))
            if not outer:
                conn.execute("BEGIN IMMEDIATE")
            try:
                conn.execute(fold_samples, (start, end))
                replaced += conn.execute(f"DELETE FROM samples WHERE {window}", (start, end)).rowcount
                conn.execute(fold_links, (start, end))
                conn.execute(f"DELETE FROM link_samples WHERE {window}", (start, end))
                conn.execute(fold_ranks, (start, end))
                conn.execute(f"DELETE FROM rank_samples WHERE {window}", (start, end))
            except BaseException:
                if not outer:
                    conn.execute("ROLLBACK")
                raise
            if not outer:
                conn.execute("COMMIT")
            start = next_raw(end)
        return replaced
    finally:
        if own:
            conn.close()
