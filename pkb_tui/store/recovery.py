"""When runs.db goes away in the middle of a batch: nothing the batch measured is lost.

The launcher writes through a ``BatchWriter``. Before every write (and once a second while the
ranks work) it looks at the database's path: the file it opened must still be there, be the same
file (device and inode: a file moved over it is another database, even with the same name) and not
be read-only by its mode bits (looked at directly, so chmod counts even for root, whom SQLite would
let write). A write that fails (disk full, I/O error, a read-only file system) counts the same.
From then on the database is not touched again and every write goes to a recovery file
(JSON lines): the whole batch's writes so far (the database that held them may be gone), then
each one as it comes. ``pkb-tui import FILE`` writes the same rows a normal batch writes (runs,
results, trials, kernels, sources, hosts, samples) into a database, matching runs by their batch
and place in it, so importing twice changes nothing.

Format: the first line is the header ``{"recovery": "pkb-tui", "version": 1, "batch_id": ...,
"database": ..., "reason": ...}``; every other line one write: ``{"op": "source" | "host" | "run"
| "update" | "note" | "result" | "trials" | "kernels" | "samples", ...}``, runs named by ``item``
(their index in the batch), hosts by ``host`` (their fingerprint).
"""

from __future__ import annotations

import json
import os
import shlex
import socket
import sqlite3
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any, TypeVar

from collectors.sample import sample_dict
from pkb_tui.errors import EXIT_HARNESS, PkbError
from pkb_tui.store.samples import insert_run_samples
from pkb_tui.store.store import (
    Store,
    host_fingerprint,
    insert_kernels,
    insert_run,
    insert_source,
    run_fields,
    source_hash,
    update_run_row,
    upsert_host_row,
    upsert_result,
    upsert_trials,
)

RECOVERY_MARK = "pkb-tui"
RECOVERY_VERSION = 1
SAMPLES_PER_LINE = 1000
T = TypeVar("T")


# ---------------------------------------------------------------------- is the database still ours
def file_identity(path: Path) -> tuple[int, int] | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_dev, st.st_ino


