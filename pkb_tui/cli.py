"""`pkb-tui`: the headless CLI on the same engine as the dashboard.

With no command it opens the dashboard (Textual, imported only then). Errors a user can hit print
one sentence (no traceback unless --verbose). Exit codes (EXIT_CODES_HELP): 0 every candidate
correct, 1 some candidate incorrect or failed, 2 usage error, 3 harness error (the ranks did not
start, a launcher or database failure), 4 results not stored (the database went away during the
batch; they are in the recovery file it names), 130 interrupted (Ctrl-C, SIGTERM).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import sqlite3
import sys
import time
import traceback
from collections.abc import Sequence
from pathlib import Path
from typing import Any, NoReturn, TextIO

from pkb_tui.engine.modes import MODE_CHOICES
from pkb_tui.engine.netcal import NETWORK_MODES
from pkb_tui.engine.nodes import DEFAULT_JOIN_TIMEOUT_S, DEFAULT_NODE_TIMEOUT_S
from pkb_tui.errors import EXIT_CANDIDATE_FAILED, EXIT_HARNESS, EXIT_NOT_STORED, EXIT_OK, PkbError
from pkb_tui.store.statuses import STATUSES, status_label

EXIT_INTERRUPTED = 130  # the shell's code for a process ended by SIGINT
EXIT_CODES_HELP = (
    f"exit codes: {EXIT_OK} every candidate correct; {EXIT_CANDIDATE_FAILED} some candidate wrong or failed; "
    "2 usage error; "
    f"{EXIT_HARNESS} harness error (the ranks did not start, a launcher or database failure); "
    f"{EXIT_NOT_STORED} results not stored (the database was deleted, moved, replaced or made read-only during "
    "the batch: its results are in the recovery file named at the end, `pkb-tui import FILE` loads them); "
    f"{EXIT_INTERRUPTED} interrupted (Ctrl-C, SIGTERM)"
)
DEFAULT_KERNELS_SHOWN = 10  # per variant in `show`


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:  # usage errors: one sentence, exit 2
        raise PkbError(f"{message} (see `{self.prog} --help`).")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="pkb-tui", description="Evaluate multi-GPU communication kernels.", epilog=EXIT_CODES_HELP)
    parser.add_argument("--db", help="database file (default ./runs.db or $PKB_DB)")
    parser.add_argument("--runs-dir", help="folder for run logs and traces (default: pkb-runs next to the database)")
    parser.add_argument("--verbose", "-v", action="store_true", help="show tracebacks of errors")
    parser.add_argument("--pkb-root", help="a ParallelKernelBench clone: its problems join the dashboard's tasks (remembered)")
    parser.add_argument("--prometheus", metavar="[HOST:]PORT",
                        help="the dashboard serves the live metrics for Prometheus at HOST:PORT/metrics while it runs")
    sub = parser.add_subparsers(dest="command", parser_class=_Parser)

    run = sub.add_parser("run", help="run tasks against solution sets", epilog=EXIT_CODES_HELP)
    run.add_argument("--task", required=True, help="task id(s), comma separated, or 'all'")
    run.add_argument("--model", required=True, help="solution set name(s) or path(s), comma separated; 'baseline' runs the baseline")
    run.add_argument("--world-size", type=int, default=2)
    run.add_argument("--oversubscribe", action="store_true",
                     help="allow more ranks than the mode holds here (CPU cores, GPUs, 8 on a shared GPU)")
    run.add_argument("--mode", choices=list(MODE_CHOICES), default="auto")
    run.add_argument("--dtype", default=None, help="default float32; bfloat16 when every task is a PKB problem")
    run.add_argument("--size", default="small", help="small, default or large")
    run.add_argument("--trials", type=int, default=3)
    run.add_argument("--timeout", type=float, default=300.0,
                     help="wall seconds per run (task x model), from its start; the ranks' start-up has as long again")
    run.add_argument("--iterations", type=int, default=30, help="timed iterations per variant")
    run.add_argument("--warmup", type=int, default=5)
    run.add_argument("--no-timing", action="store_true", help="check correctness only")
    run.add_argument("--no-profile", action="store_true", help="skip the per-kernel profile")
    run.add_argument("--seed", type=int, default=0)
    run.add_argument("--max-host-memory-gib", type=float, default=None,
                     help="host memory a candidate may hold per rank (default: half this machine's, shared by the ranks)")
    run.add_argument("--max-tasks", type=int, default=None,
                     help="threads and processes a candidate may run per rank (default 512)")
    run.add_argument("--max-cpu-s", type=float, default=None,
                     help="CPU seconds a candidate's processes may use per rank (default: --timeout times the cores a "
                          "rank may use, at most 2)")
    run.add_argument("--max-gpu-memory-gib", type=float, default=None,
                     help="GPU memory a candidate may hold per rank (default: its GPU's memory shared by the ranks on "
                          "it, less 6 GiB for the judge, halved for the baseline)")
    _basis_option(run)
    run.add_argument("--json", action="store_true", help="print one JSON document")
    run.add_argument("--db", dest="sub_db", help=argparse.SUPPRESS)
    run.add_argument("--runs-dir", dest="sub_runs_dir", help=argparse.SUPPRESS)
    _node_options(run.add_argument_group(
        "several nodes (torchrun's c10d rendezvous; --world-size is every node's ranks together)"))
    _add_pkb_options(run)
    pkb = run.add_argument_group("ParallelKernelBench problems (tasks pkb/<N>_<name>; pkb/all, pkb/1-8 select several)")
    pkb.add_argument("--m", type=int, help="PKB base shape M (rows); overrides --size")
    pkb.add_argument("--n", type=int, help="PKB base shape N (columns); overrides --size")
    pkb.add_argument("--fresh-seeds", action="store_true", help="inputs from this project's per-trial seeds, not PKB's")
    pkb.add_argument("--pkb-tolerance", action="store_true", help="judge with PKB's allclose(atol=1e-2, rtol=1e-2)")

    for name, helptext in (("tasks", "list tasks"), ("models", "list solution sets")):
        p = sub.add_parser(name, help=helptext)
        p.add_argument("--json", action="store_true")
        _add_pkb_options(p)
        if name == "tasks":
            p.add_argument("--family", help="only this family ('pkb' for every PKB problem)")
            p.add_argument("--traffic", action="store_true",
                           help="measure each baseline's traffic on gloo ranks and print it beside the hand-written model")
            p.add_argument("--world-size", type=int, default=4, help="ranks for --traffic (default 4)")
            p.add_argument("--size", default="small", help="size for --traffic (default small)")
            p.add_argument("--dtype", default="float32", help="dtype for --traffic (default float32)")

    agent = sub.add_parser("agent", help="join a multi-node batch as one of its nodes (no database of its own)")
    agent.add_argument("--node-rank", type=int, default=None, help="this node's rank, 1..N-1 (with --slurm: from SLURM_NODEID)")
    _rendezvous_options(agent)
    agent.add_argument("--channel", help="the head's HOST:PORT for its agents (default: the rendezvous port + 1)")
    agent.add_argument("--slurm", action="store_true", help="this node's rank from SLURM's environment (srun)")
    agent.add_argument("--join-timeout", type=float, default=DEFAULT_JOIN_TIMEOUT_S,
                       help=f"seconds to keep trying to reach the head (default {DEFAULT_JOIN_TIMEOUT_S:g})")
    agent.add_argument("--no-telemetry", action="store_true", help="send no samples of this host to the head")
    agent.add_argument("--runs-dir", dest="sub_runs_dir", help=argparse.SUPPRESS)

    runs = sub.add_parser("runs", help="run history")
    runs.add_argument("--task")
    runs.add_argument("--model")
    runs.add_argument("--status", choices=list(STATUSES))
    runs.add_argument("--limit", type=int, default=50)
    _basis_option(runs)
    runs.add_argument("--json", action="store_true")
    runs.add_argument("--db", dest="sub_db", help=argparse.SUPPRESS)

    board = sub.add_parser("board", help="per-problem scores by model: pass@k and fast_p, as ParallelKernelBench reports them")
    board.add_argument("--k", default="1", help="k values of pass@k, comma separated (default 1)")
    board.add_argument("--p", default="1,1.5", help="p values of fast_p, comma separated (default 1,1.5)")
    board.add_argument("--prefix", help="only task ids starting with this (e.g. pkb/)")
    board.add_argument("--json", action="store_true")
    board.add_argument("--db", dest="sub_db", help=argparse.SUPPRESS)

    show = sub.add_parser("show", help="one run in full")
    show.add_argument("run_id", type=int)
    _basis_option(show)
    show.add_argument("--kernels", default=str(DEFAULT_KERNELS_SHOWN),
                      help=f"kernels shown per variant (biggest total time first): a number or 'all' (default {DEFAULT_KERNELS_SHOWN})")
    show.add_argument("--json", action="store_true")
    show.add_argument("--db", dest="sub_db", help=argparse.SUPPRESS)

    imp = sub.add_parser(
        "import", help="load a recovery file (results a batch could not store) into the database",
        description="A batch whose database was deleted, moved, replaced or made read-only while it ran keeps "
                    "going and writes its results to a recovery file next to the database (runs.recovery-<batch>.jsonl "
                    "for runs.db), named when the batch ends (exit code 4). This loads it into a database: the runs, results, trials, "
                    "kernels and samples a normal batch stores. Runs are matched by their batch and place in it, "
                    "so importing a file twice, or into the database that kept the batch's first rows, adds "
                    "nothing twice.",
        epilog=f"exit codes: {EXIT_OK} imported; 2 no such file, or not a recovery file (nothing written); "
               f"{EXIT_HARNESS} the database could not be written")
    imp.add_argument("file", help="the recovery file (.jsonl)")
    imp.add_argument("--json", action="store_true", help="print what was imported as JSON")
    imp.add_argument("--db", dest="sub_db", metavar="PATH", help="database to load it into (default ./runs.db or $PKB_DB)")

    rm = sub.add_parser("rm", help="delete runs with their results, trials, kernels and samples")
    rm.add_argument("run_ids", type=int, nargs="+", metavar="RUN_ID")
    rm.add_argument("--db", dest="sub_db", help=argparse.SUPPRESS)

    monitor = sub.add_parser("monitor", help="live NVLink/PCIe/utilisation with no run going")
    monitor.add_argument("--duration", type=float, help="seconds (default: until Ctrl-C)")
    monitor.add_argument("--interval", type=float, default=0.5, help="seconds between refreshes")
    monitor.add_argument("--json", action="store_true", help="JSON lines instead of a table")
    monitor.add_argument("--record", action="store_true",
                         help="also write the samples to the database (default: not recorded, as the dashboard's Monitor)")
    monitor.add_argument("--prometheus", metavar="[HOST:]PORT",
                         help="also serve the metrics for Prometheus (dcgm-exporter names) at HOST:PORT/metrics; "
                              "HOST defaults to 127.0.0.1 (0.0.0.0 lets other machines scrape)")
    monitor.add_argument("--db", dest="sub_db", help=argparse.SUPPRESS)

    export = sub.add_parser(
        "export", help="write runs, results, trials, kernels and samples to CSV, JSON lines or Parquet",
        description="Write the runs chosen (filtered as `runs` filters them) and their results, trials, kernels and "
                    "telemetry samples, one file per table, into a folder. Parquet needs pyarrow "
                    "(pip install 'pkb-tui[export]'); CSV and JSON lines need nothing more.")
    export.add_argument("--out", required=True, help="folder to write <table>.<format> into (created if missing)")
    export.add_argument("--format", choices=["csv", "jsonl", "parquet"], default="csv")
    export.add_argument("--tables", default="runs,results,trials,kernels,samples", help="comma separated")
    export.add_argument("--task")
    export.add_argument("--model")
    export.add_argument("--status")
    export.add_argument("--run", help="run id(s), comma separated")
    export.add_argument("--since", help="runs created on or after (YYYY-MM-DD[THH:MM], local time)")
    export.add_argument("--until", help="runs created before (YYYY-MM-DD[THH:MM], local time)")
    export.add_argument("--limit", type=int, help="at most this many runs")
    export.add_argument("--json", action="store_true", help="print what was written as JSON")
    export.add_argument("--db", dest="sub_db", help=argparse.SUPPRESS)

    query = sub.add_parser(
        "query", help="run one read-only SQL statement on runs.db",
        description="One SQL statement on a read-only connection (writes are refused). The views run_results "
                    "(a row per run, both variants) and kernel_rows (a row per kernel with its run) are described "
                    "in docs/database.md; --schema lists every table and view with its columns.")
    query.add_argument("sql", nargs="?", help='e.g. "SELECT task_id, model, speedup FROM run_results ORDER BY speedup DESC"')
    query.add_argument("--json", action="store_true", help="print the rows as a JSON list")
    query.add_argument("--schema", action="store_true", help="list the tables and views and their columns")
    query.add_argument("--db", dest="sub_db", help=argparse.SUPPRESS)

    calibrate = sub.add_parser("calibrate", help="measure this host's memory, peer and NCCL bandwidths")
    calibrate.add_argument("--quick", action="store_true")
    calibrate.add_argument("--no-noise", action="store_true", help="skip the noise floor (the baseline timed against itself)")
    calibrate.add_argument("--noise-only", action="store_true",
                           help="measure only the noise floor (works without a GPU: cpu mode)")
    calibrate.add_argument("--noise-tasks", metavar="all|collectives|ID[,ID...]",
                           help="the noise floor's self-check tasks (default: all on a GPU, ~5-10 min; "
                                "collectives there is quicker but under-reads the other tasks' spread; the eight "
                                "collectives in cpu mode)")
    calibrate.add_argument("--json", action="store_true")
    calibrate.add_argument("--db", dest="sub_db", help=argparse.SUPPRESS)
    calibrate.add_argument("--runs-dir", dest="sub_runs_dir", help=argparse.SUPPRESS)
    network = calibrate.add_argument_group(
        "the network between nodes (--network: per pair of hosts, stored in this node's database; the other "
        "nodes join as for a run: `pkb-tui agent`, or srun under --slurm)")
    network.add_argument("--network", action="store_true",
                         help="measure the bandwidth and latency between every pair of the nodes' hosts, one process "
                              "per node (gloo over TCP in cpu mode, NCCL on GPU 0 of each node in nccl mode)")
    network.add_argument("--mode", choices=["auto", *NETWORK_MODES], default="auto",
                         help="--network: nccl where the node has a GPU, else cpu (default auto)")
    network.add_argument("--timeout", type=float, default=None,
                         help="--network: wall seconds for the measurement (default 600)")
    _node_options(network)

    from pkb_tui.generate.cli import add_parsers as add_generate_parsers

    add_generate_parsers(sub)  # generate, generations
    return parser


def _add_pkb_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--pkb-root", help="a ParallelKernelBench clone (default $PKB_ROOT): its problems become tasks pkb/...")
    parser.add_argument("--backend", choices=["reference", "triton", "cuda", "parallelkittens"],
                        help="which PKB candidates of a model folder to run (default: the folder's, or the only one)")


def _activate_pkb(args: argparse.Namespace) -> None:
    """--pkb-root / --backend into the environment, which the launched ranks inherit (the registry
    in tasks/base.py reads $PKB_ROOT in every process; candidates find PKB's helpers on $PYTHONPATH)."""
    import os

    if getattr(args, "pkb_root", None):
        from pkb_tui.pkb.tasks import activate

        activate(args.pkb_root)
    if getattr(args, "backend", None):
        os.environ["PKB_BACKEND"] = args.backend


def _node_options(nodes: Any) -> None:
    """The options that spread a command over nodes (run, calibrate --network)."""
    nodes.add_argument("--nnodes", type=int, default=1, help="nodes in the batch (default 1)")
    nodes.add_argument("--node-rank", type=int, default=0,
                       help="0: this node owns the database and receives every event (the head); "
                            "1..N-1: join the head's batch as that node (as `pkb-tui agent` does)")
    _rendezvous_options(nodes)
    nodes.add_argument("--rdzv-id", help="torchrun's rendezvous id (default: the batch id)")
    nodes.add_argument("--node-timeout", type=float, default=DEFAULT_NODE_TIMEOUT_S,
                       help=f"seconds a node may stay silent before it is taken for lost (default {DEFAULT_NODE_TIMEOUT_S:g})")
    nodes.add_argument("--join-timeout", type=float, default=DEFAULT_JOIN_TIMEOUT_S,
                       help=f"seconds for every node's agent to join (default {DEFAULT_JOIN_TIMEOUT_S:g})")
    nodes.add_argument("--slurm", action="store_true",
                       help="inside a SLURM allocation: nodes and this node's rank from SLURM's environment, "
                            "the other nodes' agents started with srun")
    nodes.add_argument("--agent-runs-dir", help="--slurm: the agents' folder for logs (default ./pkb-runs where srun starts them)")


def _rendezvous_options(parser: Any) -> None:
    parser.add_argument("--rdzv-endpoint", metavar="HOST:PORT",
                        help="the head node's address and a free port for torchrun's c10d rendezvous")
    parser.add_argument("--channel-port", type=int, default=None,
                        help="the head's port for its agents and judge 0 (default: the rendezvous port + 1)")


def _basis_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--speedup-basis", choices=["eager", "graph"], default="eager",
                        help="which timing the speedup uses: eager (per call as an eager program pays it, the "
                             "default) or graph (the call replayed in a CUDA graph)")


