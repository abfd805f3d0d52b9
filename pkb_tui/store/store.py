"""runs.db: one writer per process (the launcher; the collectors' sink has its own connection),
several processes on one file (two batches, the dashboard and a CLI).

WAL mode, so the TUI reads while a run writes. Every write is its own short BEGIN IMMEDIATE
transaction, retried where SQLite answers "locked" without waiting (retry_busy), so a launcher
killed at any point (kill -9 included) leaves a readable database and two writers wait for each
other instead of failing; runs it left 'running' are marked 'interrupted' the next time any Store
opens the file and finds their launcher gone. The batches table says which batches run now
(register_batch, other_live_batches); store/recovery.py keeps a batch's writes when the file goes.
"""

from __future__ import annotations

import hashlib
import json
import os
import socket
import sqlite3
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar

from pkb_tui.errors import EXIT_HARNESS, PkbError
from pkb_tui.store.faster import floor_to_apply, row_counts_as_faster
from pkb_tui.store.faster import within_noise as _within_noise
from pkb_tui.store.generate import GenerateStore
from pkb_tui.store.schema import MIGRATIONS, SCHEMA_VERSION, host_pair
from pkb_tui.store.statuses import FINISHED_STATUSES, UNFINISHED_STATUSES, sql_list

DEFAULT_DB = "runs.db"
T = TypeVar("T")


def default_db_path() -> Path:
    return Path(os.environ.get("PKB_DB") or DEFAULT_DB)


def damaged_database(path: Path | str, exc: BaseException) -> str:
    """The one sentence for a database SQLite cannot read (header or pages)."""
    return (f"The database {path} is damaged ({exc}); move it aside (pkb-tui then starts a new one) "
            "or restore it from a copy.")


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


# ---------------------------------------------------------------------- writes on a connection
# Each takes a connection inside a transaction, so a Store method and `pkb-tui import` (one
# transaction for a whole recovery file) write the same rows the same way.
def run_fields(fields: dict[str, Any]) -> dict[str, Any]:
    """A runs row as create_run stores it: creation time and launcher filled in, request as JSON."""
    fields = dict(fields)
    fields.setdefault("created_at", time.time())
    fields.setdefault("launcher_pid", os.getpid())
    fields.setdefault("launcher_host", socket.gethostname())
    for key in ("request", "notes"):
        if fields.get(key) is not None and not isinstance(fields[key], str):
            fields[key] = json.dumps(fields[key], sort_keys=key == "request")
    return fields


def insert_row(conn: sqlite3.Connection, table: str, fields: dict[str, Any]) -> int:
    cols = ", ".join(fields)
    marks = ", ".join("?" for _ in fields)
    cur = conn.execute(f"INSERT INTO {table} ({cols}) VALUES ({marks})", tuple(fields.values()))
    return int(cur.lastrowid or 0)  # an INSERT always sets it


def insert_run(conn: sqlite3.Connection, fields: dict[str, Any]) -> int:
    return insert_row(conn, "runs", fields)


def update_run_row(conn: sqlite3.Connection, run_id: int, fields: dict[str, Any]) -> None:
    if not fields:
        return
    if "notes" in fields and not isinstance(fields["notes"], (str, type(None))):
        fields = {**fields, "notes": json.dumps(fields["notes"])}
    sets = ", ".join(f"{k}=?" for k in fields)
    conn.execute(f"UPDATE runs SET {sets} WHERE id=?", (*fields.values(), run_id))