def database_lost_reason(path: Path, identity: tuple[int, int] | None) -> str | None:
    """Why the database at ``path`` is no longer the one opened as ``identity`` (a phrase after
    "The database X"), or None when it still is and may be written."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return "was deleted or moved away"
    except OSError as exc:
        return f"cannot be reached ({exc.strerror})"
    if identity is not None and (st.st_dev, st.st_ino) != identity:
        return "was replaced by another file"
    if _read_only(path, st.st_mode):
        return "was made read-only"
    return None


def _read_only(path: Path, mode: int) -> bool:
    # Mode bits, not only os.access: root may write whatever the bits say, and SQLite keeps writing
    # through the descriptor it opened before the chmod either way.
    return mode & 0o222 == 0 or not os.access(path, os.W_OK)


def read_only_database_sentence(path: Path, done: str = "run") -> str | None:
    """Before a batch (or a calibration, ``done`` "measured"; an import, "imported"): the sentence when
    the database at ``path`` exists and is read-only (a batch would run to the end and then store
    nothing); None when it may be written or is not there yet."""
    try:
        st = os.stat(path)
    except OSError:
        return None  # not there yet (Store creates it) or unreachable (Store says so)
    if not _read_only(path, st.st_mode):
        return None
    return (f"The database {path} is read-only (mode {st.st_mode & 0o777:03o}): make it writable "
            f"(chmod u+w {shlex.quote(str(path))}) or name another file with --db; nothing was {done}.")


def recovery_file_name(db_path: Path, batch_id: str) -> str:
    return f"{db_path.stem}.recovery-{batch_id}.jsonl"


def not_stored_sentence(lost: str, recovery_path: Path | None, recovery_error: str | None, db_path: Path) -> str:
    """What the CLI and the dashboard say when a batch ends with its database lost."""
    if recovery_path is None:
        return f"Results not stored: {lost}, and no recovery file could be written ({recovery_error})."
    command = f"pkb-tui import {shlex.quote(str(recovery_path))} --db {shlex.quote(str(db_path))}"
    return (f"Results not stored: {lost}. The batch's results are in {recovery_path}; "
            f"load them into a database with: {command}")


# ---------------------------------------------------------------------- the launcher's writes
class BatchWriter:
    """A batch's writes: to the database while it is the file the batch opened, else to a
    recovery file. The methods are Store's that the launcher uses, with the same arguments.

    ``fallback_dir``: where the recovery file goes when the database's folder cannot take it (the
    batch's log folder). ``on_lost(sentence, recovery_path)`` is called once, on the thread whose
    write or look found the loss.
    """

    def __init__(
        self, store: Store, batch_id: str, *, fallback_dir: Path | None = None,
        on_lost: Callable[[str, Path | None], None] | None = None,
    ) -> None:
        self.store: Store | None = store
        self.path = store.path
        self.identity = file_identity(store.path)
        self.batch_id = batch_id
        self.fallback_dir = fallback_dir
        self.on_lost = on_lost
        self.lost: str | None = None  # the sentence saying what happened to the database
        self.recovery_path: Path | None = None
        self.recovery_error: str | None = None  # why no recovery file could be written
        self._journal: list[dict[str, Any]] = []  # every write of the batch, in order (until lost)
        self._file: IO[str] | None = None
        self._lock = threading.RLock()
        self._item_of: dict[int, int] = {}  # run id -> item index
        self._host_key_of: dict[int, str] = {}  # host id -> fingerprint
        self._local_ids = 0  # ids handed out once the database is lost (negative)

    # ---- the database's state
    def check(self) -> bool:
        """Look at the database's path; True while it may be written."""
        with self._lock:
            if self.store is None:
                return False
            reason = database_lost_reason(self.path, self.identity)
            if reason is not None:
                self._lose(reason)
                return False
            return True

    @property
    def stored(self) -> bool:
        return self.lost is None

    def run_ids(self) -> list[int]:
        return list(self._item_of)

    def _lose(self, reason: str) -> None:
        store, self.store = self.store, None
        if store is not None:
            # Our WAL into the file we opened, and the WAL emptied, before anything opens a new file
            # at the path: SQLite would replay a WAL left there into whatever database is there
            # then. (Closing alone does not: SQLite skips the closing checkpoint of a moved file.)
            # Only descriptors of ours are touched, never a file by its name.
            try:
                store.conn.execute("PRAGMA busy_timeout = 1000")
                store.conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
            except (sqlite3.Error, PkbError):
                pass
            try:
                store.close()
            except sqlite3.Error:
                pass
        self.lost = f"The database {self.path} {reason} while the batch ran"
        self._open_recovery_file(reason)
        if self.on_lost is not None:
            self.on_lost(self.lost, self.recovery_path)

    def _open_recovery_file(self, reason: str) -> None:
        header = {
            "recovery": RECOVERY_MARK, "version": RECOVERY_VERSION, "batch_id": self.batch_id,
            "database": str(self.path), "reason": reason, "host": socket.gethostname(), "created_at": time.time(),
        }
        name = recovery_file_name(self.path, self.batch_id)
        folders = [self.path.resolve().parent] + ([self.fallback_dir] if self.fallback_dir is not None else [])
        errors = []
        for folder in folders:
            target = folder / name
            try:
                fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644)
            except OSError as exc:
                errors.append(f"{target}: {exc.strerror}")
                continue
            self._file = os.fdopen(fd, "w")
            self.recovery_path = target
            break
        if self._file is None:
            self.recovery_error = "; ".join(errors) or "no folder to write it in"
            return
        try:
            for line in [header, *self._journal]:
                self._file.write(json.dumps(line, default=str) + "\n")
            self._file.flush()
        except OSError as exc:
            self.recovery_error = f"{self.recovery_path}: {exc.strerror}"
        self._journal = []

    def _append(self, op: dict[str, Any]) -> None:
        if self._file is None:
            return
        try:
            self._file.write(json.dumps(op, default=str) + "\n")
            self._file.flush()  # a launcher killed later still leaves every line written so far
        except OSError as exc:
            self.recovery_error = f"{self.recovery_path}: {exc.strerror}"

    def _write(self, op: dict[str, Any] | None, write: Callable[[Store], T], fallback: Callable[[], T]) -> T:
        """Keep ``op`` (None: nothing to keep, e.g. the batches table), then write it to the
        database if it is still ours; else, or when the write fails, the recovery file has it."""
        with self._lock:
            if op is not None:
                if self.store is None:
                    self._append(op)
                else:
                    self._journal.append(op)
            if self.store is not None and self.check():
                try:
                    return write(self.store)
                except (sqlite3.Error, OSError) as exc:
                    self._lose(f"could not be written ({exc})")
                except PkbError as exc:
                    if exc.exit_code != EXIT_HARNESS:
                        raise
                    self._lose(f"could not be written ({exc})")
            return fallback()

    def _local_id(self) -> int:
        self._local_ids -= 1
        return self._local_ids

    def _item(self, run_id: int) -> int:
        return self._item_of[run_id]

    # ---- writes (Store's signatures)
    def add_source(self, path: str, text: str) -> str:
        return self._write({"op": "source", "path": path, "text": text},
                           lambda store: store.add_source(path, text), lambda: source_hash(text))

    def upsert_host(self, info: dict[str, Any]) -> int:
        key, _ = host_fingerprint(info)
        host_id = self._write({"op": "host", "host": key, "info": info},
                              lambda store: store.upsert_host(info), self._local_id)
        self._host_key_of[host_id] = key
        return host_id

    def create_run(self, fields: dict[str, Any]) -> int:
        """``fields`` must hold item_index: the run's identity in its batch."""
        fields = run_fields(fields)
        item = int(fields["item_index"])
        run_id = self._write({"op": "run", "item": item, "fields": fields},
                             lambda store: store.create_run(fields), self._local_id)
        self._item_of[run_id] = item
        return run_id

    def update_run(self, run_id: int, **fields: Any) -> None:
        op_fields = dict(fields)
        if "host_id" in op_fields:
            op_fields["host_id"] = {"host": self._host_key_of.get(op_fields["host_id"])}
        self._write({"op": "update", "item": self._item(run_id), "fields": op_fields},
                    lambda store: store.update_run(run_id, **fields), lambda: None)

    def add_note(self, run_ids: Iterable[int], sentence: str) -> None:
        run_ids = list(run_ids)
        self._write({"op": "note", "items": [self._item(r) for r in run_ids], "note": sentence},
                    lambda store: store.add_note(run_ids, sentence), lambda: None)

    def add_result(self, run_id: int, variant: str, fields: dict[str, Any]) -> None:
        self._write({"op": "result", "item": self._item(run_id), "variant": variant, "fields": fields},
                    lambda store: store.add_result(run_id, variant, fields), lambda: None)

    def add_trials(self, run_id: int, trials: Iterable[dict[str, Any]]) -> None:
        trials = list(trials)
        self._write({"op": "trials", "item": self._item(run_id), "trials": trials},
                    lambda store: store.add_trials(run_id, trials), lambda: None)

    def add_kernels(self, run_id: int, kernels: Iterable[dict[str, Any]]) -> None:
        kernels = list(kernels)
        self._write({"op": "kernels", "item": self._item(run_id), "kernels": kernels},
                    lambda store: store.add_kernels(run_id, kernels), lambda: None)

    def add_samples(self, samples: Iterable[Any]) -> None:
        """Telemetry samples (collectors.sample.GpuSample) of this batch's runs, once the database
        is lost (before, the sample sink writes them); samples of no run of ours are left out."""
        if self.store is not None:
            return
        rows = []
        for sample in samples:
            item = self._item_of.get(sample.run_id) if sample.run_id is not None else None
            if item is None:
                continue
            row = sample_dict(sample)
            row.pop("run_id")
            rows.append({**row, "item": item})
        for start in range(0, len(rows), SAMPLES_PER_LINE):  # the ring's hour of samples: lines of a few hundred kB
            self._write({"op": "samples", "samples": rows[start:start + SAMPLES_PER_LINE]}, lambda store: None, lambda: None)

    # ---- the batches running now (live state: never kept for recovery)
    def register_batch(self, *, runs: int) -> None:
        self._write(None, lambda store: store.register_batch(self.batch_id, runs=runs), lambda: None)

    def end_batch(self) -> None:
        self._write(None, lambda store: store.end_batch(self.batch_id), lambda: None)

    def other_live_batches(self) -> list[dict[str, Any]]:
        return self._read(lambda store: store.other_live_batches(self.batch_id), list)

    # ---- reads the launcher needs (nothing to read once the database is lost)
    def _read(self, read: Callable[[Store], T], fallback: Callable[[], T]) -> T:
        with self._lock:
            if self.store is not None and self.check():
                try:
                    return read(self.store)
                except sqlite3.Error as exc:
                    self._lose(f"could not be read ({exc})")
            return fallback()

    def latest_calibration(self, host_id: int) -> dict[str, float]:
        return self._read(lambda store: store.latest_calibration(host_id), dict)

    def latest_link_latency(self, host_id: int) -> dict[str, Any] | None:
        return self._read(lambda store: store.latest_link_latency(host_id), lambda: None)

    def latest_noise_floor(self, host_id: int, mode: str) -> dict[str, Any] | None:
        return self._read(lambda store: store.latest_noise_floor(host_id, mode), lambda: None)

    def network_pairs(self) -> dict[tuple[str, str], dict[str, Any]]:
        return self._read(lambda store: store.network_pairs(), dict)

    def close(self) -> None:
        with self._lock:
            if self.store is not None:
                self.store.close()
                self.store = None
            if self._file is not None:
                try:
                    self._file.close()
                except OSError:
                    pass
                self._file = None
            self._journal = []


