"""What a candidate may take of the machine (engine.limits), on CPU with two real ranks.

Each fixture under tests/fixtures/containment/ gives the right answer and abuses the machine:
memory held in the runner, memory held by a daemon that escaped the runner's process tree,
threads by the hundred, output by the tens of MiB. The limits end the first three with a verdict
that names the limit; the flood passes with its log cut to its head and tail; nothing of the batch
is left running.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

from pkb_tui.engine.sandbox import landlock_abi
from tests.conftest import fixture_model

CONTAINMENT = Path(__file__).parent / "fixtures" / "containment"
ROOT = Path(__file__).resolve().parents[1]
HONEST = ROOT / "solutions" / "torch-p2p"


def _processes_under(folder: Path) -> list[str]:
    """Processes whose working directory is inside ``folder`` (runners work in its scratch)."""
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                cwd = os.readlink(f"/proc/{entry}/cwd")
            except OSError:
                continue
            if cwd.startswith(str(folder)):
                found.append(f"{entry}: {cwd}")
    return found


@pytest.mark.timeout(1200)
def test_limits_end_abusive_candidates_with_a_verdict_that_names_the_limit(cli, tmp_db: Path, tmp_path: Path) -> None:
    runs_dir = tmp_path / "runs"
    abusers = ("memory-hog", "thread-bomb", "escaped-hog", "flood", "escape-attempts")
    models = ",".join([*(str(CONTAINMENT / name) for name in abusers), str(HONEST)])
    result = cli("run", "--task", "all_reduce", "--model", models, "--world-size", "2", "--size", "small",
                 "--trials", "2", "--no-timing", "--no-profile", "--timeout", "300", "--runs-dir", str(runs_dir),
                 "--max-host-memory-gib", "1", "--max-tasks", "150", "--json")
    runs = {r["model"]: r for r in result.json()["runs"]}
    for name in ("memory-hog", "escaped-hog"):
        assert runs[name]["status"] == "error", runs[name]
        assert "exceeded its host-memory limit" in runs[name]["status_detail"], runs[name]["status_detail"]
        assert "> 1.0 GiB" in runs[name]["status_detail"], runs[name]["status_detail"]
    assert runs["thread-bomb"]["status"] == "error", runs["thread-bomb"]
    assert "exceeded its limit of 150 threads and processes" in runs["thread-bomb"]["status_detail"]
    assert runs["torch-p2p"]["status"] == "passed", runs["torch-p2p"]
    # Every write outside its scratch and its own caches refused, every capability gone (root or not).
    if landlock_abi() > 0:
        assert runs["escape-attempts"]["status"] == "passed", runs["escape-attempts"]["status_detail"]
    else:
        assert "escaped the sandbox" in runs["escape-attempts"]["status_detail"]

    # The flood is right, so it passes; its log keeps the first and the last MiB and says what went.
    assert runs["flood"]["status"] == "passed", runs["flood"]
    (batch,) = [p for p in runs_dir.iterdir() if p.is_dir()]
    logs = sorted(batch.glob("item003.rank0.candidate.log"))
    assert logs, sorted(p.name for p in batch.iterdir())
    text = logs[0].read_text(errors="replace")
    assert logs[0].stat().st_size < 3 * 2**20, logs[0].stat().st_size
    assert "FLOOD-FIRST-LINE" in text and "bytes of output dropped here" in text
    assert "FLOOD-LAST-LINE call 2" in text.rsplit("bytes of output dropped here", 1)[1]
    total = sum(p.stat().st_size for p in batch.rglob("*") if p.is_file())
    assert total < 32 * 2**20, total  # 48 MiB printed per rank, a few MiB kept in all

    # Nothing of the batch runs on: not the runners, not the daemon that escaped.
    assert _processes_under(runs_dir) == []
    notes = runs["torch-p2p"]["notes"]
    assert any("limits per candidate and rank: 1.0 GiB of host memory, 150 threads" in n for n in notes), notes


@pytest.mark.timeout(600)
def test_a_helper_in_a_session_of_its_own_is_stopped_whenever_its_runner_is(cli, tmp_db: Path, tmp_path: Path) -> None:
    """A runner is stopped between commands (its process group); a helper it started with setsid
    and a double fork is outside that group. It must be stopped with it, or it works on through
    the baseline's timed blocks. The fixture's helper and a thread of its runner each count the
    time they were awake; stopped together, the two counts agree (measured here: 0.331 s against
    0.325 s); with only the group stopped the helper counted 0.676 s against 0.266 s."""
    runs_dir = tmp_path / "runs"
    result = cli("run", "--task", "all_reduce", "--model", str(CONTAINMENT / "escaped-worker"), "--world-size", "1",
                 "--size", "small", "--trials", "1", "--no-profile", "--timeout", "300", "--runs-dir", str(runs_dir),
                 "--json")
    (run,) = result.json()["runs"]
    assert run["status"] == "passed", run
    assert run["speedup"] is not None  # timed: the baseline's blocks ran while the candidate was stopped
    (log,) = runs_dir.glob("*/item000.rank0.candidate.log")
    lines = [line.split() for line in log.read_text().splitlines() if line.startswith("AWAKE ")]
    assert len(lines) > 20, len(lines)  # checked calls and timed blocks
    runner, helper = (float(field.split("=")[1]) for field in lines[-1][1:])
    assert runner > 0.05, lines[-1]
    assert helper <= 1.25 * runner + 0.05, f"the helper was awake {helper:.3f} s, its runner {runner:.3f} s"
    assert _processes_under(runs_dir) == []


@pytest.mark.timeout(600)
def test_a_runner_without_its_sandbox_says_so_in_the_runs_notes(cli, tmp_db: Path, monkeypatch) -> None:
    monkeypatch.setenv("PKB_SANDBOX", "0")
    result = cli("run", "--task", "all_reduce", "--model", str(HONEST), "--world-size", "1", "--size", "small",
                 "--trials", "1", "--no-timing", "--no-profile", "--timeout", "300", "--json")
    (run,) = result.json()["runs"]
    assert run["status"] == "passed", run
    assert "the candidate's sandbox on rank 0: no write sandbox: PKB_SANDBOX=0" in run["notes"], run["notes"]


def _judges_of(runs_dir: Path) -> list[int]:
    """The judge processes (torchrun's ranks) of batches under ``runs_dir``."""
    pids = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/cmdline", "rb") as f:
                    cmdline = f.read().decode(errors="replace")
            except OSError:
                continue
            if "pkb_tui.engine.worker" in cmdline and str(runs_dir) in cmdline and "torch.distributed.run" not in cmdline:
                pids.append(int(entry))
    return sorted(pids)


def _start_hung_batch(tmp_path: Path) -> tuple[subprocess.Popen[str], Path, list[int]]:
    """A CLI batch whose candidate spins forever; returns once both judges are up."""
    runs_dir = tmp_path / "runs"
    cli = subprocess.Popen(
        [sys.executable, "-m", "pkb_tui.cli", "--db", str(tmp_path / "runs.db"), "run", "--task", "all_reduce",
         "--model", fixture_model("hang"), "--world-size", "2", "--trials", "1", "--no-timing", "--no-profile",
         "--timeout", "600", "--runs-dir", str(runs_dir), "--json"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=str(ROOT),
    )
    deadline = time.monotonic() + 300
    while not _run_is_running(tmp_path / "runs.db"):
        if cli.poll() is not None or time.monotonic() > deadline:
            cli.kill()
            raise AssertionError(f"the run did not start: {cli.communicate()}")
        time.sleep(0.5)
    judges = _judges_of(runs_dir)
    if len(judges) != 2:
        cli.kill()
        raise AssertionError(f"two judges expected: {judges}")
    return cli, runs_dir, judges


def _run_is_running(db: Path) -> bool:
    try:
        with contextlib.closing(sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=5)) as conn:
            return conn.execute("SELECT status FROM runs").fetchall() == [("running",)]
    except sqlite3.Error:
        return False


@pytest.mark.timeout(600)
def test_a_stopped_judge_ends_the_launch_with_a_sentence_that_says_so(tmp_path: Path) -> None:
    cli, runs_dir, judges = _start_hung_batch(tmp_path)
    os.kill(judges[1], signal.SIGSTOP)  # what a candidate without Landlock's signal scoping could do
    try:
        out, err = cli.communicate(timeout=240)
    finally:
        for pid in judges:
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGCONT)
        cli.kill()
    (run,) = json.loads(out)["runs"]
    assert run["status"] == "error", run
    assert "was stopped (SIGSTOP or a tracer)" in run["status_detail"], run["status_detail"]
    assert _judges_of(runs_dir) == [] and _processes_under(runs_dir) == []


