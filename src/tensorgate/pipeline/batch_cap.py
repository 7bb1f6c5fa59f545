"""How many rows a dynamic batch may take, learned from what batches cost.

Batching pays when a batch of n rows costs less than n batches of one: on a GPU, or for a
model whose calls carry a fixed overhead. On a CPU it often does not. ResNet-50 with one
intra-op thread on the 2-core machine costs 70.8 ms a row at batch 1, 75–80 ms at 2–6, 84 ms
at 12 and 104 ms at 32 (activations leave the caches), so the batches that 16 or 64 waiting
clients form lower throughput; and for a cheap model the gather copy of every input costs
more than the call it saves.

`BatchCap` keeps the executor's time per row (gather, forward, split: everything the
executor spends on a batch) by batch-size bucket (1, 2–3, 4–7, …), as a moving average. Once
two buckets are measured, batches are limited to the upper end of the largest bucket whose
cost per row is within MARGIN of the cheapest bucket's — or, when that is the largest bucket
measured, to the next bucket's, so batches grow a bucket at a time while each is as cheap
(on a GPU, where a row gets cheaper as batches grow, up to `max_batch_size`) and never jump
to sizes nobody has measured. While capped, one batch in PROBE_EVERY may take the next
bucket's rows, so that a change (other load, inputs of another size) is seen.

Models cheaper than MIN_COST_NS a row are left alone: there the work outside the executor
(the loop's dispatch and delivery, two thread hand-offs per batch) weighs more than what the
executor's time per row shows. Measured: identity (602 KB, ~35 µs a row) capped at one row
lost 16 % of its HTTP throughput at 16 connections (3,755 → 3,155 requests/s).

A request is never split: one whose own rows exceed the cap runs as a batch by itself.
"""

from __future__ import annotations

__all__ = ["BatchCap", "MARGIN", "MIN_COST_NS", "PROBE_EVERY"]

MARGIN = 0.05       # a bucket within 5 % of the cheapest cost per row counts as as cheap
MIN_COST_NS = 1_000_000  # below 1 ms a row, batching is not capped
PROBE_EVERY = 16    # while capped, every 16th batch may take one bucket more
_ALPHA = 0.25       # weight of a new batch in its bucket's moving average
_MIN_SAMPLES = 3    # batches a bucket needs before it counts


class BatchCap:
    """The row limit of one model version's batches; used on the event loop only."""

    __slots__ = ("_max_rows", "_cost", "_samples", "_limit", "_taken")

    def __init__(self, max_rows: int) -> None:
        self._max_rows = max_rows
        buckets = max(max_rows, 1).bit_length()
        self._cost = [0.0] * buckets  # ns per row, moving average
        self._samples = [0] * buckets
        self._limit = max_rows
        self._taken = 0

    @property
    def limit(self) -> int:
        """The most rows a batch takes now (max_batch_size when nothing is capped)."""
        return self._limit

    def rows_for_next_batch(self) -> int:
        """The limit, or now and then (while capped) the next bucket's upper end."""
        if self._limit >= self._max_rows:
            return self._max_rows
        self._taken += 1
        if self._taken % PROBE_EVERY == 0:
            return min(self._max_rows, 2 * self._limit + 1)
        return self._limit

    def record(self, rows: int, busy_ns: int) -> bool:
        """Count a finished batch of `rows` rows that kept its executor `busy_ns`; returns
        whether the limit changed."""
        bucket = rows.bit_length() - 1
        if rows < 1 or bucket >= len(self._cost):
            return False
        per_row = busy_ns / rows
        if self._samples[bucket]:
            self._cost[bucket] += _ALPHA * (per_row - self._cost[bucket])
        else:
            self._cost[bucket] = per_row
        self._samples[bucket] += 1
        limit = self._decide()
        changed = limit != self._limit
        self._limit = limit
        return changed

    def _decide(self) -> int:
        seen = [b for b, n in enumerate(self._samples) if n >= _MIN_SAMPLES]
        if len(seen) < 2:
            return self._limit
        cheapest = min(self._cost[b] for b in seen)
        if cheapest < MIN_COST_NS:
            return self._max_rows
        top = max(b for b in seen if self._cost[b] <= cheapest * (1 + MARGIN))
        if top == seen[-1]:  # the largest batches measured are as cheap as any: one more
            top += 1
        return min(self._max_rows, (2 << top) - 1)
