"""The sample sink and ring buffer against a real SQLite file made through pkb_tui.store.Store."""

from __future__ import annotations

import sqlite3
import threading

import pytest

from collectors.sample import GpuSample, LinkSample, RankCpu
from collectors.sink import RingBuffer, SampleSink, apply_retention
from pkb_tui.store.store import Store, connect


def gpu_sample(ts: float, gpu: int = 0, *, tx: float | None = 1e9, links: int = 0, run_id: int | None = None) -> GpuSample:
    return GpuSample(
        ts=ts, gpu=gpu, nvlink_tx_bytes_per_s=tx, nvlink_rx_bytes_per_s=2e9, power_w=300.0 + ts % 7,
        temperature_c=None, run_id=run_id,
        links=[LinkSample(link=l, tx_bytes_per_s=1e8 * (l + 1), rx_bytes_per_s=None) for l in range(links)],
    )


@pytest.fixture
def db(tmp_path):
    path = tmp_path / "runs.db"
    Store(path).close()
    return path


def test_samples_and_links_are_written_with_nulls_kept(db):
    with SampleSink(db, host_id=None) as sink:
        sink.put([gpu_sample(100.0, 0, links=3, run_id=7), gpu_sample(100.0, 1, tx=None)])
        assert sink.flush()
    conn = connect(db, readonly=True)
    rows = conn.execute("SELECT * FROM samples ORDER BY gpu").fetchall()
    assert [(r["gpu"], r["run_id"], r["resolution"]) for r in rows] == [(0, 7, "raw"), (1, None, "raw")]
    assert rows[0]["nvlink_tx_bytes_per_s"] == 1e9
    assert rows[1]["nvlink_tx_bytes_per_s"] is None  # not available stays NULL, never 0
    assert rows[0]["temperature_c"] is None
    links = conn.execute("SELECT link, tx_bytes_per_s, rx_bytes_per_s, run_id FROM link_samples ORDER BY link").fetchall()
    assert [tuple(l) for l in links] == [(0, 1e8, None, 7), (1, 2e8, None, 7), (2, 3e8, None, 7)]


def test_large_batches_are_split_under_the_bound_parameter_limit(db):
    # Many rows per INSERT statement, in chunks that respect the connection's parameter limit
    # (999 before SQLite 3.32): every row lands, in order, with its own values.
    from collectors.sink import write_samples

    conn = connect(db)
    conn.setlimit(sqlite3.SQLITE_LIMIT_VARIABLE_NUMBER, 999)
    samples = [gpu_sample(1000.0 + k / 100, k % 8, tx=float(k), links=3 if k % 5 == 0 else 0, run_id=k % 3 or None)
               for k in range(1234)]
    assert write_samples(conn, samples, host_id=None) == (1234, 3 * 247)
    rows = conn.execute("SELECT ts, gpu, run_id, nvlink_tx_bytes_per_s, power_w FROM samples ORDER BY id").fetchall()
    assert [tuple(r) for r in rows] == [(s.ts, s.gpu, s.run_id, s.nvlink_tx_bytes_per_s, s.power_w) for s in samples]
    links = conn.execute("SELECT ts, gpu, link, tx_bytes_per_s FROM link_samples ORDER BY id").fetchall()
    assert [tuple(r) for r in links] == [(s.ts, s.gpu, l.link, l.tx_bytes_per_s) for s in samples for l in s.links]
    conn.close()


def test_a_runs_samples_are_read_through_the_run_index(db):
    conn = connect(db, readonly=True)
    plan = " ".join(str(tuple(r)) for r in conn.execute(
        "EXPLAIN QUERY PLAN SELECT ts FROM samples WHERE run_id = ? ORDER BY gpu, ts", (3,)))
    assert "samples_run" in plan  # the partial index (run_id IS NOT NULL) serves run reads


def test_many_small_puts_become_few_transactions(db):
    sink = SampleSink(db, batch_rows=500, flush_interval_s=30.0)
    for k in range(50):
        sink.put([gpu_sample(1000.0 + k * 0.1 + g * 0.001, g) for g in range(10)])
    assert sink.flush()
    sink.close()
    assert sink.rows_written == 500
    assert 1 <= sink.transactions <= 2
    assert connect(db, readonly=True).execute("SELECT COUNT(*) FROM samples").fetchone()[0] == 500


