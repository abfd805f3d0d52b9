"""A node agent: `pkb-tui agent` (or `run --node-rank R>0`, or srun under `run --slurm`).

It joins a batch run by the head (the launcher that owns the database) over the uplink, and for each
launch the head orders starts this node's torchrun (engine.nodes, torchrun's c10d rendezvous). It
keeps no database: judge 0 (wherever it sits) sends the events to the head, and the agent sends its
host's telemetry (batched) and heartbeats, and answers the head's clock pings. Liveness both ways:
the head silent for the node timeout (or its channel closed) ends this node's ranks and the agent;
this agent dead ends its judges (they watch its pid, as the head's judges watch the launcher's).
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import socket
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

from pkb_tui.engine import procs
from pkb_tui.engine.nodes import (
    DEFAULT_JOIN_TIMEOUT_S,
    DEFAULT_NODE_TIMEOUT_S,
    HEARTBEAT_S,
    RANK_MODULES,
    Rendezvous,
    start_node_ranks,
)
from pkb_tui.engine.uplink import Uplink, UplinkError, derive_key
from pkb_tui.errors import EXIT_HARNESS, PkbError

TELEMETRY_SEND_S = 0.5  # samples and new log lines go to the head in batches this often
# The ranks' logs the head mirrors beside its own (global ranks: no two nodes write the same name).
MIRRORED_LOG = re.compile(r"(item\d{3}\.rank\d+(\.candidate|\.baseline)?|baseline\.rank\d+)\.log")
MIRROR_CHUNK_BYTES = 256 * 1024  # per file and send
MIRROR_LIMIT_BYTES = 8 * 2**20  # per file: the rest stays on the node (the run's notes say where)


class LogMirror:
    """New bytes of this node's rank logs since the last look (complete lines where it can)."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.sent: dict[str, int] = {}

    def take(self) -> dict[str, str]:
        out = {}
        try:
            names = sorted(p.name for p in self.folder.iterdir() if MIRRORED_LOG.fullmatch(p.name))
        except OSError:
            return {}
        for name in names:
            offset = self.sent.get(name, 0)
            if offset >= MIRROR_LIMIT_BYTES:
                continue
            try:
                fd = os.open(self.folder / name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
            except OSError:
                continue
            try:
                os.lseek(fd, offset, os.SEEK_SET)
                data = os.read(fd, min(MIRROR_CHUNK_BYTES, MIRROR_LIMIT_BYTES - offset))
            finally:
                os.close(fd)
            if b"\n" in data and len(data) == MIRROR_CHUNK_BYTES:
                data = data[:data.rindex(b"\n") + 1]
            if data:
                self.sent[name] = offset + len(data)
                out[name] = data.decode(errors="replace")
        return out


@dataclass
class AgentConfig:
    channel: tuple[str, int]  # the head's uplink server
    join_key: bytes
    node_rank: int
    runs_dir: Path
    join_timeout_s: float = DEFAULT_JOIN_TIMEOUT_S
    telemetry: bool = True


class Agent:
    def __init__(self, config: AgentConfig, log: TextIO | None = None) -> None:
        self.config = config
        config.runs_dir = config.runs_dir.resolve()  # torchrun and the judges run in other folders
        self.log = log or sys.stderr
        self.uplink: Uplink | None = None
        self.proc: Any = None  # this node's torchrun for the current launch
        self.launch = 0
        self.batch_dir: Path | None = None
        self.node_timeout_s = DEFAULT_NODE_TIMEOUT_S
        self.telemetry: Any = None
        self.mirror: LogMirror | None = None
        self._stop = threading.Event()

    def say(self, text: str) -> None:
        print(f"pkb-tui agent (node {self.config.node_rank}): {text}", file=self.log, flush=True)

    # ------------------------------------------------------------------ joining
    def connect(self) -> Uplink:
        """Join the head's batch, retrying until the join timeout (the head may start later)."""
        deadline = time.monotonic() + self.config.join_timeout_s
        about = {"node_rank": self.config.node_rank, "host": socket.gethostname(), "pid": os.getpid()}
        last: Exception | None = None
        while time.monotonic() < deadline:
            try:
                return Uplink(self.config.channel, self.config.join_key, "agent", about, timeout_s=10.0)
            except (OSError, UplinkError) as exc:
                last = exc
                time.sleep(0.5)
        host, port = self.config.channel
        raise PkbError(f"Could not join the batch at {host}:{port} within {self.config.join_timeout_s:g} s "
                       f"({last}); start `pkb-tui run` on the head node, and check PKB_JOIN_KEY is the head's.",
                       exit_code=EXIT_HARNESS)

    def run(self) -> int:
        self.uplink = uplink = self.connect()
        self.say(f"joined the batch at {self.config.channel[0]}:{self.config.channel[1]}")
        self._start_telemetry()
        self._last_heard = self._last_beat = self._last_mirror = time.monotonic()
        try:
            while True:
                try:
                    done = self._step(uplink)
                except UplinkError as exc:
                    self.say(f"the launcher is gone ({exc}); ending this node's ranks")
                    return EXIT_HARNESS
                if done is not None:
                    return done
        finally:
            self._stop.set()
            self._end_launch()
            self._stop_telemetry()
            uplink.close()

    def _step(self, uplink: Uplink) -> int | None:
        """One turn of the agent's loop: a message from the head (or none in 0.2 s), the head's
        deadline, this node's new log bytes, its beat. UplinkError: the head is gone."""
        message = uplink.receive(0.2)
        now = time.monotonic()
        if message is not None:
            self._last_heard = now
            done = self._handle(message)
            if done is not None:
                return done
        elif now - self._last_heard > self.node_timeout_s:
            raise UplinkError(f"no word from it for {self.node_timeout_s:g} s")
        if self.mirror is not None and now - self._last_mirror >= TELEMETRY_SEND_S:
            self._last_mirror = now
            self._send_logs()
        if now - self._last_beat >= HEARTBEAT_S:
            self._last_beat = now
            code = self.proc.poll() if self.proc is not None else None
            uplink.send({"t": "beat", "launch": self.launch, "torchrun_exit": code,
                         "running": self.proc is not None and code is None})
        return None

    def _handle(self, message: dict[str, Any]) -> int | None:
        assert self.uplink is not None
        kind = message.get("t")
        if kind == "ping":
            self.uplink.send({"t": "pong", "t0": message.get("t0"), "t1": time.time()})
        elif kind == "launch":
            self._start_launch(message)
        elif kind == "end_launch":
            self._end_launch()
            self._send_logs()  # everything its ranks wrote, before the head merges each run's log
            self.uplink.send({"t": "launch_ended", "launch": message.get("launch")})
        elif kind == "ranks":
            if self.telemetry is not None:
                self.telemetry.set_rank_pids({int(r): int(p) for r, p in (message.get("pids") or {}).items()})
        elif kind == "refused":
            self.say(f"the launcher refused this node: {message.get('why')}")
            return 2
        elif kind == "done":
            if self.batch_dir is not None:
                from pkb_tui.engine.launcher import remove_old_batches

                self._end_launch()
                remove_old_batches(self.config.runs_dir, keep=self.batch_dir)
            return 0
        return None

    # ------------------------------------------------------------------ launches
    def _start_launch(self, message: dict[str, Any]) -> None:
        assert self.uplink is not None
        self._end_launch()
        self.launch = int(message["launch"])
        self.node_timeout_s = float(message.get("node_timeout_s") or DEFAULT_NODE_TIMEOUT_S)
        batch_id = str(message["batch_id"])
        if not batch_id.replace("-", "").isalnum():
            raise PkbError(f"the launcher sent a batch id that is not one: {batch_id!r}")
        node_rank = self.config.node_rank
        batch_dir = self.config.runs_dir / f"{batch_id}.node{node_rank}"
        if batch_dir != self.batch_dir:
            self.mirror = LogMirror(batch_dir)
        self.batch_dir = batch_dir
        self.batch_dir.mkdir(parents=True, exist_ok=True)
        spec = dict(message["spec"])
        host, port = self.config.channel
        spec.update(launcher=f"{host}:{port}", launcher_pid=os.getpid(), heartbeat_s=HEARTBEAT_S)
        rdzv = message["rendezvous"]
        rendezvous = Rendezvous(nnodes=int(rdzv["nnodes"]), endpoint=str(rdzv["endpoint"]), run_id=str(rdzv["run_id"]),
                                host_store=False, local_addr=self.uplink.sock.getsockname()[0])
        key = derive_key(self.config.join_key, f"events {batch_id} {self.launch}")
        module = str(message.get("module") or RANK_MODULES[0])
        if module not in RANK_MODULES:
            raise PkbError(f"the launcher asked for ranks that run {module!r}, which is none of {', '.join(RANK_MODULES)}")
        self.proc = start_node_ranks(self.batch_dir, self.launch, spec, key, nproc=int(message["nproc"]),
                                     node_rank=node_rank, rendezvous=rendezvous, module=module)
        self.uplink.send({"t": "launched", "launch": self.launch, "batch_dir": str(self.batch_dir),
                          "torchrun_pid": self.proc.pid})

    def _end_launch(self) -> None:
        proc, self.proc = self.proc, None
        if proc is not None:
            procs.kill_process_tree(proc.pid)
            try:
                proc.wait(timeout=10)
            except Exception:  # noqa: BLE001
                pass
        if self.batch_dir is not None:
            shutil.rmtree(self.batch_dir / "scratch", ignore_errors=True)

    def _send_logs(self) -> None:
        if self.mirror is not None and self.uplink is not None:
            files = self.mirror.take()
            if files:
                self.uplink.send({"t": "logs", "files": files})

    # ------------------------------------------------------------------ telemetry
    def _start_telemetry(self) -> None:
        if not self.config.telemetry:
            return
        try:
            from collectors.telemetry import Telemetry

            self.telemetry = Telemetry(None, interval_s=0.1, record=False).start()
        except Exception as exc:  # noqa: BLE001  (telemetry must never stop a batch)
            self.say(f"no telemetry on this node: {exc}")
            self.telemetry = None
            return
        threading.Thread(target=self._send_samples, daemon=True, name="pkb-agent-telemetry").start()

    def _send_samples(self) -> None:
        from collectors.sample import sample_to_row

        since: float | None = None
        while not self._stop.wait(TELEMETRY_SEND_S):
            telemetry, uplink = self.telemetry, self.uplink
            if telemetry is None or uplink is None:
                return
            fresh = [s for s in telemetry.ring.snapshot(since) if since is None or s.ts > since]
            if not fresh:
                continue
            since = max(s.ts for s in fresh)
            try:
                uplink.send({"t": "samples", "rows": [sample_to_row(s) for s in fresh]})
            except UplinkError:
                return

    def _stop_telemetry(self) -> None:
        if self.telemetry is not None:
            try:
                self.telemetry.stop()
            except Exception:  # noqa: BLE001
                pass
            self.telemetry = None


def run_agent(config: AgentConfig, log: TextIO | None = None) -> int:
    """Run an agent until the head says the batch is done (0), or the head is lost (3)."""
    agent = Agent(config, log)

    def stop(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt

    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, stop)
    try:
        return agent.run()
    except KeyboardInterrupt:
        return 130
