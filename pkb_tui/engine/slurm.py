"""SLURM: what a batch takes from an allocation's environment, and how the head starts the agents.

Inside `salloc`/`sbatch` the head (`pkb-tui run --slurm`, on the allocation's first node) reads the
node count and its own node from SLURM's variables and starts one agent on every other node with
`srun --relative 1`. The worker knows nothing of SLURM: the agents start torchrun as on any node.
"""

from __future__ import annotations

import os
import re
import socket
import sys
from collections.abc import Mapping
from dataclasses import dataclass

from pkb_tui.errors import PkbError

# srun numbers the nodes of a step from 0; the agents' step starts at the allocation's node 1.
NODE_OFFSET_ENV = "PKB_SLURM_NODE_OFFSET"


@dataclass(frozen=True)
class Allocation:
    job_id: str
    nnodes: int
    node_rank: int
    nodes: list[str]  # host names, SLURM_JOB_NODELIST expanded

    @property
    def head_host(self) -> str:
        return self.nodes[0] if self.nodes else socket.gethostname()


def expand_nodelist(text: str) -> list[str]:
    """SLURM's compressed host list ('gpu[01-03,07],login1') in order, as `scontrol show hostnames`."""
    hosts: list[str] = []
    for match in re.finditer(r"([^,\[]+)(?:\[([^\]]+)\])?(?:,|$)", text.strip()):
        prefix, ranges = match.group(1), match.group(2)
        if not prefix and not ranges:
            continue
        if ranges is None:
            hosts.append(prefix)
            continue
        for part in ranges.split(","):
            low, _, high = part.partition("-")
            if not high:
                hosts.append(prefix + low)
                continue
            width = len(low)
            hosts.extend(f"{prefix}{n:0{width}d}" for n in range(int(low), int(high) + 1))
    return hosts


def allocation(env: Mapping[str, str] | None = None) -> Allocation:
    """The allocation this process runs in; a PkbError sentence outside one."""
    env = os.environ if env is None else env
    job_id = env.get("SLURM_JOB_ID") or env.get("SLURM_JOBID")
    nnodes = env.get("SLURM_NNODES") or env.get("SLURM_JOB_NUM_NODES")
    if not job_id or not nnodes:
        raise PkbError("--slurm needs a SLURM allocation (SLURM_JOB_ID and SLURM_NNODES are not set); "
                       "run inside salloc or an sbatch script, or give --nnodes and --rdzv-endpoint.")
    offset = int(env.get(NODE_OFFSET_ENV, "0") or 0)
    node_rank = int(env.get("SLURM_NODEID", "0") or 0) + offset
    nodes = expand_nodelist(env.get("SLURM_JOB_NODELIST") or env.get("SLURM_NODELIST") or "")
    return Allocation(job_id=str(job_id), nnodes=int(nnodes), node_rank=node_rank, nodes=nodes)


def agents_command(alloc: Allocation, channel: str, runs_dir: str | None) -> list[str]:
    """srun for one agent on every node but the head's: nodes 1..N-1 of the allocation."""
    others = alloc.nnodes - 1
    cmd = ["srun", "--nodes", str(others), "--ntasks", str(others), "--ntasks-per-node", "1",
           "--relative", "1", "--kill-on-bad-exit=1", sys.executable, "-m", "pkb_tui.cli"]
    if runs_dir:
        cmd += ["--runs-dir", runs_dir]
    cmd += ["agent", "--slurm", "--channel", channel]
    return cmd
