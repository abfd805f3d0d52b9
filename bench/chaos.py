"""kill -9 anywhere: batches on one database, each with one of its processes SIGKILLed at a seeded
random moment (the launcher, a judge, a candidate's runner, torchrun). After each kill:

- the database passes PRAGMA integrity_check;
- once the database is opened again, every run of that batch is finished, interrupted or cancelled
  (none left "running" or "pending");
- within LEFTOVER_WAIT_S no process of the batch is left (judges, fork servers, runners, torchrun);

and at the end a new batch on the same database passes.

    python bench/chaos.py --moments 100 --seed 1 [--workdir DIR]

Prints one line per moment and a summary; exit 1 if any check failed. tests/test_chaos.py runs
four moments (one per victim) on CPU.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import sqlite3
import subprocess
import sys
import tempfile
import time
from contextlib import closing
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

VICTIMS = ("launcher", "judge", "runner", "torchrun")
FINISHED = {"passed", "failed", "error", "timeout", "interrupted", "cancelled"}
LEFTOVER_WAIT_S = 30.0


@dataclass
class Moment:
    index: int
    victim: str
    delay_s: float
    killed: str = ""  # what was killed (pid and what it was), or why nothing was
    problems: list[str] = field(default_factory=list)
    statuses: list[str] = field(default_factory=list)
    took_s: float = 0.0


def _cmdline(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def _cwd(pid: int) -> str:
    try:
        return os.readlink(f"/proc/{pid}/cwd")
    except OSError:
        return ""


def processes_of(runs_dir: Path, launcher_pid: int | None = None) -> dict[int, str]:
    """The batch's processes: the launcher, torchrun and the judges (their command lines name the
    runs folder), fork servers and runners (their working folders are in it)."""
    found = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        pid = int(entry)
        if pid == os.getpid():
            continue
        cmd = _cmdline(pid)
        if pid == launcher_pid and cmd:
            found[pid] = "launcher"
        elif str(runs_dir) in cmd and "torch.distributed.run" in cmd:
            found[pid] = "torchrun"
        elif str(runs_dir) in cmd and "pkb_tui.engine.worker" in cmd:
            found[pid] = "judge"
        elif _cwd(pid).startswith(str(runs_dir)) and "pkb_tui" in cmd:
            found[pid] = "fork server" if _cwd(pid).rstrip("/").endswith("scratch") else "runner"
    return found


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(") ", 1)[1][:1] not in ("Z", "X")
    except OSError:
        return False


def start_batch(db: Path, runs_dir: Path, models: str, timing: bool = True) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, "-m", "pkb_tui.cli", "--db", str(db), "run", "--task", "all_reduce,all_gather",
         "--model", models, "--world-size", "2", "--trials", "2", "--iterations", "4", "--warmup", "1",
         "--no-profile", "--timeout", "300", "--runs-dir", str(runs_dir), "--json", *([] if timing else ["--no-timing"])],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=str(ROOT), start_new_session=True,
    )


def run_moment(moment: Moment, db: Path, runs_dir: Path, models: str, timing: bool = True) -> None:
    runs_dir.mkdir(parents=True, exist_ok=True)
    cli = start_batch(db, runs_dir, models, timing)
    end = time.monotonic() + moment.delay_s
    victim_pid = None
    while time.monotonic() < end or victim_pid is None:
        if cli.poll() is not None:
            moment.killed = f"nothing: the batch ended first (exit {cli.returncode})"
            break
        candidates = [pid for pid, kind in processes_of(runs_dir, cli.pid).items() if kind == moment.victim]
        if time.monotonic() >= end and candidates:
            victim_pid = random.Random(moment.index).choice(sorted(candidates))
            break
        if time.monotonic() > end + 60:
            moment.killed = f"nothing: no {moment.victim} appeared within 60 s of the moment"
            break
        time.sleep(0.05)
    if victim_pid is not None:
        try:
            os.kill(victim_pid, signal.SIGKILL)
            moment.killed = f"{moment.victim} pid {victim_pid}"
        except ProcessLookupError:
            moment.killed = f"nothing: the {moment.victim} pid {victim_pid} had just ended"
    try:
        cli.wait(timeout=900)
    except subprocess.TimeoutExpired:
        moment.problems.append("the launcher did not end within 900 s of the kill")
        cli.kill()
        cli.wait()
    deadline = time.monotonic() + LEFTOVER_WAIT_S
    while (left := {p: k for p, k in processes_of(runs_dir).items() if _alive(p)}) and time.monotonic() < deadline:
        time.sleep(0.2)
    if left:
        moment.problems.append(f"left running {LEFTOVER_WAIT_S:g} s after: {sorted(left.items())}")
        for pid in left:
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
    check_database(db, moment)


def check_database(db: Path, moment: Moment) -> None:
    with closing(sqlite3.connect(str(db), timeout=30)) as conn:
        result = conn.execute("PRAGMA integrity_check").fetchone()[0]
        if result != "ok":
            moment.problems.append(f"integrity_check: {result}")
    from pkb_tui.store import Store

    Store(db).close()  # the next open marks what a dead launcher left running
    with closing(sqlite3.connect(str(db), timeout=30)) as conn:
        rows = conn.execute("SELECT id, status FROM runs WHERE batch_id = (SELECT batch_id FROM runs "
                            "ORDER BY id DESC LIMIT 1)").fetchall()
    moment.statuses = [status for _, status in rows]
    unfinished = [(run_id, status) for run_id, status in rows if status not in FINISHED]
    if unfinished:
        moment.problems.append(f"runs not finished after reopening: {unfinished}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--moments", type=int, default=100)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--workdir", type=Path, default=None)
    parser.add_argument("--max-delay-s", type=float, default=25.0)
    parser.add_argument("--models", default="baseline")
    parser.add_argument("--no-timing", action="store_true", help="correctness only (kills land in the trials)")
    parser.add_argument("--victims", default=",".join(VICTIMS), help="which processes may be killed")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="pkb-chaos-"))
    db = workdir / "runs.db"
    rng = random.Random(args.seed)
    moments = []
    victims = [v for v in args.victims.split(",") if v in VICTIMS]
    for i in range(args.moments):
        victim = victims[i % len(victims)] if args.moments <= len(victims) else rng.choice(victims)
        moment = Moment(i, victim, round(rng.uniform(1.0, args.max_delay_s), 2))
        t0 = time.monotonic()
        run_moment(moment, db, workdir / "runs", args.models, not args.no_timing)
        moment.took_s = round(time.monotonic() - t0, 1)
        moments.append(moment)
        verdict = "ok" if not moment.problems else "PROBLEM: " + "; ".join(moment.problems)
        print(f"{i:3d} {moment.victim:9s} at {moment.delay_s:5.2f} s  killed {moment.killed:32s} "
              f"runs {','.join(moment.statuses)}  ({moment.took_s:.0f} s)  {verdict}", flush=True)
    final = Moment(len(moments), "none", 0.0)
    cli = start_batch(db, workdir / "runs", args.models, not args.no_timing)
    code = cli.wait(timeout=900)
    check_database(db, final)
    if code != 0 or any(s != "passed" for s in final.statuses):
        final.problems.append(f"a new batch after the kills: exit {code}, statuses {final.statuses}")
    bad = [m for m in [*moments, final] if m.problems]
    print(f"{len(moments)} kills, {sum(1 for m in moments if m.killed.startswith(tuple(VICTIMS)))} landed; "
          f"new batch after them: {','.join(final.statuses)} (exit {code}); problems: {len(bad)}")
    if args.json:
        print(json.dumps([m.__dict__ for m in [*moments, final]]))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
