"""Run a benchmark's parts independently: a failing part prints one line and the rest go on."""

from __future__ import annotations

import time
import traceback
from pathlib import Path
from typing import Any, Callable


def part(name: str, failures: dict[str, Any], heading: str = "--- {name}", key: str = "{name}") -> Callable:
    """Decorate a part of a benchmark; its exception is printed and stored in ``failures``."""
    def wrap(fn: Callable) -> Callable:
        def run(*args: Any, **kwargs: Any) -> None:
            print(heading.format(name=name), flush=True)
            started = time.perf_counter()
            try:
                fn(*args, **kwargs)
            except Exception as exc:
                where = traceback.extract_tb(exc.__traceback__)[-1]
                print(f"FAILED {name}: {type(exc).__name__}: {exc} (at {Path(where.filename).name}:{where.lineno})")
                failures[key.format(name=name)] = f"{type(exc).__name__}: {exc}"
            print(f"    ({time.perf_counter() - started:.1f} s)", flush=True)
        return run
    return wrap
