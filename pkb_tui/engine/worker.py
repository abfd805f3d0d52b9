"""One rank of a batch, started by torchrun: `python -m pkb_tui.engine.worker SPEC.json`.

The ranks stay up for the whole batch: every (task, model) item, every trial, both variants.
Everything a rank learns reaches rank 0 through a gloo control group (gather_object), and only
rank 0 writes events (JSON lines) to the batch's event file, which the launcher reads. So the same
path works when ranks sit on other nodes.

Import order matters: pkb_tui.engine.timing binds its clocks now, before any candidate is imported.
"""

from __future__ import annotations

from pkb_tui.engine import timing  # noqa: I001  (first: binds the clocks before any candidate runs)

import hashlib
import importlib.util
import json
import math
import os
import socket
import sys
import threading
import time
import traceback
from datetime import timedelta
from pathlib import Path
from typing import Any, Callable

import torch
import torch.distributed as dist

from pkb_tui.engine import events as ev
from pkb_tui.engine.compare import Comparison, compare_outputs, find_aliasing, poison_free_memory, tensors_in
from pkb_tui.engine.modes import backend_for
from pkb_tui.engine.request import RunItem, RunRequest
from collectors.counters import combine_phases
from tasks.base import Task, load_task

_now = time.time  # bound before candidates, like the clocks in timing


class _CandidateError(Exception):
    """The candidate raised, or its module could not be loaded (message is for the user)."""


class _Timed:
    """One variant's state through the interleaved timing rounds."""

    def __init__(self, variant: str, fn: Callable, input_sets: list, counters: Any) -> None:
        self.variant, self.fn, self.input_sets, self.counters = variant, fn, input_sets, counters
        self.samples: list[float] = []
        self.phases: list[dict] = []
        self.kept: list[Any] = []
        self.failure: str | None = None