class RecoverySampleSink:
    """Telemetry's sink once the database is lost: samples of the batch's runs go to the recovery
    file (the sampler's thread calls put; the writer's lock orders it with the launcher's writes)."""

    def __init__(self, writer: BatchWriter) -> None:
        self.writer = writer
        self.error: str | None = None

    def put(self, samples: list[Any]) -> None:
        self.writer.add_samples(samples)

    def flush(self, timeout_s: float | None = None) -> bool:
        return True

    def close(self, timeout_s: float = 0.0) -> None:
        self.error = self.writer.recovery_error


# ---------------------------------------------------------------------- pkb-tui import
@dataclass
class RecoveredRun:
    item: int
    fields: dict[str, Any] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    results: dict[str, dict[str, Any]] = field(default_factory=dict)
    trials: dict[int, dict[str, Any]] = field(default_factory=dict)
    kernels: list[dict[str, Any]] = field(default_factory=list)
    samples: list[dict[str, Any]] = field(default_factory=list)


@dataclass
class RecoveredBatch:
    """A recovery file folded into the final state of each run."""

    path: Path
    header: dict[str, Any]
    sources: dict[str, tuple[str, str]] = field(default_factory=dict)  # hash -> (path, text)
    hosts: dict[str, dict[str, Any]] = field(default_factory=dict)  # fingerprint -> facts
    runs: dict[int, RecoveredRun] = field(default_factory=dict)
    torn_last_line: bool = False  # the launcher was killed while writing it: left out

    @property
    def batch_id(self) -> str:
        return str(self.header["batch_id"])


