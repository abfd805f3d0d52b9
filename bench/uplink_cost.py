"""What the uplink (engine.uplink) costs per event and per telemetry row, measured on this box.

A sender process (a judge, a node agent) sends over 127.0.0.1 to the launcher's server in this
process, which takes each message as the launcher does: events parsed into Event records, sample
batches decoded into GpuSample records and written into a SQLite file by the sink's own function
(collectors.sink.write_samples, one transaction per batch). CPU seconds are taken on each side
(time.process_time), so the figures are costs, not waits. Then the arithmetic of docs/scaling.md
(N nodes x G GPUs x L links at H Hz into one writer) with these figures.

    python bench/uplink_cost.py [--events 20000] [--seconds-of-samples 20] [--nodes 64 --gpus 8 --links 18 --hz 10]
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import sqlite3
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from collectors.sample import (  # noqa: E402
    GpuSample,
    LinkSample,
    sample_from_dict,
    sample_from_row,
    sample_dict,
    sample_to_row,
)
from collectors.sink import write_samples  # noqa: E402
from pkb_tui.engine import events as ev  # noqa: E402
from pkb_tui.engine.uplink import Uplink, UplinkServer  # noqa: E402
from pkb_tui.store.samples import open_sample_writer  # noqa: E402

KEY = os.urandom(32)


def trial_event(i: int) -> ev.Event:
    return ev.TrialResult(item=i % 8, trial=i, correct=True, max_abs_error=1.2e-7, max_rel_error=3.4e-8, worst_rank=3,
                          ranks=[{"rank": r, "correct": True, "max_abs_error": 1e-7, "max_rel_error": 1e-8}
                                 for r in range(8)])


def gpu_sample(ts: float, gpu: int, links: int) -> GpuSample:
    return GpuSample(ts=ts, gpu=gpu, nvlink_tx_bytes_per_s=1.1e11, nvlink_rx_bytes_per_s=1.2e11, pcie_tx_bytes_per_s=3e9,
                     pcie_rx_bytes_per_s=2e9, sm_util_pct=87.0, mem_util_pct=40.0, power_w=612.5, sm_clock_mhz=1980.0,
                     mem_clock_mhz=2619.0, temperature_c=61.0, memory_used_bytes=7.3e10, run_id=1,
                     links=[LinkSample(k, 6.1e9, 6.2e9) for k in range(links)])


ENCODINGS = {"row": (sample_to_row, sample_from_row), "dict": (sample_dict, sample_from_dict)}


def _sender(port: int, kind: str, count: int, gpus: int, links: int, hz: int, out: mp.Queue) -> None:
    started = time.process_time()
    sent_bytes = 0
    if kind == "events":
        link = Uplink(("127.0.0.1", port), KEY, "judge")
        for i in range(count):
            message = {"t": "event", "event": json.loads(trial_event(i).to_json())}
            line = link.session.seal(message)
            sent_bytes += len(line)
            link.sock.sendall(line)
    else:
        link = Uplink(("127.0.0.1", port), KEY, "agent")
        ts = time.time()
        per_batch = gpus * hz // 2  # an agent sends every 0.5 s
        for b in range(count):
            encode = ENCODINGS[kind.split(":")[1]][0]
            rows = [encode(gpu_sample(ts + b * 0.5 + k / (gpus * hz), k % gpus, links)) for k in range(per_batch)]
            line = link.session.seal({"t": "samples", "rows": rows})
            sent_bytes += len(line)
            link.sock.sendall(line)
    link.send({"t": "end"})
    out.put((time.process_time() - started, sent_bytes))
    link.close()


def measure(kind: str, count: int, gpus: int, links: int, hz: int, db: Path | None) -> dict[str, float]:
    server = UplinkServer({"judge": KEY, "agent": KEY})
    results: mp.Queue = mp.Queue()
    child = mp.get_context("fork").Process(target=_sender, args=(server.port, kind, count, gpus, links, hz, results))
    conn = open_sample_writer(db) if db is not None else None
    child.start()
    received = rows = link_rows = 0
    cpu_receive = cpu_write = 0.0
    wall_start = None
    done = False
    while not done:
        t0 = time.process_time()
        messages = server.poll(1.0)
        if not messages and not child.is_alive():
            break
        decoded = []
        for message in messages:
            body = message.body
            if body.get("t") == "end":
                done = True
            elif body.get("t") == "event":
                event = ev.parse_event(json.dumps(body["event"]))
                assert event is not None
                received += 1
            elif body.get("t") == "samples":
                decode = ENCODINGS[kind.split(":")[1]][1]
                batch = [decode(row) for row in body["rows"]]
                decoded.append(batch)
                received += 1
        cpu_receive += time.process_time() - t0
        if messages and wall_start is None:
            wall_start = time.perf_counter()
        for batch in decoded:
            assert conn is not None
            t1 = time.process_time()
            n, links_written = write_samples(conn, batch)
            cpu_write += time.process_time() - t1
            rows += n
            link_rows += links_written
    wall = time.perf_counter() - (wall_start or time.perf_counter())
    send_cpu, sent_bytes = results.get(timeout=60)
    child.join(30)
    server.close()
    db_bytes = 0
    if conn is not None:
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        conn.close()
        assert db is not None
        db_bytes = db.stat().st_size
    return {"db_bytes": db_bytes, "messages": received, "rows": rows, "link_rows": link_rows, "send_cpu_s": send_cpu, "bytes": sent_bytes,
            "receive_cpu_s": cpu_receive, "write_cpu_s": cpu_write, "wall_s": wall}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=20_000)
    parser.add_argument("--seconds-of-samples", type=int, default=20, help="of one node's telemetry, sent as fast as it goes")
    parser.add_argument("--nodes", type=int, default=64)
    parser.add_argument("--gpus", type=int, default=8)
    parser.add_argument("--links", type=int, default=18)
    parser.add_argument("--hz", type=int, default=10)
    args = parser.parse_args(argv)
    print(f"host: {os.uname().nodename}, {os.cpu_count()} CPU(s), load average {os.getloadavg()[0]:.1f}; "
          f"python {sys.version.split()[0]}, SQLite {sqlite3.sqlite_version}")

    e = measure("events", args.events, args.gpus, args.links, args.hz, None)
    per_event = {k: e[k] / e["messages"] for k in ("send_cpu_s", "receive_cpu_s", "bytes")}
    print(f"events: {e['messages']} trial_result events (8 ranks' detail) in {e['wall_s']:.2f} s "
          f"({e['messages'] / e['wall_s']:,.0f}/s); per event: {per_event['bytes']:.0f} bytes, "
          f"judge side {per_event['send_cpu_s'] * 1e6:.1f} us CPU (JSON + HMAC + send), "
          f"launcher side {per_event['receive_cpu_s'] * 1e6:.1f} us CPU (receive + HMAC + parse)")

    costs = {}
    for encoding in ("dict", "row"):  # what a first version sent, and what the agents send
        with tempfile.TemporaryDirectory() as folder:
            batches = args.seconds_of_samples * 2
            s = measure(f"samples:{encoding}", batches, args.gpus, args.links, args.hz, Path(folder) / "bench.db")
        rows = s["rows"]
        send_us, receive_us, write_us = (s[k] / rows * 1e6 for k in ("send_cpu_s", "receive_cpu_s", "write_cpu_s"))
        row_bytes = s["bytes"] / rows
        costs[encoding] = (receive_us, write_us, row_bytes)
        disk_row_bytes = s["db_bytes"] / rows
        print(f"samples as {encoding}s: {rows} GPU rows with {args.links} links each ({s['link_rows']} link rows) in "
              f"{batches} batches; per GPU row: {row_bytes:.0f} bytes on the wire, agent {send_us:.1f} us CPU "
              f"(JSON + HMAC + send), launcher {receive_us:.1f} us CPU (receive + HMAC + decode) + {write_us:.1f} us "
              f"CPU (SQLite insert, its {args.links} link rows included); database {disk_row_bytes:.0f} bytes per "
              f"GPU row with its links")
    receive_us, write_us, row_bytes = costs["row"]
    gpu_rows_s = args.nodes * args.gpus * args.hz
    head_cpu = gpu_rows_s * (receive_us + write_us) / 1e6
    print(f"\narithmetic: {args.nodes} nodes x {args.gpus} GPUs x {args.links} links at {args.hz} Hz")
    print(f"  rows/s into the one writer: {gpu_rows_s:,} GPU rows + {gpu_rows_s * args.links:,} link rows "
          f"+ {args.nodes * args.hz:,} host rows (at most; host rows are 10 Hz)")
    print(f"  bytes/s over the channels into the head: {gpu_rows_s * row_bytes / 1e6:.1f} MB/s "
          f"({gpu_rows_s * row_bytes * 8 / 1e9:.2f} Gb/s)")
    print(f"  head CPU: receive+decode {gpu_rows_s * receive_us / 1e6:.2f} + SQLite {gpu_rows_s * write_us / 1e6:.2f} "
          f"= {head_cpu:.2f} core-seconds per second ({'fits' if head_cpu < 0.5 else 'does NOT fit'} in half a core)")
    print(f"  database growth: {gpu_rows_s * disk_row_bytes / 1e6:.1f} MB/s raw = "
          f"{gpu_rows_s * disk_row_bytes * 3600 / 1e9:.1f} GB per hour (raw rows are folded to 1 s after an hour)")
    most_nodes = 0.5 / (args.gpus * args.hz * (receive_us + write_us) / 1e6)
    print(f"  one writer at half a core keeps up with ~{most_nodes:.0f} nodes of {args.gpus} GPUs at {args.hz} Hz")
    return 0


if __name__ == "__main__":
    sys.exit(main())
