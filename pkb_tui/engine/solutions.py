"""Solution sets ("models"): folders of solution(*inputs) files named by task id.

A set lives under solutions/<name>/ (or anywhere, given as a path) and may carry manifest.json
({"model": ..., "provider": ..., "backend": ..., "notes": ...}). A set's name is its folder's
name, always: the manifest's "model" is only a label shown beside it, so a manifest cannot make a
folder's runs count as another model's (its leaderboard entry, its history). The pseudo-model "baseline" runs
the task's baseline as the candidate: a self-check and a way to time the baseline alone.

A folder of ParallelKernelBench candidates (a generator's `solutions_*` folder, or any folder of
`<stem>_<backend>.py` files) is a model too: its files resolve for the tasks `pkb/<stem>`
(pkb_tui/pkb/solutions.py), and the generator folders of the clone at $PKB_ROOT are listed.

Candidate code is untrusted: the launcher only parses it (syntax, a `solution` function with the
baseline's arity); it is imported in the rank processes alone.
"""

from __future__ import annotations

import ast
import inspect
import json
import os
from dataclasses import dataclass, field
from pathlib import Path

from pkb_tui.errors import PkbError
from pkb_tui.pkb import solutions as pkb_layout

BASELINE_MODEL = "baseline"
PROJECT_ROOT = Path(__file__).resolve().parents[2]


def search_dirs() -> list[Path]:
    """Where named solution sets are looked for, first match wins: $PKB_SOLUTIONS (os.pathsep
    separated), ./solutions, then the solutions/ folder shipped with the project."""
    dirs = [Path(p) for p in os.environ.get("PKB_SOLUTIONS", "").split(os.pathsep) if p]
    dirs += [Path.cwd() / "solutions", PROJECT_ROOT / "solutions"]
    if os.environ.get("PKB_ROOT"):
        dirs.append(Path(os.environ["PKB_ROOT"]))  # its solutions_* folders (list_models keeps only those)
    unique: list[Path] = []
    for d in dirs:
        if d.is_dir() and d.resolve() not in [u.resolve() for u in unique]:
            unique.append(d)
    return unique


@dataclass
class SolutionSet:
    name: str
    path: Path | None  # None for the baseline pseudo-model
    manifest: dict = field(default_factory=dict)
    pkb: pkb_layout.PkbFolder | None = None  # set when the folder holds PKB candidates

    @property
    def is_baseline(self) -> bool:
        return self.path is None

    def files(self) -> dict[str, Path]:
        """task id -> solution file. A file may be <task_id>.py or <N>_<task_id>.py; a PKB
        candidate <stem>_<backend>.py (of the chosen backend) serves the task pkb/<stem>."""
        if self.path is None:
            return {}
        out: dict[str, Path] = {}
        for file in sorted(self.path.glob("*.py")):
            if file.name.startswith("_"):
                continue
            out[file.stem] = file
        if self.pkb is not None:
            out.update(pkb_layout.solution_files(self.path, self.pkb.backend))
        return out

    def solution_file(self, task_id: str) -> Path | None:
        if self.pkb is not None and self.path is not None and task_id.startswith("pkb/"):
            return pkb_layout.solution_for(self.path, self.pkb.backend, task_id)
        return self.files().get(task_id)

    @property
    def label(self) -> str | None:
        """The manifest's own name for the set, when it says something the folder name does not."""
        label = self.manifest.get("model")
        return str(label) if label and str(label) != self.name else None

    @property
    def display_name(self) -> str:
        return f"{self.name} ({self.label})" if self.label else self.name

    def covers(self, task_ids: list[str]) -> list[str]:
        if self.is_baseline:
            return list(task_ids)
        files = self.files()
        return [t for t in task_ids if t in files or (t.startswith("pkb/") and self.solution_file(t) is not None)]


def _load_manifest(path: Path) -> dict:
    manifest_file = path / "manifest.json"
    if not manifest_file.exists():
        return {}
    try:
        data = json.loads(manifest_file.read_text())
    except json.JSONDecodeError as exc:
        raise PkbError(f"{manifest_file} is not valid JSON ({exc}); fix or remove it.") from exc
    if not isinstance(data, dict):
        raise PkbError(f"{manifest_file} must hold a JSON object.")
    return data


def _solution_set(name: str, path: Path) -> SolutionSet:
    """A folder as a model: its manifest, and what its PKB naming says (manifest fields win)."""
    manifest = _load_manifest(path)
    pkb = pkb_layout.pkb_folder(path)
    if pkb is not None:
        manifest = {**pkb.manifest(), **manifest}
    return SolutionSet(name, path, manifest, pkb)


