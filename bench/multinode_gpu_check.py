"""Two nodes on one box (issue 16): the head and a second agent on 127.0.0.1, --nnodes 2.

    python bench/multinode_gpu_check.py [--mode shared-gpu|cpu] [--ranks-per-node 1|2] [--out DIR]
                                        [--budget-s 200] [--tasks ...] [--models baseline,torch-p2p] [--mps]

What the CPU test (tests/test_multinode.py) does, on a GPU box with one GPU: node 1 is `pkb-tui agent`
in a folder of its own; the head runs in this process (engine.launcher.Launcher with a two-node
Cluster: the dashboard's own path), every rank on the one GPU (shared-gpu mode), the eight
collectives, baseline and torch-p2p, size small, one trial. Prints each run's verdict and timings,
each run's per-node telemetry and wire lines (GPU links and NICs against the traffic model), and
Live's per-node rendering: the batch's own events (as the launcher passed them on) replayed into
the Textual app headless at the last node status seen while a run was going; the SVG is saved as
OUT/live_nodes.svg, the text as OUT/live_nodes.txt; everything as OUT/multinode_check.json, the
events the app was told as OUT/events.jsonl.

Bounded: the batch is cancelled at --budget-s (runs not done are recorded as interrupted or
cancelled and the figures so far still print), each run has a 60 s timeout, node 1's agent is
killed (by its pid) at the end, and a watchdog ends this process at budget + 90 s whatever hangs.
--mode cpu runs the same on a machine without a GPU.

MPS is off unless --mps: the agent on node 1 starts no MPS daemon, so with --mps only the head's
ranks would be MPS clients, beside node 1's plain CUDA processes on the same GPU (untested mix).
"""

from __future__ import annotations

import argparse
import asyncio
import faulthandler
import io
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from pkb_tui.engine import events as ev  # noqa: E402
from pkb_tui.engine.launcher import Cluster, Launcher  # noqa: E402
from pkb_tui.engine.nodes import SAFE_ENV, free_port  # noqa: E402
from pkb_tui.engine.request import RunRequest  # noqa: E402
from pkb_tui.store import Store  # noqa: E402
from pkb_tui.store.store import node_telemetry_line, node_wire_lines  # noqa: E402

COLLECTIVES = "all_reduce,all_gather,reduce_scatter,all_to_all,broadcast,reduce,gather,scatter"


def start_agent(folder: Path, port: int, key: bytes) -> subprocess.Popen[bytes]:
    env = {**os.environ, **SAFE_ENV, "PKB_JOIN_KEY": key.hex(), "PYTHONUNBUFFERED": "1",
           "PYTHONPATH": os.pathsep.join([str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])])}
    folder.mkdir(parents=True, exist_ok=True)
    log = open(folder / "agent.log", "wb")
    return subprocess.Popen([sys.executable, "-m", "pkb_tui.cli", "agent", "--node-rank", "1",
                             "--rdzv-endpoint", f"127.0.0.1:{port}"], cwd=folder, env=env, stdout=log,
                            stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)


def stop_agent(agent: subprocess.Popen[bytes]) -> int | None:
    """The agent ends by itself once the head says done; else it is stopped (SIGTERM, then SIGKILL)."""
    try:
        return agent.wait(timeout=20)
    except subprocess.TimeoutExpired:
        agent.send_signal(signal.SIGTERM)
    try:
        return agent.wait(timeout=10)
    except subprocess.TimeoutExpired:
        agent.kill()
        return agent.wait(timeout=10)


def live_moment(recorded: list[tuple[ev.Event, int | None]]) -> int | None:
    """The index of the last NodeStatus seen while a run was going (else the last one at all)."""
    running: set[int] = set()
    last_running = last_any = None
    for index, (event, _) in enumerate(recorded):
        if isinstance(event, ev.RunStarted):
            running.add(event.item)
        elif isinstance(event, ev.RunFinished):
            running.discard(event.item)
        elif isinstance(event, ev.NodeStatus):
            last_any = index
            if running:
                last_running = index
    return last_running if last_running is not None else last_any


