"""How much work one stream takes behind a held stream wait before the host blocks (GPU only).

The GPU gate (engine.gate) has the runner enqueue its whole graph block behind a wait on the go
flag. On the H100 (2026-12-06) the replay of a timed block of dp_int8_allreduce's baseline did not
return until go was released: the host was held in cudaGraphLaunch. This probe finds where that
starts, in one process: for eager kernels and for CUDA graphs of K kernel nodes, fresh (first
launch) and launched once before, whether the launch behind a held wait returns within 0.5 s.

    python bench/gate_depth.py [--sizes 64,256,...]
"""

from __future__ import annotations

import argparse
import ctypes
import threading
import time

import torch

from pkb_tui.engine import gate


def graph_nodes(g: torch.cuda.CUDAGraph) -> int | None:
    """The captured graph's node count (torch keeps the cudaGraph_t with keep_graph=True)."""
    try:
        raw = g.raw_cuda_graph()
    except (AttributeError, RuntimeError):
        return None
    lib = ctypes.CDLL("libcuda.so.1")
    count = ctypes.c_size_t(0)
    fn = lib.cuGraphGetNodes
    fn.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.POINTER(ctypes.c_size_t)]
    code = fn(ctypes.c_void_p(raw), None, ctypes.byref(count))
    return int(count.value) if code == 0 else -code


def graph_upload(g: torch.cuda.CUDAGraph, stream: torch.cuda.Stream) -> str:
    """cuGraphUpload of the instantiated graph: its first launch's set-up, without running it."""
    try:
        raw = g.raw_cuda_graph_exec()
    except (AttributeError, RuntimeError) as exc:
        return f"no exec handle ({exc})"
    lib = ctypes.CDLL("libcuda.so.1")
    fn = lib.cuGraphUpload
    fn.argtypes = [ctypes.c_void_p, ctypes.c_void_p]
    return f"code {fn(ctypes.c_void_p(raw), ctypes.c_void_p(stream.cuda_stream))}"


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--sizes", default="64,256,512,768,1000,1024,1100,1536,2048,4096,8192")
    args = parser.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    device = torch.device("cuda", 0)
    flags = torch.zeros(64, dtype=torch.int32, device=device)
    x = torch.zeros(1024, device=device)
    held = torch.cuda.Stream(device)
    releaser = torch.cuda.Stream(device)
    # Every kernel used behind the wait is loaded first: with lazy module loading (CUDA's default)
    # a first launch behind a held wait blocked the host, and the release with it.
    x.add_(1)
    gate.write(gate.stream_handle(releaser), flags.data_ptr(), 0)
    torch.cuda.synchronize(device)
    seq = 0

    def behind_wait(launch) -> tuple[bool, int, float]:
        """(the host blocked 0.5 s, launches done by then, ms until the launch returned)."""
        nonlocal seq
        seq += 1
        torch.cuda.synchronize(device)
        gate.wait(gate.stream_handle(held), flags.data_ptr(), seq)
        progress = [0]
        finished = threading.Event()
        started = time.monotonic()
        took = [0.0]

        def run() -> None:
            with torch.cuda.stream(held):
                launch(progress)
            took[0] = (time.monotonic() - started) * 1000
            finished.set()

        thread = threading.Thread(target=run)
        thread.start()
        blocked = not finished.wait(0.5)
        done_by_then = progress[0]
        gate.write(gate.stream_handle(releaser), flags.data_ptr(), seq)
        thread.join()
        torch.cuda.synchronize(device)
        return blocked, done_by_then, took[0]

    print("eager: K add_ kernels launched behind a held wait")
    for k in sizes:
        def eager(progress, k=k):
            for _ in range(k):
                x.add_(1)
                progress[0] += 1
        blocked, done, ms = behind_wait(eager)
        print(f"  K={k:6d}: {'BLOCKED after ' + str(done) if blocked else 'returned'} ({ms:.1f} ms to return)")

    keep = True
    try:
        torch.cuda.CUDAGraph(keep_graph=True)
    except TypeError:
        keep = False
    print(f"graphs: K add_ nodes (keep_graph available: {keep})")
    for k in sizes:
        for warm in (False, True, "uploaded"):
            g = torch.cuda.CUDAGraph(keep_graph=True) if keep else torch.cuda.CUDAGraph()
            side = torch.cuda.Stream(device)
            with torch.cuda.graph(g, stream=side):
                for _ in range(k):
                    x.add_(1)
            nodes = graph_nodes(g) if keep else None
            if keep:
                g.instantiate()
            if warm == "uploaded":
                print(f"    cuGraphUpload: {graph_upload(g, side)}")
                torch.cuda.synchronize(device)
            elif warm:
                g.replay()
                torch.cuda.synchronize(device)

            def replay(progress, g=g):
                g.replay()
                progress[0] += 1
            blocked, _, ms = behind_wait(replay)
            print(f"  K={k:6d} nodes={nodes} {'uploaded       ' if warm == 'uploaded' else 'launched before' if warm else 'first launch   '}: "
                  f"{'BLOCKED' if blocked else 'returned'} ({ms:.1f} ms to return)")
            del g
    # Several graphs behind one wait: is the limit per launch or per pending work?
    print("graphs: N launches of a 256-node graph behind one wait")
    g = torch.cuda.CUDAGraph()
    side = torch.cuda.Stream(device)
    with torch.cuda.graph(g, stream=side):
        for _ in range(256):
            x.add_(1)
    g.replay()
    torch.cuda.synchronize(device)
    for n in (1, 2, 4, 8, 16, 64):
        def many(progress, n=n):
            for _ in range(n):
                g.replay()
                progress[0] += 1
        blocked, done, ms = behind_wait(many)
        print(f"  N={n:3d}: {'BLOCKED after ' + str(done) if blocked else 'returned'} ({ms:.1f} ms to return)")


if __name__ == "__main__":
    main()
