"""Prometheus text exposition with Triton's metric names, so existing dashboards keep working,
plus tensorgate's own (copies, pool, cache, connections, and latency histograms). Triton's
counters are cumulative, their latencies µs; the histograms are in seconds, Prometheus' way."""

from __future__ import annotations

import functools
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from tensorgate.custom_metrics import label_text, render_custom_metrics
from tensorgate.gpu_metrics import GpuSample
from tensorgate.host_metrics import HostSample
from tensorgate.pipeline.response_cache import CacheStatistics
from tensorgate.pipeline.stats import SUMMARY_STAGES, Histogram, ModelCall, ModelStatistics
from tensorgate.tensor.copies import process_copies
from tensorgate.tensor.pool import PoolStatistics

__all__ = ["LatencyMetrics", "render_metrics"]

Labels = tuple[tuple[str, str], ...]  # (name, value), in the order written


@dataclass(frozen=True)
class LatencyMetrics:
    """Which of Triton's latency metrics to write (its --metrics-config): the cumulative
    counters, the summaries at these quantiles (none: no summaries), decoupled models'
    first-response histogram in ms."""

    counters: bool = True
    summary_quantiles: tuple[float, ...] = ()
    first_response_histogram: bool = False

_HELP = {
    "nv_inference_request_success": ("counter", "Number of successful inference requests"),
    "nv_inference_request_failure": ("counter", "Number of failed inference requests"),
    "nv_inference_count": ("counter", "Number of inferences performed (batch N counts N)"),
    "nv_inference_exec_count": ("counter", "Number of model executions (batches)"),
    "nv_inference_pending_request_count": ("gauge", "Requests queued, not yet executing"),
    "nv_model_load_duration_secs": ("gauge", "Model load time in seconds"),
    "nv_inference_request_duration_us": ("counter", "Cumulative end-to-end request time (µs)"),
    "nv_inference_queue_duration_us": ("counter", "Cumulative time requests waited (µs)"),
    "nv_inference_compute_input_duration_us": ("counter", "Cumulative input time (µs)"),
    "nv_inference_compute_infer_duration_us": ("counter", "Cumulative model time (µs)"),
    "nv_inference_compute_output_duration_us": ("counter", "Cumulative output time (µs)"),
    "nv_inference_request_summary_us": (
        "summary", "End-to-end request time (µs), successes and failures, over the last 60 s"),
    "nv_inference_queue_summary_us": ("summary", "Time requests waited (µs), last 60 s"),
    "nv_inference_compute_input_summary_us": ("summary", "Input time (µs), last 60 s"),
    "nv_inference_compute_infer_summary_us": ("summary", "Model time (µs), last 60 s"),
    "nv_inference_compute_output_summary_us": ("summary", "Output time (µs), last 60 s"),
    "nv_inference_first_response_histogram_ms": (
        "histogram", "A decoupled model's time from a request to its first response (ms)"),
    "nv_cache_num_hits_per_model": ("counter", "Requests answered from the response cache"),
    "nv_cache_num_misses_per_model": ("counter", "Requests the response cache did not hold"),
    "nv_cache_hit_duration_per_model": ("counter", "Cumulative cache lookup time of hits (µs)"),
    "nv_cache_miss_duration_per_model": (
        "counter", "Cumulative cache lookup and insertion time of misses (µs)"),
    "nv_cpu_utilization": ("gauge", "CPU utilization rate [0.0 - 1.0]"),
    "nv_cpu_memory_total_bytes": ("gauge", "CPU total memory (RAM), in bytes"),
    "nv_cpu_memory_used_bytes": ("gauge", "CPU used memory (RAM), in bytes"),
    "nv_gpu_utilization": ("gauge", "GPU utilization rate [0.0 - 1.0]"),
    "nv_gpu_memory_total_bytes": ("gauge", "GPU total memory, in bytes"),
    "nv_gpu_memory_used_bytes": ("gauge", "GPU used memory, in bytes"),
    "nv_gpu_power_usage": ("gauge", "GPU power usage, in watts"),
    "nv_gpu_power_limit": ("gauge", "GPU power management limit, in watts"),
    "nv_energy_consumption": ("counter", "GPU energy consumed since the server started, in "
                                         "joules"),
    "nv_pinned_memory_pool_total_bytes": ("gauge", "Pinned memory pool total memory size, in "
                                                   "bytes"),
    "nv_pinned_memory_pool_used_bytes": ("gauge", "Pinned memory pool used memory size, in "
                                                  "bytes"),
    "tensorgate_batch_rows_limit": (
        "gauge", "Rows a dynamic batch may take now: max_batch_size, or less where larger "
                 "batches measured dearer per row"),
    "tensorgate_model_call_seconds": (
        "gauge", "How long each instance's current call into its model has run (0 while "
                 "idle): one that keeps growing is a model that does not return"),
    "tensorgate_sequence_slots": ("gauge", "A stateful model's sequence slots, all instances"),
    "tensorgate_sequences_active": ("gauge", "Sequences holding a slot"),
    "tensorgate_sequences_waiting": ("gauge", "Sequences started and waiting for a free slot"),
    "tensorgate_sequences_expired_total": (
        "counter", "Sequences ended by max_sequence_idle_microseconds, not by sequence_end"),
    "tensorgate_request_duration_seconds": (
        "histogram", "Successful requests' time in the server's pipeline, queue to answer"),
    "tensorgate_queue_duration_seconds": (
        "histogram", "Successful requests' time waiting in the queue"),
    "tensorgate_compute_infer_duration_seconds": (
        "histogram", "Successful requests' time in the model (their batch's)"),
    "tensorgate_first_response_duration_seconds": (
        "histogram", "A decoupled model's time from a request to its first response"),
    "tensorgate_copied_bytes_total": ("counter", "Tensor bytes the server copied"),
    "tensorgate_copies_by_reason_bytes_total": (
        "counter", "Tensor bytes the whole process copied, by reason (receive, decode, batch, ...)"),
    "tensorgate_copies_by_reason_total": ("counter", "Copies the whole process made, by reason"),
    "tensorgate_pool_bytes": ("gauge", "Host buffer pool bytes by state (in_use, idle)"),
    "tensorgate_pool_limit_bytes": ("gauge", "Host buffer pool bounds (held, idle)"),
    "tensorgate_pool_acquires_total": ("counter", "Pool acquisitions by result (hit, miss)"),
    "tensorgate_pool_evictions_total": ("counter", "Pooled buffers freed to stay in bounds"),
    # Triton's local cache's, server-wide; its two durations are totals in µs
    "nv_cache_num_entries": ("gauge", "Number of responses stored in response cache"),
    "nv_cache_num_lookups": ("gauge", "Number of cache lookups in response cache"),
    "nv_cache_num_hits": ("gauge", "Number of cache hits in response cache"),
    "nv_cache_num_misses": ("gauge", "Number of cache misses in response cache"),
    "nv_cache_num_evictions": ("gauge", "Number of cache evictions in response cache"),
    "nv_cache_lookup_duration": (
        "gauge", "Total cache lookup duration (hit and miss), in microseconds"),
    "nv_cache_insertion_duration": ("gauge", "Total cache insertion duration, in microseconds"),
    "nv_cache_util": ("gauge", "Cache utilization [0.0 - 1.0]"),
    "tensorgate_response_cache_bytes": ("gauge", "Response cache bytes by state (used, limit)"),
    "tensorgate_response_cache_entries": ("gauge", "Answers the response cache holds"),
    "tensorgate_response_cache_evictions_total": (
        "counter", "Answers the response cache dropped to stay in its bound"),
    "tensorgate_traces_written_total": (
        "counter", "Traces written to the trace file (or sent to the OpenTelemetry collector)"),
    "tensorgate_traces_held": ("gauge", "Traces taken and not yet written (or sent)"),
    "tensorgate_traces_dropped_total": (
        "counter", "Traces chosen but not kept: too many waited, or the OpenTelemetry "
                   "collector did not take them"),
    "tensorgate_connections_open": ("gauge", "Client connections open (HTTP and gRPC)"),
    "tensorgate_connections_refused_total": (
        "counter", "Client connections refused past --max-connections"),
    "tensorgate_connections_flooding_total": (
        "counter", "Client connections ended for flooding the server (HTTP/2 GOAWAY "
                   "ENHANCE_YOUR_CALM: streams reset or refused, frames that carry nothing, "
                   "oversized frames or header blocks)"),
    "tensorgate_connections_probation_total": (
        "counter", "Client connections opened from an address whose connection was ended "
                   "for flooding within the last minute: each read at an eighth of the pace "
                   "until it has earned its streams"),
    "tensorgate_connections_retired_total": (
        "counter", "gRPC connections sent GOAWAY at their maximum age "
                   "(--grpc-max-connection-age)"),
    "tensorgate_connections_keepalive_closed_total": (
        "counter", "gRPC connections closed when a keepalive PING went unanswered "
                   "(--grpc-keepalive-time, --grpc-keepalive-timeout)"),
}


