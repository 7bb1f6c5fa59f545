"""How many rows a dynamic batch may take, learned from what batches cost.

Batching pays when a batch of n rows costs less than n batches of one: on a GPU, or for a
model whose calls carry a fixed overhead. On a CPU it often does not. ResNet-50 with one
intra-op thread on the 2-core machine costs 70.8 ms a row at batch 1, 75–80 ms at 2–6, 84 ms
at 12 and 104 ms at 32 (activations leave the caches), so the batches that 16 or 64 waiting
clients form lower throughput; and for a cheap model the gather copy of every input costs
more than the call it saves.

`BatchCap` keeps the executor's time per row (gather, forward, split: everything the
executor spends on a batch) by batch-size bucket (1, 2–3, 4–7, …), as a moving average.
Batches start at one row and grow a bucket at a time: a batch may take the upper end of the
smallest bucket whose cost per row is within MARGIN of the cheapest bucket's (as much
throughput, and the least time waiting behind a batch) — or, when the largest bucket
measured is cheaper than every smaller one by GROW_MARGIN, the next bucket's (on a GPU,
where a row gets cheaper as batches grow, up to `max_batch_size`). While capped, one batch
in PROBE_EVERY may take the next bucket's rows, so that a change (other load, inputs of
another size) is seen; every second one while that bucket is not yet measured and such a
batch is cheap (_EAGER_PROBE_NS).

Why start small: before anything is measured, a burst of waiting clients would form one
batch of up to max_batch_size whose rows all wait for all of it. ResNet-50 on the 2-core
machine, 16 connections: the first batches took 14 rows (1.3 s each), and those alone put
P99 at 1.4 s against 0.65 s with batches of one (bench/RESULTS.md).

Models cheaper than MIN_COST_NS a row are not capped by their cost: there the work outside
the executor (the loop's dispatch and delivery, two thread hand-offs per batch) weighs more
than what the executor's time per row shows. Measured: identity (602 KB, ~35 µs a row) capped
at one row lost 16 % of its HTTP throughput at 16 connections (3,755 → 3,155 requests/s).
On a CPU their batches are instead kept to what the gather copies within GATHER_BYTES
(`gather_bytes`; at least one request): for such a model the copy is most of what a larger
batch adds, and once it leaves the caches it costs more than the hand-offs it saves.
Measured (2026-12-03, 2 cores, identity over HTTP, wrk, medians of 2–4 runs): at 64
connections 2,208 requests/s with batches of up to 64 rows (14 rows on average) against
2,606 with 2; at 16 connections batches of 2 or 3 rows were as fast or faster than 64's.
Small rows are not affected: 2 MiB holds 512 rows of 4 KB. On a GPU batching pays, and a
cheap model's batches grow to max_batch_size as before; nor is a Triton Python model
bounded, whose execute is given the requests one by one (nothing is gathered).

A request is never split: one whose own rows exceed the cap runs as a batch by itself.
"""

from __future__ import annotations

__all__ = ["BatchCap", "GATHER_BYTES", "GROW_MARGIN", "MARGIN", "MIN_COST_NS", "PROBE_EVERY"]

MARGIN = 0.05       # a bucket within 5 % of the cheapest cost per row counts as as cheap
# Batches grow past the largest size measured only when it is this much cheaper a row than
# every smaller one: averages of a few batches under contention differ by 5–10 % for
# nothing (ResNet-50 on 2 busy cores), while a GPU's rows get 30–50 % cheaper a step.
GROW_MARGIN = 0.15
MIN_COST_NS = 1_000_000  # below 1 ms a row, batching is not capped by cost
GATHER_BYTES = 2 << 20   # ... but on a CPU by the bytes its gather copies (see above)
PROBE_EVERY = 16    # while capped, every 16th batch may take one bucket more
_EAGER_PROBE = 2    # every 2nd while that bucket has too few samples to count, if cheap:
_EAGER_PROBE_NS = 20_000_000  # a probe expected to take longer waits its PROBE_EVERY turn
_ALPHA = 0.25       # weight of a new batch in its bucket's moving average
_MIN_SAMPLES = 3    # batches a bucket needs before it counts


class BatchCap:
    """The row limit of one model version's batches; used on the event loop only."""

    __slots__ = ("_max_rows", "_cost", "_samples", "_limit", "_taken", "_gather_bytes",
                 "_cheap", "_row_bytes")

    def __init__(self, max_rows: int, gather_bytes: int | None = None) -> None:
        """`gather_bytes`: what a batch of cheap rows may copy in its gather (None: no
        bound, on a GPU)."""
        self._max_rows = max_rows
        self._gather_bytes = gather_bytes
        self._cheap = False  # rows measured under MIN_COST_NS
        self._row_bytes = 0  # input bytes of a row of the latest batch asked for
        buckets = max(max_rows, 1).bit_length()
        self._cost = [0.0] * buckets  # ns per row, moving average
        self._samples = [0] * buckets
        self._limit = 1  # slow start: one row until batches are measured
        self._taken = 0

    @property
    def bounds_gathers(self) -> bool:
        """Whether batches of cheap rows are bounded by their gather (on a CPU): then
        `rows_for_next_batch` needs the rows' bytes."""
        return self._gather_bytes is not None

    @property
    def limit(self) -> int:
        """The most rows a batch takes now (max_batch_size when nothing is capped)."""
        if self._cheap and self._gather_bytes and self._row_bytes:
            return min(self._max_rows, max(1, self._gather_bytes // self._row_bytes))
        return self._limit

    def rows_for_next_batch(self, row_bytes: int = 0) -> int:
        """The limit, or now and then (while capped) the next bucket's upper end.
        `row_bytes`: the input bytes of one row of the batch to be formed."""
        self._row_bytes = row_bytes
        if self._cheap or self._limit >= self._max_rows:  # nothing to probe
            return self.limit
        self._taken += 1
        probe = min(self._max_rows, 2 * self._limit + 1)
        if self._taken % self._probe_every(probe) == 0:
            return probe
        return self._limit

    def _probe_every(self, probe: int) -> int:
        """Probe eagerly while the next bucket is unmeasured and a probe is cheap: a probe of
        ResNet-50 on a CPU (15 rows, 1.2 s) every second batch would stretch the tail."""
        if self._samples[self._limit.bit_length()] >= _MIN_SAMPLES:
            return PROBE_EVERY
        below = self._limit.bit_length() - 1  # the limit's own bucket
        if self._samples[below] and probe * self._cost[below] > _EAGER_PROBE_NS:
            return PROBE_EVERY
        return _EAGER_PROBE

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
        if not seen:
            return self._limit
        cheapest = min(self._cost[b] for b in seen)
        self._cheap = cheapest < MIN_COST_NS
        if self._cheap:
            return self._max_rows
        if len(seen) < 2:
            return self._limit
        # The smallest batches as cheap as any: as much throughput, and the least waiting
        # behind a batch (a request that just missed one waits for all of its rows).
        top = min(b for b in seen if self._cost[b] <= cheapest * (1 + MARGIN))
        if top == seen[-1] and all(self._cost[b] * (1 - GROW_MARGIN) > cheapest
                                   for b in seen[:-1]):
            top += 1  # only the largest batches measured are that cheap, by far: one more
        return min(self._max_rows, (2 << top) - 1)
