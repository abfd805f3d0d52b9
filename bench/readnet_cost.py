"""The cost of confining a candidate's reads and network (engine.sandbox), piece by piece, on this
box: the namespace helper (judge 0, once per item), the hand-over of its descriptors to another
judge, setns in a fresh runner, and the read rules built and applied (every candidate runner:
a walk from / towards each denied path, one Landlock rule per sibling on the way).

    python bench/readnet_cost.py [repeats]

Then the named unix sockets' covers (engine.unix_sockets), in a fresh forked child each time: the
sockets found (/proc/net/unix, the scan of /run, /tmp, /var/tmp and /dev, mountinfo's aliases) and
hidden (unshare(CLONE_NEWNS), mounts made private, /dev/null bound over each), with the host's
own sockets and with 50 and 500 more bound by this script (listed by /proc/net/unix).
"""

from __future__ import annotations

import os
import socket
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from pkb_tui.engine import sandbox  # noqa: E402
from pkb_tui.engine.worker import _fetch_fds, _hand_out_fds  # noqa: E402


def _in_child(fn) -> float:
    """Seconds ``fn`` took in a forked child (sandboxing is for good: never in this process)."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover
        t0 = time.perf_counter()
        ok = fn()
        os.write(w, f"{time.perf_counter() - t0 if ok else -1.0}".encode())
        os._exit(0)
    os.close(w)
    data = os.read(r, 64)
    os.close(r)
    os.waitpid(pid, 0)
    return float(data)


def _unix_in_child() -> tuple[float, float, int, int]:
    """(seconds to find, seconds to hide, sockets covered, absolute paths /proc/net/unix listed) in
    a forked child: the mount namespace is for good."""
    from pkb_tui.engine import unix_sockets

    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover
        t0 = time.perf_counter()
        found = unix_sockets.find_host_sockets()
        t1 = time.perf_counter()
        covered, why = unix_sockets.hide(found)
        t2 = time.perf_counter()
        os.write(w, f"{t1 - t0} {t2 - t1 if why is None else -1.0} {covered} {found.listed}".encode())
        os._exit(0)
    os.close(w)
    data = os.read(r, 256).split()
    os.close(r)
    os.waitpid(pid, 0)
    return float(data[0]), float(data[1]), int(data[2]), int(data[3])


def unix_sockets_cost(repeats: int) -> None:
    import shutil

    folder = Path(tempfile.mkdtemp(prefix="unix-cost-"))
    deep = folder / "a" / "b"  # beneath the scan's depth: found through /proc/net/unix
    deep.mkdir(parents=True)
    bound: list[socket.socket] = []
    try:
        for extra in (0, 50, 500):
            while len(bound) < extra:
                sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
                sock.bind(str(deep / f"s{len(bound)}.sock"))
                sock.listen(1)
                bound.append(sock)
            finds, hides = [], []
            covered = listed = 0
            for _ in range(repeats):
                find_s, hide_s, covered, listed = _unix_in_child()
                finds.append(find_s)
                hides.append(hide_s)
            print(f"named unix sockets, {listed} paths in /proc/net/unix, {covered} covered: found median "
                  f"{statistics.median(finds) * 1000:.1f} ms (max {max(finds) * 1000:.1f}), hidden median "
                  f"{statistics.median(hides) * 1000:.1f} ms (max {max(hides) * 1000:.1f})")
    finally:
        for sock in bound:
            sock.close()
        shutil.rmtree(folder, ignore_errors=True)


def main() -> int:
    repeats = int(sys.argv[1]) if len(sys.argv) > 1 else 10
    work = Path(tempfile.mkdtemp(prefix="readnet-cost-"))
    (work / "batch" / "scratch" / "own").mkdir(parents=True)
    (work / "jit").mkdir()
    db = work / "runs.db"
    db.write_text("")
    results: dict[str, list[float]] = {k: [] for k in ("namespace made", "handed to a judge", "setns",
                                                        "read rules built", "Landlock applied")}
    rules_count = 0
    for _ in range(repeats):
        t0 = time.perf_counter()
        made = sandbox.make_net_namespace()
        results["namespace made"].append(time.perf_counter() - t0)
        if isinstance(made, str):
            print(f"no namespace: {made}")
            break
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        name = f"\0readnet-cost-{os.getpid()}-{time.monotonic_ns()}"
        listener.bind(name)
        listener.listen(2)
        got: list[object] = []
        t0 = time.perf_counter()
        thread = threading.Thread(target=lambda: got.append(_fetch_fds(name)))
        thread.start()
        _hand_out_fds(listener, made, {os.getpid()})
        thread.join()
        results["handed to a judge"].append(time.perf_counter() - t0)
        fetched = got[0]
        assert isinstance(fetched, sandbox.NetNamespace), fetched
        fetched.close()
        results["setns"].append(_in_child(lambda: sandbox.join_net_namespace(made.net_fd, made.user_fd) is None))
        made.close()
        t0 = time.perf_counter()
        denials = sandbox.candidate_read_denials(work / "batch", db, ROOT, [work / "other-model"])
        needs, own = sandbox.runner_needs(work / "batch" / "scratch" / "own", work / "jit", None)
        rules = sandbox.read_rules(denials, needs, own)
        results["read rules built"].append(time.perf_counter() - t0)
        rules_count = len(rules)
        writable = sandbox.runner_writable(work / "batch" / "scratch" / "own", work / "jit", "cpu")
        results["Landlock applied"].append(_in_child(lambda: sandbox.restrict_writes(writable, readable=rules) is None))
    unix_sockets_cost(repeats)
    print(f"{repeats} repeats on {os.cpu_count()} CPUs; {rules_count} read rules "
          f"({len(os.listdir('/tmp'))} entries in /tmp)")
    for what, values in results.items():
        if values:
            print(f"  {what:18s} median {statistics.median(values) * 1000:7.1f} ms   max {max(values) * 1000:7.1f} ms")
    return 0


if __name__ == "__main__":
    sys.exit(main())
