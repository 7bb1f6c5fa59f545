"""Triton's per-model metric settings in config.pbtxt: `metric_tags` and `model_metrics`.

`metric_tags { key: "team" value: "search" }` adds a label to every metric of the model,
its key prefixed with an underscore (`_team="search"`) as Triton writes it, so a dashboard
can group models by what the repository's owner says about them. A key must make a
Prometheus label name: letters, digits and underscores, not starting with one (Prometheus
keeps names that start with two underscores for itself).

`model_metrics { metric_control [ { metric_identifier { family: "..." } histogram_options
{ buckets: [...] } } ] }` sets one histogram's bucket bounds for this model, in the family's
unit. Triton acts on its first-response histogram (ms); tensorgate also on its own latency
histograms (s). A family named here that the server does not write is served without, and
the load says so (Triton warns the same way): a repository written for a newer Triton may
name one.

Both may come from a client's load `config`: what one costs on every scrape is bounded.
"""

from __future__ import annotations

import math
import re

from tritonclient.grpc import model_config_pb2 as pb

from tensorgate.errors import ModelConfigError

__all__ = ["MAX_BUCKETS", "MAX_METRIC_TAGS", "histogram_bounds", "metric_tags"]

MAX_METRIC_TAGS = 32  # labels on each of the model's rows, on every scrape
MAX_TAG_VALUE_CHARS = 256
MAX_BUCKETS = 64  # one histogram's bounds: each is a row per model version on every scrape
_MAX_BOUND_NS = 2**63 - 1  # the longest duration in ns an int64 holds, some 292 years
_TAG_KEY = re.compile(r"[A-Za-z0-9][A-Za-z0-9_]{0,127}")
# family -> (the model version's histogram it sets: ModelStatistics' request_latency,
# queue_latency, infer_latency or first_response_latency; ns in one of its unit)
_FAMILIES = {
    "nv_inference_first_response_histogram_ms": ("first_response", 1_000_000),
    "tensorgate_first_response_duration_seconds": ("first_response", 1_000_000_000),
    "tensorgate_request_duration_seconds": ("request", 1_000_000_000),
    "tensorgate_queue_duration_seconds": ("queue", 1_000_000_000),
    "tensorgate_compute_infer_duration_seconds": ("infer", 1_000_000_000),
}


def metric_tags(config: pb.ModelConfig, source: str) -> tuple[tuple[str, str], ...]:
    """The config's metric_tags as labels (`_key`, value), sorted by key."""
    if len(config.metric_tags) > MAX_METRIC_TAGS:
        raise ModelConfigError(source, f"'metric_tags' has {len(config.metric_tags)} tags; at "
                                       f"most {MAX_METRIC_TAGS} may be given")
    labels = []
    for key, value in sorted(config.metric_tags.items()):
        if _TAG_KEY.fullmatch(key) is None:
            raise ModelConfigError(source, f"metric_tags key {key!r} cannot name a label: it "
                                           "must be letters, digits and underscores (at most "
                                           "128), not starting with an underscore")
        if len(value) > MAX_TAG_VALUE_CHARS:
            raise ModelConfigError(source, f"metric_tags value of {key!r} has {len(value)} "
                                           f"characters; at most {MAX_TAG_VALUE_CHARS}")
        labels.append((f"_{key}", value))
    return tuple(labels)


def histogram_bounds(config: pb.ModelConfig, source: str
                     ) -> tuple[tuple[tuple[str, tuple[int, ...]], ...], tuple[str, ...]]:
    """(each histogram the config sets, by name ("request", "queue", "infer",
    "first_response"), with its bounds in ns, ascending; the families it names that the
    server does not write, for the load's warning)."""
    bounds: dict[str, tuple[int, ...]] = {}
    set_by: dict[str, str] = {}
    unknown = []
    for index, control in enumerate(config.model_metrics.metric_control):
        family = control.metric_identifier.family
        where = f"model_metrics.metric_control[{index}]"
        if family not in _FAMILIES:
            unknown.append(f"{where} (family {family!r} is not one this server writes)")
            continue
        histogram, ns_per_unit = _FAMILIES[family]
        given = _bounds_ns(control, ns_per_unit, f"{where} ({family})", source)
        if histogram in bounds and bounds[histogram] != given:
            raise ModelConfigError(source, f"{where} sets {family}'s buckets, and "
                                           f"{set_by[histogram]} set other buckets for the "
                                           "same histogram (the one in ms, the other in s): "
                                           "give one")
        bounds[histogram] = given
        set_by[histogram] = family
    return tuple(sorted(bounds.items())), tuple(unknown)


def _bounds_ns(control: pb.ModelMetrics.MetricControl, ns_per_unit: int, where: str,
               source: str) -> tuple[int, ...]:
    buckets = control.histogram_options.buckets
    if not buckets:
        raise ModelConfigError(source, f"{where} gives no histogram_options.buckets")
    if len(buckets) > MAX_BUCKETS:
        raise ModelConfigError(source, f"{where} gives {len(buckets)} buckets; at most "
                                       f"{MAX_BUCKETS}")
    found: list[int] = []
    for value in buckets:
        scaled = value * ns_per_unit
        if not (math.isfinite(scaled) and 0 <= scaled <= _MAX_BOUND_NS):
            raise ModelConfigError(source, f"{where}: bucket bound {value} is not a duration "
                                           "(a number from 0 to 2^63 ns, about 292 years)")
        ns = round(scaled)
        if found and ns <= found[-1]:
            raise ModelConfigError(source, f"{where}: the bucket bounds must increase, each by "
                                           f"1 ns or more; {value} follows "
                                           f"{found[-1] / ns_per_unit:g}")
        found.append(ns)
    return tuple(found)
