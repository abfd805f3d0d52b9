"""The bell: a shared page for the timed "run" and its answer where judge and runner spin (GPU
boxes; PKB_SPIN=1 here), instead of a pipe hand-off (~63 us in and ~73 us out on the H200 VM,
inside the window). What the runner writes there is untrusted, as on the pipe."""

from __future__ import annotations

import os
import struct
from pathlib import Path

import pytest
import torch

from pkb_tui.engine import channel

PROBE = Path(__file__).parent / "fixtures" / "solutions" / "bell-probe"


def test_a_message_rung_is_taken_once_and_the_sequence_number_wraps() -> None:
    judge = channel.Bell()
    runner = channel.Bell(os.dup(judge.fd))  # the runner's own mapping of the same page
    last = runner.seq(channel.TO_RUNNER)
    assert runner.take(channel.TO_RUNNER, last) is None
    assert judge.post(channel.TO_RUNNER, {"op": "run", "how": "graph"})
    assert runner.take(channel.TO_RUNNER, last) == {"op": "run", "how": "graph"}
    assert runner.take(channel.TO_RUNNER, runner.seq(channel.TO_RUNNER)) is None
    # A runner that set the judge's-side number to the largest value cannot make posting raise.
    struct.pack_into("<Q", runner._map, 0, 2**64 - 1)
    assert judge.post(channel.TO_RUNNER, {"op": "run"}) and judge.seq(channel.TO_RUNNER) == 0
    assert not judge.post(channel.TO_JUDGE, {"pad": "x" * channel.BELL_BYTES})  # too large: the pipe
    judge.close()
    runner.close()


def test_what_a_runner_writes_on_the_bell_is_checked_like_the_pipe() -> None:
    judge = channel.Bell()
    runner = channel.Bell(os.dup(judge.fd))
    base = channel.Bell.SIZE // 2  # the answer's half
    last = judge.seq(channel.TO_JUDGE)
    struct.pack_into("<I", runner._map, base + 8, channel.BELL_BYTES + 1)
    struct.pack_into("<Q", runner._map, base, last + 1)
    with pytest.raises(channel.ChannelError, match="bytes on the bell"):
        judge.take(channel.TO_JUDGE, last)
    runner._map[base + 64: base + 68] = b"\xff{[1"
    struct.pack_into("<I", runner._map, base + 8, 4)
    with pytest.raises(channel.ChannelError, match="not JSON"):
        judge.take(channel.TO_JUDGE, last)
    runner._map[base + 64: base + 67] = b"[1]"
    struct.pack_into("<I", runner._map, base + 8, 3)
    with pytest.raises(channel.ChannelError, match="not a JSON object"):
        judge.take(channel.TO_JUDGE, last)
    judge.close()
    runner.close()


def test_a_runner_cannot_shrink_the_pages_the_judge_maps() -> None:
    # Shrunk under the judge's mapping, the judge's next access would die of SIGBUS.
    bell = channel.Bell()
    arena = channel.Arena(torch.device("cpu"), 1 << 20)
    for fd in (bell.fd, arena.fd):
        with pytest.raises(OSError):
            os.ftruncate(fd, 0)
    bell.close()
    arena.close()


@pytest.mark.timeout(600)
def test_timed_runs_go_over_the_bell_where_the_harness_spins(cli, tmp_db: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # bell-probe answers zeros to a timed call that came over the pipe: with the bell it passes,
    # without (no spinning on CPU by default) it fails.
    args = ("run", "--task", "all_reduce", "--model", str(PROBE), "--world-size", "1", "--size", "small",
            "--trials", "2", "--iterations", "6", "--warmup", "2", "--no-profile", "--timeout", "300", "--json")
    monkeypatch.setenv("PKB_SPIN", "1")
    (run,) = cli(*args).json()["runs"]
    assert run["status"] == "passed", run
    assert run["speedup"] is not None, run
    monkeypatch.delenv("PKB_SPIN")
    (run,) = cli(*args).json()["runs"]
    assert run["status"] == "failed", run


def test_a_runner_cannot_seal_the_arena_against_the_judge_growing_it() -> None:
    import fcntl

    arena = channel.Arena(torch.device("cpu"), 4096)
    with pytest.raises(OSError):
        fcntl.fcntl(arena.fd, fcntl.F_ADD_SEALS, fcntl.F_SEAL_GROW)
    bigger = arena.grown(1 << 20)
    assert bigger.nbytes >= 1 << 20
    bigger.close()
