"""Turns a RunRequest into runs in the database: one torchrun launch for a whole batch.

torchrun (python -m torch.distributed.run) is started as a child process in its own session, with
an explicit free port (one node) or on torchrun's c10d rendezvous (several nodes: this launcher is
the head, the node that owns the database; an agent on each other node, engine.agent, starts that
node's torchrun when told). The ranks (engine.worker) stay up for every item of the batch; judge 0
sends events over the uplink (engine.uplink) to this launcher, which stores what they carry. Only
the launcher writes run results; the agents' telemetry reaches the same database through it. A run that hangs past its timeout, or a rank that dies, ends that run as
timeout / error; the whole process tree is killed, and the rest of the batch goes on in a fresh
launch. Cancelling (or Ctrl-C) kills the tree and records the run as interrupted.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import shutil
import socket
import subprocess
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pkb_tui.engine import events as ev
from pkb_tui.engine import procs, stats, timing
from pkb_tui.engine.logs import RANKS_DID_NOT_START, launch_failure_detail, read_regular
from pkb_tui.engine.modes import check_world_size, choose_mode, timings_representative
from pkb_tui.engine.nodes import (
    DEFAULT_JOIN_TIMEOUT_S,
    DEFAULT_NODE_TIMEOUT_S,
    HEARTBEAT_S,
    Rendezvous,
    is_loopback,
    live_node,
    node_wire,
    rank_nodes_of,
    start_node_ranks,
)
from pkb_tui.engine.request import RunItem, RunRequest
from pkb_tui.engine.solutions import PROJECT_ROOT, baseline_arity, find_model, validate_solution_file
from pkb_tui.engine.topology import Topology
from pkb_tui.engine.uplink import Message, Peer, UplinkServer, derive_key, parse_address
from pkb_tui.errors import EXIT_HARNESS, PkbError
from pkb_tui.store import Store, default_db_path
from pkb_tui.store.recovery import BatchWriter, RecoverySampleSink, not_stored_sentence, read_only_database_sentence
from tasks.base import SIZE_NAMES, Traffic, all_tasks, broken_tasks, load_task

EventCallback = Callable[[ev.Event, "int | None"], None]

NETWORK_NEEDS_NODES = ("--network measures the network between nodes: give --nnodes 2 or more with --rdzv-endpoint "
                       "HOST:PORT (and start `pkb-tui agent` on the other nodes), or --slurm in an allocation of "
                       "two or more nodes.")
HEARTBEAT_TIMEOUT_S = 60.0
# A judge or torchrun seen stopped (SIGSTOP, a tracer) this long ends the launch: nothing of ours
# stops them, so something else did, and the batch would otherwise hang on it.
STOPPED_LIMIT_S = 10.0


def judge_grace_s(timeout_s: float) -> float:
    """Beyond a run's timeout, for its judges to end the candidate and report (a quarter of the
    timeout, 5-60 s), so the timeout still bounds the wall time."""
    return min(60.0, max(5.0, 0.25 * float(timeout_s)))


@dataclass
class Cluster:
    """How a batch spreads over nodes; the default is one node (this one)."""

    nnodes: int = 1
    rdzv_endpoint: str | None = None  # HOST:PORT of torchrun's c10d rendezvous (hosted by the head)
    rdzv_id: str | None = None  # default: the batch id
    channel_port: int | None = None  # the head's uplink port (default: the rendezvous port + 1)
    join_key: bytes | None = None  # what agents must know to join (PKB_JOIN_KEY); default: random
    node_timeout_s: float = DEFAULT_NODE_TIMEOUT_S
    join_timeout_s: float = DEFAULT_JOIN_TIMEOUT_S
    agents_command: list[str] | None = None  # started once the uplink listens (srun under --slurm)

    @property
    def multi_node(self) -> bool:
        return self.nnodes > 1

    def endpoint(self) -> tuple[str, int]:
        if not self.rdzv_endpoint:
            raise PkbError(f"--nnodes {self.nnodes} needs --rdzv-endpoint HOST:PORT (this node's address and a "
                           "free port for torchrun's rendezvous), or --slurm inside an allocation.")
        try:
            return parse_address(self.rdzv_endpoint)
        except ValueError as exc:
            raise PkbError(f"--rdzv-endpoint: {exc}; give HOST:PORT.") from None

    def uplink_port(self) -> int:
        return self.channel_port if self.channel_port else self.endpoint()[1] + 1


@dataclass
class _Node:
    """Another node of the batch, as its agent said it is."""

    rank: int
    peer: Peer
    host: str
    pid: int
    host_id: int | None = None
    batch_dir: str | None = None
    torchrun_exit: int | None = None
    running: bool = False
    ended_launch: int = 0
    pings: list[tuple[float, float]] = field(default_factory=list)  # (round trip s, offset s)
    latest: dict[int, Any] = field(default_factory=dict)  # its newest sample per GPU (-1: the host row), for Live

    @property
    def clock_offset_s(self) -> float:
        """Its clock minus ours, from the ping with the shortest round trip (NTP's rule)."""
        return min(self.pings)[1] if self.pings else 0.0

    @property
    def round_trip_s(self) -> float | None:
        return min(self.pings)[0] if self.pings else None

    def describe(self) -> str:
        return f"node {self.rank} ({self.host}, agent pid {self.pid})"


@dataclass
class BatchOutcome:
    run_ids: list[int]
    statuses: dict[int, str]
    skipped: list[str] = field(default_factory=list)  # sentences: pairs not run and why
    # The database went away during the batch (store.recovery): what happened, and the file that
    # holds the batch's results for `pkb-tui import` (None with not_stored set: none could be written).
    not_stored: str | None = None
    recovery_path: Path | None = None
    recovery_error: str | None = None
    database: Path | None = None

    @property
    def not_stored_sentence(self) -> str | None:
        """The sentence to end the batch with when its results are not in the database."""
        if self.not_stored is None:
            return None
        return not_stored_sentence(self.not_stored, self.recovery_path, self.recovery_error,
                                   self.database or default_db_path())

    @property
    def all_passed(self) -> bool:
        return bool(self.statuses) and all(s == "passed" for s in self.statuses.values())


@dataclass
class _RunState:
    run_id: int
    item: RunItem
    trials: list[dict[str, Any]] = field(default_factory=list)
    timed_check: dict[str, Any] | None = None
    timings: dict[str, ev.Timing] = field(default_factory=dict)
    link_bytes: dict[str, ev.LinkBytes] = field(default_factory=dict)
    errors: list[str] = field(default_factory=list)
    neighbours: dict[str, str] = field(default_factory=dict)  # other batches that ran meanwhile: note
    started: bool = False
    finished: bool = False
    status: str = "queued"


class Launcher:
    def __init__(self, db_path: Path | str | None = None, *, runs_dir: Path | str | None = None,
                 cluster: Cluster | None = None, noise_floor: bool = True) -> None:
        self.db_path = Path(db_path) if db_path is not None else default_db_path()
        self.runs_dir = Path(runs_dir).resolve() if runs_dir is not None else self.db_path.resolve().parent / "pkb-runs"
        self.cluster = cluster or Cluster()
        # False: intervals from the rounds alone, no calibrated floor folded in (calibrate's own
        # self-check measures the floor from those).
        self.use_noise_floor = noise_floor
        self.telemetry: Any = None  # a collectors.telemetry.Telemetry while a batch runs
        self._ring: Any = None  # its ring of samples, kept to the batch's end (a database lost at the very end)
        self.skipped: list[str] = []
        self.outcome: BatchOutcome | None = None  # the last batch's, also when run() raised (Ctrl-C)
        self._proc: subprocess.Popen | None = None
        self._server: UplinkServer | None = None
        self._nodes: dict[int, _Node] = {}
        self._agents_proc: subprocess.Popen | None = None
        self._lost: str | None = None  # a node lost during the batch: nothing more can launch
        self._run_id: int | None = None  # the run now running (its samples are stamped with it)
        self._network: Any = None  # roofline.NetworkCeiling of a multi-node batch's hosts

    # ------------------------------------------------------------------ planning (no processes)
    def plan(self, request: RunRequest) -> list[RunItem]:
        """Resolve and check everything that can be checked before launching; raise PkbError."""
        if request.trials < 1:
            raise PkbError(f"--trials must be at least 1 (got {request.trials}).")
        if request.timing and request.iterations < 1:
            raise PkbError(f"--iterations must be at least 1 (got {request.iterations}); --no-timing skips timing.")
        if request.warmup < 0:
            raise PkbError(f"--warmup must be 0 or more (got {request.warmup}).")
        if request.timeout_s <= 0:
            raise PkbError(f"--timeout must be positive (got {request.timeout_s}).")
        for flag, value in (("--max-host-memory-gib", request.max_host_memory_gib), ("--max-tasks", request.max_tasks),
                            ("--max-cpu-s", request.max_cpu_s), ("--max-gpu-memory-gib", request.max_gpu_memory_gib)):
            if value is not None and not value > 0:
                raise PkbError(f"{flag} must be positive (got {value}); leave it out for the default.")
        if request.size not in SIZE_NAMES:
            raise PkbError(f"Unknown size {request.size!r}; choose one of {', '.join(SIZE_NAMES)}.")
        topology = Topology.of(request.world_size, self.cluster.nnodes)
        if self.cluster.multi_node:
            self.cluster.endpoint()  # a missing or malformed endpoint is a usage error now
        # A mode is chosen and checked per node: each node holds ranks_per_node of the ranks.
        mode = choose_mode(topology.ranks_per_node, request.mode)
        check_world_size(topology.ranks_per_node, mode, oversubscribe=request.oversubscribe)
        every = request.tasks == ["all"]
        task_ids = list(all_tasks()) if every else list(dict.fromkeys(request.tasks))
        if not task_ids:
            raise PkbError("No task given; pass --task ID[,ID...] or --task all.")
        tasks = [load_task(t) for t in task_ids]
        models = [find_model(m) for m in dict.fromkeys(request.models)]
        if not models:
            raise PkbError("No model given; pass --model NAME|PATH[,...] (baseline runs the baseline itself).")
        self.skipped = []
        if every:
            self.skipped += [f"Task module {name} did not load: {why}." for name, why in sorted(broken_tasks().items())]
        items: list[RunItem] = []
        for task in tasks:
            try:
                task.check_request(world_size=request.world_size, mode=mode, dtype=request.dtype, size=request.size)
            except PkbError as exc:
                if every:
                    self.skipped.append(str(exc))
                    continue
                raise
            for model in models:
                solution = None if model.is_baseline else model.solution_file(task.id)
                if not model.is_baseline and solution is None:
                    message = f"Model {model.name} has no solution for task {task.id} (looked in {model.path})."
                    if every or len(tasks) > 1:
                        self.skipped.append(message)
                        continue
                    raise PkbError(message)
                invalid_reason = None
                if solution is not None:
                    # A bad candidate file is that model's failed run, not the whole batch's usage error.
                    try:
                        validate_solution_file(solution, task.id, baseline_arity(task.baseline))
                    except PkbError as exc:
                        invalid_reason = str(exc)
                items.append(RunItem(
                    index=len(items), task=task.id, model=model.name,
                    model_path=str(model.path) if model.path else None,
                    solution_path=str(solution) if solution else None,
                    invalid_reason=invalid_reason,
                ))
        if not items:
            raise PkbError("Nothing to run: " + " ".join(self.skipped or ["no task and model pair applies."]))
        return items

    # ------------------------------------------------------------------ running
    def run(
        self, request: RunRequest, *, on_event: EventCallback | None = None,
        cancel: threading.Event | None = None,
    ) -> BatchOutcome:
        items = self.plan(request)
        if (sentence := read_only_database_sentence(Path(self.db_path))) is not None:
            raise PkbError(sentence)  # before anything runs: a whole batch measured for nothing otherwise
        self._topology = Topology.of(request.world_size, self.cluster.nnodes)
        mode = self._mode = choose_mode(self._topology.ranks_per_node, request.mode)
        cancel = cancel or threading.Event()
        load_at_start = os.getloadavg()[0]
        gpus_shared_at_start = _gpu_processes()  # before this batch's MPS daemon starts
        started_wall_s = time.time()
        self._ring = None
        batch_id = time.strftime("%Y%m%d-%H%M%S-") + uuid.uuid4().hex[:6]
        self._batch_id = batch_id
        batch_dir = self.runs_dir / batch_id
        batch_dir.mkdir(parents=True, exist_ok=True)
        self._batch_dir = batch_dir
        store = BatchWriter(Store(self.db_path), batch_id, fallback_dir=batch_dir,
                            on_lost=lambda sentence, path: self._on_database_lost(store, sentence, path, on_event))
        try:
            store.register_batch(runs=len(items))
            self._neighbours = _Neighbours(store, on_event)
            self._neighbours.look()
            states = self._create_runs(store, request, items, mode, batch_id, batch_dir)
            for item in items:
                if item.invalid_reason:
                    self._record_invalid(store, states[item.index], item.invalid_reason, on_event)
        except BaseException:
            store.end_batch()
            store.close()
            raise
        self._start_telemetry(store)
        if self.telemetry is not None and self.cluster.multi_node:
            self.telemetry.node = 0  # the head is node 0; the agents' samples carry their own rank
        mps = self._start_mps(mode)
        self._join_key = self.cluster.join_key or secrets.token_bytes(32)
        self._lost = None
        try:
            remaining = [item for item in items if not item.invalid_reason]
            self._open_uplink()
            if self.cluster.multi_node and remaining:
                missing = self._gather_nodes(store, batch_dir, cancel)
                if missing:
                    for item in remaining:
                        self._finish(store, states[item.index], "error", f"{RANKS_DID_NOT_START}: {missing}", on_event)
                    remaining = []
            launch = 0
            while remaining:
                if cancel.is_set():
                    break
                if self._lost:
                    for item in remaining:
                        self._finish(store, states[item.index], "error", f"not run: {self._lost}", on_event)
                    break
                launch += 1
                if launch > 1 and mps is not None and mps.enabled:
                    # The launch before ended early (a lost CUDA context, a dead rank): its clients'
                    # fault may live on in the MPS server, so the rest runs under a fresh daemon.
                    mps.restart()
                remaining = self._launch(
                    store, request, mode, remaining, states, batch_dir, launch, mps, on_event, cancel,
                )
        except KeyboardInterrupt:
            cancel.set()
            raise
        finally:
            self._kill_tree()
            self._release_nodes(store, [s.run_id for s in states.values()])
            for state in states.values():
                if not state.finished:
                    # A run never started is cancelled, not interrupted: it has no partial result.
                    status = "interrupted" if state.started else "cancelled"
                    why = "cancelled by the user" if cancel.is_set() else "the batch stopped"
                    detail = why if state.started else f"{why} before this run started"
                    self._finish(store, state, status, detail, on_event)
            if mps is not None:
                mps.stop()
            self._stop_telemetry()
            store.end_batch()
            store.add_note([s.run_id for s in states.values()], _host_load_note(load_at_start))
            # The ranks are ended and the MPS daemon stopped: what holds the GPUs now is not this batch's.
            if (shared := _gpu_sharing_note(gpus_shared_at_start, mps_used=mps is not None)) is not None:
                store.add_note([s.run_id for s in states.values()], shared)
            store.close()
            # Temporary trees go with the batch (runners' scratch, torchrun's torchelastic_*
            # folders, which TMPDIR puts there); logs stay, older batches' within the retention.
            shutil.rmtree(batch_dir / "scratch", ignore_errors=True)
            procs.sweep_cuda_ipc_files(since_s=started_wall_s - 1.0)
            remove_old_batches(self.runs_dir, keep=batch_dir)
            self.outcome = BatchOutcome(
                [s.run_id for s in states.values()], {s.run_id: s.status for s in states.values()}, list(self.skipped),
                not_stored=store.lost, recovery_path=store.recovery_path, recovery_error=store.recovery_error,
                database=self.db_path,
            )
        return self.outcome

    # ------------------------------------------------------------------ the network between the nodes
    def calibrate_network(self, spec: dict[str, Any], *, progress: Callable[[str], None] | None = None,
                          cancel: threading.Event | None = None) -> dict[str, Any]:
        """`pkb-tui calibrate --network`: gather the nodes as a run does (their agents join; srun
        starts them under --slurm), then one launch of engine.netcal, one rank per node, which
        measures every pair of nodes in turn. Returns rank 0's report (each node's host; per pair
        both directions' sweeps and the latency); stores nothing (the caller writes the rows).
        ``spec``: mode, sizes, repeats, timeout_s."""
        from pkb_tui.engine import netcal

        if not self.cluster.multi_node:
            raise PkbError(NETWORK_NEEDS_NODES)
        if (sentence := read_only_database_sentence(Path(self.db_path))) is not None:
            raise PkbError(sentence)
        host, port = self.cluster.endpoint()
        cancel = cancel or threading.Event()
        self._topology = Topology.of(self.cluster.nnodes, self.cluster.nnodes)
        self._mode = str(spec["mode"])
        self._batch_id = time.strftime("%Y%m%d-%H%M%S-") + uuid.uuid4().hex[:6]
        batch_dir = self._batch_dir = self.runs_dir / self._batch_id
        batch_dir.mkdir(parents=True, exist_ok=True)
        self._join_key = self.cluster.join_key or secrets.token_bytes(32)
        self._nodes, self._lost = {}, None
        store = BatchWriter(Store(self.db_path), self._batch_id, fallback_dir=batch_dir)
        try:
            self._open_uplink()
            missing = self._gather_nodes(store, batch_dir, cancel)
            if cancel.is_set():
                raise KeyboardInterrupt
            if missing:
                raise PkbError(f"The network calibration did not start: {missing}.", exit_code=EXIT_HARNESS)
            server = self._server
            assert server is not None
            launch = self._launch_no = 1
            event_key = derive_key(self._join_key, f"events {self._batch_id} {launch}")
            server.set_key("judge", event_key)
            rendezvous = Rendezvous(nnodes=self.cluster.nnodes, endpoint=f"{host}:{port}",
                                    run_id=self.cluster.rdzv_id or self._batch_id, host_store=True, local_addr=host)
            for node in self._nodes.values():
                server.send(node.peer, {
                    "t": "launch", "launch": launch, "batch_id": self._batch_id, "spec": spec, "nproc": 1,
                    "node_timeout_s": self.cluster.node_timeout_s, "module": netcal.MODULE,
                    "rendezvous": {"nnodes": self.cluster.nnodes, "endpoint": rendezvous.endpoint, "run_id": rendezvous.run_id},
                })
            self._proc = start_node_ranks(
                batch_dir, launch, {**spec, "launcher": f"127.0.0.1:{server.port}", "launcher_pid": os.getpid()},
                event_key, nproc=1, node_rank=0, rendezvous=rendezvous, module=netcal.MODULE)
            try:
                return self._network_report(store, float(spec["timeout_s"]), batch_dir, progress, cancel)
            finally:
                self._kill_tree()
                self._end_node_launches(launch, store)
        finally:
            self._kill_tree()
            self._release_nodes(store, [])
            store.close()
            shutil.rmtree(batch_dir / "scratch", ignore_errors=True)

    def _network_report(self, store: BatchWriter, timeout_s: float, batch_dir: Path,
                        progress: Callable[[str], None] | None, cancel: threading.Event) -> dict[str, Any]:
        """Wait for the calibration ranks' report, keeping the nodes' liveness as a run does."""
        server, proc = self._server, self._proc
        assert server is not None and proc is not None
        deadline = time.monotonic() + timeout_s
        last_ping = 0.0
        while True:
            for message in server.poll(0.1):
                if message.peer.role == "agent":
                    lost = self._on_node_message(store, message)
                    if lost:
                        raise PkbError(f"The network calibration stopped: {lost}.", exit_code=EXIT_HARNESS)
                    continue
                body = message.body
                if body.get("t") == "progress" and progress is not None:
                    progress(str(body.get("text"))[:200])
                elif body.get("t") == "netcal":
                    return body
            now = time.monotonic()
            if now - last_ping >= HEARTBEAT_S:
                last_ping = now
                self._ping_nodes()
                silent = next((n for n in self._nodes.values() if now - n.peer.last_heard > self.cluster.node_timeout_s), None)
                if silent is not None:
                    raise PkbError(f"The network calibration stopped: {silent.describe()} was not heard from for "
                                   f"{self.cluster.node_timeout_s:g} s.", exit_code=EXIT_HARNESS)
                exited = next((n for n in self._nodes.values() if n.torchrun_exit is not None), None)
                if exited is not None:
                    raise PkbError(f"The network calibration's rank on {exited.describe()} exited (torchrun exit code "
                                   f"{exited.torchrun_exit}) before the report; its log is launch.log in "
                                   f"{exited.batch_dir} on {exited.host}.", exit_code=EXIT_HARNESS)
            if proc.poll() is not None:
                raise PkbError(f"The network calibration's rank on this node exited (torchrun exit code "
                               f"{proc.returncode}) before the report; see {batch_dir / 'launch.log'}.",
                               exit_code=EXIT_HARNESS)
            if cancel.is_set():
                raise KeyboardInterrupt
            if now > deadline:
                raise PkbError(f"The network calibration took longer than {timeout_s:g} s; its ranks were stopped "
                               f"(see {batch_dir / 'launch.log'}).", exit_code=EXIT_HARNESS)

    def _on_database_lost(
        self, store: BatchWriter, sentence: str, recovery_path: Path | None, on_event: EventCallback | None,
    ) -> None:
        """The database is gone (store.recovery): the samples that follow go to the recovery file,
        with those of this batch's runs still in the ring (the database that held them may be gone),
        and whoever watches is told at once."""
        if self.telemetry is not None:
            self.telemetry.replace_sink(RecoverySampleSink(store))
        if self._ring is not None:
            store.add_samples(self._ring.snapshot())
        if recovery_path is not None:
            message = f"{sentence}; this batch's results now go to {recovery_path}"
        else:
            message = f"{sentence}, and no recovery file could be written ({store.recovery_error}): results are not kept"
        if on_event is not None:
            on_event(ev.DatabaseLost(message=message, recovery_path=str(recovery_path) if recovery_path else None), None)

    # ------------------------------------------------------------------ the uplink and the other nodes
    def _open_uplink(self) -> None:
        """The server judge 0 and the agents connect to: 127.0.0.1 on one node; across nodes every
        interface (a loopback rendezvous host keeps it on 127.0.0.1) at the channel port."""
        if not self.cluster.multi_node:
            self._server = UplinkServer({"agent": self._join_key}, "127.0.0.1", 0)
            return
        host, _ = self.cluster.endpoint()
        bind = "127.0.0.1" if is_loopback(host) else "0.0.0.0"
        try:
            self._server = UplinkServer({"agent": self._join_key}, bind, self.cluster.uplink_port())
        except OSError as exc:
            raise PkbError(f"Could not listen for the other nodes on {bind}:{self.cluster.uplink_port()} ({exc}); "
                           "give a free port with --channel-port.", exit_code=3) from None

    def _gather_nodes(self, store: BatchWriter, batch_dir: Path, cancel: threading.Event) -> str | None:
        """Wait for every other node's agent to join (starting them first under SLURM); the
        sentence saying which did not, or None. Each agent's clock is pinged a few times."""
        server = self._server
        assert server is not None
        if self.cluster.agents_command:
            env = {**os.environ, "PKB_JOIN_KEY": self._join_key.hex(), "PKB_SLURM_NODE_OFFSET": "1"}
            with os.fdopen(os.open(batch_dir / "agents.log", os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW,
                                   0o644), "ab") as log:
                try:
                    self._agents_proc = subprocess.Popen(
                        self.cluster.agents_command, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                        env=env, start_new_session=True)
                except OSError as exc:
                    return f"could not start the other nodes' agents with {self.cluster.agents_command[0]}: {exc}"
        wanted = set(range(1, self.cluster.nnodes))
        deadline = time.monotonic() + self.cluster.join_timeout_s
        while set(self._nodes) != wanted:
            if cancel.is_set():
                return None  # the batch loop sees the cancel; its runs are recorded as cancelled
            for message in server.poll(0.1):
                if self._on_node_message(store, message, joining=True):  # joined, then gone: it may join again
                    self._nodes = {k: n for k, n in self._nodes.items() if not n.peer.closed}
            if self._agents_proc is not None and self._agents_proc.poll() is not None and set(self._nodes) != wanted:
                return (f"the agents started with {(self.cluster.agents_command or ['srun'])[0]} exited (code "
                        f"{self._agents_proc.returncode}) before node(s) {_ranks(wanted - set(self._nodes))} "
                        f"joined; see {batch_dir / 'agents.log'}")
            if time.monotonic() > deadline:
                return (f"node(s) {_ranks(wanted - set(self._nodes))} did not join within "
                        f"{self.cluster.join_timeout_s:g} s; start `pkb-tui agent` there with this batch's "
                        "--rdzv-endpoint and PKB_JOIN_KEY")
        for _ in range(5):  # a first clock offset before the first launch needs it
            self._ping_nodes()
            end = time.monotonic() + 0.05
            while time.monotonic() < end:
                for message in server.poll(0.01):
                    self._on_node_message(store, message)
        return None

    def _on_node_message(self, store: BatchWriter, message: Message, joining: bool = False) -> str | None:
        """An agent's message; returns a sentence when it says its node is lost."""
        peer, body = message.peer, message.body
        if peer.role != "agent":
            return None
        kind = body.get("t")
        node = next((n for n in self._nodes.values() if n.peer is peer), None)
        if node is None:
            if kind == "closed" or not joining:
                return None
            about = peer.hello
            try:
                rank = int(about.get("node_rank"))  # type: ignore[arg-type]  # a bad value is refused below
            except (TypeError, ValueError):
                rank = -1
            why = None
            if not 0 < rank < self.cluster.nnodes:
                why = f"its node rank {about.get('node_rank')!r} is not one of 1..{self.cluster.nnodes - 1}"
            elif rank in self._nodes:
                why = f"node rank {rank} has joined already ({self._nodes[rank].describe()})"
            if why is not None:
                assert self._server is not None
                self._server.send(peer, {"t": "refused", "why": why})
                self._server.drop(peer, why)
                return None
            host = str(about.get("host") or peer.address)[:200]
            node = _Node(rank=rank, peer=peer, host=host, pid=int(about.get("pid") or 0))
            node.host_id = store.upsert_host({"hostname": host})
            self._nodes[rank] = node
            return None
        if kind == "closed":
            return f"{node.describe()} was lost: {body.get('why')}"
        if kind == "pong":
            try:
                t0, t1, t2 = float(body["t0"]), float(body["t1"]), time.time()
            except (KeyError, TypeError, ValueError):
                return None
            node.pings = sorted([*node.pings, (t2 - t0, t1 - (t0 + t2) / 2)])[:16]
        elif kind == "beat":
            if int(body.get("launch") or 0) == getattr(self, "_launch_no", 0):
                node.torchrun_exit = body.get("torchrun_exit")
                node.running = bool(body.get("running"))
        elif kind == "launched":
            node.batch_dir = str(body.get("batch_dir") or "")[:1000]
            node.running = True
        elif kind == "launch_ended":
            node.ended_launch = int(body.get("launch") or 0)
        elif kind == "samples":
            self._store_node_samples(node, body.get("rows"))
        elif kind == "logs":
            self._mirror_node_logs(node, body.get("files"))
        return None

    def _mirror_node_logs(self, node: _Node, files: Any) -> None:
        """A node's rank logs, copied beside the head's own in the batch folder (names checked, no
        link followed, at most MIRROR_LIMIT_BYTES each), so a run's merged log and a failed rank's
        own words cover every node."""
        from pkb_tui.engine.agent import MIRROR_LIMIT_BYTES, MIRRORED_LOG

        if not isinstance(files, dict):
            return
        for name, text in files.items():
            if not isinstance(name, str) or not isinstance(text, str) or not MIRRORED_LOG.fullmatch(name):
                continue
            path = self._batch_dir / name
            try:
                fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW, 0o644)
            except OSError:
                continue
            with os.fdopen(fd, "ab") as f:
                room = MIRROR_LIMIT_BYTES - f.tell()
                if room > 0:
                    f.write(text.encode()[:room])

    def _store_node_samples(self, node: _Node, rows: Any) -> None:
        """A node's telemetry into this database (the one writer), on our clock, tagged with its host."""
        sink = getattr(self.telemetry, "sink", None)
        if sink is None or not isinstance(rows, list):
            return
        from collectors.sample import sample_from_row

        offset = node.clock_offset_s
        samples = []
        for row in rows[:100_000]:
            try:
                sample = sample_from_row(row)
            except (TypeError, ValueError, IndexError):
                continue
            sample.ts = float(sample.ts) - offset
            sample.host_id, sample.node, sample.run_id = node.host_id, node.rank, self._run_id
            samples.append(sample)
            if sample.ts >= getattr(node.latest.get(sample.gpu), "ts", -1.0):
                node.latest[sample.gpu] = sample
        sink.put(samples)

    def _node_status(self) -> ev.NodeStatus:
        """Every node as the head sees it now, for Live: its host, when it was last heard from (on
        this clock), its GPUs' link rates and its NICs' from its newest samples."""
        now = time.time()
        ring = getattr(self.telemetry, "ring", None)
        head = live_node(0, socket.gethostname(), now, ring.latest_per_gpu() if ring is not None else {})
        others = [live_node(node.rank, node.host, now - (time.monotonic() - node.peer.last_heard), node.latest)
                  for node in sorted(self._nodes.values(), key=lambda n: n.rank)]
        return ev.NodeStatus(ts=now, node_timeout_s=self.cluster.node_timeout_s, nodes=[head, *others])

    def _ping_nodes(self) -> None:
        assert self._server is not None
        for node in self._nodes.values():
            self._server.send(node.peer, {"t": "ping", "t0": time.time()})

    def _send_nodes(self, message: dict[str, Any]) -> None:
        assert self._server is not None
        for node in self._nodes.values():
            self._server.send(node.peer, message)

    def _end_node_launches(self, launch: int, store: BatchWriter) -> None:
        """Every other node ends its ranks of this launch; wait (briefly) until each says so, so a
        relaunch never meets ranks of the one before."""
        if not self._nodes:
            return
        self._send_nodes({"t": "end_launch", "launch": launch})
        deadline = time.monotonic() + 20.0
        assert self._server is not None
        while time.monotonic() < deadline and any(n.ended_launch < launch and not n.peer.closed for n in self._nodes.values()):
            for message in self._server.poll(0.05):
                lost = self._on_node_message(store, message)
                if lost and not self._lost:
                    self._lost = lost

    def _release_nodes(self, store: BatchWriter, run_ids: list[int]) -> None:
        """The batch is over: the agents go (their ranks with them), the channel closes, and each
        run's notes say where the other nodes' logs are and their measured clock offsets."""
        if self._nodes:
            self._send_nodes({"t": "done"})
            notes = []
            for node in sorted(self._nodes.values(), key=lambda n: n.rank):
                rtt = node.round_trip_s
                clock = (f"clock offset {node.clock_offset_s * 1e3:+.3f} ms (round trip {rtt * 1e3:.3f} ms, "
                         "applied to its samples)" if rtt is not None else "clock offset not measured")
                notes.append(f"{node.describe()}: its ranks' logs in {node.batch_dir or '(no launch)'} on {node.host}; {clock}")
            try:
                for note in notes:
                    store.add_note(run_ids, note)
            except Exception:  # noqa: BLE001  (notes must not hide the batch's outcome)
                pass
        if self._agents_proc is not None:
            try:
                self._agents_proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                pass
            procs.kill_process_tree(self._agents_proc.pid)
            try:
                self._agents_proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                pass
            self._agents_proc = None
        if self._server is not None:
            self._server.close()
            self._server = None
        self._nodes = {}

    def _record_invalid(
        self, store: BatchWriter, state: _RunState, reason: str, on_event: EventCallback | None = None,
    ) -> None:
        """A candidate that cannot run (see RunItem.invalid_reason): its run is recorded as failed
        with the reason, without launching anything; the rest of the batch goes on."""
        if on_event is not None:
            item = state.item
            on_event(ev.RunStarted(item=item.index, task=item.task, model=item.model, trials=0), state.run_id)
        store.update_run(state.run_id, started_at=time.time())
        self._finish(store, state, "failed", f"invalid candidate: {reason}", on_event)

    def _create_runs(
        self, store: BatchWriter, request: RunRequest, items: list[RunItem], mode: str, batch_id: str, batch_dir: Path,
    ) -> dict[int, _RunState]:
        states: dict[int, _RunState] = {}
        for item in items:
            task = load_task(item.task)
            baseline_file = Path(str(task.module.__file__))
            baseline_hash = store.add_source(str(baseline_file.relative_to(PROJECT_ROOT)) if baseline_file.is_relative_to(PROJECT_ROOT) else str(baseline_file), baseline_file.read_text())
            candidate_hash = baseline_hash
            if item.solution_path:
                try:
                    source = Path(item.solution_path).read_text(errors="replace")
                except OSError as exc:  # an unreadable candidate is an invalid item (plan), still a run
                    source = f"# unreadable: {exc.strerror}\n"
                candidate_hash = store.add_source(item.solution_path, source)
            run_id = store.create_run({
                "batch_id": batch_id, "task_id": item.task, "model": item.model, "model_path": item.model_path,
                "world_size": request.world_size, "mode": mode, "dtype": request.dtype, "size": request.size,
                "trials": request.trials, "timeout_s": request.timeout_s,
                "request": {**request.to_dict(), "mode": mode, "item": item.to_dict(), "nnodes": self.cluster.nnodes},
                "status": "queued", "baseline_source_hash": baseline_hash, "candidate_source_hash": candidate_hash,
                "timings_representative": int(timings_representative(mode)),
                "log_path": str(batch_dir / f"item{item.index:03d}.rank0.log"),
                "item_index": item.index,
            })
            states[item.index] = _RunState(run_id=run_id, item=item)
        return states

    def _launch(
        self, store: BatchWriter, request: RunRequest, mode: str, items: list[RunItem], states: dict[int, _RunState],
        batch_dir: Path, launch: int, mps, on_event: EventCallback | None, cancel: threading.Event,
    ) -> list[RunItem]:
        """One torchrun for these items. Returns the items still to run (after a timeout/crash)."""
        server = self._server
        assert server is not None
        self._launch_no = launch
        # Events are signed with a key only the judges and this launcher hold (the judges drop it
        # from the environment before they start any runner); one per launch, derived from the
        # batch's join key so that every node's agent derives it too and none is ever sent.
        event_key = derive_key(self._join_key, f"events {self._batch_id} {launch}")
        server.set_key("judge", event_key)
        accepted_from = time.monotonic()  # a judge connection from before this launch is not heard
        spec = {
            "request": request.to_dict(), "items": [i.to_dict() for i in items], "mode": mode,
            "batch_id": self._batch_id, "heartbeat_s": HEARTBEAT_S,
            # What a candidate's runner may not read (engine.sandbox.candidate_read_denials): the
            # database and every model folder of the batch (a relaunch's items are only the rest).
            "db_path": str(self.db_path.resolve()), "runs_dir": str(self.runs_dir),
            "model_dirs": sorted({d for s in states.values() if (d := _model_dir(s.item)) is not None}),
        }
        topology = self._topology
        rendezvous = None
        if self.cluster.multi_node:
            host, port = self.cluster.endpoint()
            rendezvous = Rendezvous(nnodes=topology.nodes, endpoint=f"{host}:{port}",
                                    run_id=self.cluster.rdzv_id or self._batch_id, host_store=True, local_addr=host)
            for node in self._nodes.values():
                node.torchrun_exit, node.running = None, False
                assert self._server is not None
                self._server.send(node.peer, {
                    "t": "launch", "launch": launch, "batch_id": self._batch_id, "spec": spec,
                    "nproc": topology.ranks_per_node, "node_timeout_s": self.cluster.node_timeout_s,
                    "rendezvous": {"nnodes": topology.nodes, "endpoint": rendezvous.endpoint, "run_id": rendezvous.run_id},
                })
        self._proc = start_node_ranks(
            batch_dir, launch, {**spec, "launcher": f"127.0.0.1:{server.port}", "launcher_pid": os.getpid()},
            event_key, nproc=topology.ranks_per_node, node_rank=0, rendezvous=rendezvous,
            env_extra=mps.env if mps is not None else None,
        )
        # The launcher's own record of the events it accepted, one JSON line each after the
        # sender's place (node:rank); nothing reads it back.
        record = os.fdopen(os.open(batch_dir / f"events.{launch}.jsonl",
                                   os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644), "a", buffering=1)
        pending = {item.index for item in items}
        current: int | None = None
        started = time.monotonic()
        # The timeout bounds the ranks' start-up, then each run's wall time from its start (a
        # candidate is not charged for torchrun and NCCL coming up), and the gap after a run
        # finished. The judges end a candidate that outlives its timeout themselves; the grace is
        # for them to do so and report.
        deadline = started + request.timeout_s + judge_grace_s(request.timeout_s)
        last_beat = started
        any_run_started = False
        # Stopped processes of ours: torchrun and its children (the judges), found by looking, so
        # a judge stopped before it could say who it is is seen too.
        watched = {self._proc.pid: (f"torchrun (pid {self._proc.pid})", procs.StopWatch(self._proc.pid))}
        rank_of: dict[int, int] = {}
        last_look = started

        def handle(event: ev.Event) -> None:
            nonlocal current, deadline, last_beat, any_run_started
            last_beat = time.monotonic()
            item_index = getattr(event, "item", None)
            state = states.get(item_index) if item_index is not None else None
            if isinstance(event, ev.BatchStarted):
                self._on_batch_started(store, states, items, event)
                self._rank_nodes = list(event.rank_nodes or [])
                # CPU use per rank: each node follows its own ranks' processes (pids are per host)
                nodes = event.rank_nodes or [0] * len(event.rank_pids or [])
                by_node: dict[int, dict[int, int]] = {}
                for r, (pid, node_rank) in enumerate(zip(event.rank_pids or [], nodes)):
                    by_node.setdefault(int(node_rank), {})[r] = int(pid)
                if self.telemetry is not None:
                    self.telemetry.set_rank_pids(by_node.get(0, {}))
                for node in self._nodes.values():
                    server.send(node.peer, {"t": "ranks", "pids": by_node.get(node.rank, {})})
                rank_of.update({pid: r for r, pid in by_node.get(0, {}).items()})
            elif isinstance(event, ev.RunStarted) and state is not None:
                current, any_run_started = event.item, True
                deadline = time.monotonic() + request.timeout_s + judge_grace_s(request.timeout_s)
                state.started = True
                store.update_run(state.run_id, status="running", started_at=time.time())
                self._neighbours.look(state)
                self._run_id = state.run_id
                if self.telemetry is not None:
                    self.telemetry.set_run(state.run_id)
            elif isinstance(event, ev.TrialResult) and state is not None:
                row = {
                    "trial": event.trial, "correct": event.correct, "max_abs_error": event.max_abs_error,
                    "max_rel_error": event.max_rel_error, "worst_rank": event.worst_rank,
                    "message": event.message, "detail": event.ranks,
                }
                store.add_trials(state.run_id, [row])
                if event.trial < 0:
                    state.timed_check = row
                else:
                    state.trials.append(row)
            elif isinstance(event, ev.Timing) and state is not None:
                state.timings[event.variant] = event
            elif isinstance(event, ev.LinkBytes) and state is not None:
                state.link_bytes[event.variant] = event
            elif isinstance(event, ev.Kernels) and state is not None:
                store.add_kernels(state.run_id, [{**k, "variant": event.variant, "rank": event.rank} for k in event.kernels])
                if event.trace_path:
                    store.update_run(state.run_id, trace_path=event.trace_path)
            elif isinstance(event, ev.RunNote) and state is not None:
                store.add_note([state.run_id], event.note)
            elif isinstance(event, ev.Error) and state is not None:
                state.errors.append(f"{event.where}: {event.message}")
            elif isinstance(event, ev.RunFinished) and state is not None:
                self._finish(store, state, event.status, event.detail, None, request=request)
                pending.discard(event.item)
                current = None
                deadline = time.monotonic() + request.timeout_s + judge_grace_s(request.timeout_s)
            run_id = state.run_id if state is not None else None
            if on_event is not None:
                on_event(event, run_id)

        def receive(timeout_s: float) -> str | None:
            """Take what came over the uplink: judge 0's events, the agents' words; a lost node's sentence."""
            lost = None
            for message in server.poll(timeout_s):
                peer, body = message.peer, message.body
                if peer.role == "agent":
                    lost = self._on_node_message(store, message) or lost
                    continue
                if peer.connected_at < accepted_from or body.get("t") != "event":
                    continue
                data = body.get("event")
                event = ev.parse_event(json.dumps(data)) if isinstance(data, dict) else None
                if event is not None:
                    record.write(f"{peer.hello.get('node_rank')}:{peer.hello.get('rank')} {json.dumps(data)}\n")
                    handle(event)
            return lost

        outcome: tuple[str, str] | None = None  # (status for the current run, detail)
        last_ping = 0.0
        try:
            while True:
                lost = receive(0.05)
                returncode = self._proc.poll()
                now = time.monotonic()
                if lost is None and now - last_ping >= HEARTBEAT_S:
                    last_ping = now
                    self._ping_nodes()  # the head's heartbeat to every node, and a clock sample
                    if on_event is not None and self.cluster.multi_node:
                        on_event(self._node_status(), None)
                    silent = next((n for n in self._nodes.values()
                                   if now - n.peer.last_heard > self.cluster.node_timeout_s), None)
                    if silent is not None:
                        lost = f"{silent.describe()} was lost: not heard from for {self.cluster.node_timeout_s:g} s"
                    exited = next((n for n in self._nodes.values() if n.torchrun_exit is not None), None)
                    if lost is None and exited is not None and pending:
                        lost_ranks = (f"the ranks on {exited.describe()} exited (torchrun exit code "
                                      f"{exited.torchrun_exit}) before the batch finished; their logs are in "
                                      f"{exited.batch_dir} on {exited.host}")
                        outcome = ("error", lost_ranks)
                        break
                if lost is not None:
                    self._lost = lost
                    outcome = ("error", f"{lost}; the ranks on every node were stopped")
                    break
                if returncode is not None:
                    receive(0.0)
                    if not pending:
                        break
                    outcome = ("error", launch_failure_detail(batch_dir, returncode, items=[i.index for i in items]))
                    break
                if cancel.is_set():
                    outcome = ("interrupted", "cancelled by the user")
                    break
                if now > deadline:
                    what = "the run" if current is not None else "the ranks' start-up"
                    outcome = ("timeout", f"{what} took longer than its timeout ({request.timeout_s:g} s); the ranks were killed")
                    break
                if any_run_started and now - last_beat > HEARTBEAT_TIMEOUT_S:
                    outcome = ("timeout", f"no heartbeat from rank 0 for {HEARTBEAT_TIMEOUT_S:g} s; the ranks were killed")
                    break
                if now - last_look >= 1.0:
                    last_look = now
                    store.check()  # a database deleted or replaced is told at once, not at the next write
                    self._neighbours.look(states[current] if current is not None else None)
                    for pid in procs.children_by_parent().get(self._proc.pid, []):
                        watched.setdefault(pid, ("a judge", procs.StopWatch(pid)))
                    stopped = next((pid for pid, (_, watch) in watched.items() if watch.stopped_s() > STOPPED_LIMIT_S), None)
                    if stopped is not None:
                        what = watched[stopped][0]
                        if stopped in rank_of:
                            what = f"rank {rank_of[stopped]}'s judge (pid {stopped})"
                        elif what == "a judge":
                            what = f"a judge (pid {stopped})"
                        outcome = ("error", f"{what} was stopped (SIGSTOP or a tracer) for over {STOPPED_LIMIT_S:g} s "
                                            "by something outside pkb-tui; the ranks were killed")
                        break
        finally:
            record.close()
        self._kill_tree()
        if self._nodes:
            self._end_node_launches(launch, store)
            for item in items:  # the other nodes' logs have come in full: each run's log covers them
                state = states[item.index]
                if state.finished and (merged := self._merge_logs(state)) is not None:
                    store.update_run(state.run_id, log_path=str(merged))
        if outcome is None:
            return []
        status, detail = outcome
        if current is not None:
            state = states[current]
            if state.errors and status == "error":
                # The first failed rank's own words first; what the others reported after it died follows.
                detail += "\nreported by the ranks: " + "; ".join(state.errors[-3:])
            self._finish(store, state, status, detail, on_event, request=request)
            pending.discard(current)
        elif not any_run_started and status != "interrupted":
            # The ranks never reached a run: relaunching would fail the same way.
            for index in sorted(pending):
                self._finish(store, states[index], "error", f"{RANKS_DID_NOT_START}: {detail}", on_event, request=request)
            return []
        if status == "interrupted":
            return []
        return [item for item in items if item.index in pending]

    # ------------------------------------------------------------------ results
    def _on_batch_started(self, store: BatchWriter, states: dict[int, _RunState], items: list[RunItem], event: ev.BatchStarted) -> None:
        host = dict(event.host)
        host_id = store.upsert_host(host)
        self._host = host
        self._host_id = host_id
        self._calibration = store.latest_calibration(host_id)
        self._latency = store.latest_link_latency(host_id)
        self._noise_floor = store.latest_noise_floor(host_id, self._mode) if self.use_noise_floor else None
        for item in items:
            store.update_run(
                states[item.index].run_id, host_id=host_id, mps_enabled=event.mps_enabled,
                timings_representative=int(event.timings_representative and timings_representative(self._mode)),
                notes=event.notes,
            )
        self._network = None
        if self.cluster.multi_node:
            from pkb_tui.engine.roofline import network_ceiling

            # The slowest calibrated pair of the batch's hosts, or the default naming the pair not measured.
            self._network = network_ceiling(self._node_hosts(), store.network_pairs())
            store.add_note([states[item.index].run_id for item in items],
                           f"network between the nodes: {self._network.gbps:g} GB/s per GPU, {self._network.source}")

    def _finish(
        self, store: BatchWriter, state: _RunState, status: str, detail: str | None,
        on_event: EventCallback | None, *, request: RunRequest | None = None,
    ) -> None:
        if state.finished:
            return
        state.finished = True
        state.status = status
        if state.errors and not detail:
            detail = "; ".join(state.errors[-3:])
        if state.started:
            self._neighbours.look(state)
            for note in state.neighbours.values():
                store.add_note([state.run_id], note)
        log_path = self._merge_logs(state)
        store.update_run(state.run_id, status=status, status_detail=detail, finished_at=time.time(),
                         **({"log_path": str(log_path)} if log_path else {}))
        if request is not None:
            self._store_results(store, state, request)
        self._run_id = None  # the other nodes' samples that follow belong to no run
        if self.telemetry is not None:
            self.telemetry.set_run(None)
        if on_event is not None:
            on_event(ev.RunFinished(item=state.item.index, status=status, detail=detail), state.run_id)

    def _store_results(self, store: BatchWriter, state: _RunState, request: RunRequest) -> None:
        traffic = self._traffic(state.item.task, request)
        trials = state.trials
        passed = sum(1 for t in trials if t["correct"])
        worst = max(trials, key=lambda t: (not t["correct"], t["max_abs_error"] or 0.0), default=None)
        timed_ok = state.timed_check["correct"] if state.timed_check else True
        timing_fields = self._timing_fields(state, request)
        for variant in ("baseline", "candidate"):
            timing_event = state.timings.get(variant)
            fields: dict[str, Any] = {"traffic": traffic.__dict__ if traffic else None}
            if variant == "baseline":
                fields.update(correct=1, trials_passed=len(trials), trials_total=len(trials))
            else:
                if not trials:
                    fields.update(correct=None, trials_passed=0, trials_total=0)
                else:
                    fields.update(
                        correct=int(passed == len(trials) and timed_ok and state.status == "passed"),
                        trials_passed=passed, trials_total=len(trials),
                        max_abs_error=worst["max_abs_error"] if worst else None,
                        max_rel_error=worst["max_rel_error"] if worst else None,
                        worst_rank=worst["worst_rank"] if worst else None,
                    )
            if timing_event is not None:
                fields.update(timing_fields.get(variant, {}))
                median_us = fields.get("median_us")
                if median_us:
                    fields.update(self._roofline(traffic, median_us, request))
            link = state.link_bytes.get(variant)
            if self.cluster.multi_node and timing_event is not None:
                fields["node_wire"] = self._node_wire(link, request, state.item.task)
            if link is not None:
                fields["link_bytes_per_iter"] = link.nvlink_bytes_per_iter
                fields["pcie_bytes_per_iter"] = link.pcie_bytes_per_iter
                fields["traffic_flag"] = _traffic_flag(link, traffic, self._mode)
            store.add_result(state.run_id, variant, fields)

    def _timing_fields(self, state: _RunState, request: RunRequest) -> dict[str, dict[str, Any]]:
        """Both methods' figures per variant and the speedup with its interval (engine.stats), from
        the judges' per-round figures; the user's basis (eager or graph) fills median_us/speedup."""
        base, cand = state.timings.get("baseline"), state.timings.get("candidate")
        if base is None:
            return {}

        def rounds(event: ev.Timing | None, method: str) -> list[list[float]] | None:
            figures = getattr(event, method, None) if event is not None else None
            return (figures or {}).get("rounds_us") or None

        eager = stats.MethodRounds(rounds(base, "eager"), rounds(cand, "eager"))
        graph_note = (cand.graph_note if cand is not None else None) or base.graph_note
        graph = stats.MethodRounds(rounds(base, "graph"), rounds(cand, "graph"), note=graph_note)
        basis = getattr(request, "speedup_basis", "eager") or "eager"
        if basis == "graph" and not graph.candidate_rounds:
            basis = "eager"  # no graph figure to pick: say which one was used
        statistic = stats.round_statistic_for(self._mode)
        calibrated = getattr(self, "_noise_floor", None)
        floor = stats.noise_floor_for(calibrated, basis)
        # Each method's interval holds the host's spread between processes, where calibrate measured it.
        floors = {method: stats.noise_floor_for(calibrated, method) for method in ("eager", "graph")}
        try:
            fields = stats.timing_result_fields(eager, graph, basis=basis, statistic=statistic,
                                                noise_floor_fraction=floor, interval_floors=floors)
        except ValueError:
            return {}
        # A speedup in blocks that calls alone did not confirm (the judges' check could not decide
        # within the budget): the run claims the speed alone (timing.unconfirmed_in_blocks).
        def singles(event: ev.Timing | None) -> list[list[float]]:
            return list(((event.eager or {}).get("single_rounds_us") or []) if event is not None else [])

        calls = int(((cand.eager or {}).get("calls_per_block") or 0) if cand is not None else 0)
        if cand is not None and fields.get("candidate"):
            alone = timing.unconfirmed_in_blocks((eager.baseline_rounds or [], eager.candidate_rounds or []),
                                                 (singles(base), singles(cand)), calls,
                                                 timing.BATCHED_LIMIT["cpu" if self._mode == "cpu" else "cuda"], statistic)
            if alone is not None:
                fields["candidate"] = timing.cap_at_alone(fields["candidate"], stats.widened(alone, floors["eager"]),
                                                          basis, calls, floor)
        return fields

    def _rank_traffic(self, task_id: str, request: RunRequest) -> list[Traffic] | None:
        """The task's traffic model of each rank; None where the task has none for this request."""
        try:
            task = load_task(task_id)
            return [
                task.traffic(task.context(rank=r, world_size=request.world_size, dtype=request.dtype, size=request.size))
                for r in range(request.world_size)
            ]
        except Exception:
            return None

    def _node_hosts(self) -> list[str]:
        """Each node's hostname, node 0 (this one) first, as the agents said when they joined."""
        hosts = {0: socket.gethostname()}  # (the run's host is judge 0's, which may sit on another node)
        hosts.update({n.rank: n.host for n in self._nodes.values()})
        return [hosts[rank] for rank in sorted(hosts)]

    def _node_wire(self, link: ev.LinkBytes | None, request: RunRequest, task_id: str) -> list[dict[str, Any]]:
        """Per node, one variant's wire bytes per call against the traffic model (nodes.node_wire)."""
        topology = self._topology
        hosts = dict(enumerate(self._node_hosts()))
        return node_wire(link.per_rank if link is not None else [], rank_nodes_of(getattr(self, "_rank_nodes", None), topology),
                         hosts, topology, self._rank_traffic(task_id, request), self._mode)

    def _traffic(self, task_id: str, request: RunRequest) -> Traffic | None:
        """The task's roofline model, the busiest rank's figure for each quantity."""
        per_rank = self._rank_traffic(task_id, request)
        if not per_rank:
            return None
        # The floor's terms each grow with one quantity, so the busiest rank's floor is the floor of
        # the per-quantity maxima; the compute term weighs flops by their TF32 share, so flops and
        # tf32_flops come from one rank, the one with the most arithmetic.
        arithmetic = max(per_rank, key=lambda t: t.flops)
        return Traffic(
            send_bytes=max(t.send_bytes for t in per_rank), recv_bytes=max(t.recv_bytes for t in per_rank),
            memory_bytes=max(t.memory_bytes for t in per_rank), flops=arithmetic.flops,
            payload_bytes=max(t.payload_bytes for t in per_rank), bus_factor=per_rank[0].bus_factor,
            tf32_flops=arithmetic.tf32_flops, messages=max(t.messages for t in per_rank),
        )

    def _roofline(self, traffic: Traffic | None, median_us: float, request: RunRequest) -> dict[str, Any]:
        if traffic is None or median_us <= 0:
            return {}
        try:
            from pkb_tui.engine import roofline
        except ImportError:
            return {}
        try:
            bandwidths = roofline.bandwidths_for(getattr(self, "_host", {}), getattr(self, "_calibration", {}), self._mode,
                                                 request.world_size, latency=getattr(self, "_latency", None))
            bandwidths = roofline.with_topology(bandwidths, getattr(self, "_topology", None),
                                                getattr(self, "_network", None))
            result = roofline.evaluate(traffic, median_us, bandwidths, request.dtype)
        except Exception:
            return {}
        return result.result_fields()

    def _merge_logs(self, state: _RunState) -> Path | None:
        """Every rank's output for this run, in one file, lines prefixed by rank."""
        parts = sorted(self._batch_dir.glob(f"item{state.item.index:03d}.rank*.log"))
        if not parts:
            return None
        merged = parts[0].parent / f"run-{state.run_id}.log"
        with os.fdopen(os.open(merged, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o644), "w") as out:
            for part in parts:
                rank = part.name.split(".rank")[1].split(".")[0]
                for line in read_regular(part).splitlines():
                    out.write(f"[rank {rank}] {line}\n")
        return merged

    # ------------------------------------------------------------------ helpers: telemetry, MPS, processes
    def _start_telemetry(self, store: BatchWriter) -> None:
        try:
            from collectors.telemetry import Telemetry
        except ImportError:
            return
        try:
            # A lost database is never opened again by path: that would make a new, empty one there.
            stored = store.check()
            self.telemetry = Telemetry(self.db_path, interval_s=0.1, record=stored)
            self._ring = self.telemetry.ring
            if not stored:
                self.telemetry.replace_sink(RecoverySampleSink(store))
            self.telemetry.start()
        except Exception:
            self.telemetry = None

    def _stop_telemetry(self) -> None:
        if self.telemetry is not None:
            try:
                self.telemetry.stop()
            finally:
                self.telemetry = None

    def _start_mps(self, mode: str):
        if mode != "shared-gpu":
            return None
        try:
            from pkb_tui.engine.mps import MpsDaemon
        except ImportError:
            return None
        daemon = MpsDaemon()
        daemon.start()
        return daemon

    def _kill_tree(self) -> None:
        proc, self._proc = self._proc, None
        if proc is None:
            return
        procs.kill_process_tree(proc.pid)
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            pass


