"""Soak: many consecutive runs mixing correct, wrong, raising, crashing, hanging, flooding and
forking candidates, alternately through the CLI (a subprocess per batch) and through the engine
call the dashboard makes (Launcher.run in this process), on one database. Before and after:
processes, threads, this process's open files, listening TCP ports, entries in the temp folder
and /dev/shm, the database's size; where a GPU is present also the GPUs' memory used, their compute
processes and the MPS daemons. Target: nothing grows but the database (GPU memory: by no more than
the driver's own drift, GROWTH_ALLOWED).

    python bench/soak.py --runs 1000 [--workdir DIR]   (CPU, two ranks; ~5-10 s a run here)
    python bench/soak.py --mode nccl --world-size 1 --runs 150 --timeout 10 --max-minutes 6   (one GPU)

--candidates torch-p2p,wrong soaks a few of CANDIDATES (by folder name). --max-minutes M starts no
batch after M minutes (the batch running then ends first, so leave it room under a time limit);
the last line says how many of the runs asked for were done.

Host-memory limit (resident bytes of a candidate's processes together, engine.limits): 1 GiB in
cpu mode. In a GPU mode a runner also holds a CUDA context, whose host side (driver, CUDA
libraries, NCCL) comes on top of the ~0.2 GiB of a runner with torch imported (CPU build, measured
here; not measured on a GPU box), so an honest candidate could come near 1 GiB: the GPU modes get
1.5 GiB. escaped-hog still passes that: its daemon alone writes 1.5 GiB (1536 MiB) and holds
what it inherited from the runner, and the runner's own resident memory counts with it.

Prints a line per batch and a before/after table; exit 1 if anything but the database grew (or
could not be read after), or a run's verdict was not the one its candidate deserves.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

FIXTURES = ROOT / "tests" / "fixtures"
# model folder -> the verdicts it may get
CANDIDATES = {
    ROOT / "solutions" / "torch-p2p": {"passed"},
    FIXTURES / "solutions" / "wrong": {"failed"},
    FIXTURES / "solutions" / "crash-with-message": {"error"},
    FIXTURES / "solutions" / "crash": {"error"},
    FIXTURES / "solutions" / "hang": {"timeout"},
    FIXTURES / "containment" / "flood": {"passed"},
    FIXTURES / "containment" / "escaped-hog": {"error"},  # past the host-memory limit, with a daemon
}
MODES = ("cpu", "nccl", "shared-gpu")
# Host memory a candidate may hold per rank, by mode (why the GPU modes get more: the docstring).
HOST_MEMORY_GIB = {"cpu": 1.0, "nccl": 1.5, "shared-gpu": 1.5}
GPU_MEMORY_KEY = "GPU memory used (MiB)"
# How far a census figure may rise before it counts as grown (0 where not listed): the driver moves
# a GPU's memory used by a few MiB by itself.
GROWTH_ALLOWED = {GPU_MEMORY_KEY: 64}


FILES_KEY = "open files (this process)"


def census(db: Path) -> dict[str, int]:
    """What the machine holds that a leak would grow; the GPUs' figures only where there are GPUs."""
    gpu = gpu_census()  # first: NVML's files and nvidia-smi's process are gone before the counts below
    processes = threads = 0
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    fields = f.read().rsplit(") ", 1)[1].split()
                if entry == "2" or fields[1] == "2":
                    continue  # kernel threads (kworkers come and go by themselves)
                threads += int(fields[17])
                processes += 1
            except (OSError, IndexError, ValueError):
                continue
    listening = 0
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(table) as f:
                listening += sum(1 for line in list(f)[1:] if line.split()[3] == "0A")
        except OSError:
            pass
    temp = Path(tempfile.gettempdir())
    return {
        "processes": processes, "threads": threads, FILES_KEY: len(os.listdir("/proc/self/fd")),
        "listening tcp ports": listening, f"entries in {temp}": len(list(temp.iterdir())),
        "entries in /dev/shm": len(os.listdir("/dev/shm")) if os.path.isdir("/dev/shm") else 0,
        "database bytes": db.stat().st_size if db.exists() else 0, **gpu,
    }


