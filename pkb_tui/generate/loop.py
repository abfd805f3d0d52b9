"""The generation loop: K independent samples per task, then up to R refine rounds per sample, each
round's candidates evaluated by the engine in one batch.

Round r of sample s of task t is one request (gen_requests). Its reply is kept whole; the code
extracted from it becomes solutions/gen/<model-slug>/<gen-run-id>/s<s>r<r>/<t>.py (a solution set
per sample and round, so K x R candidates of one task never collide) and is evaluated by
Launcher.run with those folders as models. Refine round r+1 of a sample is fed a digest of round r's
evaluation (read back from the Store's run record) and the best correct candidate of the sample so far.

Resumable: every request, reply and candidate is written as it happens; resuming rebuilds the state
from the tables, sends only requests without a stored reply, makes candidates of replies that have
none, and evaluates candidates without a finished run.
"""

from __future__ import annotations

import dataclasses
import json
import os
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pkb_tui.engine.modes import choose_mode
from pkb_tui.engine.solutions import PROJECT_ROOT, baseline_arity, validate_solution_file
from pkb_tui.errors import PkbError
from pkb_tui.generate.client import ChatClient, EndpointError, Message, QuotaError, Reply
from pkb_tui.generate.config import Endpoint
from pkb_tui.generate.extract import extract_code
from pkb_tui.generate.metrics import outcomes_from_candidates, suite_mean, task_metrics
from pkb_tui.generate.prompts import TEMPLATE_VERSION, Prompt, digest_run, load_hardware, refine_prompt, task_prompt
from pkb_tui.store import Store
from tasks.base import all_tasks, load_task

NO_CODE = "no code in reply"


@dataclass
class GenerateRequest:
    tasks: list[str]  # ids, or ["all"]
    samples: int = 1
    rounds: int = 0
    world_size: int = 2
    mode: str | None = None  # None: chosen from the GPUs present
    size: str = "small"
    dtype: str = "float32"
    trials: int = 3
    timeout_s: float = 300.0
    timing: bool = True
    until_correct: bool = False  # stop refining a sample once it is correct (default: refine for speed too)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> GenerateRequest:
        names = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in names})


@dataclass
class GenEvent:
    """What the loop tells its caller (CLI progress, the Generate screen). Sent from worker threads."""

    kind: str  # started, sent, tokens, reply, failed, candidate, evaluating, evaluated, finished
    gen_run_id: int
    task_id: str | None = None
    sample: int | None = None
    round: int | None = None
    request_id: int | None = None
    tokens: int = 0  # streamed pieces so far (kind tokens) or completion tokens (kind reply)
    cost_usd: float = 0.0
    detail: str = ""
    run_id: int | None = None
    extra: dict[str, Any] = field(default_factory=dict)


OnGenEvent = Callable[[GenEvent], None]


def _chain_key(row: dict[str, Any]) -> tuple[str, int]:
    return (row["task_id"], row["sample"])