def _number(value: float) -> str:
    """A bound or a value as Prometheus reads it, without trailing zeros ("0.00005", "2.5")."""
    return f"{value:.6f}".rstrip("0").rstrip(".")


@functools.lru_cache(maxsize=64)
def _le_labels(bounds_ns: tuple[int, ...], in_ms: bool) -> tuple[str, ...]:
    """Prometheus' `le` label of each bucket bound, in seconds or in ms ("0.00005", "2.5"),
    then "+Inf"; a bound six decimals cannot write exactly is written in full ("5e-07")."""
    labels = []
    for ns in bounds_ns:
        bound = ns / (1e6 if in_ms else 1e9)
        text = _number(bound)
        labels.append(text if float(text) == bound else repr(bound))
    return (*labels, "+Inf")


def _histogram(histogram: Histogram, labels: Labels, in_ms: bool = False) -> list[str]:
    """The rows of one histogram: cumulative buckets, then its sum and count, in seconds
    (Prometheus' unit) or ms (Triton's for its first-response histogram)."""
    text = label_text(labels)
    rows = []
    total = 0
    for le, count in zip(_le_labels(histogram.bounds_ns, in_ms), histogram.counts):
        total += count
        rows.append(f'_bucket{text[:-1]},le="{le}"}} {total}')
    rows.append(f"_sum{text} {histogram.ns / (1e6 if in_ms else 1e9):.9f}")
    rows.append(f"_count{text} {total}")
    return rows


