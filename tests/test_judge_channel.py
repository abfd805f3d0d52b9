"""The judge's channels on their own: the signed event file the launcher reads, and the pipes and
shared memory between a judge and its runner."""

from __future__ import annotations

import os
import threading
from pathlib import Path

import pytest
import torch

from pkb_tui.engine import channel
from pkb_tui.engine import events as ev
from pkb_tui.engine.launcher import _create_new, _EventTail
from pkb_tui.engine.logs import read_regular

KEY = b"k" * 32


def test_only_lines_signed_with_the_launch_key_become_events(tmp_path: Path) -> None:
    path = tmp_path / "events.1.jsonl"
    real = ev.RunFinished(item=0, status="failed", detail="wrong").to_json()
    forged = ev.RunFinished(item=0, status="passed").to_json()
    with open(path, "w") as f:
        f.write(ev.sign(KEY, real) + "\n")
        f.write(forged + "\n")                           # unsigned
        f.write(ev.sign(b"x" * 32, forged) + "\n")       # signed with another key
        f.write(ev.sign(KEY, real)[:-3] + "abc" + "\n")  # body changed after signing
    tail = _EventTail(path, KEY)
    events = tail.read()
    assert [(e.name, e.status) for e in events] == [("run_finished", "failed")]
    assert tail.forged == 3


def test_a_link_or_fifo_planted_for_the_event_file_is_not_followed(tmp_path: Path) -> None:
    target = tmp_path / "elsewhere.jsonl"
    target.write_text(ev.sign(KEY, ev.RunFinished(item=0, status="passed").to_json()) + "\n")
    link = tmp_path / "events.1.jsonl"
    link.symlink_to(target)
    assert _EventTail(link, KEY).read() == []
    fifo = tmp_path / "events.2.jsonl"
    os.mkfifo(fifo)
    done = threading.Event()

    def read() -> None:
        _EventTail(fifo, KEY).read()
        done.set()

    threading.Thread(target=read, daemon=True).start()
    assert done.wait(5), "reading a FIFO planted as the event file hung the launcher"
    assert read_regular(link) == "" and read_regular(fifo) == ""
    with pytest.raises(FileExistsError):
        _create_new(link, b"x")  # never written through a planted link
    assert "passed" in target.read_text()


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
