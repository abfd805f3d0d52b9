"""The host's named unix sockets, hidden from a candidate's runner (engine.unix_sockets), on this
machine's real kernel.

First in a forked child that does what a candidate's runner does (find the sockets, a mount
namespace of its own with /dev/null over each, Landlock, capabilities dropped), as root and as an
unprivileged user; then the attack of tests/fixtures/adversarial/unix-socket in a real batch
(torchrun, gloo, two ranks) beside an honest model, with the covers and without
(PKB_SANDBOX_UNIX=0: the bytes arrive, so the test can tell).
"""

from __future__ import annotations

import ctypes
import os
import shutil
import socket
import tempfile
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from pkb_tui.engine import sandbox, unix_sockets
from tests._listeners import Listener

ROOT = Path(__file__).resolve().parents[1]
ADVERSARIAL = Path(__file__).parent / "fixtures" / "adversarial"
HONEST = ROOT / "solutions" / "torch-p2p"


class _UnixListener(Listener):
    """A listening unix socket (a path, or an abstract name) that keeps whatever arrives."""

    def __init__(self, address: str, sock: socket.socket | None = None) -> None:
        self.address = address
        if sock is None:
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            sock.bind(address)
            sock.listen(16)
        if not address.startswith("\0"):
            os.chmod(address, 0o777)  # an unprivileged runner may connect as far as modes go
        super().__init__(sock, accept_timeout_s=0.2)


def _bound_in_another_netns(path: str) -> socket.socket | str:
    """A socket bound to ``path`` by a thread that moved into a network namespace of its own (as
    a container's or a PrivateNetwork service's would be): /proc/net/unix here does not list it."""
    made: list[socket.socket | str] = []

    def work() -> None:
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.unshare(ctypes.c_int(0x40000000)) != 0:
            made.append(f"unshare(CLONE_NEWNET): {os.strerror(ctypes.get_errno())}")
            return
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.bind(path)
        sock.listen(16)
        made.append(sock)

    thread = threading.Thread(target=work)
    thread.start()
    thread.join()
    return made[0]


def _user_and_net_namespace() -> sandbox.NetNamespace:
    """What judge 0's helper makes without root (sandbox._net_namespace_by_helper, which runs
    sys.executable: not one this test's other user may run): a forked child in a user namespace
    of its own plus a network namespace hands back both descriptors."""
    ours, theirs = socket.socketpair()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the grandchild
        libc = ctypes.CDLL(None, use_errno=True)
        uid, gid = os.geteuid(), os.getegid()
        assert libc.unshare(ctypes.c_int(0x10000000 | 0x40000000)) == 0
        for name, text in (("setgroups", "deny"), ("uid_map", f"{uid} {uid} 1"), ("gid_map", f"{gid} {gid} 1")):
            with open(f"/proc/self/{name}", "w") as f:
                f.write(text)
        fds = [os.open("/proc/self/ns/user", os.O_RDONLY), os.open("/proc/self/ns/net", os.O_RDONLY)]
        socket.send_fds(theirs, [b"u"], fds)
        os._exit(0)
    _, fds, _, _ = socket.recv_fds(ours, 1, 2)
    os.waitpid(pid, 0)
    ours.close()
    theirs.close()
    return sandbox.NetNamespace(net_fd=fds[1], user_fd=fds[0])


@pytest.fixture
def socket_folder() -> Iterator[Path]:
    """A folder directly in /tmp (the scan's depth), open to every user (the unprivileged case)."""
    folder = Path(tempfile.mkdtemp(prefix="pkb-unix-", dir="/tmp"))
    folder.chmod(0o755)
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