def _summaries(stats: ModelStatistics, labels: Labels, quantiles: tuple[float, ...]
               ) -> Iterable[tuple[str, list[str]]]:
    """Each stage's summary rows: its count and sum (all time, µs), then its value at each
    quantile over the window (NaN when the window saw no request)."""
    if stats.summaries is None:
        return
    text = label_text(labels)
    for stage in SUMMARY_STAGES:
        values, count, total_us = stats.summaries.read(stage, quantiles)
        rows = [f"_count{text} {count}", f"_sum{text} {total_us}"]
        for quantile, value in zip(quantiles, values):
            shown = "NaN" if math.isnan(value) else _number(value)
            rows.append(f'{label_text((*labels, ("quantile", f"{quantile:g}")))} {shown}')
        yield f"nv_inference_{stage}_summary_us", rows


def _labels(**values: str) -> str:
    return label_text(tuple(values.items()))


def render_metrics(models: Iterable[tuple[ModelStatistics, int]],
                   pool: PoolStatistics | None = None,
                   connections: tuple[int, int, int, int, int, int] | None = None,
                   cache: CacheStatistics | None = None,
                   traces: tuple[int, int, int] | None = None,
                   host: HostSample | None = None,
                   latencies: LatencyMetrics = LatencyMetrics(),
                   gpus: Sequence[GpuSample] = (),
                   calls: Sequence[ModelCall] = ()) -> str:
    """`models`: each version's statistics and its pending-request count; `pool`: the host
    buffer pool's, when there is one to report; `connections`: (open, refused so far, ended
    for flooding so far, retired at their age so far, closed when a keepalive PING went
    unanswered, opened on probation); `cache`: the response cache's, when
    the server has one; `traces`: (written, held, dropped), when the server traces; `host`:
    the last CPU sample, when it takes them; `latencies`: which of Triton's latency metrics
    to write; `gpus`: the last GPU sample, one per GPU, when the server takes them (a
    reading a GPU lacks is left out); `calls`: each instance's current call into its model
    (Engine.model_calls)."""
    rows: dict[str, list[str]] = {name: [] for name in _HELP}
    tags: dict[tuple[str, int], Labels] = {}
    for stats, pending in models:
        # each row of a model version: its name, its version, its config's metric_tags
        base: Labels = (("model", stats.name), ("version", str(stats.version)), *stats.tags)
        tags[stats.name, stats.version] = stats.tags
        labels = label_text(base)
        rows["nv_inference_request_success"].append(f"{labels} {stats.success.count}")
        for reason in ("REJECTED", "CANCELED", "BACKEND", "OTHER"):
            failed = stats.failures_by_reason.get(reason, 0)
            rows["nv_inference_request_failure"].append(
                f"{label_text((*base, ('reason', reason)))} {failed}")
        rows["nv_inference_count"].append(f"{labels} {stats.inference_count}")
        rows["nv_inference_exec_count"].append(f"{labels} {stats.execution_count}")
        rows["nv_inference_pending_request_count"].append(f"{labels} {pending}")
        rows["nv_model_load_duration_secs"].append(f"{labels} {stats.load_s:.9f}")
        if latencies.counters:
            total_ns = stats.success.ns + stats.fail.ns
            rows["nv_inference_request_duration_us"].append(f"{labels} {total_ns // 1000}")
            rows["nv_inference_queue_duration_us"].append(f"{labels} {stats.queue.ns // 1000}")
            rows["nv_inference_compute_input_duration_us"].append(
                f"{labels} {stats.compute_input.ns // 1000}")
            rows["nv_inference_compute_infer_duration_us"].append(
                f"{labels} {stats.compute_infer.ns // 1000}")
            rows["nv_inference_compute_output_duration_us"].append(
                f"{labels} {stats.compute_output.ns // 1000}")
        if stats.cached:
            rows["nv_cache_num_hits_per_model"].append(f"{labels} {stats.cache_hit.count}")
            rows["nv_cache_num_misses_per_model"].append(f"{labels} {stats.cache_miss.count}")
            rows["nv_cache_hit_duration_per_model"].append(
                f"{labels} {stats.cache_hit.ns // 1000}")
            rows["nv_cache_miss_duration_per_model"].append(
                f"{labels} {stats.cache_miss.ns // 1000}")
        if stats.batch_rows_limit:
            rows["tensorgate_batch_rows_limit"].append(f"{labels} {stats.batch_rows_limit}")
        if stats.sequence_slots:
            rows["tensorgate_sequence_slots"].append(f"{labels} {stats.sequence_slots}")
            rows["tensorgate_sequences_active"].append(f"{labels} {stats.sequences_active}")
            rows["tensorgate_sequences_waiting"].append(f"{labels} {stats.sequences_waiting}")
            rows["tensorgate_sequences_expired_total"].append(
                f"{labels} {stats.sequences_expired}")
        rows["tensorgate_request_duration_seconds"] += _histogram(stats.request_latency, base)
        rows["tensorgate_queue_duration_seconds"] += _histogram(stats.queue_latency, base)
        rows["tensorgate_compute_infer_duration_seconds"] += _histogram(stats.infer_latency,
                                                                       base)
        if stats.first_response_latency.ns:
            rows["tensorgate_first_response_duration_seconds"] += _histogram(
                stats.first_response_latency, base)
            if latencies.first_response_histogram:
                rows["nv_inference_first_response_histogram_ms"] += _histogram(
                    stats.first_response_latency, base, in_ms=True)
        if latencies.summary_quantiles:
            for name, summary in _summaries(stats, base, latencies.summary_quantiles):
                rows[name] += summary
        rows["tensorgate_copied_bytes_total"].append(f"{labels} {stats.copied_bytes}")
    for call in calls:
        called: Labels = (("model", call.model), ("version", str(call.version)),
                          *tags.get((call.model, call.version), ()),
                          ("instance", call.instance))
        rows["tensorgate_model_call_seconds"].append(
            f"{label_text(called)} {_number(call.seconds)}")
    totals = process_copies()
    rows["tensorgate_copied_bytes_total"].append(
        f'{_labels(model="")} {totals.bytes}')  # the whole process, all models
    for reason, (nbytes, copies) in totals.by_reason.items():
        rows["tensorgate_copies_by_reason_bytes_total"].append(f"{_labels(reason=reason)} {nbytes}")
        rows["tensorgate_copies_by_reason_total"].append(f"{_labels(reason=reason)} {copies}")
    if host is not None:
        rows["nv_cpu_utilization"].append(f" {host.cpu_utilization}")
        rows["nv_cpu_memory_total_bytes"].append(f" {host.memory_total_bytes}")
        rows["nv_cpu_memory_used_bytes"].append(f" {host.memory_used_bytes}")
    for gpu in gpus:
        labels = _labels(gpu_uuid=gpu.uuid)
        for name, reading in (("nv_gpu_utilization", gpu.utilization),
                              ("nv_gpu_memory_total_bytes", gpu.memory_total_bytes),
                              ("nv_gpu_memory_used_bytes", gpu.memory_used_bytes),
                              ("nv_gpu_power_usage", gpu.power_watts),
                              ("nv_gpu_power_limit", gpu.power_limit_watts),
                              ("nv_energy_consumption", gpu.energy_joules)):
            if reading is not None:
                rows[name].append(f"{labels} {reading}")
    if pool is not None:
        # Triton's pinned pool is the host pool here when CUDA is present (0 without)
        pinned = pool.pinned
        rows["nv_pinned_memory_pool_total_bytes"].append(
            f" {pool.limit_bytes if pinned else 0}")
        rows["nv_pinned_memory_pool_used_bytes"].append(
            f" {pool.bytes_in_use if pinned else 0}")
        rows["tensorgate_pool_bytes"] += [f"{_labels(state='in_use')} {pool.bytes_in_use}",
                                          f"{_labels(state='idle')} {pool.bytes_idle}"]
        rows["tensorgate_pool_limit_bytes"] += [f"{_labels(bound='held')} {pool.limit_bytes}",
                                                f"{_labels(bound='idle')} {pool.idle_limit_bytes}"]
        rows["tensorgate_pool_acquires_total"] += [f"{_labels(result='hit')} {pool.hits}",
                                                   f"{_labels(result='miss')} {pool.misses}"]
        rows["tensorgate_pool_evictions_total"].append(f" {pool.evictions}")
    if cache is not None:
        for name, reading in (("nv_cache_num_entries", cache.entries),
                              ("nv_cache_num_lookups", cache.hits + cache.misses),
                              ("nv_cache_num_hits", cache.hits),
                              ("nv_cache_num_misses", cache.misses),
                              ("nv_cache_num_evictions", cache.evictions),
                              ("nv_cache_lookup_duration", cache.lookup_ns // 1000),
                              ("nv_cache_insertion_duration", cache.insertion_ns // 1000)):
            rows[name].append(f" {reading}")
        rows["nv_cache_util"].append(f" {_number(cache.bytes / cache.limit_bytes)}")
        rows["tensorgate_response_cache_bytes"] += [f"{_labels(state='used')} {cache.bytes}",
                                                    f"{_labels(state='limit')} {cache.limit_bytes}"]
        rows["tensorgate_response_cache_entries"].append(f" {cache.entries}")
        rows["tensorgate_response_cache_evictions_total"].append(f" {cache.evictions}")
    if traces is not None:
        rows["tensorgate_traces_written_total"].append(f" {traces[0]}")
        rows["tensorgate_traces_held"].append(f" {traces[1]}")
        rows["tensorgate_traces_dropped_total"].append(f" {traces[2]}")
    if connections is not None:
        rows["tensorgate_connections_open"].append(f" {connections[0]}")
        rows["tensorgate_connections_refused_total"].append(f" {connections[1]}")
        rows["tensorgate_connections_flooding_total"].append(f" {connections[2]}")
        rows["tensorgate_connections_retired_total"].append(f" {connections[3]}")
        rows["tensorgate_connections_keepalive_closed_total"].append(f" {connections[4]}")
        rows["tensorgate_connections_probation_total"].append(f" {connections[5]}")
    out = []
    for name, (kind, text) in _HELP.items():
        if not rows[name]:
            continue
        out.append(f"# HELP {name} {text}")
        out.append(f"# TYPE {name} {kind}")
        out += [f"{name}{row}" for row in rows[name]]
    out += render_custom_metrics()  # the models' own (pb_utils.MetricFamily)
    return "\n".join(out) + "\n"
