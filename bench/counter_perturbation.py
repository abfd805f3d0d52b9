"""Does reading NVML just before a timed loop slow the loop? (GPU box only.)

    python bench/counter_perturbation.py [--reps 12]

A 33.6 MB device-to-device copy (the size of one rank's all_gather input at size default) is timed
per iteration with CUDA events, 30 iterations, right after one of: nothing; the PCIe byte counters
read (nvmlDeviceGetFieldValues 197/198); a GPM sample (nvmlGpmSampleGet); both (what
PhaseCounters.start() does); both and then a 2 ms pause; both, then 3 untimed iterations. Prints the
median microseconds of the first 5 and of the remaining 25 iterations for each, over --reps
repetitions taken in turn (A B C ... A B C ...), so drift falls on all alike.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from collectors import nvml as N  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=12)
    args = parser.parse_args()
    import torch

    pynvml = N.load_nvml()
    pynvml.nvmlInit()
    handle = pynvml.nvmlDeviceGetHandleByIndex(0)
    gpm_ok = N.Gpm.supported(pynvml, handle)
    buffer = pynvml.nvmlGpmSampleAlloc() if gpm_ok else None
    sources = [torch.randn(4099 * 2049, device="cuda") for _ in range(3)]
    dest = torch.empty_like(sources[0])

    def pcie() -> None:
        pynvml.nvmlDeviceGetFieldValues(handle, [(N.FI_PCIE_TX_BYTES, 0), (N.FI_PCIE_RX_BYTES, 0)])

    def gpm() -> None:
        if buffer is not None:
            pynvml.nvmlGpmSampleGet(handle, buffer)

    def loop(iterations: int = 30) -> list[float]:
        out = []
        for i in range(iterations):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            dest.copy_(sources[i % 3])
            torch.cuda.synchronize()
            end.record()
            end.synchronize()
            out.append(start.elapsed_time(end) * 1000.0)
        return out

    conditions = {
        "nothing": lambda: None,
        "PCIe counters": pcie,
        "GPM sample": gpm,
        "both (PhaseCounters.start)": lambda: (pcie(), gpm()),
        "both, then 2 ms pause": lambda: (pcie(), gpm(), time.sleep(0.002)),
        "both, then 3 untimed iterations": lambda: (pcie(), gpm(), loop(3)),
    }
    loop(10)
    results: dict[str, tuple[list[float], list[float]]] = {name: ([], []) for name in conditions}
    for _ in range(args.reps):
        for name, before in conditions.items():
            torch.cuda.synchronize()
            time.sleep(0.02)
            before()
            samples = loop()
            results[name][0].extend(samples[:5])
            results[name][1].extend(samples[5:])
    print(f"GPU {torch.cuda.get_device_name(0)}; GPM {'supported' if gpm_ok else 'not supported'}; {args.reps} reps")
    print(f"  {'before the loop':34s} {'first 5 (median us)':>20s} {'last 25 (median us)':>20s}")
    for name, (first, rest) in results.items():
        print(f"  {name:34s} {statistics.median(first):20.1f} {statistics.median(rest):20.1f}")
    if buffer is not None:
        pynvml.nvmlGpmSampleFree(buffer)
    pynvml.nvmlShutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
