"""`pkb-tui generate` and `pkb-tui generations`: the parsers and handlers, kept here so pkb_tui/cli.py
only registers them."""

from __future__ import annotations

import argparse
import json
import sys
import threading
from pathlib import Path
from typing import Any, TextIO

from pkb_tui.errors import EXIT_CANDIDATE_FAILED, EXIT_OK, PkbError


def add_parsers(sub: Any) -> None:
    gen = sub.add_parser("generate", help="ask a language-model endpoint to write candidates, evaluate and refine them")
    gen.add_argument("--task", help="task id(s), comma separated, or 'all'")
    gen.add_argument("--model", help="endpoint name in the models config")
    gen.add_argument("--samples", type=int, default=1, help="independent samples per task (K)")
    gen.add_argument("--rounds", type=int, default=0, help="refine rounds per sample (R)")
    gen.add_argument("--world-size", type=int, default=2)
    gen.add_argument("--mode", choices=["auto", "nccl", "shared-gpu", "cpu"], default="auto")
    gen.add_argument("--size", default="small")
    gen.add_argument("--dtype", default="float32")
    gen.add_argument("--trials", type=int, default=3)
    gen.add_argument("--timeout", type=float, default=300.0, help="seconds per evaluation run")
    gen.add_argument("--until-correct", action="store_true", help="stop refining a sample once it is correct")
    gen.add_argument("--models-config", help="endpoints TOML (default ~/.config/pkb-tui/models.toml or $PKB_MODELS_CONFIG)")
    gen.add_argument("--out", help="folder under which solutions/gen/... is written (default: the project root)")
    gen.add_argument("--resume", type=int, metavar="GEN_ID", help="continue a generation run without repeating finished requests")
    gen.add_argument("--json", action="store_true", help="print one JSON document")
    gen.add_argument("--print-prompt", action="store_true",
                     help="print the first-round prompt of each task (with this host's hardware) and send nothing")
    gen.add_argument("--db", dest="sub_db", help=argparse.SUPPRESS)

    gens = sub.add_parser("generations", help="generation runs, pass@k and fast_p@k per task and endpoint")
    gens.add_argument("gen_id", type=int, nargs="?", help="one generation run in full")
    gens.add_argument("--json", action="store_true")
    gens.add_argument("--db", dest="sub_db", help=argparse.SUPPRESS)


def _split(value: str) -> list[str]:
    return [v.strip() for v in value.split(",") if v.strip()]


class _GenProgress:
    """One line per reply, failure and evaluation on stderr."""

    def __init__(self, stream: TextIO, quiet: bool) -> None:
        self.stream, self.quiet, self.lock, self.cost_usd = stream, quiet, threading.Lock(), 0.0

    def __call__(self, event: Any) -> None:
        if self.quiet or event.kind in ("tokens", "sent"):
            return
        where = f"{event.task_id} s{event.sample} r{event.round}" if event.task_id else f"gen {event.gen_run_id}"
        if event.kind == "reply":
            self.cost_usd += event.cost_usd
            line = f"{where}: reply, {event.tokens} tokens, {event.detail or '?'} (cost so far ${self.cost_usd:.4f})"
        elif event.kind == "failed":
            line = f"{where}: request failed: {event.detail}"
        elif event.kind == "candidate":
            line = f"{where}: {event.detail}"
        elif event.kind == "evaluated":
            speed = event.extra.get("speedup")
            line = f"{where}: run {event.run_id} {event.detail}" + (f", {speed:.2f}x" if speed else "")
        else:
            line = f"{where}: {event.kind} {event.detail}".rstrip()
        with self.lock:
            self.stream.write(line + "\n")
            self.stream.flush()


def cmd_generate(args: argparse.Namespace, db: Path | None, out: TextIO) -> int:
    from pkb_tui.generate.config import find_endpoint
    from pkb_tui.generate.loop import GenerateRequest, GenerationLoop
    from pkb_tui.store import Store, default_db_path

    db_path = db or default_db_path()
    Store(db_path).close()  # a bad --db fails here, before anything is asked
    if args.print_prompt:
        return _print_prompts(args, db_path, out)
    out_root = Path(args.out).resolve() if args.out else None
    if args.resume is not None:
        with Store(db_path) as store:
            info = store.gen_run(args.resume)
        if info["status"] == "finished":
            raise PkbError(f"Generation run {args.resume} is finished; nothing to resume.")
        endpoint = find_endpoint(args.model or info["endpoint"], args.models_config)
        loop = GenerationLoop(db_path, endpoint, on_event=_GenProgress(sys.stderr, args.json))
        gen_run_id = args.resume
    else:
        if not args.task or not args.model:
            raise PkbError("generate needs --task and --model (or --resume GEN_ID).")
        endpoint = find_endpoint(args.model, args.models_config)
        loop = GenerationLoop(db_path, endpoint, out_root=out_root, on_event=_GenProgress(sys.stderr, args.json))
        request = GenerateRequest(
            tasks=_split(args.task), samples=args.samples, rounds=args.rounds, world_size=args.world_size,
            mode=None if args.mode == "auto" else args.mode, size=args.size, dtype=args.dtype, trials=args.trials,
            timeout_s=args.timeout, until_correct=args.until_correct,
        )
        gen_run_id = loop.start(request)
        for sentence in loop.skipped:
            print(f"skipped: {sentence}", file=sys.stderr)
    if not args.json:
        print(f"generation run {gen_run_id} ({endpoint.name}: {endpoint.model})", file=sys.stderr)
    from pkb_tui.cli import _terminate_as_interrupt

    _terminate_as_interrupt()  # SIGTERM ends it like Ctrl-C: recorded as interrupted, resumable
    try:
        summary = loop.run(gen_run_id)
    finally:
        loop.client.close()
    if args.json:
        json.dump(summary, out, indent=2, default=str)
        out.write("\n")
    else:
        _print_summary(summary, out)
    every_task_solved = bool(summary["tasks"]) and all(t["correct"] > 0 for t in summary["tasks"].values())
    return EXIT_OK if every_task_solved else EXIT_CANDIDATE_FAILED