def main(argv: Sequence[str] | None = None, out: TextIO | None = None) -> int:
    out = out or sys.stdout
    argv = list(sys.argv[1:] if argv is None else argv)
    verbose = "--verbose" in argv or "-v" in argv
    db: Path | None = None
    try:
        args = build_parser().parse_args(argv)
        db = Path(getattr(args, "sub_db", None) or args.db) if (getattr(args, "sub_db", None) or args.db) else None
        runs_dir = getattr(args, "sub_runs_dir", None) or args.runs_dir
        args.runs_dir = Path(runs_dir) if runs_dir else None
        if args.command is None:
            from pkb_tui.app import run_app
            from pkb_tui.store import default_db_path

            if args.pkb_root:
                from pkb_tui.pkb.settings import remember_root

                remember_root(_activated_root(args.pkb_root))
            return run_app(db or default_db_path(), runs_dir=args.runs_dir, prometheus=args.prometheus)
        _activate_pkb(args)
        handler = COMMANDS[args.command]
        code = handler(args, db, out)
        out.flush()
        return code
    except PkbError as exc:
        if verbose:
            traceback.print_exc()
        print(f"pkb-tui: {exc}", file=sys.stderr)
        return exc.exit_code
    except BrokenPipeError:
        # `pkb-tui ... | head`: the reader has gone; stop quietly. Point stdout at /dev/null so the
        # interpreter's own flush at exit does not print the same error.
        try:
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        except (OSError, ValueError):
            pass
        return EXIT_OK
    except KeyboardInterrupt:
        print("pkb-tui: interrupted.", file=sys.stderr)
        return EXIT_INTERRUPTED
    except sqlite3.DatabaseError as exc:
        # Damage past the header shows only when a page is read; the header's case is caught on open.
        from pkb_tui.store import default_db_path
        from pkb_tui.store.store import damaged_database

        if verbose:
            traceback.print_exc()
        print(f"pkb-tui: {damaged_database(db or default_db_path(), exc)}", file=sys.stderr)
        return EXIT_HARNESS
    except Exception as exc:  # a harness bug: say so, keep the traceback behind --verbose
        if verbose:
            traceback.print_exc()
        print(f"pkb-tui: internal error: {type(exc).__name__}: {exc} (run with --verbose for the traceback).", file=sys.stderr)
        return EXIT_HARNESS


