"""Per-model cumulative counters in the shape of Triton's statistics extension.

Updated on the event-loop thread only (results come back there), so no locks.
"""

from __future__ import annotations

import time
from bisect import bisect_left
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import TYPE_CHECKING, NamedTuple

from tensorgate.pipeline.summary import LatencySummaries

if TYPE_CHECKING:
    from tensorgate.repository.model_spec import ModelSpec

__all__ = ["LATENCY_BOUNDS_US", "SUMMARY_STAGES", "Duration", "Histogram", "ModelCall",
           "ModelStatistics", "StageTimes"]

# Latency histogram bucket bounds (µs): fine below 10 ms, where batch-1 serving lives, so a
# P99 read from them (Prometheus' histogram_quantile) is within a bucket of the truth there.
LATENCY_BOUNDS_US = (50, 100, 250, 500, 750, 1_000, 1_500, 2_500, 5_000, 7_500, 10_000,
                     25_000, 50_000, 75_000, 100_000, 250_000, 500_000, 1_000_000, 2_500_000,
                     5_000_000, 10_000_000)
_BOUNDS_NS = tuple(bound * 1000 for bound in LATENCY_BOUNDS_US)
_NO_BOUNDS: Mapping[str, tuple[int, ...]] = MappingProxyType({})
# the stages a model's latency summaries follow (Triton's nv_inference_<stage>_summary_us),
# in the order ModelStatistics passes their durations
SUMMARY_STAGES = ("request", "queue", "compute_input", "compute_infer", "compute_output")


class ModelCall(NamedTuple):
    """An instance's current call into its model (Engine.model_calls): `instance` is its
    thread's name, `since` when the call began (time.monotonic(); 0.0 idle), `rows` the
    batch's (0: a streaming step), `request_ids` its requests' ids (those they have)."""

    model: str
    version: int
    instance: str
    since: float
    seconds: float
    rows: int
    request_ids: tuple[str, ...] = ()


class Duration:
    """A count and a total in ns, as Triton's `{"count": n, "ns": total}`."""

    __slots__ = ("count", "ns")

    def __init__(self) -> None:
        self.count = 0
        self.ns = 0

    def add(self, ns: int, count: int = 1) -> None:
        self.count += count
        self.ns += ns

    def as_dict(self) -> dict[str, int]:
        return {"count": self.count, "ns": self.ns}


class Histogram:
    """Counts of durations by bucket (the last: above every bound) and their sum: what
    Prometheus needs for quantiles across a fleet, at a bisect and two adds. `bounds_ns`:
    ascending; LATENCY_BOUNDS_US unless the model's config sets its own (model_metrics)."""

    __slots__ = ("bounds_ns", "counts", "ns")

    def __init__(self, bounds_ns: tuple[int, ...] = _BOUNDS_NS) -> None:
        self.bounds_ns = bounds_ns
        self.counts = [0] * (len(bounds_ns) + 1)
        self.ns = 0

    def add(self, ns: int) -> None:
        # a bucket holds durations <= its bound
        self.counts[bisect_left(self.bounds_ns, ns)] += 1
        self.ns += ns

    @property
    def count(self) -> int:
        return sum(self.counts)


class StageTimes:
    """One request's time in each stage (ns) and the bytes copied for it."""

    __slots__ = ("queue_ns", "input_ns", "infer_ns", "output_ns", "total_ns")

    def __init__(self) -> None:
        self.queue_ns = 0
        self.input_ns = 0
        self.infer_ns = 0
        self.output_ns = 0
        self.total_ns = 0

    def as_us(self) -> dict[str, float]:
        return {"queue": self.queue_ns / 1e3, "compute_input": self.input_ns / 1e3,
                "compute_infer": self.infer_ns / 1e3, "compute_output": self.output_ns / 1e3,
                "total": self.total_ns / 1e3}


@dataclass
class _BatchDurations:
    compute_input: Duration = field(default_factory=Duration)
    compute_infer: Duration = field(default_factory=Duration)
    compute_output: Duration = field(default_factory=Duration)


