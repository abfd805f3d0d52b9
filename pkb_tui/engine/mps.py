"""A private CUDA MPS daemon for one shared-gpu run.

Without MPS, the kernels of several processes on one GPU only time-slice, so a device-side barrier
between ranks costs milliseconds (DESIGN.md: ~2.3 ms at 2 ranks, ~7 ms at 4); under MPS they run
concurrently and the same barrier costs ~0.05-0.1 ms. The daemon gets its own pipe and log folders
in a temporary directory, so any MPS daemon the box already runs (default /tmp/nvidia-mps) is left
alone, and only the rank processes given ``.env`` become its clients.

    with MpsDaemon() as mps:
        env = {**os.environ, **mps.env}      # empty when it could not start; mps.reason says why
        ... start the ranks with env, wait for them ...
    # stopped and cleaned up here, also on an exception

It never changes the GPU's compute mode and never leaves a daemon behind: stop() asks it to quit,
waits, and kills the process it started if it will not go.
"""

from __future__ import annotations

import atexit
import os
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path

from pkb_tui.engine import procs

CONTROL_BINARY = "nvidia-cuda-mps-control"
PID_FILE = "nvidia-cuda-mps-control.pid"


class MpsDaemon:
    def __init__(self, *, binary: str = CONTROL_BINARY, start_timeout_s: float = 10.0, stop_timeout_s: float = 10.0) -> None:
        self.binary = binary
        self.start_timeout_s = start_timeout_s
        self.stop_timeout_s = stop_timeout_s
        self.enabled = False
        self.reason: str | None = None
        self.env: dict[str, str] = {}
        self._root: Path | None = None
        self._binary_path: str | None = None
        self._pid: int | None = None

    # ------------------------------------------------------------------ start / stop
    def start(self) -> bool:
        """Start the daemon; True when it answers. On failure ``reason`` says why and nothing is left running."""
        if self.enabled:
            return True
        self._binary_path = shutil.which(self.binary)
        if self._binary_path is None:
            self.reason = f"{self.binary} is not on PATH (it ships with the NVIDIA driver), so ranks only time-slice the GPU"
            return False
        self._root = Path(tempfile.mkdtemp(prefix="pkb-mps-"))
        pipe_dir, log_dir = self._root / "pipe", self._root / "log"
        pipe_dir.mkdir()
        log_dir.mkdir()
        self.env = {"CUDA_MPS_PIPE_DIRECTORY": str(pipe_dir), "CUDA_MPS_LOG_DIRECTORY": str(log_dir)}
        try:
            proc = self._control(["-d"], timeout_s=self.start_timeout_s)
        except (OSError, subprocess.TimeoutExpired) as exc:
            return self._give_up(f"{self.binary} -d did not run ({exc})")
        if proc.returncode != 0:
            return self._give_up(f"{self.binary} -d failed (exit {proc.returncode}): {_first_line(proc)}")
        deadline = time.monotonic() + self.start_timeout_s
        while True:
            probe = self._control([], stdin="get_server_list\n", timeout_s=self.start_timeout_s)
            if probe.returncode == 0:
                break
            if time.monotonic() > deadline:
                return self._give_up(f"the MPS control daemon did not answer: {_first_line(probe) or self._log_tail()}")
            time.sleep(0.05)
        self._pid = self._read_pid()
        self.enabled = True
        self.reason = None
        atexit.register(self.stop)
        return True

    def stop(self) -> None:
        """Ask the daemon to quit, wait for it, kill it if it will not go, and remove its folders."""
        if self._root is None:
            return
        # Its MPS servers (children of the control daemon), known before it goes: a server whose
        # client faulted can outlive the daemon's quit, and a new daemon's clients then failed to
        # start on the H200 ("Unexpected error from cudaGetDeviceCount()").
        servers = [(pid, _start_time(pid)) for pid in procs.descendants(self._pid)] if self._pid else []
        try:
            if self.enabled:
                try:
                    self._control([], stdin="quit\n", timeout_s=self.stop_timeout_s)
                except (OSError, subprocess.TimeoutExpired):
                    pass
                self._wait_gone(self.stop_timeout_s)
        finally:
            self._kill_if_alive()
            for pid, started in servers:
                if started is not None and _start_time(pid) == started:  # the same process, not a reused pid
                    try:
                        os.kill(pid, signal.SIGKILL)
                    except OSError:
                        pass
            shutil.rmtree(self._root, ignore_errors=True)
            self._root = None
            self.enabled = False
            self.env = {}
            atexit.unregister(self.stop)

    def restart(self) -> bool:
        """A fresh daemon (new folders, new servers): between launches of a batch, after one whose
        judges ended on a lost CUDA context (MPS shares a client's fault among all clients)."""
        self.stop()
        return self.start()

    def __enter__(self) -> "MpsDaemon":
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def describe(self) -> str:
        """One sentence for a run's notes."""
        if self.enabled:
            return "ranks ran under a private MPS daemon, so their kernels ran concurrently"
        return f"no MPS daemon ({self.reason}); kernels of different ranks time-sliced the GPU"

    # ------------------------------------------------------------------ internals
    def _control(self, args: list[str], *, stdin: str | None = None, timeout_s: float) -> subprocess.CompletedProcess:
        assert self._binary_path is not None
        # Output goes to files, not pipes: a daemon that keeps an inherited pipe open would make
        # reading it wait for the daemon's end.
        with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
            proc = subprocess.run(
                [self._binary_path, *args], input=stdin, stdout=out, stderr=err, text=True,
                env={**os.environ, **self.env}, timeout=timeout_s,
            )
            out.seek(0)
            err.seek(0)
            return subprocess.CompletedProcess(proc.args, proc.returncode, out.read(), err.read())

    def _read_pid(self) -> int | None:
        try:
            return int((Path(self.env["CUDA_MPS_PIPE_DIRECTORY"]) / PID_FILE).read_text().split()[0])
        except (OSError, ValueError, IndexError, KeyError):
            return None

    def _alive(self) -> bool:
        if self._pid is not None:
            try:
                os.kill(self._pid, 0)
            except ProcessLookupError:
                return False
            except PermissionError:
                return True
            return not _is_zombie(self._pid)
        try:  # no pid file: ask the daemon itself
            return self._control([], stdin="get_server_list\n", timeout_s=2.0).returncode == 0
        except (OSError, subprocess.TimeoutExpired):
            return False

    def _wait_gone(self, timeout_s: float) -> bool:
        deadline = time.monotonic() + timeout_s
        while self._alive():
            if time.monotonic() > deadline:
                return False
            time.sleep(0.05)
        return True

    def _kill_if_alive(self) -> None:
        # Only the process whose pid our own daemon wrote into our private pipe folder.
        if self._pid is None:
            self._pid = self._read_pid() if self.env else None
        if self._pid is None or not self._alive():
            return
        for sig in (signal.SIGTERM, signal.SIGKILL):
            try:
                os.kill(self._pid, sig)
            except ProcessLookupError:
                return
            if self._wait_gone(2.0):
                return

    def _give_up(self, reason: str) -> bool:
        self.reason = reason
        self._pid = self._read_pid()
        self._kill_if_alive()
        if self._root is not None:
            shutil.rmtree(self._root, ignore_errors=True)
        self._root = None
        self.env = {}
        return False

    def _log_tail(self) -> str:
        if self._root is None:
            return ""
        log = self._root / "log" / "control.log"
        try:
            lines = log.read_text(errors="replace").strip().splitlines()
        except OSError:
            return "no control.log"
        return lines[-1] if lines else "empty control.log"


def _first_line(proc: subprocess.CompletedProcess) -> str:
    text = (proc.stderr or "").strip() or (proc.stdout or "").strip()
    return text.splitlines()[0] if text else ""


def _start_time(pid: int) -> int | None:
    """The process's start time in clock ticks since boot (field 22 of /proc/PID/stat), None when gone."""
    try:
        return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[-1].split()[19])
    except (OSError, ValueError, IndexError):
        return None


def _is_zombie(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[-1].split()[0] == "Z"