def test_a_reader_reads_while_the_sink_writes(db):
    sink = SampleSink(db, batch_rows=200, flush_interval_s=0.01)
    counts: list[int] = []
    errors: list[BaseException] = []
    done = threading.Event()

    def reader() -> None:
        conn = connect(db, readonly=True, timeout_s=5.0)
        try:
            while not done.is_set():
                counts.append(conn.execute("SELECT COUNT(*) FROM samples").fetchone()[0])
        except BaseException as exc:  # "database is locked" would land here
            errors.append(exc)

    thread = threading.Thread(target=reader)
    thread.start()
    for k in range(100):
        sink.put([gpu_sample(2000.0 + k * 0.01, g, links=2) for g in range(8)])
        if k % 10 == 9:
            assert sink.flush()  # ten separate transactions for the reader to read through
    done.set()
    thread.join()
    sink.close()
    assert not errors
    assert counts == sorted(counts)  # the reader only ever sees whole transactions, growing
    assert sink.transactions >= 10
    assert connect(db, readonly=True).execute("SELECT COUNT(*) FROM samples").fetchone()[0] == 800


def test_close_writes_what_is_still_queued_and_later_puts_are_ignored(db):
    sink = SampleSink(db, batch_rows=10**6, flush_interval_s=60.0)
    sink.put([gpu_sample(5.0 + k, 0) for k in range(30)])
    sink.close()
    sink.put([gpu_sample(99.0)])
    assert connect(db, readonly=True).execute("SELECT COUNT(*) FROM samples").fetchone()[0] == 30


def test_retention_replaces_old_raw_rows_by_per_second_averages(db):
    with SampleSink(db) as sink:
        samples = []
        for tenth in range(100):  # 10 s at 10 Hz, two GPUs and the host row, from t = 10000
            ts = 10_000 + tenth / 10
            for g in (0, 1):
                s = gpu_sample(ts, g, tx=float(tenth) if g == 0 else None, links=1)
                s.power_w = 100.0 + tenth % 10
                samples.append(s)
            host = GpuSample(ts=ts, gpu=-1, run_id=3, ranks=[RankCpu(0, 4242, 90.0 + tenth % 10), RankCpu(1, 4243, None)])
            samples.append(host)
        sink.put(samples)
        sink.flush()
    store = Store(db)
    conn = store.conn
    assert [(r["rank"], r["pid"], r["samples"]) for r in store.run_rank_cpu(3)] == [(0, 4242, 100)]  # rank 1: no figure
    assert store.run_rank_cpu(3)[0]["mean_pct"] == pytest.approx(94.5)
    replaced = apply_retention(conn, raw_keep_s=5.5, now=10_010.0)  # cut at floor(10004.5) = 10004
    assert replaced == 4 * 10 * 3  # seconds 10000..10003, 10 raw rows per GPU (and host) each
    rows = conn.execute(
        "SELECT gpu, ts, nvlink_tx_bytes_per_s, power_w FROM samples WHERE resolution='1s' AND gpu >= 0 ORDER BY gpu, ts"
    ).fetchall()
    assert len(rows) == 4 * 2
    ranks = conn.execute("SELECT rank, cpu_pct FROM rank_samples WHERE resolution='1s' ORDER BY rank, ts").fetchall()
    assert [(r["rank"], r["cpu_pct"]) for r in ranks] == [(0, pytest.approx(94.5))] * 4 + [(1, None)] * 4
    assert conn.execute("SELECT COUNT(*) FROM rank_samples WHERE resolution='raw'").fetchone()[0] == 2 * 60
    assert store.run_rank_cpu(3)[0]["mean_pct"] == pytest.approx(94.5)  # the averages keep the mean
    gpu0 = [r for r in rows if r["gpu"] == 0]
    assert [r["nvlink_tx_bytes_per_s"] for r in gpu0] == pytest.approx([4.5, 14.5, 24.5, 34.5])
    assert all(10_000 + k <= r["ts"] < 10_001 + k for k, r in enumerate(gpu0))
    assert all(r["power_w"] == pytest.approx(104.5) for r in rows)
    assert all(r["nvlink_tx_bytes_per_s"] is None for r in rows if r["gpu"] == 1)  # NULL stays NULL
    assert conn.execute("SELECT COUNT(*) FROM samples WHERE resolution='raw'").fetchone()[0] == 300 - 120
    assert conn.execute("SELECT MIN(ts) FROM samples WHERE resolution='raw'").fetchone()[0] >= 10_004
    links = conn.execute("SELECT COUNT(*), AVG(tx_bytes_per_s) FROM link_samples WHERE resolution='1s'").fetchone()
    assert links[0] == 8 and links[1] == pytest.approx(1e8)
    # A second pass at the same moment finds nothing more to fold.
    assert apply_retention(conn, raw_keep_s=5.5, now=10_010.0) == 0
    assert conn.execute("SELECT COUNT(*) FROM samples WHERE resolution='1s'").fetchone()[0] == 12