@dataclass
class ImportSummary:
    batch_id: str
    database: Path
    run_ids: list[int]
    added: int  # runs new to the database
    updated: int  # runs it had (an earlier import, or rows written before the loss)
    samples_added: int
    torn_last_line: bool


def _not_a_recovery_file(path: Path, why: str) -> PkbError:
    return PkbError(f"{path} is not a pkb-tui recovery file ({why}); give the file the batch named when it "
                    "ended (runs.recovery-<batch>.jsonl for runs.db).")


def read_recovery(path: Path | str) -> RecoveredBatch:
    """Parse and fold a recovery file; PkbError (exit 2) for a file that is missing or is not one."""
    path = Path(path)
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except FileNotFoundError:
        raise PkbError(f"There is no recovery file {path}; check the path the batch printed when it ended.") from None
    except IsADirectoryError:
        raise PkbError(f"{path} is a folder, not a recovery file; give the .jsonl file the batch printed.") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise _not_a_recovery_file(path, f"it cannot be read as text: {exc}") from None
    lines = text.split("\n")
    ends_cleanly = lines[-1] == ""
    if ends_cleanly:
        lines.pop()
    parsed: list[dict[str, Any]] = []
    torn = False
    for number, line in enumerate(lines, start=1):
        try:
            value = json.loads(line)
            if not isinstance(value, dict):
                raise ValueError("not an object")
        except ValueError as exc:
            if number == len(lines) and not ends_cleanly and number > 1:
                torn = True  # a launcher killed mid-line: the lines before it are whole
                break
            raise _not_a_recovery_file(path, f"line {number} is not a JSON object: {exc}") from None
        parsed.append(value)
    if not parsed:
        raise _not_a_recovery_file(path, "it is empty")
    header = parsed[0]
    if header.get("recovery") != RECOVERY_MARK or "batch_id" not in header:
        raise _not_a_recovery_file(path, "its first line is not a recovery header")
    if header.get("version") != RECOVERY_VERSION:
        raise PkbError(f"{path} is a recovery file of version {header.get('version')}; this pkb-tui reads version "
                       f"{RECOVERY_VERSION}: import it with the pkb-tui that wrote it.")
    batch = RecoveredBatch(path=path, header=header, torn_last_line=torn)
    for number, op in enumerate(parsed[1:], start=2):
        try:
            _fold(batch, op)
        except (KeyError, TypeError, ValueError) as exc:
            raise _not_a_recovery_file(path, f"line {number} is not a write it knows ({type(exc).__name__}: {exc})") from None
    return batch


