"""Tasks and models as the Launch screen lists them. Loading imports torch (the task modules), so
the app does it in a thread worker; tests inject a fixed catalogue."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class TaskInfo:
    id: str
    title: str
    family: str
    source: str
    world_sizes: tuple[int, ...] | None  # None: any >= min_world_size
    min_world_size: int
    dtypes: tuple[str, ...]
    sizes: tuple[str, ...]
    modes: tuple[str, ...]

    @property
    def world_sizes_label(self) -> str:
        if self.world_sizes is None:
            return f"≥{self.min_world_size}"
        sizes = sorted(self.world_sizes)
        if len(sizes) > 2 and sizes == list(range(sizes[0], sizes[-1] + 1)):
            return f"{sizes[0]}-{sizes[-1]}"
        return ",".join(map(str, sizes))


@dataclass(frozen=True)
class ModelInfo:
    name: str
    covered: int  # tasks of the catalogue this set has a solution for
    total: int
    notes: str = ""
    task_ids: frozenset[str] | None = None  # the tasks it has a solution for; None: every task

    def covers(self, task_id: str) -> bool:
        return self.task_ids is None or task_id in self.task_ids


@dataclass
class Catalog:
    tasks: list[TaskInfo] = field(default_factory=list)
    models: list[ModelInfo] = field(default_factory=list)
    problem: str | None = None  # why the catalogue is partial (a broken task module, say)

    @property
    def families(self) -> list[str]:
        return sorted({t.family for t in self.tasks})


def task_info(spec) -> TaskInfo:
    return TaskInfo(
        id=spec.id, title=spec.title, family=spec.family, source=spec.source,
        world_sizes=tuple(spec.world_sizes) if spec.world_sizes is not None else None,
        min_world_size=spec.min_world_size, dtypes=tuple(spec.dtypes), sizes=tuple(spec.sizes),
        modes=tuple(spec.modes),
    )


def load_catalog() -> Catalog:
    """The registered tasks and the solution sets found, with each set's coverage."""
    from pkb_tui.errors import PkbError

    catalog = Catalog()
    try:
        from tasks import all_tasks, broken_tasks

        catalog.tasks = [task_info(task.spec) for task in all_tasks().values()]
        broken = broken_tasks()
        if broken:
            catalog.problem = "Left out, did not load: " + "; ".join(f"{name} ({why})" for name, why in broken.items())
    except PkbError as exc:
        catalog.problem = str(exc)
    try:
        from pkb_tui.engine.solutions import list_models

        ids = [t.id for t in catalog.tasks]
        for model in list_models():
            notes = str(model.manifest.get("notes") or model.manifest.get("provider") or "")
            if model.manifest.get("format") == "pkb":  # a PKB generator folder: provider · model slug
                notes = " · ".join(str(model.manifest[k]) for k in ("provider", "model", "backend") if model.manifest.get(k))
            covered = model.covers(ids)
            catalog.models.append(ModelInfo(model.name, len(covered), len(ids), notes,
                                            None if model.is_baseline else frozenset(covered)))
    except PkbError as exc:
        catalog.problem = (catalog.problem + " " if catalog.problem else "") + str(exc)
    return catalog