# ---------------------------------------------------------------------- run
def _activated_root(root: str) -> Path:
    from pkb_tui.pkb.tasks import activate

    return activate(root)


def _pkb_run_options(args: argparse.Namespace, task_ids: list[str]) -> dict[str, Any]:
    """The PKB switches into the environment the ranks inherit; what they were, for the request
    JSON (so a stored run says which tolerance judged it and which inputs it saw)."""
    import os

    from pkb_tui.pkb.tasks import tolerance_mode

    if args.m is not None or args.n is not None:
        if (args.m is not None and args.m < 1) or (args.n is not None and args.n < 1):
            raise PkbError("--m and --n must be positive.")
        os.environ["PKB_SHAPE"] = f"{args.m or 1024},{args.n or 1024}"
    os.environ["PKB_FRESH_SEEDS"] = "1" if args.fresh_seeds else "0"
    os.environ["PKB_TOLERANCE"] = "pkb" if args.pkb_tolerance else "pkb-tui"
    if not any(t.startswith("pkb/") for t in task_ids):
        return {}
    return {"pkb": {
        "root": os.environ.get("PKB_ROOT"), "tolerance": tolerance_mode(),
        "tolerance_atol_rtol": [1e-2, 1e-2] if args.pkb_tolerance else None,
        "seeds": "fresh" if args.fresh_seeds else "pkb", "base_shape": os.environ.get("PKB_SHAPE"),
        "backend": os.environ.get("PKB_BACKEND"),
    }}


def _expand_tasks(selectors: list[str], world_size: int, mode: str | None, dtype: str | None, size: str) -> tuple[list[str], list[str]]:
    """Task ids from --task (pkb/all and pkb/1-8 select PKB problems), and, for those selected in
    bulk, the ones that cannot run as asked with the reason (listed, not run)."""
    from pkb_tui.engine.modes import choose_mode
    from pkb_tui.pkb.tasks import expand_selector
    from tasks import all_tasks

    if not any(s.startswith("pkb/") for s in selectors):
        return selectors, []
    tasks = all_tasks()
    ids: list[str] = []
    skipped: list[str] = []
    chosen_mode = choose_mode(world_size, mode)
    for selector in selectors:
        expanded = expand_selector(selector, tasks)
        for task_id in expanded:
            if expanded != [selector] and task_id in tasks:
                try:
                    tasks[task_id].check_request(world_size=world_size, mode=chosen_mode,
                                                 dtype=dtype or "bfloat16", size=size)
                except PkbError as exc:
                    skipped.append(str(exc))
                    continue
            ids.append(task_id)
    if not ids:
        raise PkbError("Nothing to run: " + " ".join(skipped or ["no task selected."]))
    return list(dict.fromkeys(ids)), skipped


