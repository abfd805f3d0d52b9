"""`pkb-tui monitor`: live NVLink / PCIe / utilisation / power per GPU, with no run going.

A table refreshed in place (plain ANSI, no Textual), or JSON lines with ``as_json``: first one
{"kind": "monitor", ...} line saying what is sampled, then one {"kind": "sample", ...} line per GPU
(and the host row, gpu -1) per sampling tick. Without NVIDIA GPUs it shows the host's figures under
a plain "no NVIDIA GPU found" line. Records into the database unless ``record`` is False. Ctrl-C
ends it cleanly with exit status 0.
"""

from __future__ import annotations

import json
import sys
import time
from typing import Any, TextIO

from collectors.sample import GpuSample, sample_dict
from collectors.telemetry import Telemetry
from pkb_tui.errors import EXIT_OK

NA = "n/a"  # a figure the device cannot give: never shown as 0


def _rate(value: float | None) -> str:
    if value is None:
        return NA
    if value >= 1e9:
        return f"{value / 1e9:.2f} GB/s"
    if value >= 1e6:
        return f"{value / 1e6:.1f} MB/s"
    return f"{value / 1e3:.1f} kB/s"


def _num(value: float | None, fmt: str = "{:.0f}") -> str:
    return NA if value is None else fmt.format(value)


def _gib(value: float | None) -> str:
    return NA if value is None else f"{value / 2**30:.1f} GiB"


_GPU_COLUMNS = (
    ("GPU", lambda s, n: str(s.gpu)),
    ("name", lambda s, n: n.get(s.gpu, "")[:22]),
    ("NVLink TX", lambda s, n: _rate(s.nvlink_tx_bytes_per_s)),
    ("NVLink RX", lambda s, n: _rate(s.nvlink_rx_bytes_per_s)),
    ("PCIe TX", lambda s, n: _rate(s.pcie_tx_bytes_per_s)),
    ("PCIe RX", lambda s, n: _rate(s.pcie_rx_bytes_per_s)),
    ("SM %", lambda s, n: _num(s.sm_util_pct)),
    ("Mem %", lambda s, n: _num(s.mem_util_pct)),
    ("DRAM %", lambda s, n: _num(s.dram_bw_util_pct)),
    ("Tensor %", lambda s, n: _num(s.tensor_active_pct)),
    ("Power W", lambda s, n: _num(s.power_w)),
    ("SM MHz", lambda s, n: _num(s.sm_clock_mhz)),
    ("Temp C", lambda s, n: _num(s.temperature_c)),
    ("Mem used", lambda s, n: _gib(s.memory_used_bytes)),
)


def render_table(latest: dict[int, GpuSample], names: dict[int, str], header: str, reason: str | None) -> list[str]:
    """The monitor's screen as lines of text."""
    lines = [header]
    if reason:
        lines.append(reason)
    gpus = [latest[g] for g in sorted(latest) if g >= 0]
    if gpus:
        cells = [[title for title, _ in _GPU_COLUMNS]] + [[fn(s, names) for _, fn in _GPU_COLUMNS] for s in gpus]
        widths = [max(len(row[i]) for row in cells) for i in range(len(_GPU_COLUMNS))]
        for row in cells:
            lines.append("  ".join(cell.rjust(w) if i != 1 else cell.ljust(w) for i, (cell, w) in enumerate(zip(row, widths, strict=False))))
    host = latest.get(-1)
    if host is not None:
        lines.append(
            f"host  CPU {_num(host.cpu_pct, '{:.1f}')} %  memory used {_gib(host.host_memory_used_bytes)}"
            f"  loopback {_rate(host.loopback_bytes_per_s)}"
        )
    elif not gpus:
        lines.append("waiting for the first sample...")
    return lines


def sample_record(sample: GpuSample) -> dict[str, Any]:
    return {"kind": "sample", **sample_dict(sample)}


def monitor_command(
    db_path: str | None, duration_s: float | None, interval_s: float, as_json: bool, record: bool,
    out: TextIO = sys.stdout, prometheus: str | None = None, telemetry: Telemetry | None = None,
) -> int:
    """Run the live monitor until ``duration_s`` passes (None: until Ctrl-C); returns the exit status.
    ``prometheus``: also serve the metrics at [HOST:]PORT. ``telemetry``: a sampler to use instead
    of a new one (tests: a replayed NVML)."""
    recording = record and db_path is not None
    if telemetry is None:
        telemetry = Telemetry(db_path if recording else None, interval_s=interval_s, record=recording)
    tty = hasattr(out, "isatty") and out.isatty()
    started = time.monotonic()
    drawn = 0
    last_ts: float | None = None
    exporter = None
    try:
        if prometheus is not None:
            from collectors.prometheus import serve

            exporter = serve(prometheus, lambda: telemetry)
        telemetry.sample_once()  # a first reading now: counter baselines, and something to show at once
        telemetry.start()
        if as_json:
            out.write(json.dumps({
                "kind": "monitor", "source": telemetry.source, "reason": telemetry.reason,
                "gpus": {str(k): v for k, v in telemetry.gpu_names.items()}, "interval_s": interval_s,
                "recording_to": str(db_path) if recording else None,
                "prometheus": exporter.url if exporter is not None else None,
            }) + "\n")
            out.flush()
        elif exporter is not None:
            out.write(f"serving Prometheus metrics at {exporter.url}\n")
            out.flush()
        # Redraw a screen at most 4 times a second (once a second when not on a terminal); JSON
        # lines go out at the sampling rate.
        refresh_s = interval_s if as_json else max(interval_s, 0.25 if tty else 1.0)
        while True:
            left = None if duration_s is None else duration_s - (time.monotonic() - started)
            if left is not None and left <= 0:
                break
            time.sleep(refresh_s if left is None else min(refresh_s, left))
            if as_json:
                last_ts = _write_json_lines(telemetry, last_ts, out)
                continue
            elapsed = time.monotonic() - started
            header = (
                f"pkb-tui monitor  source {telemetry.source}  {1 / interval_s:.0f} Hz  "
                f"{'recording to ' + str(db_path) if recording else 'not recording'}  "
                f"{'metrics at ' + exporter.url + '  ' if exporter is not None else ''}{elapsed:.0f} s  (Ctrl-C stops)"
            )
            reason = telemetry.reason if telemetry.source == "host" else None
            lines = render_table(telemetry.ring.latest_per_gpu(), telemetry.gpu_names, header, reason)
            if tty:
                if drawn:
                    out.write(f"\x1b[{drawn}F\x1b[J")  # back to the table's first line, clear below
                out.write("\n".join(lines) + "\n")
                drawn = len(lines)
            else:
                out.write("\n".join(lines) + "\n\n")
            out.flush()
    except KeyboardInterrupt:
        pass
    finally:
        if exporter is not None:
            exporter.close()
        telemetry.stop()
    if as_json:
        _write_json_lines(telemetry, last_ts, out)  # what was sampled before the stop
    return EXIT_OK


def _write_json_lines(telemetry: Telemetry, since_ts: float | None, out: TextIO) -> float | None:
    fresh = telemetry.ring.snapshot(since_ts=since_ts)
    for sample in fresh:
        out.write(json.dumps(sample_record(sample)) + "\n")
    out.flush()
    return fresh[-1].ts if fresh else since_ts
