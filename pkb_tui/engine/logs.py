"""What a failed launch says about itself: the first failed rank's own exception, from the logs.

torchrun prints its own wrapper traceback (ChildFailedError) after the ranks' output, so the tail of
launch.log is never the rank's error. The first rank that failed is named in torchrun's summary
("Root Cause (first observed failure)"); its own output is in the batch folder: in
itemNNN.rankR.log once the worker has redirected it for an item, in launch.log before that
(start-up: imports, process-group set-up, the first gathers).
"""

from __future__ import annotations

import os
import re
import stat
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

# The start of a run's status detail when the ranks never reached it: a harness failure (exit 3),
# not the candidate's (exit 1). The launcher writes it; the CLI and the dashboard read it.
RANKS_DID_NOT_START = "the ranks did not start"

LAUNCH_MARKER = "=== launch "
_ROOT_CAUSE = re.compile(
    r"Root Cause \(first observed failure\):.*?rank\s*:\s*(\d+).*?exitcode\s*:\s*(-?\d+)", re.S,
)
_ANY_FAILURE = re.compile(r"^\s*rank\s*:\s*(\d+).*?\n\s*exitcode\s*:\s*(-?\d+)", re.M)
_GLOG_LINE = re.compile(r"^[IWEF]\d{4} \d\d:\d\d:\d\d")  # torchrun's own logging
_RANK_LOG = re.compile(r"^item(\d+)\.rank(\d+)\.log$")
_TRACEBACK = "Traceback (most recent call last):"


@dataclass
class RankFailure:
    rank: int | None  # the first rank that failed (None when torchrun's summary is missing)
    exit_code: int | None  # that rank's exit code (negative: killed by that signal)
    lines: list[str]  # the rank's own last lines, its exception last
    source: Path | None  # the log they come from

    @property
    def headline(self) -> str:
        """One line: who failed and the exception's last line."""
        who = f"rank {self.rank}" if self.rank is not None else "a rank"
        code = f" (exit code {self.exit_code})" if self.exit_code is not None else ""
        last = next((line.strip() for line in reversed(self.lines) if line.strip()), "")
        return f"{who} failed{code}" + (f": {last}" if last else "")

    def describe(self) -> str:
        """The headline, then the rank's last lines and where the whole log is."""
        text = self.headline
        if self.lines:
            text += "\n" + "\n".join(self.lines)
        if self.source is not None:
            text += f"\n(full output: {self.source})"
        return text


def last_launch_text(launch_log: Path) -> str:
    """launch.log's section for the latest torchrun launch of the batch."""
    try:
        text = launch_log.read_text(errors="replace")
    except OSError:
        return ""
    cut = text.rfind(LAUNCH_MARKER)
    return text[cut:] if cut >= 0 else text


def failed_ranks(launch_text: str) -> list[tuple[int, int]]:
    """(rank, exit code) of every failure in torchrun's summary, its root cause first."""
    found: list[tuple[int, int]] = []
    root = _ROOT_CAUSE.search(launch_text)
    if root:
        found.append((int(root.group(1)), int(root.group(2))))
    for match in _ANY_FAILURE.finditer(launch_text):
        failure = (int(match.group(1)), int(match.group(2)))
        if failure not in found:
            found.append(failure)
    return found


def first_failed_rank(launch_text: str) -> tuple[int, int] | None:
    """(rank, exit code) of torchrun's root cause, or of its first listed failure."""
    found = failed_ranks(launch_text)
    return found[0] if found else None


def last_exception(text: str, max_lines: int = 12) -> list[str]:
    """The last traceback in text (its final max_lines lines), else the last non-blank lines."""
    lines = [line.rstrip() for line in text.splitlines()]
    start = max((i for i, line in enumerate(lines) if line.strip() == _TRACEBACK), default=None)
    block = lines[start:] if start is not None else lines
    block = [line for line in block if line.strip()]
    return block[-max_lines:]


def _ranks_own_output(launch_text: str) -> str:
    """launch.log without torchrun's own lines: its banner, log lines and wrapper traceback."""
    lines = launch_text.splitlines()
    end = next((i for i, line in enumerate(lines) if "ChildFailedError" in line), len(lines))
    # The wrapper traceback that ends in ChildFailedError starts at the last "Traceback" before it.
    wrapper = max((i for i in range(end) if lines[i].strip() == _TRACEBACK), default=None)
    if end < len(lines) and wrapper is not None:
        # Only when the wrapper's frames are torchrun's (a rank's traceback keeps its own frames).
        if any("torch/distributed/run.py" in line or "elastic" in line for line in lines[wrapper:end]):
            end = wrapper
    kept = []
    for line in lines[:end]:
        if line.startswith(LAUNCH_MARKER) or _GLOG_LINE.match(line) or line.startswith("*****"):
            continue
        if "OMP_NUM_THREADS environment variable" in line:
            continue
        kept.append(line)
    return "\n".join(kept)