class GenerationLoop:
    def __init__(
        self, db_path: Path | str, endpoint: Endpoint, *, out_root: Path | str | None = None,
        runs_dir: Path | str | None = None, on_event: OnGenEvent | None = None,
        cancel: threading.Event | None = None, client: ChatClient | None = None,
    ) -> None:
        self.db_path = Path(db_path)
        self.endpoint = endpoint
        self.out_root = Path(out_root) if out_root is not None else PROJECT_ROOT
        self.runs_dir = runs_dir
        self.on_event = on_event or (lambda event: None)
        self.cancel = cancel or threading.Event()
        self.client = client or ChatClient(endpoint)  # a missing key fails here, before any row is written
        self.skipped: list[str] = []
        self._quota: QuotaError | None = None

    # ------------------------------------------------------------------ starting
    def resolve_tasks(self, request: GenerateRequest, mode: str) -> list[str]:
        every = request.tasks == ["all"]
        ids = list(all_tasks()) if every else list(dict.fromkeys(request.tasks))
        if not ids:
            raise PkbError("No task given; pass --task ID[,ID...] or --task all.")
        chosen = []
        for task_id in ids:
            task = load_task(task_id)
            try:
                task.check_request(world_size=request.world_size, mode=mode, dtype=request.dtype, size=request.size)
            except PkbError as exc:
                if not every:
                    raise
                self.skipped.append(str(exc))
                continue
            chosen.append(task_id)
        if not chosen:
            raise PkbError("No task can run as asked: " + " ".join(self.skipped))
        return chosen

    def start(self, request: GenerateRequest) -> int:
        """Check the request, write the generation run row; returns its id (run() does the work)."""
        if request.samples < 1:
            raise PkbError(f"--samples must be at least 1 (got {request.samples}).")
        if request.rounds < 0:
            raise PkbError(f"--rounds must be 0 or more (got {request.rounds}).")
        mode = choose_mode(request.world_size, request.mode)
        tasks = self.resolve_tasks(request, mode)
        resolved = dataclasses.replace(request, tasks=tasks, mode=mode)
        with Store(self.db_path) as store:
            gen_run_id = store.create_gen_run({
                "endpoint": self.endpoint.name, "api": self.endpoint.api, "base_url": self.endpoint.base_url,
                "model_id": self.endpoint.model, "model_slug": self.endpoint.slug,
                "endpoint_config": self.endpoint.describe(), "request": resolved.to_dict(),
                "out_dir": "", "template_version": TEMPLATE_VERSION, "status": "running",
            })
            out_dir = (self.out_root / "solutions" / "gen" / self.endpoint.slug / str(gen_run_id)).resolve()
            store.update_gen_run(gen_run_id, out_dir=str(out_dir))
        return gen_run_id

    # ------------------------------------------------------------------ running
    def run(self, gen_run_id: int) -> dict[str, Any]:
        """Generate and evaluate every round of a generation run (new or resumed); returns its summary."""
        with Store(self.db_path, recover=True) as store:
            store.recover_gen_runs()
            info = store.gen_run(gen_run_id)
        if info["status"] == "running" and info["launcher_pid"] != os.getpid():
            raise PkbError(f"Generation run {gen_run_id} is running in process {info['launcher_pid']} on "
                           f"{info['launcher_host']}; stop that one first (two would send the same requests).")
        if info["endpoint"] != self.endpoint.name and info["model_id"] != self.endpoint.model:
            raise PkbError(f"Generation run {gen_run_id} was made with endpoint {info['endpoint']!r} "
                           f"({info['model_id']}); resume it with --model {info['endpoint']}.")
        store = Store(self.db_path)
        try:
            store.update_gen_run(gen_run_id, status="running", status_detail=None, finished_at=None,
                                 launcher_pid=os.getpid())
            request = GenerateRequest.from_dict(info["request"])
            out_dir = Path(info["out_dir"])
            self.on_event(GenEvent("started", gen_run_id, detail=f"{len(request.tasks)} task(s) x {request.samples} sample(s), "
                                   f"{request.rounds} refine round(s)"))
            hardware = load_hardware(store, request.mode or "cpu", request.world_size)
            first: dict[str, Prompt] = {}
            for task_id in request.tasks:
                first[task_id] = task_prompt(load_task(task_id), world_size=request.world_size, mode=request.mode or "cpu",
                                             size=request.size, dtype=request.dtype, hardware=hardware)
            status, detail = "finished", None
            for round_index in range(request.rounds + 1):
                if self.cancel.is_set():
                    break
                self._round(store, gen_run_id, request, round_index, first, out_dir)
                if self._quota is not None:
                    break
            if self._quota is not None:
                status, detail = "stopped", str(self._quota)
            elif self.cancel.is_set():
                status, detail = "stopped", "stopped by the user; `pkb-tui generate --resume` continues it"
            store.update_gen_run(gen_run_id, status=status, status_detail=detail, finished_at=time.time())
            summary = summarize(store, gen_run_id)
            self.on_event(GenEvent("finished", gen_run_id, detail=status, cost_usd=summary["cost_usd"]))
            if self._quota is not None:
                raise self._quota
            return summary
        except BaseException as exc:
            self.cancel.set()  # requests not yet started stay unsent; those in flight still store their replies
            if not isinstance(exc, QuotaError):
                try:
                    store.update_gen_run(gen_run_id, status="interrupted" if isinstance(exc, KeyboardInterrupt) else "error",
                                         status_detail=f"{type(exc).__name__}: {exc}"[:500], finished_at=time.time())
                except Exception:
                    pass
            raise
        finally:
            store.close()

    # ------------------------------------------------------------------ one round
    def _round(self, store: Store, gen_run_id: int, request: GenerateRequest, round_index: int,
               first: dict[str, Prompt], out_dir: Path) -> None:
        rows = store.gen_requests(gen_run_id)
        by_key = {(r["task_id"], r["sample"], r["round"]): r for r in rows}
        todo: list[tuple[int, str, int, Prompt]] = []
        for task_id in request.tasks:
            for sample in range(request.samples):
                existing = by_key.get((task_id, sample, round_index))
                if existing is not None and existing["status"] in ("replied", "failed"):
                    continue
                if round_index > 0 and not self._chain_goes_on(by_key, task_id, sample, round_index, request):
                    continue
                stored = store.prompt(existing["prompt_hash"]) if existing is not None else None
                if stored is not None:  # sent before a kill: ask again in the very same words
                    data = json.loads(stored["text"])
                    prompt = Prompt(data["system"], data["messages"], stored["template"])
                else:
                    prompt = self._prompt(store, by_key, first, task_id, sample, round_index, request)
                store.add_prompt(prompt.sha256, prompt.template, prompt.as_json())
                request_id = store.ensure_gen_request(gen_run_id, task_id, sample, round_index, prompt.sha256)
                todo.append((request_id, task_id, sample, prompt))
        if todo:
            with ThreadPoolExecutor(max_workers=self.endpoint.concurrency, thread_name_prefix="pkb-gen") as pool:
                for request_id, task_id, sample, prompt in todo:
                    pool.submit(self._ask, store, gen_run_id, request_id, task_id, sample, round_index, prompt)
        # Candidates for every reply or failure of this round that has none (a resume after a kill lands here too).
        for row in store.gen_requests(gen_run_id):
            if row["round"] == round_index and row["candidate_id"] is None and row["status"] in ("replied", "failed"):
                self._make_candidate(store, gen_run_id, row, out_dir)
        if not self.cancel.is_set() and self._quota is None:
            self._evaluate(store, gen_run_id, request, round_index)

    def _chain_goes_on(self, by_key: dict, task_id: str, sample: int, round_index: int, request: GenerateRequest) -> bool:
        previous = by_key.get((task_id, sample, round_index - 1))
        if previous is None:  # the chain's last request was never made (quota stop, cancel): resume makes it first
            return False
        if request.until_correct:
            chain = [by_key.get((task_id, sample, r)) for r in range(round_index)]
            if any(r is not None and r.get("correct") and r.get("run_status") == "passed" for r in chain):
                return False
        return True

    def _prompt(self, store: Store, by_key: dict, first: dict[str, Prompt], task_id: str, sample: int,
                round_index: int, request: GenerateRequest) -> Prompt:
        base = first[task_id]
        root = by_key.get((task_id, sample, 0))
        if root is not None:  # the task prompt as it was first sent (the hardware may be calibrated since)
            stored = store.prompt(root["prompt_hash"])
            if stored and stored["template"].startswith("system+task."):
                data = json.loads(stored["text"])
                base = Prompt(data["system"], data["messages"], stored["template"])
        if round_index == 0:
            return base
        last = by_key[(task_id, sample, round_index - 1)]
        reply = store.gen_reply(last["id"])
        if reply is None:  # the last request failed for good: ask the task again
            return base
        chain = [by_key[(task_id, sample, r)] for r in range(round_index) if (task_id, sample, r) in by_key]
        digest = self._digest(store, last, reply)
        best, goal = self._best(store, chain, last)
        return refine_prompt(base, reply["text"], round_index=round_index, rounds=request.rounds, digest=digest,
                             best=best, goal=goal)

    def _digest(self, store: Store, last: dict[str, Any], reply: dict[str, Any]) -> str:
        notes = []
        if reply.get("finish_reason") in ("length", "max_tokens"):
            notes.append(f"Your reply was cut at the output limit ({self.endpoint.max_output_tokens} tokens): be shorter.")
        status = last.get("candidate_status")
        if status == "no_code":
            notes.append(f"Your reply had no usable code ({last.get('extraction')}): reply with one ```python block "
                         "defining solution.")
        elif status == "invalid":
            notes.append(f"Your code was not run: {last.get('candidate_detail')}")
        elif last.get("run_id") is not None:
            run = store.run(last["run_id"])
            tail = None
            if run["status"] in ("error", "timeout") and run.get("log_path") and Path(run["log_path"]).is_file():
                tail = Path(run["log_path"]).read_text(errors="replace")[-2500:]
            notes.append(digest_run(run, log_tail=tail))
        else:
            notes.append(f"Your code was not evaluated ({last.get('candidate_detail') or status}).")
        return "\n\n".join(notes)

    def _best(self, store: Store, chain: list[dict[str, Any]], last: dict[str, Any]) -> tuple[str, str]:
        correct = [r for r in chain if r.get("correct") and r.get("run_status") == "passed" and r.get("source_hash")]
        last_ok = bool(last.get("correct")) and last.get("run_status") == "passed"
        goal = (f"It is correct ({(last.get('speedup') or 0):.2f}x the baseline): make it faster and keep it correct."
                if last_ok else "Fix it first: a wrong or failing candidate scores nothing, however fast.")
        if not correct:
            return "None of your candidates so far was correct.", goal
        best = max(correct, key=lambda r: r.get("speedup") or 0.0)
        source = store.source(best["source_hash"])
        code = source["text"] if source else "(source not stored)"
        speed = f"{best['speedup']:.2f}x" if best.get("speedup") else "untimed"
        return f"Round {best['round']}, correct, speedup {speed}:\n\n```python\n{code.rstrip()}\n```", goal

    # ------------------------------------------------------------------ one request (worker thread)
    def _ask(self, store: Store, gen_run_id: int, request_id: int, task_id: str, sample: int, round_index: int,
             prompt: Prompt) -> None:
        where: dict[str, Any] = dict(gen_run_id=gen_run_id, task_id=task_id, sample=sample, round=round_index, request_id=request_id)
        if self.cancel.is_set() or self._quota is not None:
            return
        try:
            store.update_gen_request(request_id, status="sent", sent_at=time.time(), error=None)
            self.on_event(GenEvent("sent", **where))
            pieces = 0
            last_tick = 0.0

            def on_delta(text: str) -> None:
                nonlocal pieces, last_tick
                pieces += 1
                now = time.monotonic()
                if now - last_tick >= 0.2:
                    last_tick = now
                    self.on_event(GenEvent("tokens", **where, tokens=pieces))

            messages = [Message(m["role"], m["content"]) for m in prompt.messages]
            reply = self.client.complete(prompt.system, messages, on_delta=on_delta)
        except QuotaError as exc:
            self._quota = exc
            # Not this request's fault: left pending so that a resume sends it.
            store.update_gen_request(request_id, status="pending", error=str(exc))
            self.on_event(GenEvent("failed", **where, detail=str(exc)))
            return
        except EndpointError as exc:
            store.update_gen_request(request_id, status="failed", error=str(exc), attempts=exc.attempts,
                                     retries=exc.retries, finished_at=time.time())
            self.on_event(GenEvent("failed", **where, detail=str(exc)))
            return
        except Exception as exc:  # a harness bug in one request must not hang the pool: recorded, shown
            store.update_gen_request(request_id, status="failed", error=f"{type(exc).__name__}: {exc}", finished_at=time.time())
            self.on_event(GenEvent("failed", **where, detail=f"{type(exc).__name__}: {exc}"))
            return
        self._store_reply(store, request_id, reply)
        self.on_event(GenEvent("reply", **where, tokens=reply.completion_tokens or pieces,
                               cost_usd=self.endpoint.cost_usd(reply.prompt_tokens, reply.completion_tokens),
                               detail=reply.finish_reason or ""))

    def _store_reply(self, store: Store, request_id: int, reply: Reply) -> None:
        store.update_gen_request(request_id, attempts=reply.attempts, retries=reply.retries)
        store.add_gen_reply(request_id, {
            "text": reply.text, "finish_reason": reply.finish_reason, "resolved_model": reply.model,
            "prompt_tokens": reply.prompt_tokens, "completion_tokens": reply.completion_tokens,
            "cached_tokens": reply.cached_tokens, "reasoning_tokens": reply.reasoning_tokens,
            "latency_us": reply.latency_us, "cost_usd": self.endpoint.cost_usd(reply.prompt_tokens, reply.completion_tokens),
        })

    # ------------------------------------------------------------------ candidates
    def _make_candidate(self, store: Store, gen_run_id: int, row: dict[str, Any], out_dir: Path) -> None:
        fields: dict[str, Any] = {
            "request_id": row["id"], "gen_run_id": gen_run_id, "task_id": row["task_id"], "sample": row["sample"],
            "round": row["round"],
        }
        if row["status"] == "failed":
            fields.update(extraction="no reply", status="request_failed", detail=row.get("error"))
        else:
            reply = store.gen_reply(row["id"])
            extraction = extract_code(reply["text"] if reply else "")
            fields["extraction"] = extraction.how
            if extraction.code is None:
                fields.update(status="no_code", detail=NO_CODE)
            else:
                folder = out_dir / f"s{row['sample']:02d}r{row['round']}"
                folder.mkdir(parents=True, exist_ok=True)
                manifest = folder / "manifest.json"
                if not manifest.exists():
                    manifest.write_text(json.dumps({
                        "model": f"gen:{self.endpoint.slug}:{gen_run_id}:s{row['sample']}r{row['round']}",
                        "provider": self.endpoint.name, "backend": "generated",
                        "notes": f"written by {self.endpoint.model} ({self.endpoint.api} endpoint {self.endpoint.name}), "
                                 f"generation run {gen_run_id}, sample {row['sample']}, round {row['round']}",
                    }, indent=2))
                path = folder / f"{row['task_id']}.py"
                path.write_text(extraction.code)
                fields.update(path=str(path), source_hash=store.add_source(str(path), extraction.code), status="pending")
                try:
                    validate_solution_file(path, row["task_id"], baseline_arity(load_task(row["task_id"]).baseline))
                except PkbError as exc:
                    fields.update(status="invalid", detail=str(exc))
        store.add_gen_candidate(fields)
        self.on_event(GenEvent("candidate", gen_run_id, row["task_id"], row["sample"], row["round"], row["id"],
                               detail=fields["status"] if fields["status"] != "pending" else fields["extraction"]))

    def _evaluate(self, store: Store, gen_run_id: int, request: GenerateRequest, round_index: int) -> None:
        from pkb_tui.engine.launcher import Launcher
        from pkb_tui.engine.request import RunRequest

        pending = [r for r in store.gen_requests(gen_run_id)
                   if r["round"] == round_index and r["candidate_status"] == "pending"]
        if not pending:
            return
        folders = sorted({str(Path(r["path"]).parent) for r in pending})
        tasks = sorted({r["task_id"] for r in pending})
        self.on_event(GenEvent("evaluating", gen_run_id, round=round_index,
                               detail=f"{len(pending)} candidate(s), round {round_index}"))
        run_request = RunRequest(
            tasks=tasks, models=folders, world_size=request.world_size, mode=request.mode, dtype=request.dtype,
            size=request.size, trials=request.trials, timeout_s=request.timeout_s, timing=request.timing,
            extra={"gen_run_id": gen_run_id, "round": round_index},
        )
        launcher = Launcher(self.db_path, runs_dir=self.runs_dir)
        outcome = launcher.run(run_request, cancel=self.cancel)
        wanted = {(str(Path(r["path"]).parent.resolve()), r["task_id"]): r for r in pending}
        for run_id in outcome.run_ids:
            row = store.conn.execute("SELECT task_id, model_path, status FROM runs WHERE id=?", (run_id,)).fetchone()
            key = (str(Path(row["model_path"]).resolve()) if row["model_path"] else "", row["task_id"])
            candidate = wanted.get(key)
            if candidate is None or row["status"] == "interrupted":
                continue  # a pair only the batch's cross product made, or cut short: evaluated again on resume
            store.update_gen_candidate(candidate["candidate_id"], status="evaluated", run_id=run_id)
            verdict = store.conn.execute("SELECT speedup FROM results WHERE run_id=? AND variant='candidate'",
                                         (run_id,)).fetchone()
            speed = verdict["speedup"] if verdict else None
            self.on_event(GenEvent("evaluated", gen_run_id, candidate["task_id"], candidate["sample"], round_index,
                                   candidate["id"], run_id=run_id, detail=row["status"],
                                   extra={"speedup": speed}))


