"""Run a function on N gloo ranks in real processes (torch.multiprocessing spawn) and collect results.

For tests of task baselines and solutions without the launcher. The function must be importable
(top level of a module) and its return value picklable.
"""

from __future__ import annotations

import os
import tempfile
import traceback
from typing import Any, Callable

import torch.distributed as dist
import torch.multiprocessing as mp


def _entry(rank: int, world_size: int, init_file: str, fn: Callable, args: tuple, queue) -> None:
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    import torch

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world_size)
    try:
        queue.put((rank, "ok", fn(rank, world_size, *args)))
    except BaseException:  # report, do not hang the parent
        queue.put((rank, "error", traceback.format_exc()))
    finally:
        dist.destroy_process_group()


def run_distributed(world_size: int, fn: Callable, *args: Any, timeout_s: float = 300) -> list[Any]:
    """fn(rank, world_size, *args) on every rank; returns the per-rank results in rank order."""
    ctx = mp.get_context("spawn")
    queue = ctx.SimpleQueue()
    with tempfile.TemporaryDirectory() as tmp:
        init_file = os.path.join(tmp, "rendezvous")
        procs = [
            ctx.Process(target=_entry, args=(r, world_size, init_file, fn, args, queue), daemon=True)
            for r in range(world_size)
        ]
        for p in procs:
            p.start()
        results: dict[int, Any] = {}
        errors: list[str] = []
        import time

        deadline = time.monotonic() + timeout_s
        while len(results) + len(errors) < world_size:
            if time.monotonic() > deadline:
                break
            if queue.empty():
                if all(not p.is_alive() for p in procs) and queue.empty():
                    break
                time.sleep(0.05)
                continue
            rank, status, value = queue.get()
            if status == "ok":
                results[rank] = value
            else:
                errors.append(f"rank {rank}:\n{value}")
        for p in procs:
            p.join(timeout=5)
            if p.is_alive():
                p.kill()
        if errors:
            raise AssertionError("\n".join(errors))
        if len(results) != world_size:
            raise AssertionError(f"only {len(results)} of {world_size} ranks reported (crash or timeout)")
        return [results[r] for r in range(world_size)]


def rank_failures(per_rank: list[dict[str, dict]]) -> list[str]:
    """From per-rank {check: {"correct", "message"[, "skipped"]}} results, one line per failed check."""
    return [
        f"rank {rank} {key}: {result['message']}"
        for rank, results in enumerate(per_rank) for key, result in results.items()
        if not result.get("skipped") and not result["correct"]
    ]
