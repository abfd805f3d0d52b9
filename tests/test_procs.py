"""engine.procs against real process trees: a tree walked with and without the kernel's children
files, and a process that left its runner's process group stopped and continued with it."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from pkb_tui.engine import procs

# parent (its own session) -> child (setsid: a session and group of its own, as an escaping
# candidate's helper) -> grandchild (spins). Prints the two pids, then the parent sleeps.
TREE = r"""
import os, sys, time
r, w = os.pipe()
if os.fork() == 0:
    os.setsid()
    if os.fork() == 0:
        os.write(w, str(os.getpid()).encode() + b"\n")
        while True:
            pass
    while True:
        time.sleep(1)
line = os.read(r, 64).decode().strip()
print(line, flush=True)
while True:
    time.sleep(1)
"""


def _cpu_s(pid: int) -> float:
    (reading,) = procs.usage_of([pid]).cpu
    return reading.cpu_s


@pytest.fixture
def tree():
    parent = subprocess.Popen([sys.executable, "-c", TREE], stdout=subprocess.PIPE, text=True, start_new_session=True)
    try:
        spinner = int(parent.stdout.readline())
        deadline = time.monotonic() + 10
        while len(procs.descendants(parent.pid)) < 2 and time.monotonic() < deadline:
            time.sleep(0.01)
        yield parent, spinner
    finally:
        for pid in [*procs.descendants(parent.pid), parent.pid]:
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        parent.wait()


def test_what_left_the_group_is_stopped_with_it_and_continued_with_it(tree) -> None:
    parent, spinner = tree
    os.killpg(parent.pid, signal.SIGSTOP)
    stopped = procs.stop_outside_group(lambda: procs.subtree_but(parent.pid, set()), parent.pid)
    try:
        assert {pid for pid, _ in stopped} == set(procs.descendants(parent.pid))
        assert spinner in {pid for pid, _ in stopped}
        time.sleep(0.05)
        assert procs.state(spinner) == "T"
        before = _cpu_s(spinner)
        time.sleep(0.5)
        assert _cpu_s(spinner) == before  # not one tick while stopped
    finally:
        procs.continue_stopped(stopped)
        os.killpg(parent.pid, signal.SIGCONT)
    time.sleep(0.3)
    assert procs.state(spinner) == "R"
    running = _cpu_s(spinner)
    time.sleep(0.5)
    assert _cpu_s(spinner) > running


def test_a_pid_taken_by_another_process_is_not_continued(tree) -> None:
    parent, spinner = tree
    stopped = procs.stop_outside_group(lambda: [spinner], parent.pid)
    assert stopped and stopped[0][0] == spinner
    # The same pid with another start time (a later process) is left alone.
    procs.continue_stopped([(spinner, stopped[0][1] + 1)])
    time.sleep(0.05)
    assert procs.state(spinner) == "T"
    procs.continue_stopped(stopped)
    time.sleep(0.05)
    assert procs.state(spinner) == "R"


def test_the_walk_by_children_files_and_the_pass_over_proc_agree(tree, monkeypatch) -> None:
    parent, spinner = tree
    (child,) = [pid for pid in procs.descendants(parent.pid) if pid != spinner]
    by_proc = procs.subtree_but(parent.pid, set())
    children = procs.children_by_parent()
    monkeypatch.setattr(procs, "_children_of", lambda pid: list(children.get(pid, [])))  # as the kernel's files say
    assert sorted(procs.subtree_but(parent.pid, set())) == sorted(by_proc) == sorted([child, spinner])
    assert procs.subtree_but(parent.pid, {child}) == []  # a spared root is left out with its tree
    monkeypatch.undo()
    assert procs.subtree_but(parent.pid, {child}) == []