def cmd_run(args: argparse.Namespace, db: Path | None, out: TextIO) -> int:
    from collectors.contention import competing_load
    from pkb_tui.engine.launcher import Launcher
    from pkb_tui.engine.request import RunRequest
    from pkb_tui.store import Store

    mode = None if args.mode == "auto" else args.mode
    task_ids, not_runnable = _expand_tasks(_split(args.task), args.world_size, mode, args.dtype, args.size)
    dtype = args.dtype or ("bfloat16" if task_ids and all(t.startswith("pkb/") for t in task_ids) else "float32")
    extra = _pkb_run_options(args, task_ids)
    request = RunRequest(
        tasks=task_ids, models=_split(args.model), world_size=args.world_size,
        mode=mode, dtype=dtype, size=args.size,
        trials=args.trials, timeout_s=args.timeout, timing=not args.no_timing, warmup=args.warmup,
        iterations=args.iterations, profile=not args.no_profile, seed=args.seed, speedup_basis=args.speedup_basis,
        oversubscribe=args.oversubscribe, extra=extra,
        max_host_memory_gib=args.max_host_memory_gib, max_tasks=args.max_tasks,
        max_cpu_s=args.max_cpu_s, max_gpu_memory_gib=args.max_gpu_memory_gib,
    )
    cluster = _cluster(args)
    if cluster is None:  # this node joins another's batch: an agent, no database
        return _agent_of_run(args)
    launcher = Launcher(db, runs_dir=args.runs_dir, cluster=cluster)
    with Store(launcher.db_path) as store:  # a bad --db fails here, before anything launches
        # Batches on this database are named by the launcher (SharedMachine): not twice here.
        known_batches = [batch["pid"] for batch in store.other_live_batches()]
    _terminate_as_interrupt()
    items = launcher.plan(request)
    for warning in competing_load(known_batch_pids=known_batches):
        print(f"pkb-tui: warning: {warning}.", file=sys.stderr)
    progress = _Progress(sys.stderr, len(items), quiet=args.json)
    try:
        outcome = launcher.run(request, on_event=progress)
    except KeyboardInterrupt:
        if launcher.outcome is not None and launcher.outcome.not_stored_sentence:
            print(f"pkb-tui: {launcher.outcome.not_stored_sentence}", file=sys.stderr)
        raise
    progress.done()
    if outcome.not_stored is not None:
        runs = _recovered_runs(outcome.recovery_path, args.speedup_basis)
    else:
        with Store(launcher.db_path) as store:
            runs = [_run_summary(store.run(run_id, basis=args.speedup_basis)) for run_id in outcome.run_ids]
    if args.json:
        document: dict[str, Any] = {"db": str(launcher.db_path), "runs": runs, "skipped": not_runnable + outcome.skipped}
        if outcome.not_stored is not None:
            document.update(stored=False, not_stored=outcome.not_stored_sentence,
                            recovery_file=str(outcome.recovery_path) if outcome.recovery_path else None)
        json.dump(document, out, indent=2, default=_json_default)
        out.write("\n")
    else:
        _print_runs_table(runs, out)
        for sentence in not_runnable + outcome.skipped:
            out.write(f"skipped: {sentence}\n")
        notes = {n for r in runs for n in (r.get("notes") or [])}
        for note in sorted(notes):
            out.write(f"note: {note}\n")
    if outcome.not_stored is not None:
        print(f"pkb-tui: {outcome.not_stored_sentence}", file=sys.stderr)
        return EXIT_NOT_STORED
    return batch_exit_code(runs)


def _recovered_runs(recovery_path: Path | None, basis: str) -> list[dict[str, Any]]:
    """The runs of a batch whose database went away, read back from its recovery file (imported
    into a throw-away database: the same reading `pkb-tui import` does), for the table."""
    import tempfile

    from pkb_tui.store import Store
    from pkb_tui.store.recovery import import_recovery

    if recovery_path is None:
        return []
    with tempfile.TemporaryDirectory(prefix="pkb-recovered-") as folder, Store(Path(folder) / "runs.db") as store:
        summary = import_recovery(recovery_path, store)
        # Their ids are the throw-away database's: none until they are imported.
        return [{**_run_summary(store.run(run_id, basis=basis)), "id": None} for run_id in summary.run_ids]


def _join_key(required: bool) -> bytes | None:
    text = os.environ.get("PKB_JOIN_KEY", "").strip()
    if not text:
        if required:
            raise PkbError("Set PKB_JOIN_KEY to the head's join key (the same value on every node) to join its batch.")
        return None
    try:
        key = bytes.fromhex(text)
    except ValueError:
        key = text.encode()
    if len(key) < 16:
        raise PkbError("PKB_JOIN_KEY is too short: use at least 16 random bytes, e.g. `openssl rand -hex 32`.")
    return key


def _cluster(args: argparse.Namespace) -> Any:
    """How `run` spreads over nodes: a Cluster for the head (one node included), None when this
    process is to join another node's batch as its agent."""
    from pkb_tui.engine.launcher import Cluster
    from pkb_tui.engine.nodes import free_port

    if args.slurm:
        from pkb_tui.engine import slurm

        alloc = slurm.allocation()
        if alloc.node_rank != 0:
            raise PkbError("Run `pkb-tui run --slurm` once, on the allocation's first node: it starts the other "
                           "nodes' agents with srun.")
        if alloc.nnodes == 1:
            return Cluster()
        if args.rdzv_endpoint:
            endpoint = args.rdzv_endpoint
        else:
            endpoint = f"{alloc.head_host}:{free_port('0.0.0.0')}"
        host = endpoint.rpartition(":")[0]
        channel_port = args.channel_port or free_port("0.0.0.0")
        agents = slurm.agents_command(alloc, f"{host}:{channel_port}", args.agent_runs_dir)
        return Cluster(nnodes=alloc.nnodes, rdzv_endpoint=endpoint, rdzv_id=args.rdzv_id or f"slurm-{alloc.job_id}",
                       channel_port=channel_port, join_key=_join_key(False) or os.urandom(32),
                       node_timeout_s=args.node_timeout, join_timeout_s=args.join_timeout, agents_command=agents)
    if args.nnodes < 1:
        raise PkbError(f"--nnodes must be at least 1 (got {args.nnodes}).")
    if not 0 <= args.node_rank < args.nnodes:
        raise PkbError(f"--node-rank must be 0..{args.nnodes - 1} (got {args.node_rank}).")
    if args.nnodes == 1:
        return Cluster()
    if args.node_rank > 0:
        return None
    key = _join_key(False)
    cluster = Cluster(nnodes=args.nnodes, rdzv_endpoint=args.rdzv_endpoint, rdzv_id=args.rdzv_id,
                      channel_port=args.channel_port, join_key=key or os.urandom(32),
                      node_timeout_s=args.node_timeout, join_timeout_s=args.join_timeout)
    host, _ = cluster.endpoint()
    if key is None:
        assert cluster.join_key is not None
        print(f"pkb-tui: start the other nodes with: PKB_JOIN_KEY={cluster.join_key.hex()} pkb-tui agent "
              f"--node-rank R --channel {host}:{cluster.uplink_port()}", file=sys.stderr)
    return cluster


def _agent_of_run(args: argparse.Namespace) -> int:
    """`run --node-rank R` on a node other than the head: the same as `pkb-tui agent`."""
    from pkb_tui.engine.agent import AgentConfig, run_agent

    channel = _channel_address(args.rdzv_endpoint, args.channel_port, None)
    return run_agent(AgentConfig(channel=channel, join_key=_join_key(True) or b"", node_rank=args.node_rank,
                                 runs_dir=args.runs_dir or Path("pkb-runs"), join_timeout_s=args.join_timeout))


def _channel_address(rdzv_endpoint: str | None, channel_port: int | None, channel: str | None) -> tuple[str, int]:
    from pkb_tui.engine.uplink import parse_address

    try:
        if channel:
            return parse_address(channel)
        if rdzv_endpoint:
            host, port = parse_address(rdzv_endpoint)
            return host, channel_port or port + 1
    except ValueError as exc:
        raise PkbError(f"{exc}; give HOST:PORT.") from None
    raise PkbError("Give the head's address: --channel HOST:PORT, or --rdzv-endpoint HOST:PORT.")


def cmd_agent(args: argparse.Namespace, db: Path | None, out: TextIO) -> int:
    from pkb_tui.engine.agent import AgentConfig, run_agent

    node_rank = args.node_rank
    if args.slurm and node_rank is None:
        from pkb_tui.engine import slurm

        node_rank = slurm.allocation().node_rank
    if node_rank is None or node_rank < 1:
        raise PkbError("Give this node's rank with --node-rank R (1 or more: node 0 is the head), or --slurm.")
    channel = _channel_address(args.rdzv_endpoint, args.channel_port, args.channel)
    return run_agent(AgentConfig(channel=channel, join_key=_join_key(True) or b"", node_rank=node_rank,
                                 runs_dir=args.runs_dir or Path("pkb-runs"), join_timeout_s=args.join_timeout,
                                 telemetry=not args.no_telemetry))


