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
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pkb_tui.engine.solutions import PROJECT_ROOT

# Never let a rank switch NVLink multicast on (it can take a shared host's GPUs out of service).
SAFE_ENV = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}
# Secrets of the launcher and the agents: never in a rank's environment (the ranks get the launch's
# event key only, and drop it before any runner starts: worker._PRIVATE_ENV).
LAUNCHER_SECRETS = ("PKB_JOIN_KEY",)
HEARTBEAT_S = 1.0
DEFAULT_NODE_TIMEOUT_S = 20.0  # a node (or the head, seen from a node) silent this long is lost
DEFAULT_JOIN_TIMEOUT_S = 300.0  # for every node's agent to join a batch


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


def torchrun_command(spec_path: Path, nproc: int, rendezvous: Rendezvous | None, launch: int) -> list[str]:
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
            "-m", "pkb_tui.engine.worker", str(spec_path)]
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
    rendezvous: Rendezvous | None, env_extra: dict[str, str] | None = None,
) -> subprocess.Popen[bytes]:
    """Write this node's spec for a launch and start its torchrun (in a session of its own, output
    in launch.log). ``spec`` holds what the judges need (request, items, mode, the launcher's
    channel address, the local watcher's pid); the folders are added here."""
    scratch = batch_dir / "scratch"
    scratch.mkdir(parents=True, exist_ok=True)
    spec = {**spec, "log_dir": str(batch_dir), "scratch_dir": str(scratch), "node_rank": node_rank}
    spec_path = batch_dir / f"spec.{launch}.json"
    create_new(spec_path, json.dumps(spec).encode())
    cmd = torchrun_command(spec_path, nproc, rendezvous, launch)
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
