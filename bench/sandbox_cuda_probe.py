"""Which folders must a rank be able to write to for CUDA to start under the Landlock write sandbox?
(GPU box only.) Each attempt runs in a fresh process: sandbox with the default folders plus one
extra set, then CUDA init, a tensor, NCCL at world size 1, CuPy. Prints one line per attempt.

    python bench/sandbox_cuda_probe.py
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
ATTEMPT = r"""
import os, sys, tempfile, traceback
from pathlib import Path
sys.path.insert(0, {root!r})
from pkb_tui.engine.sandbox import default_writable, restrict_writes
batch = Path(tempfile.mkdtemp())
note = restrict_writes(default_writable(batch, {extra!r}))
step = "sandbox"
try:
    assert note is None, note
    import torch
    step = "cuda init"; torch.cuda.set_device(0); x = torch.ones(1, device="cuda")
    step = "nccl"
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT="29577", RANK="0", WORLD_SIZE="1")
    import torch.distributed as dist
    dist.init_process_group("nccl"); dist.all_reduce(x); torch.cuda.synchronize(); dist.destroy_process_group()
    step = "cupy"; import cupy; float(cupy.ones(3).sum())
    print("ok")
except BaseException as exc:
    print(f"failed at {{step}}: {{type(exc).__name__}}: {{str(exc).splitlines()[0][:150]}}")
"""


def main() -> int:
    for extra in ([], ["/proc"], ["/sys"], ["/run", "/var/run"], ["/proc", "/sys", "/run", "/var/run"], ["/"]):
        code = ATTEMPT.format(root=str(ROOT), extra=extra)
        try:
            out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=90)
            line = (out.stdout.strip().splitlines() or [out.stderr.strip()[-200:]])[-1]
        except subprocess.TimeoutExpired:
            line = "timed out"
        print(f"extra writable {extra or '(none)'}: {line}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