def batch_exit_code(runs: list[dict[str, Any]]) -> int:
    """3 when the harness failed a run (its ranks never started), else 0 if every candidate was
    correct, else 1 (a candidate wrong, raising, crashing or hanging)."""
    from pkb_tui.engine.logs import RANKS_DID_NOT_START

    if any(r["status"] == "error" and (r.get("status_detail") or "").startswith(RANKS_DID_NOT_START) for r in runs):
        return EXIT_HARNESS
    if any(r["status"] in ("interrupted", "cancelled") for r in runs):
        return EXIT_INTERRUPTED
    return EXIT_OK if runs and all(r["status"] == "passed" for r in runs) else EXIT_CANDIDATE_FAILED


def _terminate_as_interrupt() -> None:
    """SIGTERM (a `timeout`, a scheduler) ends a run like Ctrl-C: ranks killed, run interrupted."""
    import signal
    import threading

    if threading.current_thread() is threading.main_thread():
        def handler(signum: int, frame: Any) -> None:
            raise KeyboardInterrupt

        signal.signal(signal.SIGTERM, handler)


class _Progress:
    """One line per finished run on stderr (the table comes at the end); the launcher's warnings
    (another batch on this machine, the database gone) even with --json."""

    def __init__(self, stream: TextIO, total: int, quiet: bool) -> None:
        self.stream, self.total, self.quiet, self.finished = stream, total, quiet, 0
        self.t0 = time.monotonic()

    def __call__(self, event: Any, run_id: int | None) -> None:
        from pkb_tui.engine import events as ev

        if isinstance(event, (ev.SharedMachine, ev.DatabaseLost)):
            self.stream.write(f"pkb-tui: warning: {event.message}.\n")
            self.stream.flush()
            return
        if self.quiet:
            return
        if isinstance(event, ev.RunFinished):
            self.finished += 1
            detail = f" ({event.detail.splitlines()[0][:160]})" if event.detail else ""
            self.stream.write(f"[{self.finished}/{self.total}] run {run_id}: {status_label(event.status)}{detail}\n")
            self.stream.flush()

    def done(self) -> None:
        if not self.quiet:
            self.stream.write(f"finished in {time.monotonic() - self.t0:.1f} s\n")


def _run_summary(run: dict[str, Any]) -> dict[str, Any]:
    """The per-run JSON document of `run --json` and `show --json` (a stable public shape; fields
    are only ever added). median_us / speedup hold the figure of timing_method (eager or graph)."""
    from pkb_tui.engine.modes import CPU_MODE_LABEL

    results = run.get("results", {})
    baseline, candidate = results.get("baseline", {}), results.get("candidate", {})
    keep = ("correct", "trials_passed", "trials_total", "max_abs_error", "max_rel_error", "worst_rank",
            "median_us", "p10_us", "p90_us", "mean_us", "min_us", "max_us", "iterations", "bus_bandwidth_gbps",
            "roofline_floor_us", "roofline_fraction", "roofline_bound", "bandwidth_source",
            "link_bytes_per_iter", "pcie_bytes_per_iter", "traffic_flag", "traffic",
            "timing_method", "rounds", "eager_median_us", "eager_p10_us", "eager_p90_us", "graph_median_us",
            "graph_p10_us", "graph_p90_us", "graph_note", "roofline_latency_us",
            "node_wire")  # per node of a multi-node run: wire bytes per call against the model (None: one node)
    interval = ("speedup_low", "speedup_high", "speedup_eager", "speedup_eager_low", "speedup_eager_high",
                "speedup_graph", "speedup_graph_low", "speedup_graph_high", "speedup_note", "noise_floor_fraction",
                "interval_floor")
    return {
        "id": run["id"], "task": run["task_id"], "model": run["model"], "status": run["status"],
        "status_detail": run.get("status_detail"), "mode": run["mode"], "world_size": run["world_size"],
        "dtype": run["dtype"], "size": run["size"],
        "correct": bool(candidate.get("correct")) if candidate else False,
        "baseline": {k: baseline.get(k) for k in keep} if baseline else None,
        "candidate": {k: candidate.get(k) for k in keep} if candidate else None,
        "speedup": candidate.get("speedup") if candidate else None,
        **{k: candidate.get(k) if candidate else None for k in interval},
        "within_noise": None if not candidate or candidate.get("within_noise") is None else bool(candidate["within_noise"]),
        "speedup_basis": (candidate or baseline or {}).get("timing_method") or "eager",
        "timings_representative": bool(run.get("timings_representative")) and run["mode"] != "cpu",
        "measurement_note": CPU_MODE_LABEL if run["mode"] == "cpu" else None,
        "mps_enabled": None if run.get("mps_enabled") is None else bool(run["mps_enabled"]),
        "notes": run.get("notes") or [], "log_path": run.get("log_path"), "trace_path": run.get("trace_path"),
        "started_at": run.get("started_at"), "finished_at": run.get("finished_at"),
    }


def _speedup_text(speedup: float | None, low: float | None, high: float | None, within_noise: Any = None) -> str:
    """1.52x [1.47, 1.58], "~noise" appended when the host's noise could explain it."""
    if not speedup:
        return "-"
    text = f"{speedup:.2f}x"
    if low is not None and high is not None:
        text += f" [{low:.2f}, {high:.2f}]"
    return text + (" ~noise" if within_noise else "")


def _print_runs_table(runs: list[dict[str, Any]], out: TextIO) -> None:
    basis = {r.get("speedup_basis") or "eager" for r in runs}
    label = f" ({basis.pop()})" if len(basis) == 1 else ""
    header = ("run", "task", "model", "status", "trials", f"baseline µs{label}", "candidate µs", "speedup", "roofline")
    rows = []
    for r in runs:
        b, c = r.get("baseline") or {}, r.get("candidate") or {}
        trials = f"{c.get('trials_passed') or 0}/{c.get('trials_total') or 0}" if c else "-"
        rows.append((
            _run_label(r), r["task"], r["model"], status_label(r["status"]), trials,
            _num(b.get("median_us")), _num(c.get("median_us")),
            _speedup_text(r.get("speedup"), r.get("speedup_low"), r.get("speedup_high"), r.get("within_noise")),
            "cpu: n/a" if r.get("mode") == "cpu" else
            (f"{c['roofline_fraction'] * 100:.1f}%" if c.get("roofline_fraction") is not None else "-"),
        ))
    _print_table(header, rows, out)
    for r in runs:
        if r["status"] not in ("passed",) and r.get("status_detail"):
            out.write(f"run {_run_label(r)} ({r['task']} / {r['model']}): {r['status_detail'].splitlines()[0][:240]}\n")
        if (c_note := (r.get("candidate") or {}).get("graph_note")) and r.get("mode") != "cpu":
            out.write(f"run {_run_label(r)} ({r['task']} / {r['model']}): no graph figure: {c_note}\n")
    _cpu_note(runs, out)
    if any(r.get("within_noise") for r in runs):
        out.write("~noise: the speedup's interval reaches into this host's self-check spread (`pkb-tui calibrate`)\n")


def _run_label(run: dict[str, Any]) -> str:
    """A run's id, or "-" for a run that is in no database (its batch's database went away)."""
    return "-" if run.get("id") is None else str(run["id"])


def _cpu_note(runs: list[dict[str, Any]], out: TextIO) -> None:
    """One line naming the cpu-mode runs: their figures are for development, not a measurement."""
    from pkb_tui.engine.modes import CPU_MODE_LABEL

    cpu = [r for r in runs if r.get("mode") == "cpu"]
    if not cpu:
        return
    ids = [str(r["id"]) for r in cpu if r.get("id") is not None]  # none for runs not stored
    which = f"run{'s' if len(ids) > 1 else ''} {', '.join(ids)}: " if ids else ""
    out.write(f"{CPU_MODE_LABEL} ({which}gloo on a shared CPU; no roofline or bus bandwidth)\n")