def gpu_census() -> dict[str, int]:
    """Memory used summed over the GPUs, the processes with a compute context on them and the MPS
    daemons; {} where there is no GPU. NVML (nvidia-ml-py, collectors.nvml) where it starts, else nvidia-smi."""
    from collectors.nvml import Nvml

    with Nvml() as nvml:
        count = nvml.device_count()
        if count:
            memory = [nvml.device_call(index, "nvmlDeviceGetMemoryInfo") for index in range(count)]
            return {GPU_MEMORY_KEY: sum(int(m.used) // 2**20 for m in memory if m is not None),
                    "GPU compute processes": len(nvml.compute_pids()), "MPS daemons": mps_daemons()}
    memory_mib, compute_pids = nvidia_smi("--query-gpu=memory.used"), nvidia_smi("--query-compute-apps=pid")
    if not memory_mib or compute_pids is None:
        return {}
    return {GPU_MEMORY_KEY: sum(int(v) for v in memory_mib if v.isdigit()),
            "GPU compute processes": len({v for v in compute_pids if v.isdigit()}), "MPS daemons": mps_daemons()}


def nvidia_smi(query: str) -> list[str] | None:
    """nvidia-smi's lines for one query (csv, no header, no units); None where it is missing or fails."""
    if shutil.which("nvidia-smi") is None:
        return None
    try:
        done = subprocess.run(["nvidia-smi", query, "--format=csv,noheader,nounits"], capture_output=True, text=True,
                              timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return None
    if done.returncode != 0:
        return None
    return [line.strip() for line in done.stdout.splitlines() if line.strip()]


def mps_daemons() -> int:
    """Processes named nvidia-cuda-mps* (the control daemon and its servers)."""
    count = 0
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/comm") as f:
                    count += f.read().startswith("nvidia-cuda-mps")
            except OSError:
                continue
    return count


def grown(before: dict[str, int], after: dict[str, int]) -> list[str]:
    """The census figures that grew: rose at all, or by more than GROWTH_ALLOWED where one is allowed.
    Not the database (it is meant to grow), nor a figure the second census lacks."""
    return [key for key in before if key != "database bytes" and key in after
            and after[key] > before[key] + GROWTH_ALLOWED.get(key, 0)]


def chosen_candidates(names: str | None) -> list[Path]:
    """CANDIDATES' folders named in ``names`` (comma separated, in that order); all for None."""
    if names is None:
        return list(CANDIDATES)
    by_name = {m.name: m for m in CANDIDATES}
    wanted = list(dict.fromkeys(n.strip() for n in names.split(",") if n.strip()))
    unknown = [n for n in wanted if n not in by_name]
    if unknown or not wanted:
        raise ValueError(f"unknown candidate(s) {', '.join(unknown) or '(none named)'}: choose from {', '.join(by_name)}")
    return [by_name[n] for n in wanted]


def open_files() -> dict[int, str]:
    """This process's open file descriptors and what each points at."""
    fds = {}
    for entry in os.listdir("/proc/self/fd"):
        try:
            fds[int(entry)] = os.readlink(f"/proc/self/fd/{entry}")
        except OSError:  # the listing's own descriptor, closed by now
            continue
    return fds


def run_batch(index: int, db: Path, runs_dir: Path, models: list[Path], timeout_s: float, mode: str,
              world_size: int) -> dict[str, tuple[str, str]]:
    """One batch; odd batches through the CLI, even ones through Launcher.run (the dashboard's call).
    Returns model name -> (status, its detail)."""
    host_memory_gib = HOST_MEMORY_GIB[mode]
    if index % 2:
        cmd = [sys.executable, "-m", "pkb_tui.cli", "--db", str(db), "run", "--task", "all_reduce",
               "--model", ",".join(str(m) for m in models), "--mode", mode, "--world-size", str(world_size),
               "--trials", "1", "--no-timing", "--no-profile", "--timeout", str(timeout_s),
               "--max-host-memory-gib", f"{host_memory_gib:g}", "--runs-dir", str(runs_dir), "--json"]
        done = subprocess.run(cmd, capture_output=True, text=True, cwd=str(ROOT), timeout=3600)
        try:
            return {r["model"]: (r["status"], r.get("status_detail") or "") for r in json.loads(done.stdout)["runs"]}
        except (ValueError, KeyError) as exc:
            raise SystemExit(f"batch {index}: the CLI (exit {done.returncode}) printed no runs ({exc}); it said:\n"
                             f"{done.stderr[-2000:]}") from exc
    from pkb_tui.engine.launcher import Launcher
    from pkb_tui.engine.request import RunRequest
    from pkb_tui.store import Store

    request = RunRequest(tasks=["all_reduce"], models=[str(m) for m in models], mode=mode, world_size=world_size,
                         trials=1, timeout_s=timeout_s, timing=False, profile=False, max_host_memory_gib=host_memory_gib)
    outcome = Launcher(db, runs_dir=runs_dir).run(request)
    with Store(db) as store:
        rows = [store.run(run_id) for run_id in outcome.run_ids]
    return {row["model"]: (outcome.statuses[row["id"]], row.get("status_detail") or "") for row in rows}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=1000)
    parser.add_argument("--workdir", type=Path, default=None)
    parser.add_argument("--timeout", type=float, default=30.0, help="each run's timeout (the hanging one uses it all)")
    parser.add_argument("--mode", choices=MODES, default="cpu")
    parser.add_argument("--world-size", type=int, default=2, help="ranks (nccl on a one-GPU box: 1)")
    parser.add_argument("--candidates", default=None,
                        help=f"comma separated, of {','.join(m.name for m in CANDIDATES)} (default all)")
    parser.add_argument("--max-minutes", type=float, default=None,
                        help="start no batch after this many minutes (the running one ends first)")
    args = parser.parse_args(argv)
    try:
        models = chosen_candidates(args.candidates)
    except ValueError as exc:
        parser.error(str(exc))
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="pkb-soak-"))
    workdir.mkdir(parents=True, exist_ok=True)  # before the census: the database's own folder is not growth
    db, runs_dir = workdir / "runs.db", workdir / "runs"
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    before = census(db)
    fds_before = open_files()
    print(f"mode {args.mode}, {args.world_size} rank(s), host-memory limit {HOST_MEMORY_GIB[args.mode]:g} GiB; "
          f"candidates {', '.join(m.name for m in models)}; GPU census: {'yes' if GPU_MEMORY_KEY in before else 'no GPU'}",
          flush=True)
    wrong_verdicts: list[str] = []
    done = batch = 0
    # This process's open files are compared with what it held after its first batch through the
    # engine as well: that batch initializes, once per process, what later ones reuse (on the H100:
    # the CUDA driver's device files, from the launcher's GPU count; 10 -> 25, then 25 for every
    # later batch). Growth past the first batch is a leak; up to it, a one-time cost, shown apart.
    settled: dict[str, int] | None = None
    fds_settled: dict[int, str] = {}
    started = time.monotonic()
    deadline = started + 60 * args.max_minutes if args.max_minutes is not None else math.inf
    while done < args.runs and time.monotonic() < deadline:
        chosen = models[: min(len(models), args.runs - done)]
        statuses = run_batch(batch, db, runs_dir, chosen, args.timeout, args.mode, args.world_size)
        for model, (status, detail) in statuses.items():
            expected = next(v for m, v in CANDIDATES.items() if m.name == model)
            if status not in expected:
                wrong_verdicts.append(f"batch {batch} {model}: {status} (expected {'/'.join(sorted(expected))})"
                                      f"{': ' + detail[:300] if detail else ''}")
        done += len(statuses)
        if batch == 0:
            settled, fds_settled = {FILES_KEY: len(os.listdir("/proc/self/fd"))}, open_files()  # as census counts
        print(f"batch {batch:4d} via {'cli' if batch % 2 else 'engine'}: {len(statuses)} runs "
              f"({done}/{args.runs}, {time.monotonic() - started:.0f} s) {sorted(s for s, _ in statuses.values())} "
              f"open files {len(open_files())}", flush=True)
        batch += 1
    elapsed_s = time.monotonic() - started
    time.sleep(5)  # the last batch's processes end (judges notice, runners die with them)
    after = census(db)
    baseline = {**before, **{k: max(v, before[k]) for k, v in (settled or {}).items()}}
    grew = grown(baseline, after)
    unread = [key for key in before if key not in after]
    print(f"\n{'':28s} {'before':>12s} {'after':>12s}")
    for key in before:
        after_text = f"{after[key]:12,d}" if key in after else f"{'-':>12s}"
        mark = "  GREW" if key in grew else "  NOT READ AFTER" if key in unread else ""
        allowed = f"  (grown only past +{GROWTH_ALLOWED[key]}: the driver's drift)" if key in GROWTH_ALLOWED else ""
        once = (f"  (after the first batch: {settled[key]:,d}; growth counted from the larger)"
                if settled is not None and key in settled and settled[key] != before[key] else "")
        print(f"{key:28s} {before[key]:12,d} {after_text}{mark}{allowed}{once}")
    for label, then in (("before the first batch", fds_before), ("after the first batch", fds_settled)):
        if label.startswith("after") and settled is None:
            continue
        new_fds = sorted(target for fd, target in open_files().items() if then.get(fd) != target)
        if new_fds:
            print(f"open in this process now and not {label}: " + ", ".join(
                f"{target} x{new_fds.count(target)}" for target in dict.fromkeys(new_fds)))
    cut = f"; stopped at --max-minutes {args.max_minutes:g}" if done < args.runs else ""
    print(f"{done} of {args.runs} runs in {batch} batches, {elapsed_s:.0f} s{cut}; wrong verdicts: {len(wrong_verdicts)}")
    for line in wrong_verdicts[:20]:
        print("  " + line)
    return 1 if grew or unread or wrong_verdicts else 0


if __name__ == "__main__":
    sys.exit(main())