def _fold(batch: RecoveredBatch, op: dict[str, Any]) -> None:
    kind = op["op"]
    if kind == "source":
        batch.sources[source_hash(op["text"])] = (op["path"], op["text"])
    elif kind == "host":
        batch.hosts[op["host"]] = op["info"]
    elif kind == "run":
        run = batch.runs.setdefault(int(op["item"]), RecoveredRun(int(op["item"])))
        run.fields.update(op["fields"])
        notes = run.fields.pop("notes", None)
        run.notes = json.loads(notes) if isinstance(notes, str) else list(notes or [])
    elif kind == "samples":
        for sample in op["samples"]:
            batch.runs[int(sample["item"])].samples.append(sample)
    else:
        items = op["items"] if kind == "note" else [op["item"]]
        for item in items:
            run = batch.runs[int(item)]  # a write for a run the file never created: not ours
            if kind == "update":
                fields = dict(op["fields"])
                if "notes" in fields:
                    notes = fields.pop("notes")
                    run.notes = json.loads(notes) if isinstance(notes, str) else list(notes or [])
                run.fields.update(fields)
            elif kind == "note":
                run.notes.append(op["note"])
            elif kind == "result":
                run.results.setdefault(op["variant"], {}).update(op["fields"])
            elif kind == "trials":
                for trial in op["trials"]:
                    run.trials[int(trial["trial"])] = trial
            elif kind == "kernels":
                run.kernels.extend(op["kernels"])
            else:
                raise ValueError(f"unknown op {kind!r}")


def import_recovery(source: RecoveredBatch | Path | str, store: Store) -> ImportSummary:
    """Write a recovery file's runs into ``store``, in one transaction: all of it or nothing."""
    batch = source if isinstance(source, RecoveredBatch) else read_recovery(source)
    run_ids: list[int] = []
    added = updated = samples_added = 0
    with store.transaction() as conn:
        for source_path, text in batch.sources.values():
            insert_source(conn, source_path, text)
        host_ids = {key: upsert_host_row(conn, info) for key, info in batch.hosts.items()}
        for item, run in sorted(batch.runs.items()):
            fields = dict(run.fields)
            host = fields.get("host_id")
            if isinstance(host, dict):
                fields["host_id"] = host_ids.get(str(host.get("host")))
            fields["notes"] = json.dumps(run.notes) if run.notes else None
            fields["batch_id"], fields["item_index"] = batch.batch_id, item
            row = conn.execute("SELECT id FROM runs WHERE batch_id = ? AND item_index = ?",
                               (batch.batch_id, item)).fetchone()
            if row is None:
                run_id = insert_run(conn, fields)
                added += 1
            else:
                run_id = int(row["id"])
                update_run_row(conn, run_id, fields)
                updated += 1
            for variant, result in run.results.items():
                upsert_result(conn, run_id, variant, result)
            upsert_trials(conn, run_id, run.trials.values())
            if run.kernels:  # the file holds all of the run's kernels: they replace any stored
                conn.execute("DELETE FROM kernels WHERE run_id = ?", (run_id,))
                insert_kernels(conn, run_id, run.kernels)
            samples_added += insert_run_samples(conn, run_id, run.samples)
            run_ids.append(run_id)
    return ImportSummary(batch.batch_id, store.path, run_ids, added, updated, samples_added, batch.torn_last_line)
