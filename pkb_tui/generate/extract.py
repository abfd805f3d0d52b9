"""The candidate's code out of a reply: the whole solution, not the first block.

Rules (tested in tests/test_generate_extract.py):
- Fenced blocks (``` or ~~~, any info string) are read in reply order; blocks labelled as another
  language (bash, json, text, cuda/c++ sources shown apart) are not Python and are skipped, a block
  with no label counts as Python when it parses. A last fence left open (a reply cut at the token
  limit) still counts, marked `unterminated`.
- The block defining `solution` is the answer; where several do (a draft, then the fix), the last.
- Other blocks that define a name the answer uses but does not define itself (a helper, a kernel
  source string, a constant) are joined before it, in reply order: replies often split a solution
  into "the kernel" and "the wrapper".
- No fenced block: the whole reply when it parses and defines `solution`.
- Nothing defines `solution`: no code; the candidate fails with "no code in reply" and is never launched.
"""

from __future__ import annotations

import ast
import builtins
import re
from dataclasses import dataclass, field
from typing import cast

_PYTHON_LABELS = {"", "python", "py", "python3", "py3", "pycon"}


@dataclass
class Extraction:
    code: str | None
    how: str  # one line: which blocks made the code, or why there is none
    blocks: int = 0  # fenced blocks found (any language)
    used_blocks: list[int] = field(default_factory=list)  # indexes of the blocks joined
    unterminated: bool = False


@dataclass
class _Block:
    index: int
    label: str
    text: str
    tree: ast.Module | None
    closed: bool


def _blocks(reply: str) -> list[_Block]:
    """Fenced blocks, line by line: a fence opens with ``` or ~~~ (3 or more) and an optional label,
    and closes with a line of the same character, at least as long; an open last block runs to the end."""
    out: list[_Block] = []
    fence: str | None = None
    label, lines = "", cast(list[str], [])
    for line in reply.splitlines():
        stripped = line.strip()
        if fence is None:
            match = re.match(r"(`{3,}|~{3,})\s*([^`\s]*)", stripped)
            if match:
                fence, label, lines = match.group(1), match.group(2).lower(), []
            continue
        if stripped and set(stripped) == {fence[0]} and len(stripped) >= len(fence):
            out.append(_block(len(out), label, lines, closed=True))
            fence = None
            continue
        lines.append(line)
    if fence is not None:
        out.append(_block(len(out), label, lines, closed=False))
    return out


def _block(index: int, label: str, lines: list[str], *, closed: bool) -> _Block:
    text = "\n".join(lines).rstrip() + "\n"
    try:
        tree: ast.Module | None = ast.parse(text)
    except SyntaxError:
        tree = None
    return _Block(index, label, text, tree, closed)


def _defined(tree: ast.Module) -> set[str]:
    names: set[str] = set()
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names.update((a.asname or a.name).split(".")[0] for a in node.names)
        elif isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for target in targets:
                names.update(n.id for n in ast.walk(target) if isinstance(n, ast.Name))
    return names


def _used(tree: ast.Module) -> set[str]:
    return {n.id for n in ast.walk(tree) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)}


def _defines_solution(tree: ast.Module | None) -> bool:
    return tree is not None and "solution" in _defined(tree)


def extract_code(reply: str) -> Extraction:
    blocks = _blocks(reply)
    python = [b for b in blocks if b.label in _PYTHON_LABELS]
    answers = [b for b in python if _defines_solution(b.tree)]
    if not blocks:
        try:
            tree = ast.parse(reply)
        except SyntaxError:
            tree = None
        if _defines_solution(tree):
            return Extraction(reply.strip() + "\n", "the whole reply (no fenced block) defines solution")
        return Extraction(None, "no code in reply")
    if not answers:
        broken = [b for b in python if b.tree is None and "def solution" in b.text]
        if broken:
            last = broken[-1]
            why = "is cut off (the reply ended inside it)" if not last.closed else "has a syntax error"
            # Kept so the evaluation reports the syntax error (and the refine round can fix it).
            return Extraction(last.text, f"block {last.index + 1} defines solution but {why}", len(blocks),
                              [last.index], unterminated=not last.closed)
        return Extraction(None, f"no code in reply ({len(blocks)} block(s), none defines solution)", len(blocks))
    answer = answers[-1]
    assert answer.tree is not None
    missing = _used(answer.tree) - _defined(answer.tree) - set(dir(builtins))
    helpers: list[_Block] = []
    for block in python:
        if block is answer or block.tree is None or _defines_solution(block.tree):
            continue
        provided = _defined(block.tree) & missing
        if provided:
            helpers.append(block)
            missing -= provided
    used = sorted([answer, *helpers], key=lambda b: b.index)
    code = "\n\n".join(b.text.rstrip() for b in used) + "\n"
    if helpers:
        how = f"blocks {', '.join(str(b.index + 1) for b in used)} of {len(blocks)} joined (block {answer.index + 1} defines solution)"
    elif len(answers) > 1:
        how = f"block {answer.index + 1} of {len(blocks)}: the last of {len(answers)} that define solution"
    else:
        how = f"block {answer.index + 1} of {len(blocks)}"
    return Extraction(code, how, len(blocks), [b.index for b in used], unterminated=not answer.closed)
