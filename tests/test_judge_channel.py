"""The judge's channels on their own: the authenticated uplink to the launcher (engine.uplink), and
the pipes and shared memory between a judge and its runner."""

from __future__ import annotations

import json
import os
import threading
from pathlib import Path

import pytest
import torch

from pkb_tui.engine import channel, uplink
from pkb_tui.engine import events as ev
from pkb_tui.engine.logs import read_regular
from pkb_tui.engine.nodes import create_new
from pkb_tui.engine.uplink import Uplink, UplinkError, UplinkServer

KEY = b"k" * 32


def _server_and_judge(key: bytes = KEY) -> tuple[UplinkServer, Uplink]:
    server = UplinkServer({"judge": key})
    accepted: list[Uplink] = []
    thread = threading.Thread(target=lambda: accepted.append(Uplink(("127.0.0.1", server.port), key, "judge")))
    thread.start()
    while thread.is_alive():
        server.poll(0.05)
    return server, accepted[0]


def _messages(server: UplinkServer, seconds: float = 0.5) -> list[dict]:
    import time

    out, end = [], time.monotonic() + seconds
    while time.monotonic() < end:
        out += [m.body for m in server.poll(0.05)]
    return out


def test_only_lines_signed_with_the_launch_key_become_events() -> None:
    server, judge = _server_and_judge()
    real = ev.RunFinished(item=0, status="failed", detail="wrong").to_json()
    judge.send({"t": "event", "event": json.loads(real)})
    got = [m for m in _messages(server) if m.get("t") == "event"]
    assert [(e["event"]["event"], e["event"]["status"]) for e in got] == [("run_finished", "failed")]
    # A line whose body was changed after signing (or replayed out of order) cuts the connection.
    forged = judge.session.seal({"t": "event", "event": {"event": "run_finished", "item": 0, "status": "failed"}})
    judge.sock.sendall(forged.replace(b"failed", b"passed"))
    after = _messages(server)
    assert [m["t"] for m in after] == ["closed"] and "not signed" in after[0]["why"]
    assert server.rejected == 1
    judge.close()
    # Someone with another key (a candidate guessing) never gets a session.
    with pytest.raises(UplinkError):
        _server_and_judge_with_wrong_key(server)
    server.close()


def _server_and_judge_with_wrong_key(server: UplinkServer) -> None:
    errors: list[Exception] = []

    def connect() -> None:
        try:
            Uplink(("127.0.0.1", server.port), b"x" * 32, "judge", timeout_s=3.0)
        except Exception as exc:  # noqa: BLE001
            errors.append(exc)

    thread = threading.Thread(target=connect)
    thread.start()
    while thread.is_alive():
        server.poll(0.05)
    if errors:
        raise errors[0]


def test_a_stranger_that_connects_and_says_nothing_does_not_stall_the_launcher(tmp_path: Path) -> None:
    import socket
    import time

    server = UplinkServer({"judge": KEY})
    stranger = socket.create_connection(("127.0.0.1", server.port))
    stranger.sendall(b"not a hello, and no newline")
    started = time.monotonic()
    server.poll(0.1)  # returns: the server never blocks on a connection
    assert time.monotonic() - started < 5
    stranger.sendall(b"x" * 5000)  # a hello longer than any real one
    _messages(server, 0.3)
    assert server.rejected == 1 and server.peers() == []
    # Sockets opened by the hundred (to run the launcher out of descriptors) are closed, oldest first.
    flood = []
    for _ in range(100):
        flood.append(socket.create_connection(("127.0.0.1", server.port), timeout=5))
        server.poll(0.0)  # the launcher's loop runs all the while
    _messages(server, 0.5)
    assert len(server._conns) <= uplink.MAX_PENDING_HELLOS and server.rejected >= 1 + 100 - uplink.MAX_PENDING_HELLOS
    server.close()
    stranger.close()
    for sock in flood:
        sock.close()
    # The spec file is still created only where nothing was planted.
    link = tmp_path / "spec.1.json"
    link.symlink_to(tmp_path / "elsewhere")
    with pytest.raises(FileExistsError):
        create_new(link, b"x")
    assert read_regular(link) == ""


def test_messages_are_framed_json_and_a_broken_one_is_a_channel_error() -> None:
    r, w = os.pipe()
    channel.send(w, {"op": "run", "how": "eager"})
    assert channel.receive(r, deadline=None) == {"op": "run", "how": "eager"}
    os.write(w, (10).to_bytes(4, "big") + b"not json!!")
    with pytest.raises(channel.ChannelError):
        channel.receive(r)
    os.write(w, (channel.MAX_MESSAGE_BYTES + 1).to_bytes(4, "big"))
    with pytest.raises(channel.ChannelError):
        channel.receive(r)
    import time

    with pytest.raises(channel.ChannelError, match="deadline"):
        channel.receive(r, deadline=time.monotonic() + 0.1)
    os.close(w)
    with pytest.raises(channel.ChannelError, match="closed"):
        channel.receive(r)
    os.close(r)


def test_a_layout_places_values_in_the_arena_and_builds_them_back_on_the_other_side() -> None:
    value = (torch.randn(3, 5), {"idx": torch.arange(7), "scale": 0.5}, [torch.ones(2, dtype=torch.bfloat16), None])
    layout = channel.Layout()
    spec = layout.place(value)
    arena = channel.Arena(torch.device("cpu"), layout.end)
    channel.write(value, spec, arena.tensor)
    # The runner maps the same memfd (here: the same process, through the exported description).
    other = channel.attach(arena.export(), arena.fd, torch.device("cpu"))
    built = channel.build(spec, other)
    assert torch.equal(built[0], value[0]) and torch.equal(built[1]["idx"], value[1]["idx"])
    assert built[1]["scale"] == 0.5 and built[2][1] is None and built[2][0].dtype == torch.bfloat16
    built[0].fill_(7.0)  # a write on the runner's side is seen by the judge
    assert float(channel.build(spec, arena.tensor)[0].sum()) == 7.0 * 15
    with pytest.raises(channel.ChannelError):
        channel.build({"t": [layout.end + 4096, "float32", [4]]}, other)  # outside the arena
    arena.close()


def test_a_cpu_arena_grows_in_place_and_the_runner_maps_it_again() -> None:
    arena = channel.Arena(torch.device("cpu"), 4096)
    fd = arena.fd
    arena.tensor[:4].copy_(torch.tensor([1, 2, 3, 4], dtype=torch.uint8))
    bigger = arena.grown(1 << 20)
    assert bigger.fd == fd and bigger.nbytes >= 1 << 20  # the runner keeps its descriptor
    assert bigger.tensor[:4].tolist() == [1, 2, 3, 4]  # what was written stays
    remapped = channel.attach(bigger.export(), bigger.fd, torch.device("cpu"))
    remapped[(1 << 20) - 1] = 9  # the runner's new mapping reaches the new end
    assert int(bigger.tensor[(1 << 20) - 1]) == 9
    bigger.close()