def host_fingerprint(info: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    fields = {k: info.get(k) for k in (
        "hostname", "gpu_model", "gpu_count", "driver_version", "cuda_version", "torch_version",
        "nccl_version", "python_version",
    )}
    fields["gpu_count"] = fields["gpu_count"] or 0
    fields["topology"] = json.dumps(info.get("topology")) if info.get("topology") is not None else None
    return hashlib.sha256(json.dumps(fields, sort_keys=True).encode()).hexdigest()[:16], fields


def upsert_host_row(conn: sqlite3.Connection, info: dict[str, Any]) -> int:
    now = time.time()
    fingerprint, fields = host_fingerprint(info)
    row = conn.execute("SELECT id FROM hosts WHERE fingerprint=?", (fingerprint,)).fetchone()
    if row:
        conn.execute("UPDATE hosts SET last_seen_at=? WHERE id=?", (now, row["id"]))
        return int(row["id"])
    return insert_row(conn, "hosts", {"fingerprint": fingerprint, **fields, "first_seen_at": now, "last_seen_at": now})


def source_hash(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def insert_source(conn: sqlite3.Connection, path: str, text: str) -> str:
    digest = source_hash(text)
    conn.execute(
        "INSERT OR IGNORE INTO sources (hash, path, text, first_seen_at) VALUES (?, ?, ?, ?)",
        (digest, path, text, time.time()),
    )
    return digest


def upsert_result(conn: sqlite3.Connection, run_id: int, variant: str, fields: dict[str, Any]) -> None:
    fields = {**fields, "run_id": run_id, "variant": variant}
    if isinstance(fields.get("traffic"), dict):
        fields["traffic"] = json.dumps(fields["traffic"])
    if isinstance(fields.get("node_wire"), list):
        fields["node_wire"] = json.dumps(fields["node_wire"])
    cols = ", ".join(fields)
    marks = ", ".join("?" for _ in fields)
    updates = ", ".join(f"{k}=excluded.{k}" for k in fields if k not in ("run_id", "variant"))
    conn.execute(
        f"INSERT INTO results ({cols}) VALUES ({marks}) ON CONFLICT(run_id, variant) DO UPDATE SET {updates}",
        tuple(fields.values()),
    )


def upsert_trials(conn: sqlite3.Connection, run_id: int, trials: Iterable[dict[str, Any]]) -> None:
    rows = []
    for trial in trials:
        detail = trial.get("detail")
        rows.append((
            run_id, trial["trial"], int(bool(trial["correct"])), trial.get("max_abs_error"),
            trial.get("max_rel_error"), trial.get("worst_rank"), trial.get("message"),
            json.dumps(detail) if detail is not None and not isinstance(detail, str) else detail,
        ))
    conn.executemany(
        "INSERT OR REPLACE INTO trials (run_id, trial, correct, max_abs_error, max_rel_error, worst_rank, "
        "message, detail) VALUES (?, ?, ?, ?, ?, ?, ?, ?)", rows,
    )


def insert_kernels(conn: sqlite3.Connection, run_id: int, kernels: Iterable[dict[str, Any]]) -> None:
    rows = [
        (run_id, k["variant"], k["rank"], k["name"], k["category"], k["calls"], k["total_us"],
         k["mean_us"], k.get("share_fraction"))
        for k in kernels
    ]
    conn.executemany(
        "INSERT INTO kernels (run_id, variant, rank, name, category, calls, total_us, mean_us, share_fraction) "
        "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)", rows,
    )


def process_start_ticks(pid: int) -> int | None:
    """When a process started (clock ticks since boot, /proc/<pid>/stat field 22); None when gone.
    With the pid it names one process for good: a pid reused later has another start."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return int(f.read().rsplit(") ", 1)[1].split()[19])
    except (OSError, IndexError, ValueError):
        return None


class _Connection(sqlite3.Connection):
    """A connection whose damaged-file errors are the one sentence of damaged_database: damage past
    the header shows only when a statement reads a damaged page, anywhere in the program."""

    db_path: Path

    def execute(self, sql: str, parameters: Any = (), /) -> sqlite3.Cursor:  # type: ignore[override]
        try:
            return super().execute(sql, parameters)
        except sqlite3.DatabaseError as exc:
            raise _damage_or(exc, self.db_path) from exc

    def executemany(self, sql: str, parameters: Any, /) -> sqlite3.Cursor:  # type: ignore[override]
        try:
            return super().executemany(sql, parameters)
        except sqlite3.DatabaseError as exc:
            raise _damage_or(exc, self.db_path) from exc


def _damage_or(exc: sqlite3.DatabaseError, path: Path) -> Exception:
    # Only the plain DatabaseError (malformed image, not a database); IntegrityError and the other
    # subclasses are the caller's to handle.
    if type(exc) is sqlite3.DatabaseError and ("malformed" in str(exc) or "not a database" in str(exc)):
        return PkbError(damaged_database(path, exc), exit_code=EXIT_HARNESS)
    return exc


BUSY_RETRIES = 6  # after the busy timeout itself: 0.05 s doubling, ~3 s more in all


def _is_busy(exc: sqlite3.OperationalError) -> bool:
    text = str(exc)
    return "database is locked" in text or "database is busy" in text or "database table is locked" in text


def retry_busy(attempt: Callable[[], T]) -> T:
    """``attempt()`` again, after a short doubling sleep, while SQLite says the database is locked.

    The busy timeout covers most waits; a few steps answer SQLITE_BUSY at once without calling the
    busy handler (switching a new file to WAL, WAL recovery after a crash), and a second writer on
    the same file can meet them. ``attempt`` must be safe to repeat (a BEGIN, a pragma)."""
    for delay_index in range(BUSY_RETRIES + 1):
        try:
            return attempt()
        except sqlite3.OperationalError as exc:
            if not _is_busy(exc) or delay_index == BUSY_RETRIES:
                raise
            time.sleep(0.05 * 2 ** delay_index)
    raise AssertionError("unreachable")


def begin_immediate(conn: sqlite3.Connection) -> None:
    """Start a write transaction: the write lock is taken here, so nothing later in it can meet
    another writer (a deferred BEGIN that later writes can fail with SQLITE_BUSY at once in WAL)."""
    retry_busy(lambda: conn.execute("BEGIN IMMEDIATE"))


def connect(path: Path | str, *, readonly: bool = False, timeout_s: float = 30.0) -> _Connection:
    """Open the database with the settings every connection of the project uses."""
    path = Path(path)
    conn: _Connection
    if readonly:
        conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=timeout_s, check_same_thread=False,
                               factory=_Connection)
    else:
        conn = sqlite3.connect(path, timeout=timeout_s, check_same_thread=False, isolation_level=None,
                               factory=_Connection)
    conn.db_path = path
    conn.row_factory = sqlite3.Row
    conn.execute(f"PRAGMA busy_timeout = {int(timeout_s * 1000)}")
    conn.execute("PRAGMA foreign_keys = ON")
    return conn


def _run_filters(prefix: str, **filters: Any) -> tuple[list[str], list[Any]]:
    """WHERE clauses and arguments for the history filters (columns of runs, given a table prefix)."""
    where: list[str] = []
    args: list[Any] = []
    for column, name in (("task_id", "task"), ("model", "model"), ("status", "status"), ("host_id", "host_id")):
        if filters.get(name) is not None:
            where.append(f"{prefix}{column} = ?")
            args.append(filters[name])
    if filters.get("since") is not None:
        where.append(f"{prefix}created_at >= ?")
        args.append(filters["since"])
    if filters.get("until") is not None:
        where.append(f"{prefix}created_at < ?")
        args.append(filters["until"])
    return where, args


SPEEDUP_BASES = ("eager", "graph")  # which timing method the speedup and the leaderboard use


def check_basis(basis: str | None) -> None:
    if basis is not None and basis not in SPEEDUP_BASES:
        raise PkbError(f"Unknown speedup basis {basis!r}; choose one of {', '.join(SPEEDUP_BASES)}.")


def _with_detail(row: sqlite3.Row | None) -> dict[str, Any] | None:
    if row is None:
        return None
    out = dict(row)
    out["detail"] = json.loads(out["detail"]) if out.get("detail") else None
    return out


def has_basis(result: dict[str, Any] | None, basis: str | None, prefix: str = "") -> bool:
    """Whether a results row (``prefix``: a runs() row's baseline_/candidate_ columns) holds
    ``basis``'s figure. A call that could not be captured has no graph figure: its run fell back to
    eager when it was made (launcher), and every view of it does the same rather than show nothing."""
    if result is None or basis is None:
        return False
    return (result.get("timing_method") or "eager") == basis or result.get(f"{prefix}{basis}_median_us") is not None


def result_with_basis(result: dict[str, Any] | None, basis: str | None) -> dict[str, Any] | None:
    """A results row as read with ``basis``'s figures (eager or graph) in median_us, p10_us, p90_us,
    speedup, speedup_low/high and within_noise, the roofline fraction and bus bandwidth rescaled to
    that median. None, the row's own timing_method or a basis the row has no figure for (graph of
    a call that could not be captured): unchanged, and timing_method says which figure it is. Rows
    from before both figures were stored (no eager_median_us) count as eager: that is what they
    measured."""
    if result is None or basis is None or (result.get("timing_method") or "eager") == basis:
        return result
    if not has_basis(result, basis):
        return result
    out = dict(result)
    old_median = result.get("median_us")
    median = result.get(f"{basis}_median_us")
    out.update(median_us=median, p10_us=result.get(f"{basis}_p10_us"), p90_us=result.get(f"{basis}_p90_us"),
               mean_us=None, min_us=None, max_us=None, timing_method=basis)
    out.update(speedup=result.get(f"speedup_{basis}"), speedup_low=result.get(f"speedup_{basis}_low"),
               speedup_high=result.get(f"speedup_{basis}_high"))  # all None on the baseline's row
    out["within_noise"] = _within_noise(out["speedup_low"], out["speedup_high"], floor_to_apply(result))
    floor = result.get("roofline_floor_us")
    out["roofline_fraction"] = floor / median if (floor is not None and median) else None
    bus = result.get("bus_bandwidth_gbps")
    out["bus_bandwidth_gbps"] = bus * old_median / median if (bus is not None and old_median and median) else None
    return out


def _run_row_with_basis(row: dict[str, Any], basis: str | None) -> dict[str, Any]:
    """A runs() row with ``basis``'s headline figures (see result_with_basis)."""
    if basis is None or (row.get("timing_method") or "eager") == basis:
        return row
    if not (has_basis(row, basis, "candidate_") and (row.get("baseline_median_us") is None or has_basis(row, basis, "baseline_"))):
        return row  # no figure of that method (not capturable): the run's own, as the launcher chose
    row["baseline_median_us"] = row.get(f"baseline_{basis}_median_us")
    row["candidate_median_us"] = row.get(f"candidate_{basis}_median_us")
    row["speedup"] = row.get(f"speedup_{basis}")
    row["speedup_low"], row["speedup_high"] = row.get(f"speedup_{basis}_low"), row.get(f"speedup_{basis}_high")
    row["within_noise"] = _within_noise(row["speedup_low"], row["speedup_high"], floor_to_apply(row))
    row["candidate_roofline_fraction"] = None  # rescaled only in run(): this row lacks the floor
    row["timing_method"] = basis
    return row


class Store(GenerateStore):
    """Everything the project reads from and writes to runs.db."""

    def __init__(self, path: Path | str | None = None, *, recover: bool = True) -> None:
        self.path = Path(path) if path is not None else default_db_path()
        self._lock = threading.RLock()
        self.conn = self._open()
        if recover:
            try:
                self.recover_interrupted()  # the first read of a table: damage past the header shows here
            except PkbError:
                self.conn.close()
                raise

    # ----------------------------------------------------------------- opening and migrations
    def _open(self) -> sqlite3.Connection:
        parent = self.path.parent if str(self.path.parent) else Path(".")
        if not parent.exists():
            raise PkbError(f"Cannot create database {self.path}: folder {parent} does not exist; create it or pass another --db.")
        if self.path.exists() and not os.access(self.path, os.W_OK):
            raise PkbError(f"Database {self.path} is not writable; fix its permissions or pass another --db.")
        if not self.path.exists() and not os.access(parent, os.W_OK):
            raise PkbError(f"Cannot create database {self.path}: folder {parent} is not writable; pass another --db.")
        try:
            conn = connect(self.path)
            # Switching a new file to WAL takes a lock SQLite does not wait for (no busy handler):
            # two launchers creating one database at once would see "database is locked".
            retry_busy(lambda: conn.execute("PRAGMA journal_mode = WAL"))
            conn.execute("PRAGMA synchronous = NORMAL")
            version = conn.execute("PRAGMA user_version").fetchone()[0]
        except (sqlite3.DatabaseError, PkbError) as exc:
            # A file that is SQLite but damaged past its header is the "damaged" sentence (exit 3);
            # one that is not SQLite at all (or not ours) is a usage error (exit 2).
            if "malformed" in str(exc.__cause__ or exc):
                raise PkbError(damaged_database(self.path, exc.__cause__ or exc), exit_code=EXIT_HARNESS) from exc
            raise PkbError(
                f"{self.path} is not a pkb-tui database or is corrupt ({exc.__cause__ or exc}); "
                "move it aside or pass another --db."
            ) from exc
        if version > SCHEMA_VERSION:
            raise PkbError(
                f"{self.path} has schema version {version}, newer than this pkb-tui knows ({SCHEMA_VERSION}); upgrade pkb-tui."
            )
        while version < SCHEMA_VERSION:
            index = version
            try:
                begin_immediate(conn)
                # Another process may have migrated while this one waited for the lock: the
                # version read inside the write lock is the one that counts.
                version = conn.execute("PRAGMA user_version").fetchone()[0]
                if version > index:
                    conn.execute("COMMIT")
                    continue
                for statement in MIGRATIONS[index]:
                    conn.execute(statement)
                conn.execute(f"PRAGMA user_version = {index + 1}")
                conn.execute("COMMIT")
                version = index + 1
            except (sqlite3.DatabaseError, PkbError) as exc:
                try:
                    conn.execute("ROLLBACK")
                except sqlite3.DatabaseError:
                    pass
                if (isinstance(exc, PkbError) and exc.exit_code == EXIT_HARNESS) or "malformed" in str(exc):
                    raise PkbError(damaged_database(self.path, exc), exit_code=EXIT_HARNESS) from exc
                raise PkbError(f"Could not migrate {self.path} to schema {index + 1}: {exc}.") from exc
        return conn

    def close(self) -> None:
        self.conn.close()

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @contextmanager
    def transaction(self) -> Iterator[sqlite3.Connection]:
        with self._lock:
            begin_immediate(self.conn)
            try:
                yield self.conn
            except BaseException:
                self.conn.execute("ROLLBACK")
                raise
            self.conn.execute("COMMIT")

    def recover_interrupted(self) -> int:
        """Runs left unfinished by a launcher that no longer exists: 'running' ones become
        interrupted, 'queued' ones (never started) cancelled; its row in batches goes."""
        self.other_live_batches()  # removes the stale rows as it looks
        here = socket.gethostname()
        rows = self.conn.execute(
            f"SELECT id, status, launcher_pid, launcher_host FROM runs WHERE status IN {sql_list(UNFINISHED_STATUSES)}"
        ).fetchall()
        dead = [
            row for row in rows
            if row["launcher_host"] == here and (row["launcher_pid"] is None or not _pid_alive(row["launcher_pid"]))
        ]
        if dead:
            now = time.time()
            with self.transaction() as conn:
                conn.executemany(
                    "UPDATE runs SET status=?, finished_at=COALESCE(finished_at, ?), "
                    "status_detail=COALESCE(status_detail, ?) WHERE id=?",
                    [
                        ("interrupted", now, "the launcher stopped before the run finished", row["id"])
                        if row["status"] == "running" else
                        ("cancelled", now, "the launcher stopped before the run started", row["id"])
                        for row in dead
                    ],
                )
        return len(dead)

    def delete_runs(self, run_ids: Iterable[int]) -> list[int]:
        """Delete runs with their results, trials, kernels and telemetry samples; returns the ids
        that existed. A run still going (queued or running) is refused: its launcher writes to it."""
        ids = sorted(set(int(i) for i in run_ids))
        if not ids:
            return []
        marks = ", ".join("?" for _ in ids)
        rows = self.conn.execute(f"SELECT id, status FROM runs WHERE id IN ({marks})", ids).fetchall()
        busy = [row["id"] for row in rows if row["status"] in UNFINISHED_STATUSES]
        if busy:
            raise PkbError(
                f"Run {', '.join(map(str, busy))} is still queued or running; cancel it before deleting it."
            )
        found = [int(row["id"]) for row in rows]
        if not found:
            return []
        marks = ", ".join("?" for _ in found)
        with self.transaction() as conn:
            # results, trials and kernels go with the run (ON DELETE CASCADE); the samples tables
            # keep run_id without a foreign key (monitor rows have none), so they are cleared here.
            for table in ("samples", "link_samples", "rank_samples"):
                conn.execute(f"DELETE FROM {table} WHERE run_id IN ({marks})", found)
            conn.execute(f"DELETE FROM runs WHERE id IN ({marks})", found)
        return found

    # ----------------------------------------------------------------- writes
    def upsert_host(self, info: dict[str, Any]) -> int:
        with self.transaction() as conn:
            return upsert_host_row(conn, info)

    def add_source(self, path: str, text: str) -> str:
        with self.transaction() as conn:
            return insert_source(conn, path, text)

    def create_run(self, fields: dict[str, Any]) -> int:
        with self.transaction() as conn:
            return insert_run(conn, run_fields(fields))

    def update_run(self, run_id: int, **fields: Any) -> None:
        with self.transaction() as conn:
            update_run_row(conn, run_id, fields)

    def add_note(self, run_ids: Iterable[int], sentence: str) -> None:
        """Append a sentence to the notes shown with each run's result."""
        with self.transaction() as conn:
            for run_id in run_ids:
                row = conn.execute("SELECT notes FROM runs WHERE id=?", (run_id,)).fetchone()
                if row is None:
                    continue
                notes = json.loads(row["notes"]) if row["notes"] else []
                notes.append(sentence)
                conn.execute("UPDATE runs SET notes=? WHERE id=?", (json.dumps(notes), run_id))

    def add_result(self, run_id: int, variant: str, fields: dict[str, Any]) -> None:
        with self.transaction() as conn:
            upsert_result(conn, run_id, variant, fields)

    def add_trials(self, run_id: int, trials: Iterable[dict[str, Any]]) -> None:
        with self.transaction() as conn:
            upsert_trials(conn, run_id, trials)

    def add_kernels(self, run_id: int, kernels: Iterable[dict[str, Any]]) -> None:
        with self.transaction() as conn:
            insert_kernels(conn, run_id, kernels)

    # ---- the batches running now on this database (several writers)
    def register_batch(self, batch_id: str, *, runs: int) -> None:
        """This process's batch is running: other batches on the file see it (other_live_batches)."""
        pid = os.getpid()
        with self.transaction() as conn:
            conn.execute(
                "INSERT OR REPLACE INTO batches (batch_id, host, pid, pid_start_ticks, started_at, runs) "
                "VALUES (?, ?, ?, ?, ?, ?)",
                (batch_id, socket.gethostname(), pid, process_start_ticks(pid), time.time(), runs),
            )

    def end_batch(self, batch_id: str) -> None:
        with self.transaction() as conn:
            conn.execute("DELETE FROM batches WHERE batch_id=?", (batch_id,))

    def other_live_batches(self, batch_id: str | None = None) -> list[dict[str, Any]]:
        """Batches on this machine, other than ``batch_id``, whose launcher still runs: batch_id,
        pid, started_at, runs. Rows of this host whose process is gone (a launcher killed with
        kill -9) or whose pid now names another process are stale: ignored and removed. Other
        hosts' rows are left alone (their liveness cannot be seen from here)."""
        here = socket.gethostname()
        rows = [dict(row) for row in self.conn.execute("SELECT * FROM batches WHERE host=? ORDER BY started_at", (here,))]
        live: list[dict[str, Any]] = []
        stale: list[dict[str, Any]] = []
        for row in rows:
            if row["batch_id"] == batch_id:
                continue
            alive = _pid_alive(row["pid"]) and (
                row["pid_start_ticks"] is None or process_start_ticks(row["pid"]) == row["pid_start_ticks"])
            (live if alive else stale).append(row)
        if stale:
            try:
                with self.transaction() as conn:
                    conn.executemany("DELETE FROM batches WHERE batch_id=?", [(row["batch_id"],) for row in stale])
            except sqlite3.OperationalError:
                pass  # a read-only look (the file made read-only): stale rows stay ignored
        return live

    def add_calibration(self, host_id: int, rows: Iterable[dict[str, Any]]) -> None:
        """Calibration rows: a bandwidth (bandwidth_gbps), a per-message latency (latency_us) or a
        noise floor (noise_floor_fraction, with the mode it was measured in); at least one figure.
        A row of a pair of hosts (the network between them) names both in host_a / host_b."""
        now = time.time()
        values = []
        for r in rows:
            figures = (r.get("bandwidth_gbps"), r.get("latency_us"), r.get("noise_floor_fraction"))
            if all(f is None for f in figures):
                raise PkbError(f"Calibration row {r.get('kind')!r} has no figure; measure it or leave it out.")
            pair = (r.get("host_a"), r.get("host_b"))
            if (pair[0] is None) != (pair[1] is None):
                raise PkbError(f"Calibration row {r.get('kind')!r} names one host of a pair; give host_a and host_b.")
            if pair[0] is not None:
                pair = host_pair(str(pair[0]), str(pair[1]))
            values.append((
                host_id, r.get("measured_at", now), r["kind"], r.get("gpu_a"), r.get("gpu_b"), r.get("size_bytes"),
                *figures, r.get("mode"), json.dumps(r.get("detail")) if r.get("detail") is not None else None, *pair,
            ))
        with self.transaction() as conn:
            conn.executemany(
                "INSERT INTO calibrations (host_id, measured_at, kind, gpu_a, gpu_b, size_bytes, bandwidth_gbps, "
                "latency_us, noise_floor_fraction, mode, detail, host_a, host_b) "
                "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)", values,
            )

    def _insert(self, table: str, fields: dict[str, Any]) -> int:
        with self.transaction() as conn:
            return insert_row(conn, table, fields)

    # ----------------------------------------------------------------- reads
    def runs(
        self, *, task: str | None = None, model: str | None = None, status: str | None = None,
        host_id: int | None = None, since: float | None = None, until: float | None = None,
        order_by: str = "id", descending: bool = True, limit: int | None = 200, offset: int = 0,
        basis: str | None = None,
    ) -> list[dict[str, Any]]:
        """Run history joined with both variants' headline figures: one dict per run. ``basis``
        (eager or graph; None: what each run picked) chooses the figures of speedup and the times."""
        check_basis(basis)
        pick = {"eager": "COALESCE({t}.{eager}, CASE WHEN COALESCE({t}.timing_method, 'eager') = 'eager' THEN {t}.{col} END)",
                "graph": "COALESCE({t}.{graph}, {t}.{col})"}.get(basis or "", "{t}.{col}")  # (has_basis)
        def picked(t: str, col: str, eager: str, graph: str) -> str:
            return pick.format(t=t, col=col, eager=eager, graph=graph)
        sortable = {
            "id": "r.id", "task": "r.task_id", "model": "r.model", "status": "r.status",
            "created": "r.created_at", "speedup": picked("c", "speedup", "speedup_eager", "speedup_graph"),
            "candidate_us": picked("c", "median_us", "eager_median_us", "graph_median_us"),
            "baseline_us": picked("b", "median_us", "eager_median_us", "graph_median_us"),
        }
        if order_by not in sortable:
            raise PkbError(f"Cannot sort runs by {order_by!r}; choose one of {', '.join(sortable)}.")
        where, args = _run_filters("r.", task=task, model=model, status=status, host_id=host_id, since=since, until=until)
        sql = (
            "SELECT r.*, h.hostname AS hostname, h.gpu_model AS gpu_model, "
            "b.median_us AS baseline_median_us, b.correct AS baseline_correct, "
            "c.median_us AS candidate_median_us, c.correct AS candidate_correct, c.speedup AS speedup, "
            "c.roofline_fraction AS candidate_roofline_fraction, c.trials_passed AS trials_passed, "
            "c.trials_total AS trials_total, c.max_abs_error AS max_abs_error, "
            "c.speedup_low AS speedup_low, c.speedup_high AS speedup_high, c.within_noise AS within_noise, "
            "c.timing_method AS timing_method, c.rounds AS rounds, c.noise_floor_fraction AS noise_floor_fraction, "
            "c.interval_floor AS interval_floor, "
            "c.speedup_eager AS speedup_eager, c.speedup_eager_low AS speedup_eager_low, "
            "c.speedup_eager_high AS speedup_eager_high, c.speedup_graph AS speedup_graph, "
            "c.speedup_graph_low AS speedup_graph_low, c.speedup_graph_high AS speedup_graph_high, "
            "b.eager_median_us AS baseline_eager_median_us, b.graph_median_us AS baseline_graph_median_us, "
            "c.eager_median_us AS candidate_eager_median_us, c.graph_median_us AS candidate_graph_median_us, "
            "c.graph_note AS graph_note "
            "FROM runs r LEFT JOIN hosts h ON h.id = r.host_id "
            "LEFT JOIN results b ON b.run_id = r.id AND b.variant = 'baseline' "
            "LEFT JOIN results c ON c.run_id = r.id AND c.variant = 'candidate'"
        )
        if where:
            sql += " WHERE " + " AND ".join(where)
        sql += f" ORDER BY {sortable[order_by]} {'DESC' if descending else 'ASC'}, r.id DESC"
        if limit is not None:
            sql += " LIMIT ? OFFSET ?"
            args += [limit, offset]
        return [_run_row_with_basis(dict(row), basis) for row in self.conn.execute(sql, args)]

    def count_runs(self) -> int:
        return int(self.conn.execute("SELECT COUNT(*) FROM runs").fetchone()[0])

    def run(self, run_id: int, *, basis: str | None = None) -> dict[str, Any]:
        """One run with its results (by variant), trial_results, kernels and host; ``basis`` as in runs()."""
        check_basis(basis)
        row = self.conn.execute("SELECT * FROM runs WHERE id=?", (run_id,)).fetchone()
        if row is None:
            raise PkbError(f"There is no run {run_id} in {self.path}; `pkb-tui runs` lists them.")
        run = dict(row)
        for key in ("request", "notes"):
            if run.get(key):
                run[key] = json.loads(run[key])
        results = [dict(result) for result in self.conn.execute("SELECT * FROM results WHERE run_id=?", (run_id,))]
        if not all(has_basis(result, basis) for result in results):
            basis = None  # both variants read with one method: the run's own where either lacks basis's figure
        run["results"] = {}
        for result in results:
            if result.get("traffic"):
                result["traffic"] = json.loads(result["traffic"])
            if result.get("node_wire"):
                result["node_wire"] = json.loads(result["node_wire"])
            run["results"][result["variant"]] = result_with_basis(result, basis)
        run["trial_results"] = []  # "trials" stays the count asked for
        for trial in self.conn.execute("SELECT * FROM trials WHERE run_id=? ORDER BY trial", (run_id,)):
            trial = dict(trial)
            if trial.get("detail"):
                trial["detail"] = json.loads(trial["detail"])
            run["trial_results"].append(trial)
        run["kernels"] = [
            dict(k) for k in self.conn.execute(
                "SELECT * FROM kernels WHERE run_id=? ORDER BY variant, total_us DESC", (run_id,)
            )
        ]
        host = self.conn.execute("SELECT * FROM hosts WHERE id=?", (run["host_id"],)).fetchone() if run["host_id"] else None
        run["host"] = dict(host) if host else None
        run["rank_cpu"] = self.run_rank_cpu(run_id)
        run["node_telemetry"] = self.run_node_telemetry(run_id)
        return run

    def run_node_telemetry(self, run_id: int) -> list[dict[str, Any]]:
        """Per node of a multi-node run (samples.node set): its host, how many samples it sent while
        the run was current, the host's mean / peak CPU and mean NIC rates (to other nodes), and
        its GPUs' mean NVLink and PCIe rates (None where not measured: a CPU node, a host without
        NIC counters). Empty for a one-node run."""
        return [dict(row) for row in self.conn.execute(
            "SELECT s.node, h.hostname, COUNT(*) AS samples, "
            "AVG(CASE WHEN s.gpu = -1 THEN s.cpu_pct END) AS host_cpu_mean_pct, "
            "MAX(CASE WHEN s.gpu = -1 THEN s.cpu_pct END) AS host_cpu_max_pct, "
            "AVG(CASE WHEN s.gpu >= 0 THEN s.nvlink_tx_bytes_per_s END) AS nvlink_tx_mean_bytes_per_s, "
            "AVG(CASE WHEN s.gpu >= 0 THEN s.pcie_tx_bytes_per_s END) AS pcie_tx_mean_bytes_per_s, "
            "AVG(CASE WHEN s.gpu = -1 THEN s.nic_tx_bytes_per_s END) AS nic_tx_mean_bytes_per_s, "
            "AVG(CASE WHEN s.gpu = -1 THEN s.nic_rx_bytes_per_s END) AS nic_rx_mean_bytes_per_s, "
            "MIN(s.ts) AS first_ts, MAX(s.ts) AS last_ts "
            # the head's own samples carry no host id (its sink starts before the ranks say where
            # they run): they are on the run's host
            "FROM samples s LEFT JOIN hosts h ON h.id = COALESCE(s.host_id, "
            "(SELECT host_id FROM runs WHERE id = ?)) "
            "WHERE s.run_id = ? AND s.node IS NOT NULL GROUP BY s.node ORDER BY s.node",
            (run_id, run_id),
        )]

    def run_rank_cpu(self, run_id: int) -> list[dict[str, Any]]:
        """CPU use of each rank process while the run was current (100 = one full core): mean and
        peak over its samples, NULLs (no figure yet) left out. Empty where nothing was sampled."""
        return [dict(row) for row in self.conn.execute(
            "SELECT rank, pid, AVG(cpu_pct) AS mean_pct, MAX(cpu_pct) AS max_pct, COUNT(cpu_pct) AS samples "
            "FROM rank_samples WHERE run_id = ? GROUP BY rank, pid HAVING COUNT(cpu_pct) > 0 ORDER BY rank",
            (run_id,),
        )]

    def source(self, digest: str) -> dict[str, Any] | None:
        row = self.conn.execute("SELECT * FROM sources WHERE hash=?", (digest,)).fetchone()
        return dict(row) if row else None

    def latest_calibration(self, host_id: int) -> dict[str, float]:
        """The newest figure per calibration kind (and GPU pair) for a host, in GB/s."""
        rows = self.conn.execute(
            "SELECT kind, gpu_a, gpu_b, bandwidth_gbps, MAX(measured_at) FROM calibrations "
            "WHERE host_id=? AND bandwidth_gbps IS NOT NULL AND host_a IS NULL GROUP BY kind, gpu_a, gpu_b", (host_id,),
        ).fetchall()
        out: dict[str, float] = {}
        for row in rows:
            key = row["kind"] if row["gpu_a"] is None else f"{row['kind']}:{row['gpu_a']}-{row['gpu_b']}"
            out[key] = row["bandwidth_gbps"]
        return out

    def latest_link_latency(self, host_id: int) -> dict[str, Any] | None:
        """The newest per-message link latency (alpha) calibrated for a host: latency_us,
        measured_at, detail; None when never measured."""
        row = self.conn.execute(
            "SELECT latency_us, measured_at, detail FROM calibrations WHERE host_id=? AND kind='link_latency' "
            "AND latency_us IS NOT NULL ORDER BY measured_at DESC, id DESC LIMIT 1", (host_id,),
        ).fetchone()
        return _with_detail(row)

    def network_pairs(self) -> dict[tuple[str, str], dict[str, Any]]:
        """The newest network calibration of every pair of hosts (`pkb-tui calibrate --network`),
        by (host_a, host_b) with host_a <= host_b: bandwidth_gbps, latency_us, size_bytes, mode,
        measured_at, detail."""
        rows = self.conn.execute(
            "SELECT c.host_a, c.host_b, c.bandwidth_gbps, c.latency_us, c.size_bytes, c.mode, c.measured_at, c.detail "
            "FROM calibrations c WHERE c.kind='network_busbw' AND c.host_a IS NOT NULL AND c.id = ("
            "SELECT d.id FROM calibrations d WHERE d.kind='network_busbw' AND d.host_a=c.host_a AND d.host_b=c.host_b "
            "ORDER BY d.measured_at DESC, d.id DESC LIMIT 1) ORDER BY c.host_a, c.host_b",
        ).fetchall()
        return {(row["host_a"], row["host_b"]): _with_detail(row) or {} for row in rows}

    def latest_noise_floor(self, host_id: int, mode: str) -> dict[str, Any] | None:
        """The newest self-check spread measured on a host in ``mode``: noise_floor_fraction
        (0.03 = self-checks read within +-3%), measured_at, mode, detail; None when never measured."""
        row = self.conn.execute(
            "SELECT noise_floor_fraction, measured_at, mode, detail FROM calibrations WHERE host_id=? "
            "AND kind='noise_floor' AND mode=? AND noise_floor_fraction IS NOT NULL ORDER BY measured_at DESC, id DESC "
            "LIMIT 1", (host_id, mode),
        ).fetchone()
        return _with_detail(row)

    def leaderboard(self, *, task_ids: Iterable[str] | None = None, basis: str = "eager") -> list[dict[str, Any]]:
        """Per model over the latest finished run (FINISHED_STATUSES) of each task: correct, fast_1, fast_1.5, geomean speedup.

        fast_p counts tasks whose candidate is correct and whose speedup's confidence interval,
        widened by the host's noise floor, lies above p (store.faster.counts_as_faster): a ratio
        above p that the timing noise could explain is not counted (ParallelKernelBench's fast_p
        counts the point). Runs from before intervals were
        measured are judged by their point. The geometric mean runs over correct tasks with a
        speedup. ``basis``: which timing method's speedup (eager or graph); a task without a graph
        figure (not capturable) is read with its eager one under graph, as its run was, and counted
        in ``read_eager`` so that the board can say how many.
        """
        check_basis(basis)
        sql = (
            "SELECT r.model, r.task_id, c.* FROM runs r "
            f"JOIN (SELECT model, task_id, MAX(id) AS id FROM runs WHERE status IN {sql_list(FINISHED_STATUSES)} "
            "      GROUP BY model, task_id) latest ON latest.id = r.id "
            "LEFT JOIN results c ON c.run_id = r.id AND c.variant = 'candidate'"
        )
        wanted = set(task_ids) if task_ids is not None else None
        board: dict[str, dict[str, Any]] = {}
        import math

        for row in self.conn.execute(sql):
            if wanted is not None and row["task_id"] not in wanted:
                continue
            if row["model"].startswith("gen:"):
                continue  # generated candidates: ranked per endpoint (pkb_tui.generate.report), not per sample
            entry = board.setdefault(row["model"], {
                "model": row["model"], "tasks": 0, "correct": 0, "fast_1": 0, "fast_1_5": 0, "read_eager": 0, "_logs": [],
            })
            entry["tasks"] += 1
            if row["correct"]:
                entry["correct"] += 1
                result = result_with_basis(dict(row), basis) or {}
                entry["read_eager"] += basis == "graph" and (result.get("timing_method") or "eager") == "eager"
                speedup = result["speedup"]
                if speedup is not None and speedup > 0:
                    entry["_logs"].append(math.log(speedup))
                entry["fast_1"] += row_counts_as_faster(result, 1.0)
                entry["fast_1_5"] += row_counts_as_faster(result, 1.5)
        out = []
        for entry in board.values():
            logs = entry.pop("_logs")
            entry["geomean_speedup"] = math.exp(sum(logs) / len(logs)) if logs else None
            entry["basis"] = basis
            out.append(entry)
        return sorted(out, key=lambda e: (-e["correct"], -e["fast_1"], e["model"]))

    # ---- reads for the dashboard
    def count_runs_where(
        self, *, task: str | None = None, model: str | None = None, status: str | None = None,
        host_id: int | None = None, since: float | None = None, until: float | None = None,
    ) -> int:
        """How many runs the same filters as runs() match (for "showing 500 of 10,000")."""
        where, args = _run_filters("", task=task, model=model, status=status, host_id=host_id, since=since, until=until)
        sql = "SELECT COUNT(*) FROM runs" + (" WHERE " + " AND ".join(where) if where else "")
        return int(self.conn.execute(sql, args).fetchone()[0])

    def run_values(self, column: str) -> list[str]:
        """The distinct tasks, models or statuses that runs hold, sorted (filter choices)."""
        columns = {"task": "task_id", "model": "model", "status": "status"}
        if column not in columns:
            raise PkbError(f"Cannot list run values of {column!r}; choose one of {', '.join(columns)}.")
        name = columns[column]
        return [row[0] for row in self.conn.execute(f"SELECT DISTINCT {name} FROM runs ORDER BY {name}")]

    def hosts(self) -> list[dict[str, Any]]:
        return [dict(row) for row in self.conn.execute(
            "SELECT id, hostname, gpu_model, gpu_count, last_seen_at FROM hosts ORDER BY hostname, id"
        )]

    def latest_run_per_task(self) -> dict[str, dict[str, Any]]:
        """task id -> its newest finished run (any model): id, model, status, candidate correct, speedup."""
        sql = (
            "SELECT r.task_id, r.id, r.model, r.status, c.correct, c.speedup FROM runs r "
            f"JOIN (SELECT task_id, MAX(id) AS id FROM runs WHERE status IN {sql_list(FINISHED_STATUSES)} "
            "      GROUP BY task_id) latest ON latest.id = r.id "
            "LEFT JOIN results c ON c.run_id = r.id AND c.variant = 'candidate'"
        )
        return {row["task_id"]: dict(row) for row in self.conn.execute(sql)}

    def run_samples(self, run_id: int, *, limit: int = 20_000) -> list[dict[str, Any]]:
        """The telemetry samples recorded during a run, per GPU in time order (host: gpu -1)."""
        return [dict(row) for row in self.conn.execute(
            "SELECT ts, gpu, nvlink_tx_bytes_per_s, nvlink_rx_bytes_per_s, pcie_tx_bytes_per_s, "
            "pcie_rx_bytes_per_s, sm_util_pct, power_w, cpu_pct, loopback_bytes_per_s FROM samples "
            # raw and per-second (retention) rows of a run never overlap in time: take both
            "WHERE run_id = ? ORDER BY gpu, ts LIMIT ?", (run_id, limit),
        )]

    def data_version(self) -> int:
        """Changes whenever another connection (the launcher, the sample sink) commits: screens
        use it to skip reloading when nothing was written since they last looked."""
        return int(self.conn.execute("PRAGMA data_version").fetchone()[0])


def node_telemetry_line(node: dict[str, Any]) -> str:
    """One node of Store.run_node_telemetry in words, as `pkb-tui show` and the Result screen say it."""
    cpu = (f"host CPU {node['host_cpu_mean_pct']:.0f}/{node['host_cpu_max_pct']:.0f}% (mean / peak)"
           if node["host_cpu_mean_pct"] is not None else "host CPU n/a")
    nvlink = node["nvlink_tx_mean_bytes_per_s"]
    links = f", NVLink TX {nvlink / 1e9:.1f} GB/s per GPU (mean)" if nvlink is not None else ""
    nic_tx, nic_rx = node["nic_tx_mean_bytes_per_s"], node["nic_rx_mean_bytes_per_s"]
    nic = (f", NIC {nic_tx / 1e6:.1f} MB/s out / {nic_rx / 1e6:.1f} MB/s in (mean)"
           if nic_tx is not None and nic_rx is not None else ", NIC n/a")
    return f"node {node['node']} ({node['hostname'] or '?'}): {node['samples']} samples, {cpu}{links}{nic}"


def _bytes_text(value: float) -> str:
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if abs(value) >= scale:
            return f"{value / scale:.3g} {unit}"
    return f"{value:.0f} B"


def _against(measured: float, model: float | None) -> str:
    if model is None:
        return ""
    ratio = f", {measured / model:.2f}x" if model > 0 else ""
    return f" (model {_bytes_text(model)}{ratio})"


def node_wire_line(variant: str, node: dict[str, Any], *, with_note: bool = True) -> str:
    """One node's wire bytes per call for one variant (results.node_wire) in words, as `pkb-tui
    show` and the Result screen say it: its GPUs' links against the model's on-node bytes, its
    NICs against the model's off-node bytes; "n/a: why" where a counter is missing, never 0."""
    model_na = node.get("model_na")
    link = node.get("link_bytes_per_iter")
    if link is not None:
        links = f"GPU links {_bytes_text(link)}/call{_against(link, node.get('model_on_node_bytes_per_iter'))}"
    else:
        links = f"GPU links n/a: {node.get('link_na') or 'not measured'}"
    tx, rx = node.get("nic_tx_bytes_per_iter"), node.get("nic_rx_bytes_per_iter")
    if tx is not None and rx is not None:
        nic = (f"NIC out {_bytes_text(tx)}/call{_against(tx, node.get('model_off_node_send_bytes_per_iter'))}, "
               f"in {_bytes_text(rx)}/call{_against(rx, node.get('model_off_node_recv_bytes_per_iter'))}")
    else:
        nic = f"NIC n/a: {node.get('nic_na') or 'not measured'}"
    line = f"node {node.get('node')} ({node.get('host') or '?'}) {variant}: {links}; {nic}"
    if model_na:
        line += f"; model n/a: {model_na}"
    if with_note and node.get("note"):
        line += f" [{node['note']}]"
    return line


def node_wire_lines(run: dict[str, Any]) -> list[str]:
    """Every node's wire line of a run (Store.run's dict), baseline first, as `pkb-tui show` and the
    Result screen print them; a note every node shares said once at the end. Empty on one node."""
    rows = [(variant, node) for variant in ("baseline", "candidate")
            for node in (run.get("results", {}).get(variant, {}).get("node_wire") or [])]
    notes = {node.get("note") for _, node in rows}
    shared = notes.pop() if len(notes) == 1 else None
    lines = [f"wire per call, {node_wire_line(variant, node, with_note=shared is None)}" for variant, node in rows]
    if shared:
        lines.append(f"({shared})")
    return lines
