"""PKB candidate folders as models.

PKB's generator writes `solutions_<backend>_<precision>_<hw|none>_<provider>_<model_slug>/` folders
of `<stem>_<backend>.py` files (e.g. `1_allreduce_cuda.py`); run_local.py also takes any folder of
such files (--solutions-dir). Either is a model here: its files resolve for the tasks `pkb/<stem>`,
the provider and model slug are parsed from the folder name, and the backend is the folder's, or
the one chosen with --backend ($PKB_BACKEND), or the only one its file names show.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

from pkb_tui.errors import PkbError

BACKENDS = ("reference", "triton", "cuda", "parallelkittens")
FOLDER = re.compile(
    r"^solutions_(?P<backend>[a-z]+)_(?P<precision>fp32|fp16|bf16)_(?P<hardware>none|[a-z0-9]+_\d+)"
    r"_(?P<provider>[A-Za-z0-9\-]+)_(?P<model>.+)$"
)
CANDIDATE_FILE = re.compile(r"^(?P<stem>(?P<number>\d+)_[A-Za-z0-9_\-]+?)_(?P<backend>" + "|".join(BACKENDS) + r")\.py$")


@dataclass(frozen=True)
class PkbFolder:
    """What a folder of PKB candidates says about itself."""

    backend: str
    model: str  # the model slug (PKB's path-safe form of the model id, "/" -> "_")
    provider: str | None = None
    precision: str | None = None
    hardware: str | None = None

    def manifest(self) -> dict[str, str]:
        out = {"model": self.model, "backend": self.backend, "format": "pkb"}
        for key in ("provider", "precision", "hardware"):
            value = getattr(self, key)
            if value:
                out[key] = value
        return out


def parse_folder_name(name: str) -> dict[str, str] | None:
    """The fields of a generator folder name, or None when the name is not in that form."""
    match = FOLDER.match(name)
    return match.groupdict() if match else None


def candidate_files(path: Path) -> dict[str, dict[str, Path]]:
    """backend -> {pkb task id -> file} for the `<stem>_<backend>.py` files of a folder."""
    out: dict[str, dict[str, Path]] = {}
    for file in sorted(path.glob("*.py")):
        match = CANDIDATE_FILE.match(file.name)
        if match:
            out.setdefault(match["backend"], {})[f"pkb/{match['stem']}"] = file
    return out


def pkb_folder(path: Path) -> PkbFolder | None:
    """The PKB description of a folder of candidates, or None when it holds none in PKB's naming.

    Raises PkbError when it holds several backends and none is chosen."""
    if not path.is_dir():
        return None
    by_backend = candidate_files(path)
    fields = parse_folder_name(path.name)
    if not by_backend and fields is None:
        return None
    chosen = os.environ.get("PKB_BACKEND") or None
    if chosen is not None and chosen not in BACKENDS:
        raise PkbError(f"Unknown --backend {chosen!r}; choose one of {', '.join(BACKENDS)}.")
    backend = chosen or (fields["backend"] if fields else None)
    if backend is None:
        if len(by_backend) > 1:
            raise PkbError(
                f"{path} holds candidates for the backends {', '.join(sorted(by_backend))}; choose one with --backend."
            )
        backend = next(iter(by_backend))
    if fields is not None:
        return PkbFolder(backend, fields["model"], fields["provider"], fields["precision"], fields["hardware"])
    return PkbFolder(backend, path.name)


def solution_files(path: Path, backend: str) -> dict[str, Path]:
    """pkb task id -> candidate file for one backend."""
    return candidate_files(path).get(backend, {})


def solution_for(path: Path, backend: str, task_id: str) -> Path | None:
    """The candidate for a pkb task: `<stem>_<backend>.py`, or else the one file of that backend
    whose problem number matches (a problem renamed in the clone keeps its candidates)."""
    files = solution_files(path, backend)
    if task_id in files:
        return files[task_id]
    number = task_id[len("pkb/"):].split("_", 1)[0]
    same_number = [f for tid, f in files.items() if tid[len("pkb/"):].split("_", 1)[0] == number]
    return same_number[0] if len(same_number) == 1 else None


def clone_model_dirs(root: Path) -> list[Path]:
    """The generator's `solutions_*` folders in a clone."""
    if not root.is_dir():
        return []
    return [d for d in sorted(root.iterdir()) if d.is_dir() and d.name.startswith("solutions")]
