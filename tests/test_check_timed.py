"""The judge's check of timed outputs (engine.worker.check_timed) and the sampled median of the
per-output rule (engine.compare): chunked stacks, a wrong call found in any chunk, outputs of
several shapes, and a typical error still caught when the median is taken over a sample."""

from __future__ import annotations

import random

import torch

from pkb_tui.engine import compare, worker
from tasks.base import load_task


def _calls(n: int, elements: int, seed: int = 0) -> tuple[list[torch.Tensor], list[torch.Tensor], list[torch.Tensor]]:
    gen = torch.Generator().manual_seed(seed)
    truths = [torch.randn(elements, generator=gen, dtype=torch.float64) for _ in range(n)]
    expected = [t.to(torch.bfloat16) for t in truths]
    return [e.clone() for e in expected], expected, truths


def test_a_wrong_call_is_found_in_a_later_chunk(monkeypatch) -> None:
    monkeypatch.setattr(worker, "STACK_ELEMENTS", 100)  # 2 calls of 50 elements a chunk
    monkeypatch.setattr(worker, "TIMED_SAMPLE", 0)  # the chunks alone must find it
    outputs, expected, truths = _calls(10, 50)
    outputs[7] = outputs[7] + 1.0
    rule = worker.Rule(load_task("all_reduce"))
    message = worker.check_timed(outputs, expected, truths, rule, 3, random.Random(1))
    assert message is not None and "timed call 7 of round 3" in message, message


def test_right_calls_pass_in_chunks(monkeypatch) -> None:
    monkeypatch.setattr(worker, "STACK_ELEMENTS", 100)
    outputs, expected, truths = _calls(9, 50)
    assert worker.check_timed(outputs, expected, truths, worker.Rule(load_task("all_reduce")), 0, random.Random(1)) is None


def test_outputs_of_several_shapes_are_judged_one_by_one() -> None:
    outputs, expected, truths = _calls(4, 64)
    small_out, small_exp, small_truth = _calls(1, 8, seed=5)
    outputs[2], expected[2], truths[2] = small_out[0] * 0, small_exp[0], small_truth[0]  # wrong, and another shape
    message = worker.check_timed(outputs, expected, truths, worker.Rule(load_task("all_reduce")), 1, random.Random(1))
    assert message is not None and "timed call 2" in message, message


def test_a_typical_error_is_caught_when_the_median_is_sampled(monkeypatch) -> None:
    monkeypatch.setattr(compare, "MEDIAN_SAMPLE", 4096)
    truth = torch.randn(200_000, generator=torch.Generator().manual_seed(2), dtype=torch.float64)
    expected = truth.to(torch.bfloat16)
    assert compare._sample_index(200_000, truth.device) is not None
    assert compare._sample_index(4096, truth.device) is None
    tolerance = load_task("all_reduce").spec.output_tolerance
    honest = compare.judge_outputs(expected.clone(), expected, truth, tolerance, "out")
    assert honest.correct, honest.message
    # int8 transport, one scale per 32 elements: every element a little wrong (the median's case)
    blocks = truth.to(torch.float32).reshape(-1, 32)
    scale = blocks.abs().amax(dim=1, keepdim=True) / 127
    lossy = ((blocks / scale).round().clamp(-127, 127) * scale).reshape(-1).to(torch.bfloat16)
    verdict = compare.judge_outputs(lossy, expected, truth, tolerance, "out")
    assert not verdict.correct and "typical" in (verdict.message or ""), verdict.message


class _FakeGpu:
    """Probe waits in us as the judge would see them; time moves only when the judge sleeps."""

    def __init__(self, busy_until: float = 0.0, busy_until_stopped: bool = False, busy_forever: bool = False) -> None:
        self.now, self.busy_until, self.busy_until_stopped, self.busy_forever = 0.0, busy_until, busy_until_stopped, busy_forever
        self.stopped = False

    def probe_us(self) -> float:
        busy = self.busy_forever or self.now < self.busy_until or (self.busy_until_stopped and not self.stopped)
        return 2_000.0 if busy else 30.0

    def sleep(self, seconds: float) -> None:
        self.now += seconds

    def stop(self) -> None:
        self.stopped = True


def _await(gpu: _FakeGpu):
    return worker.await_idle_gpu(gpu.probe_us, gpu.stop, sleep=gpu.sleep, clock=lambda: gpu.now)


def test_an_idle_gpu_or_one_that_goes_idle_by_itself_lets_the_baseline_be_timed() -> None:
    for gpu in (_FakeGpu(), _FakeGpu(busy_until=0.2)):
        assert _await(gpu) is None and not gpu.stopped


def test_gpu_work_left_running_by_the_stopped_candidate_fails_it_as_tampering() -> None:
    gpu = _FakeGpu(busy_until_stopped=True)
    failure = _await(gpu)
    assert gpu.stopped and failure is not None and failure.status == "failed"
    assert "timing tampered" in failure.message


def test_a_gpu_busy_with_someone_elses_work_is_an_error_not_the_candidates_fault() -> None:
    gpu = _FakeGpu(busy_forever=True)
    failure = _await(gpu)
    assert failure is not None and failure.status == "error" and worker.GPU_BUSY in failure.message
    assert not worker._candidate_fault(failure, True)


def test_a_trace_the_runner_planted_is_copied_only_as_a_regular_file_and_only_so_much(tmp_path) -> None:
    # The runner's scratch is the candidate's: what it leaves at the trace's path is hostile.
    import os

    secret = tmp_path / "secret"
    secret.write_text("not for the batch folder")
    link, fifo, big, good = (tmp_path / n for n in ("link", "fifo", "big", "good"))
    link.symlink_to(secret)
    os.mkfifo(fifo)
    big.write_bytes(b"x" * 2048)
    good.write_bytes(b'{"traceEvents": []}')
    target = tmp_path / "copied"
    assert not worker._copy_regular_file(link, target, 1024) and not target.exists()
    assert not worker._copy_regular_file(fifo, target, 1024) and not target.exists()  # would block on a read
    assert not worker._copy_regular_file(big, target, 1024) and not target.exists()
    assert not worker._copy_regular_file(tmp_path / "missing", target, 1024)
    assert worker._copy_regular_file(good, target, 1024) and target.read_bytes() == good.read_bytes()
