"""What a candidate may read and reach over the network (engine.sandbox: Landlock's read rights,
a network namespace per model group), on this machine's real kernel.

The rule builder is tried first on its own (a forked child applies the rules and reads: a database
under /tmp, a virtualenv in the home, a home that is /); then two attacks of
tests/fixtures/adversarial/ run in a real batch (torchrun, gloo, two ranks) beside an honest model:
one reads a secret in the home folder, the runs database, another model's solution and the
project's README; one sends bytes to a listener this test opens on the host's 127.0.0.1.
"""

from __future__ import annotations

import os
import socket
import uuid
from pathlib import Path

import pytest

from pkb_tui.engine import sandbox
from pkb_tui.engine.sandbox import ReadDenials, landlock_abi
from tests._listeners import Listener

ROOT = Path(__file__).resolve().parents[1]
ADVERSARIAL = Path(__file__).parent / "fixtures" / "adversarial"
HONEST = ROOT / "solutions" / "torch-p2p"

needs_landlock = pytest.mark.skipif(landlock_abi() <= 0, reason="this kernel has no Landlock: reads stay open (said in the notes)")


def _readable_after(rules: dict[Path, int], probes: list[Path]) -> dict[str, bool]:
    """In a forked child: reads confined to ``rules`` (writes to nothing), then each probe read
    (a folder listed). Path -> whether it could be read."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        os.close(r)
        code = 1
        try:
            note = sandbox.restrict_writes([], readable=rules)
            results = []
            for path in probes:
                try:
                    if path.is_dir():
                        os.listdir(path)
                    else:
                        with open(path, "rb") as f:
                            f.read(1)
                    results.append(f"{path}=1")
                except OSError:
                    results.append(f"{path}=0")
            os.write(w, ("\n".join([f"note={note}", *results])).encode())
            code = 0
        finally:
            os._exit(code)
    os.close(w)
    data = b""
    while chunk := os.read(r, 65536):
        data += chunk
    os.close(r)
    os.waitpid(pid, 0)
    lines = data.decode().splitlines()
    assert lines and lines[0] == "note=None", lines
    return {line.rsplit("=", 1)[0]: line.endswith("=1") for line in lines[1:]}


@needs_landlock
def test_everything_but_the_denied_paths_stays_readable_database_under_tmp(tmp_path: Path) -> None:
    db = tmp_path / "runs.db"
    db.write_text("rows")
    sibling = tmp_path / "notes.txt"
    sibling.write_text("fine")
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "deep.txt").write_text("fine")
    denials = sandbox.candidate_read_denials(tmp_path / "batch", db, None, [])
    rules = sandbox.read_rules(denials, [Path("/usr")], [])
    # The database's write-ahead log appears after the rules are made: no rule covers it either.
    wal = Path(str(db) + "-wal")
    wal.write_text("later")
    later = tmp_path / "made-later.txt"
    later.write_text("x")
    got = _readable_after(rules, [db, wal, sibling, tmp_path / "sub" / "deep.txt", Path("/etc/hostname"),
                                  Path("/usr/bin")])
    assert got == {str(db): False, str(wal): False, str(sibling): True, str(tmp_path / "sub" / "deep.txt"): True,
                   "/etc/hostname": True, "/usr/bin": True}, got
    assert not any(sandbox._within(str(p), str(db)) for p in rules)


@needs_landlock
def test_a_virtualenv_in_the_home_stays_readable_the_rest_of_the_home_does_not(tmp_path: Path) -> None:
    home = tmp_path / "home"
    (home / "venv" / "lib").mkdir(parents=True)
    (home / "venv" / "lib" / "mod.py").write_text("x = 1")
    (home / ".ssh").mkdir()
    (home / ".ssh" / "id_ed25519").write_text("PRIVATE")
    project = tmp_path / "project"
    for name in ("pkb_tui", "tasks", "docs"):
        (project / name).mkdir(parents=True)
        (project / name / "f.py").write_text("y = 2")
    (project / "README.md").write_text("readme")
    denials = ReadDenials(hard=(), soft=(str(home), str(project)), project_root=str(project))
    rules = sandbox.read_rules(denials, [home / "venv", project], [])
    got = _readable_after(rules, [home / "venv" / "lib" / "mod.py", home / ".ssh" / "id_ed25519",
                                  project / "pkb_tui" / "f.py", project / "tasks" / "f.py", project / "docs" / "f.py",
                                  project / "README.md", project])
    assert got == {
        str(home / "venv" / "lib" / "mod.py"): True, str(home / ".ssh" / "id_ed25519"): False,
        str(project / "pkb_tui" / "f.py"): True, str(project / "tasks" / "f.py"): True,
        str(project / "docs" / "f.py"): False, str(project / "README.md"): False,
        str(project): True,  # listed (imports scan it), its files not read
    }, got


@needs_landlock
def test_a_virtualenv_inside_the_runs_folder_stays_readable_other_batches_do_not(tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    (runs / "venv").mkdir(parents=True)
    (runs / "venv" / "mod.py").write_text("x = 1")
    (runs / "older-batch").mkdir()
    (runs / "older-batch" / "item000.log").write_text("log")
    batch = runs / "this-batch"
    (batch / "scratch" / "own").mkdir(parents=True)
    (batch / "scratch" / "other").mkdir()
    (batch / "scratch" / "other" / "f").write_text("theirs")
    # The fork server's sys.path[0] is the batch's scratch root: never granted.
    denials = sandbox.candidate_read_denials(batch, None, None, [], [runs])
    rules = sandbox.read_rules(denials, [runs / "venv", batch / "scratch"], [batch / "scratch" / "own"])
    got = _readable_after(rules, [runs / "venv" / "mod.py", runs / "older-batch" / "item000.log",
                                  batch / "scratch" / "other" / "f", batch / "scratch" / "own"])
    assert got == {str(runs / "venv" / "mod.py"): True, str(runs / "older-batch" / "item000.log"): False,
                   str(batch / "scratch" / "other" / "f"): False, str(batch / "scratch" / "own"): True}, got


@needs_landlock
def test_a_home_that_is_the_root_leaves_only_what_the_runner_needs(tmp_path: Path) -> None:
    own = tmp_path / "scratch"
    own.mkdir()
    (own / "mine.txt").write_text("mine")
    for denials in (ReadDenials(hard=(), soft=("/",)), ReadDenials(hard=(), soft=("/",), project_root="/")):
        rules = sandbox.read_rules(denials, [Path("/usr")], [own])
        got = _readable_after(rules, [own / "mine.txt", Path("/usr/bin"), Path("/etc/hostname")])
        assert got == {str(own / "mine.txt"): True, "/usr/bin": True, "/etc/hostname": False}, (denials, got)


def test_the_runner_needs_pythons_prefixes_and_every_import_path() -> None:
    import sys

    needs, own = sandbox.runner_needs(Path("/s"), Path("/j"), "/m")
    assert {Path(sys.prefix), Path(sys.base_prefix), Path("/usr"), Path("/proc"), Path("/dev")} <= set(needs)
    assert all(Path(p) in needs for p in sys.path if p)
    assert own == [Path("/s"), Path("/j"), Path("/m")]


@pytest.mark.parametrize("how", ["as made", "in a user namespace"])
def test_a_namespace_of_the_groups_own_reaches_its_loopback_not_the_hosts(how: str) -> None:
    # "in a user namespace": what a judge without root gets (a helper process makes both).
    made = sandbox.make_net_namespace() if how == "as made" else sandbox._net_namespace_by_helper(30.0, user=True)
    if how != "as made" and not isinstance(made, str):
        assert made.user_fd is not None
    if isinstance(made, str):
        pytest.skip(f"no network namespace here: {made} (the run's notes say 'network not restricted')")
    host = socket.socket()
    host.bind(("127.0.0.1", 0))
    host.listen()
    port = host.getsockname()[1]
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        said = []
        try:
            said.append(f"join={sandbox.join_net_namespace(made.net_fd, made.user_fd)}")
            try:
                socket.create_connection(("127.0.0.1", port), timeout=2).close()
                said.append("host=reached")
            except OSError:
                said.append("host=refused")
            own = socket.socket()
            own.bind(("127.0.0.1", port))  # the same port: free in here
            own.listen()
            socket.create_connection(("127.0.0.1", port), timeout=2).close()
            said.append("own=reached")
        except OSError as exc:
            said.append(f"error={exc}")
        finally:
            os.write(w, " ".join(said).encode())
            os._exit(0)
    os.close(w)
    said = os.read(r, 4096).decode()
    os.close(r)
    os.waitpid(pid, 0)
    made.close()
    host.close()
    assert said == "join=None host=refused own=reached", said


def test_the_notes_say_when_the_network_stays_open(monkeypatch: pytest.MonkeyPatch) -> None:
    from pkb_tui.engine.worker import _candidate_sandbox_note

    monkeypatch.delenv("PKB_SANDBOX_NET", raising=False)
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
    assert "network: a namespace of the model's own ranks on this host" in _candidate_sandbox_note(2)
    assert "network not restricted: the candidate's ranks span several nodes" in _candidate_sandbox_note(4)
    monkeypatch.setenv("PKB_SANDBOX_NET", "0")
    assert "network not restricted: PKB_SANDBOX_NET=0" in _candidate_sandbox_note(2)
    monkeypatch.setenv("PKB_SANDBOX_READS", "0")
    if landlock_abi() > 0:
        assert "reads not restricted: PKB_SANDBOX_READS=0" in _candidate_sandbox_note(2)
    monkeypatch.setenv("PKB_SANDBOX", "0")
    assert _candidate_sandbox_note(2) == ("candidate sandbox: writes and reads not restricted (PKB_SANDBOX=0); "
                                          "network not restricted: PKB_SANDBOX=0; "
                                          "named unix sockets reachable: PKB_SANDBOX=0")


class _Listener(Listener):
    """A TCP listener on the host's 127.0.0.1 that keeps whatever arrives."""

    def __init__(self) -> None:
        sock = socket.socket()
        sock.bind(("127.0.0.1", 0))
        sock.listen(16)
        self.port = sock.getsockname()[1]
        super().__init__(sock)


