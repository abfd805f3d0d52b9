"""Runner processes forked from one warm process per judge: `python -m pkb_tui.engine.forkserver`.

Every (task, model) item gets fresh runners (engine.worker), and a fresh Python that imports torch
costs 2-6 s (more on a loaded box, times two runners per rank per item). A judge therefore starts
one *fork server* when it first needs a runner: a child that imports what every runner needs
(torch, engine.channel, engine.compare, engine.runner), touches no GPU and holds nothing secret, then waits on a
socket. For each runner the judge sends the runner's pipes, log file and arena over that socket
(SCM_RIGHTS) with its environment and working directory; the server forks twice so the runner is
re-parented to the judge (a child subreaper), which waits on it, signals its process group and ends
it like any child. In the runner, before any candidate code: a session of its own, only its own
descriptors open, the environment replaced, fresh random state; then engine.runner.main as usual
(sandbox, device, process group). The server is spared at item ends and killed with the judge's
other children at the end of the batch; it exits by itself when its judge goes away. The judge
starts it before confining itself, so its runners are outside the judge's Landlock domain: a
process in a domain may not mount, and a candidate's runner hides the host's named unix sockets
with bind mounts (engine.unix_sockets) before it confines itself.

PKB_FORKSERVER=0 starts every runner with a fresh interpreter instead (subprocess), the slower
path, kept for comparison and for a platform where forking a warm torch is unsafe.
"""

from __future__ import annotations

import json
import os
import select
import signal
import socket
import struct
import subprocess
import sys
import time
import warnings
from pathlib import Path
from typing import Any

# In this order; arena only when there is one, userns/netns only for a candidate in a namespace of its group's.
REQUEST_FDS = ("to_runner", "from_runner", "log", "arena", "bell", "userns", "netns")
_MAX_REQUEST_BYTES = 1 << 20


class ForkServerError(Exception):
    """The fork server is gone or broke its protocol: the judge starts its runners the slow way."""


def enabled() -> bool:
    return os.environ.get("PKB_FORKSERVER", "1") != "0"


# --------------------------------------------------------------------------------- judge's side
class RunnerHandle:
    """A forked runner as its judge sees it: a child (after re-parenting) that it waits on by pid,
    with the part of subprocess.Popen's interface the judge uses."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.returncode: int | None = None

    def poll(self) -> int | None:
        if self.returncode is None:
            try:
                pid, status = os.waitpid(self.pid, os.WNOHANG)
            except ChildProcessError:  # reaped elsewhere (the judge's end-of-item sweep): it is gone
                self.returncode = -signal.SIGKILL
                return self.returncode
            if pid:
                self.returncode = os.waitstatus_to_exitcode(status)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        end = None if timeout is None else time.monotonic() + timeout
        delay = 0.001
        while (code := self.poll()) is None:
            if end is not None and time.monotonic() >= end:
                raise subprocess.TimeoutExpired(f"runner {self.pid}", timeout or 0.0)
            time.sleep(delay)
            delay = min(delay * 2, 0.05)
        return code


class ForkServer:
    """The judge's handle on its fork server (started on first use, one per judge)."""

    def __init__(self, env: dict[str, str], log_path: Path, start_timeout_s: float = 120.0) -> None:
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        log = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW, 0o644)
        try:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "pkb_tui.engine.forkserver", str(theirs.fileno())],
                pass_fds=[theirs.fileno()], stdin=subprocess.DEVNULL, stdout=log, stderr=log,
                env={**env, "PYTHONUNBUFFERED": "1"}, start_new_session=True,
            )
        finally:
            os.close(log)
            theirs.close()
        self.sock = ours
        self.start_timeout_s = start_timeout_s
        self.ready = False

    @property
    def pid(self) -> int:
        return self.proc.pid

    def spawn(self, fds: dict[str, int], env: dict[str, str], cwd: str) -> RunnerHandle:
        """Fork one runner with these descriptors (REQUEST_FDS), environment and directory."""
        names = [name for name in REQUEST_FDS if name in fds]
        request = json.dumps({"fds": names, "env": env, "cwd": cwd}).encode()
        try:
            if not self.ready:  # the first request waits for the server's imports
                self._expect(self.start_timeout_s, "ready")
                self.ready = True
            socket.send_fds(self.sock, [struct.pack(">I", len(request)) + request], [fds[n] for n in names])
            reply = self._expect(30.0, "pid")
        except OSError as exc:
            raise ForkServerError(f"the fork server went away: {exc}") from exc
        return RunnerHandle(int(reply["pid"]))

    def _expect(self, timeout_s: float, key: str) -> dict[str, Any]:
        ready, _, _ = select.select([self.sock], [], [], timeout_s)
        if not ready:
            raise ForkServerError(f"the fork server did not answer within {timeout_s:g} s")
        data = _recv_exact(self.sock, 4)
        (length,) = struct.unpack(">I", data)
        if length > _MAX_REQUEST_BYTES:
            raise ForkServerError("the fork server broke its protocol")
        reply = json.loads(_recv_exact(self.sock, length))
        if key not in reply:
            raise ForkServerError(f"the fork server could not start a runner: {reply.get('error', reply)}")
        return reply

    def close(self) -> None:
        try:
            self.sock.close()
        finally:
            if self.proc.poll() is None:
                try:
                    self.proc.kill()
                except OSError:
                    pass
            try:
                self.proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                pass


