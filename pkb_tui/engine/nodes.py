"""Starting one node's ranks: the spec file, torchrun's command line and the ranks' environment.

The launcher (the head: the node that owns the database) and every node agent (engine.agent) start
their node's judges with this one function, so a node is a node wherever it is. On one node
torchrun gets a static rendezvous on 127.0.0.1 (as before); across nodes torchrun's own c10d
rendezvous at the endpoint the user gave (or SLURM's head node), one torchrun agent per node, the
head's hosting the store.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pkb_tui.engine.solutions import PROJECT_ROOT
from pkb_tui.engine.topology import Topology

if TYPE_CHECKING:
    from collectors.sample import GpuSample
    from tasks.base import Traffic

# Never let a rank switch NVLink multicast on (it can take a shared host's GPUs out of service).
SAFE_ENV = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}
# Secrets of the launcher and the agents: never in a rank's environment (the ranks get the launch's
# event key only, and drop it before any runner starts: worker._PRIVATE_ENV).
LAUNCHER_SECRETS = ("PKB_JOIN_KEY",)
HEARTBEAT_S = 1.0
DEFAULT_NODE_TIMEOUT_S = 20.0  # a node (or the head, seen from a node) silent this long is lost
DEFAULT_JOIN_TIMEOUT_S = 300.0  # for every node's agent to join a batch
# What a node's torchrun may run: the judges, or the network calibration's ranks (engine.netcal).
# An agent starts only these, whatever the (authenticated) launch order names.
RANK_MODULES = ("pkb_tui.engine.worker", "pkb_tui.engine.netcal")


@dataclass(frozen=True)
class Rendezvous:
    """torchrun's c10d rendezvous across nodes; ``host_store``: this node hosts its store (the head)."""

    nnodes: int
    endpoint: str  # HOST:PORT
    run_id: str
    host_store: bool
    local_addr: str | None = None  # the address other nodes reach this node's torchrun agent at


