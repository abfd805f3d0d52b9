"""The private MPS daemon, against a stand-in for nvidia-cuda-mps-control (CI has no driver).

The stand-in behaves like the real control program where MpsDaemon depends on it: `-d` leaves a
background process that writes its pid into $CUDA_MPS_PIPE_DIRECTORY; `get_server_list` on stdin
answers only while that process lives; `quit` makes it exit.
"""

from __future__ import annotations

import os
import stat
import sys
import textwrap
import time
from pathlib import Path

import pytest

from pkb_tui.engine.mps import PID_FILE, MpsDaemon

FAKE_CONTROL = textwrap.dedent(
    """\
    #!{python}
    import os, subprocess, sys, time
    pipe = os.environ.get("CUDA_MPS_PIPE_DIRECTORY")
    logs = os.environ.get("CUDA_MPS_LOG_DIRECTORY")
    with open(os.environ["FAKE_MPS_CALLS"], "a") as calls:
        calls.write(" ".join(sys.argv[1:]) + "|" + str(pipe) + "|" + str(logs) + "\\n")
    if not pipe or pipe.startswith("/tmp/nvidia-mps"):
        sys.exit("refusing to touch the system's MPS folders")
    pidfile = os.path.join(pipe, "{pidfile}")
    def alive():
        try:
            pid = int(open(pidfile).read())
            os.kill(pid, 0)
            return "Z" not in open(f"/proc/{{pid}}/stat").read().rsplit(")", 1)[-1].split()[0]
        except (OSError, ValueError):
            return False
    if sys.argv[1:] == ["-d"]:
        if os.environ.get("FAKE_MPS_FAIL"):
            sys.exit("An instance of this daemon is already running")
        body = "import os,time\\n" + (
            "import signal; signal.signal(signal.SIGTERM, signal.SIG_IGN)\\n" if os.environ.get("FAKE_MPS_STUBBORN") else ""
        ) + (
            # A server (a child of the daemon) that outlives the daemon's quit, as one whose client faulted.
            "import subprocess, sys\\nsubprocess.Popen([sys.executable, '-c', %r])\\n" % (
                "import os, signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
                "open(%r, 'w').write(str(os.getpid())); time.sleep(600)" % os.path.join(pipe, "server.pid"))
            if os.environ.get("FAKE_MPS_SERVER_STUCK") else ""
        ) + "while not os.path.exists(os.path.join(%r, 'quit')): time.sleep(0.02)\\n" % pipe
        proc = subprocess.Popen([sys.executable, "-c", body], start_new_session=True)
        open(pidfile, "w").write(str(proc.pid))
        sys.exit(0)
    command = sys.stdin.read().strip()
    if not alive():
        sys.exit("Cannot find MPS control daemon process")
    if command == "quit" and not os.environ.get("FAKE_MPS_STUBBORN"):
        open(os.path.join(pipe, "quit"), "w").close()
    sys.exit(0)
    """
)


@pytest.fixture
def fake_control(tmp_path, monkeypatch):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    script = bin_dir / "nvidia-cuda-mps-control"
    script.write_text(FAKE_CONTROL.format(python=sys.executable, pidfile=PID_FILE))
    script.chmod(script.stat().st_mode | stat.S_IEXEC)
    calls = tmp_path / "calls.log"
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("FAKE_MPS_CALLS", str(calls))
    return calls


def _pid_gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[-1].split()[0] == "Z"
    except OSError:
        return True


def test_a_run_gets_a_private_daemon_that_is_gone_afterwards(fake_control):
    with MpsDaemon() as mps:
        assert mps.enabled and mps.reason is None
        pipe = Path(mps.env["CUDA_MPS_PIPE_DIRECTORY"])
        logs = Path(mps.env["CUDA_MPS_LOG_DIRECTORY"])
        assert pipe.is_dir() and logs.is_dir() and pipe.parent == logs.parent
        assert not str(pipe).startswith("/tmp/nvidia-mps")
        pid = int((pipe / PID_FILE).read_text())
        assert not _pid_gone(pid)
        assert "private MPS daemon" in mps.describe()
    assert _pid_gone(pid)
    assert not pipe.parent.exists()
    assert not mps.enabled and mps.env == {}
    # Every call to the control program carried our private folders.
    lines = fake_control.read_text().splitlines()
    assert lines[0].startswith("-d|") and all(f"|{pipe}|{logs}" in line for line in lines)
    assert len(lines) >= 3  # -d, at least one health probe, quit


def test_the_daemon_is_stopped_when_the_run_raises(fake_control):
    with pytest.raises(RuntimeError):
        with MpsDaemon() as mps:
            pid = int((Path(mps.env["CUDA_MPS_PIPE_DIRECTORY"]) / PID_FILE).read_text())
            raise RuntimeError("rank crashed")
    assert _pid_gone(pid)


def test_a_daemon_that_ignores_quit_is_killed(fake_control, monkeypatch):
    monkeypatch.setenv("FAKE_MPS_STUBBORN", "1")
    mps = MpsDaemon(stop_timeout_s=0.5)
    assert mps.start()
    pid = int((Path(mps.env["CUDA_MPS_PIPE_DIRECTORY"]) / PID_FILE).read_text())
    started = time.monotonic()
    mps.stop()
    assert _pid_gone(pid)
    assert time.monotonic() - started < 10


def test_missing_binary_leaves_the_run_without_mps_and_says_why(monkeypatch, tmp_path):
    monkeypatch.setenv("PATH", str(tmp_path))
    mps = MpsDaemon()
    assert mps.start() is False
    assert not mps.enabled and mps.env == {}
    assert "nvidia-cuda-mps-control is not on PATH" in mps.reason
    assert "time-sliced" in mps.describe()
    mps.stop()  # harmless


def test_a_failing_daemon_reports_the_control_programs_words(fake_control, monkeypatch):
    monkeypatch.setenv("FAKE_MPS_FAIL", "1")
    mps = MpsDaemon()
    assert mps.start() is False
    assert "already running" in mps.reason and "exit 1" in mps.reason
    assert mps.env == {}


def test_a_server_that_outlives_its_daemon_is_ended_and_a_restart_gives_a_fresh_daemon(fake_control, monkeypatch) -> None:
    monkeypatch.setenv("FAKE_MPS_SERVER_STUCK", "1")
    daemon = MpsDaemon()
    assert daemon.start(), daemon.reason
    first_pipe = Path(daemon.env["CUDA_MPS_PIPE_DIRECTORY"])
    server_pid_file = first_pipe / "server.pid"
    deadline = time.monotonic() + 10
    while not server_pid_file.exists() and time.monotonic() < deadline:
        time.sleep(0.02)
    server = int(server_pid_file.read_text())
    old_daemon = int((first_pipe / PID_FILE).read_text())
    try:
        assert daemon.restart(), daemon.reason
        assert _pid_gone(server), "the old daemon's server lived on"
        assert _pid_gone(old_daemon)
        assert not first_pipe.exists()
        new_pipe = Path(daemon.env["CUDA_MPS_PIPE_DIRECTORY"])
        assert new_pipe != first_pipe and (new_pipe / PID_FILE).exists() and daemon.enabled
    finally:
        daemon.stop()
        try:
            os.kill(server, 9)
        except OSError:
            pass
