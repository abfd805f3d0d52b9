"""CPU placement of judges and runners (engine.placement) and the check that a candidate did not
move the baseline's runner or its judge (a real child process, real scheduling calls)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from pkb_tui.engine import placement

ADVERSARIAL = Path(__file__).parent / "fixtures" / "adversarial"
HONEST = Path(__file__).resolve().parents[1] / "solutions" / "torch-p2p"


def _sysfs(tmp_path: Path, layout: list[tuple[int, int]]) -> Path:
    """A sysfs cpu tree: logical CPU i -> (package, core) = layout[i]."""
    for cpu, (package, core) in enumerate(layout):
        topo = tmp_path / f"cpu{cpu}" / "topology"
        topo.mkdir(parents=True)
        (topo / "physical_package_id").write_text(f"{package}\n")
        (topo / "core_id").write_text(f"{core}\n")
    return tmp_path


def test_siblings_share_a_core_and_ranks_get_disjoint_cores_the_same_on_every_rank(tmp_path: Path) -> None:
    # 2 packages x 4 cores x 2 threads, Linux numbering: siblings are i and i + 8.
    layout = [(c // 4, c % 4) for c in range(8)] * 2
    sysfs = _sysfs(tmp_path, layout)
    cores = placement.physical_cores(set(range(16)), sysfs)
    assert cores[0] == (0, 8) and len(cores) == 8 and all(len(c) == 2 for c in cores)
    plans = [placement.plan(r, 2, set(range(16)), sysfs, enabled=True) for r in range(2)]
    assert all(p.pinned for p in plans)
    taken = [p.judge | p.runners for p in plans]
    assert not taken[0] & taken[1], "two ranks share a CPU"
    assert not any({0, 8} & t for t in taken), "the first core is the launcher's"
    assert plans[0].runners == frozenset({2, 10, 3, 11})  # two physical cores, both threads each
    assert plans[0] == placement.plan(0, 2, set(range(16)), sysfs, enabled=True)


def test_too_few_cores_or_switched_off_is_not_pinned_and_says_why(tmp_path: Path) -> None:
    sysfs = _sysfs(tmp_path, [(0, c) for c in range(4)])
    one_runner_core = placement.plan(0, 1, set(range(4)), sysfs, enabled=True)
    assert one_runner_core.pinned and len(one_runner_core.runners) == 2  # 3 spare cores: 1 judge + 2
    tight = placement.plan(1, 2, set(range(4)), sysfs, enabled=True)
    assert not tight.pinned and "not pinned (4 physical cores for 2 ranks" in tight.note
    off = placement.plan(0, 1, set(range(4)), sysfs, enabled=False)
    assert not off.pinned and "PKB_PIN=0" in off.note


def test_a_changed_nice_or_affinity_of_another_process_is_seen_and_what_can_be_put_back_is() -> None:
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        expected = placement.Scheduling.of(child.pid)
        assert placement.moved(child.pid, expected, "the baseline's runner") is None
        os.setpriority(os.PRIO_PROCESS, child.pid, min(19, expected.nice + 5))  # what an attacker may do
        said = placement.moved(child.pid, expected, "the baseline's runner")
        assert said and said.startswith("timing tampered: the baseline's runner's scheduling was changed"), said
        cpus = sorted(expected.cpus)
        if len(cpus) > 1:
            os.sched_setaffinity(child.pid, {cpus[-1]})
            assert "CPUs" in (placement.moved(child.pid, expected, "x") or "")
        # A lower nice needs CAP_SYS_NICE: restored as root, reported otherwise.
        left = placement.restore(child.pid, expected, "the fork server")
        if os.geteuid() == 0:
            assert left is None and placement.Scheduling.of(child.pid) == expected
        else:
            assert left is not None and "nice" in left
    finally:
        child.kill()
        child.wait()


def test_a_renice_of_one_thread_of_the_baseline_runner_is_seen_and_undone_as_root() -> None:
    code = ("import threading, time\n"
            "t = threading.Thread(target=time.sleep, args=(60,), daemon=True); t.start()\n"
            "print(t.native_id, flush=True); time.sleep(60)\n")
    child = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout is not None
        tid = int(child.stdout.readline())
        expected = placement.Scheduling.of(child.pid)
        assert placement.moved(child.pid, expected, "the baseline's runner") is None
        os.setpriority(os.PRIO_PROCESS, tid, min(19, expected.nice + 7))  # its NCCL proxy, say
        said = placement.moved(child.pid, expected, "the baseline's runner")
        assert said and f"thread {tid}" in said and "timing tampered" in said, said
        if os.geteuid() == 0:
            assert placement.restore(child.pid, expected, "x") is None
            assert os.getpriority(os.PRIO_PROCESS, tid) == expected.nice
    finally:
        child.kill()
        child.wait()


@pytest.mark.timeout(900)
def test_a_candidate_that_renices_the_baseline_fails_and_the_next_model_passes(cli, tmp_db: Path) -> None:
    models = f"{ADVERSARIAL / 'renice-baseline'},{HONEST}"
    result = cli("run", "--task", "all_reduce", "--model", models, "--world-size", "2", "--size", "small",
                 "--trials", "2", "--iterations", "12", "--warmup", "2", "--timeout", "300", "--json")
    runs = {r["model"]: r for r in result.json()["runs"]}
    attack = runs["renice-baseline"]
    assert attack["status"] == "failed", attack
    assert "timing tampered" in attack["status_detail"] and "scheduling was changed" in attack["status_detail"], attack
    assert runs["torch-p2p"]["status"] == "passed", runs["torch-p2p"]
