"""One judge of a batch, started by torchrun: `python -m pkb_tui.engine.worker SPEC.json`.

The judge never imports candidate code. Per rank it starts runner processes (engine.runner): one
for the baseline, kept for the launch, and one per (task, model) item for the candidate, ended with
the item. It makes every input itself from a seed drawn from the OS for the batch (never given to a
runner), computes the expected outputs itself with the task's baseline, writes inputs into shared
memory it owns (engine.channel), tells the runner to call, reads the outputs back and compares them
in its own process, and times each block of calls with its own clock. A candidate runner is stopped
(SIGSTOP) whenever it is not serving a command, so it cannot work in the background: not while the
baseline is timed, not after it said it was done.

Everything a judge learns reaches judge 0 through a gloo control group; only judge 0 sends events,
over the uplink (engine.uplink: a TCP connection to the launcher, authenticated with a key only the
judges and the launcher hold), on one node as across nodes. Each judge watches the process that
started its node's ranks (the launcher, or the node's agent) and ends itself when that is gone.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import math
import os
import random
import secrets
import select
import shutil
import signal
import socket
import stat
import struct
import subprocess
import sys
import threading
import time
import traceback
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from collectors.counters import combine_phases
from pkb_tui.engine import channel, forkserver, gate, limits, placement, procs, sandbox, stats, unix_sockets
from pkb_tui.engine import events as ev
from pkb_tui.engine.compare import (
    Comparison,
    clone_value,
    find_aliasing,
    float64_copies,
    judge_outputs,
    tensors_in,
)
from pkb_tui.engine.logs import RANKS_DID_NOT_START
from pkb_tui.engine.modes import backend_for, mode_info, timings_representative
from pkb_tui.engine.request import RunItem, RunRequest
from pkb_tui.engine.timing import BATCHED_LIMIT, batched, batching_unresolved, per_call_us, percentile, reconcile
from pkb_tui.engine.uplink import Uplink, UplinkError, parse_address
from tasks.base import Task, load_task

_now = time.time
_perf_counter_ns = time.perf_counter_ns
_monotonic = time.monotonic

# Timing: each variant takes this many interleaved rounds at least (B C, C B, ...), each round a
# block of calls on fresh inputs; a block lasts about TARGET_BLOCK_US so the judge's clock (pipe
# wake-ups of ~10-50 us) is small against it.
MIN_ROUNDS = 6  # the fewest whose order statistics bound the speedup's median at 95% (engine.stats)
# At most, per device: a safety cap, not the rule (the interval's width and the time budget are).
# cuda: 40 stopped the eager-only tasks first (H100, 2026-12-07: their 40 rounds took 1.5-4.5 s of
# a 7.5 s budget, intervals still +-3-6%, 2 of 6 points off by more than 3% in one self-check).
# cpu: 40, where the batching check's extra rounds stop (gloo's spread is the host's).
MAX_ROUNDS = {"cuda": 120, "cpu": 40}
# cpu: a round's p25 over its blocks shrugs off a descheduled rank. Two, not more: on a small shared
# box each block costs the judges seconds of hand-offs (measured on the 2-core dev VM: 2-5 s a
# block, ~100 s of timing per item at 3 blocks a round).
BLOCKS_PER_ROUND = {"cuda": 1, "cpu": 2}
# Calls alone (timing.batched) per variant a round, the round's figure their statistic. On a GPU
# one was not enough: beyond the null, the baseline's call alone read 130-230 us and the candidates'
# 0-35 us (H100, 2026-12-06), and with one a round the batching fixture's speedup alone read
# [0.56, 2.67] after 13 rounds, too wide to fail it (4.1x in blocks); with five, [0.81, 1.00] on the
# H200. cpu: as its blocks (gloo's calls alone cost ms each on the 2-core box).
SINGLES_PER_ROUND = {"cuda": 5, "cpu": 2}
# An experiment, off by default: the baseline's runner makes the trials' calls too (worker._trials).
BASELINE_TRIALS = os.environ.get("PKB_BASELINE_TRIALS", "0") == "1"
TIMING_BUDGET_S = {"cuda": 30.0, "cpu": 20.0}  # adaptive rounds stop here (engine.stats.next_round_needed)
# cpu: at most 16. The judges compute every timed call's expected outputs with collectives of their
# own, and a call's net time (the harness's share taken off) can read near zero on a noisy box,
# which asked for 512 calls a block: measured 3 s to 85 s for the same all_reduce item.
MAX_CALLS_PER_BLOCK = {"cuda": 512, "cpu": 16}
# A graph call of a small collective is ~1 us on the H200 and its output copy ~3 us: at 512 calls
# a block held ~0.5 ms of the call's own GPU work under ~1.5 ms of copies and pipe hand-offs, and
# the per-round ratio of the baseline against itself spread sd 0.3-1.5 (log) at size small. Graph
# blocks may hold more calls (the inputs, outputs and checks of each still fit the arena budget).
MAX_GRAPH_CALLS_PER_BLOCK = 1024
# cpu: 5 ms, not more: gloo timings are for development, and each timed call costs the judges its
# expected outputs (two collectives of their own), which on a small box is most of an item's time.
TARGET_BLOCK_US = {"cuda": 5_000.0, "cpu": 5_000.0}
ARENA_BUDGET_BYTES = {"cuda": 4 * 2**30, "cpu": 512 * 2**20}

# Environment a runner must not inherit: the event key (and the batch's join key, which a rank is
# never given: belt and braces), torchrun's rendezvous, the launcher's pid.
_PRIVATE_ENV = ("PKB_EVENT_KEY", "PKB_JOIN_KEY", "MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_RUN_ID", "RANK", "WORLD_SIZE",
                "LOCAL_RANK", "GROUP_RANK", "ROLE_RANK", "LOCAL_WORLD_SIZE", "GROUP_WORLD_SIZE", "ROLE_WORLD_SIZE",
                "TORCHELASTIC_RESTART_COUNT", "TORCHELASTIC_MAX_RESTARTS", "TORCHELASTIC_USE_AGENT_STORE",
                "TORCH_NCCL_ASYNC_ERROR_HANDLING", "TORCHELASTIC_ERROR_FILE")


LAUNCHER_STOPPED_LIMIT_S = 30.0  # a launcher stopped this long is taken for gone (a candidate's SIGSTOP)

TIMED_SAMPLE = 8  # timed calls per block also judged one by one (a secret sample)
# Before a baseline block is timed on a GPU nothing else may run there: a candidate can leave a
# kernel running after its reply (its runner is stopped, its queued GPU work is not) and slow the
# baseline timed next. A probe kernel of the judge's own that waits longer than IDLE_PROBE_US (a
# time slice of another context) means the GPU is busy; the judge waits IDLE_WAIT_S for it to go
# idle, then kills the candidate's processes and looks again for IDLE_SETTLE_S.
IDLE_PROBE_US = 1_000.0
IDLE_WAIT_S = 0.5
IDLE_SETTLE_S = 2.0
GATE_ENQUEUE_S = 5.0  # a gated run's first answer (its replay enqueued, engine.gate) comes within this
GPU_BUSY = "the GPU stayed busy with work that is not this run's"
TRACE_MAX_BYTES = 256 * 2**20  # a profiler trace larger than this stays in the runner's scratch (and goes with it)
STACK_ELEMENTS = 1 << 25  # timed outputs judged together at most (engine.compare holds float64 copies)


class Rule:
    """How a task's outputs are judged: against the baseline's and the float64 truth's, per output
    (engine.compare.judge_outputs with the task's per-output tolerances)."""

    def __init__(self, task: Task) -> None:
        self.task = task

    def judge(self, outputs: Any, expected: Any, truth: Any, where: str) -> Comparison:
        if isinstance(outputs, str):  # the runner could not store them: its sentence
            return Comparison(False, None, None, outputs)
        return judge_outputs(outputs, expected, truth, self.task.spec.output_tolerance, where)


class CandidateFailure(Exception):
    """The runner raised, died, hung or broke the protocol: the run ends with this status."""

    def __init__(self, status: str, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


class PhaseClock:
    """Where one item's time went on this judge: wall seconds per phase, in order, and parts
    inside them (the judge's own share of the timing rounds). Printed to the item's log, and a
    timeout's message says it: "start-up 4.1 s, trials 1.0 s, ..." tells whether the run's
    --timeout was too short for the task (the judge's inputs and checks) or the code was slow."""

    def __init__(self) -> None:
        self.phases: dict[str, float] = {}
        self.parts: dict[str, float] = {}
        self.rounds = 0
        self._last = _monotonic()

    def mark(self, phase: str) -> None:
        """The time since the last mark (or the clock's start) was ``phase``'s."""
        now = _monotonic()
        self.phases[phase] = self.phases.get(phase, 0.0) + (now - self._last)
        self._last = now

    @contextlib.contextmanager
    def part(self, name: str) -> Iterator[None]:
        """Time inside the current phase that was ``name``'s (counted in the phase as well)."""
        start = _monotonic()
        try:
            yield
        finally:
            self.parts[name] = self.parts.get(name, 0.0) + (_monotonic() - start)

    def summary(self) -> str:
        self.mark("the rest")
        words = []
        for phase, seconds in self.phases.items():
            if phase == "the rest" and seconds < 0.05:
                continue
            label = f"{self.rounds} timing round{'s' if self.rounds != 1 else ''}" if phase == "timing rounds" else phase
            words.append(f"{label} {seconds:.1f} s")
        parts = ", ".join(f"{name} {seconds:.1f} s" for name, seconds in self.parts.items() if seconds >= 0.05)
        return ", ".join(words) + (f" (of which {parts})" if parts else "")


@dataclass
class Block:
    """One timed block as this judge saw it."""

    wall_us: float
    reported_us: float
    calls: int
    wake_in_us: float | None = None  # command sent -> runner has it (the runner's word)
    wake_out_us: float | None = None  # runner sends its answer -> judge has it


@dataclass
class Series:
    """One variant's blocks for one method, by round."""

    rounds: list[list[Block]] = field(default_factory=list)
    note: str | None = None  # why there are none (graph: not capturable)


class RunnerProcess:
    """This judge's runner for one variant: a child process in a session of its own."""

    def __init__(self, judge: Rank, label: str, port: int, log_path: Path,
                 netns: sandbox.NetNamespace | None = None) -> None:
        self.judge, self.label = judge, label
        to_runner_r, self.to_runner = os.pipe()
        self.from_runner, from_runner_w = os.pipe()
        self.arena = channel.Arena(judge.device, 1 << 20 if judge.device.type == "cuda" else 64 * 2**20)
        self.arena_size_sent = 0
        # The timed "run" and its answer go over a shared page where both sides spin (GPU boxes).
        self.bell = channel.Bell() if spins(judge.device) and channel.bell_supported() else None
        # A folder of its own per item (nothing one candidate leaves there reaches the next), and
        # JIT caches of its own model's (nothing one model builds is loaded by another).
        item = judge.item
        self.scratch = Path(judge.spec["scratch_dir"]) / (
            f"item{item.index:03d}.{label}.rank{judge.rank}" if item is not None else f"{label}.rank{judge.rank}")
        self.scratch.mkdir(parents=True, exist_ok=True)
        jit_dir = sandbox.jit_cache_dir(_model_key(item if label == "candidate" else None))
        jit_dir.mkdir(parents=True, exist_ok=True)
        env = {**runner_env(), **sandbox.jit_env(jit_dir), "TMPDIR": str(self.scratch),
               **(unix_sockets.runner_env() if label == "candidate" else {})}
        scratch = self.scratch
        self.output = limits.OutputCapture(log_path)  # head and tail kept, however much it prints
        self.violation: str | None = None  # the limit its processes passed (set by the judge's guard)
        self.cpu = limits.CpuClock()  # its processes' CPU time since it started
        self.gpu = limits.GpuWatch()  # whether NVML can tell its GPU memory
        judge.spawning += 1
        try:
            self.proc: subprocess.Popen[bytes] | forkserver.RunnerHandle = judge.start_runner_process(
                {"to_runner": to_runner_r, "from_runner": from_runner_w, "log": self.output.write_fd,
                 **({"arena": self.arena.fd} if self.arena.fd is not None else {}),
                 **({"bell": self.bell.fd} if self.bell is not None else {}),
                 **({"userns": netns.user_fd} if netns is not None and netns.user_fd is not None else {}),
                 **({"netns": netns.net_fd} if netns is not None else {})}, env, str(scratch))
            judge.runners.add(self)
        finally:
            judge.spawning -= 1
            self.output.handed_over()
            os.close(to_runner_r)
            os.close(from_runner_w)
        self.stopped = False
        self.escapees: list[tuple[int, int]] = []  # (pid, start ticks) stopped outside its group
        channel.send(self.to_runner, {
            "rank": judge.rank, "world_size": judge.world_size, "mode": judge.mode, "device": str(judge.device),
            # In the group's own network namespace the rendezvous is on its loopback.
            "backend": backend_for(judge.mode), "master_addr": "127.0.0.1" if netns is not None else judge.master_addr,
            "port": port, "netns": netns is not None,
            "scratch_dir": str(scratch), "jit_dir": str(jit_dir), "timeout_s": max(30.0, float(judge.request.timeout_s)),
            "sandbox": os.environ.get("PKB_SANDBOX", "1") != "0",
            "cpus": sorted(judge.placement.runners),  # both variants' runners on the same CPUs
            **(judge.read_denials_for(item) if label == "candidate" else {}),
        })
        self.started = False

    @property
    def pid(self) -> int:
        return self.proc.pid

    def request(self, message: dict[str, Any], deadline: float, abort: Any = None, spin_s: float = 0.0
                ) -> dict[str, Any]:
        """Send one command and wait for its answer; CandidateFailure when there is none.
        ``spin_s``: poll without sleeping that long first (timed blocks on a GPU box); then the
        command goes over the bell where there is one (the runner, after "prepare", spins on it)
        and the answer may come back on either."""
        self.resume()
        bell = self.bell if spin_s > 0 else None
        try:
            last = bell.seq(channel.TO_JUDGE) if bell is not None else 0
            if bell is None or not bell.post(channel.TO_RUNNER, message):
                bell = None
                channel.send(self.to_runner, message)
            if bell is not None:
                answer = _spin_for_answer(bell, last, self.from_runner, spin_s)
                if answer is not None:
                    return answer
            elif spin_s > 0:
                channel.spin_until_readable(self.from_runner, spin_s)
            return self._answer(deadline, abort, bell, last)
        except channel.ChannelError as exc:
            raise self._channel_failure(exc) from exc

    def answer(self, deadline: float, abort: Any = None) -> dict[str, Any]:
        """The runner's next message on the pipe, with no command sent (the second answer of a
        gated graph block, engine.gate); CandidateFailure when there is none."""
        try:
            return self._answer(deadline, abort, None, 0)
        except channel.ChannelError as exc:
            raise self._channel_failure(exc) from exc

    def _answer(self, deadline: float, abort: Any, bell: Any, last: int) -> dict[str, Any]:
        while True:
            left = deadline - _monotonic()
            if left <= 0:
                raise CandidateFailure("timeout", f"the {self.label} did not answer within its timeout on rank {self.judge.rank}")
            # With a bell the answer can come there: look at it every 0.2 ms (a judge has its own core).
            ready, _, _ = select.select([self.from_runner], [], [], min(0.0002 if bell is not None else 0.2, left))
            if ready:
                return channel.receive(self.from_runner, deadline)
            if bell is not None:
                answer = bell.take(channel.TO_JUDGE, last)
                if answer is not None:
                    return answer
            code = self.proc.poll()
            if code is not None:
                raise CandidateFailure("error", self._exited(code))
            if abort is not None and abort():
                raise CandidateFailure("error", "stopped: another rank's runner failed")

    def _channel_failure(self, exc: channel.ChannelError) -> CandidateFailure:
        try:  # a closed pipe usually means the process is on its way out: get its exit code
            code = self.proc.wait(timeout=2.0)
        except subprocess.TimeoutExpired:
            code = None
        if code is not None:
            return CandidateFailure("error", self._exited(code))
        if "deadline" in str(exc):
            return CandidateFailure("timeout", f"the {self.label} did not answer within its timeout on rank {self.judge.rank}")
        return CandidateFailure("error", f"the {self.label} on rank {self.judge.rank} broke the protocol: {exc}")

    def first_message(self, deadline: float, abort: Any = None) -> dict[str, Any]:
        """The runner's first word (its process group is up), or ChannelError: not in time, it
        exited, or ``abort()`` said another rank's runner failed."""
        while True:
            left = deadline - _monotonic()
            if left <= 0:
                raise channel.ChannelError("no answer before the deadline")
            if select.select([self.from_runner], [], [], min(0.2, left))[0]:
                return channel.receive(self.from_runner, deadline)
            if self.proc.poll() is not None:
                raise channel.ChannelError("the runner exited")
            if abort is not None and abort():
                raise channel.ChannelError("stopped: another rank's runner failed")

    def _exited(self, code: int) -> str:
        """The sentence for a runner that died: the limit it passed, or its exit code and the last
        thing it said."""
        if self.violation:
            return f"the {self.label}'s processes on rank {self.judge.rank} {self.violation}; they were killed"
        said = self.output.last_lines(3)
        return f"the {self.label}'s process on rank {self.judge.rank} exited with code {code}" + (f": {said}" if said else "")

    def ensure_arena(self, nbytes: int, deadline: float, abort: Any = None) -> None:
        if nbytes > self.arena.nbytes:
            self.arena = self.arena.grown(max(nbytes, 2 * self.arena.nbytes))
            self.arena_size_sent = 0
        if self.arena_size_sent != self.arena.nbytes:
            reply = self.request({"op": "arena", "export": self.arena.export()}, deadline, abort)
            _expect_ok(reply, self.label)
            self.arena_size_sent = self.arena.nbytes

    def pause(self) -> None:
        """A runner does nothing between commands: SIGSTOP to its whole process group. Only once
        every judge has its runner's answer (after a control-group collective), so no runner is
        stopped while a peer still needs it inside a collective. The baseline runner is stopped
        too, so both pay the same wake-up on every command."""
        if not self.stopped and self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGSTOP)
                self.stopped = True
            except OSError:
                pass
            if self.stopped and self.label == "candidate":
                # What it started in a session of its own (setsid, a double fork the judge adopted)
                # is outside that group: stopped too, or it works on while the baseline is timed
                # (and slows it) or after the candidate said it was done.
                self.escapees = procs.stop_outside_group(lambda: self.judge._candidate_pids(self), self.proc.pid)

    def resume(self) -> None:
        if self.stopped:
            procs.continue_stopped(self.escapees)
            self.escapees = []
            try:
                os.killpg(self.proc.pid, signal.SIGCONT)
            except OSError:
                pass
            self.stopped = False

    def close(self) -> None:
        """End the runner and everything it started (its session, then any descendant)."""
        if self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except OSError:
                pass
            procs.kill_process_tree(self.proc.pid, grace_s=0.5)
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            pass
        for fd in (self.to_runner, self.from_runner):
            try:
                os.close(fd)
            except OSError:
                pass
        self.arena.close()
        if self.bell is not None:
            self.bell.close()
        self.output.close()
        shutil.rmtree(self.scratch, ignore_errors=True)
        procs.remove_cuda_ipc_files(self.proc.pid)
        self.judge.runners.discard(self)
        if self.judge.guarded is self:
            self.judge.guarded = None


def _expect_ok(reply: dict[str, Any], label: str) -> None:
    if not reply.get("ok"):
        if reply.get("raised"):
            raise CandidateFailure("error", f"the {label} raised: {str(reply['raised'])[:2000]}")
        raise CandidateFailure("error", str(reply.get("error") or f"the {label} refused a command")[:2000])


class Rank:
    def __init__(self, spec: dict[str, Any]) -> None:
        self.spec = spec
        self.request = RunRequest.from_dict(spec["request"])
        self.items = [RunItem(**item) for item in spec["items"]]
        self.mode: str = spec["mode"]
        self.rank = int(os.environ["RANK"])
        self.world_size = int(os.environ["WORLD_SIZE"])
        self.local_rank = int(os.environ.get("LOCAL_RANK", "0"))
        self.master_addr = os.environ.get("MASTER_ADDR", "127.0.0.1")
        self.log_dir = Path(spec["log_dir"])
        self._event_key = bytes.fromhex(os.environ.pop("PKB_EVENT_KEY", "")) or b"unsigned"
        self.node_rank = int(os.environ.get("PKB_NODE_RANK", "0") or 0)
        self.uplink: Uplink | None = None  # judge 0's channel to the launcher
        self._lock = threading.Lock()
        self.current_item: int | None = None
        self.item: RunItem | None = None
        self.sandbox_note: str | None = None
        self.runner_note: str | None = None
        self.baseline_runner: RunnerProcess | None = None
        self.clock = PhaseClock()  # the current item's (run_item)
        self.forkserver: forkserver.ForkServer | None = None
        self.forkserver_failed = False
        self.device = torch.device(mode_info(self.mode).device_for(self.local_rank))
        self.limits = self._limits()
        self._gpu_memory: limits.GpuMemory | None = None  # NVML, opened by the guard's first look
        self._guard_lock = threading.Lock()  # the guard thread and the verdict's last look
        self.netns_unavailable: str | None = None  # judge 0: why no namespace could be made (tried once)
        self.guarded: RunnerProcess | None = None  # this item's candidate runner, watched by _guard
        self.runners: set[RunnerProcess] = set()  # every live runner (the guard counts none of the others)
        self.spawning = 0  # a runner being forked is nobody's yet: the guard waits
        self.timing_block = False  # a timed block is running: the guard waits (once more before the verdict)
        self._abort_epoch = 0
        self._flush: torch.Tensor | None = None
        self._probe: torch.Tensor | None = None
        self.gate: gate.JudgeGate | None = None  # graph blocks timed on the GPU (engine.gate); None: host clock
        self.gate_note: str | None = None  # why not, where a GPU has no gate
        self.gate_stuck: str | None = None  # a window that never ended: this judge's GPU stream is held
        self._sampler = random.Random(secrets.randbits(64))  # which timed calls are judged one by one

    def _limits(self) -> limits.Limits:
        local_world = int(os.environ.get("LOCAL_WORLD_SIZE", self.world_size))
        gpu_total = ranks_per_gpu = None
        if self.device.type == "cuda":
            gpu_total = int(torch.cuda.get_device_properties(self.device).total_memory)
            info = mode_info(self.mode)
            ranks_per_gpu = sum(1 for r in range(local_world) if info.device_for(r) == str(self.device))
        req = self.request
        return limits.Limits.from_request(
            req.max_host_memory_gib, req.max_tasks, local_world, cpu_s=req.max_cpu_s, timeout_s=float(req.timeout_s),
            gpu_memory_gib=req.max_gpu_memory_gib, gpu_total_bytes=gpu_total, ranks_per_gpu=ranks_per_gpu or 1)

    # ------------------------------------------------------------------ plumbing
    def connect_uplink(self) -> None:
        """Judge 0 opens its channel to the launcher (engine.uplink), wherever the launcher is."""
        if self.rank != 0:
            return
        self.uplink = Uplink(parse_address(str(self.spec["launcher"])), self._event_key, "judge",
                             {"rank": self.rank, "node_rank": self.node_rank, "pid": os.getpid()})

    def emit(self, event: ev.Event) -> None:
        if self.rank != 0:
            return
        if self.uplink is None:
            raise RuntimeError("judge 0 has no channel to the launcher")
        try:
            self.uplink.send({"t": "event", "event": json.loads(event.to_json())})
        except UplinkError as exc:
            self._launcher_gone(f"its channel broke: {exc}")

    def _launcher_gone(self, why: str) -> None:
        print(f"pkb: rank {self.rank}: the launcher is gone or stopped ({why}); ending", file=sys.stderr, flush=True)
        self._end_runners()
        os._exit(75)

    def _watchdog(self) -> None:
        """Heartbeats for the launcher; and if the process that started this node's ranks (the
        launcher, or the node's agent: always on this host) died, or has been stopped (SIGSTOP)
        past LAUNCHER_STOPPED_LIMIT_S, end this judge (torchrun then ends the others), so no
        orphaned ranks run on and no batch hangs on a launcher nobody will wake. Judge 0 also
        ends when its channel to the launcher breaks."""
        launcher_pid = int(self.spec["launcher_pid"])
        interval = float(self.spec.get("heartbeat_s", 1.0))
        launcher = procs.StopWatch(launcher_pid)
        while True:
            time.sleep(interval)
            if not procs.alive(launcher_pid) or launcher.stopped_s() > LAUNCHER_STOPPED_LIMIT_S:
                self._launcher_gone(f"pid {launcher_pid} on this node")
            self.emit(ev.Heartbeat(ts=_now(), item=self.current_item))

    def _guard(self) -> None:
        """Four times a second: the candidate's processes (its runner's tree and whatever escaped
        from it back to this judge) against the candidate's limits (engine.limits); past one,
        they are killed and the run's verdict names the limit."""
        while True:
            time.sleep(limits.GUARD_INTERVAL_S)
            runner = self.guarded
            if runner is not None and not self.timing_block:  # a block's clock is not ours to disturb
                try:
                    self._enforce_limits(runner)
                except OSError:
                    pass

    def _enforce_limits(self, runner: RunnerProcess) -> None:
        """One look by the guard: past a limit, the candidate's processes are killed."""
        with self._guard_lock:
            self._look(runner)

    def _look(self, runner: RunnerProcess) -> None:
        if runner.violation or self.spawning:
            return
        pids = self._candidate_pids(runner)
        usage = procs.usage_of(pids)
        gpu_bytes = None
        if self.limits.gpu_memory_bytes is not None:
            if self._gpu_memory is None:
                self._gpu_memory = limits.GpuMemory()
            # procs.alive, not proc.poll(): only the main thread reaps its runner (its exit code)
            gpu_bytes = runner.gpu.look(self._gpu_memory, pids, runner.pid, procs.alive(runner.pid))
        violation = limits.over_limit(usage, self.limits, cpu_s=runner.cpu.update(usage.cpu), gpu_memory_bytes=gpu_bytes)
        if violation and self.guarded is runner and not self.spawning:
            runner.violation = violation
            for pid in pids:
                try:
                    os.kill(pid, signal.SIGKILL)
                except OSError:
                    pass

    def _within_limits(self, candidate: RunnerProcess, status: str, detail: str | None) -> tuple[str, str | None]:
        """The verdict once more against the limits, looked at now (a run can end between two of
        the guard's looks); every judge agrees on it."""
        try:
            self._enforce_limits(candidate)
        except OSError:
            pass
        said = candidate._exited(-9) if candidate.violation else None
        # NVML could not tell this candidate's GPU memory: said in the run's notes.
        unlimited = candidate.gpu.note() if self.limits.gpu_memory_bytes is not None else None
        agreed = self.agree((said, f"{unlimited} (rank {self.rank})" if unlimited else None))
        notes = [note for _, note in agreed if note]
        if notes and self.current_item is not None:
            self.emit(ev.RunNote(item=self.current_item, note=notes[0]))
        broken = [s for s, _ in agreed if s]
        if broken and status not in ("error", "timeout"):
            return "error", broken[0]
        return status, detail

    def _kill_candidate(self, runner: RunnerProcess) -> None:
        """End a candidate's runner and whatever of it escaped (a double fork re-parented to us)."""
        escaped = self._candidate_pids(runner)
        runner.close()
        for pid in escaped:
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass

    def _candidate_pids(self, runner: RunnerProcess) -> list[int]:
        """This judge's descendants but the fork server's, and other runners', trees."""
        spared = {other.pid for other in [*(r for r in list(self.runners) if r is not runner), self.forkserver]
                  if other is not None}
        return procs.subtree_but(os.getpid(), spared)

    def gather(self, value: Any) -> list[Any] | None:
        out = [None] * self.world_size if self.rank == 0 else None
        dist.gather_object(value, out, dst=0, group=self.ctrl)
        return out

    def agree(self, value: Any) -> list[Any]:
        out: list[Any] = [None] * self.world_size
        dist.all_gather_object(out, value, group=self.ctrl)
        return out

    def barrier(self) -> None:
        dist.barrier(group=self.ctrl)

    def _redirect_output(self, item: RunItem) -> Path:
        path = self.log_dir / f"item{item.index:03d}.rank{self.rank}.log"
        sys.stdout.flush()
        sys.stderr.flush()
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW, 0o644)
        os.dup2(fd, 1)
        os.dup2(fd, 2)
        os.close(fd)
        return path

    # ------------------------------------------------------------------ the batch
    def main(self) -> int:
        os.chdir(self.spec["scratch_dir"])
        # The fork server starts before this judge confines itself: a process under Landlock may not
        # mount, and a candidate's runner covers the host's named unix sockets with bind mounts.
        self._place()  # first: the fork server and every thread started later inherit it
        self._start_forkserver()
        self.sandbox_note = self._restrict_writes()
        _become_subreaper()  # a runner's double-forked children come back to this judge, to be ended
        if self.device.type == "cuda":
            torch.cuda.set_device(self.device)
        backend = backend_for(self.mode)
        pg_timeout = timedelta(seconds=max(60.0, float(self.request.timeout_s) + 60.0))
        dist.init_process_group(backend=backend, timeout=pg_timeout)
        self.ctrl = dist.new_group(backend="gloo", timeout=pg_timeout)
        if backend == "nccl":
            dist.all_reduce(torch.zeros(1, device=self.device))
            torch.cuda.synchronize(self.device)
        self._open_gate()
        # The batch's secret: inputs come from it; no runner ever sees it.
        secret = self.agree(secrets.randbits(62) if self.rank == 0 else None)[0]
        self.secret_seed = int(secret) ^ int(self.request.seed)
        self.store = dist.distributed_c10d._get_default_store()
        self.nonce = hashlib.blake2b(f"{self.secret_seed}".encode(), digest_size=8).hexdigest()
        self.connect_uplink()
        threading.Thread(target=self._watchdog, daemon=True, name="pkb-watchdog").start()
        threading.Thread(target=self._guard, daemon=True, name="pkb-guard").start()
        host = self.host_facts()
        where = self.gather((os.getpid(), self.node_rank))
        self.emit(ev.BatchStarted(
            world_size=self.world_size, mode=self.mode, host=host,
            timings_representative=timings_representative(self.mode),
            mps_enabled=bool(os.environ.get("CUDA_MPS_PIPE_DIRECTORY")) if self.mode == "shared-gpu" else None,
            notes=self.mode_notes(), rank_pids=[pid for pid, _ in where or []],
            rank_nodes=[node for _, node in where or []],
        ))
        try:
            for item in self.items:
                lost = self._context_lost()
                why = f"this judge's CUDA context is unusable ({lost})" if lost else self._scheduling_lost()
                if why:
                    # Before this item started, so nobody is charged: the launcher relaunches the
                    # judges (fresh CUDA contexts, the launcher's scheduling) for the items left.
                    print(f"rank {self.rank}: {why}; ending the launch before item {item.index} so the rest runs "
                          f"on fresh judges", file=sys.stderr, flush=True)
                    self._end_runners()
                    os._exit(1)
                self.current_item, self.item = item.index, item
                self._redirect_output(item)
                try:
                    self.run_item(item)
                except Exception as exc:
                    # Outside the runners, an exception means the judges are out of step (a peer
                    # died): report it and end this launch; the launcher relaunches the rest.
                    traceback.print_exc()
                    self.emit(ev.Error(item=item.index, where="harness", message=f"rank {self.rank}: {exc}",
                                       traceback=traceback.format_exc(), rank=self.rank))
                    sys.stdout.flush()
                    sys.stderr.flush()
                    self._end_runners()
                    os._exit(1)
                self.current_item = None
            self.emit(ev.BatchFinished(status="finished"))
        finally:
            self._end_runners()
        try:
            dist.destroy_process_group()
        except Exception:  # noqa: BLE001
            pass
        return 0

    def _open_gate(self) -> None:
        """The GPU gate on every GPU where every judge's works (engine.gate); PKB_GPU_GATE=0 turns
        it off (graph blocks then timed on the judge's host clock, as the batch's notes say)."""
        if self.device.type != "cuda":
            return
        if os.environ.get("PKB_GPU_GATE", "1") == "0":
            self.gate_note = ("graph figures on the judge's host clock, pipe hand-offs included: the GPU gate is off "
                              "(PKB_GPU_GATE=0)")
            return
        judge_gate = None
        try:
            judge_gate = gate.JudgeGate(self.device)
            why = judge_gate.self_test()
        except Exception as exc:  # noqa: BLE001 - no gate is a note, not a failure
            why = f"{type(exc).__name__}: {exc}"
        whys = [w for w in self.agree(why) if w]
        if whys:
            self.gate_note = (f"graph figures on the judge's host clock, pipe hand-offs included: the GPU gate "
                              f"is off ({whys[0]})")
        else:
            self.gate = judge_gate

    def _end_runners(self) -> None:
        if self.baseline_runner is not None:
            self.baseline_runner.close()
            self.baseline_runner = None
        if self.forkserver is not None:
            self.forkserver.close()
            self.forkserver = None
        _end_children()

    def start_runner_process(self, fds: dict[str, int], env: dict[str, str], cwd: str
                             ) -> subprocess.Popen[bytes] | forkserver.RunnerHandle:
        """A runner process, forked from this judge's fork server (engine.forkserver); a fresh
        interpreter where that is switched off or the server failed (said once in the rank's log)."""
        if forkserver.enabled() and not self.forkserver_failed:
            try:
                if self.forkserver is None:
                    self._start_forkserver()
                assert self.forkserver is not None
                return self.forkserver.spawn(fds, env, cwd)
            except (forkserver.ForkServerError, OSError) as exc:
                print(f"pkb: rank {self.rank}: the runner fork server failed ({exc}); starting runners afresh",
                      file=sys.stderr, flush=True)
                self.forkserver_failed = True
                if self.forkserver is not None:
                    self.forkserver.close()
                    self.forkserver = None
        return start_runner_subprocess(fds, env, cwd)

    def _start_forkserver(self) -> None:
        if forkserver.enabled() and not self.forkserver_failed and self.forkserver is None:
            self.forkserver = forkserver.ForkServer(runner_env(), self.log_dir / f"forkserver.rank{self.rank}.log")

    def _restrict_writes(self) -> str | None:
        if os.environ.get("PKB_SANDBOX", "1") == "0":
            return "no write sandbox: PKB_SANDBOX=0"
        from pkb_tui.engine.sandbox import default_writable, restrict_writes

        return restrict_writes(default_writable(Path(self.spec["log_dir"])))

    def _place(self) -> None:
        """This judge onto its CPUs (engine.placement), before it starts threads or its fork
        server (they inherit them); what it and the baseline's runner must keep running with."""
        local_world = int(os.environ.get("LOCAL_WORLD_SIZE", self.world_size))
        self.placement = placement.plan(self.local_rank, local_world)
        if self.placement.pinned:
            placement.pin_process(self.placement.judge)
        own = placement.Scheduling.of(os.getpid())
        self.judge_scheduling = own
        self.runner_scheduling = placement.Scheduling(self.placement.runners or own.cpus, own.nice, own.policy)

    def _scheduling_lost(self) -> str | None:
        """Before an item: this judge and its fork server (whose children are the next runners)
        run as placed. A candidate of an earlier item may have moved them; what cannot be put back
        (a raised nice, without CAP_SYS_NICE) ends the launch, as a lost CUDA context does."""
        checks = [(os.getpid(), "this judge")]
        if self.forkserver is not None and self.forkserver.pid:
            checks.append((self.forkserver.pid, "its fork server"))
        for pid, who in checks:
            still = placement.restore(pid, self.judge_scheduling, who)
            if still:
                return still.replace("timing tampered: ", "", 1)
        return None

    def _scheduling_moved(self, runner: RunnerProcess) -> str | None:
        """Before a timed baseline block: the sentence when the baseline's runner or this judge no
        longer runs where and how it was placed (a candidate of the same uid can move both)."""
        return (placement.moved(runner.pid, self.runner_scheduling, f"the baseline's runner on rank {self.rank}")
                or placement.moved(os.getpid(), self.judge_scheduling, f"judge {self.rank}"))

    def mode_notes(self) -> list[str]:
        notes = [self.sandbox_note] if self.sandbox_note else []
        notes.append(self.placement.note)
        if self.mode == "shared-gpu":
            mps = "on" if os.environ.get("CUDA_MPS_PIPE_DIRECTORY") else "off"
            notes.append(f"shared-gpu mode: {self.world_size} ranks on one GPU (MPS {mps}); timings do not represent an interconnect")
        if self.mode == "cpu":
            notes.append("cpu: for development, not a measurement (gloo on CPU tensors)")
        if self.gate_note:
            notes.append(self.gate_note)
        notes.append(_candidate_sandbox_note(self.world_size))
        notes.append(f"limits per candidate and rank: {self.limits.describe()}, the first and last "
                     f"{limits.OUTPUT_HALF_BYTES // 2**20} MiB of its output kept")
        return notes

    def host_facts(self) -> dict[str, Any]:
        facts: dict[str, Any] = {
            "hostname": socket.gethostname(), "torch_version": torch.__version__,
            "python_version": sys.version.split()[0], "gpu_count": 0,
        }
        try:
            from pkb_tui.engine.calibrate import host_facts

            facts.update(host_facts())
            return facts
        except Exception:  # noqa: BLE001
            pass
        if torch.cuda.is_available():
            facts["gpu_count"] = torch.cuda.device_count()
            facts["gpu_model"] = torch.cuda.get_device_name(self.device)
            facts["cuda_version"] = torch.version.cuda
        return facts

    # ------------------------------------------------------------------ runners
    def _port(self) -> int:
        """A port for a runner group's rendezvous, chosen on judge 0 (which hosts runner 0)."""
        port = None
        if self.rank == 0:
            with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
                s.bind(("", 0))
                port = s.getsockname()[1]
        return int(self.agree(port)[0])

    def _candidate_netns(self) -> tuple[sandbox.NetNamespace | None, str | None]:
        """The candidate group's network namespace on this host, made by judge 0 and handed to the
        other judges over an abstract unix socket (they may not open /proc/PID/ns of another
        judge's child: Landlock scopes ptrace to a judge's own domain); or None and why not.
        Every judge calls it at the same point (collectives)."""
        why = _net_unrestricted_reason(self.world_size)
        if why is not None:
            return None, f"network not restricted: {why}"
        made: sandbox.NetNamespace | str | None = None
        listener = None
        name = None
        if self.rank == 0:
            made = self.netns_unavailable or sandbox.make_net_namespace()
            if isinstance(made, str):
                self.netns_unavailable = made  # the kernel will not change its mind within a batch
            if isinstance(made, sandbox.NetNamespace):
                try:
                    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
                    name = f"\0pkb-netns-{secrets.token_hex(16)}"
                    listener.bind(name)
                    listener.listen(self.world_size)
                except OSError as exc:
                    made.close()
                    made = f"no socket to hand the namespace out ({exc})"
        said = self.agree((os.getpid(), name, made if isinstance(made, str) else None))
        name, error = said[0][1], said[0][2]
        if error is not None:
            return None, f"network not restricted: {error}"
        ns: sandbox.NetNamespace | None = None
        problem = None
        if self.rank == 0 and listener is not None:
            assert isinstance(made, sandbox.NetNamespace)
            ns = made
            problem = _hand_out_fds(listener, ns, {pid for pid, _, _ in said[1:]})
        else:
            got = _fetch_fds(str(name))
            ns, problem = (got, None) if isinstance(got, sandbox.NetNamespace) else (None, got)
        problems = [p for p in self.agree(problem) if p]
        if problems:
            if ns is not None:
                ns.close()
            return None, f"network not restricted: {problems[0]}"
        return ns, None

    def read_denials_for(self, item: RunItem | None) -> dict[str, Any]:
        """What this item's candidate runner may not read, for its init (engine.sandbox), or
        nothing when reads are left open (PKB_SANDBOX_READS=0: said in the run's notes)."""
        if os.environ.get("PKB_SANDBOX_READS", "1") == "0":
            return {}  # said in the batch's notes
        own = None
        if item is not None and (item.model_path or item.solution_path):
            own = sandbox.real_path(item.model_path or Path(str(item.solution_path)).parent)
        others = [d for d in self.spec.get("model_dirs") or [] if sandbox.real_path(d) != own]
        if item is not None and not self.spec.get("model_dirs"):
            others = [sandbox.real_path(i.model_path) for i in self.items if i.model_path and sandbox.real_path(i.model_path) != own]
        db = self.spec.get("db_path")
        # Other batches' folders and other models' JIT caches too (the runner's own is granted back).
        shared = [self.spec["runs_dir"]] if self.spec.get("runs_dir") else []
        denials = sandbox.candidate_read_denials(self.log_dir, Path(db) if db else None, _PROJECT_ROOT, others,
                                                 [*shared, sandbox.jit_cache_dir("")])
        return {"read_denials": denials.to_dict(), "model_dir": own}

    def _start_runners(self, wanted: list[tuple[str, Path]], deadline: float) -> list[RunnerProcess]:
        """Start runners side by side (their start-ups overlap) and wait until each one's process
        group is up; every judge agrees on any failure, and the runners are stopped till needed."""
        failure = None
        if any(self.agree(_monotonic() >= deadline)):  # every judge decides alike (ports are agreed next)
            # The launch's own start-up (torchrun, the judges' imports) ate the first run's
            # timeout: say so now rather than start runners the launcher will kill mid-way.
            failure = ("error", f"{RANKS_DID_NOT_START}: the ranks' start-up took longer than its timeout "
                                f"({float(self.request.timeout_s):g} s); no runner was started")
            wanted = []
        ports = [self._port() for _ in wanted]
        netns, net_note = self._candidate_netns() if any(label == "candidate" for label, _ in wanted) else (None, None)
        if net_note is not None and self.item is not None and _net_unrestricted_reason(self.world_size) is None:
            # A namespace that could not be made (the batch's note says what was meant).
            self.emit(ev.RunNote(item=self.item.index, note=f"the candidate's sandbox: {net_note}"))
        runners = []
        try:
            for (label, log_path), port in zip(wanted, ports):
                runners.append(RunnerProcess(self, label, port, log_path, netns if label == "candidate" else None))
                if label == "candidate":
                    self.guarded = runners[-1]
        finally:
            if netns is not None:
                netns.close()  # the runner is in it now (or never will be): it lives as long as its members
        # A runner that dies while its group forms leaves its peers waiting in the rendezvous: its
        # judge says so at once (the abort key) and the other judges stop waiting on theirs.
        abort = self._aborted(self.item) if self.item is not None else None
        for runner in runners:
            try:
                if failure is not None:
                    raise channel.ChannelError("stopped: another runner of this rank failed")
                reply = runner.first_message(deadline, abort)  # sent once its process group is up
                if not reply.get("ok"):
                    failure = failure or ("error", str(reply.get("error"))[:2000])
                elif reply.get("sandbox_note"):
                    note = f"the {runner.label}'s sandbox on rank {self.rank}: {str(reply['sandbox_note'])[:300]}"
                    if self.item is not None:
                        self.emit(ev.RunNote(item=self.item.index, note=note))
                    self.runner_note = note
            except channel.ChannelError as exc:
                code = runner.proc.poll()
                if str(exc).startswith("stopped:"):
                    failure = failure or ("error", f"{exc}"[:300])
                elif code is None and _monotonic() < deadline:  # its pipe broke (killed from outside, say)
                    failure = failure or ("error", f"the {runner.label}'s process on rank {self.rank} stopped "
                                                   f"answering while it started: {exc}"[:300])
                elif code is None:  # not up in time: the harness's start-up, not the candidate's doing
                    failure = failure or ("error", f"{RANKS_DID_NOT_START}: the ranks' start-up took longer than its "
                                                   f"timeout ({float(self.request.timeout_s):g} s); the {runner.label}'s "
                                                   f"process on rank {self.rank} was not up in time")
                else:
                    failure = failure or ("error", f"the {runner.label}'s process on rank {self.rank} did not start "
                                                   f"(exit code {code}): {runner.output.last_lines(3) or exc}")
        if failure is not None and not failure[1].startswith("stopped:"):
            self._signal_abort(self.current_item)
        failures = sorted((f for f in self.agree(failure) if f), key=_failure_order)
        if failures:
            self._abort_epoch += 1
            for runner in runners:
                runner.close()
            raise CandidateFailure(*failures[0])
        for runner in runners:
            runner.pause()
        return runners

    def _baseline_runner(self, deadline: float) -> RunnerProcess:
        if self.baseline_runner is None:
            (self.baseline_runner,) = self._start_runners(
                [("baseline", self.log_dir / f"baseline.rank{self.rank}.log")], deadline)
        return self.baseline_runner

    def _abort_key(self, item_index: int | None) -> str:
        # One key per agreed failure (the epoch moves on after each, on every judge alike), so a
        # failure already dealt with does not stop the runners that carry on (the baseline's).
        return f"pkb/{self.nonce}/abort/{item_index}/{self._abort_epoch}"

    def _aborted(self, item: RunItem) -> Any:
        return lambda: self.store.check([self._abort_key(item.index)])

    def _signal_abort(self, item_index: int | None) -> None:
        """Tell the other judges at once that this rank's runner failed (they stop waiting on theirs)."""
        if item_index is None:
            return
        try:
            self.store.set(self._abort_key(item_index), "1")
        except Exception:  # noqa: BLE001
            pass

    def _agree_failure(self, item: RunItem, failure: CandidateFailure | None, *runners: RunnerProcess | None
                       ) -> CandidateFailure | None:
        """Every judge's failure (or None), the cause first; the runners are stopped afterwards."""
        if failure is not None:
            self._signal_abort(item.index)
        got = self.agree((failure.status, failure.message) if failure else None)
        for runner in runners:
            if runner is not None:
                runner.pause()
        candidates = sorted((g for g in got if g), key=_failure_order)
        if candidates:
            self._abort_epoch += 1
        first = candidates[0] if candidates else None
        return CandidateFailure(*first) if first else None

    # ------------------------------------------------------------------ one (task, model)
    def _context_lost(self) -> str | None:
        """Why this judge's CUDA context cannot be used any more, or None. Measured on the H200 in
        shared-gpu mode (MPS): a candidate runner killed while its kernel ran left every client of
        the GPU with a sticky "illegal memory access", the judges included, so the next model's run
        died on its first allocation and was reported as an error of its own. MPS shares one GPU
        fault among its clients; a context that saw one is never reused (issue 13, item 5)."""
        if self.device.type != "cuda":
            return None
        if self.gate_stuck:  # a synchronize would wait for the held stream for ever
            return self.gate_stuck
        try:
            torch.empty(1, device=self.device).fill_(0.0)
            torch.cuda.synchronize(self.device)
        except Exception as exc:  # noqa: BLE001 - any CUDA error here means the context is gone
            return str(exc).splitlines()[0][:200] if str(exc) else type(exc).__name__
        return None

    def run_item(self, item: RunItem) -> None:
        req = self.request
        self.emit(ev.RunStarted(item=item.index, task=item.task, model=item.model, trials=req.trials))
        task = load_task(item.task)
        rule = Rule(task)
        deadline = _monotonic() + float(req.timeout_s)  # from the run's start: the launch's start-up is not its
        abort = self._aborted(item)
        self.clock = clock = PhaseClock()
        candidate: RunnerProcess | None = None
        log_path = self.log_dir / f"item{item.index:03d}.rank{self.rank}.candidate.log"
        try:
            try:
                start_s = _monotonic()
                # The baseline's runner is as new as the candidate's (a long-lived one would be warmer:
                # allocator pools, library handles), started beside it so the start-ups overlap.
                wanted = [("candidate", log_path)]
                if req.timing:
                    wanted.append(("baseline", self.log_dir / f"item{item.index:03d}.rank{self.rank}.baseline.log"))
                started = self._start_runners(wanted, deadline)
                candidate = started[0]
                self.baseline_runner = started[1] if len(started) > 1 else None
                failure = None
                try:
                    _expect_ok(candidate.request({"op": "load", "task": item.task, "solution_path": item.solution_path},
                                                 deadline, abort), "candidate")
                except CandidateFailure as exc:
                    failure = exc
                failure = self._agree_failure(item, failure, candidate)
                if failure is not None:
                    raise CandidateFailure(failure.status, failure.message)
                self._candidate_start_s = _monotonic() - start_s  # isolation's cost: spawn, group, import
                clock.mark("start-up")
            except CandidateFailure as exc:
                where = "candidate import" if exc.status == "error" else "candidate start"
                self.emit(ev.Error(item=item.index, where=where, message=exc.message))
                self.emit(ev.RunFinished(item=item.index, status=exc.status, detail=self._spent(item, clock, exc.status, exc.message)))
                return
            status, detail = self._trials(item, task, rule, candidate, deadline, abort)
            clock.mark("trials")
            if status in ("passed", "failed") and req.timing:
                timing_status, timing_detail = self._time(item, task, rule, candidate, status == "passed", deadline, abort)
                clock.mark("timing rounds" if clock.rounds else "timing")
                if timing_status != "passed":
                    status, detail = timing_status, timing_detail
            if status == "passed" and req.profile:
                self._profile(item, candidate, deadline, abort)
                clock.mark("profile")
            status, detail = self._within_limits(candidate, status, detail)
            self.emit(ev.RunFinished(item=item.index, status=status, detail=self._spent(item, clock, status, detail)))
        finally:
            if candidate is not None:
                candidate.close()
            if self.baseline_runner is not None:
                self.baseline_runner.close()
                self.baseline_runner = None
            _end_children(keep=self.forkserver.pid if self.forkserver is not None else None)

    def _spent(self, item: RunItem, clock: PhaseClock, status: str, detail: str | None) -> str | None:
        """The item's log gets where its time went on this judge; a timeout's message too (was
        the --timeout too short for what the judge does for this task, or the code slow?)."""
        spent = clock.summary()
        print(f"rank {self.rank}: {item.task} ({item.model}, {status}): item's time: {spent}", file=sys.stderr, flush=True)
        if status == "timeout" and detail:
            return f"{detail} (time spent on rank {self.rank}: {spent})"
        return detail

    def _context(self, task: Task, item: RunItem, label: Any) -> Any:
        req = self.request
        return task.context(rank=self.rank, world_size=self.world_size, dtype=req.dtype, size=req.size,
                            seed=_trial_seed(self.secret_seed, item.task, label), device=self.device, mode=self.mode,
                            trial=label if isinstance(label, int) else None)  # PKB problems seed their inputs by it

    def _trials(self, item: RunItem, task: Task, rule: Rule, candidate: RunnerProcess, deadline: float,
                abort: Any) -> tuple[str, str | None]:
        req = self.request
        all_correct = True
        for trial in range(req.trials):
            self.emit(ev.Progress(item=item.index, phase="trial", trial=trial, trials=req.trials))
            inputs = task.make_inputs(self._context(task, item, trial))
            baseline_inputs = clone_value(inputs)
            expected = task.baseline(*baseline_inputs)
            # A baseline that returns (a view of) its input (a gather's non-root ranks) makes that
            # legitimate for the candidate too; an earlier call's output never is.
            check = "outputs" if find_aliasing(expected, [baseline_inputs]) else True
            del baseline_inputs
            truth = task.baseline(*float64_copies(inputs))  # the same maths in float64: what "right" is
            self._sync()
            failure = None
            cmp = Comparison(False, message="not run")
            try:
                outputs = self._call(candidate, [inputs], [expected], "eager", deadline, abort, check=check,
                                     poison=_nbytes(expected))[1]
                cmp = rule.judge(outputs[0], expected, truth, "output")
            except CandidateFailure as exc:
                failure = exc
            failure = self._agree_failure(item, failure)
            if failure is not None:
                self.emit(ev.Error(item=item.index, where="candidate", message=failure.message))
                return failure.status, failure.message
            if self.baseline_runner is not None and BASELINE_TRIALS:
                # An experiment (PKB_BASELINE_TRIALS=1): the baseline's runner makes the trial's call
                # too, so both runners reach timing with the same history (calls made, arenas
                # mapped); its outputs are not read. Whether that moves the steady offset between
                # the two processes is what it is for (docs/architecture.md, noise floor).
                try:
                    if trial == 0:  # as the candidate's runner was, before its first trial
                        _expect_ok(self.baseline_runner.request({"op": "load", "task": item.task, "solution_path": None},
                                                                deadline, abort), "baseline")
                    self._call(self.baseline_runner, [inputs], [expected], "eager", deadline, abort, check=check,
                               poison=_nbytes(expected))
                except CandidateFailure as exc:
                    failure = exc
                failure = self._agree_failure(item, failure)
                if failure is not None:
                    message = f"the baseline's runner failed in the trial: {failure.message}"
                    self.emit(ev.Error(item=item.index, where="baseline", message=message))
                    return "error", message
            all_correct = self._report_trial(item, trial, cmp) and all_correct
        return ("passed" if all_correct else "failed"), None

    def _call(self, runner: RunnerProcess, inputs: list[Any], expected: list[Any], how: str, deadline: float,
              abort: Any, *, check: bool | str = False, poison: int = 0, timed: bool = False,
              counters: Any = None, idle_check: RunnerProcess | None = None,
              _recaptured: bool = False) -> tuple[Block, list[Any], dict[str, Any]]:
        """Write inputs into the runner's arena, have it call once per input set, read the outputs.

        Returns the block as the judge timed it, the outputs (values read from the arena, or the
        runner's sentence when they broke the contract) and the runner's reply."""
        # A graph block on a GPU is timed by the judge's own events on the GPU (engine.gate), its
        # flags in the arena's first bytes.
        judge_gate = self.gate if how.startswith("graph") else None
        layout = channel.Layout(gate.GATE_BYTES if self.gate is not None else 0)
        in_specs = [layout.place(x) for x in inputs]
        out_start = layout.end
        out_specs = [layout.place(e) for e in expected]
        if how.startswith("graph") and _has_plain_values(out_specs):
            return Block(0.0, 0.0, len(inputs)), [], {"ok": True, "graph_error": "not capturable: outputs with plain values"}
        key = hashlib.blake2b(json.dumps([in_specs, out_specs]).encode(), digest_size=12).hexdigest()
        # Every judge passes the same collectives whatever its runner did: a failure is held until
        # the ranks agree on it (announced at once, so the other judges stop waiting on theirs).
        failure: CandidateFailure | None = None
        reply: dict[str, Any] = {}
        try:
            runner.ensure_arena(layout.end, deadline, abort)
            # The runner learns the layout, then is stopped while this block's inputs land: it
            # cannot see them before it is woken just ahead of the barrier. (With the inputs
            # written first, a candidate computed the whole block in "prepare", outside the
            # window: fixture adversarial/head-start, 19.3x.) The prepared views are the same
            # slots every block of this layout ("same" on the runner's side).
            _expect_ok(runner.request({"op": "prepare", "inputs": in_specs, "outputs": out_specs, "key": key},
                                      deadline, abort), runner.label)
            runner.pause()
        except CandidateFailure as exc:
            failure = exc
            self._signal_abort(self.current_item)
        if failure is None and timed and idle_check is not None and runner is not idle_check:
            # ``idle_check``: the candidate's runner, stopped. It may have moved the baseline's runner
            # or this judge onto a busy CPU or to a lower priority (no capability needed).
            moved = self._scheduling_moved(runner)
            if moved is not None:
                failure = CandidateFailure("failed", moved)
                self._signal_abort(self.current_item)
        if failure is None and timed and idle_check is not None and self.device.type == "cuda":
            # ``idle_check``: the candidate's runner, stopped; nothing of it may still run on the GPU,
            # neither while the baseline is timed nor, before the candidate's own block, a kernel
            # left waiting for the inputs to land (it would start on them before the window).
            failure = await_idle_gpu(self._gpu_probe_us, lambda: self._kill_candidate(idle_check))
            if failure is not None:
                self._signal_abort(self.current_item)
        if failure is None:
            try:
                arena = runner.arena.tensor
                if judge_gate is not None:  # staged: they reach the arena inside the window (engine.gate)
                    staged = judge_gate.stage(arena, layout.end)
                    for value, spec in zip(inputs, in_specs):
                        channel.write(value, spec, staged)
                else:
                    for value, spec in zip(inputs, in_specs):
                        channel.write(value, spec, arena)
                    arena[out_start:layout.end].fill_(0xFF)  # poison: a slot the runner never writes reads NaN
                    self._flush_l2()
                self._sync()
            except CandidateFailure as exc:
                failure = exc
                self._signal_abort(self.current_item)
        # The wake-up from SIGSTOP stays outside the window: inside it, it cost ~1 ms a block on the
        # H200 VM (hand-offs 0.9 ms, sd up to 0.6 ms, against ~0.14 ms for a spinning runner), most
        # of a small call's block. What the runner can start on before t0 is what the barrier
        # takes once it is awake (tens of us at one rank).
        runner.resume()
        if timed:
            self.barrier()
        wall_us = 0.0
        t_back = 0
        if judge_gate is not None:
            block, reply = self._gated_block(judge_gate, runner, failure, out_start, layout.end, len(inputs), how, deadline, abort)
            if reply.get("graph_error"):
                return block, [], reply
            snapshot = judge_gate.outputs()
            judged: list[Any] = []
            for spec in out_specs:
                try:
                    judged.append(_build_output(spec, snapshot, None))
                except (channel.ChannelError, TypeError, ValueError, IndexError) as exc:
                    judged.append(f"outputs unreadable: {exc}")
            return block, judged, reply
        if failure is None:
            if counters is not None:
                counters.start()
            self.timing_block = timed  # the guard keeps off the GIL while a block is timed
            t0 = _perf_counter_ns()
            try:
                reply = runner.request({"op": "run", "how": how, "check": check, "poison": poison}, deadline, abort,
                                       spin_s=0.05 if timed and spins(self.device) else 0.0)
                t_back = _perf_counter_ns()
                wall_us = (t_back - t0) / 1000.0
                _expect_ok(reply, runner.label)
            except CandidateFailure as exc:
                failure = exc
                self._signal_abort(self.current_item)
            self.timing_block = False
            if counters is not None:
                counters.tick()
        graph_error = str(reply["graph_error"])[:300] if reply.get("graph_error") else None
        agreed = self.agree(((failure.status, failure.message) if failure else None, bool(reply.get("captured")),
                             graph_error))
        runner.pause()
        self._raise_agreed(runner, [f for f, _, _ in agreed])
        graph_errors = [g for _, _, g in agreed if g]
        if graph_errors:  # one rank's runner could not capture: the method is off on every rank
            return Block(wall_us, 0.0, len(inputs)), [], {"ok": True, "graph_error": graph_errors[0]}
        if any(captured for _, captured, _ in agreed) and not _recaptured:
            # This call captured the graph (its time holds the capture): time a replay instead.
            return self._call(runner, inputs, expected, how, deadline, abort, check=check, poison=poison, timed=timed,
                              counters=counters, idle_check=idle_check, _recaptured=True)
        arena = runner.arena.tensor
        if reply.get("graph_error"):
            return Block(wall_us, 0.0, len(inputs)), [], reply
        issues = reply.get("issues") or []
        leaves = reply.get("leaves") or []
        outputs: list[Any] = []
        for i, spec in enumerate(out_specs):
            issue = issues[i] if i < len(issues) and how != "graph" else None
            if issue:
                outputs.append(str(issue)[:500])
                continue
            try:
                # A plain value the runner did not send reads None (wrong), never the expected one:
                # replies leave out empty lists (runner._run_block).
                outputs.append(_build_output(spec, arena, None if how == "graph" else (leaves[i] if i < len(leaves) else [])))
            except (channel.ChannelError, TypeError, ValueError, IndexError) as exc:
                outputs.append(f"outputs unreadable: {exc}")
        try:
            reported = float(reply.get("device_us") or 0.0)
        except (TypeError, ValueError):
            reported = math.inf
        block = Block(wall_us, reported if math.isfinite(reported) else math.inf, len(inputs))
        try:  # where the harness's time goes (diagnosis only: CLOCK_MONOTONIC is shared by processes)
            block.wake_in_us = (int(reply["t_in_ns"]) - t0) / 1000.0
            block.wake_out_us = (t_back - int(reply["t_out_ns"])) / 1000.0
        except (KeyError, TypeError, ValueError):
            pass
        return block, outputs, reply

    def _gated_block(self, gate_: gate.JudgeGate, runner: RunnerProcess, failure: CandidateFailure | None, out_start: int, end: int,
                     calls: int, how: str, deadline: float, abort: Any) -> tuple[Block, dict[str, Any]]:
        """A graph block timed on the GPU between the judge's own events (engine.gate). The runner
        (awake, past the barrier) captures its graph if it has none for this block (the judges
        agree on that first); the inputs are staged in the judge's mirror; the runner enqueues its
        replay between the flags and answers; the judges agree (every rank's window enqueued) and
        release their flags at once; the runner answers again once the block has run. Every judge
        goes through the same collectives whatever happened, and a window is never left held: a
        failure releases both flags, and a runner that does not let the window end is ended."""
        who = f"judge rank {self.rank} ({runner.label})"
        graph_error = None
        if failure is None:
            try:
                captured = runner.request({"op": "capture", "how": how}, deadline, abort)
                _expect_ok(captured, runner.label)
                graph_error = str(captured["graph_error"])[:300] if captured.get("graph_error") else None
            except CandidateFailure as exc:
                failure = exc
                self._signal_abort(self.current_item)
        agreed = self.agree(((failure.status, failure.message) if failure else None, graph_error))
        self._raise_agreed(runner, [f for f, _ in agreed])
        graph_errors = [g for _, g in agreed if g]
        if graph_errors:  # one rank's runner could not capture: the method is off on every rank
            runner.pause()
            return Block(0.0, 0.0, 0), {"ok": True, "graph_error": graph_errors[0]}

        # Nothing may allocate while the window is held: freeing cached memory to make room
        # synchronizes the device, and would wait for the held stream for ever.
        self._l2_flush_buffer()
        window = gate_.open(runner.arena.tensor, out_start, end, self._flush_l2)
        gate.trace(who, "window opened, asking the runner", window.seq)
        gate.watch()
        stalled = None
        try:
            command = {"op": "run", "how": how, "gate": window.seq}
            try:
                reply = runner.request(command, min(deadline, _monotonic() + GATE_ENQUEUE_S), abort)
            except CandidateFailure as exc:
                if exc.status != "timeout" or _monotonic() >= deadline:
                    raise
                # Enqueueing a replay takes microseconds: a runner silent this long may be waiting
                # for its own stream, which the gate holds. Released, it answers if so; the block
                # then held host time and is not a figure.
                gate_.release(window)
                gate.trace(who, "no first answer: released early", window.seq)
                reply = runner.answer(deadline, abort)
                stalled = (f"not timed: the {runner.label}'s runner on rank {self.rank} enqueued its graph block only "
                           f"once the GPU gate's go flag was released ({GATE_ENQUEUE_S:g} s without an answer)")
            _expect_ok(reply, runner.label)
            if not reply.get("gated"):
                raise CandidateFailure("failed" if runner.label == "candidate" else "error",
                                       f"timing tampered: the {runner.label}'s runner on rank {self.rank} answered a "
                                       "graph block without timing it through the GPU gate")
        except CandidateFailure as exc:
            failure = exc
            self._signal_abort(self.current_item)
        gate_.close(window)
        gate.trace(who, f"first answer {'failed' if failure else 'in'}, window closed", window.seq)
        agreed_run = self.agree(((failure.status, failure.message) if failure else None, stalled))
        failed_somewhere = any(f for f, _ in agreed_run)
        # Every window is enqueued on every rank: let them run together (or end them, on a failure).
        gate_.release(window, done_too=failed_somewhere)
        gate.trace(who, f"released (done too: {failed_somewhere})", window.seq)
        late: CandidateFailure | None = None
        if not failed_somewhere:
            try:
                second = runner.answer(deadline, abort)  # the runner's stream has run
                _expect_ok(second, runner.label)
            except CandidateFailure as exc:
                late = exc
                self._signal_abort(self.current_item)
        late = self._end_window(gate_, window, runner, late)
        gate.unwatch()
        gate.trace(who, f"window ended ({late.message if late else 'ok'})", window.seq)
        agreed_late = self.agree((late.status, late.message) if late else None)
        runner.pause()
        self._raise_agreed(runner, [f for f, _ in agreed_run] + list(agreed_late))
        stalls = [n for _, n in agreed_run if n]
        if stalls:
            return Block(0.0, 0.0, 0), {"ok": True, "graph_error": stalls[0]}
        gpu_us = gate_.elapsed_us(window)
        return Block(gpu_us, gpu_us, calls), reply

    def _raise_agreed(self, runner: RunnerProcess, failures: list[Any]) -> None:
        """Raise the first of the ranks' agreed failures (the cause first), the runner stopped."""
        found = sorted((f for f in failures if f), key=_failure_order)
        if found:
            runner.pause()
            self._abort_epoch += 1
            raise CandidateFailure(*found[0])

    def _end_window(self, gate_: gate.JudgeGate, window: gate.Window, runner: RunnerProcess,
                    failure: CandidateFailure | None) -> CandidateFailure | None:
        """Wait for the window's end event, once the runner has said its stream has run (``failure``
        None) or failed (the judge then writes both flags itself). A window that has not ended
        IDLE_SETTLE_S later (a runner that never writes ``done``, or holds ``go`` down) ends the
        runner's processes, and the judge writes both flags again; one still held after that leaves
        this judge's GPU stream stuck, and the launch ends before the next item (_context_lost)."""
        if failure is not None:
            gate_.release(window, done_too=True)
        settle = _monotonic() + IDLE_SETTLE_S
        while not gate_.ended(window):
            if _monotonic() > settle:
                break
            time.sleep(0.0001)
        else:
            return failure
        if failure is None:
            failure = CandidateFailure(
                "failed" if runner.label == "candidate" else "error",
                f"timing tampered: the {runner.label}'s runner on rank {self.rank} said its graph block had run but "
                f"never signalled its end (the GPU gate's done flag) within {IDLE_SETTLE_S:g} s")
            self._signal_abort(self.current_item)
        self._kill_candidate(runner)
        gate_.release(window, done_too=True)
        settle = _monotonic() + IDLE_SETTLE_S
        while not gate_.ended(window):
            if _monotonic() > settle:
                self.gate_stuck = "a gated graph block's window did not end once its runner was killed"
                break
            time.sleep(0.001)
        return failure

    def _stream_round(self, item: RunItem, series: dict) -> None:
        """The round just timed, per variant, for the Live screen (judge 0's own figures)."""
        overhead = _null_overhead_us(series)
        for (variant, method), s in series.items():
            if method != "eager" or not s.rounds or not s.rounds[-1]:
                continue
            self.emit(ev.BlockTimes(item=item.index, variant=variant, method=method,
                                    per_call_us=[per_call_us(b.wall_us, overhead, b.calls) for b in s.rounds[-1]]))

    def _more_rounds(self, series: dict, candidate_ok: bool, rounds_done: int, least_rounds: int, elapsed_s: float,
                     budget_s: float, statistic: str, suspect_budget_s: float | None = None) -> bool:
        """Whether to time another round (engine.stats.next_round_needed on the figures of the
        method the speedup is read from: --speedup-basis, eager where the call has no graph).
        ``suspect_budget_s``: the longer budget of a speedup that looks like batching, undecided."""
        suspect_budget_s = budget_s if suspect_budget_s is None else suspect_budget_s
        if rounds_done < least_rounds:
            return True
        if not candidate_ok or rounds_done >= MAX_ROUNDS[self.device.type]:
            return False
        def suspect() -> bool:
            """A speedup that looks like batching and is not decided yet: more rounds, on CPU too,
            while another round fits the budget."""
            return (elapsed_s + elapsed_s / max(rounds_done, 1) <= suspect_budget_s
                    and self._batching_unresolved(series, statistic))

        if self.device.type != "cuda":
            return suspect()  # cpu: else a fixed count (its spread is the host's, not the kernels'; see stats)
        method = getattr(self.request, "speedup_basis", "eager") or "eager"
        if not any(series.get(("candidate", method), Series()).rounds) or series[("candidate", method)].note:
            method = "eager"
        overhead = _null_overhead_us(series, method)

        def per_call(key: tuple[str, str]) -> list[list[float]]:
            return [[per_call_us(b.wall_us, overhead, b.calls) for b in r] for r in series[key].rounds if r]

        decision = stats.next_round_needed(per_call(("baseline", method)), per_call(("candidate", method)),
                                           elapsed_s=elapsed_s, budget_s=budget_s, least_rounds=least_rounds,
                                           max_rounds=MAX_ROUNDS[self.device.type], statistic=statistic)
        return decision.more or suspect()

    def _batching_unresolved(self, series: dict, statistic: str) -> bool:
        """timing.batching_unresolved on this judge's own figures so far (eager blocks and calls
        alone, each with its null's share off, as _emit_timings computes them for all ranks)."""
        keys = [(v, m) for v in ("baseline", "candidate") for m in ("eager", "single")]
        if any(k not in series for k in keys) or ("baseline", "single-null") not in series:
            return False
        def rows(variant: str, method: str) -> list[list[float]]:
            overhead = _null_overhead_us(series, method)
            return [[per_call_us(b.wall_us, overhead, b.calls) for b in r] for r in series[(variant, method)].rounds]

        calls = max((b.calls for r in series[("candidate", "eager")].rounds for b in r), default=0)
        return batching_unresolved((rows("baseline", "eager"), rows("candidate", "eager")),
                                   (rows("baseline", "single"), rows("candidate", "single")),
                                   calls, BATCHED_LIMIT[self.device.type], statistic)

    def _report_trial(self, item: RunItem, trial: int, cmp: Comparison) -> bool:
        per_rank = self.gather({
            "rank": self.rank, "correct": cmp.correct, "max_abs_error": _finite(cmp.max_abs_error),
            "max_rel_error": _finite(cmp.max_rel_error), "message": cmp.message,
        })
        ok_everywhere = self.agree(cmp.correct)
        if self.rank == 0 and per_rank is not None:
            worst = max(per_rank, key=lambda r: (not r["correct"], r["max_abs_error"] or 0.0))
            message = next((f"rank {r['rank']}: {r['message']}" for r in per_rank if r["message"]), None)
            abs_errors = [r["max_abs_error"] for r in per_rank if r["max_abs_error"] is not None]
            rel_errors = [r["max_rel_error"] for r in per_rank if r["max_rel_error"] is not None]
            self.emit(ev.TrialResult(
                item=item.index, trial=trial, correct=all(ok_everywhere),
                max_abs_error=max(abs_errors) if abs_errors else None,
                max_rel_error=max(rel_errors) if rel_errors else None,
                worst_rank=worst["rank"], message=message, ranks=per_rank,
            ))
        return all(ok_everywhere)

    # ------------------------------------------------------------------ timing
    def _time(self, item: RunItem, task: Task, rule: Rule, candidate: RunnerProcess, candidate_ok: bool,
              deadline: float, abort: Any) -> tuple[str, str | None]:
        """Baseline and candidate in interleaved rounds (B C, C B, ...), each round a block of calls
        on fresh inputs that every variant gets alike, timed by the judge's own clock from the
        command to the answer; the runner's harness cost (null calls that only store outputs, on
        the baseline runner) is subtracted. Every output of every timed call is checked."""
        req = self.request
        try:
            baseline = self._baseline_runner(deadline)
            _expect_ok(baseline.request({"op": "load", "task": item.task, "solution_path": None}, deadline), "baseline")
            failure = None
        except CandidateFailure as exc:
            failure = exc
        failure = self._agree_failure(item, failure, self.baseline_runner)
        if failure is not None:
            self.emit(ev.Error(item=item.index, where="baseline runner", message=failure.message))
            return "error", failure.message
        variants = [("baseline", baseline)] + ([("candidate", candidate)] if candidate_ok else [])
        graph_ok = self.device.type == "cuda" and self.mode == "nccl"
        methods = ["eager"] + (["graph"] if graph_ok else [])
        kind = self.device.type
        series = {(v, m): Series() for v, _ in variants for m in methods}
        series[("baseline", "null")] = Series()
        if "graph" in methods:
            series[("baseline", "graph-null")] = Series()
        if candidate_ok:  # one call at a time, each round (the batching check, _batched)
            for v, _ in variants:
                series[(v, "single")] = Series()
            series[("baseline", "single-null")] = Series()
        phases: dict[str, list[dict]] = {v: [] for v, _ in variants}
        counters = {v: _phase_counters(self.device) for v, _ in variants}
        # Across nodes, each node's first rank also counts its host's NIC bytes over each variant's
        # timed blocks (what crossed to the other nodes); the launcher compares them per node with
        # the traffic model (nodes.node_wire).
        nic = ({v: _nic_tally() for v, _ in variants}
               if self.local_rank == 0 and int(os.environ.get("LOCAL_WORLD_SIZE", self.world_size)) < self.world_size else None)

        clock = self.clock

        def fresh(label: Any, calls: int) -> tuple[list[Any], list[Any], list[Any]]:
            with clock.part("the judge's inputs and expected outputs"):
                inputs = [task.make_inputs(self._context(task, item, ("timing", label, k))) for k in range(calls)]
                expected = [task.baseline(*clone_value(x)) for x in inputs]
                truths = [task.baseline(*float64_copies(x)) for x in inputs]
                self._sync()
            return inputs, expected, truths

        # Warm-up (also JIT, NCCL and graph capture) and the block size: enough calls that a block
        # lasts ~TARGET_BLOCK_US, as many as fit the arena budget, at most MAX_CALLS_PER_BLOCK.
        sample_inputs, sample_expected, _ = fresh("size", 1)
        per_call_bytes = max(1, _nbytes(sample_inputs[0]) + _nbytes(sample_expected[0]))
        calls_by_memory = max(1, ARENA_BUDGET_BYTES[kind] // per_call_bytes)
        warm_calls = int(min(calls_by_memory, max(2, min(8, req.warmup))))
        # cpu: no null blocks, nothing subtracted. At the few calls a CPU block holds, the harness's
        # share is about as large as the calls, and the difference of two noisy figures read zero
        # (no speedup then); gross figures, the same harness on both sides, for development.
        null_blocks = kind == "cuda"
        failure = None
        warm_us: dict[str, list[float]] = {m: [] for m in methods}
        try:
            # The block size is read from the baseline runner's warm-up block, and that runner is new
            # for this item: its first call of the task pays the task's lazy set-up in that process
            # (library handles and plans, NCCL's communicator for the operation, the allocator's
            # first segments), which the candidate's runner paid in its trials. A warm-up block that
            # holds it reads slow and asks for too few calls a block (a reference whose first call
            # takes 1.5 s: one call a block, tests/test_pkb_cli.py; on the H100 the uncapturable
            # tasks' blocks moved up to ~10x, both ways, when this runner had made trial calls
            # first: docs/measurements-2026-12-07.md). So the baseline's runner makes one untimed
            # call first, on inputs of its own (none a timed block sees).
            first_inputs, first_expected, _ = fresh("first call", 1)
            self._call(baseline, first_inputs, first_expected, "eager", deadline, abort)
            del first_inputs, first_expected
            inputs, expected, _ = fresh("warmup", warm_calls)
            for variant, runner in variants:
                for how in methods:
                    block, outputs, reply = self._call(runner, inputs, expected, how, deadline, abort, timed=True)
                    if reply.get("graph_error"):
                        series[(variant, how)].note = str(reply["graph_error"])[:300]
                    if variant == "baseline" and how == "eager" and not null_blocks:
                        warm_us[how].append(per_call_us(block.wall_us, 0.0, block.calls))
                    elif variant == "baseline":
                        null_block = self._call(runner, inputs, expected, "null" if how == "eager" else "graph-null",
                                                deadline, abort)[0]
                        if reply.get("graph_error"):
                            pass
                        elif how == "graph" and math.isfinite(block.reported_us) and block.reported_us > 0:
                            # Sized by the (trusted) baseline runner's own event time: at the warm-up's
                            # few calls the judge's clock is mostly pipe hand-offs and their jitter
                            # (H200: a 1 us call read 20 us, and blocks of 250 calls were asked for).
                            warm_us[how].append(per_call_us(block.reported_us, null_block.reported_us, block.calls))
                        else:  # the call's own time, the harness's share taken off
                            warm_us[how].append(per_call_us(block.wall_us, null_block.wall_us, block.calls))
        except CandidateFailure as exc:
            failure = exc
        candidate_failure: CandidateFailure | None = None

        def timed_on_without_candidate(failure: CandidateFailure) -> bool:
            """An agreed failure while timing: False when the run ends here; True when it was the
            candidate's (it raised or died), which then fails while the baseline is timed on alone
            for the rounds it still needs (its own figures stand)."""
            nonlocal candidate_failure, candidate_ok, variants
            self.emit(ev.Error(item=item.index, where="timing", message=failure.message))
            if not _candidate_fault(failure, candidate_ok):
                return False
            candidate_failure = _during_timing(failure)
            candidate_ok = False
            variants = [(v, r) for v, r in variants if v != "candidate"]
            for key in [k for k in series if k[0] == "candidate"]:
                series[key].rounds = []
                series[key].note = series[key].note or "the candidate failed while timed"
            return True

        failure = self._agree_failure(item, failure)
        if failure is not None and not timed_on_without_candidate(failure):
            return failure.status, failure.message
        notes = self.agree({m: series[("candidate", m)].note for m in methods} if candidate_ok else {})
        for m in methods:
            note = next((n.get(m) for n in notes if n.get(m)), None)
            if note and candidate_ok:
                series[("candidate", m)].note = note
        # Per method: a graph call is often 10-100x shorter than the same call eager (the host's
        # launch cost is gone), and a block sized by the eager figure then held a few hundred us of
        # GPU work under ~350 us of harness share with ~100 us of jitter (H200 self-check,
        # 2026-12-04: graph ratios 0.14-3.5 for the same code). Each method gets ~TARGET_BLOCK_US.
        warm_agreed = self.agree({m: max(v) for m, v in warm_us.items() if v})
        timed_methods = [m for m in methods if any(not series[(v, m)].note for v, _ in variants)]
        calls_for = calls_per_block(methods, timed_methods, warm_agreed, calls_by_memory, kind)
        first_call: dict[str, int] = {}
        calls = 0
        for how in methods:
            first_call[how], calls = calls, calls + calls_for[how]
        per_round_singles = calls_for["eager"] > 1  # (a block of one call is its own single)
        per_round = BLOCKS_PER_ROUND[kind]
        least_rounds = int(min(MAX_ROUNDS[kind], max(MIN_ROUNDS, math.ceil(req.iterations / (calls_for["eager"] * per_round)))))
        budget_s = min(TIMING_BUDGET_S[kind], 0.3 * float(req.timeout_s))
        # On a GPU a speedup that looks like batching gets up to twice as long to decide (undecided,
        # its figure is capped at the speed alone: timing.unconfirmed_in_blocks), within the run's
        # timeout. Not on CPU: gloo's noise makes honest runs look so (docs/architecture.md, the
        # batching check), the CPU budget already allows for it, and its figures are for development.
        suspect_budget_s = budget_s if kind == "cpu" else max(budget_s, min(2 * TIMING_BUDGET_S[kind],
                                                                             0.45 * float(req.timeout_s)))
        statistic = stats.round_statistic_for(self.mode)
        clock.mark("the baseline's load and the warm-up")
        timing_started = _monotonic()

        wrong: str | None = None
        round_index = 0
        while True:
            for key in list(series):
                series[key].rounds.append([])
            failure = None
            try:
                for sub in range(per_round):
                    inputs, expected, truths = fresh((round_index, sub), calls)
                    order = variants if (round_index * per_round + sub) % 2 == 0 else variants[::-1]  # B C, C B, ... block by block
                    for variant, runner in order:
                        self.emit(ev.Progress(item=item.index, phase="timing", variant=variant))
                        for how in methods:
                            if series[(variant, how)].note:
                                continue
                            if nic is not None and how == "eager":
                                nic[variant].begin()
                            calls_of = slice(first_call[how], first_call[how] + calls_for[how])
                            block, outputs, reply = self._call(
                                runner, inputs[calls_of], expected[calls_of], how, deadline, abort, timed=True,
                                counters=counters[variant] if how == "eager" else None,
                                idle_check=candidate if candidate_ok else None)
                            if nic is not None and how == "eager":
                                nic[variant].end(calls_for[how])
                            if how == "eager" and counters[variant] is not None:
                                phases[variant].append(counters[variant].stop(calls_for[how]))
                            if reply.get("graph_error"):
                                series[(variant, how)].note = str(reply["graph_error"])[:300]
                                continue
                            series[(variant, how)].rounds[-1].append(block)
                            if variant == "candidate" and wrong is None:
                                with clock.part("the judge's checks"):
                                    wrong = check_timed(outputs, expected[calls_of], truths[calls_of], rule, round_index,
                                                        self._sampler)
                            if variant == "baseline" and null_blocks:
                                null_how = "null" if how == "eager" else "graph-null"
                                null_block, _, null_reply = self._call(runner, inputs[calls_of], expected[calls_of], null_how,
                                                                       deadline, abort, timed=True)
                                if not null_reply.get("graph_error"):
                                    series[("baseline", null_how)].rounds[-1].append(null_block)
                singles = SINGLES_PER_ROUND[kind] if candidate_ok and per_round_singles else 0
                stale = inputs[:1], expected[:1]  # already timed: a warm-up on them tells a runner nothing
                for sub in range(singles):
                    # One call alone, on an input no block has held: what a call costs when the next
                    # one's input is not there yet. A runner that turns a block's calls into fewer
                    # operations (adversarial/batch-calls: one all_reduce for the block) is fast per
                    # call in blocks and not alone; timing.batched compares the two.
                    inputs, expected, truths = fresh((round_index, "single", sub), 1)
                    order = variants if (round_index * singles + sub) % 2 == 0 else variants[::-1]
                    for variant, runner in order:
                        # Warm first (an untimed null call on a stale input), so that every call alone
                        # is timed as the baseline's null after it is: right after a call of its own
                        # runner. Without it most calls alone came after the other runner's, the null
                        # never did, and on the H200 honest candidates' calls alone read 37-136 us
                        # beyond the null (0-35 us on the H100), which pulls a fast candidate's speedup
                        # alone towards 1-2x: the batching rule's signature. (Not yet measured on a GPU.)
                        self._call(runner, *stale, "null", deadline, abort)
                        block, outputs, _ = self._call(runner, inputs, expected, "eager", deadline, abort, timed=True,
                                                       idle_check=candidate if candidate_ok else None)
                        series[(variant, "single")].rounds[-1].append(block)
                        if variant == "candidate" and wrong is None:
                            with clock.part("the judge's checks"):
                                wrong = check_timed(outputs, expected, truths, rule, round_index, self._sampler)
                        if variant == "baseline":  # (on CPU too: a call alone is mostly the hand-off there)
                            null_block = self._call(runner, inputs, expected, "null", deadline, abort, timed=True)[0]
                            series[("baseline", "single-null")].rounds[-1].append(null_block)
                    stale = inputs, expected
            except CandidateFailure as exc:
                failure = exc
            failure = self._agree_failure(item, failure)
            if failure is not None and not timed_on_without_candidate(failure):
                return failure.status, failure.message
            round_index += 1
            clock.rounds = round_index
            if self.rank == 0:
                self._stream_round(item, series)
            # Adaptive: more rounds until the speedup's interval is narrow enough or the budget is
            # spent (judge 0 decides on its own clock's figures; every judge follows).
            more = None
            if self.rank == 0:
                more = self._more_rounds(series, candidate_ok, round_index, least_rounds,
                                         _monotonic() - timing_started, budget_s, statistic, suspect_budget_s)
            if not self.agree(more)[0]:
                break
        del inputs, expected, truths
        wrong_anywhere = [w for w in self.agree(wrong) if w]
        timed_ok = not wrong_anywhere
        if candidate_ok and candidate_failure is None:
            self._report_trial(item, -1, Comparison(timed_ok, message=None if timed_ok else wrong_anywhere[0]))

        # Per block: the slowest rank's wall time; the harness cost of a block is the median of the
        # null blocks (slowest rank each), per method.
        gathered = self.gather({k: [[(b.wall_us, b.reported_us, b.calls, b.wake_in_us, b.wake_out_us) for b in r]
                                    for r in s.rounds]
                                for k, s in ((f"{k[0]}|{k[1]}", s) for k, s in series.items())})
        def phase_figures(v: str) -> dict[str, Any] | None:
            entry = (combine_phases(phases[v], calls_for["eager"] * len(phases[v]))
                     if counters[v] is not None and phases[v] else None)
            if nic is not None and v in nic:
                entry = {**(entry or {}), **nic[v].figures()}
            return entry

        link_all = {v: self.gather(phase_figures(v)) for v, _ in variants}
        tampered: str | None = None
        if self.rank == 0 and gathered is not None:
            tampered = self._emit_timings(item, variants, methods, series, gathered, link_all, calls)
        tampered = self.agree(tampered)[0]
        if candidate_failure is not None:
            return "failed", candidate_failure.message
        if tampered:
            self.emit(ev.Error(item=item.index, where="timing", message=tampered))
            return "failed", tampered
        if not timed_ok:
            return "failed", wrong_anywhere[0]
        return "passed", None

    def _emit_timings(self, item: RunItem, variants: list, methods: list[str], series: dict, gathered: list,
                      link_all: dict, calls: int) -> str | None:
        def rounds_of(key: str) -> list[list[tuple[float, float, int]]]:
            """Per round, per block: the slowest rank's wall time, the least reported, the calls."""
            per_rank = [g.get(key, []) for g in gathered]
            count = min((len(r) for r in per_rank), default=0)
            out = []
            for i in range(count):
                blocks = min(len(r[i]) for r in per_rank)
                row = []
                for j in range(blocks):
                    row.append((max(r[i][j][0] for r in per_rank), min(r[i][j][1] for r in per_rank), per_rank[0][i][j][2]))
                if row:
                    out.append(row)
            return out

        tampered = None
        null_eager = sorted(b[0] for r in rounds_of("baseline|null") for b in r)
        null_graph = sorted(b[0] for r in rounds_of("baseline|graph-null") for b in r)
        overhead = {"eager": percentile(null_eager, 50) if null_eager else 0.0,
                    "graph": percentile(null_graph, 50) if null_graph else 0.0}
        if getattr(self, "_candidate_start_s", None) is not None:
            overhead["candidate_start_s"] = self._candidate_start_s
        for which in ("wake_in", "wake_out"):  # where the harness's share goes (rank 0's baseline blocks)
            index = 3 if which == "wake_in" else 4
            values = sorted(b[index] for r in gathered[0].get("baseline|eager", []) for b in r if b[index] is not None)
            if values:
                overhead[f"{which}_us"] = percentile(values, 50)
        block_rounds: dict[str, list[list[float]]] = {}
        single_rounds: dict[str, list[list[float]]] = {}
        single_null = sorted(b[0] for r in rounds_of("baseline|single-null") for b in r)
        single_overhead = percentile(single_null, 50) if single_null else 0.0
        for variant, _ in variants:
            figures: dict[str, Any] = {}
            for how in methods:
                rows = rounds_of(f"{variant}|{how}")
                if not rows:
                    continue
                per_call = [[per_call_us(w, overhead[how], n) for w, _, n in row] for row in rows]
                summary = stats.summarize_rounds(per_call)
                figures[how] = {"median_us": summary.median_us, "p10_us": summary.p10_us, "p90_us": summary.p90_us,
                                "mean_us": summary.mean_us, "min_us": summary.min_us, "max_us": summary.max_us,
                                "iterations": summary.samples, "rounds_us": per_call,
                                "calls_per_block": max((n for row in rows for _, _, n in row), default=0),
                                # Diagnosis only, never a verdict: per block, the runner's own event time
                                # per call (the candidate's is its word) and rank 0's hand-offs in and out.
                                "reported_rounds_us": [[round(r / n, 4) if n and math.isfinite(r) else None
                                                        for _, r, n in row] for row in rows],
                                "handoff_rounds_us": [[[_round(b[3]), _round(b[4])] for b in r]
                                                      for r in gathered[0].get(f"{variant}|{how}", [])]}
                if variant == "candidate" and tampered is None:
                    tampered = _tampered([g.get(f"candidate|{how}", []) for g in gathered], overhead[how])
            eager = figures.get("eager")
            if eager is None:
                continue
            single_rows = [[per_call_us(b[0], single_overhead, b[2]) for b in r] for r in rounds_of(f"{variant}|single")]
            singles = sorted(x for row in single_rows for x in row)
            if singles:  # calls alone (timing.batched), the harness's share off; stored for diagnosis
                q = 25 if stats.round_statistic_for(self.mode) != "median" else 50
                eager["single_us"] = percentile(singles, q)
                eager["singles"] = len(singles)
                eager["single_rounds_us"] = [[round(x, 3) for x in row] for row in single_rows]
                block_rounds[variant], single_rounds[variant] = eager["rounds_us"] or [], single_rows
            graph_note = series[(variant, "graph")].note if (variant, "graph") in series else None
            if self.device.type != "cuda":
                graph_note = "no CUDA graphs off the GPU"
            elif self.mode != "nccl":
                graph_note = graph_note or "not capturable: gloo collectives (shared-gpu mode)"
            self.emit(ev.Timing(
                item=item.index, variant=variant, median_us=eager["median_us"], p10_us=eager["p10_us"],
                p90_us=eager["p90_us"], mean_us=eager["mean_us"], min_us=eager["min_us"], max_us=eager["max_us"],
                iterations=eager["iterations"], input_copies=calls, eager=eager, graph=figures.get("graph"),
                graph_note=graph_note, overhead_us=overhead,
            ))
            links = link_all.get(variant) or []
            if any(entry is not None for entry in links):
                self.emit(ev.LinkBytes(
                    item=item.index, variant=variant, iterations=eager["iterations"],
                    nvlink_bytes_per_iter=_max_field(links, "nvlink_bytes_per_iter"),
                    pcie_bytes_per_iter=_max_field(links, "pcie_bytes_per_iter"),
                    per_rank=[entry or {} for entry in links],
                ))
        if tampered is None and len(block_rounds) == 2:
            eager_calls = max((b[2] for r in rounds_of("candidate|eager") for b in r), default=0)
            tampered = batched((block_rounds["baseline"], block_rounds["candidate"]),
                               (single_rounds["baseline"], single_rounds["candidate"]), eager_calls,
                               BATCHED_LIMIT[self.device.type], stats.round_statistic_for(self.mode))
        return tampered

    # ------------------------------------------------------------------ profile
    def _profile(self, item: RunItem, candidate: RunnerProcess, deadline: float, abort: Any) -> None:
        for variant, runner in (("baseline", self.baseline_runner), ("candidate", candidate)):
            if runner is None:
                continue
            self.emit(ev.Progress(item=item.index, phase="profile", variant=variant))
            # The runner writes its trace in its own scratch folder (all its sandbox lets it write);
            # the judge copies it into the batch folder.
            trace = str(self.log_dir / f"item{item.index:03d}.{variant}.rank{self.rank}.trace.json") if self.rank == 0 else None
            written = runner.scratch / "profile.trace.json"
            rows: list[dict[str, Any]] = []
            error = None
            try:
                reply = runner.request({"op": "profile", "iterations": 3, "trace_path": str(written) if trace else None},
                                       deadline, abort)
                _expect_ok(reply, variant)
                rows = _clean_rows(reply.get("rows"))
                if trace is not None and not _copy_regular_file(written, Path(trace), TRACE_MAX_BYTES):
                    trace = None
            except CandidateFailure as exc:
                error = f"profiler failed on rank {self.rank}: {exc.message}"
            if error:
                self._signal_abort(item.index)
            gathered = self.gather((rows, error))
            runner.pause()
            if self.rank == 0 and gathered is not None:
                for rank, (rank_rows, rank_error) in enumerate(gathered):
                    if rank_error:
                        self.emit(ev.Error(item=item.index, where=f"profile {variant}", message=rank_error, rank=rank))
                        continue
                    self.emit(ev.Kernels(item=item.index, variant=variant, rank=rank, kernels=rank_rows,
                                         trace_path=trace if rank == 0 and variant == "candidate" else None))

    # ------------------------------------------------------------------ device
    def _sync(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def _gpu_probe_us(self) -> float:
        """How long one tiny kernel of the judge's own takes from launch to done: tens of us on an
        idle GPU, a time slice (ms) when another process's kernel holds it."""
        if self._probe is None:
            self._probe = torch.zeros(1, device=self.device)
        started = _perf_counter_ns()
        self._probe.add_(1)
        torch.cuda.synchronize(self.device)
        return (_perf_counter_ns() - started) / 1000.0

    def _flush_l2(self) -> None:
        """Evict the inputs the judge just wrote from L2, so every timed call reads them cold."""
        if self.device.type != "cuda":
            return
        self._l2_flush_buffer().fill_(0)

    def _l2_flush_buffer(self) -> torch.Tensor:
        if self._flush is None:
            l2 = getattr(torch.cuda.get_device_properties(self.device), "L2_cache_size", 50 * 2**20)
            self._flush = torch.empty(2 * l2, dtype=torch.uint8, device=self.device)
        return self._flush


def await_idle_gpu(probe_us: Any, stop_candidate: Any, *, wait_s: float = IDLE_WAIT_S,
                   settle_s: float = IDLE_SETTLE_S, sleep: Any = time.sleep, clock: Any = _monotonic) -> CandidateFailure | None:
    """None when the GPU is idle (``probe_us()``: one probe kernel's wait, the least of three
    counts). Busy past ``wait_s`` while the candidate is stopped: its processes are ended
    (``stop_candidate()``), and if the GPU then goes idle the candidate left work running after
    its calls returned ("timing tampered", failed); if not, something else shares the GPU (error)."""
    def idle() -> bool:
        return min(probe_us() for _ in range(3)) < IDLE_PROBE_US

    if idle():
        return None
    end = clock() + wait_s
    while clock() < end:
        sleep(0.01)
        if idle():
            return None
    stop_candidate()
    end = clock() + settle_s
    while True:
        if idle():
            return CandidateFailure("failed", "timing tampered: the candidate's GPU work ran on after its calls had "
                                              "returned (the GPU stayed busy while its processes were stopped, and "
                                              "went idle once they were killed)")
        if clock() >= end:
            return CandidateFailure("error", f"{GPU_BUSY} (probe kernels waited over {IDLE_PROBE_US / 1000:g} ms for "
                                             f"{wait_s + settle_s:g} s, also once the candidate's processes were "
                                             "killed): another process is using this GPU")
        sleep(0.01)


def check_timed(outputs: list[Any], expected: list[Any], truths: list[Any], rule: Rule, round_index: int,
                sampler: random.Random) -> str | None:
    """Every timed call's outputs against its own expected values; None when all are right.
    Calls whose outputs have one shape are judged in one stacked comparison (the largest error
    of any call counts), and a secret sample of calls one by one as well (the typical error of
    each call counts too)."""

    def one_by_one(calls: range) -> str | None:
        for k in calls:
            cmp = rule.judge(outputs[k], expected[k], truths[k], f"timed call {k} of round {round_index}")
            if not cmp.correct:
                return cmp.message or "a timed output was wrong"
        return None

    # Stacked a chunk of calls at a time: the comparison holds several float64 copies of what it
    # judges. A chunk that fails is judged call by call (the first wrong call's message; the stack
    # is only a quicker first look, so a chunk whose calls are each right passes).
    elements = sum(t.numel() for t in tensors_in(expected[0])) if expected else 0
    chunk = max(1, STACK_ELEMENTS // max(1, elements))
    for first in range(0, len(outputs), chunk):
        calls = range(first, min(len(outputs), first + chunk))
        out, exp, truth = _stack(outputs[first:calls.stop]), _stack(expected[first:calls.stop]), _stack(truths[first:calls.stop])
        if out is None or exp is None or truth is None:
            return one_by_one(range(len(outputs)))  # outputs of several shapes: every call on its own
        stacked_ok = rule.judge(out, exp, truth, "timed outputs").correct
        del out, exp, truth
        if not stacked_ok:
            wrong = one_by_one(calls)
            if wrong:
                return wrong
    # The typical error of each call counts too: a secret sample of calls, one by one.
    for k in sorted(sampler.sample(range(len(outputs)), min(TIMED_SAMPLE, len(outputs)))):
        wrong = one_by_one(range(k, k + 1))
        if wrong:
            return wrong
    return None


def _copy_regular_file(source: Path, target: Path, max_bytes: int) -> bool:
    """Copy a file a runner wrote (in its scratch folder) to ``target``: only a regular file, not
    through a link (O_NOFOLLOW), at most ``max_bytes``. False when there is none or it is refused."""
    try:
        fd = os.open(source, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return False
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode) or info.st_size > max_bytes:
            return False
        # At most max_bytes even if the file grows while it is copied (the runner still runs then).
        with os.fdopen(os.dup(fd), "rb") as src, open(target, "wb") as dst:
            left = max_bytes
            while left > 0 and (chunk := src.read(min(left, 1 << 20))):
                dst.write(chunk)
                left -= len(chunk)
        return True
    except OSError:
        return False
    finally:
        os.close(fd)


def _build_output(spec: Any, arena: torch.Tensor, leaves: list[Any] | None) -> Any:
    """The candidate's outputs as the judge reads them: tensors from the arena (cloned, so nothing
    the runner does later can change them), plain values from the runner's answer."""
    queue = list(leaves or [])

    def walk(node: Any) -> Any:
        kind, body = next(iter(node.items()))
        if kind == "t":
            return channel.build(node, arena).clone()
        if kind == "tuple":
            return tuple(walk(n) for n in body)
        if kind == "list":
            return [walk(n) for n in body]
        if kind == "dict":
            return {k: walk(n) for k, n in body}
        if kind == "v":
            if leaves is None:
                return body
            return queue.pop(0) if queue else None
        return channel.build(node, arena)

    return walk(spec)


def _null_overhead_us(series: dict, method: str = "eager") -> float:
    """The harness's share of a block of ``method`` (eager, graph, single) so far, as this judge saw
    it: its null blocks' median."""
    key = ("baseline", {"eager": "null", "graph": "graph-null", "single": "single-null"}[method])
    nulls = sorted(b.wall_us for r in series[key].rounds for b in r) if key in series else []
    return percentile(nulls, 50) if nulls else 0.0


def _candidate_fault(failure: CandidateFailure, candidate_timed: bool) -> bool:
    """A failure in timing that is the candidate's (it raised or its process died), so the
    baseline can be timed on without it; a timeout or a baseline runner's failure is not."""
    return (candidate_timed and failure.status == "error" and "baseline" not in failure.message
            and GPU_BUSY not in failure.message)


def _during_timing(failure: CandidateFailure) -> CandidateFailure:
    message = failure.message.replace("the candidate raised:", "the candidate raised during timing:", 1)
    if message == failure.message:
        message = f"during timing: {message}"
    return CandidateFailure(failure.status, message)


def calls_per_block(methods: list[str], timed: list[str], warm: list[dict[str, float]], calls_by_memory: int,
                    kind: str) -> dict[str, int]:
    """Calls per block for each timing method: enough that a block lasts ~TARGET_BLOCK_US by the
    warm-up's per-call figures (``warm``, one dict per rank; a method without one is sized by the
    eager figure), within the method's cap and, all methods together, the arena budget.

    A method in ``methods`` but not in ``timed`` (no variant can be timed by it: "not capturable"
    for every runner) gets no calls: its inputs, expected outputs and float64 truths would be made
    every round and never used. For the six uncapturable tasks that was half of the judge's work a
    round (H100, 2026-12-07: gnn_halo_exchange's inputs and expected outputs took 4.3 s of its 7.2 s
    of rounds, and it stopped at 8 rounds)."""
    calls_for: dict[str, int] = {}
    for how in methods:
        if how not in timed:
            calls_for[how] = 0
            continue
        seen = [w[how] for w in warm if how in w] or [w["eager"] for w in warm if "eager" in w] or [1.0]
        most = MAX_GRAPH_CALLS_PER_BLOCK if how == "graph" else MAX_CALLS_PER_BLOCK[kind]
        calls_for[how] = int(max(1, min(calls_by_memory, most, math.ceil(TARGET_BLOCK_US[kind] / max(max(seen), 0.5)))))
    # Fresh inputs per round, each method's block its own: a graph block on the inputs the same
    # runner's eager block had just been given could replay results it kept from them. Together
    # they stay within the memory one block was allowed (the judge holds a round's inputs, its
    # expected outputs and their float64 truths).
    if sum(calls_for.values()) > calls_by_memory:
        share = calls_by_memory / sum(calls_for.values())
        calls_for = {how: (max(1, int(n * share)) if n else 0) for how, n in calls_for.items()}
    return calls_for


def _failure_order(entry: Any) -> int:
    """The cause before its echoes: a runner that died or hung, then one that raised (its peers
    often raise only because it died), then the ranks told to stop."""
    message = str(entry[1])
    if "exited with code" in message or "; they were killed" in message or entry[0] == "timeout":
        return 0
    return 2 if message.startswith("stopped:") else 1


def _tampered(per_rank: list[list[list[tuple]]], overhead_us: float) -> str | None:
    """A sentence when a runner's own reports of its blocks cannot be reconciled with the judge's
    clock on the same rank (timing.reconcile)."""
    for rank, rounds in enumerate(per_rank):
        problem = reconcile([(b[0], b[1]) for blocks in rounds for b in blocks], overhead_us)
        if problem:
            return f"timing tampered: the candidate's runner on rank {rank} {problem}"
    return None


def _stack(values: list[Any]) -> Any:
    """Values of one structure and shape stacked along a new first dimension; None otherwise."""
    if not values or any(isinstance(v, str) for v in values):
        return None
    first = values[0]
    if isinstance(first, torch.Tensor):
        if not all(isinstance(v, torch.Tensor) and v.shape == first.shape and v.dtype == first.dtype
                   and v.device == first.device for v in values):
            return None
        return torch.stack(values)
    if isinstance(first, (tuple, list)):
        if not all(type(v) is type(first) and len(v) == len(first) for v in values):
            return None
        items = [_stack([v[i] for v in values]) for i in range(len(first))]
        return None if any(p is None for p in items) else type(first)(items)
    if isinstance(first, dict):
        if not all(isinstance(v, dict) and v.keys() == first.keys() for v in values):
            return None
        parts = {k: _stack([v[k] for v in values]) for k in first}
        return None if any(p is None for p in parts.values()) else parts
    return None  # plain values: compared call by call


def _has_plain_values(specs: Any) -> bool:
    """A value description with a non-tensor leaf (a graph replay cannot produce those)."""
    if isinstance(specs, list):
        return any(_has_plain_values(s) for s in specs)
    kind, body = next(iter(specs.items()))
    if kind == "v":
        return True
    if kind in ("tuple", "list"):
        return any(_has_plain_values(b) for b in body)
    if kind == "dict":
        return any(_has_plain_values(b) for _, b in body)
    return False


def _clean_rows(rows: Any) -> list[dict[str, Any]]:
    """A runner's kernel table, kept to plain fields of plain types (it is the candidate's word)."""
    out: list[dict[str, Any]] = []
    if not isinstance(rows, list):
        return out
    for row in rows[:200]:
        if not isinstance(row, dict):
            continue
        clean = {str(k)[:64]: (v if isinstance(v, (int, float, bool)) or v is None else str(v)[:300])
                 for k, v in list(row.items())[:20]}
        out.append(clean)
    return out


def _become_subreaper() -> None:
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(36, 1, 0, 0, 0)  # PR_SET_CHILD_SUBREAPER
    except (OSError, AttributeError):
        pass


def _model_key(item: RunItem | None) -> str:
    """A folder name per model for its JIT caches: its name and a hash of where it lives."""
    if item is None or not item.model_path:
        return "baseline"
    name = "".join(c if c.isalnum() or c in "-_." else "_" for c in item.model)[:40]
    return f"{name}-{hashlib.blake2b(str(Path(item.model_path).resolve()).encode(), digest_size=6).hexdigest()}"


_PROJECT_ROOT = Path(__file__).resolve().parents[2]


def _candidate_sandbox_note(world_size: int) -> str:
    """What the candidates' sandbox enforces on this kernel, as the run's notes say it (a runner
    that could not apply a part says so in a note of its own)."""
    abi = sandbox.landlock_abi()
    if os.environ.get("PKB_SANDBOX", "1") == "0":
        parts = ["writes and reads not restricted (PKB_SANDBOX=0)"]
    elif abi <= 0:
        parts = ["writes and reads not restricted (this kernel has no Landlock)"]
    else:
        parts = [f"writes only to its scratch and JIT cache (Landlock ABI {abi})"]
        if os.environ.get("PKB_SANDBOX_READS", "1") == "0":
            parts.append("reads not restricted: PKB_SANDBOX_READS=0")
        else:
            parts.append("reads of the home folders, the database, the batch folder, other models' folders and the "
                         "project (but pkb_tui/, collectors/, tasks/) refused")
    why = _net_unrestricted_reason(world_size)
    parts.append("network: a namespace of the model's own ranks on this host, loopback only" if why is None
                 else f"network not restricted: {why}")
    why = unix_sockets.unrestricted_reason()
    parts.append("the host's named unix sockets hidden (a mount namespace of its own; the MPS pipe folder left)"
                 if why is None else f"named unix sockets reachable: {why}")
    return "candidate sandbox: " + "; ".join(parts)


def _net_unrestricted_reason(world_size: int) -> str | None:
    """Why a candidate group keeps the host's network (None: it gets a namespace of its own)."""
    if os.environ.get("PKB_SANDBOX", "1") == "0":
        return "PKB_SANDBOX=0"
    if os.environ.get("PKB_SANDBOX_NET", "1") == "0":
        return "PKB_SANDBOX_NET=0"
    local = int(os.environ.get("LOCAL_WORLD_SIZE", world_size) or world_size)
    if local != world_size:
        return "the candidate's ranks span several nodes (--nnodes > 1) and need the real network"
    return None


def _hand_out_fds(listener: socket.socket, ns: sandbox.NetNamespace, judges: set[int], timeout_s: float = 60.0) -> str | None:
    """Judge 0: give the namespace's descriptors to each other judge (known by pid: SO_PEERCRED),
    to no one else. None when every judge has them."""
    end = _monotonic() + timeout_s
    waiting = set(judges)
    try:
        while waiting:
            left = end - _monotonic()
            if left <= 0:
                return f"{len(waiting)} judge(s) did not come for the network namespace"
            listener.settimeout(left)
            try:
                conn, _ = listener.accept()
            except OSError as exc:
                return f"handing out the network namespace failed ({exc})"
            with conn:
                pid = struct.unpack("3i", conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i")))[0]
                if pid in waiting:
                    socket.send_fds(conn, [b"u" if ns.user_fd is not None else b"n"], ns.fds())
                    waiting.discard(pid)
        return None
    finally:
        listener.close()


def _fetch_fds(name: str, timeout_s: float = 60.0) -> sandbox.NetNamespace | str:
    """Another judge: judge 0's namespace descriptors, or why not."""
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn:
            conn.settimeout(timeout_s)
            conn.connect(name)
            data, fds, _, _ = socket.recv_fds(conn, 1, 2)
    except OSError as exc:
        return f"judge 0's network namespace did not arrive ({exc})"
    if len(fds) != (2 if data == b"u" else 1):
        for fd in fds:
            os.close(fd)
        return "judge 0's network namespace came incomplete"
    return sandbox.NetNamespace(net_fd=fds[-1], user_fd=fds[0] if data == b"u" else None)


def runner_env() -> dict[str, str]:
    """A runner's environment: the judge's, less its secrets and torchrun's rendezvous."""
    return {**{k: v for k, v in os.environ.items() if k not in _PRIVATE_ENV}, "PYTHONUNBUFFERED": "1"}


def start_runner_subprocess(fds: dict[str, int], env: dict[str, str], cwd: str) -> subprocess.Popen[bytes]:
    """A runner in a fresh interpreter (PKB_FORKSERVER=0, or the fork server failed)."""
    env = {**env, "PKB_RUNNER_FDS": f"{fds['to_runner']},{fds['from_runner']}", "PKB_JUDGE_PID": str(os.getpid())}
    passed = [fds["to_runner"], fds["from_runner"]]
    if "arena" in fds:
        env["PKB_ARENA_FD"] = str(fds["arena"])
        passed.append(fds["arena"])
    if "bell" in fds:
        env["PKB_BELL_FD"] = str(fds["bell"])
        passed.append(fds["bell"])
    if "netns" in fds:  # the candidate group's network namespace (and user namespace): joined first thing
        netns = [fds[k] for k in ("userns", "netns") if k in fds]
        env["PKB_NETNS_FDS"] = ",".join(str(fd) for fd in netns)
        passed += netns
    return subprocess.Popen(
        [sys.executable, "-m", "pkb_tui.engine.runner"], pass_fds=passed, stdin=subprocess.DEVNULL,
        stdout=fds["log"], stderr=fds["log"], env=env, cwd=cwd, start_new_session=True,
    )


def _end_children(keep: int | None = None) -> None:
    """Kill every descendant of this judge but ``keep`` (the fork server, between items)."""
    for pid in procs.descendants(os.getpid()):
        if pid != keep:
            try:
                procs.kill_process_tree(pid, grace_s=0.2)
            except OSError:
                pass
    try:
        while os.waitpid(-1, os.WNOHANG)[0] > 0:
            pass
    except ChildProcessError:
        pass


def _phase_counters(device: torch.device) -> Any:
    if device.type != "cuda" or os.environ.get("PKB_PHASE_COUNTERS", "1") == "0":
        return None
    try:
        from collectors.counters import PhaseCounters

        return PhaseCounters(device.index if device.index is not None else 0)
    except Exception:  # noqa: BLE001
        return None


def _nic_tally() -> Any:
    from collectors.host import NicTally

    return NicTally()


def _max_field(rows: list[dict | None], key: str) -> float | None:
    values = [float(r[key]) for r in rows if r and r.get(key) is not None]
    return max(values) if values else None


def _trial_seed(seed: int, task_id: str, trial: Any) -> int:
    digest = hashlib.blake2b(f"{seed}:{task_id}:{trial}".encode(), digest_size=6).digest()
    return int.from_bytes(digest, "little")


def _nbytes(value: Any) -> int:
    return sum(t.numel() * t.element_size() for t in tensors_in(value))


def spins(device: torch.device) -> bool:
    """Whether judge and runner wait for a timed block's command and answer spinning (each on a
    core of its own): on a GPU box; on CPU only with PKB_SPIN=1 (tests of the bell), since a
    2-core box has no cores to spare."""
    return device.type == "cuda" or os.environ.get("PKB_SPIN") == "1"


def _spin_for_answer(bell: channel.Bell, last: int, pipe: int, spin_s: float) -> dict[str, Any] | None:
    """Spin up to ``spin_s`` for an answer on the bell (or anything on the pipe: an answer too
    large for the bell, or a closed pipe); None when there is none yet or the pipe has one."""
    end = _perf_counter_ns() + int(spin_s * 1e9)
    polls = 0
    while True:
        answer = bell.take(channel.TO_JUDGE, last)
        if answer is not None:
            return answer
        polls += 1
        if polls % 256 == 0:
            if select.select([pipe], [], [], 0)[0] or _perf_counter_ns() > end:
                return None


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 2)


def _finite(value: float | None) -> float | None:
    if value is None or math.isnan(value):
        return None
    return value if math.isfinite(value) else 1e308


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    spec = json.loads(Path(argv[0]).read_text())
    return Rank(spec).main()


if __name__ == "__main__":
    sys.exit(main())
