"""The interposer: traffic measured from a baseline's torch.distributed calls, on real gloo ranks."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

from pkb_tui.engine.interposer import MEASURED_SOURCE, Interposer, MeasureRequest, measure
from tasks.base import load_task
from tests._dist import run_distributed

COLLECTIVES = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all", "broadcast", "reduce", "gather", "scatter")
# Where the hand-written model's memory figure claims what the measurement counts (inputs read +
# outputs written), the two must agree too; elsewhere the hand-written model counts the
# algorithm's own reads (docs/traffic-audit.md).
SAME_MEMORY_CLAIM = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all", "broadcast", "gather")


@pytest.mark.timeout(900)
@pytest.mark.parametrize("world_size", [1, 2, 4, 8])
def test_measured_traffic_of_the_eight_collectives_equals_their_hand_written_models(world_size: int) -> None:
    measured = measure(MeasureRequest(COLLECTIVES, world_size, "float32", "small"))
    mismatches = []
    for task_id in COLLECTIVES:
        per_rank = measured[task_id]
        assert not isinstance(per_rank, str), f"{task_id}: {per_rank}"
        task = load_task(task_id)
        for rank, measurement in enumerate(per_rank):
            mine = measurement.traffic()
            hand = task.traffic(task.context(rank=rank, world_size=world_size, dtype="float32", size="small"))
            assert mine.source == MEASURED_SOURCE and mine.messages == hand.messages == 1
            fields = ["send_bytes", "recv_bytes", "payload_bytes"] + (["memory_bytes"] if task_id in SAME_MEMORY_CLAIM else [])
            for name in fields:
                if getattr(mine, name) != getattr(hand, name):
                    mismatches.append(f"{task_id} rank {rank} {name}: measured {getattr(mine, name)}, hand-written {getattr(hand, name)}")
            assert [c.kind for c in measurement.calls] == [task_id], "one outermost call per baseline"
            assert all(c.group_size == world_size for c in measurement.calls)
    assert not mismatches, "\n".join(mismatches)


def _p2p_and_objects(rank: int, world_size: int) -> list[tuple[str, int, int, int]]:
    """Point-to-point, batched and object calls recorded on a real gloo pair."""
    interposer = Interposer().install()
    try:
        interposer.recording = True
        peer = 1 - rank
        x = torch.full((100,), float(rank))  # 400 bytes
        if rank == 0:
            dist.send(x, dst=peer)
        else:
            dist.recv(x, src=peer)
        buf = torch.empty(50, dtype=torch.float64)  # 400 bytes
        ops = [dist.P2POp(dist.isend, torch.ones(25, dtype=torch.float64), peer), dist.P2POp(dist.irecv, buf, peer)]
        for work in dist.batch_isend_irecv(ops):
            work.wait()
        gathered = [None] * world_size
        dist.all_gather_object(gathered, {"rank": rank})
        objects = [{"payload": "x" * 1000} if rank == 0 else None]
        dist.broadcast_object_list(objects, src=0)
        dist.barrier()
        return [(c.kind, c.bytes, c.send_bytes, c.recv_bytes) for c in interposer.calls]
    finally:
        interposer.uninstall()


@pytest.mark.timeout(300)
def test_point_to_point_batched_and_object_calls_are_recorded_once_each_with_their_bytes() -> None:
    per_rank = run_distributed(2, _p2p_and_objects)
    kinds = [[call[0] for call in calls] for calls in per_rank]
    # all_gather_object and broadcast_object_list are built on tensor collectives: recorded once, as themselves
    assert kinds[0] == ["send", "send", "recv", "all_gather_object", "broadcast_object_list", "barrier"]
    assert kinds[1] == ["recv", "send", "recv", "all_gather_object", "broadcast_object_list", "barrier"]
    assert per_rank[0][0] == ("send", 400, 400, 0) and per_rank[1][0] == ("recv", 400, 0, 400)
    assert per_rank[0][1][1:] == (200, 200, 0) and per_rank[0][2][1:] == (400, 0, 400)
    root_bcast, leaf_bcast = per_rank[0][4], per_rank[1][4]
    assert root_bcast[2] == leaf_bcast[3] > 1000 and root_bcast[3] == 0 and leaf_bcast[2] == 0
    own, other = per_rank[0][3], per_rank[1][3]
    assert own[2] == own[1] and own[3] == other[1]  # sends its pickled dict once, receives the peer's


def test_the_interposer_puts_every_wrapped_function_back() -> None:
    before = (dist.all_reduce, dist.batch_isend_irecv, torch.distributed.distributed_c10d.all_gather_object)
    with Interposer():
        assert getattr(dist.all_reduce, "__pkb_interposed__", False)
        assert dist.all_reduce is torch.distributed.distributed_c10d.all_reduce
    assert (dist.all_reduce, dist.batch_isend_irecv, torch.distributed.distributed_c10d.all_gather_object) == before


def _stacked_all_gather(rank: int, world_size: int) -> tuple[list[str], list[tuple[str, int, int]]]:
    """PKB's 2_allgather shape: an output of (world_size, M, N), which NCCL takes and gloo rejects."""
    interposer = Interposer().install()
    try:
        interposer.tolerate_backend_errors = interposer.recording = True
        x = torch.ones(4, 8)
        dist.all_gather_into_tensor(x.new_empty((world_size, 4, 8)), x)
        return interposer.backend_errors, [(c.kind, c.send_bytes, c.recv_bytes) for c in interposer.calls]
    finally:
        interposer.uninstall()


@pytest.mark.timeout(300)
def test_a_call_gloo_rejects_on_its_arguments_is_measured_as_if_it_had_run() -> None:
    for errors, calls in run_distributed(2, _stacked_all_gather):
        assert len(errors) == 1 and errors[0].startswith("all_gather_into_tensor")
        assert calls == [("all_gather", 128, 128)]
