"""The GPU gate's driver calls (engine.gate) where CI has no GPU: a missing driver or a refusing
one is a sentence, never a crash or a silent pass. (The gate itself runs on the GPU box:
bench/judge_gpu_check.py --parts gate; bench/device_check.sh gate.)"""

from __future__ import annotations

import ctypes

import pytest

from pkb_tui.engine import gate


@pytest.fixture
def fresh_driver(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(gate, "_driver", None)
    monkeypatch.setattr(gate, "_unavailable", None)


def test_without_a_cuda_driver_the_gate_says_why(fresh_driver: None, monkeypatch: pytest.MonkeyPatch) -> None:
    def no_library(name: str, *args: object, **kwargs: object) -> object:
        raise OSError(f"{name}: cannot open shared object file: No such file or directory")

    monkeypatch.setattr(ctypes, "CDLL", no_library)
    with pytest.raises(gate.GateError, match="CUDA driver library could not be opened"):
        gate.wait(0, 0, 1)
    with pytest.raises(gate.GateError, match="could not be opened"):  # remembered, not retried
        gate.write(0, 0, 1)


def test_a_driver_that_refuses_stream_memory_operations_is_named(fresh_driver: None,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[tuple[int, int]] = []

    class Refusing:
        def __init__(self) -> None:
            self.restype = self.argtypes = None

        def __call__(self, stream: object, address: int, value: int, flags: int) -> int:
            calls.append((address, value))
            return 801  # CUDA_ERROR_NOT_SUPPORTED

    class Driver:
        cuStreamWaitValue32_v2 = Refusing()
        cuStreamWriteValue32_v2 = Refusing()

    monkeypatch.setattr(ctypes, "CDLL", lambda name: Driver())
    with pytest.raises(gate.GateError, match="cuStreamWaitValue32 failed .*801.*not supported"):
        gate.wait(0, 4096, 7)
    with pytest.raises(gate.GateError, match="cuStreamWriteValue32 failed"):
        gate.write(0, 4100, -1)
    assert calls == [(4096, 7), (4100, 0xFFFFFFFF)]  # a value is a 32-bit word


def test_the_flags_sit_before_every_tensor_of_a_gpu_layout() -> None:
    import torch

    from pkb_tui.engine import channel

    layout = channel.Layout(gate.GATE_BYTES)
    spec = layout.place(torch.zeros(3))
    assert spec["t"][0] >= gate.GATE_BYTES > max(gate.GO_OFFSET, gate.DONE_OFFSET) + 4 - 1


# ---------------------------------------------------------------- the judge's side of a gated block
# Rank._gated_block with the GPU (the gate's flags and events) and the runner process as doubles:
# the order of the protocol and what each failure becomes. The real gate ran on the H100
# (bench/judge_gpu_check.py --parts gate: its three attacks failed, an honest model passed).

class FakeGate:
    def __init__(self, ends: bool = True) -> None:
        self.ends = ends
        self.log: list[str] = []
        self.seq = 0

    def open(self, arena: object, out_start: int, end: int, flush: object) -> object:
        from types import SimpleNamespace

        self.seq += 1
        self.log.append("open")
        return SimpleNamespace(seq=self.seq)

    def close(self, window: object) -> None:
        self.log.append("close")

    def release(self, window: object, *, done_too: bool = False) -> None:
        self.log.append("release+done" if done_too else "release")

    def ended(self, window: object) -> bool:
        return self.ends

    def elapsed_us(self, window: object) -> float:
        return 1234.5


class FakeRunner:
    label = "candidate"

    def __init__(self, replies: dict[str, list[object]], answers: list[object]) -> None:
        from types import SimpleNamespace

        self.arena = SimpleNamespace(tensor=None)
        self.replies, self.answers = replies, answers
        self.sent: list[dict] = []
        self.paused = 0

    def request(self, message: dict, deadline: float, abort: object = None) -> dict:
        self.sent.append(message)
        reply = self.replies[message["op"]].pop(0)
        if isinstance(reply, Exception):
            raise reply
        return reply  # type: ignore[return-value]

    def answer(self, deadline: float, abort: object = None) -> dict:
        reply = self.answers.pop(0)
        if isinstance(reply, Exception):
            raise reply
        return reply  # type: ignore[return-value]

    def pause(self) -> None:
        self.paused += 1


def _judge(monkeypatch: pytest.MonkeyPatch) -> object:
    from types import MethodType, SimpleNamespace

    from pkb_tui.engine import worker

    monkeypatch.setattr(worker, "IDLE_SETTLE_S", 0.02)
    judge = SimpleNamespace(rank=0, current_item=0, _abort_epoch=0, gate_stuck=None, killed=[], agreed=[])

    def agree(value: object) -> list[object]:
        judge.agreed.append(value)
        return [value]

    judge.agree = agree
    judge._signal_abort = lambda item: None
    judge._l2_flush_buffer = lambda: None
    judge._flush_l2 = lambda: None
    judge._kill_candidate = lambda runner: judge.killed.append(runner)
    for name in ("_gated_block", "_end_window", "_raise_agreed"):
        setattr(judge, name, MethodType(getattr(worker.Rank, name), judge))
    return judge


def test_a_gated_block_is_captured_first_then_released_once_and_timed_on_the_gpu(monkeypatch: pytest.MonkeyPatch) -> None:
    judge, fake_gate = _judge(monkeypatch), FakeGate()
    runner = FakeRunner({"capture": [{"ok": True, "captured": True}], "run": [{"ok": True, "gated": True}]},
                        [{"ok": True, "gated": True}])
    block, reply = judge._gated_block(fake_gate, runner, None, 256, 4096, 40, "graph", 1e12, None)
    assert [m["op"] for m in runner.sent] == ["capture", "run"] and runner.sent[1]["gate"] == 1
    assert fake_gate.log == ["open", "close", "release"]
    assert (block.wall_us, block.reported_us, block.calls) == (1234.5, 1234.5, 40) and not reply.get("graph_error")
    assert len(judge.agreed) == 3 and runner.paused == 1  # capture, window enqueued, window ended


def test_a_graph_that_cannot_be_captured_opens_no_window(monkeypatch: pytest.MonkeyPatch) -> None:
    judge, fake_gate = _judge(monkeypatch), FakeGate()
    runner = FakeRunner({"capture": [{"ok": True, "graph_error": "not capturable: a host sync"}]}, [])
    block, reply = judge._gated_block(fake_gate, runner, None, 256, 4096, 40, "graph", 1e12, None)
    assert reply["graph_error"] == "not capturable: a host sync" and fake_gate.log == []


def test_a_runner_that_answers_without_the_gate_fails_as_tampering_and_the_window_is_ended(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from pkb_tui.engine.worker import CandidateFailure

    judge, fake_gate = _judge(monkeypatch), FakeGate()
    runner = FakeRunner({"capture": [{"ok": True}], "run": [{"ok": True, "device_us": 1.0}]}, [])
    with pytest.raises(CandidateFailure, match="without timing it through the GPU gate") as raised:
        judge._gated_block(fake_gate, runner, None, 256, 4096, 40, "graph", 1e12, None)
    assert raised.value.status == "failed" and fake_gate.log == ["open", "close", "release+done"]


def test_a_runner_that_enqueues_only_once_released_loses_the_figure_not_the_run(monkeypatch: pytest.MonkeyPatch) -> None:
    from pkb_tui.engine.worker import CandidateFailure

    judge, fake_gate = _judge(monkeypatch), FakeGate()
    silent = CandidateFailure("timeout", "the candidate did not answer within its timeout on rank 0")
    runner = FakeRunner({"capture": [{"ok": True}], "run": [silent]},
                        [{"ok": True, "gated": True}, {"ok": True, "gated": True}])
    block, reply = judge._gated_block(fake_gate, runner, None, 256, 4096, 40, "graph", 1e12, None)
    assert reply["graph_error"].startswith("not timed: the candidate's runner on rank 0 enqueued its graph block only")
    assert fake_gate.log == ["open", "release", "close", "release"] and runner.answers == []


def test_a_window_that_never_ends_ends_the_runner_and_fails_the_run(monkeypatch: pytest.MonkeyPatch) -> None:
    from pkb_tui.engine.worker import CandidateFailure

    judge, fake_gate = _judge(monkeypatch), FakeGate(ends=False)
    runner = FakeRunner({"capture": [{"ok": True}], "run": [{"ok": True, "gated": True}]}, [{"ok": True, "gated": True}])
    with pytest.raises(CandidateFailure, match="never signalled its end") as raised:
        judge._gated_block(fake_gate, runner, None, 256, 4096, 40, "graph", 1e12, None)
    assert raised.value.status == "failed" and judge.killed == [runner]
    assert fake_gate.log[-1] == "release+done" and judge.gate_stuck  # still held: the launch ends before the next item


class _Log:
    """What the judge's side of a window did, in order: stream waits and writes, copies, fills."""

    def __init__(self) -> None:
        self.steps: list[tuple] = []


class _Bytes:
    """A byte buffer (the arena or the mirror) whose slices log what is done to them."""

    def __init__(self, name: str, log: _Log, size: int) -> None:
        self.name, self.log, self.size = name, log, size

    def data_ptr(self) -> int:
        return {"arena": 1 << 20, "mirror": 2 << 20}.get(self.name, 3 << 20)

    def numel(self) -> int:
        return self.size

    def __getitem__(self, part: slice) -> "_Slice":
        return _Slice(self, part.start or 0, self.size if part.stop is None else part.stop)


class _Slice:
    def __init__(self, buffer: _Bytes, start: int, stop: int) -> None:
        self.buffer, self.start, self.stop = buffer, start, stop

    def copy_(self, source: "_Slice") -> None:
        self.buffer.log.steps.append(("copy", (source.buffer.name, source.start, source.stop),
                                      (self.buffer.name, self.start, self.stop)))

    def fill_(self, value: int) -> None:
        self.buffer.log.steps.append(("fill", (self.buffer.name, self.start, self.stop), value))

    def zero_(self) -> None:
        self.fill_(0)


def _fake_torch(log: _Log) -> object:
    import contextlib
    import types

    class Stream:
        cuda_stream = 7

        def synchronize(self) -> None:
            log.steps.append(("synchronize",))

    class Event:
        def __init__(self, enable_timing: bool = False) -> None:
            pass

        def record(self, stream: object = None) -> None:
            log.steps.append(("event",))

    cuda = types.SimpleNamespace(Stream=lambda device=None: Stream(), Event=Event,
                                 stream=lambda stream: contextlib.nullcontext())
    return types.SimpleNamespace(cuda=cuda, uint8="uint8",
                                 empty=lambda n, dtype=None, device=None: _Bytes("mirror", log, n))


def test_no_input_reaches_the_arena_before_go_even_on_a_layouts_first_window(monkeypatch: pytest.MonkeyPatch) -> None:
    # The runner is awake while the judge opens a window: inputs in the arena before go would let it
    # compute the block outside the window (the head-start attack). The first window on a layout
    # also runs the window's kernels once unheld (lazy module loading): on the output slots only.
    log = _Log()
    monkeypatch.setattr(gate, "wait", lambda stream, address, value: log.steps.append(("wait", address, value)))
    judge = gate.JudgeGate.__new__(gate.JudgeGate)
    judge.torch, judge.device, judge.mirror, judge.seq, judge.warmed = _fake_torch(log), "cuda:0", None, 0, set()
    judge.stream = judge.releaser = judge.torch.cuda.Stream()  # type: ignore[attr-defined]
    arena = _Bytes("arena", log, 4096)
    out_start, end = 1024, 4096
    for _ in range(2):  # the layout's first window (warmed first) and a second one (not again)
        judge.stage(arena, end)
        log.steps.clear()
        judge.open(arena, out_start, end, flush=lambda: log.steps.append(("flush",)))
        go = next(i for i, step in enumerate(log.steps) if step[0] == "wait")
        before, after = log.steps[:go], log.steps[go + 1:]
        assert log.steps[go][1] == arena.data_ptr() + gate.GO_OFFSET
        assert not [s for s in before if s[0] == "copy" and s[2][0] == "arena"]  # nothing copied into the arena
        assert not [s for s in before if s[0] == "fill" and s[1][0] == "arena" and s[1][1] < out_start]
        assert ("copy", ("mirror", gate.GATE_BYTES, out_start), ("arena", gate.GATE_BYTES, out_start)) in after
        assert ("fill", ("arena", out_start, end), 0xFF) in after and ("flush",) in after
        assert after[0] == ("event",)  # E0 first: the inputs land inside the window
    assert len(judge.warmed) == 1