def find_model(name_or_path: str) -> SolutionSet:
    if name_or_path == BASELINE_MODEL:
        return SolutionSet(BASELINE_MODEL, None, {"model": "baseline", "notes": "the task's own baseline"})
    as_path = Path(name_or_path).expanduser()
    if as_path.is_dir() and (os.sep in name_or_path or name_or_path.startswith(".")):
        path = as_path.resolve()
        return _solution_set(_folder_name(path), path)
    clone = Path(os.environ["PKB_ROOT"]).resolve() if os.environ.get("PKB_ROOT") else None
    for directory in search_dirs():
        candidate = directory / name_or_path
        if clone is not None and directory.resolve() == clone and candidate not in pkb_layout.clone_model_dirs(directory):
            continue  # in a PKB clone only its solutions_* folders are models (not reference/, utils/)
        if candidate.is_dir():
            return _solution_set(name_or_path, candidate.resolve())
    if as_path.is_dir():
        path = as_path.resolve()
        return _solution_set(_folder_name(path), path)
    known = ", ".join(m.name for m in list_models())
    raise PkbError(f"Unknown model {name_or_path!r}: no such solution set (known: {known}) and no such folder.")


def _folder_name(path: Path) -> str:
    """A folder given as a path is named by its folder; one named like the built-in baseline
    would pool its runs with the baseline's, so it says where it came from."""
    return f"{path.name} ({path})" if path.name == BASELINE_MODEL else path.name


def list_models() -> list[SolutionSet]:
    seen: dict[str, SolutionSet] = {BASELINE_MODEL: find_model(BASELINE_MODEL)}
    clone = Path(os.environ["PKB_ROOT"]).resolve() if os.environ.get("PKB_ROOT") else None
    for directory in search_dirs():
        in_clone = clone is not None and directory.resolve() == clone
        children = pkb_layout.clone_model_dirs(directory) if in_clone else sorted(directory.iterdir())
        for child in children:
            if child.is_dir() and not child.name.startswith((".", "_")) and child.name not in seen:
                try:
                    seen[child.name] = _solution_set(child.name, child.resolve())
                except PkbError as exc:  # e.g. several PKB backends and no --backend: listed, with why
                    seen[child.name] = SolutionSet(child.name, child.resolve(), {"notes": str(exc)})
    return list(seen.values())


def baseline_arity(baseline) -> tuple[int, int]:
    """(required, maximum) positional parameters of a baseline."""
    params = list(inspect.signature(baseline).parameters.values())
    if any(p.kind is p.VAR_POSITIONAL for p in params):
        return (0, 1 << 30)
    positional = [p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    required = [p for p in positional if p.default is p.empty]
    return (len(required), len(positional))


def validate_solution_file(path: Path, task_id: str, arity: tuple[int, int]) -> str:
    """Parse (never import) a candidate file; return its text or raise PkbError saying what to fix."""
    try:
        text = path.read_text()
    except OSError as exc:
        raise PkbError(f"Cannot read solution {path}: {exc.strerror}.") from exc
    if not text.strip():
        raise PkbError(f"Solution {path} is empty; it must define solution(*inputs) like the {task_id} baseline.")
    try:
        tree = ast.parse(text, filename=str(path))
    except (SyntaxError, ValueError) as exc:  # ValueError: NUL bytes
        if not isinstance(exc, SyntaxError):
            raise PkbError(f"Solution {path} is not Python source ({exc}); fix it and run again.") from exc
        raise PkbError(f"Solution {path} has a syntax error at line {exc.lineno}: {exc.msg}; fix it and run again.") from exc
    funcs = [n for n in tree.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) and n.name == "solution"]
    assigned = any(
        isinstance(n, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "solution" for t in n.targets)
        for n in tree.body
    )
    if not funcs and not assigned:
        raise PkbError(f"Solution {path} defines no `solution` function; it must define solution(*inputs) like the {task_id} baseline.")
    if funcs:
        args = funcs[-1].args
        if not args.vararg:
            positional = len(args.posonlyargs) + len(args.args)
            required = positional - len(args.defaults)
            wanted_required, wanted_max = arity
            if positional < wanted_required or required > wanted_max:
                raise PkbError(
                    f"Solution {path} takes {positional} argument(s) but the {task_id} baseline takes "
                    f"{wanted_required}; give solution() the baseline's signature."
                )
    return text
