"""runs.db as a data set: `pkb-tui export` (runs, results, trials, kernels, samples to CSV, JSON lines
or Parquet), `pkb-tui query "SQL"` (read-only), and where a run's profiler traces are.

Reads go through sqlite-utils (rows as dicts, table and view names and columns for --schema) over
a read-only connection; the schema's documented views (run_results, kernel_rows: docs/database.md)
are what `runs` exports, so a file has both variants' figures on one row. Parquet needs pyarrow
(the optional extra `pkb-tui[export]`); CSV and JSON lines need nothing more.
"""

from __future__ import annotations

import csv
import json
import sqlite3
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pkb_tui.errors import PkbError

EXPORT_TABLES = ("runs", "results", "trials", "kernels", "samples")
EXPORT_FORMATS = ("csv", "jsonl", "parquet")
_CHUNK_ROWS = 50_000
PERFETTO_HINT = "open it in https://ui.perfetto.dev (Open trace file) or chrome://tracing"


@dataclass(frozen=True)
class ExportedTable:
    table: str
    path: Path
    rows: int


def open_readonly(db_path: Path | str) -> sqlite3.Connection:
    """A connection that cannot write (SQLite's read-only mode and query_only), on a database at the
    current schema (migrated first, so the views exist)."""
    from pkb_tui.store import Store
    from pkb_tui.store.store import connect

    path = Path(db_path)
    if not path.exists():
        raise PkbError(f"No database at {path}; run something first or pass --db.")
    Store(path, recover=False).close()  # migrations (views included) are the tool's own writes
    conn = connect(path, readonly=True)
    conn.execute("PRAGMA query_only = 1")
    return conn


def _database(conn: sqlite3.Connection) -> Any:
    import sqlite_utils

    return sqlite_utils.Database(conn)


# ------------------------------------------------------------------------------ query
def run_query(db_path: Path | str, sql: str, params: Iterable[Any] = ()) -> tuple[list[str], list[dict[str, Any]]]:
    """(columns, rows) of one read-only statement; a statement that would write is refused."""
    conn = open_readonly(db_path)
    try:
        cursor = conn.execute(sql, tuple(params))
        columns = [d[0] for d in cursor.description or ()]
        return columns, [dict(zip(columns, row)) for row in cursor.fetchall()]
    except sqlite3.OperationalError as exc:
        if "readonly" in str(exc) or "read-only" in str(exc):
            raise PkbError("`pkb-tui query` only reads the database; change it with sqlite3 (or sqlite-utils) "
                           "on a copy if you must.") from exc
        raise PkbError(f"The query failed: {exc}.") from exc
    except (sqlite3.ProgrammingError, sqlite3.DatabaseError) as exc:
        raise PkbError(f"The query failed: {exc} (one statement at a time).") from exc
    finally:
        conn.close()


def schema(db_path: Path | str) -> dict[str, dict[str, Any]]:
    """name -> {'kind': table|view, 'columns': {name: type}}, for `query --schema`."""
    conn = open_readonly(db_path)
    try:
        db = _database(conn)
        out: dict[str, dict[str, Any]] = {}
        for kind, names in (("table", db.table_names()), ("view", db.view_names())):
            for name in names:
                table = db[name]
                out[name] = {"kind": kind, "columns": {c.name: c.type for c in table.columns}}
        return out
    finally:
        conn.close()


# ------------------------------------------------------------------------------ export
def _run_where(filters: dict[str, Any]) -> tuple[str, list[Any]]:
    where, args = [], []
    for column, key in (("task_id", "task"), ("model", "model"), ("status", "status")):
        if filters.get(key) is not None:
            where.append(f"{column} = ?")
            args.append(filters[key])
    if filters.get("since") is not None:
        where.append("created_at >= ?")
        args.append(filters["since"])
    if filters.get("until") is not None:
        where.append("created_at < ?")
        args.append(filters["until"])
    if filters.get("run_ids"):
        where.append(f"run_id IN ({', '.join('?' * len(filters['run_ids']))})")
        args += list(filters["run_ids"])
    return (" WHERE " + " AND ".join(where)) if where else "", args


def _table_sql(table: str, run_where: str) -> str:
    """The SELECT of one exported table; every table but runs follows the runs selected."""
    selected = f"SELECT run_id FROM run_results{run_where}"
    return {
        "runs": f"SELECT * FROM run_results{run_where} ORDER BY run_id",
        "results": f"SELECT * FROM results WHERE run_id IN ({selected}) ORDER BY run_id, variant",
        "trials": f"SELECT * FROM trials WHERE run_id IN ({selected}) ORDER BY run_id, trial",
        "kernels": f"SELECT * FROM kernel_rows WHERE run_id IN ({selected}) ORDER BY run_id, variant, rank, total_us DESC",
        "samples": f"SELECT * FROM samples WHERE run_id IN ({selected}) ORDER BY run_id, ts, gpu",
    }[table]


