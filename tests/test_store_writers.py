"""One runs.db, several writers; a database that goes away in the middle of a batch (issue 13, item 6).

Real SQLite files and real `pkb-tui run` processes in cpu mode. A batch is held in the middle of a
run by the `gated` fixture model (its candidate waits for a file to exist), never by sleeping: the
tests wait for what the database or the batch says, act, then open the gate.
"""

from __future__ import annotations

import json
import os
import re
import sqlite3
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from pkb_tui.errors import EXIT_NOT_STORED
from pkb_tui.store import Store
from pkb_tui.store.recovery import BatchWriter, import_recovery, read_recovery
from tests.conftest import fixture_model

PROJECT_ROOT = Path(__file__).resolve().parents[1]
SHARED = "shares this machine: timings may be disturbed"
RUN_ARGS = ("run", "--task", "all_reduce", "--model", f"baseline,{fixture_model('gated')}", "--world-size", "2",
            "--size", "small", "--trials", "1", "--no-timing", "--no-profile", "--mode", "cpu", "--timeout", "240")
WAIT_S = 300.0  # a guard against a hang, never a measurement


class Batch:
    """`pkb-tui run RUN_ARGS` in a process of its own, its output in files read while it runs."""

    def __init__(self, tmp_path: Path, db: Path, name: str, gate: Path) -> None:
        self.stdout_path, self.stderr_path = tmp_path / f"{name}.out", tmp_path / f"{name}.err"
        env = {**os.environ, "PYTHONPATH": str(PROJECT_ROOT), "PKB_TEST_GATE": str(gate), "OMP_NUM_THREADS": "1"}
        with open(self.stdout_path, "w") as out, open(self.stderr_path, "w") as err:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "pkb_tui.cli", "--db", str(db), "--runs-dir", str(tmp_path / "pkb-runs"), *RUN_ARGS],
                stdout=out, stderr=err, stdin=subprocess.DEVNULL, cwd=PROJECT_ROOT, env=env,
            )

    def stdout(self) -> str:
        return self.stdout_path.read_text()

    def stderr(self) -> str:
        return self.stderr_path.read_text()

    def wait(self) -> int:
        try:
            return self.proc.wait(timeout=WAIT_S)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            pytest.fail(f"the batch did not end:\n{self.stderr()}")


@pytest.fixture
def batches():
    started: list[Batch] = []
    yield started
    for batch in started:
        if batch.proc.poll() is None:  # a failed test: take its batch down (SIGTERM ends it as interrupted)
            batch.proc.terminate()
            try:
                batch.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                batch.proc.kill()
                batch.proc.wait()


def _wait_for(what: str, condition: Callable[[], bool], *watched: Batch) -> None:
    deadline = time.monotonic() + WAIT_S
    while not condition():
        for batch in watched:
            if batch.proc.poll() is not None:
                pytest.fail(f"the batch ended (exit {batch.proc.returncode}) before {what}:\n{batch.stderr()}")
        if time.monotonic() > deadline:
            pytest.fail(f"still waiting for {what}: " + " | ".join(b.stderr() for b in watched))
        time.sleep(0.1)


def _gated_runs_running(db: Path) -> int:
    """How many gated runs the database shows running (each is held until the gate opens)."""
    try:
        conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=30)
        try:
            return conn.execute("SELECT COUNT(*) FROM runs WHERE status = 'running' AND model = 'gated'").fetchone()[0]
        finally:
            conn.close()
    except sqlite3.Error:
        return 0  # not created yet


def _numbers_out(text: str) -> str:
    return re.sub(r"\d+(\.\d+)?", "N", text)


