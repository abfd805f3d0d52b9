"""The Launch screen's preset: its options and marked tasks, kept in a JSON file next to the
database (runs.db -> runs.launch.json), so a dashboard opened on the same database starts where the
last launch left off. A missing or unreadable file is an empty preset, never an error."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

KEYS = ("world_size", "mode", "dtype", "size", "trials", "timing", "oversubscribe", "models", "marked")


def preset_path(db_path: Path | str) -> Path:
    db_path = Path(db_path)
    return db_path.with_name(f"{db_path.stem}.launch.json")


def load(db_path: Path | str) -> dict[str, Any]:
    try:
        data = json.loads(preset_path(db_path).read_text())
    except (OSError, ValueError):
        return {}
    return {k: v for k, v in data.items() if k in KEYS} if isinstance(data, dict) else {}


def save(db_path: Path | str, values: dict[str, Any]) -> None:
    path = preset_path(db_path)
    tmp = path.with_name(path.name + ".tmp")
    try:
        tmp.write_text(json.dumps({k: v for k, v in values.items() if k in KEYS}, indent=1, sort_keys=True))
        os.replace(tmp, path)  # whole or not at all: a crash mid-write leaves the last preset
    except OSError:
        pass  # a read-only folder: the preset is a convenience, the launch already happened
