"""The network between nodes, measured per pair of hosts: `pkb-tui calibrate --network`.

The head (the node that owns the database) gathers its nodes as a multi-node run does (agents
joining over the uplink, srun under --slurm: Launcher.calibrate_network) and starts one launch of
this module, one rank per node, on torchrun's c10d rendezvous. For each pair of nodes in turn the
two ranks measure, while the others wait at a barrier:

- the latency: ping-pong of an 8-byte message, round trips / 2, median of the repetitions;
- the bandwidth each way: the sender streams ``calls`` messages of a size back to back and the
  window closes when the receiver's one-message acknowledgement arrives, so it ends when the last
  byte is in (a send returns when its buffer is handed to the transport, not when it arrived).
  Before each window the receiver says it is ready, so the sender never times the receiver's
  start. The window is read with the host's monotonic clock after synchronising the device: a
  transfer between two hosts has no single device whose events would see both ends.
  Per size the median over repetitions (the first dropped as warm-up); the pair's figure is the
  best size's, and the pair's bandwidth the slower direction's (what crosses both ways is held
  back by it).

gloo over TCP in cpu mode, NCCL on GPU 0 of each node in nccl mode (the mode decides, as for runs).
Rank 0 (wherever c10d put it) sends the report to the head over its uplink (the launch's event key);
the head stores one calibrations row per pair of hosts (kind network_busbw, host_a/host_b).
"""

from __future__ import annotations

import json
import os
import socket
import statistics
import sys
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

KiB = 1024
MiB = 1024 * KiB
# gloo copies through host memory and a TCP socket: smaller messages than NCCL needs to show its peak.
CPU_SIZES = (64 * KiB, 1 * MiB, 4 * MiB, 16 * MiB)
CPU_QUICK_SIZES = (64 * KiB, 1 * MiB)
GPU_SIZES = (1 * MiB, 16 * MiB, 64 * MiB, 256 * MiB)
GPU_QUICK_SIZES = (1 * MiB, 64 * MiB)
LATENCY_BYTES = 8
LATENCY_ROUND_TRIPS = 50
REPEATS = 5  # timed repetitions per size, after one warm-up
STREAM_BYTES = {"cpu": 16 * MiB, "nccl": 512 * MiB}  # at least this much per timed window (capped by CALLS_MAX)
CALLS_MAX = 32
NETWORK_MODES = ("cpu", "nccl")
MODULE = "pkb_tui.engine.netcal"
METHOD = ("sender's monotonic clock over `calls` back-to-back sends closed by the receiver's 8-byte "
          "acknowledgement (device synchronised first), the receiver ready before each window; median of "
          f"{REPEATS} after a warm-up; latency: 8-byte ping-pong, round trip / 2")


def sizes_for(mode: str, quick: bool) -> tuple[int, ...]:
    if mode == "cpu":
        return CPU_QUICK_SIZES if quick else CPU_SIZES
    return GPU_QUICK_SIZES if quick else GPU_SIZES