class _Neighbours:
    """Other batches on this database that run on this machine now (the batches table, looked at
    when a run starts and ends and once a second between): each is said once, as a SharedMachine
    event, and every run that ran while one did gets a note naming it."""

    def __init__(self, store: BatchWriter, on_event: EventCallback | None) -> None:
        self.store = store
        self.on_event = on_event
        self.said: set[str] = set()

    def look(self, state: _RunState | None = None) -> None:
        for batch in self.store.other_live_batches():
            note = shared_machine_note(batch["pid"], batch["started_at"])
            if state is not None:
                state.neighbours.setdefault(batch["batch_id"], note)
            if batch["batch_id"] not in self.said:
                self.said.add(batch["batch_id"])
                if self.on_event is not None:
                    self.on_event(ev.SharedMachine(pid=batch["pid"], started_at=batch["started_at"], message=note), None)


def shared_machine_note(pid: int, started_at: float) -> str:
    started = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(started_at))
    return f"another pkb-tui batch (pid {pid}, started {started}) shares this machine: timings may be disturbed"


def _host_load_note(load_at_start: float) -> str:
    from collectors.contention import host_load_note

    return host_load_note(load_at_start)


MPS_SERVER = "nvidia-cuda-mps-server"  # the program of the MPS daemon's servers