def _print_table(header: Sequence[str], rows: Sequence[Sequence[str]], out: TextIO) -> None:
    widths = [max(len(h), *(len(r[i]) for r in rows)) if rows else len(h) for i, h in enumerate(header)]
    numeric = {i for i, h in enumerate(header) if h.endswith(("µs", "speedup", "roofline", "run", "calls"))}
    def line(cells: Sequence[str]) -> str:
        return "  ".join(c.rjust(w) if i in numeric else c.ljust(w) for i, (c, w) in enumerate(zip(cells, widths, strict=True))).rstrip()
    out.write(line(header) + "\n")
    for row in rows:
        out.write(line(row) + "\n")


def _num(value: float | None) -> str:
    if value is None:
        return "-"
    return f"{value:,.1f}" if value < 1e5 else f"{value:,.0f}"


def _split(value: str) -> list[str]:
    return [v.strip() for v in value.split(",") if v.strip()]


def _json_default(value: Any) -> Any:
    return str(value)


# ---------------------------------------------------------------------- listings
def cmd_tasks(args: argparse.Namespace, db: Path | None, out: TextIO) -> int:
    from tasks import all_tasks, broken_tasks

    tasks = [t for t in all_tasks().values() if not args.family or t.spec.family == args.family
             or (args.family == "pkb" and t.spec.family.startswith("pkb-"))]
    for name, why in broken_tasks().items():
        print(f"warning: task module {name} did not load and is left out: {why}", file=sys.stderr)
    if args.family and not tasks:
        raise PkbError(f"No task in family {args.family!r}.")
    if args.traffic:
        return _print_traffic(args, tasks, out)
    if args.json:
        json.dump([{
            "id": t.id, "title": t.spec.title, "family": t.spec.family, "source": t.spec.source, "why": t.spec.why,
            "sizes": list(t.spec.sizes), "dtypes": list(t.spec.dtypes), "modes": list(t.spec.modes),
            "world_sizes": list(t.spec.world_sizes) if t.spec.world_sizes else None,
            "min_world_size": t.spec.min_world_size,
        } for t in tasks], out, indent=2)
        out.write("\n")
        return EXIT_OK
    rows = [(t.id, t.spec.family, ",".join(t.spec.modes), t.spec.source[:70]) for t in tasks]
    _print_table(("task", "family", "modes", "source"), rows, out)
    return EXIT_OK


TRAFFIC_QUANTITIES = ("send_bytes", "recv_bytes", "payload_bytes", "memory_bytes", "flops")


def _print_traffic(args: argparse.Namespace, tasks: list[Any], out: TextIO) -> int:
    """Each task's traffic measured from its baseline's calls (engine/interposer.py) beside its
    hand-written model, the busiest rank's figure for each quantity; '*' marks a difference over
    10% (docs/traffic-audit.md explains them)."""
    from pkb_tui.engine.interposer import MeasureRequest, measure

    ws, dtype, size = args.world_size, args.dtype, args.size
    runnable = []
    for task in tasks:
        try:
            # any mode the task runs in: measuring tolerates calls gloo rejects on argument checks
            task.check_request(world_size=ws, mode=task.spec.modes[0],
                               dtype=dtype if dtype in task.spec.dtypes else task.spec.dtypes[0], size=size)
            runnable.append(task)
        except PkbError as exc:
            out.write(f"{task.id}: not measured: {exc}\n")
    print(f"measuring {len(runnable)} baselines on {ws} gloo ranks ...", file=sys.stderr)
    measured = measure(MeasureRequest(tuple(t.id for t in runnable), ws, dtype, size)) if runnable else {}
    rows, report = [], []
    for task in runnable:
        result = measured[task.id]
        if isinstance(result, str):
            rows.append((task.id, "-", "-", "-", "-", "-", f"not measured: {result[:80]}"))
            continue
        mine = _busiest([m.traffic() for m in result])
        hand = None
        if not task.id.startswith("pkb/"):
            try:
                hand = _busiest([task.traffic(task.context(rank=r, world_size=ws, dtype=dtype, size=size)) for r in range(ws)])
            except Exception as exc:
                hand = None
                report.append(f"{task.id}: hand-written model failed: {type(exc).__name__}: {exc}")
        cells, flags = [], []
        for quantity in TRAFFIC_QUANTITIES:
            m = getattr(mine, quantity)
            h = getattr(hand, quantity) if hand is not None else None
            differs = h is not None and abs(m - h) > 0.10 * max(abs(m), abs(h))
            if differs:
                flags.append(quantity.replace("_bytes", ""))
            cells.append(f"{_si(m)} / {_si(h) if h is not None else '-'}{' *' if differs else ''}")
        rows.append((task.id, *cells, ", ".join(flags)))
        report.append(json.dumps({"task": task.id, "measured": mine.__dict__, "hand_written": hand.__dict__ if hand else None}))
    if args.json:
        json.dump([json.loads(line) for line in report if line.startswith("{")], out, indent=2)
        out.write("\n")
        return EXIT_OK
    out.write(f"traffic per call, busiest rank: measured from the baseline's calls / hand-written model "
              f"({ws} ranks, {dtype}, size {size}; * = differs by more than 10%)\n")
    _print_table(("task", "send", "recv", "payload", "memory", "flops", "differs"), rows, out)
    for line in report:
        if not line.startswith("{"):
            out.write(line + "\n")
    return EXIT_OK


def _busiest(per_rank: list[Any]) -> Any:
    """Per quantity, the largest over ranks (as the launcher's roofline takes it)."""
    from tasks.base import Traffic

    return Traffic(**{q: max(getattr(t, q) for t in per_rank) for q in TRAFFIC_QUANTITIES},
                   bus_factor=per_rank[0].bus_factor, source=per_rank[0].source)


def _si(value: float) -> str:
    for unit, scale in (("G", 1e9), ("M", 1e6), ("K", 1e3)):
        if abs(value) >= scale:
            return f"{value / scale:.3g}{unit}"
    return f"{value:g}"


def cmd_models(args: argparse.Namespace, db: Path | None, out: TextIO) -> int:
    from pkb_tui.engine.solutions import list_models
    from tasks import all_tasks

    task_ids = list(all_tasks())
    models = list_models()
    if args.json:
        json.dump([{
            "name": m.name, "label": m.label, "path": str(m.path) if m.path else None, "manifest": m.manifest,
            "tasks": m.covers(task_ids),
        } for m in models], out, indent=2)
        out.write("\n")
        return EXIT_OK
    rows = [(m.display_name, f"{len(m.covers(task_ids))}/{len(task_ids)}", m.manifest.get("backend", "-"),
             m.manifest.get("provider", "-"), m.manifest.get("model", "-") if m.pkb is not None else "-",
             str(m.path or "(built in)")) for m in models]
    _print_table(("model", "tasks", "backend", "provider", "model slug", "path"), rows, out)
    for m in models:
        if m.manifest.get("notes") and m.path is not None and not m.covers(task_ids):
            out.write(f"note: {m.name}: {m.manifest['notes']}\n")
    return EXIT_OK


def cmd_runs(args: argparse.Namespace, db: Path | None, out: TextIO) -> int:
    from pkb_tui.store import Store

    with Store(db) as store:
        rows = store.runs(task=args.task, model=args.model, status=args.status, limit=args.limit, basis=args.speedup_basis)
    for row in rows:
        row["measurement_note"] = _measurement_note(row["mode"])
        row["speedup_basis"] = args.speedup_basis  # what "speedup" is here: the view's basis, not the run's
    if args.json:
        json.dump(rows, out, indent=2, default=_json_default)
        out.write("\n")
        return EXIT_OK
    table = [(
        str(r["id"]), _when(r["created_at"]), r["task_id"], r["model"], status_label(r["status"]),
        r["mode"], str(r["world_size"]), _num(r["baseline_median_us"]), _num(r["candidate_median_us"]),
        _speedup_text(r.get("speedup"), r.get("speedup_low"), r.get("speedup_high"), r.get("within_noise")),
    ) for r in rows]
    _print_table(("run", "when", "task", "model", "status", "mode", "ranks", "baseline µs", "candidate µs",
                  f"speedup ({args.speedup_basis})"), table, out)
    _cpu_note(rows, out)
    return EXIT_OK