class Rank:
    def __init__(self, spec: dict[str, Any]) -> None:
        self.spec = spec
        self.request = RunRequest.from_dict(spec["request"])
        self.items = [RunItem(**item) for item in spec["items"]]
        self.mode: str = spec["mode"]
        self.rank = int(os.environ["RANK"])
        self.world_size = int(os.environ["WORLD_SIZE"])
        self.local_rank = int(os.environ.get("LOCAL_RANK", "0"))
        self.log_dir = Path(spec["log_dir"])
        self._events_file = None
        self._lock = threading.Lock()
        self.current_item: int | None = None
        self.sandbox_note: str | None = None  # why file writes are not restricted, if they are not
        if self.mode == "nccl":
            self.device = torch.device("cuda", self.local_rank)
        elif self.mode == "shared-gpu":
            self.device = torch.device("cuda", 0)
        else:
            self.device = torch.device("cpu")

    # ------------------------------------------------------------------ plumbing
    def emit(self, event: ev.Event) -> None:
        if self.rank != 0:
            return
        with self._lock:
            if self._events_file is None:
                self._events_file = open(self.spec["events_path"], "a", buffering=1)
            self._events_file.write(event.to_json() + "\n")
            self._events_file.flush()

    def _watchdog(self) -> None:
        """Heartbeats for the launcher; and if the launcher died, end this rank (torchrun then ends
        the others), so no orphaned ranks run on."""
        launcher_pid = int(self.spec["launcher_pid"])
        interval = float(self.spec.get("heartbeat_s", 1.0))
        while True:
            time.sleep(interval)
            try:
                os.kill(launcher_pid, 0)
            except ProcessLookupError:
                os._exit(75)
            except PermissionError:
                pass
            self.emit(ev.Heartbeat(ts=_now(), item=self.current_item))

    def gather(self, value: Any) -> list[Any] | None:
        """Every rank's value on rank 0 (None elsewhere), over the gloo control group."""
        out = [None] * self.world_size if self.rank == 0 else None
        dist.gather_object(value, out, dst=0, group=self.ctrl)
        return out

    def agree(self, value: Any) -> list[Any]:
        """Every rank's value on every rank."""
        out = [None] * self.world_size
        dist.all_gather_object(out, value, group=self.ctrl)
        return out

    def barrier(self) -> None:
        dist.barrier(group=self.ctrl)

    def _redirect_output(self, item: RunItem) -> None:
        """This rank's stdout/stderr (its own prints and the candidate's) go to the run's log file."""
        path = self.log_dir / f"item{item.index:03d}.rank{self.rank}.log"
        sys.stdout.flush()
        sys.stderr.flush()
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        os.dup2(fd, 1)
        os.dup2(fd, 2)
        os.close(fd)

    # ------------------------------------------------------------------ the batch
    def main(self) -> int:
        os.chdir(self.spec["scratch_dir"])  # a candidate's relative writes land in the scratch dir
        # Before any thread starts (Landlock binds the calling thread and what it starts later):
        # from here on this rank writes only beneath the batch folder, temp, /dev, /proc, MPS and JIT
        # caches (engine/sandbox.py).
        self.sandbox_note = self._restrict_writes()
        if self.device.type == "cuda":
            torch.cuda.set_device(self.device)
        backend = backend_for(self.mode)
        pg_timeout = timedelta(seconds=max(30.0, float(self.request.timeout_s)))
        dist.init_process_group(backend=backend, timeout=pg_timeout)
        # A separate gloo group for the harness's own messages: a candidate that leaves a collective
        # unmatched on the default group cannot pair with (and corrupt) the harness's gathers.
        self.ctrl = dist.new_group(backend="gloo", timeout=pg_timeout)
        if backend == "nccl":
            # Bring NCCL's communicator up with every rank taking part, so a baseline whose first
            # call is point-to-point (batch_isend_irecv) is not the first op on a fresh group.
            dist.all_reduce(torch.zeros(1, device=self.device))
            torch.cuda.synchronize(self.device)
        threading.Thread(target=self._watchdog, daemon=True, name="pkb-watchdog").start()
        host = self.host_facts()
        pids = self.gather(os.getpid())  # so the launcher's host sampler can follow each rank's CPU use
        self.emit(ev.BatchStarted(
            world_size=self.world_size, mode=self.mode, host=host,
            timings_representative=self.mode != "shared-gpu",
            mps_enabled=bool(os.environ.get("CUDA_MPS_PIPE_DIRECTORY")) if self.mode == "shared-gpu" else None,
            notes=self.mode_notes(), rank_pids=pids or [],
        ))
        for item in self.items:
            self.current_item = item.index
            self._redirect_output(item)
            try:
                self.run_item(item)
            except Exception as exc:
                # Outside the candidate's own calls, an exception means the ranks are out of step
                # (a peer died, a collective broke): report it and end this launch; the launcher
                # records the run as error and relaunches the rest of the batch.
                traceback.print_exc()
                self.emit(ev.Error(item=item.index, where="harness", message=f"rank {self.rank}: {exc}",
                                   traceback=traceback.format_exc(), rank=self.rank))
                sys.stdout.flush()
                sys.stderr.flush()
                os._exit(1)
            self.current_item = None
        self.emit(ev.BatchFinished(status="finished"))
        try:
            dist.destroy_process_group()
        except Exception:
            pass
        return 0

    def _restrict_writes(self) -> str | None:
        if os.environ.get("PKB_SANDBOX", "1") == "0":
            return "no write sandbox: PKB_SANDBOX=0"
        from pkb_tui.engine.sandbox import default_writable, restrict_writes

        return restrict_writes(default_writable(Path(self.spec["log_dir"])))

    def mode_notes(self) -> list[str]:
        notes = [self.sandbox_note] if self.sandbox_note else []
        if self.mode == "shared-gpu":
            mps = "on" if os.environ.get("CUDA_MPS_PIPE_DIRECTORY") else "off"
            notes.append(f"shared-gpu mode: {self.world_size} ranks on one GPU (MPS {mps}); timings do not represent an interconnect")
        if self.mode == "cpu":
            notes.append("cpu mode: gloo on CPU tensors; timings are for development, not for GPUs")
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
        except Exception:
            pass
        if torch.cuda.is_available():
            facts["gpu_count"] = torch.cuda.device_count()
            facts["gpu_model"] = torch.cuda.get_device_name(self.device)
            facts["cuda_version"] = torch.version.cuda
            try:
                facts["nccl_version"] = ".".join(map(str, torch.cuda.nccl.version()))
            except Exception:
                pass
        return facts

    # ------------------------------------------------------------------ one (task, model)
    def run_item(self, item: RunItem) -> None:
        req = self.request
        self.emit(ev.RunStarted(item=item.index, task=item.task, model=item.model, trials=req.trials))
        task = load_task(item.task)
        tol = task.spec.tolerance(req.dtype)

        candidate, load_error = self._load_candidate(task, item)
        errors = self.agree(load_error)
        if any(errors):
            message = next(e for e in errors if e)
            self.emit(ev.Error(item=item.index, where="candidate import", message=message))
            self.emit(ev.RunFinished(item=item.index, status="error", detail=message))
            return

        all_correct = True
        raised: str | None = None
        previous_outputs: Any = None
        for trial in range(req.trials):
            self.emit(ev.Progress(item=item.index, phase="trial", trial=trial, trials=req.trials))
            ctx = task.context(rank=self.rank, world_size=self.world_size, dtype=req.dtype, size=req.size,
                               seed=_trial_seed(req.seed, item.task, trial), device=self.device, mode=self.mode)
            inputs = task.make_inputs(ctx)
            expected = task.baseline(*_clone(inputs))
            self._sync()
            cand_inputs = _clone(inputs)
            poison_free_memory(_nbytes(expected), self.device)
            outputs, cmp = self._call_and_compare(candidate, cand_inputs, expected, tol)
            if cmp.correct:
                alias = find_aliasing(outputs, cand_inputs, [previous_outputs] if previous_outputs is not None else [])
                if alias:
                    cmp = Comparison(False, cmp.max_abs_error, cmp.max_rel_error, alias)
            if outputs is None and cmp.message and cmp.message.startswith("candidate raised"):
                raised = raised or cmp.message
            previous_outputs = outputs
            all_correct = self._report_trial(item, trial, cmp) and all_correct
            del inputs, expected, cand_inputs
        previous_outputs = None
        raised_anywhere = [r for r in self.agree(raised) if r]
        if raised_anywhere:
            self.emit(ev.RunFinished(item=item.index, status="error", detail=raised_anywhere[0]))
            return

        status = "passed" if all_correct else "failed"
        if req.timing:
            # An incorrect candidate's time means nothing: then only the baseline is timed.
            variants = [(v, task.baseline if v == "baseline" else candidate)
                        for v in req.extra.get("variants", ["baseline", "candidate"]) if v != "candidate" or all_correct]
            if variants and not self._time_variants(item, task, variants, tol):
                status = "failed"
        if req.profile:
            for variant in ("baseline", "candidate"):
                if variant == "candidate" and not all_correct:
                    continue
                self._profile_variant(item, task, variant, task.baseline if variant == "baseline" else candidate)
        self.emit(ev.RunFinished(item=item.index, status=status))

    def _load_candidate(self, task: Task, item: RunItem) -> tuple[Callable | None, str | None]:
        if item.solution_path is None:
            return task.baseline, None
        path = Path(item.solution_path)
        module_name = f"pkb_candidate_{hashlib.sha1(str(path).encode()).hexdigest()[:10]}"
        try:
            spec = importlib.util.spec_from_file_location(module_name, path)
            module = importlib.util.module_from_spec(spec)
            sys.path.insert(0, str(path.parent))
            try:
                spec.loader.exec_module(module)
            finally:
                if sys.path and sys.path[0] == str(path.parent):
                    sys.path.pop(0)
        except BaseException as exc:  # SystemExit from a candidate included
            return None, f"{path.name} failed to import on rank {self.rank}: {type(exc).__name__}: {exc}"
        fn = getattr(module, "solution", None)
        if not callable(fn):
            return None, f"{path.name} defines no callable `solution`"
        return fn, None

    def _call_and_compare(self, fn: Callable, inputs: tuple, expected: Any, tol) -> tuple[Any, Comparison]:
        try:
            outputs = fn(*inputs)
            self._sync()
        except BaseException as exc:  # the candidate's failure is a result, not a harness crash
            traceback.print_exc()
            message = f"candidate raised on rank {self.rank}: {type(exc).__name__}: {exc}"
            return None, Comparison(False, None, None, message)
        return outputs, compare_outputs(outputs, expected, tol)

    def _report_trial(self, item: RunItem, trial: int, cmp: Comparison) -> bool:
        per_rank = self.gather({
            "rank": self.rank, "correct": cmp.correct, "max_abs_error": _finite(cmp.max_abs_error),
            "max_rel_error": _finite(cmp.max_rel_error), "message": cmp.message,
        })
        ok_everywhere = self.agree(cmp.correct)
        if self.rank == 0:
            worst = max(per_rank, key=lambda r: (not r["correct"], r["max_abs_error"] or 0.0))
            message = next((f"rank {r['rank']}: {r['message']}" for r in per_rank if r["message"]), None)
            self.emit(ev.TrialResult(
                item=item.index, trial=trial, correct=all(ok_everywhere),
                max_abs_error=max((r["max_abs_error"] or 0.0) for r in per_rank) if any(r["max_abs_error"] is not None for r in per_rank) else None,
                max_rel_error=max((r["max_rel_error"] or 0.0) for r in per_rank) if any(r["max_rel_error"] is not None for r in per_rank) else None,
                worst_rank=worst["rank"], message=message, ranks=per_rank,
            ))
        return all(ok_everywhere)

    # ------------------------------------------------------------------ timing and profile
    def _input_copies(self, inputs: tuple) -> int:
        """How many copies of the inputs to rotate through so timed iterations start cold in L2."""
        if self.device.type != "cuda":
            return 1
        l2_bytes = getattr(torch.cuda.get_device_properties(self.device), "L2_cache_size", 50 * 2**20)
        size = max(1, _nbytes(inputs))
        if size >= 2 * l2_bytes:
            return 1
        return min(16, math.ceil(2 * l2_bytes / size))

    def _time_variants(self, item: RunItem, task: Task, variants: list[tuple[str, Callable]], tol) -> bool:
        """Time the variants interleaved: each warms up, then in every one of ``timing.rounds``
        rounds each variant times a block of iterations, the order alternating round by round
        (B C, C B, ...). Drift over the timing (clocks, heat, a neighbour process) then falls on
        every variant alike instead of on whichever ran second. Each variant has its own input
        copies and byte counters (read around its blocks only). False if a variant failed: it
        raised while timed, or the candidate's timed outputs were wrong."""
        req = self.request
        ctx = task.context(rank=self.rank, world_size=self.world_size, dtype=req.dtype, size=req.size,
                           seed=_trial_seed(req.seed, item.task, "timing"), device=self.device, mode=self.mode)
        inputs = task.make_inputs(ctx)
        copies = self._input_copies(inputs)
        timed = [_Timed(variant, fn, [_clone(inputs) for _ in range(copies)], _phase_counters(self.device))
                 for variant, fn in variants]
        expected = task.baseline(*_clone(inputs)) if any(t.variant == "candidate" for t in timed) else None
        del inputs
        blocks = timing.split_rounds(req.iterations, timing.ROUNDS)
        done = 0
        for round_index, block in enumerate(blocks):
            last_round = round_index == len(blocks) - 1
            for t in (timed if round_index % 2 == 0 else timed[::-1]):
                if t.failure is not None:
                    continue
                self.emit(ev.Progress(item=item.index, phase="timing", variant=t.variant))
                failure = None
                try:
                    samples, kept = timing.time_iterations(
                        lambda i, t=t, offset=done: t.fn(*t.input_sets[(offset + i) % copies]),
                        iterations=block, warmup=req.warmup if round_index == 0 else 0, device=self.device,
                        barrier=self.barrier, keep_last=min(copies, block) if t.variant == "candidate" and last_round else 0,
                        on_start=t.counters.start if t.counters is not None else None,
                        between=t.counters.tick if t.counters is not None else None,
                    )
                    if t.counters is not None:
                        t.phases.append(t.counters.stop(block))
                    t.samples += samples
                    t.kept = kept
                except BaseException as exc:
                    failure = f"{t.variant} raised during timing on rank {self.rank}: {type(exc).__name__}: {exc}"
                    traceback.print_exc()
                failures = self.agree(failure)
                if any(failures):
                    t.failure = next(f for f in failures if f)
                    t.samples, t.phases, t.kept = [], [], []
                    self.emit(ev.Error(item=item.index, where=f"timing {t.variant}", message=t.failure))
            done += block

        ok = True
        for t in timed:
            t.input_sets = []
            if t.failure is not None:
                ok = False
                continue
            all_samples = self.gather(t.samples)
            link_all = self.gather(combine_phases(t.phases, req.iterations) if t.counters is not None else None)
            if self.rank == 0:
                stats = timing.summarize(all_samples)
                self.emit(ev.Timing(
                    item=item.index, variant=t.variant, median_us=stats.median_us, p10_us=stats.p10_us,
                    p90_us=stats.p90_us, mean_us=stats.mean_us, min_us=stats.min_us, max_us=stats.max_us,
                    iterations=stats.iterations, input_copies=copies,
                    per_rank_median_us=[timing.percentile(sorted(s), 50) for s in all_samples],
                ))
                if any(l is not None for l in link_all):
                    self.emit(ev.LinkBytes(
                        item=item.index, variant=t.variant, iterations=req.iterations,
                        nvlink_bytes_per_iter=_max_field(link_all, "nvlink_bytes_per_iter"),
                        pcie_bytes_per_iter=_max_field(link_all, "pcie_bytes_per_iter"),
                        per_rank=[l or {} for l in link_all],
                    ))
            if t.variant == "candidate":
                # The outputs of the timed iterations must be right too (a candidate that is only
                # right when checked, or races across iterations, fails here).
                cmp = Comparison(True, 0.0, 0.0)
                for out in t.kept:
                    cmp = cmp.merge(compare_outputs(out, expected, tol, "timed output"))
                t.kept = []
                ok = self._report_trial(item, -1, cmp) and ok
        return ok

    def _profile_variant(self, item: RunItem, task: Task, variant: str, fn: Callable) -> None:
        try:
            from collectors.profiler import profile_kernels
        except ImportError:
            return
        req = self.request
        self.emit(ev.Progress(item=item.index, phase="profile", variant=variant))
        ctx = task.context(rank=self.rank, world_size=self.world_size, dtype=req.dtype, size=req.size,
                           seed=_trial_seed(req.seed, item.task, "profile"), device=self.device, mode=self.mode)
        inputs = task.make_inputs(ctx)
        trace = str(self.log_dir / f"item{item.index:03d}.{variant}.rank{self.rank}.trace.json") if self.rank == 0 else None
        try:
            rows = profile_kernels(lambda: fn(*inputs), iterations=3, device=self.device, trace_path=trace)
            error = None
        except BaseException as exc:
            rows, error = [], f"profiler failed on rank {self.rank}: {type(exc).__name__}: {exc}"
        gathered = self.gather((rows, error))
        if self.rank == 0:
            for rank, (rank_rows, rank_error) in enumerate(gathered):
                if rank_error:
                    self.emit(ev.Error(item=item.index, where=f"profile {variant}", message=rank_error, rank=rank))
                    continue
                self.emit(ev.Kernels(item=item.index, variant=variant, rank=rank, kernels=rank_rows,
                                     trace_path=trace if rank == 0 else None))

    def _sync(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)


def _phase_counters(device: torch.device):
    """This rank's byte counters; none off the GPU, or with PKB_PHASE_COUNTERS=0 (to see what
    reading them costs the timings)."""
    if device.type != "cuda" or os.environ.get("PKB_PHASE_COUNTERS", "1") == "0":
        return None
    try:
        from collectors.counters import PhaseCounters

        return PhaseCounters(device.index if device.index is not None else 0)
    except Exception:
        return None


def _max_field(rows: list[dict | None], key: str) -> float | None:
    values = [r.get(key) for r in rows if r and r.get(key) is not None]
    return max(values) if values else None


def _trial_seed(seed: int, task_id: str, trial: Any) -> int:
    digest = hashlib.blake2b(f"{seed}:{task_id}:{trial}".encode(), digest_size=6).digest()
    return int.from_bytes(digest, "little")


def _clone(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        return value.clone()
    if isinstance(value, tuple):
        return tuple(_clone(v) for v in value)
    if isinstance(value, list):
        return [_clone(v) for v in value]
    if isinstance(value, dict):
        return {k: _clone(v) for k, v in value.items()}
    return value


def _nbytes(value: Any) -> int:
    return sum(t.numel() * t.element_size() for t in tensors_in(value))


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
