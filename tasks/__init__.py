"""The task suite: one module per task, grouped by family, found by its id (see tasks.base)."""

from tasks.base import (  # noqa: F401
    FAMILIES,
    MODES,
    Task,
    TaskContext,
    TaskSpec,
    Tolerance,
    Traffic,
    all_tasks,
    broken_tasks,
    load_task,
)