def render_live(recorded: list[tuple[ev.Event, int | None]], items: list[tuple[str, str]], request: RunRequest,
                db: Path, out: Path, size: tuple[int, int] = (120, 36)) -> str | None:
    """Replay the batch's events into the app (the messages its batch thread posts) up to the
    chosen node status, show Live headless; save the SVG, return the screen as text."""
    from rich.console import Console

    from pkb_tui.app import PkbApp
    from pkb_tui.app.config import AppConfig
    from pkb_tui.app.messages import BatchBegan, EngineEvent

    moment = live_moment(recorded)
    if moment is None:
        return None
    status = recorded[moment][0]
    assert isinstance(status, ev.NodeStatus)
    config = AppConfig(db_path=db, runs_dir=out / "replay-runs", clock=lambda: status.ts, utc=True, telemetry=None,
                       contention_check=None)
    app = PkbApp(config=config)

    async def main() -> str:
        async with app.run_test(size=size) as pilot:
            await pilot.app.workers.wait_for_complete()
            app.batch.busy = True
            app.post_message(BatchBegan(items, request))
            for event, run_id in recorded[:moment + 1]:
                app.post_message(EngineEvent(event, run_id))
            await pilot.pause(0.2)
            await pilot.press("v")
            await pilot.pause(0.8)
            (out / "live_nodes.svg").write_text(app.export_screenshot(title="pkb-tui Live, two nodes"))
            width, height = app.size
            console = Console(width=width, height=height, file=io.StringIO(), force_terminal=True, record=True,
                              color_system="truecolor", legacy_windows=False, safe_box=False)
            console.print(app.screen._compositor.render_update(full=True, screen_stack=app._background_screens))
            return console.export_text()

    text = asyncio.run(main())
    (out / "live_nodes.txt").write_text(text)
    return text


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--mode", default="shared-gpu", choices=["shared-gpu", "cpu", "nccl"])
    parser.add_argument("--ranks-per-node", type=int, default=1, choices=[1, 2])
    parser.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", "/tmp/pkb-multinode")))
    parser.add_argument("--budget-s", type=float, default=200.0, help="cancel the batch after this long")
    parser.add_argument("--tasks", default=COLLECTIVES)
    parser.add_argument("--models", default="baseline,torch-p2p")
    parser.add_argument("--iterations", type=int, default=20)
    parser.add_argument("--mps", action="store_true", help="let the head start its MPS daemon (node 1 starts none)")
    args = parser.parse_args()
    out = args.out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    # Whatever hangs, this process ends and says where it was.
    faulthandler.dump_traceback_later(args.budget_s + 90, exit=True)
    if args.mode == "cpu":
        os.environ["PKB_FORCE_CPU"] = "1"
    os.environ.update(SAFE_ENV)

    head, other = out / "node0", out / "node1"
    head.mkdir(exist_ok=True)
    db = head / "runs.db"
    port = free_port()
    key = os.urandom(32)
    cluster = Cluster(nnodes=2, rdzv_endpoint=f"127.0.0.1:{port}", join_key=key, node_timeout_s=20.0, join_timeout_s=60.0)
    request = RunRequest(tasks=args.tasks.split(","), models=args.models.split(","), world_size=2 * args.ranks_per_node,
                         mode=args.mode, size="small", trials=1, timeout_s=60.0, iterations=args.iterations, profile=False)
    launcher = Launcher(db, runs_dir=head / "pkb-runs", cluster=cluster)
    if not args.mps:
        launcher._start_mps = lambda mode: None  # type: ignore[method-assign]  # see the docstring
    items = [(i.task, i.model) for i in launcher.plan(request)]
    recorded: list[tuple[ev.Event, int | None]] = []
    cancel = threading.Event()
    timer = threading.Timer(args.budget_s, cancel.set)
    timer.daemon = True
    print(f"=== two nodes on 127.0.0.1: {args.mode}, {args.ranks_per_node} rank(s) per node, {len(items)} runs, "
          f"budget {args.budget_s:.0f} s; out {out}", flush=True)
    agent = start_agent(other, port, key)
    started = time.monotonic()
    timer.start()
    outcome = None
    try:
        outcome = launcher.run(request, on_event=lambda event, run_id: recorded.append((event, run_id)), cancel=cancel)
    finally:
        timer.cancel()
        agent_code = stop_agent(agent)
    wall_s = time.monotonic() - started
    print(f"--- batch: {wall_s:.0f} s{' (cancelled at the budget)' if cancel.is_set() else ''}; agent exit {agent_code}",
          flush=True)

    report: dict[str, Any] = {"mode": args.mode, "ranks_per_node": args.ranks_per_node, "wall_s": wall_s,
                              "cancelled": cancel.is_set(), "agent_exit": agent_code, "runs": []}
    statuses = {}
    with Store(db) as store:
        for run_id in outcome.run_ids if outcome else []:
            run = store.run(run_id)
            base, cand = run["results"].get("baseline", {}), run["results"].get("candidate", {})
            statuses[run_id] = run["status"]
            median = (f"base {base.get('median_us') or 0:9.1f} us  cand {cand.get('median_us') or 0:9.1f} us  "
                      f"speedup {cand.get('speedup') or 0:.2f}x" if cand.get("median_us") else "no timing")
            print(f"run {run_id:3d} {run['task_id']:<15} {run['model']:<10} {run['status']:<11} {median}"
                  + (f"  [{(run.get('status_detail') or '')[:160]}]" if run["status"] != "passed" else ""))
            for node in run["node_telemetry"]:
                print(f"      {node_telemetry_line(node)}")
            for line in node_wire_lines(run):
                print(f"      {line}")
            report["runs"].append({
                "id": run_id, "task": run["task_id"], "model": run["model"], "status": run["status"],
                "status_detail": run.get("status_detail"), "baseline_median_us": base.get("median_us"),
                "candidate_median_us": cand.get("median_us"), "speedup": cand.get("speedup"),
                "node_telemetry": run["node_telemetry"], "node_wire": {v: run["results"].get(v, {}).get("node_wire")
                                                                       for v in ("baseline", "candidate")},
                "notes": run.get("notes"),
            })
    with open(out / "events.jsonl", "w") as f:  # what the app was told, in order (a replay fixture)
        for event, event_run in recorded:
            f.write(json.dumps({"run_id": event_run, **json.loads(event.to_json())}) + "\n")
    node_status = [e for e, _ in recorded if isinstance(e, ev.NodeStatus)]
    report["node_status_events"] = len(node_status)
    report["last_node_status"] = node_status[-1].nodes if node_status else None
    print(f"--- {len(node_status)} node status events from the head")
    try:
        text = render_live(recorded, items, request, db, out)
    except Exception as exc:  # noqa: BLE001  (the figures above still stand)
        text = None
        print(f"--- Live could not be rendered: {exc!r}")
    if text is not None:
        print("=== Live, per node (replayed; SVG in live_nodes.svg)")
        print(text)
    (out / "multinode_check.json").write_text(json.dumps(report, indent=2, default=str))
    passed = sum(1 for s in statuses.values() if s == "passed")
    print(f"=== {passed}/{len(items)} runs passed; report {out / 'multinode_check.json'}")
    return 0 if statuses and passed == len(items) else 1


if __name__ == "__main__":
    sys.exit(main())