def _recv_exact(sock: socket.socket, count: int) -> bytes:
    chunks = []
    while count:
        chunk = sock.recv(count)
        if not chunk:
            raise ForkServerError("the fork server went away")
        chunks.append(chunk)
        count -= len(chunk)
    return b"".join(chunks)


# -------------------------------------------------------------------------------- server's side
def _send(sock: socket.socket, message: dict[str, Any]) -> None:
    data = json.dumps(message).encode()
    sock.sendall(struct.pack(">I", len(data)) + data)


def serve(sock: socket.socket) -> int:
    """Answer fork requests until the judge closes its end."""
    from pkb_tui.engine import channel, compare, procs, runner  # noqa: F401 - warm: what every runner imports first

    judge_pid = os.getppid()
    if not procs.die_with(judge_pid, wait_s=0):
        return 0
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    _send(sock, {"ready": True})
    while True:
        try:
            header, fds, _, _ = socket.recv_fds(sock, 4, len(REQUEST_FDS))
        except OSError:
            return 0
        if not header:
            return 0  # the judge went away
        try:
            if len(header) < 4:
                header += _recv_exact(sock, 4 - len(header))
            (length,) = struct.unpack(">I", header)
            if length > _MAX_REQUEST_BYTES:
                return 1
            request = json.loads(_recv_exact(sock, length))
            named = dict(zip(request["fds"], fds, strict=True))
            pid = _fork_runner(sock, named, dict(request["env"]), str(request["cwd"]), judge_pid)
            _send(sock, {"pid": pid})
        except Exception as exc:  # noqa: BLE001 - told to the judge, who falls back
            _send(sock, {"error": f"{type(exc).__name__}: {exc}"})
        finally:
            for fd in fds:
                os.close(fd)


def _fork_runner(sock: socket.socket, fds: dict[str, int], env: dict[str, str], cwd: str, judge_pid: int) -> int:
    """Fork twice; the runner (grandchild) reports its pid once it leads a session of its own."""
    pid_r, pid_w = os.pipe()
    sys.stdout.flush()
    sys.stderr.flush()
    with warnings.catch_warnings():  # 3.12 warns about forking with threads: the BLAS pool's, fork-safe
        warnings.simplefilter("ignore", DeprecationWarning)
        middle = os.fork()
        if middle == 0:
            try:
                if os.fork() == 0:
                    os.close(pid_r)
                    _become_runner(sock, fds, env, cwd, pid_w, judge_pid)  # never returns
                os._exit(0)
            except BaseException:  # noqa: BLE001
                os._exit(1)
    os.close(pid_w)
    try:
        os.waitpid(middle, 0)  # once it is gone the runner is the judge's child (a subreaper)
        ready, _, _ = select.select([pid_r], [], [], 30.0)
        data = os.read(pid_r, 32) if ready else b""
    finally:
        os.close(pid_r)
    if not data:
        raise ForkServerError("the runner did not report its pid")
    return int(data)


def _become_runner(sock: socket.socket, fds: dict[str, int], env: dict[str, str], cwd: str, pid_w: int,
                   judge_pid: int) -> None:
    code = 1
    try:
        os.setsid()
        sock.close()
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        os.dup2(fds["log"], 1)
        os.dup2(fds["log"], 2)
        netns = [fds[k] for k in ("userns", "netns") if k in fds]
        keep = {0, 1, 2, fds["to_runner"], fds["from_runner"], pid_w, *netns} | {fds[k] for k in ("arena", "bell") if k in fds}
        _close_all_but(keep)
        os.write(pid_w, str(os.getpid()).encode())
        os.close(pid_w)
        from pkb_tui.engine import procs

        if not procs.die_with(judge_pid):  # re-parented to the judge: it dies, this runner dies
            os._exit(1)
        os.environ.clear()
        os.environ.update(env)
        os.environ["PKB_RUNNER_FDS"] = f"{fds['to_runner']},{fds['from_runner']}"
        if "arena" in fds:
            os.environ["PKB_ARENA_FD"] = str(fds["arena"])
        if "bell" in fds:
            os.environ["PKB_BELL_FD"] = str(fds["bell"])
        if netns:
            os.environ["PKB_NETNS_FDS"] = ",".join(str(fd) for fd in netns)
        os.chdir(cwd)
        import random
        import tempfile

        random.seed()
        tempfile.tempdir = None  # TMPDIR is the runner's scratch now
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        from pkb_tui.engine import runner

        code = runner.main()
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 1
    except BaseException:  # noqa: BLE001
        import traceback

        traceback.print_exc()
    finally:
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            os._exit(code)


def _close_all_but(keep: set[int]) -> None:
    try:
        open_fds = sorted(int(name) for name in os.listdir("/proc/self/fd"))
    except OSError:
        open_fds = list(range(3, 1024))
    for fd in open_fds:
        if fd not in keep:
            try:
                os.close(fd)
            except OSError:
                pass


def main() -> int:
    sock = socket.socket(fileno=int(sys.argv[1]))
    return serve(sock)


if __name__ == "__main__":
    sys.exit(main())