def export(
    db_path: Path | str, out_dir: Path | str, *, tables: Iterable[str] = EXPORT_TABLES, fmt: str = "csv",
    limit: int | None = None, **filters: Any,
) -> list[ExportedTable]:
    """Write each table to out_dir/<table>.<fmt>; filters as `runs` takes them (task, model, status,
    since, until) and run_ids. Returns what was written."""
    if fmt not in EXPORT_FORMATS:
        raise PkbError(f"Unknown export format {fmt!r}; choose one of {', '.join(EXPORT_FORMATS)}.")
    tables = list(tables)
    unknown = [t for t in tables if t not in EXPORT_TABLES]
    if unknown:
        raise PkbError(f"Cannot export {', '.join(unknown)}; choose from {', '.join(EXPORT_TABLES)}.")
    if fmt == "parquet":
        _need_pyarrow()
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    where, args = _run_where(filters)
    conn = open_readonly(db_path)
    written = []
    try:
        db = _database(conn)
        for table in tables:
            sql = _table_sql(table, where)
            if limit is not None and table == "runs":
                sql += f" LIMIT {int(limit)}"
            rows = db.query(sql, args)
            path = out / f"{table}.{fmt}"
            count = {"csv": _write_csv, "jsonl": _write_jsonl, "parquet": _write_parquet}[fmt](path, rows)
            written.append(ExportedTable(table, path, count))
    finally:
        conn.close()
    return written


def _write_csv(path: Path, rows: Iterator[dict[str, Any]]) -> int:
    count = 0
    with open(path, "w", newline="") as f:
        writer = None
        for row in rows:
            if writer is None:
                writer = csv.DictWriter(f, fieldnames=list(row))
                writer.writeheader()
            writer.writerow(row)  # None is an empty cell: "not measured", never 0
            count += 1
    return count


def _write_jsonl(path: Path, rows: Iterator[dict[str, Any]]) -> int:
    count = 0
    with open(path, "w") as f:
        for row in rows:
            f.write(json.dumps(row, default=str) + "\n")
            count += 1
    return count


def _need_pyarrow() -> Any:
    try:
        import pyarrow
        import pyarrow.parquet  # noqa: F401
    except ImportError:
        raise PkbError("Parquet needs pyarrow: pip install 'pkb-tui[export]' (or pyarrow), or export --format csv/jsonl.") from None
    return pyarrow


def _arrow_type(values: list[Any]) -> Any:
    pa = _need_pyarrow()
    kinds = {type(v) for v in values if v is not None}
    if kinds <= {int, bool} and kinds:
        return pa.int64()
    if kinds <= {int, float} and kinds:
        return pa.float64()
    if kinds == {bytes}:
        return pa.binary()
    return pa.string()


def _write_parquet(path: Path, rows: Iterator[dict[str, Any]]) -> int:
    """In chunks, one schema from the first chunk (a REAL column holding 1.0 and 2 becomes float64)."""
    pa = _need_pyarrow()
    import pyarrow.parquet as pq

    writer = None
    schema = None
    count = 0
    chunk: list[dict[str, Any]] = []

    def flush() -> None:
        nonlocal writer, schema
        if not chunk:
            return
        columns = list(chunk[0])
        if schema is None:
            schema = pa.schema([(c, _arrow_type([r[c] for r in chunk])) for c in columns])
            writer = pq.ParquetWriter(str(path), schema)
        arrays = []
        for column in schema:
            values = [r[column.name] for r in chunk]
            if pa.types.is_string(column.type):
                values = [None if v is None else str(v) for v in values]
            elif pa.types.is_int64(column.type) and any(isinstance(v, float) for v in values):
                raise PkbError(f"Column {column.name} holds both integers and fractions; export it as csv or jsonl.")
            arrays.append(pa.array(values, type=column.type))
        writer.write_table(pa.Table.from_arrays(arrays, schema=schema))
        chunk.clear()

    for row in rows:
        chunk.append(row)
        count += 1
        if len(chunk) >= _CHUNK_ROWS:
            flush()
    flush()
    if writer is None:
        pq.write_table(pa.table({}), str(path))  # no rows: an empty file that still reads
    else:
        writer.close()
    return count


# ------------------------------------------------------------------------------ traces
def trace_files(trace_path: str | None) -> dict[str, str]:
    """variant -> Chrome/Perfetto trace file of a run (the worker writes one per variant, side by
    side: itemNNN.<variant>.rank0.trace.json; the run row keeps the last one written)."""
    if not trace_path:
        return {}
    path = Path(trace_path)
    out: dict[str, str] = {}
    for variant in ("baseline", "candidate"):
        for other in ("baseline", "candidate"):
            marker = f".{other}."
            if marker in path.name:
                candidate = path.with_name(path.name.replace(marker, f".{variant}."))
                if candidate.exists() or candidate == path:
                    out[variant] = str(candidate)
    if not out:
        out["trace"] = str(path)
    return out
