"""The PKB clone the dashboard remembers: a small JSON file, so `pkb-tui --pkb-root DIR` once is
enough for later dashboards ($PKB_ROOT, when set, wins)."""

from __future__ import annotations

import json
import os
from pathlib import Path


def settings_path() -> Path:
    base = os.environ.get("PKB_CONFIG_DIR") or os.path.join(
        os.environ.get("XDG_CONFIG_HOME") or os.path.join(os.path.expanduser("~"), ".config"), "pkb-tui")
    return Path(base) / "pkb.json"


def remembered_root() -> str | None:
    try:
        data = json.loads(settings_path().read_text())
    except (OSError, ValueError):
        return None
    root = data.get("pkb_root") if isinstance(data, dict) else None
    return str(root) if root else None


def remember_root(root: Path) -> None:
    path = settings_path()
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps({"pkb_root": str(root)}) + "\n")
    except OSError:
        pass  # not remembering is no reason to fail the command


def apply_remembered() -> str | None:
    """Activate the remembered clone when $PKB_ROOT is unset; returns a sentence when it is gone."""
    if os.environ.get("PKB_ROOT"):
        return None
    root = remembered_root()
    if not root:
        return None
    from pkb_tui.errors import PkbError
    from pkb_tui.pkb.tasks import activate

    try:
        activate(root)
    except PkbError as exc:
        return f"The remembered PKB clone is not usable: {exc}"
    return None