def _rows(db: Path) -> dict[tuple[str, str], dict[str, Any]]:
    """What a batch stored, per (task, model), without what differs between two batches of the same
    request: ids, times, pids, batch and log paths, measured errors and numbers inside notes."""
    conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    conn.row_factory = sqlite3.Row
    out = {}
    try:
        for run in conn.execute("SELECT * FROM runs ORDER BY item_index"):
            run_id = run["id"]
            request = json.loads(run["request"])
            host = conn.execute("SELECT fingerprint FROM hosts WHERE id = ?", (run["host_id"],)).fetchone()
            results = {}
            for result in conn.execute("SELECT * FROM results WHERE run_id = ? ORDER BY variant", (run_id,)):
                results[result["variant"]] = {
                    "present": sorted(k for k in result.keys() if result[k] is not None and k not in ("id", "run_id")),
                    "verdict": (result["correct"], result["trials_passed"], result["trials_total"]),
                    "traffic": result["traffic"],
                }
            out[(run["task_id"], run["model"])] = {
                "run": {k: run[k] for k in (
                    "task_id", "model", "model_path", "world_size", "mode", "dtype", "size", "trials", "timeout_s",
                    "status", "status_detail", "launcher_host", "baseline_source_hash", "candidate_source_hash",
                    "timings_representative", "mps_enabled", "item_index")},
                "times": (run["created_at"] is not None, run["started_at"] is not None, run["finished_at"] is not None),
                "request": {k: v for k, v in request.items() if k != "seed"},
                "notes": sorted(_numbers_out(n) for n in json.loads(run["notes"] or "[]")),
                "host": host["fingerprint"] if host else None,
                "sources": [conn.execute("SELECT COUNT(*) FROM sources WHERE hash = ?", (h,)).fetchone()[0]
                            for h in (run["baseline_source_hash"], run["candidate_source_hash"])],
                "results": results,
                "trials": [(t["trial"], t["correct"], t["message"], t["detail"] is not None) for t in conn.execute(
                    "SELECT * FROM trials WHERE run_id = ? ORDER BY trial", (run_id,))],
                "kernels": conn.execute("SELECT COUNT(*) FROM kernels WHERE run_id = ?", (run_id,)).fetchone()[0],
                "has_samples": conn.execute("SELECT COUNT(*) > 0 FROM samples WHERE run_id = ?", (run_id,)).fetchone()[0],
            }
    finally:
        conn.close()
    return out


def _counts(db: Path) -> dict[str, int]:
    conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    try:
        return {t: conn.execute(f"SELECT COUNT(*) FROM {t}").fetchone()[0]
                for t in ("runs", "results", "trials", "kernels", "sources", "hosts", "samples", "rank_samples")}
    finally:
        conn.close()