class ModelStatistics:
    """Cumulative counters of one model version."""

    def __init__(self, name: str, version: int, cached: bool = False,
                 summaries: bool = False, tags: tuple[tuple[str, str], ...] = (),
                 bounds: Mapping[str, tuple[int, ...]] = _NO_BOUNDS) -> None:
        """`summaries`: keep the latency summaries (--metrics-config summary_latencies);
        `tags`: labels on each of this version's metrics (ModelSpec.metric_tags); `bounds`:
        latency histograms' bucket bounds (ns) by name, where the config sets them
        (ModelSpec.histogram_bounds)."""
        self.name = name
        self.version = version
        self.tags = tags
        self.cached = cached  # answers from the response cache when it can
        self.summaries = LatencySummaries(SUMMARY_STAGES) if summaries else None
        self.last_inference_ms = 0
        self.load_s = 0.0  # the version's load, to ready (Triton's nv_model_load_duration_secs)
        self.inference_count = 0
        self.execution_count = 0
        self.success = Duration()
        self.fail = Duration()
        self.queue = Duration()
        self.compute_input = Duration()
        self.compute_infer = Duration()
        self.compute_output = Duration()
        self.cache_hit = Duration()  # answered from the response cache: the lookup's time
        self.cache_miss = Duration()  # not in it: the lookup's and the insertion's time
        # Successful requests' latencies, for /metrics: end to end in the pipeline, waiting in
        # the queue, and in the model; a decoupled model's first response (time to first token)
        self.request_latency = Histogram(bounds.get("request", _BOUNDS_NS))
        self.queue_latency = Histogram(bounds.get("queue", _BOUNDS_NS))
        self.infer_latency = Histogram(bounds.get("infer", _BOUNDS_NS))
        self.first_response_latency = Histogram(bounds.get("first_response", _BOUNDS_NS))
        self.copied_bytes = 0
        self.batch_rows_limit = 0  # rows a batch may take now (0: no batching)
        self.sequence_slots = 0  # a stateful model's slots, all instances (0: not stateful)
        self.sequences_active = 0  # sequences holding a slot
        self.sequences_waiting = 0  # sequences started and waiting for a slot
        self.sequences_expired = 0  # sequences ended by max_sequence_idle_microseconds
        self.failures_by_reason: dict[str, int] = {}
        self._batches: dict[int, _BatchDurations] = {}

    @classmethod
    def of(cls, spec: ModelSpec, version: int, *, cached: bool,
           summaries: bool) -> ModelStatistics:
        """A served version's statistics, labelled and bucketed as its config says."""
        return cls(spec.name, version, cached=cached, summaries=summaries,
                   tags=spec.metric_tags, bounds=dict(spec.histogram_bounds))

    def record_batch(self, size: int, input_ns: int, infer_ns: int, output_ns: int,
                     inferences: int | None = None) -> None:
        """A model execution of `size` rows, of which `inferences` (default all) were
        requests' rows (the rest fill a direct sequence batch)."""
        self.execution_count += 1
        self.inference_count += size if inferences is None else inferences
        durations = self._batches.get(size)
        if durations is None:
            durations = self._batches[size] = _BatchDurations()
        durations.compute_input.add(input_ns)
        durations.compute_infer.add(infer_ns)
        durations.compute_output.add(output_ns)

    def record_success(self, times: StageTimes, copied: int) -> None:
        self.last_inference_ms = time.time_ns() // 1_000_000  # wall clock: a timestamp, not a timer
        self.success.add(times.total_ns)
        self.request_latency.add(times.total_ns)
        self.queue_latency.add(times.queue_ns)
        self.infer_latency.add(times.infer_ns)
        self.queue.add(times.queue_ns)
        self.compute_input.add(times.input_ns)
        self.compute_infer.add(times.infer_ns)
        self.compute_output.add(times.output_ns)
        self.copied_bytes += copied
        if self.summaries is not None:
            self.summaries.observe(times.total_ns, times.queue_ns, times.input_ns,
                                   times.infer_ns, times.output_ns)

    def record_cache_hit(self, times: StageTimes) -> None:
        """A success the model did not run for: no inference, no execution (as Triton)."""
        self.last_inference_ms = time.time_ns() // 1_000_000
        self.success.add(times.total_ns)
        self.request_latency.add(times.total_ns)
        self.cache_hit.add(times.total_ns)
        if self.summaries is not None:
            self.summaries.observe(times.total_ns)

    def record_failure(self, total_ns: int, reason: str) -> None:
        self.fail.add(total_ns)
        self.failures_by_reason[reason] = self.failures_by_reason.get(reason, 0) + 1
        if self.summaries is not None:  # as nv_inference_request_duration_us counts it
            self.summaries.observe(total_ns)

    def as_dict(self) -> dict[str, object]:
        """Triton's `model_stats` entry."""
        return {
            "name": self.name,
            "version": str(self.version),
            "last_inference": self.last_inference_ms,
            "inference_count": self.inference_count,
            "execution_count": self.execution_count,
            "inference_stats": {
                "success": self.success.as_dict(), "fail": self.fail.as_dict(),
                "queue": self.queue.as_dict(), "compute_input": self.compute_input.as_dict(),
                "compute_infer": self.compute_infer.as_dict(),
                "compute_output": self.compute_output.as_dict(),
                "cache_hit": self.cache_hit.as_dict(), "cache_miss": self.cache_miss.as_dict(),
            },
            "batch_stats": [
                {"batch_size": size, "compute_input": d.compute_input.as_dict(),
                 "compute_infer": d.compute_infer.as_dict(),
                 "compute_output": d.compute_output.as_dict()}
                for size, d in sorted(self._batches.items())
            ],
            # Triton 2.51 has these too (a client reading them must find them): per-response
            # times of decoupled models and per-device memory, which it also leaves empty
            # for a Python-backend model and tensorgate does not measure
            "memory_usage": [],
            "response_stats": {},
        }