def _attempts_in_child(targets: dict[str, str], *, as_user: int | None = None, alias: tuple[Path, Path] | None = None,
                       allow: list[str] | None = None, group_namespace: bool = False) -> dict[str, str]:
    """In a forked child: (``alias``: a folder bound elsewhere first, in a mount namespace of the
    child's), what a candidate's runner does (the sockets found, covered, Landlock, capabilities
    dropped), then a connect to each target and a try at lifting the covers. What -> outcome."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        os.close(r)
        said: list[str] = []
        try:
            libc = ctypes.CDLL(None, use_errno=True)
            if alias is not None:
                assert libc.unshare(ctypes.c_int(0x00020000)) == 0
                assert libc.mount(None, b"/", None, ctypes.c_ulong(0x4000 | (1 << 18)), None) == 0
                assert libc.mount(os.fsencode(alias[0]), os.fsencode(alias[1]), None, ctypes.c_ulong(0x1000), None) == 0
            if as_user is not None:
                os.setgroups([])
                os.setresgid(as_user, as_user, as_user)
                os.setresuid(as_user, as_user, as_user)
                libc.prctl(4, 1, 0, 0, 0)  # PR_SET_DUMPABLE, as a process started as that user is (its /proc/self)
            found = unix_sockets.find_host_sockets(allow)
            if group_namespace:  # as a runner joins its group's (user and) network namespace before hiding
                made = _user_and_net_namespace() if as_user is not None else sandbox.make_net_namespace()
                assert not isinstance(made, str), made
                said.append(f"join={sandbox.join_net_namespace(made.net_fd, made.user_fd)}")
            covered, note = unix_sockets.hide(found)
            said.append(f"hide={note}")
            said.append(f"note={sandbox.restrict_writes([Path('/dev/null')], scope_signals=True)}")
            said.append(f"caps={sandbox.drop_capabilities()}")
            for what, address in targets.items():
                try:
                    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn:
                        conn.settimeout(2)
                        conn.connect(address)
                        conn.sendall(what.encode())
                    said.append(f"{what}=reached")
                except OSError as exc:
                    said.append(f"{what}=refused:{type(exc).__name__}")
            cover = targets["hidden"]
            said.append("umount=" + ("LIFTED" if libc.umount2(cover.encode(), 2) == 0 else "refused"))
            if libc.unshare(ctypes.c_int(0x10000000 | 0x00020000)) == 0:
                said.append("userns umount=" + ("LIFTED" if libc.umount2(cover.encode(), 2) == 0 else "refused"))
            else:
                said.append("userns umount=refused")
        except BaseException as exc:  # noqa: BLE001
            said.append(f"error={type(exc).__name__}: {exc}")
        finally:
            os.write(w, "\n".join(said).encode())
            os._exit(0)
    os.close(w)
    data = b""
    while chunk := os.read(r, 65536):
        data += chunk
    os.close(r)
    os.waitpid(pid, 0)
    lines = data.decode().splitlines()
    assert not any(line.startswith("error=") for line in lines), lines
    return dict(line.split("=", 1) for line in lines)


@pytest.mark.parametrize("who", ["root", "an unprivileged user", "root in its group's network namespace",
                                 "an unprivileged user in its group's user and network namespaces"])
def test_the_hosts_named_sockets_are_covered_the_mps_folder_and_abstract_ones_stay(socket_folder: Path, who: str) -> None:
    group = "group's" in who
    if who.startswith("root") and os.geteuid() != 0:
        pytest.skip("needs root")
    if not who.startswith("root") and os.geteuid() != 0:
        pytest.skip("switching to another user needs root; this user is already unprivileged: the root case runs as it")
    deep = socket_folder / "a" / "b"  # below the scan's depth: only /proc/net/unix finds it
    deep.mkdir(parents=True)
    (socket_folder / "a").chmod(0o755)
    deep.chmod(0o755)
    mps = socket_folder / "mps"
    mps.mkdir(mode=0o755)
    elsewhere = _bound_in_another_netns(str(socket_folder / "elsewhere.sock"))
    if isinstance(elsewhere, str):
        pytest.skip(f"no network namespace here: {elsewhere}")
    listeners = {
        "hidden": _UnixListener(str(deep / "docker.sock")),
        "other netns": _UnixListener(str(socket_folder / "elsewhere.sock"), elsewhere),
        "mps": _UnixListener(str(mps / "control")),
        "abstract": _UnixListener(f"\0pkb-test-{uuid.uuid4().hex}"),
    }
    link = socket_folder / "link.sock"
    link.symlink_to(deep / "docker.sock")
    listed = unix_sockets._listed_paths()[0]
    assert str(deep / "docker.sock") in listed and str(socket_folder / "elsewhere.sock") not in listed, listed
    try:
        targets = {what: listener.address for what, listener in listeners.items()}
        targets["symlink"] = str(link)
        got = _attempts_in_child(targets, as_user=None if who.startswith("root") else 65534, allow=[str(mps)],
                                 group_namespace=group)
    finally:
        for listener in listeners.values():
            listener.close()
    assert got["hide"] == "None" and got["caps"] == "None", got
    assert got.get("join", "None") == "None", got  # in its group's namespace, where asked
    if sandbox.landlock_abi() > 0:
        assert got["note"] == "None", got
    assert got["hidden"].startswith("refused") and got["symlink"].startswith("refused"), got
    assert got["other netns"].startswith("refused"), got
    assert got["mps"] == "reached", got  # CUDA's MPS clients
    # Abstract sockets (NCCL's) are left to the network namespace: the host's in its own, none in the group's.
    assert got["abstract"] == ("refused:ConnectionRefusedError" if group else "reached"), got
    assert got.get("join", "None") == "None", got
    assert got["umount"] == "refused" and got["userns umount"] == "refused", got
    assert listeners["hidden"].received == [] and listeners["other netns"].received == [], listeners
    assert listeners["mps"].received == [b"mps"], listeners["mps"].received
    assert listeners["abstract"].received == ([] if group else [b"abstract"]), listeners["abstract"].received


def test_a_folder_bound_elsewhere_is_covered_there_too(socket_folder: Path) -> None:
    if os.geteuid() != 0:
        pytest.skip("binding a folder elsewhere needs root (or a user namespace of the test's)")
    source = socket_folder / "src"
    source.mkdir()
    target = socket_folder / "x" / "y" / "alias"  # below the scan's depth
    target.mkdir(parents=True)
    listener = _UnixListener(str(source / "private.sock"))
    try:
        got = _attempts_in_child({"hidden": str(source / "private.sock"), "alias": str(target / "private.sock")},
                                 alias=(source, target))
    finally:
        listener.close()
    assert got["hide"] == "None", got
    assert got["hidden"].startswith("refused") and got["alias"].startswith("refused"), got
    assert listener.received == [], listener.received


def test_without_the_covers_the_same_child_reaches_the_socket(socket_folder: Path) -> None:
    # The control: the connect the test above expects refused does arrive when nothing is covered.
    listener = _UnixListener(str(socket_folder / "open.sock"))
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn:
            conn.connect(listener.address)
            conn.sendall(b"hello")
        for _ in range(50):
            if listener.received:
                break
            threading.Event().wait(0.05)
    finally:
        listener.close()
    assert listener.received == [b"hello"]


def test_the_finder_leaves_the_allowed_folders_and_the_hide_refuses_a_threaded_process(socket_folder: Path) -> None:
    mps = socket_folder / "mps"
    mps.mkdir()
    inside = _UnixListener(str(mps / "control"))
    outside = _UnixListener(str(socket_folder / "out.sock"))
    try:
        found = unix_sockets.find_host_sockets([str(mps)])
        assert str(socket_folder / "out.sock") in found.paths and str(mps / "control") not in found.paths, found
        env = {"CUDA_MPS_PIPE_DIRECTORY": str(mps), unix_sockets.ALLOW: "/srv/a:/srv/b"}
        assert unix_sockets.allowed_folders(env) == [str(mps), "/srv/a", "/srv/b"]
        assert unix_sockets.allowed_folders({}) == [unix_sockets.MPS_DEFAULT_PIPE]
        # This test process runs the listeners' threads: unshare(CLONE_NEWNS) would fail, said as such.
        covered, note = unix_sockets.hide(found)
        assert covered == 0 and note is not None and note.startswith("named unix sockets reachable: the runner already ran")
    finally:
        inside.close()
        outside.close()


def test_the_notes_say_when_named_sockets_stay_reachable(monkeypatch: pytest.MonkeyPatch) -> None:
    from pkb_tui.engine.worker import _candidate_sandbox_note

    monkeypatch.delenv("PKB_SANDBOX", raising=False)
    monkeypatch.delenv(unix_sockets.SWITCH, raising=False)
    assert "the host's named unix sockets hidden" in _candidate_sandbox_note(2)
    assert unix_sockets.runner_env() == {unix_sockets.RUNNER_FLAG: "1"}
    monkeypatch.setenv(unix_sockets.SWITCH, "0")
    assert "named unix sockets reachable: PKB_SANDBOX_UNIX=0" in _candidate_sandbox_note(2)
    assert unix_sockets.runner_env() == {}
    monkeypatch.delenv(unix_sockets.SWITCH)
    monkeypatch.setenv("PKB_SANDBOX", "0")
    assert "named unix sockets reachable: PKB_SANDBOX=0" in _candidate_sandbox_note(2)
    assert unix_sockets.runner_env() == {}


def _run_socket_attack(cli, tmp_db: Path, monkeypatch: pytest.MonkeyPatch, socket_folder: Path
                       ) -> tuple[dict[str, dict], dict[str, _UnixListener], str]:
    """The unix-socket fixture beside the honest model, one batch; (runs by model, listeners, logs)."""
    run_like = Path("/run") if os.access("/run", os.W_OK) else socket_folder / "run"
    run_folder = Path(tempfile.mkdtemp(prefix="pkb-test-", dir=run_like)) if run_like == Path("/run") else run_like
    run_folder.mkdir(exist_ok=True)
    run_folder.chmod(0o755)
    listeners = {"docker-like": _UnixListener(str(run_folder / "docker.sock")),
                 "temp folder": _UnixListener(str(socket_folder / "db.sock")),
                 "abstract": _UnixListener(f"\0pkb-test-{uuid.uuid4().hex}")}
    link = socket_folder / "link.sock"
    link.symlink_to(run_folder / "docker.sock")
    targets = {"docker-like": listeners["docker-like"].address, "temp folder": listeners["temp folder"].address,
               "symlink": str(link)}
    monkeypatch.setenv("PKB_TEST_UNIX_SOCKETS", ":".join(f"{k}={v}" for k, v in targets.items()))
    monkeypatch.setenv("PKB_TEST_ABSTRACT_SOCKET", listeners["abstract"].address[1:])
    try:
        models = ",".join([str(ADVERSARIAL / "unix-socket"), str(HONEST)])
        result = cli("run", "--task", "all_reduce", "--model", models, "--world-size", "2", "--mode", "cpu",
                     "--size", "small", "--trials", "1", "--no-timing", "--no-profile", "--timeout", "300", "--json")
    finally:
        for listener in listeners.values():
            listener.close()
        if run_like == Path("/run"):
            shutil.rmtree(run_folder, ignore_errors=True)
    runs = {r["model"]: r for r in result.json()["runs"]}
    (batch,) = [p for p in (tmp_db.parent / "pkb-runs").iterdir() if p.is_dir()]
    logs = "\n".join(p.read_text(errors="replace") for p in sorted(batch.glob("item*.rank*.candidate.log")))
    return runs, listeners, logs


@pytest.mark.timeout(900)
def test_a_candidate_reaches_no_named_socket_of_the_host_and_the_honest_model_still_passes(
        cli, tmp_db: Path, monkeypatch: pytest.MonkeyPatch, socket_folder: Path) -> None:
    monkeypatch.delenv(unix_sockets.SWITCH, raising=False)
    runs, listeners, logs = _run_socket_attack(cli, tmp_db, monkeypatch, socket_folder)
    assert {r["status"] for r in runs.values()} == {"passed"}, runs
    # Nothing arrived, from either rank, at import or in the call, directly, by a symlink or /proc.
    assert all(listener.received == [] for listener in listeners.values()), {k: v.received for k, v in listeners.items()}
    for what in ("docker-like", "temp folder", "symlink", "docker-like via /proc/1/root", "host abstract",
                 "every other process's /proc/PID/root"):
        assert f"connect refused: {what}" in logs, (what, logs)
    assert "umount refused: docker-like" in logs and "umount in a user namespace refused: docker-like" in logs, logs
    assert "LEAKED" not in logs, logs
    notes = runs["torch-p2p"]["notes"]
    assert any("candidate sandbox:" in n and "the host's named unix sockets hidden" in n for n in notes), notes
    assert not any("reachable" in n or "not restricted" in n for r in runs.values() for n in r["notes"]), runs


@pytest.mark.timeout(900)
def test_with_the_covers_switched_off_the_bytes_arrive_and_the_notes_say_so(
        cli, tmp_db: Path, monkeypatch: pytest.MonkeyPatch, socket_folder: Path) -> None:
    monkeypatch.setenv(unix_sockets.SWITCH, "0")
    runs, listeners, logs = _run_socket_attack(cli, tmp_db, monkeypatch, socket_folder)
    assert {r["status"] for r in runs.values()} == {"passed"}, runs
    assert any(b"EXFILTRATED" in got for got in listeners["docker-like"].received), listeners["docker-like"].received
    assert any(b"EXFILTRATED" in got for got in listeners["temp folder"].received), listeners["temp folder"].received
    assert "LEAKED over a unix socket: docker-like" in logs, logs
    assert listeners["abstract"].received == []  # the network namespace still keeps the host's abstract sockets away
    notes = runs["torch-p2p"]["notes"]
    assert any("named unix sockets reachable: PKB_SANDBOX_UNIX=0" in n for n in notes), notes