def test_retention_accepts_a_path(db):
    with SampleSink(db) as sink:
        sink.put([gpu_sample(50.0 + k / 10) for k in range(20)])
    assert apply_retention(db, raw_keep_s=0, now=100.0) == 20
    assert connect(db, readonly=True).execute("SELECT COUNT(*) FROM samples").fetchone()[0] == 2


def test_the_ring_keeps_the_newest_samples_only():
    ring = RingBuffer(capacity=5)
    ring.append([gpu_sample(float(t), t % 2) for t in range(12)])
    assert len(ring) == 5
    assert [s.ts for s in ring.snapshot()] == [7.0, 8.0, 9.0, 10.0, 11.0]
    assert [s.ts for s in ring.snapshot(since_ts=9.0)] == [10.0, 11.0]
    assert ring.snapshot(since_ts=11.0) == []
    assert {g: s.ts for g, s in ring.latest_per_gpu().items()} == {0: 10.0, 1: 11.0}
    assert ring.appended == 12


def test_ring_series_gives_one_gpus_column_oldest_first():
    ring = RingBuffer(capacity=100)
    for t in range(10):
        ring.append([gpu_sample(float(t), 0, tx=float(t)), gpu_sample(float(t), 1, tx=None)])
    assert ring.series(0, "nvlink_tx_bytes_per_s", 3) == [7.0, 8.0, 9.0]
    assert ring.series(1, "nvlink_tx_bytes_per_s", 2) == [None, None]
    assert ring.series(5, "power_w", 4) == []
    with pytest.raises(ValueError):
        ring.series(0, "links", 3)


def _fill(db, seconds: int, start: float = 20_000.0) -> None:
    with SampleSink(db) as sink:
        sink.put([gpu_sample(start + k / 10, g, tx=float(k), links=2) for k in range(seconds * 10) for g in (0, 1)])


def _table(db) -> list[tuple]:
    conn = connect(db, readonly=True)
    return [tuple(r) for r in conn.execute(
        "SELECT ts, gpu, resolution, nvlink_tx_bytes_per_s, power_w FROM samples ORDER BY gpu, ts")] + [
        tuple(r) for r in conn.execute("SELECT ts, gpu, link, resolution, tx_bytes_per_s FROM link_samples ORDER BY gpu, link, ts")]


def test_retention_in_small_slices_matches_one_pass(tmp_path):
    one, sliced = tmp_path / "one.db", tmp_path / "sliced.db"
    for path in (one, sliced):
        Store(path).close()
        _fill(path, 12)
    assert apply_retention(one, raw_keep_s=2, now=20_012.0, slice_s=3600) == 10 * 10 * 2
    assert apply_retention(sliced, raw_keep_s=2, now=20_012.0, slice_s=1) == 10 * 10 * 2
    assert _table(one) == _table(sliced)


def test_retention_continues_from_where_it_stopped(tmp_path):
    db = tmp_path / "runs.db"
    Store(db).close()
    _fill(db, 10)
    assert apply_retention(db, raw_keep_s=6, now=20_010.0) == 4 * 10 * 2
    # Later: told where the raw rows start, it folds the next seconds only.
    assert apply_retention(db, raw_keep_s=3, now=20_010.0, since=20_004) == 3 * 10 * 2
    conn = connect(db, readonly=True)
    assert conn.execute("SELECT COUNT(*) FROM samples WHERE resolution='1s'").fetchone()[0] == 7 * 2
    assert conn.execute("SELECT MIN(ts) FROM samples WHERE resolution='raw'").fetchone()[0] >= 20_007


def test_the_sink_applies_retention_itself(tmp_path):
    db = tmp_path / "runs.db"
    Store(db).close()
    sink = SampleSink(db, raw_keep_s=60.0, retention_every_s=0.0, flush_interval_s=0.01)
    sink.put([gpu_sample(1_000.0 + k / 10, 0) for k in range(30)])  # long ago: due for folding
    assert sink.flush()
    sink.close()
    assert sink.error is None
    conn = connect(db, readonly=True)
    assert conn.execute("SELECT COUNT(*) FROM samples WHERE resolution='raw'").fetchone()[0] == 0
    assert conn.execute("SELECT COUNT(*) FROM samples WHERE resolution='1s'").fetchone()[0] == 3