def _gpu_processes() -> dict[int, str]:
    """Other processes on this host's GPUs (collectors.contention.gpu_processes); {} where that
    cannot be asked: the note is an explanation, never a reason for a batch to fail."""
    from collectors.contention import gpu_processes

    try:
        return gpu_processes()
    except Exception:
        return {}


def _gpu_sharing_note(at_start: dict[int, str], *, mps_used: bool) -> str | None:
    """The run note on other processes that held the GPUs (collectors.contention.gpu_sharing_note),
    the end's sample taken now, but for this batch's MPS server where it had one (killed without a
    wait, it may still be going)."""
    from collectors.contention import gpu_sharing_note

    at_end = {pid: command for pid, command in _gpu_processes().items()
              if not (mps_used and os.path.basename(command.split(" ", 1)[0]) == MPS_SERVER)}
    return gpu_sharing_note(at_start, at_end)


def remove_old_batches(runs_dir: Path, keep: Path | None = None, now: float | None = None) -> list[Path]:
    """Batch folders (logs, traces) older than PKB_LOG_RETENTION_DAYS (default 30; 0 keeps all)
    are removed; only folders named as the launcher names them. Returns those removed."""
    try:
        days = float(os.environ.get("PKB_LOG_RETENTION_DAYS", "30"))
    except ValueError:
        days = 30.0
    if days <= 0:
        return []
    cutoff = (now if now is not None else time.time()) - days * 86400.0
    removed = []
    try:
        entries = list(runs_dir.iterdir())
    except OSError:
        return []
    for entry in entries:
        if entry == keep or not _BATCH_NAME.fullmatch(entry.name):
            continue
        try:
            if entry.is_dir() and not entry.is_symlink() and entry.stat().st_mtime < cutoff:
                shutil.rmtree(entry)
                removed.append(entry)
        except OSError:
            continue
    return removed


# A batch's folder on the head, and on node K of a multi-node batch (engine.agent): <batch>.nodeK.
_BATCH_NAME = re.compile(r"\d{8}-\d{6}-[0-9a-f]{6}(\.node\d+)?")


def _traffic_flag(link: ev.LinkBytes, traffic: Traffic | None, mode: str) -> str | None:
    if traffic is None:
        return None
    try:
        from collectors.counters import traffic_flag
    except ImportError:
        return None
    try:
        return traffic_flag(link.nvlink_bytes_per_iter, traffic.wire_bytes, mode=mode)
    except Exception:
        return None


def _ranks(ranks: set[int]) -> str:
    return ", ".join(str(r) for r in sorted(ranks))


def _model_dir(item: RunItem) -> str | None:
    """The folder of an item's solution set (what another model of the batch may not read)."""
    if item.model_path:
        return str(Path(item.model_path).resolve())
    return str(Path(item.solution_path).resolve().parent) if item.solution_path else None