def cmd_board(args: argparse.Namespace, db: Path | None, out: TextIO) -> int:
    from pkb_tui.pkb.board import board_rows, problem_scores
    from pkb_tui.store import Store

    try:
        ks = tuple(int(v) for v in _split(args.k))
        ps = tuple(float(v) for v in _split(args.p))
    except ValueError:
        raise PkbError("--k takes whole numbers and --p numbers, comma separated (e.g. --k 1,5 --p 1,1.5).") from None
    if any(k < 1 for k in ks):
        raise PkbError("--k values must be at least 1.")
    with Store(db) as store:
        scores = problem_scores(store.conn, prefix=args.prefix)
    if args.json:
        json.dump([{
            "model": s.model, "problems": len(s.problems),
            "pass_at": {str(k): s.pass_at(k) for k in ks}, "fast": {str(p): s.fast(p) for p in ps},
            "per_problem": [{"task": p.task_id, "runs": p.runs, "correct_runs": p.correct_runs,
                             "pass_at": {str(k): p.pass_at(k) for k in ks}, "latest_speedup": p.latest_speedup,
                             "fast": {str(q): p.fast(q) for q in ps}} for p in s.problems],
        } for s in scores], out, indent=2)
        out.write("\n")
        return EXIT_OK
    header = ("model", "problems", *(f"pass@{k}" for k in ks), *(f"fast_{p:g}" for p in ps))
    _print_table(header, board_rows(scores, ks, ps), out)
    return EXIT_OK


def _measurement_note(mode: str) -> str | None:
    from pkb_tui.engine.modes import CPU_MODE_LABEL

    return CPU_MODE_LABEL if mode == "cpu" else None


def cmd_show(args: argparse.Namespace, db: Path | None, out: TextIO) -> int:
    from pkb_tui.store import Store
    from pkb_tui.store.store import node_telemetry_line, node_wire_lines

    with Store(db) as store:
        run = store.run(args.run_id, basis=args.speedup_basis)
    summary = _run_summary(run)
    if args.json:
        json.dump({**summary, "trials": run["trial_results"], "kernels": run["kernels"], "host": run["host"],
                   "rank_cpu": run["rank_cpu"], "node_telemetry": run["node_telemetry"]},
                  out, indent=2, default=_json_default)
        out.write("\n")
        return EXIT_OK
    out.write(f"run {run['id']}: {run['task_id']} / {run['model']}  {status_label(run['status'])}\n")
    out.write(f"  {run['mode']} mode, world size {run['world_size']}, {run['dtype']}, size {run['size']}, {run['trials']} trials\n")
    if run.get("status_detail"):
        out.write(f"  detail: {run['status_detail']}\n")
    for note in summary["notes"]:
        out.write(f"  note: {note}\n")
    from pkb_tui.engine.timing import capped_at_alone

    speedup_note = (run["results"].get("candidate") or {}).get("speedup_note")
    if capped_at_alone(speedup_note):
        out.write(f"  speedup: {speedup_note}\n")
    _print_runs_table([summary], out)
    for trial in sorted(run["trial_results"], key=lambda t: (t["trial"] < 0, t["trial"])):
        label = "timed" if trial["trial"] < 0 else str(trial["trial"])
        mark = "✓" if trial["correct"] else "✗"
        err = f"max abs err {trial['max_abs_error']:.3g}" if trial["max_abs_error"] is not None else ""
        out.write(f"  trial {label}: {mark} {err} {trial['message'] or ''}\n")
    if run["kernels"]:
        _print_kernels(run["kernels"], _kernel_limit(args.kernels), out)
    if run["rank_cpu"]:
        out.write("  CPU per rank (mean / peak, 100% = one core): " + ", ".join(
            f"r{r['rank']} {r['mean_pct']:.0f}/{r['max_pct']:.0f}%" for r in run["rank_cpu"]) + "\n")
    for node in run["node_telemetry"]:
        out.write(f"  {node_telemetry_line(node)}\n")
    for line in node_wire_lines(run):
        out.write(f"  {line}\n")
    if run.get("log_path"):
        out.write(f"  log: {run['log_path']}\n")
    from pkb_tui.export import PERFETTO_HINT, trace_files

    traces = trace_files(run.get("trace_path"))
    for variant, path in traces.items():
        out.write(f"  {variant} trace: {path}\n")
    if traces:
        out.write(f"  ({PERFETTO_HINT})\n")
    return EXIT_OK if run["status"] == "passed" else EXIT_CANDIDATE_FAILED


def _kernel_limit(value: str) -> int | None:
    if value == "all":
        return None
    try:
        limit = int(value)
    except ValueError:
        limit = 0
    if limit < 1:
        raise PkbError(f"--kernels takes a positive number or 'all' (got {value!r}).")
    return limit


def _print_kernels(kernels: list[dict[str, Any]], limit: int | None, out: TextIO) -> None:
    """Both variants, every rank: per variant the kernels by total time (over ranks), each row one
    kernel on one rank, so a rank that does other work than its peers shows."""
    from collectors.profiler import PROFILE_CALLS

    ranks = sorted({k["rank"] for k in kernels})
    out.write(f"  kernels: torch.profiler over {PROFILE_CALLS} calls of each variant after timing, on each of "
              f"{len(ranks)} rank(s); calls and total µs are per rank over those calls\n")
    for variant in ("baseline", "candidate"):
        rows_of = [k for k in kernels if k["variant"] == variant]
        if not rows_of:
            continue
        by_name: dict[str, float] = {}
        for k in rows_of:
            by_name[k["name"]] = by_name.get(k["name"], 0.0) + (k["total_us"] or 0.0)
        names = sorted(by_name, key=lambda n: -by_name[n])
        shown = names if limit is None else names[:limit]
        rows = [
            (variant, str(k["rank"]), k["category"], k["name"][:60], str(k["calls"]), _num(k["total_us"]))
            for name in shown for k in sorted((k for k in rows_of if k["name"] == name), key=lambda k: k["rank"])
        ]
        _print_table(("variant", "rank", "category", "kernel", "calls", "total µs"), rows, out)
        if len(shown) < len(names):
            out.write(f"  ({len(names) - len(shown)} more {variant} kernel(s): --kernels all shows them)\n")


def cmd_import(args: argparse.Namespace, db: Path | None, out: TextIO) -> int:
    from pkb_tui.store import Store, default_db_path
    from pkb_tui.store.recovery import import_recovery, read_only_database_sentence, read_recovery

    batch = read_recovery(args.file)  # a missing or foreign file is refused before any database is touched
    target = db or default_db_path()
    if (sentence := read_only_database_sentence(Path(target), "imported")) is not None:
        raise PkbError(sentence)
    with Store(target) as store:
        summary = import_recovery(batch, store)
    if summary.torn_last_line:
        print(f"pkb-tui: warning: the last line of {args.file} was cut off (the batch was killed while writing it) "
              "and was left out; every line before it was imported.", file=sys.stderr)
    if args.json:
        json.dump({"file": str(args.file), "db": str(target), "batch_id": summary.batch_id, "run_ids": summary.run_ids,
                   "added": summary.added, "already_there": summary.updated, "samples_added": summary.samples_added,
                   "torn_last_line": summary.torn_last_line}, out, indent=2)
        out.write("\n")
        return EXIT_OK
    ids = ", ".join(map(str, summary.run_ids)) or "none"
    out.write(f"imported batch {summary.batch_id} from {args.file} into {target}: {summary.added} run(s) added, "
              f"{summary.updated} already there (brought up to date), {summary.samples_added} telemetry sample(s) "
              f"added; run ids {ids} (`pkb-tui show RUN_ID`)\n")
    return EXIT_OK


