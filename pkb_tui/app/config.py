"""What the dashboard is given from outside, so tests and snapshots can pin it down: the database,
the clock, the task/model catalogue, live telemetry and the launcher."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pkb_tui.app.catalog import Catalog, load_catalog


def _default_telemetry(db_path: Path) -> Any:
    """The Monitor screen's own sampler (not recorded): NVML where there is a GPU, else the host."""
    from collectors.telemetry import Telemetry

    return Telemetry(db_path, interval_s=0.1, record=False)


def _default_launcher(db_path: Path, runs_dir: Path | None) -> Any:
    from pkb_tui.engine.launcher import Launcher

    return Launcher(db_path, runs_dir=runs_dir)


def _default_contention_check() -> list[str]:
    from collectors.contention import competing_load

    return competing_load()


@dataclass
class AppConfig:
    db_path: Path
    runs_dir: Path | None = None  # where run logs go; None: the launcher's default
    clock: Callable[[], float] = time.time
    utc: bool = False  # show moments in UTC (snapshots), else local time
    catalog: Callable[[], Catalog] = load_catalog
    # None: no telemetry at all (tests); else a factory of objects with start/stop/ring/source/reason
    telemetry: Callable[[Path], Any] | None = _default_telemetry
    launcher: Callable[[Path, Path | None], Any] = _default_launcher
    live_refresh_s: float = 0.25  # 4 Hz sparklines
    chart_refresh_s: float = 0.5  # plotext panels at 2 Hz at most
    history_page: int = 100  # runs loaded at a time in History (more as the cursor nears the end)
    defaults: dict[str, Any] = field(default_factory=dict)  # launch options preset (world_size, mode, ...)
    speedup_basis: str = "eager"  # which timing speedups and the leaderboard use: eager or graph (History: e)
    # What else runs on the box before a batch starts (sentences); None: no check (tests, snapshots).
    contention_check: Callable[[], list[str]] | None = _default_contention_check
    prometheus: str | None = None  # [HOST:]PORT: serve the live metrics (collectors.prometheus) while the app runs
    # Freeze what start-up made (modules, classes, the screens) out of the garbage collector's full
    # passes (gc.freeze): fewer and shorter pauses in a dashboard left open all day. Off in tests,
    # where many apps come and go in one process and frozen ones would never be collected.
    freeze_startup: bool = False