def calls_for(mode: str, size: int) -> int:
    return max(2, min(CALLS_MAX, STREAM_BYTES[mode] // max(1, size)))


# ---------------------------------------------------------------------- one pair, on its two ranks
def _sync(device: Any) -> None:
    import torch

    if device.type == "cuda":
        torch.cuda.synchronize(device)


def measure_latency_us(peer: int, leader: bool, device: Any, round_trips: int = LATENCY_ROUND_TRIPS,
                       repeats: int = REPEATS) -> list[float]:
    """One-way latency per repetition (the leader's list; the other rank's is empty)."""
    import torch
    import torch.distributed as dist

    token = torch.zeros(LATENCY_BYTES // 4, dtype=torch.float32, device=device)
    out = []
    for repeat in range(repeats + 1):
        _sync(device)
        start = time.perf_counter()
        for _ in range(round_trips):
            if leader:
                dist.send(token, peer)
                dist.recv(token, peer)
            else:
                dist.recv(token, peer)
                dist.send(token, peer)
        _sync(device)
        if leader and repeat:
            out.append((time.perf_counter() - start) / (2 * round_trips) * 1e6)
    return out


def measure_stream_s(peer: int, sender: bool, device: Any, size_bytes: int, calls: int, repeats: int = REPEATS,
                     receiver_delay_s: float = 0.0) -> list[float]:
    """Seconds per window of ``calls`` messages of ``size_bytes`` from the sender to its peer (the
    sender's list; the receiver's is empty). ``receiver_delay_s``: the receiver waits this long
    before it acknowledges: a known duration inside the window, to check the timing with."""
    import torch
    import torch.distributed as dist

    buffer = torch.rand(max(1, size_bytes // 4), dtype=torch.float32, device=device)  # never zeros
    ack = torch.zeros(LATENCY_BYTES // 4, dtype=torch.float32, device=device)
    out = []
    for repeat in range(repeats + 1):
        if sender:
            dist.recv(ack, peer)  # the receiver is ready
            _sync(device)
            start = time.perf_counter()
            for _ in range(calls):
                dist.send(buffer, peer)
            dist.recv(ack, peer)  # the last byte is in
            _sync(device)
            if repeat:
                out.append(time.perf_counter() - start)
        else:
            dist.send(ack, peer)
            for _ in range(calls):
                dist.recv(buffer, peer)
            _sync(device)
            if receiver_delay_s:
                time.sleep(receiver_delay_s)
            dist.send(ack, peer)
            _sync(device)
    return out


def sweep(peer: int, sender: bool, device: Any, mode: str, sizes: tuple[int, ...], repeats: int = REPEATS) -> list[dict[str, Any]]:
    """One direction of a pair at every size: per size the calls per window, each window's seconds,
    the median's GB/s (the sender's figures; the receiver's list holds no timings)."""
    points = []
    for size in sizes:
        calls = calls_for(mode, size)
        seconds = measure_stream_s(peer, sender, device, size, calls, repeats)
        if sender:
            median_s = statistics.median(seconds)
            points.append({"size_bytes": size, "calls": calls, "seconds": seconds,
                           "gbps": calls * size / median_s / 1e9, "time_per_call_us": median_s / calls * 1e6})
    return points


def direction(points: list[dict[str, Any]]) -> dict[str, Any]:
    peak = max(points, key=lambda p: p["gbps"])
    return {"sweep": points, "peak_gbps": peak["gbps"], "peak_size_bytes": peak["size_bytes"]}


# ---------------------------------------------------------------------- the ranks (torchrun -m pkb_tui.engine.netcal)
def main(argv: list[str] | None = None) -> int:
    import torch
    import torch.distributed as dist

    from pkb_tui.engine.modes import backend_for, mode_info
    from pkb_tui.engine.uplink import Uplink, parse_address

    argv = sys.argv[1:] if argv is None else argv
    spec = json.loads(Path(argv[0]).read_text())
    event_key = bytes.fromhex(os.environ.pop("PKB_EVENT_KEY", ""))
    mode = str(spec["mode"])
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    node_rank = int(os.environ.get("PKB_NODE_RANK", "0") or 0)
    device = torch.device(mode_info(mode).device_for(int(os.environ.get("LOCAL_RANK", "0"))))
    if device.type == "cuda":
        torch.cuda.set_device(device)
    timeout = timedelta(seconds=float(spec["timeout_s"]))
    dist.init_process_group(backend=backend_for(mode), timeout=timeout)
    control = dist.new_group(backend="gloo", timeout=timeout) if backend_for(mode) != "gloo" else None
    me = {"rank": rank, "node": node_rank, "host": socket.gethostname()}
    everyone: list[Any] = [None] * world
    dist.all_gather_object(everyone, me, group=control)
    uplink = None
    if rank == 0:
        uplink = Uplink(parse_address(str(spec["launcher"])), event_key, "judge",
                        {"rank": rank, "node_rank": node_rank, "pid": os.getpid()})
    # One rank per node measures for it (the first, should a node have several).
    first_rank: dict[int, int] = {}
    for who in sorted(everyone, key=lambda w: w["rank"]):
        first_rank.setdefault(int(who["node"]), int(who["rank"]))
    nodes = sorted(first_rank)
    sizes = tuple(int(s) for s in spec["sizes"])
    repeats = int(spec.get("repeats") or REPEATS)
    mine: list[dict[str, Any]] = []
    for i, a in enumerate(nodes):
        for b in nodes[i + 1:]:
            ra, rb = first_rank[a], first_rank[b]
            if uplink is not None:
                uplink.send({"t": "progress", "text": f"network between node {a} and node {b} ({mode} mode)"})
            if rank in (ra, rb):
                peer = rb if rank == ra else ra
                latency = measure_latency_us(peer, rank == ra, device, repeats=repeats)
                forward = sweep(peer, rank == ra, device, mode, sizes, repeats)  # a -> b, timed on a
                backward = sweep(peer, rank == rb, device, mode, sizes, repeats)  # b -> a, timed on b
                own = forward if rank == ra else backward
                mine.append({"nodes": [a, b], "from": a if rank == ra else b, "direction": direction(own),
                             **({"latency_us": latency} if rank == ra else {})})
            dist.barrier(group=control)
    gathered: list[Any] = [None] * world if rank == 0 else []
    dist.gather_object(mine, gathered if rank == 0 else None, dst=0, group=control)
    if uplink is not None:
        uplink.send({"t": "netcal", "mode": mode, "nodes": everyone,
                     "parts": [part for parts in gathered for part in (parts or [])]})
        uplink.close()
    dist.barrier(group=control)
    dist.destroy_process_group()
    return 0


# ---------------------------------------------------------------------- the head: rows and the table
def pair_rows(report: dict[str, Any], measured_at: float | None = None) -> list[dict[str, Any]]:
    """The calibrations rows of a report (one per pair of hosts; two node pairs on the same pair of
    hosts keep the slower): bandwidth the slower direction's peak, latency the median one-way."""
    from pkb_tui.store.schema import host_pair

    hosts = {int(n["node"]): str(n["host"]) for n in report.get("nodes") or []}
    by_pair: dict[tuple[int, int], dict[str, Any]] = {}
    for part in report.get("parts") or []:
        a, b = (int(n) for n in part["nodes"])
        entry = by_pair.setdefault((a, b), {"directions": {}, "latency_us": None})
        entry["directions"][f"{part['from']}->{b if int(part['from']) == a else a}"] = part["direction"]
        if part.get("latency_us"):
            entry["latency_us"] = part["latency_us"]
    now = time.time() if measured_at is None else measured_at
    rows: dict[tuple[str, str], dict[str, Any]] = {}
    for (a, b), entry in sorted(by_pair.items()):
        if len(entry["directions"]) != 2:
            continue  # a side that did not report: no figure for the pair
        slower_key = min(entry["directions"], key=lambda k: entry["directions"][k]["peak_gbps"])
        slower = entry["directions"][slower_key]
        latency = statistics.median(entry["latency_us"]) if entry["latency_us"] else None
        host_a, host_b = host_pair(hosts.get(a, f"node{a}"), hosts.get(b, f"node{b}"))
        row = {
            "kind": "network_busbw", "host_a": host_a, "host_b": host_b, "bandwidth_gbps": slower["peak_gbps"],
            "latency_us": latency, "size_bytes": slower["peak_size_bytes"], "mode": report.get("mode"),
            "measured_at": now, "gpu_a": None, "gpu_b": None,
            "detail": {"nodes": [a, b], "node_hosts": [hosts.get(a), hosts.get(b)], "slower_direction": slower_key,
                       "directions": entry["directions"], "latency_samples_us": entry["latency_us"],
                       "backend": "gloo (TCP)" if report.get("mode") == "cpu" else "NCCL (GPU 0 of each node)",
                       "method": METHOD, "same_host": host_a == host_b},
        }
        known = rows.get((host_a, host_b))
        if known is None or row["bandwidth_gbps"] < known["bandwidth_gbps"]:
            rows[(host_a, host_b)] = row
    return list(rows.values())


def format_pairs(rows: list[dict[str, Any]]) -> str:
    lines = [f"{'hosts':<40} {'nodes':<6} {'GB/s':>8} {'each way GB/s':>17} {'at size':>9} {'latency us':>11}"]
    for row in rows:
        detail = row["detail"]
        ways = " / ".join(f"{d['peak_gbps']:.2f}" for d in detail["directions"].values())
        size = row["size_bytes"] / MiB
        latency = f"{row['latency_us']:.1f}" if row.get("latency_us") is not None else "-"
        nodes = "-".join(str(n) for n in detail["nodes"])
        lines.append(f"{row['host_a'] + ' <-> ' + row['host_b']:<40} {nodes:<6} "
                     f"{row['bandwidth_gbps']:>8.2f} {ways:>17} {size:>6.2f} MiB {latency:>11}")
        for name, way in detail["directions"].items():
            points = ", ".join(f"{p['size_bytes'] / MiB:g} MiB {p['gbps']:.2f}" for p in way["sweep"])
            lines.append(f"  node {name}: {points} (GB/s, median of {REPEATS})")
        if detail.get("same_host"):
            lines.append("  (both nodes on one host: this is loopback, not a network)")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
