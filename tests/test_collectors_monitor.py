"""`monitor`: JSON lines and the in-place table, recording, and a clean Ctrl-C."""

from __future__ import annotations

import io
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from collectors.monitor import monitor_command, render_table
from collectors.nvml import NvmlSampler
from collectors.replay import ReplayNvml
from pkb_tui.store.store import connect

TRACE = json.loads((Path(__file__).parent / "fixtures" / "nvml_trace.json").read_text())
ROOT = Path(__file__).resolve().parents[1]


def test_json_lines_say_what_is_sampled_and_are_recorded(tmp_path, monkeypatch):
    monkeypatch.setenv("PKB_FORCE_CPU", "1")
    db = tmp_path / "runs.db"
    out = io.StringIO()
    assert monitor_command(str(db), 0.2, 0.05, True, True, out=out) == 0
    lines = [json.loads(l) for l in out.getvalue().splitlines()]
    assert lines[0]["kind"] == "monitor" and lines[0]["source"] == "host"
    assert lines[0]["reason"].startswith("no NVIDIA GPU")
    samples = [l for l in lines[1:] if l["kind"] == "sample"]
    assert samples and all(s["gpu"] == -1 for s in samples)
    assert "nvlink_tx_bytes_per_s" in samples[0] and samples[0]["nvlink_tx_bytes_per_s"] is None
    recorded = connect(db, readonly=True).execute("SELECT COUNT(*) FROM samples WHERE gpu = -1").fetchone()[0]
    assert recorded == len(samples)


def test_no_record_leaves_no_database(tmp_path, monkeypatch):
    monkeypatch.setenv("PKB_FORCE_CPU", "1")
    out = io.StringIO()
    assert monitor_command(str(tmp_path / "runs.db"), 0.1, 0.05, True, False, out=out) == 0
    assert not (tmp_path / "runs.db").exists()


def test_the_table_says_plainly_when_there_is_no_gpu(tmp_path, monkeypatch):
    monkeypatch.setenv("PKB_FORCE_CPU", "1")
    out = io.StringIO()
    assert monitor_command(None, 1.2, 0.1, False, True, out=out) == 0
    text = out.getvalue()
    assert "no NVIDIA GPU" in text
    assert "host  CPU" in text
    assert "\x1b[" not in text  # not a terminal: no cursor movement


def test_the_table_shows_every_gpu_and_unavailable_as_na():
    replay = ReplayNvml(TRACE)
    sampler = NvmlSampler(nvml=replay, clock=replay.clock)
    sampler.sample()
    replay.step(3)
    latest = {s.gpu: s for s in sampler.sample()}
    lines = render_table(latest, sampler.gpu_names, "header", None)
    rows = {line.split()[0]: line for line in lines[2:]}
    assert set(rows) == {"0", "1", "2"}
    assert "H100" in rows["0"] and "GB/s" in rows["0"]
    assert rows["2"].split()[3:5] == ["n/a", "n/a"]  # H200 without NVLink: n/a, never 0
    assert " 0 B/s" not in "\n".join(lines)


def test_ctrl_c_ends_the_monitor_cleanly(tmp_path):
    env = {**os.environ, "PKB_FORCE_CPU": "1", "PYTHONPATH": str(ROOT)}
    code = (
        # SIGUSR1 prints every thread's stack: what it waits on, should it not end
        "import faulthandler, signal, sys; faulthandler.register(signal.SIGUSR1); "
        # As a terminal gives it: a test run in the background of a shell without job control
        # inherits SIGINT ignored, and Python then keeps it ignored (the CI hang of this test).
        "signal.signal(signal.SIGINT, signal.default_int_handler); "
        "from collectors.monitor import monitor_command; "
        f"sys.exit(monitor_command({str(tmp_path / 'runs.db')!r}, None, 0.05, True, True))"
    )
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env,
                            cwd=ROOT, text=True)
    try:
        first = json.loads(proc.stdout.readline())  # running: it has said what it samples
        assert first["kind"] == "monitor"
        proc.send_signal(signal.SIGINT)
        try:
            rest, err = proc.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            proc.send_signal(signal.SIGUSR1)
            time.sleep(2)
            proc.kill()
            _, stacks = proc.communicate()
            raise AssertionError(f"the monitor did not end within 60 s of Ctrl-C; its threads:\n{stacks[-6000:]}") from None
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, err
    assert "Traceback" not in err
    assert all(json.loads(line)["kind"] == "sample" for line in rest.splitlines())