def _latest_rank_log(batch_dir: Path, rank: int, items: Iterable[int] | None) -> Path | None:
    wanted = set(items) if items is not None else None
    found: list[tuple[int, Path]] = []
    for path in batch_dir.glob(f"item*.rank{rank}.log"):
        match = _RANK_LOG.match(path.name)
        if match and (wanted is None or int(match.group(1)) in wanted):
            found.append((int(match.group(1)), path))
    return max(found)[1] if found else None


def rank_failure(batch_dir: Path, *, items: Iterable[int] | None = None, max_lines: int = 12) -> RankFailure:
    """The first failed rank of the batch's latest launch and its own last lines.

    torchrun's "root cause" is only the failure it noticed first: when one rank dies, its peers
    fail a moment later ("Connection closed by peer") and may be listed first. So a failure whose
    own last lines say a peer went away, or that torchrun itself killed (SIGTERM/SIGKILL), yields
    to one that does not. items: the item indices of that launch, so a rank log left by an
    earlier launch is not taken for this one's."""
    items = list(items) if items is not None else None
    launch_log = batch_dir / "launch.log"
    launch_text = last_launch_text(launch_log)
    failures: list[tuple[int, int | None]] = list(failed_ranks(launch_text))
    if not failures:  # no summary (torchrun killed, or another launcher): every rank's log is a witness
        logged = {int(m.group(2)) for p in batch_dir.glob("item*.rank*.log") if (m := _RANK_LOG.match(p.name))}
        failures = [(rank, None) for rank in sorted(logged)]
    own = _ranks_own_output(launch_text)
    witnesses = [_rank_failure(batch_dir, own, launch_log, rank, code, items, max_lines) for rank, code in failures]
    for failure in witnesses:
        if failure.exit_code not in _KILLED_BY_TORCHRUN and not _peer_went_away(failure.lines):
            return failure
    if witnesses:
        return witnesses[0]
    return RankFailure(None, None, last_exception(own, max_lines), launch_log if launch_log.exists() else None)


_KILLED_BY_TORCHRUN = (-15, -9)  # SIGTERM / SIGKILL: torchrun ending the others after a failure
_PEER_GONE = re.compile(
    r"Connection closed by peer|Connection reset by peer|remote worker crash|Broken pipe|"
    r"remote process exited|peer process|ProcessGroup.*abort|Socket Timeout|recvBytes|sendBytes", re.I,
)


def _peer_went_away(lines: list[str]) -> bool:
    return any(_PEER_GONE.search(line) for line in lines[-3:])


def _rank_failure(
    batch_dir: Path, own: str, launch_log: Path, rank: int, code: int | None, items: list[int] | None, max_lines: int,
) -> RankFailure:
    path = _latest_rank_log(batch_dir, rank, items)
    if path is not None:
        lines = last_exception(path.read_text(errors="replace"), max_lines)
        if lines:
            return RankFailure(rank, code, lines, path)
    # torch prefixes a rank's uncaught exception with "[rankR]:": keep only this rank's lines.
    prefix = f"[rank{rank}]:"
    mine = [line[len(prefix):].removeprefix(" ") for line in own.splitlines() if line.startswith(prefix)]
    text = "\n".join(mine) if mine else ("" if any(_RANK_PREFIX.match(line) for line in own.splitlines()) else own)
    return RankFailure(rank, code, last_exception(text, max_lines), launch_log if launch_log.exists() else None)


_RANK_PREFIX = re.compile(r"^\[rank\d+\]:")


def launch_failure_detail(batch_dir: Path, torchrun_exit: int, *, items: Iterable[int] | None = None) -> str:
    """The status detail of a run whose launch died: the failed rank's exception, not torchrun's."""
    failure = rank_failure(batch_dir, items=items)
    return f"a rank process died (torchrun exit code {torchrun_exit}): {failure.describe()}"


def read_regular(path: Path, limit: int = 64 * 2**20) -> str:
    """A file in the batch folder as text, only if it is a regular file (no link, FIFO or device
    planted there can redirect or hang the reader); at most ``limit`` bytes (the tail)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return ""
    with os.fdopen(fd, "rb") as f:
        info = os.fstat(f.fileno())
        if not stat.S_ISREG(info.st_mode):
            return ""
        if info.st_size > limit:
            f.seek(info.st_size - limit)
        return f.read(limit).decode(errors="replace")