@pytest.mark.timeout(600)
def test_a_stopped_launcher_is_taken_for_gone_and_nothing_runs_on(tmp_path: Path) -> None:
    cli, runs_dir, judges = _start_hung_batch(tmp_path)
    os.kill(cli.pid, signal.SIGSTOP)
    try:
        deadline = time.monotonic() + 180  # the judges give a stopped launcher 30 s
        while _judges_of(runs_dir) and time.monotonic() < deadline:
            time.sleep(1)
        assert _judges_of(runs_dir) == [], "the judges ran on under a stopped launcher"
    finally:
        os.kill(cli.pid, signal.SIGCONT)
    try:
        out, err = cli.communicate(timeout=240)
    finally:
        cli.kill()
    (run,) = json.loads(out)["runs"]
    assert run["status"] == "error", run  # recorded when the launcher wakes, never "passed"
    assert _processes_under(runs_dir) == []


def test_old_batch_folders_go_after_the_retention_and_nothing_else_does(tmp_path: Path, monkeypatch) -> None:
    from pkb_tui.engine.launcher import remove_old_batches

    monkeypatch.setenv("PKB_LOG_RETENTION_DAYS", "30")
    now = time.time()
    old, new, other, current = (tmp_path / n for n in ("20261001-101010-abcdef", "20261201-101010-012345",
                                                        "my-notes", "20261002-101010-fedcba"))
    for folder in (old, new, other, current):
        folder.mkdir()
        (folder / "run-1.log").write_text("x")
    for folder in (old, other, current):
        os.utime(folder, (now - 40 * 86400, now - 40 * 86400))
    assert remove_old_batches(tmp_path, keep=current, now=now) == [old]
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([new.name, other.name, current.name])
    monkeypatch.setenv("PKB_LOG_RETENTION_DAYS", "0")
    os.utime(new, (now - 400 * 86400, now - 400 * 86400))
    assert remove_old_batches(tmp_path, now=now) == []
