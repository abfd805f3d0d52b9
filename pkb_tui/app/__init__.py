"""The Textual dashboard. Textual is imported only when the app is used, so the engine, the CLI's
headless commands and the GPU box never need it."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pkb_tui.app.app import PkbApp
    from pkb_tui.app.config import AppConfig


def run_app(db_path: Path, runs_dir: Path | None = None, *, prometheus: str | None = None) -> int:
    """Open the dashboard on db_path (created if missing); ``prometheus``: serve the live metrics at
    [HOST:]PORT while it runs. Returns the process exit code."""
    from pkb_tui.errors import PkbError

    try:
        from pkb_tui.app.app import PkbApp
    except ImportError as exc:
        print(f"The dashboard needs textual ({exc}); install it with `pip install textual plotext`, "
              f"or use the headless commands (pkb-tui run / runs / show).", file=sys.stderr)
        return 3
    from pkb_tui.pkb.settings import apply_remembered

    problem = apply_remembered()  # the PKB clone of an earlier `pkb-tui --pkb-root DIR`
    if problem:
        print(problem, file=sys.stderr)
    try:
        from pkb_tui.app.config import AppConfig

        app = PkbApp(config=AppConfig(db_path=Path(db_path), runs_dir=runs_dir, prometheus=prometheus,
                                      freeze_startup=True))
    except PkbError as exc:
        print(str(exc), file=sys.stderr)
        return exc.exit_code
    result = app.run()
    return int(result or 0) if app.return_code is None else int(app.return_code or result or 0)


def __getattr__(name: str) -> Any:
    # PkbApp and AppConfig load textual: only on first use.
    if name == "PkbApp":
        from pkb_tui.app.app import PkbApp

        return PkbApp
    if name == "AppConfig":
        from pkb_tui.app.config import AppConfig

        return AppConfig
    raise AttributeError(name)


__all__ = ["run_app", "PkbApp", "AppConfig"]