@pytest.mark.timeout(900)
def test_a_candidate_reads_no_secret_and_sends_nothing_out_and_the_honest_model_still_passes(
        cli, tmp_db: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    secret = Path.home() / f".pkb-secret-{uuid.uuid4().hex}"
    secret.write_text("API_KEY=do-not-read")
    tmp_db.write_bytes(b"")  # exists before the batch: the attack must not read it either
    listener = _Listener()
    monkeypatch.setenv("PKB_TEST_SECRET_PATH", str(secret))
    monkeypatch.setenv("PKB_TEST_OTHER_SOLUTION", str(HONEST / "all_reduce.py"))
    monkeypatch.setenv("PKB_TEST_PROJECT", str(ROOT))
    monkeypatch.setenv("PKB_TEST_LISTENER_PORT", str(listener.port))
    other_batch = tmp_db.parent / "pkb-runs" / "20200101-000000-older" / "item000.rank0.log"
    other_batch.parent.mkdir(parents=True)
    other_batch.write_text("another batch's log")
    monkeypatch.setenv("PKB_TEST_OTHER_BATCH_LOG", str(other_batch))
    try:
        models = ",".join([str(ADVERSARIAL / "read-secrets"), str(ADVERSARIAL / "net-exfil"), str(HONEST)])
        result = cli("run", "--task", "all_reduce", "--model", models, "--world-size", "2", "--mode", "cpu",
                     "--size", "small", "--trials", "1", "--no-timing", "--no-profile", "--timeout", "300", "--json")
    finally:
        listener.close()
        secret.unlink(missing_ok=True)
    runs = {r["model"]: r for r in result.json()["runs"]}
    assert {r["status"] for r in runs.values()} == {"passed"}, runs
    (batch,) = [p for p in (tmp_db.parent / "pkb-runs").iterdir() if p.is_dir() and p != other_batch.parent]
    logs = "\n".join(p.read_text(errors="replace") for p in sorted(batch.glob("item*.rank*.candidate.log")))
    # Nothing arrived at the host's listener, from either rank, before or after the group was up.
    assert listener.received == [], listener.received
    assert "connect refused: host listener" in logs and "LEAKED over the network" not in logs, logs
    if landlock_abi() > 0:
        for what in ("home secret", "database", "other model", "project readme", "other batch", "batch scratch listing"):
            assert f"read refused: {what}" in logs, (what, logs)
        assert "LEAKED" not in logs, logs
    notes = runs["torch-p2p"]["notes"]
    assert any("candidate sandbox:" in n and "network: a namespace of the model's own ranks" in n for n in notes), notes
    if landlock_abi() > 0:
        assert any("reads of the home folders, the database" in n for n in notes), notes
    # Every part was in force for every run (a part that failed would say so in a note of its own).
    assert not any("not restricted" in n or "no write sandbox" in n for r in runs.values() for n in r["notes"]), runs