def cmd_rm(args: argparse.Namespace, db: Path | None, out: TextIO) -> int:
    from pkb_tui.store import Store

    with Store(db) as store:
        deleted = store.delete_runs(args.run_ids)
    missing = sorted(set(args.run_ids) - set(deleted))
    if deleted:
        out.write(f"deleted run(s) {', '.join(map(str, deleted))}\n")
    if missing:
        raise PkbError(f"There is no run {', '.join(map(str, missing))} in {db or 'runs.db'}; `pkb-tui runs` lists them.")
    return EXIT_OK


def _when(ts: float | None) -> str:
    return dt.datetime.fromtimestamp(ts).strftime("%Y-%m-%d %H:%M") if ts else "-"


def cmd_monitor(args: argparse.Namespace, db: Path | None, out: TextIO) -> int:
    from collectors.monitor import monitor_command
    from pkb_tui.store import default_db_path

    return monitor_command(str(db or default_db_path()), args.duration, args.interval, args.json, args.record, out=out,
                           prometheus=args.prometheus)


def _moment(text: str | None, flag: str) -> float | None:
    if text is None:
        return None
    try:
        return dt.datetime.fromisoformat(text).timestamp()
    except ValueError:
        raise PkbError(f"{flag} takes a date like 2026-12-01 or 2026-12-01T14:30, not {text!r}.") from None


def cmd_export(args: argparse.Namespace, db: Path | None, out: TextIO) -> int:
    from pkb_tui.export import export
    from pkb_tui.store import default_db_path

    try:
        run_ids = [int(v) for v in _split(args.run)] if args.run else None
    except ValueError:
        raise PkbError(f"--run takes run ids separated by commas, not {args.run!r}.") from None
    written = export(
        db or default_db_path(), args.out, tables=_split(args.tables), fmt=args.format, limit=args.limit,
        task=args.task, model=args.model, status=args.status, run_ids=run_ids,
        since=_moment(args.since, "--since"), until=_moment(args.until, "--until"),
    )
    if args.json:
        json.dump([{"table": w.table, "path": str(w.path), "rows": w.rows} for w in written], out, indent=2)
        out.write("\n")
    else:
        _print_table(("table", "rows", "file"), [(w.table, str(w.rows), str(w.path)) for w in written], out)
    return EXIT_OK


def cmd_query(args: argparse.Namespace, db: Path | None, out: TextIO) -> int:
    from pkb_tui.export import run_query, schema
    from pkb_tui.store import default_db_path

    path = db or default_db_path()
    if args.schema:
        tables = schema(path)
        if args.json:
            json.dump(tables, out, indent=2)
            out.write("\n")
        else:
            for name, info in tables.items():
                out.write(f"{info['kind']} {name}: " + ", ".join(f"{c} {t}".strip() for c, t in info["columns"].items()) + "\n")
        return EXIT_OK
    if not args.sql:
        raise PkbError('Give a SQL statement, e.g. pkb-tui query "SELECT * FROM run_results LIMIT 5", or --schema.')
    columns, rows = run_query(path, args.sql)
    if args.json:
        json.dump(rows, out, indent=2, default=_json_default)
        out.write("\n")
    else:
        _print_table(columns, [tuple(_cell(row[c]) for c in columns) for row in rows], out)
    return EXIT_OK


def _cell(value: Any) -> str:
    if value is None:
        return "NULL"
    if isinstance(value, float):
        return f"{value:.6g}"
    return str(value).replace("\n", " ")


def cmd_calibrate(args: argparse.Namespace, db: Path | None, out: TextIO) -> int:
    from pkb_tui.engine.calibrate import calibrate_command
    from pkb_tui.store import default_db_path

    if args.noise_tasks is not None and (args.no_noise or args.network):
        raise PkbError("--noise-tasks picks the noise floor's self-check tasks; leave it out with "
                       f"{'--no-noise' if args.no_noise else '--network'}.")
    if args.network:
        return _calibrate_network(args, db, out)
    if args.nnodes != 1 or args.slurm or args.node_rank or args.rdzv_endpoint:
        raise PkbError("The node options (--nnodes, --node-rank, --rdzv-endpoint, --slurm) of `calibrate` are for "
                       "--network; this host's own figures are measured on one node.")
    if args.timeout is not None:
        raise PkbError("--timeout bounds the --network measurement; this host's own figures have their own time "
                       "limits. Leave --timeout out, or add --network.")
    return calibrate_command(str(db or default_db_path()), args.json, args.quick, out=out, noise=not args.no_noise,
                             noise_only=args.noise_only, noise_tasks=args.noise_tasks)


def _calibrate_network(args: argparse.Namespace, db: Path | None, out: TextIO) -> int:
    """`calibrate --network`: the head gathers the nodes and stores a row per pair of hosts; on
    another node (--node-rank R > 0) this process is that node's agent, as with `run`."""
    from pkb_tui.engine import netcal
    from pkb_tui.engine.launcher import NETWORK_NEEDS_NODES, Launcher
    from pkb_tui.engine.modes import choose_mode
    from pkb_tui.store import Store

    if args.noise_only:
        raise PkbError("--noise-only measures this host's noise floor; leave it out with --network.")
    if not args.slurm and args.nnodes < 2:
        raise PkbError(NETWORK_NEEDS_NODES)
    timeout_s = 600.0 if args.timeout is None else args.timeout
    if timeout_s <= 0:
        raise PkbError(f"--timeout must be positive (got {args.timeout}).")
    cluster = _cluster(args)
    if cluster is None:
        return _agent_of_run(args)
    if not cluster.multi_node:  # --slurm in a one-node allocation
        raise PkbError(NETWORK_NEEDS_NODES)
    mode = choose_mode(1, None if args.mode == "auto" else args.mode)
    spec = {"mode": mode, "sizes": list(netcal.sizes_for(mode, args.quick)), "repeats": netcal.REPEATS,
            "timeout_s": timeout_s}
    launcher = Launcher(db, runs_dir=args.runs_dir, cluster=cluster)
    with Store(launcher.db_path):  # a bad --db fails here, before any node is asked to start
        pass
    _terminate_as_interrupt()
    say = None if args.json else (lambda text: print(f"  measuring {text} ...", file=sys.stderr, flush=True))
    report = launcher.calibrate_network(spec, progress=say)
    rows = netcal.pair_rows(report)
    if not rows:
        raise PkbError("The network calibration reported no complete pair (see the nodes' launch.log).",
                       exit_code=EXIT_HARNESS)
    with Store(launcher.db_path) as store:
        for row in rows:
            store.add_calibration(store.upsert_host({"hostname": row["host_a"]}), [row])
        database = str(store.path)
    if args.json:
        json.dump({"db": database, "mode": mode, "nodes": report.get("nodes"), "pairs": rows}, out, indent=2)
        out.write("\n")
        return EXIT_OK
    out.write(netcal.format_pairs(rows) + "\n")
    out.write(f"\nStored per pair of hosts in {database} ({mode} mode: "
              f"{'gloo over TCP' if mode == 'cpu' else 'NCCL, GPU 0 of each node'}); multi-node runs across these "
              "hosts now judge their network term against the slowest pair.\n")
    return EXIT_OK


COMMANDS = {
    "run": cmd_run, "tasks": cmd_tasks, "models": cmd_models, "runs": cmd_runs, "show": cmd_show, "rm": cmd_rm,
    "import": cmd_import,
    "board": cmd_board, "agent": cmd_agent,
    "monitor": cmd_monitor, "calibrate": cmd_calibrate, "export": cmd_export, "query": cmd_query,
}


def _generate_commands() -> None:
    from pkb_tui.generate.cli import COMMANDS as GENERATE_COMMANDS

    COMMANDS.update(GENERATE_COMMANDS)


_generate_commands()


if __name__ == "__main__":
    sys.exit(main())