def summarize(store: Store, gen_run_id: int) -> dict[str, Any]:
    """A generation run's figures: per task pass@k and fast_1@k for k in 1..K, the suite means, cost."""
    info = store.gen_run(gen_run_id)
    request = info["request"]
    rows = store.gen_requests(gen_run_id)
    outcomes = outcomes_from_candidates(store.gen_candidate_outcomes(gen_run_ids=[gen_run_id]))
    ks = sorted({1, request["samples"]})
    per_task = task_metrics(outcomes, ks, ps=(1.0, 1.5))
    return {
        "gen_run_id": gen_run_id, "status": info["status"], "status_detail": info["status_detail"],
        "endpoint": info["endpoint"], "model": info["model_id"], "out_dir": info["out_dir"],
        "request": request, "requests": len(rows),
        "cost_usd": sum(r["cost_usd"] or 0 for r in rows),
        "prompt_tokens": sum(r["prompt_tokens"] or 0 for r in rows),
        "completion_tokens": sum(r["completion_tokens"] or 0 for r in rows),
        "tasks": {t: dataclasses.asdict(m) for t, m in per_task.items()},
        "suite": {
            **{f"pass@{k}": suite_mean(per_task, k) for k in ks},
            **{f"fast_1@{k}": suite_mean(per_task, k, 1.0) for k in ks},
        },
    }