def _print_prompts(args: argparse.Namespace, db_path: Path, out: TextIO) -> int:
    from pkb_tui.engine.modes import choose_mode
    from pkb_tui.generate.prompts import load_hardware, task_prompt
    from pkb_tui.store import Store
    from tasks.base import all_tasks, load_task

    if not args.task:
        raise PkbError("--print-prompt needs --task ID[,ID...].")
    mode = choose_mode(args.world_size, None if args.mode == "auto" else args.mode)
    task_ids = list(all_tasks()) if args.task == "all" else _split(args.task)
    with Store(db_path) as store:
        hardware = load_hardware(store, mode, args.world_size)
    for task_id in task_ids:
        task = load_task(task_id)
        task.check_request(world_size=args.world_size, mode=mode, dtype=args.dtype, size=args.size)
        prompt = task_prompt(task, world_size=args.world_size, mode=mode, size=args.size, dtype=args.dtype, hardware=hardware)
        if args.json:
            out.write(json.dumps({"task": task_id, "sha256": prompt.sha256, "template": prompt.template,
                                  "system": prompt.system, "messages": prompt.messages}) + "\n")
        else:
            out.write(f"===== {task_id} (sha256 {prompt.sha256[:16]}, {prompt.template})\n")
            out.write(f"----- system\n{prompt.system}\n----- user\n{prompt.messages[0]['content']}\n")
    return EXIT_OK


def _pct(value: float | None) -> str:
    return "n/a" if value is None else f"{value * 100:.0f}%"


def _print_summary(summary: dict[str, Any], out: TextIO) -> None:
    from pkb_tui.cli import _print_table

    k = summary["request"]["samples"]
    rows: list[Any] = []
    for task_id, m in summary["tasks"].items():
        best = m["best_speedup"]
        rows.append((task_id, str(m["n"]), str(m["correct"]), _pct(m["pass_at"].get(1)), _pct(m["pass_at"].get(k)),
                     _pct(m["fast_at"]["1"].get(1)), f"{best:.2f}x" if best else "-"))
    header: tuple[str, ...] = ("task", "samples", "correct", "pass@1", f"pass@{k}", "fast_1@1", "best speedup")
    if k == 1:  # pass@K is pass@1: one column
        header, rows = header[:4] + header[5:], [r[:4] + r[5:] for r in rows]
    _print_table(header, rows, out)
    suite = summary["suite"]
    pass_k = f", pass@{k} {_pct(suite.get(f'pass@{k}'))}" if k > 1 else ""
    out.write(f"suite: pass@1 {_pct(suite.get('pass@1'))}{pass_k}, "
              f"fast_1@1 {_pct(suite.get('fast_1@1'))}; {summary['requests']} requests, "
              f"{summary['prompt_tokens']:,} + {summary['completion_tokens']:,} tokens, ${summary['cost_usd']:.4f}\n")
    out.write(f"generation run {summary['gen_run_id']}: {summary['status']}"
              + (f" ({summary['status_detail']})" if summary.get("status_detail") else "")
              + f"; candidates in {summary['out_dir']}\n")


def cmd_generations(args: argparse.Namespace, db: Path | None, out: TextIO) -> int:
    from pkb_tui.cli import _print_table, _when
    from pkb_tui.generate.loop import summarize
    from pkb_tui.generate.report import endpoint_leaderboard
    from pkb_tui.store import Store

    with Store(db) as store:
        store.recover_gen_runs()
        if args.gen_id is not None:
            summary = summarize(store, args.gen_id)
            requests = store.gen_requests(args.gen_id)
            if args.json:
                json.dump({**summary, "request_rows": requests}, out, indent=2, default=str)
                out.write("\n")
                return EXIT_OK
            _print_summary(summary, out)
            rows: list[Any] = [(r["task_id"], str(r["sample"]), str(r["round"]), r["status"], r["finish_reason"] or "-",
                     str(r["completion_tokens"] or "-"), r["candidate_status"] or "-",
                     str(r["run_id"] or "-"), r["run_status"] or "-",
                     f"{r['speedup']:.2f}x" if r.get("speedup") else "-") for r in requests]
            _print_table(("task", "sample", "round", "request", "finish", "tokens", "candidate", "run", "verdict", "speedup"),
                         rows, out)
            return EXIT_OK
        runs = store.gen_runs()
        board = endpoint_leaderboard(store)
    if args.json:
        json.dump({"generations": runs, "leaderboard": board}, out, indent=2, default=str)
        out.write("\n")
        return EXIT_OK
    _print_table(("gen", "when", "endpoint", "model", "status", "requests", "cost $"), [
        (str(r["id"]), _when(r["created_at"]), r["endpoint"], r["model_id"], r["status"],
         f"{r['replied'] or 0}/{r['requests']}", f"{r['cost_usd']:.4f}") for r in runs], out)
    out.write("\n")
    _print_table(("endpoint", "model", "tasks", "samples", "pass@1", "pass@k", "k", "fast_1@1"), [
        (e["endpoint"], e["model"], str(e["tasks"]), str(e["samples"]), _pct(e["pass@1"]), _pct(e["pass@k"]), str(e["k"]),
         _pct(e["fast_1@1"])) for e in board], out)
    return EXIT_OK


COMMANDS = {"generate": cmd_generate, "generations": cmd_generations}
