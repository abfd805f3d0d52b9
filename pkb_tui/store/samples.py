"""The samples tables' SQL: inserting telemetry rows and folding old raw rows into per-second
averages. The store owns every statement on the database; collectors/sink.py turns GpuSample
records into rows and calls these from its writer thread (a connection of its own).
"""

from __future__ import annotations

import math
import sqlite3
import time
from pathlib import Path

from collectors.sample import SAMPLE_COLUMNS
from pkb_tui.store.store import begin_immediate

_SAMPLE_HEAD = f"INSERT INTO samples (ts, host_id, node, run_id, gpu, {', '.join(SAMPLE_COLUMNS)}) VALUES "
SAMPLE_WIDTH = 5 + len(SAMPLE_COLUMNS)  # values per samples row, in _SAMPLE_HEAD's order
_LINK_HEAD = "INSERT INTO link_samples (ts, node, run_id, gpu, link, tx_bytes_per_s, rx_bytes_per_s) VALUES "
LINK_WIDTH = 7
_RANK_HEAD = "INSERT INTO rank_samples (ts, run_id, rank, pid, cpu_pct) VALUES "
RANK_WIDTH = 5
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


def open_sample_writer(db_path: str | Path) -> sqlite3.Connection:
    """A connection of our own on a migrated database, in WAL mode."""
    from pkb_tui.store.store import Store, connect, retry_busy

    Store(db_path, recover=False).close()  # creates / migrates the schema if needed
    conn = connect(db_path)
    retry_busy(lambda: conn.execute("PRAGMA journal_mode = WAL"))
    conn.execute("PRAGMA synchronous = NORMAL")
    return conn


def insert_samples(conn: sqlite3.Connection, sample_values: list, link_values: list, rank_values: list) -> None:
    """Insert flat rows (SAMPLE_WIDTH / LINK_WIDTH / RANK_WIDTH values each) in one transaction."""
    begin_immediate(conn)
    try:
        insert_sample_rows(conn, sample_values, link_values, rank_values)
    except BaseException:
        conn.execute("ROLLBACK")
        raise
    conn.execute("COMMIT")


def insert_sample_rows(conn: sqlite3.Connection, sample_values: list, link_values: list, rank_values: list) -> None:
    """insert_samples inside the caller's transaction."""
    if sample_values:
        _insert_many(conn, _SAMPLE_HEAD, SAMPLE_WIDTH, sample_values)
    if link_values:
        _insert_many(conn, _LINK_HEAD, LINK_WIDTH, link_values)
    if rank_values:
        _insert_many(conn, _RANK_HEAD, RANK_WIDTH, rank_values)


def insert_run_samples(conn: sqlite3.Connection, run_id: int, samples: list[dict]) -> int:
    """A run's samples as a recovery file holds them (GpuSample fields, links and ranks as lists of
    dicts), inside the caller's transaction; a sample whose (node, gpu, ts) the run already has is left
    out, so importing a file twice, or a file whose first samples did reach the database, adds
    each sample once. Returns the samples added."""
    have = {tuple(row) for row in conn.execute("SELECT node, gpu, ts FROM samples WHERE run_id = ?", (run_id,))}
    values: list = []
    link_values: list = []
    rank_values: list = []
    added = 0
    for sample in samples:
        node = sample.get("node")
        key = (node, sample["gpu"], sample["ts"])
        if key in have:
            continue
        have.add(key)
        added += 1
        # host_id None: the run's host (a host id of the lost database means nothing here)
        values += [sample["ts"], None, node, run_id, sample["gpu"], *(sample.get(c) for c in SAMPLE_COLUMNS)]
        for link in sample.get("links") or []:
            link_values += [sample["ts"], node, run_id, sample["gpu"], link["link"], link.get("tx_bytes_per_s"),
                            link.get("rx_bytes_per_s")]
        for rank in sample.get("ranks") or []:
            rank_values += [sample["ts"], run_id, rank["rank"], rank.get("pid"), rank.get("cpu_pct")]
    insert_sample_rows(conn, values, link_values, rank_values)
    return added


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
    conn: sqlite3.Connection = conn_or_path if isinstance(conn_or_path, sqlite3.Connection) else open_sample_writer(conn_or_path)
    cutoff = math.floor((time.time() if now is None else now) - raw_keep_s)
    averages = ", ".join(f"AVG({c})" for c in SAMPLE_COLUMNS)
    window = "resolution = 'raw' AND ts >= ? AND ts < ?"
    fold_samples = (
        f"INSERT INTO samples (ts, host_id, node, run_id, gpu, resolution, {', '.join(SAMPLE_COLUMNS)}) "
        f"SELECT AVG(ts), host_id, node, run_id, gpu, '1s', {averages} FROM samples "
        f"WHERE {window} GROUP BY host_id, node, run_id, gpu, CAST(ts AS INTEGER)"
    )
    fold_links = (
        "INSERT INTO link_samples (ts, node, run_id, gpu, link, resolution, tx_bytes_per_s, rx_bytes_per_s) "
        "SELECT AVG(ts), node, run_id, gpu, link, '1s', AVG(tx_bytes_per_s), AVG(rx_bytes_per_s) FROM link_samples "
        f"WHERE {window} GROUP BY node, run_id, gpu, link, CAST(ts AS INTEGER)"
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
                begin_immediate(conn)
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
