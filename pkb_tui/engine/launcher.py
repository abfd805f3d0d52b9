"""Turns a RunRequest into runs in the database: one torchrun launch for a whole batch.

torchrun (python -m torch.distributed.run) is started as a child process in its own session, with
an explicit free port. The ranks (engine.worker) stay up for every item of the batch; rank 0
writes events to a file that this launcher tails, storing what they carry. Only the launcher
writes run results. A run that hangs past its timeout, or a rank that dies, ends that run as
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
import stat
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pkb_tui.engine import events as ev
from pkb_tui.engine import procs, stats
from pkb_tui.engine.logs import RANKS_DID_NOT_START, launch_failure_detail, read_regular
from pkb_tui.engine.modes import check_world_size, choose_mode, timings_representative
from pkb_tui.engine.request import RunItem, RunRequest
from pkb_tui.engine.solutions import PROJECT_ROOT, baseline_arity, find_model, validate_solution_file
from pkb_tui.errors import PkbError
from pkb_tui.store import Store, default_db_path
from pkb_tui.store.recovery import BatchWriter, RecoverySampleSink, not_stored_sentence
from tasks.base import SIZE_NAMES, Traffic, all_tasks, broken_tasks, load_task

EventCallback = Callable[[ev.Event, "int | None"], None]

HEARTBEAT_TIMEOUT_S = 60.0
# A judge or torchrun seen stopped (SIGSTOP, a tracer) this long ends the launch: nothing of ours
# stops them, so something else did, and the batch would otherwise hang on it.
STOPPED_LIMIT_S = 10.0


def judge_grace_s(timeout_s: float) -> float:
    """Beyond a run's timeout, for its judges to end the candidate and report (a quarter of the
    timeout, 5-60 s), so the timeout still bounds the wall time, start-up included."""
    return min(60.0, max(5.0, 0.25 * float(timeout_s)))
# Never let a rank switch NVLink multicast on (it can take a shared host's GPUs out of service).
SAFE_ENV = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}


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
    def __init__(self, db_path: Path | str | None = None, *, runs_dir: Path | str | None = None) -> None:
        self.db_path = Path(db_path) if db_path is not None else default_db_path()
        self.runs_dir = Path(runs_dir) if runs_dir is not None else self.db_path.resolve().parent / "pkb-runs"
        self.telemetry: Any = None  # a collectors.telemetry.Telemetry while a batch runs
        self._ring: Any = None  # its ring of samples, kept to the batch's end (a database lost at the very end)
        self.skipped: list[str] = []
        self.outcome: BatchOutcome | None = None  # the last batch's, also when run() raised (Ctrl-C)
        self._proc: subprocess.Popen | None = None

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
        if request.size not in SIZE_NAMES:
            raise PkbError(f"Unknown size {request.size!r}; choose one of {', '.join(SIZE_NAMES)}.")
        mode = choose_mode(request.world_size, request.mode)
        check_world_size(request.world_size, mode, oversubscribe=request.oversubscribe)
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
        mode = self._mode = choose_mode(request.world_size, request.mode)
        cancel = cancel or threading.Event()
        load_at_start = os.getloadavg()[0]
        self._ring = None
        batch_id = time.strftime("%Y%m%d-%H%M%S-") + uuid.uuid4().hex[:6]
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
        mps = self._start_mps(mode)
        try:
            remaining = [item for item in items if not item.invalid_reason]
            launch = 0
            while remaining:
                if cancel.is_set():
                    break
                launch += 1
                remaining = self._launch(
                    store, request, mode, remaining, states, batch_dir, launch, mps, on_event, cancel,
                )
        except KeyboardInterrupt:
            cancel.set()
            raise
        finally:
            self._kill_tree()
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
            store.close()
            # Temporary trees go with the batch (runners' scratch, torchrun's torchelastic_*
            # folders, which TMPDIR puts there); logs stay, older batches' within the retention.
            shutil.rmtree(batch_dir / "scratch", ignore_errors=True)
            remove_old_batches(self.runs_dir, keep=batch_dir)
            self.outcome = BatchOutcome(
                [s.run_id for s in states.values()], {s.run_id: s.status for s in states.values()}, list(self.skipped),
                not_stored=store.lost, recovery_path=store.recovery_path, recovery_error=store.recovery_error,
                database=self.db_path,
            )
        return self.outcome

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
                "request": {**request.to_dict(), "mode": mode, "item": item.to_dict()},
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
        started_mono = time.monotonic()
        scratch = batch_dir / "scratch"
        scratch.mkdir(exist_ok=True)
        events_path = batch_dir / f"events.{launch}.jsonl"
        _create_new(events_path, b"")
        spec_path = batch_dir / f"spec.{launch}.json"
        _create_new(spec_path, json.dumps({
            "request": request.to_dict(), "items": [i.to_dict() for i in items], "mode": mode,
            "events_path": str(events_path), "log_dir": str(batch_dir), "scratch_dir": str(scratch),
            "launcher_pid": os.getpid(), "heartbeat_s": 1.0,
            # The timeout bounds a run's wall time, the launch's start-up included: the judges
            # count the first run's from here.
            "launch_started_at": time.time() - (time.monotonic() - started_mono),
        }).encode())
        port = _free_port()
        cmd = [
            sys.executable, "-m", "torch.distributed.run", "--nnodes", "1",
            "--nproc-per-node", str(request.world_size), "--master-addr", "127.0.0.1",
            "--master-port", str(port), "--max-restarts", "0", "--monitor-interval", "0.2",
            "-m", "pkb_tui.engine.worker", str(spec_path),
        ]
        env = dict(os.environ)
        env.update(SAFE_ENV)
        # Events are signed with a key only the judges and this launcher hold (the judges drop it
        # from the environment before they start any runner).
        event_key = secrets.token_bytes(32)
        env["PKB_EVENT_KEY"] = event_key.hex()
        env["PYTHONUNBUFFERED"] = "1"
        env["TMPDIR"] = str(scratch)  # torchrun's torchelastic_* folders are removed with it
        env["PYTHONPATH"] = os.pathsep.join([str(PROJECT_ROOT), *filter(None, [env.get("PYTHONPATH")])])
        if mode == "cpu":
            env.setdefault("OMP_NUM_THREADS", "1")
            env["CUDA_VISIBLE_DEVICES"] = ""
        if mps is not None:
            env.update(mps.env)
        launch_log = batch_dir / "launch.log"
        with os.fdopen(os.open(launch_log, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW, 0o644), "ab") as log:
            log.write(f"\n=== launch {launch}: {' '.join(cmd)}\n".encode())
            log.flush()
            self._proc = subprocess.Popen(
                cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                env=env, cwd=str(scratch), start_new_session=True,
            )
        tail = _EventTail(events_path, event_key)
        pending = {item.index for item in items}
        current: int | None = None
        started = time.monotonic()
        # The timeout bounds each run's wall time: the launch's first run counts the ranks' start-up
        # too, later ones the time since the last finished. The judges end a candidate that outlives
        # its timeout themselves; the grace is for them to do so and report.
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
                if self.telemetry is not None:
                    self.telemetry.set_rank_pids(event.rank_pids)  # CPU use per rank, in rank order
                rank_of.update({int(pid): r for r, pid in enumerate(event.rank_pids or [])})
            elif isinstance(event, ev.RunStarted) and state is not None:
                current, any_run_started = event.item, True
                state.started = True
                store.update_run(state.run_id, status="running", started_at=time.time())
                self._neighbours.look(state)
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

        outcome: tuple[str, str] | None = None  # (status for the current run, detail)
        while True:
            for event in tail.read():
                handle(event)
            returncode = self._proc.poll()
            now = time.monotonic()
            if returncode is not None:
                for event in tail.read():
                    handle(event)
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
            time.sleep(0.05)
        self._kill_tree()
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
        self._noise_floor = store.latest_noise_floor(host_id, self._mode)
        for item in items:
            store.update_run(
                states[item.index].run_id, host_id=host_id, mps_enabled=event.mps_enabled,
                timings_representative=int(event.timings_representative and timings_representative(self._mode)),
                notes=event.notes,
            )

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
        try:
            return stats.timing_result_fields(
                eager, graph, basis=basis, statistic=stats.round_statistic_for(self._mode),
                noise_floor_fraction=(getattr(self, "_noise_floor", None) or {}).get("noise_floor_fraction"),
            )
        except ValueError:
            return {}

    def _traffic(self, task_id: str, request: RunRequest) -> Traffic | None:
        """The task's roofline model, the busiest rank's figure for each quantity."""
        try:
            task = load_task(task_id)
            per_rank = [
                task.traffic(task.context(rank=r, world_size=request.world_size, dtype=request.dtype, size=request.size))
                for r in range(request.world_size)
            ]
        except Exception:
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


_BATCH_NAME = re.compile(r"\d{8}-\d{6}-[0-9a-f]{6}")


def _create_new(path: Path, data: bytes) -> None:
    """Create a file the launcher owns in the batch folder: never through a planted link or onto
    an existing file."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644)
    with os.fdopen(fd, "wb") as f:
        f.write(data)


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


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


class _EventTail:
    """Reads complete, correctly signed JSON lines appended to the event file since the last read.

    The file is opened without following links and must be a regular file (a symlink or FIFO
    planted in its place could otherwise redirect or hang the launcher). Lines whose signature is
    not the judges' are dropped and counted."""

    def __init__(self, path: Path, key: bytes) -> None:
        self.path = path
        self.key = key
        self.offset = 0
        self.partial = b""
        self.forged = 0

    def read(self) -> list[ev.Event]:
        try:
            fd = os.open(self.path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
        except OSError:
            return []
        try:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                return []
            os.lseek(fd, self.offset, os.SEEK_SET)
            data = os.read(fd, 64 * 2**20)
        finally:
            os.close(fd)
        self.offset += len(data)
        data = self.partial + data
        lines = data.split(b"\n")
        self.partial = lines.pop()
        out = []
        for line in lines:
            body = ev.verify(self.key, line.decode(errors="replace"))
            if body is None:
                self.forged += 1
                continue
            event = ev.parse_event(body)
            if event is not None:
                out.append(event)
        return out
