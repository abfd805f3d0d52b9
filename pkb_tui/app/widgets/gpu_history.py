"""History of the sampled rates over a window (10 s, 1 min, 10 min) in fixed time buckets, for the
Monitor's graphs. No Textual here.

Buckets are aligned to the clock (bucket k covers [k * bucket_s, (k + 1) * bucket_s)), so new
samples only add to the newest bucket and a frame never rescans the ring: the screen feeds the
samples that arrived since the last frame (RingBuffer.snapshot(since_ts=...)). Older buckets come
from the database (samples recorded by any sampler on this machine) where the ring does not reach
back far enough. A bucket with no value is None: drawn as a gap, never as 0.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

HISTORY_COLUMNS = ("nvlink_tx_bytes_per_s", "nvlink_rx_bytes_per_s", "pcie_tx_bytes_per_s", "pcie_rx_bytes_per_s",
                   "sm_util_pct")
WINDOWS_S = (10.0, 60.0, 600.0)
HOLD_S = 1.0


def window_label(window_s: float) -> str:
    return f"{window_s:.0f} s" if window_s < 60 else f"{window_s / 60:.0f} min"


class RateHistory:
    """Per (GPU, column): bucket index -> [sum, count]."""

    def __init__(self, window_s: float, buckets: int) -> None:
        self.window_s = float(window_s)
        self.buckets = max(1, int(buckets))
        self.bucket_s = self.window_s / self.buckets
        self._sums: dict[tuple[int, str], dict[int, list[float]]] = {}
        self.last_ts: float | None = None  # newest sample fed
        self.db_until: float | None = None  # the database was read up to here

    def bucket_of(self, ts: float) -> int:
        return math.floor(ts / self.bucket_s)

    def feed(self, samples: Iterable[Any]) -> None:
        """Samples newer than the last one fed (a GpuSample or anything with ts, gpu and the columns)."""
        for sample in samples:
            if sample.gpu < 0:
                continue
            bucket = self.bucket_of(sample.ts)
            for column in HISTORY_COLUMNS:
                value = getattr(sample, column)
                if value is None:
                    continue
                slot = self._sums.setdefault((sample.gpu, column), {}).setdefault(bucket, [0.0, 0.0])
                slot[0] += value
                slot[1] += 1
            if self.last_ts is None or sample.ts > self.last_ts:
                self.last_ts = sample.ts

    def add_bucket_means(self, rows: Iterable[tuple[int, int, str, float, int]]) -> None:
        """(gpu, bucket, column, mean, count) rows from the database, for buckets the ring lacks."""
        for gpu, bucket, column, mean, count in rows:
            if mean is None or not count:
                continue
            slots = self._sums.setdefault((gpu, column), {})
            if bucket not in slots:
                slots[bucket] = [mean * count, float(count)]

    def series(self, gpu: int, column: str, now: float, width: int | None = None) -> list[float | None]:
        """The whole window in ``width`` columns (oldest first, ending at the bucket of ``now``): each
        column the mean of the samples in its share of the buckets."""
        width = max(1, min(width or self.buckets, self.buckets))
        first = self.bucket_of(now) - self.buckets + 1
        slots = self._sums.get((gpu, column), {})
        out: list[float | None] = []
        if width == self.buckets:  # one bucket per column (the Monitor sizes it so): lookups only
            for bucket in range(first, first + width):
                slot = slots.get(bucket)
                out.append(slot[0] / slot[1] if slot else None)
        for column_index in range(width if width != self.buckets else 0):
            start = first + column_index * self.buckets // width
            end = first + (column_index + 1) * self.buckets // width
            total = count = 0.0
            for bucket in range(start, end):
                slot = slots.get(bucket)
                if slot:
                    total += slot[0]
                    count += slot[1]
            out.append(total / count if count else None)
        # Columns narrower than the sampling interval fall between samples: a value holds for up
        # to HOLD_S, so only a real pause in the data (or no data) shows as a gap.
        hold = int(HOLD_S / (self.window_s / width))
        last_value, since = None, 0
        for k, value in enumerate(out):
            if value is not None:
                last_value, since = value, 0
            elif last_value is not None and since < hold:
                out[k] = last_value
                since += 1
        return out

    def prune(self, now: float) -> None:
        oldest = self.bucket_of(now) - self.buckets
        for slots in self._sums.values():
            for bucket in [b for b in slots if b < oldest]:
                del slots[bucket]


def database_buckets(conn: Any, history: RateHistory, since: float, until: float) -> list[tuple[int, int, str, float, int]]:
    """Per-bucket means of the recorded samples between since and until (the part of the window the
    ring does not hold), read through ``conn`` (an sqlite3 connection to runs.db)."""
    columns = ", ".join(f"AVG({c}), COUNT({c})" for c in HISTORY_COLUMNS)
    sql = (f"SELECT gpu, CAST(ts / ? AS INTEGER) AS bucket, {columns} FROM samples "
           "WHERE ts >= ? AND ts < ? AND gpu >= 0 GROUP BY gpu, bucket")
    out: list[tuple[int, int, str, float, int]] = []
    for row in conn.execute(sql, (history.bucket_s, since, until)):
        gpu, bucket = int(row[0]), int(row[1])
        for k, column in enumerate(HISTORY_COLUMNS):
            mean, count = row[2 + 2 * k], row[3 + 2 * k]
            if mean is not None and count:
                out.append((gpu, bucket, column, float(mean), int(count)))
    return out