@pytest.fixture(scope="module")
def normal_batch(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The database a batch of RUN_ARGS leaves when nothing happens to it (its gate open from the start)."""
    tmp_path = tmp_path_factory.mktemp("normal")
    gate = tmp_path / "gate"
    gate.touch()
    db = tmp_path / "runs.db"
    batch = Batch(tmp_path, db, "normal", gate)
    assert batch.wait() == 0, batch.stderr()
    return db


# ---------------------------------------------------------------------- two writers
@pytest.mark.timeout(900)
def test_two_batches_on_one_database_both_store_every_row_and_each_says_the_other_shares_the_machine(
        tmp_path: Path, batches: list[Batch]) -> None:
    db, gate = tmp_path / "runs.db", tmp_path / "gate"
    first = Batch(tmp_path, db, "first", gate)
    batches.append(first)
    _wait_for("the first batch's gated run", lambda: _gated_runs_running(db) == 1, first)
    second = Batch(tmp_path, db, "second", gate)
    batches.append(second)
    _wait_for("both batches in their gated run", lambda: _gated_runs_running(db) == 2, first, second)
    # The second saw the first when it started; the first sees the second while its run is held.
    _wait_for("both warnings", lambda: SHARED in first.stderr() and SHARED in second.stderr(), first, second)
    gate.touch()
    assert first.wait() == 0, first.stderr()
    assert second.wait() == 0, second.stderr()

    for batch, other in ((first, second), (second, first)):
        err = batch.stderr()
        assert err.count(SHARED) == 1, err  # said once
        assert f"another pkb-tui batch (pid {other.proc.pid}, started " in err, err
        assert "locked" not in err + batch.stdout(), err
    logs = "".join(p.read_text(errors="replace") for p in (tmp_path / "pkb-runs").rglob("*.log"))
    assert "database is locked" not in logs

    counts = _counts(db)
    assert counts["runs"] == 4 and counts["results"] == 8 and counts["trials"] == 4, counts
    with Store(db) as store:
        runs = store.runs(order_by="id", descending=False)
        assert [r["status"] for r in runs] == ["passed"] * 4
        assert store.conn.execute("SELECT COUNT(*) FROM batches").fetchone()[0] == 0  # both took their row away
        notes = {(r["batch_id"], r["model"]): store.run(r["id"])["notes"] for r in runs}
    first_batch, second_batch = sorted({r["batch_id"] for r in runs})

    def names(batch: Batch) -> Callable[[list[str]], bool]:
        return lambda run_notes: any(f"pid {batch.proc.pid}," in n and SHARED in n for n in run_notes)

    # A run gets the note when the other batch ran while it did: the first's baseline ran alone.
    assert not any(SHARED in n for n in notes[(first_batch, "baseline")])
    assert names(second)(notes[(first_batch, "gated")])
    assert names(first)(notes[(second_batch, "baseline")]) and names(first)(notes[(second_batch, "gated")])


def test_processes_opening_a_new_database_at_once_all_migrate_it_and_write(tmp_path: Path) -> None:
    # Before: "table hosts already exists" (two migrations of one version) and "database is locked"
    # (switching the new file to WAL) for some of them.
    script = (
        "import sys, time; from pkb_tui.store import Store\n"
        "time.sleep(max(0.0, float(sys.argv[2]) - time.time()))\n"
        "with Store(sys.argv[1]) as s:\n"
        "    for i in range(10):\n"
        "        rid = s.create_run({'batch_id': sys.argv[3], 'task_id': 't', 'model': 'm', 'world_size': 2,"
        " 'mode': 'cpu', 'dtype': 'float32', 'size': 'small', 'trials': 1, 'timeout_s': 10, 'request': {}})\n"
        "        s.add_result(rid, 'baseline', {'correct': 1})\n"
    )
    env = {**os.environ, "PYTHONPATH": str(PROJECT_ROOT)}
    for round_index in range(3):
        db = tmp_path / f"runs{round_index}.db"
        start = time.time() + 2.0  # every process past its imports, then all at once
        procs = [subprocess.Popen([sys.executable, "-c", script, str(db), str(start), f"b{k}"], env=env, cwd=tmp_path,
                                  stderr=subprocess.PIPE, text=True) for k in range(4)]
        errors = [p.communicate(timeout=120)[1] for p in procs]
        assert all(p.returncode == 0 for p in procs), errors
        assert _counts(db)["runs"] == 40 and _counts(db)["results"] == 40


# ---------------------------------------------------------------------- the batches table
def test_a_batch_left_by_a_dead_launcher_or_a_reused_pid_is_not_another_batch(tmp_path: Path) -> None:
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    finished = subprocess.Popen([sys.executable, "-c", "pass"])
    finished.wait()
    try:
        with Store(tmp_path / "runs.db") as store:
            store.register_batch("mine", runs=1)
            with store.transaction() as conn:
                rows = [
                    ("alive", "localhost-not-this-one", sleeper.pid, None),  # another host: not this machine
                    ("dead", None, finished.pid, None),  # its launcher has exited
                    ("reused", None, sleeper.pid, 1),  # the pid now names a process started at another moment
                    ("other", None, sleeper.pid, None),  # really running here
                ]
                import socket

                from pkb_tui.store.store import process_start_ticks
                for batch_id, host, pid, ticks in rows:
                    conn.execute(
                        "INSERT INTO batches (batch_id, host, pid, pid_start_ticks, started_at, runs) VALUES (?, ?, ?, ?, ?, 1)",
                        (batch_id, host or socket.gethostname(), pid,
                         ticks if ticks is not None else process_start_ticks(pid), time.time()),
                    )
            live = store.other_live_batches("mine")
            assert [b["batch_id"] for b in live] == ["other"]
            left = {r[0] for r in store.conn.execute("SELECT batch_id FROM batches")}
            assert left == {"mine", "other", "alive"}  # stale rows of this host removed; another host's kept
            store.end_batch("mine")
            assert "mine" not in {r[0] for r in store.conn.execute("SELECT batch_id FROM batches")}
    finally:
        sleeper.kill()
        sleeper.wait()


# ---------------------------------------------------------------------- a database lost mid-batch
def _recovery_path(stderr: str, db: Path) -> Path:
    found = re.search(r"load them into a database with: pkb-tui import (\S+) --db (\S+)", stderr)
    assert found, stderr
    assert found.group(2) == str(db)
    return Path(found.group(1))


def _lose_mid_run(tmp_path: Path, batches: list[Batch], lose: Callable[[Path], None], said: str) -> tuple[Batch, Path]:
    db, gate = tmp_path / "runs.db", tmp_path / "gate"
    batch = Batch(tmp_path, db, "batch", gate)
    batches.append(batch)
    _wait_for("the gated run", lambda: _gated_runs_running(db) == 1, batch)
    lose(db)
    _wait_for("the batch to notice", lambda: "results now go to" in batch.stderr(), batch)
    gate.touch()
    code = batch.wait()
    err = batch.stderr()
    assert code == EXIT_NOT_STORED, err
    assert f"Results not stored: The database {db} {said} while the batch ran." in err
    return batch, _recovery_path(err, db)


@pytest.mark.timeout(900)
def test_a_database_deleted_mid_run_leaves_a_recovery_file_whose_import_gives_the_rows_of_a_normal_batch(
        tmp_path: Path, batches: list[Batch], normal_batch: Path, cli) -> None:
    batch, recovery = _lose_mid_run(tmp_path, batches, lambda db: db.unlink(), "was deleted or moved away")
    db = tmp_path / "runs.db"
    assert recovery == tmp_path / recovery.name and recovery.name.startswith("runs.recovery-")
    assert not db.exists()  # the batch made no new, empty database where the old one was
    table = batch.stdout()
    assert table.count("✓ passed") == 2, table  # the table still shows both runs, read from the file
    assert re.search(r"^\s*-\s+all_reduce\s+gated\s", table, re.M), table  # no run id: they are in no database yet

    imported = tmp_path / "imported.db"
    result = cli("--db", str(imported), "import", str(recovery))
    assert result.code == 0, result.err
    assert "2 run(s) added, 0 already there" in result.out
    assert _rows(imported) == _rows(normal_batch)

    counts = _counts(imported)
    again = cli("--db", str(imported), "import", str(recovery), "--json")
    assert again.code == 0 and again.json()["added"] == 0 and again.json()["already_there"] == 2
    assert _counts(imported) == counts  # importing twice adds nothing


@pytest.mark.timeout(900)
def test_a_database_made_read_only_mid_run_is_left_alone_and_its_recovery_file_completes_it(
        tmp_path: Path, batches: list[Batch], normal_batch: Path, cli) -> None:
    # chmod stops nobody with a descriptor already open, root not even on open: the launcher's own
    # look at the mode bits is what notices, so this holds as root too.
    batch, recovery = _lose_mid_run(tmp_path, batches, lambda db: db.chmod(0o444), "was made read-only")
    db = tmp_path / "runs.db"
    conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    statuses = [r[0] for r in conn.execute("SELECT status FROM runs ORDER BY item_index")]
    conn.close()
    assert statuses == ["passed", "running"]  # nothing written after the chmod

    db.chmod(0o644)
    result = cli("--db", str(db), "import", str(recovery))
    assert result.code == 0, result.err
    assert "0 run(s) added, 2 already there" in result.out  # the rows stored before are brought up to date
    assert _rows(db) == _rows(normal_batch)
    counts = _counts(db)
    assert cli("--db", str(db), "import", str(recovery)).code == 0
    assert _counts(db) == counts


# ---------------------------------------------------------------------- the writer and the file, in process
def _play(writer: BatchWriter, lose_after: int | None = None, lose: Callable[[], None] = lambda: None) -> None:
    """The writes a launcher makes for a batch of two runs, in its order; ``lose()`` after that many."""
    ids: dict[int, int] = {}
    sources = [writer.add_source("tasks/x.py", "def baseline(x): return x\n"),
               writer.add_source("sol/x.py", "def solution(x): return x\n")]

    def create(item: int) -> None:
        ids[item] = writer.create_run({
            "batch_id": writer.batch_id, "task_id": "all_reduce", "model": f"m{item}", "world_size": 2, "mode": "cpu",
            "dtype": "float32", "size": "small", "trials": 2, "timeout_s": 10.0, "request": {"item": {"index": item}},
            "status": "queued", "item_index": item, "baseline_source_hash": sources[0], "candidate_source_hash": sources[1],
            "created_at": 1000.0 + item, "launcher_pid": 1, "launcher_host": "h",
        })

    def batch_started() -> None:
        host_id = writer.upsert_host({"hostname": "h", "gpu_model": None, "gpu_count": 0, "torch_version": "2.13"})
        for item in ids:
            writer.update_run(ids[item], host_id=host_id, notes=["cpu: for development"], mps_enabled=None)

    def run(item: int) -> list[Callable[[], Any]]:
        return [
            lambda: writer.update_run(ids[item], status="running", started_at=2000.0 + item),
            lambda: writer.add_trials(ids[item], [{"trial": 0, "correct": True, "max_abs_error": 1e-7, "detail": [{"rank": 0}]}]),
            lambda: writer.add_trials(ids[item], [{"trial": 1, "correct": item == 0, "message": "wrong" if item else None}]),
            lambda: writer.add_kernels(ids[item], [{"variant": "candidate", "rank": r, "name": "k", "category": "cpu_op",
                                                    "calls": 3, "total_us": 9.0, "mean_us": 3.0} for r in (0, 1)]),
            lambda: writer.add_note([ids[item]], "a note"),
            lambda: writer.update_run(ids[item], status="passed" if item == 0 else "failed", status_detail=None,
                                      finished_at=3000.0 + item),
            lambda: writer.add_result(ids[item], "baseline", {"correct": 1, "trials_passed": 2, "traffic": {"send_bytes": 8}}),
            lambda: writer.add_result(ids[item], "candidate", {"correct": int(item == 0), "median_us": 5.0}),
        ]

    steps = [lambda: create(0), lambda: create(1), batch_started, *run(0), *run(1),
             lambda: writer.add_note(list(ids.values()), "host load")]
    for index, step in enumerate(steps):
        if index == lose_after:
            lose()
        step()


def _writer(db: Path, batch_id: str = "20261203-000000-abcdef") -> BatchWriter:
    return BatchWriter(Store(db), batch_id, fallback_dir=db.parent / "fallback")


@pytest.mark.parametrize("how", ["deleted", "replaced", "read-only", "write error"])
@pytest.mark.parametrize("lose_after", [3, 9, 19])
def test_whatever_the_moment_the_recovery_file_imports_to_the_rows_of_a_batch_that_kept_its_database(
        tmp_path: Path, how: str, lose_after: int) -> None:
    kept = tmp_path / "kept.db"
    writer = _writer(kept)
    _play(writer)
    writer.close()
    assert writer.stored and writer.recovery_path is None

    db = tmp_path / "lost.db"
    writer = _writer(db)

    def lose() -> None:
        if how == "deleted":
            db.unlink()
        elif how == "replaced":
            Store(tmp_path / "other.db").close()
            os.replace(tmp_path / "other.db", db)
        elif how == "read-only":
            db.chmod(0o444)
        else:
            def broken(*args: Any, **kwargs: Any) -> None:
                raise sqlite3.OperationalError("disk I/O error")
            assert writer.store is not None
            writer.store.add_trials = broken  # type: ignore[method-assign]
            writer.store.update_run = broken  # type: ignore[method-assign]
            writer.store.add_note = broken  # type: ignore[method-assign]

    _play(writer, lose_after, lose)
    writer.close()
    assert not writer.stored and writer.recovery_path is not None
    assert writer.recovery_path.parent == tmp_path and writer.recovery_path.name == f"lost.recovery-{writer.batch_id}.jsonl"
    if how == "replaced":
        # The file moved over the database is left as it was: the batch's WAL, at the path, was
        # emptied before it could be replayed into the newcomer.
        assert _counts(db)["runs"] == 0
    if how == "read-only":
        db.chmod(0o644)
    target = tmp_path / "target.db"
    with Store(target) as store:
        summary = import_recovery(writer.recovery_path, store)
        assert summary.added == 2 and summary.updated == 0
    assert _rows(target) == _rows(kept)
    if how != "deleted":
        # Into the database that kept the first rows: brought up to date, nothing twice.
        with Store(db) as store:
            import_recovery(writer.recovery_path, store)
        assert _rows(db) == _rows(kept)
        assert _counts(db)["runs"] == 2 and _counts(db)["kernels"] == _counts(kept)["kernels"]


def test_the_recovery_file_goes_to_the_batch_folder_when_the_database_folder_is_gone(tmp_path: Path) -> None:
    folder = tmp_path / "data"
    folder.mkdir()
    writer = _writer(folder / "runs.db")
    writer.fallback_dir = tmp_path / "batch"
    writer.fallback_dir.mkdir()

    def lose() -> None:
        for entry in folder.iterdir():
            entry.unlink()
        folder.rmdir()

    _play(writer, 5, lose)
    writer.close()
    assert writer.recovery_path == tmp_path / "batch" / f"runs.recovery-{writer.batch_id}.jsonl"
    assert len(read_recovery(writer.recovery_path).runs) == 2


def test_import_refuses_a_missing_or_foreign_file_with_a_sentence_and_writes_nothing(tmp_path: Path, cli) -> None:
    db = tmp_path / "runs.db"
    missing = cli("--db", str(db), "import", str(tmp_path / "nope.jsonl"))
    assert missing.code == 2 and "There is no recovery file" in missing.err, missing.err
    garbage = tmp_path / "garbage.jsonl"
    garbage.write_text("this is not json\n{}\n")
    bad = cli("--db", str(db), "import", str(garbage))
    assert bad.code == 2 and "is not a pkb-tui recovery file (line 1 is not a JSON object" in bad.err, bad.err
    foreign = tmp_path / "foreign.jsonl"
    foreign.write_text(json.dumps({"event": "run_started"}) + "\n")
    assert "its first line is not a recovery header" in cli("--db", str(db), "import", str(foreign)).err
    assert "Traceback" not in missing.err + bad.err
    assert not db.exists()  # refused before any database was made


def test_a_file_cut_off_mid_line_imports_every_whole_line_and_says_so(tmp_path: Path, cli) -> None:
    writer = _writer(tmp_path / "runs.db")
    _play(writer, 2, lambda: (tmp_path / "runs.db").unlink())
    writer.close()
    assert writer.recovery_path is not None
    text = writer.recovery_path.read_text()
    writer.recovery_path.write_text(text[:-15])  # a launcher killed while writing its last line
    result = cli("--db", str(tmp_path / "target.db"), "import", str(writer.recovery_path))
    assert result.code == 0, result.err
    assert "was cut off" in result.err and "2 run(s) added" in result.out
    # A line cut in the middle of the file is damage, not a kill: refused.
    lines = text.splitlines()
    lines[3] = lines[3][:10]
    writer.recovery_path.write_text("\n".join(lines) + "\n")
    broken = cli("--db", str(tmp_path / "target2.db"), "import", str(writer.recovery_path))
    assert broken.code == 2 and "line 4 is not a JSON object" in broken.err


def test_a_database_read_only_before_the_batch_is_refused_before_anything_runs(tmp_path: Path, cli) -> None:
    # Seen on the GPU box: a database copied from a read-only file ran a whole batch (three minutes)
    # and only then said it "was made read-only while the batch ran" and stored nothing.
    db = tmp_path / "runs.db"
    with Store(db) as store:
        store.upsert_host({"hostname": "before"})
    db.chmod(0o444)
    before = db.read_bytes()
    try:
        result = cli("--db", str(db), "run", "--task", "all_reduce", "--model", "baseline", "--mode", "cpu",
                     "--world-size", "2", "--size", "small", "--trials", "1", "--no-profile")
        assert result.code == 2, (result.code, result.err)
        assert f"The database {db} is read-only (mode 444): make it writable (chmod u+w {db})" in result.err, result.err
        assert "nothing was run" in result.err and "Traceback" not in result.err
        assert db.read_bytes() == before
        assert not list(tmp_path.glob("*.recovery-*.jsonl"))
        # The other writers say the same before writing (root could write through the mode bits).
        calibrate = cli("--db", str(db), "calibrate", "--noise-only")
        assert calibrate.code == 2 and "is read-only (mode 444)" in calibrate.err, calibrate.err
        assert "nothing was measured" in calibrate.err
        recovery = tmp_path / "batch.jsonl"
        recovery.write_text(json.dumps({"recovery": "pkb-tui", "version": 1, "batch_id": "b1",
                                        "database": str(db), "reason": "test"}) + "\n")
        imported = cli("--db", str(db), "import", str(recovery))
        assert imported.code == 2 and "is read-only (mode 444)" in imported.err, imported.err
        assert "nothing was imported" in imported.err
        assert db.read_bytes() == before
    finally:
        db.chmod(0o644)
    with Store(db) as store:
        assert store.conn.execute("SELECT COUNT(*) FROM runs").fetchone()[0] == 0
