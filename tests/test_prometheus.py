"""The Prometheus endpoint, scraped for real over HTTP on 127.0.0.1 and parsed with
prometheus-client's own parser: the replayed 8-GPU x 18-link trace (CI has no GPU), the `monitor`
command on this machine's host sampler, and the dashboard serving its Monitor's sampler."""

from __future__ import annotations

import io
import json
import threading
import time
import urllib.request

import pytest
from prometheus_client.parser import text_string_to_metric_families

from collectors.prometheus import parse_address, serve
from pkb_tui.errors import PkbError
from tests.monitor_fixtures import TRACE_8X18, replayed


def scrape(url: str) -> dict[str, list]:
    """name -> samples, from a real GET of the endpoint."""
    with urllib.request.urlopen(url, timeout=10) as response:
        assert response.status == 200
        text = response.read().decode()
    families = text_string_to_metric_families(text)
    return {family.name: family.samples for family in families}


def value(samples: list, **labels: str) -> float | None:
    found = [s.value for s in samples if all(s.labels.get(k) == v for k, v in labels.items())]
    assert len(found) <= 1
    return found[0] if found else None


def test_a_scrape_gives_every_gpu_and_link_in_dcgm_names():
    telemetry = replayed(TRACE_8X18)
    latest = telemetry.ring.latest_per_gpu()
    exporter = serve("127.0.0.1:0", lambda: telemetry, host_label="box1")
    try:
        metrics = scrape(exporter.url)
    finally:
        exporter.close()
    tx = metrics["DCGM_FI_PROF_NVLINK_TX_BYTES"]
    assert len(tx) == 8
    assert value(tx, gpu="3", host="box1") == pytest.approx(latest[3].nvlink_tx_bytes_per_s)
    assert value(metrics["DCGM_FI_DEV_POWER_USAGE"], gpu="0") == pytest.approx(latest[0].power_w)
    assert value(metrics["DCGM_FI_DEV_FB_USED"], gpu="0") == pytest.approx(latest[0].memory_used_bytes / 2**20)
    assert value(metrics["DCGM_FI_DEV_POWER_MGMT_LIMIT"], gpu="7") == 700.0
    links = metrics["pkb_nvlink_link_rx_bytes"]
    assert len(links) == 8 * 18 - 2  # the link down between GPUs 3 and 7 has no series
    link5 = next(ln for ln in latest[2].links if ln.link == 5)
    assert value(links, gpu="2", link="5") == pytest.approx(link5.rx_bytes_per_s)
    # GPU 5's temperature is NOT_SUPPORTED: absent from the scrape, not a 0
    temps = metrics["DCGM_FI_DEV_GPU_TEMP"]
    assert value(temps, gpu="5") is None and value(temps, gpu="4") is not None
    assert value(metrics["pkb_rank_cpu_pct"], rank="0", pid="41000") == pytest.approx(97.0)
    assert value(metrics["pkb_telemetry_info"], source="nvml") == 1.0


def test_no_sampler_running_is_said_not_hidden():
    exporter = serve("127.0.0.1:0", lambda: None)
    try:
        metrics = scrape(exporter.url)
    finally:
        exporter.close()
    assert value(metrics["pkb_telemetry_info"], source="none") == 1.0
    assert "DCGM_FI_DEV_GPU_UTIL" not in metrics


def test_monitor_command_serves_while_it_records(tmp_path, monkeypatch):
    from collectors.monitor import monitor_command

    monkeypatch.setenv("PKB_FORCE_CPU", "1")  # the host sampler: what this machine really has
    db = tmp_path / "runs.db"
    out = io.StringIO()
    status: list[int] = []
    thread = threading.Thread(target=lambda: status.append(monitor_command(
        str(db), 3.0, 0.2, True, True, out=out, prometheus="127.0.0.1:0")))
    thread.start()
    try:
        for _ in range(100):  # the first JSON line names the endpoint
            if out.getvalue():
                break
            time.sleep(0.05)
        head = json.loads(out.getvalue().splitlines()[0])
        time.sleep(0.5)
        metrics = scrape(head["prometheus"])
    finally:
        thread.join(30)
    assert status == [0]
    assert head["recording_to"] == str(db)
    assert value(metrics["pkb_telemetry_info"], source="host") == 1.0
    assert value(metrics["pkb_host_memory_used_bytes"]) > 0
    import sqlite3

    assert sqlite3.connect(db).execute("SELECT COUNT(*) FROM samples WHERE gpu = -1").fetchone()[0] > 0


def test_the_dashboard_serves_its_monitor(tmp_path, monkeypatch):
    import asyncio

    from pkb_tui.app import PkbApp
    from tests.app_fixtures import app_config

    monkeypatch.chdir(tmp_path)
    telemetry = replayed(TRACE_8X18)
    app = PkbApp(config=app_config(tmp_path / "runs.db", telemetry=lambda db: telemetry, prometheus="127.0.0.1:0"))
    seen: dict[str, dict] = {}

    async def main():
        async with app.run_test() as pilot:
            url = app.exporter.url
            seen["before"] = await asyncio.to_thread(scrape, url)
            await pilot.press("m")
            await app.workers.wait_for_complete()
            await pilot.pause(0.3)
            seen["monitor"] = await asyncio.to_thread(scrape, url)

    asyncio.run(main())
    assert value(seen["before"]["pkb_telemetry_info"], source="none") == 1.0
    assert len(seen["monitor"]["DCGM_FI_PROF_NVLINK_RX_BYTES"]) == 8


def test_addresses():
    assert parse_address("9400") == ("127.0.0.1", 9400)
    assert parse_address("0.0.0.0:9400") == ("0.0.0.0", 9400)
    assert parse_address("[::1]:9400") == ("::1", 9400)
    with pytest.raises(PkbError, match="HOST:"):
        parse_address("localhost:metrics")
    with pytest.raises(PkbError, match="out of range"):
        parse_address("70000")