def create_new(path: Path, data: bytes) -> None:
    """Create a file we own in a batch folder: never through a planted link or onto an existing file."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644)
    with os.fdopen(fd, "wb") as f:
        f.write(data)


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def torchrun_command(spec_path: Path, nproc: int, rendezvous: Rendezvous | None, launch: int,
                     module: str = RANK_MODULES[0]) -> list[str]:
    cmd = [sys.executable, "-m", "torch.distributed.run"]
    if rendezvous is None:
        # Pass the port explicitly: torch 2.11 defaults to 29500, 2.13 picks a free one.
        cmd += ["--nnodes", "1", "--master-addr", "127.0.0.1", "--master-port", str(free_port())]
    else:
        conf = f"is_host={1 if rendezvous.host_store else 0},join_timeout=600"
        cmd += ["--nnodes", str(rendezvous.nnodes), "--rdzv-backend", "c10d", "--rdzv-endpoint", rendezvous.endpoint,
                # one rendezvous per launch: a relaunch never meets the ranks of the one before
                "--rdzv-id", f"{rendezvous.run_id}-{launch}", "--rdzv-conf", conf]
        if rendezvous.local_addr:
            cmd += ["--local-addr", rendezvous.local_addr]
    cmd += ["--nproc-per-node", str(nproc), "--max-restarts", "0", "--monitor-interval", "0.2",
            "-m", module, str(spec_path)]
    return cmd


def rank_environment(mode: str, scratch: Path, event_key: bytes, node_rank: int,
                     extra: dict[str, str] | None = None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in LAUNCHER_SECRETS}
    env.update(SAFE_ENV)
    env["PKB_EVENT_KEY"] = event_key.hex()  # the judges drop it before they start any runner
    env["PKB_NODE_RANK"] = str(node_rank)
    env["PYTHONUNBUFFERED"] = "1"
    env["TMPDIR"] = str(scratch)  # torchrun's torchelastic_* folders are removed with it
    env["PYTHONPATH"] = os.pathsep.join([str(PROJECT_ROOT), *filter(None, [env.get("PYTHONPATH")])])
    if mode == "cpu":
        env.setdefault("OMP_NUM_THREADS", "1")
        env["CUDA_VISIBLE_DEVICES"] = ""
    env.update(extra or {})
    return env


def start_node_ranks(
    batch_dir: Path, launch: int, spec: dict[str, Any], event_key: bytes, *, nproc: int, node_rank: int,
    rendezvous: Rendezvous | None, env_extra: dict[str, str] | None = None, module: str = RANK_MODULES[0],
) -> subprocess.Popen[bytes]:
    """Write this node's spec for a launch and start its torchrun (in a session of its own, output
    in launch.log). ``spec`` holds what the judges need (request, items, mode, the launcher's
    channel address, the local watcher's pid); the folders are added here. ``module``: what each
    rank runs, one of RANK_MODULES (the judges, or the network calibration)."""
    if module not in RANK_MODULES:
        raise ValueError(f"not a module a node's ranks run: {module!r}")
    scratch = batch_dir / "scratch"
    scratch.mkdir(parents=True, exist_ok=True)
    spec = {**spec, "log_dir": str(batch_dir), "scratch_dir": str(scratch), "node_rank": node_rank}
    spec_path = batch_dir / f"spec.{launch}.json"
    create_new(spec_path, json.dumps(spec).encode())
    cmd = torchrun_command(spec_path, nproc, rendezvous, launch, module)
    env = rank_environment(spec["mode"], scratch, event_key, node_rank, env_extra)
    launch_log = batch_dir / "launch.log"
    with os.fdopen(os.open(launch_log, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW, 0o644), "ab") as log:
        log.write(f"\n=== launch {launch}: {' '.join(cmd)}\n".encode())
        log.flush()
        return subprocess.Popen(
            cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            env=env, cwd=str(scratch), start_new_session=True,
        )


def is_loopback(host: str) -> bool:
    try:
        return all(str(info[4][0]).startswith("127.") or str(info[4][0]) == "::1"
                   for info in socket.getaddrinfo(host, None))
    except OSError:
        return False


# ---------------------------------------------------------------------------- per node: Live and wire bytes
LATE_AFTER_S = 3 * HEARTBEAT_S  # a node not heard from this long is "silent" on Live (lost at its node timeout)


def live_node(node: int, host: str, heard_at: float | None, latest: Mapping[int, GpuSample]) -> dict[str, Any]:
    """One node as Live shows it, from its latest sample per GPU and its host row (``latest``, as
    RingBuffer.latest_per_gpu gives): its GPUs' NVLink and PCIe rates summed, its NICs' rates.
    A figure that was not measured is None with the reason in ``*_na``, never 0."""
    gpus = [s for gpu, s in sorted(latest.items()) if gpu >= 0]
    host_row = latest.get(-1)

    def total(name: str) -> float | None:
        values = [getattr(s, name) for s in gpus]
        return float(sum(values)) if gpus and all(v is not None for v in values) else None

    out: dict[str, Any] = {
        "node": node, "host": host, "heard_at": heard_at, "gpus": len(gpus),
        "link_tx_bytes_per_s": total("nvlink_tx_bytes_per_s"), "link_rx_bytes_per_s": total("nvlink_rx_bytes_per_s"),
        "pcie_tx_bytes_per_s": total("pcie_tx_bytes_per_s"), "pcie_rx_bytes_per_s": total("pcie_rx_bytes_per_s"),
        "nic_tx_bytes_per_s": host_row.nic_tx_bytes_per_s if host_row is not None else None,
        "nic_rx_bytes_per_s": host_row.nic_rx_bytes_per_s if host_row is not None else None,
        "sampled_at": max((s.ts for s in latest.values()), default=None),
    }
    out["link_na"] = (None if out["link_tx_bytes_per_s"] is not None else
                      "no GPU sampled on this node" if not gpus else "NVML counts no NVLink traffic here")
    out["nic_na"] = (None if out["nic_tx_bytes_per_s"] is not None else
                     "no host sample yet" if host_row is None else "no NIC counters on this host")
    return out


def rank_nodes_of(rank_nodes: Sequence[int] | None, topology: Topology) -> list[int]:
    """Each rank's node: as the ranks said (BatchStarted.rank_nodes), else torchrun's numbering."""
    if rank_nodes and len(rank_nodes) == topology.world_size:
        return [int(n) for n in rank_nodes]
    return [topology.node_of(r) for r in range(topology.world_size)]


def node_wire(
    per_rank: Sequence[Mapping[str, Any] | None], rank_nodes: Sequence[int], hosts: Mapping[int, str],
    topology: Topology, rank_traffic: Sequence[Traffic] | None, mode: str,
) -> list[dict[str, Any]]:
    """Per node, for one variant's timed blocks: the bytes per call its GPUs' links carried (the
    busier direction of each GPU's NVLink, summed over the node's ranks) and its NICs carried
    (counted by the node's first rank over the same blocks), against what the traffic model says
    the node's ranks must move on-node and off-node: each rank's bytes split by the share of its
    peers on other nodes (Topology.cross_node_share). A figure that was not measured is None with
    ``*_na`` saying why, never 0. ``per_rank``: LinkBytes.per_rank (None or {} for a rank that sent none)."""
    share = topology.cross_node_share()
    same_host = len(set(hosts.values())) == 1 and len(hosts) > 1
    out = []
    for node in sorted(set(rank_nodes)):
        ranks = [r for r, n in enumerate(rank_nodes) if n == node]
        entries: list[Mapping[str, Any]] = [per_rank[r] or {} if r < len(per_rank) else {} for r in ranks]
        row: dict[str, Any] = {"node": node, "host": hosts.get(node, "?"), "ranks": ranks}
        # GPU links: every rank of the node must have counted, else the sum would read low.
        links = [e.get("nvlink_bytes_per_iter") for e in entries]
        if mode == "shared-gpu":
            row["link_bytes_per_iter"], row["link_na"] = None, "the node's ranks share one GPU (shared-gpu mode)"
        elif entries and all(v is not None for v in links):
            row["link_bytes_per_iter"], row["link_na"] = float(sum(links)), None  # type: ignore[arg-type]
        else:
            reason = next((e.get("reason") for e in entries if e.get("reason")), None)
            row["link_bytes_per_iter"] = None
            row["link_na"] = reason or ("no GPU: cpu mode" if mode == "cpu" else "no link counters came from this node's ranks")
        counted = next((e for e in entries if e.get("nic_iterations")), None)
        if counted is not None:
            calls = float(counted["nic_iterations"])
            row["nic_tx_bytes_per_iter"] = float(counted["nic_tx_bytes"]) / calls
            row["nic_rx_bytes_per_iter"] = float(counted["nic_rx_bytes"]) / calls
            row["nic_na"] = None
        else:
            row["nic_tx_bytes_per_iter"] = row["nic_rx_bytes_per_iter"] = None
            row["nic_na"] = next((e.get("nic_reason") for e in entries if e.get("nic_reason")), None) or \
                "no NIC figures came from this node's ranks"
        if rank_traffic is not None and len(rank_traffic) == len(rank_nodes):
            mine = [rank_traffic[r] for r in ranks]
            row["model_on_node_bytes_per_iter"] = sum(t.wire_bytes for t in mine) * (1.0 - share)
            row["model_off_node_send_bytes_per_iter"] = sum(t.send_bytes for t in mine) * share
            row["model_off_node_recv_bytes_per_iter"] = sum(t.recv_bytes for t in mine) * share
            row["model_na"] = None
        else:
            row["model_on_node_bytes_per_iter"] = row["model_off_node_send_bytes_per_iter"] = None
            row["model_off_node_recv_bytes_per_iter"] = None
            row["model_na"] = "the task has no traffic model for this size"
        # Two "nodes" on one host talk over loopback: their NICs carry none of it.
        row["note"] = "the nodes share one host: what crosses between them goes over loopback, not a NIC" if same_host else None
        out.append(row)
    return out
