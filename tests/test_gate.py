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
