"""Metrics a model defines for itself (Triton's custom metrics API: `pb_utils.MetricFamily`),
shown on the metrics port beside the server's own.

A model makes a family (`MetricFamily(name, description, kind)`: COUNTER, GAUGE or
HISTOGRAM) and metrics in it, one per label set (`family.Metric(labels={...})`), and updates
them from its threads (`increment`, `set`, `observe`). As in Triton, a metric lives as long
as the model keeps its object: one dropped (the model unloaded, say) leaves the metrics port,
and a family with it once it has no metric left. Making a family of a name that exists gives
the same family when kind and description agree, and is an error otherwise; a metric of
labels that exist in its family is the same metric.
"""

from __future__ import annotations

import math
import re
import threading
import weakref
from collections.abc import Mapping, Sequence

from tensorgate.errors import TritonModelException

__all__ = ["Metric", "MetricFamily", "label_text", "render_custom_metrics"]

_NAME = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")
_LABEL = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*")
_RESERVED_PREFIXES = ("nv_", "tensorgate_", "__")  # the server's own names
MAX_METRICS_PER_FAMILY = 10_000  # label sets: a model putting request ids in labels stops here

_registry_lock = threading.Lock()
_families: weakref.WeakValueDictionary[str, MetricFamily] = weakref.WeakValueDictionary()


# A family or metric the custom metrics API refuses (the model sees its message): Triton's
# raises TritonModelException, which a model may catch
MetricError = TritonModelException


class MetricFamily:
    """A named metric of one kind, with one `Metric` per label set."""

    COUNTER = 0
    GAUGE = 1
    HISTOGRAM = 2
    _KINDS = {COUNTER: "counter", GAUGE: "gauge", HISTOGRAM: "histogram"}

    def __new__(cls, name: str, description: str, kind: int) -> MetricFamily:
        if not isinstance(name, str) or not _NAME.fullmatch(name):
            raise MetricError(f"metric family name {name!r} is not a Prometheus metric name "
                              "([a-zA-Z_:][a-zA-Z0-9_:]*)")
        if name.startswith(_RESERVED_PREFIXES):
            raise MetricError(f"metric family name '{name}': names starting with "
                              f"{', '.join(_RESERVED_PREFIXES)} are the server's own")
        if kind not in cls._KINDS:
            raise MetricError(f"metric family '{name}': kind {kind!r} is not "
                              "MetricFamily.COUNTER, GAUGE or HISTOGRAM")
        with _registry_lock:
            existing = _families.get(name)
            if existing is not None:
                if existing._kind != kind or existing._description != str(description):
                    raise MetricError(
                        f"metric family '{name}' already exists as a "
                        f"{cls._KINDS[existing._kind]} described '{existing._description}'; "
                        "a family of that name must have the same kind and description")
                return existing
            family = super().__new__(cls)
            family._name = name
            family._description = str(description)
            family._kind = kind
            family._metrics = weakref.WeakValueDictionary()
            family._lock = threading.Lock()
            _families[name] = family
            return family

    _name: str
    _description: str
    _kind: int
    _metrics: weakref.WeakValueDictionary[tuple[tuple[str, str], ...], Metric]
    _lock: threading.Lock

    def __init__(self, name: str, description: str, kind: int) -> None:
        pass  # made in __new__, which may return an existing family

    def Metric(self, labels: Mapping[str, str] | None = None,  # Triton's name
               buckets: Sequence[float] | None = None) -> Metric:
        """The family's metric for `labels`; a histogram's needs its `buckets` (upper bounds,
        increasing)."""
        key = _label_key(self._name, labels or {})
        bounds = _buckets(self._name, self._kind, buckets)
        with self._lock:
            existing = self._metrics.get(key)
            if existing is not None:
                if existing._bounds != bounds:
                    raise MetricError(f"metric family '{self._name}': the metric of labels "
                                      f"{dict(key)} exists with buckets {list(existing._bounds)}")
                return existing
            if len(self._metrics) >= MAX_METRICS_PER_FAMILY:
                raise MetricError(f"metric family '{self._name}' has {MAX_METRICS_PER_FAMILY} "
                                  "label sets already; labels must not name each request")
            metric = Metric(self, key, bounds)
            self._metrics[key] = metric
            return metric

    def _render(self) -> list[str]:
        with self._lock:
            metrics = list(self._metrics.values())
        if not metrics:
            return []
        rows = [f"# HELP {self._name} {_help_text(self._description)}",
                f"# TYPE {self._name} {self._KINDS[self._kind]}"]
        for metric in metrics:
            rows += metric._rows()
        return rows


class Metric:
    """One label set's value in its family: `increment` (a counter, a gauge), `set` (a
    gauge), `observe` (a histogram), `value()`."""

    def __init__(self, family: MetricFamily, labels: tuple[tuple[str, str], ...],
                 bounds: tuple[float, ...]) -> None:
        self._family = family  # kept alive while a metric of it is
        self._labels = labels
        self._bounds = bounds
        self._value = 0.0
        self._counts = [0] * (len(bounds) + 1)  # a histogram's, per bucket, +Inf last
        self._lock = threading.Lock()

    def increment(self, value: float) -> None:
        kind = self._family._kind
        if kind == MetricFamily.HISTOGRAM:
            raise MetricError(f"metric '{self._family._name}' is a histogram: observe(), not "
                              "increment()")
        value = _number(self._family._name, value)
        if kind == MetricFamily.COUNTER and value < 0:
            raise MetricError(f"metric '{self._family._name}' is a counter: it cannot be "
                              f"incremented by {value}")
        with self._lock:
            self._value += value

    def set(self, value: float) -> None:
        if self._family._kind != MetricFamily.GAUGE:
            raise MetricError(f"metric '{self._family._name}' is a "
                              f"{MetricFamily._KINDS[self._family._kind]}: only a gauge is set")
        value = _number(self._family._name, value)
        with self._lock:
            self._value = value

    def observe(self, value: float) -> None:
        if self._family._kind != MetricFamily.HISTOGRAM:
            raise MetricError(f"metric '{self._family._name}' is a "
                              f"{MetricFamily._KINDS[self._family._kind]}: only a histogram "
                              "observes")
        value = _number(self._family._name, value)
        index = next((i for i, bound in enumerate(self._bounds) if value <= bound),
                     len(self._bounds))
        with self._lock:
            self._counts[index] += 1
            self._value += value

    def value(self) -> float:
        """A counter's or gauge's value (a histogram's is its buckets: not one number)."""
        if self._family._kind == MetricFamily.HISTOGRAM:
            raise MetricError(f"metric '{self._family._name}' is a histogram: value() is for "
                              "counters and gauges")
        return self._value

    def _rows(self) -> list[str]:
        name = self._family._name
        labels = label_text(self._labels)
        with self._lock:
            value, counts = self._value, list(self._counts)
        if self._family._kind != MetricFamily.HISTOGRAM:
            return [f"{name}{labels} {_number_text(value)}"]
        rows = []
        total = 0
        for bound, count in zip([*self._bounds, math.inf], counts):
            total += count
            le = "+Inf" if bound == math.inf else _number_text(bound)
            rows.append(f"{name}_bucket{label_text(self._labels + (('le', le),))} {total}")
        rows.append(f"{name}_sum{labels} {_number_text(value)}")
        rows.append(f"{name}_count{labels} {total}")
        return rows


def render_custom_metrics() -> list[str]:
    """Every living family's rows, in Prometheus text, sorted by name."""
    with _registry_lock:
        families = sorted(_families.items())
    rows: list[str] = []
    for _, family in families:
        rows += family._render()
    return rows


def _label_key(family: str, labels: Mapping[str, str]) -> tuple[tuple[str, str], ...]:
    if not isinstance(labels, Mapping):
        raise MetricError(f"metric family '{family}': labels must be a dict of strings, not "
                          f"a {type(labels).__name__}")
    for key, value in labels.items():
        if not isinstance(key, str) or not _LABEL.fullmatch(key) or key.startswith("__") \
                or key == "le":
            raise MetricError(f"metric family '{family}': label name {key!r} is not a "
                              "Prometheus label name ([a-zA-Z_][a-zA-Z0-9_]*, not 'le' nor "
                              "starting with '__')")
        if not isinstance(value, str):
            raise MetricError(f"metric family '{family}': label '{key}' is "
                              f"{type(value).__name__} {value!r}; label values are strings")
    return tuple(sorted(labels.items()))


def _buckets(family: str, kind: int, buckets: Sequence[float] | None) -> tuple[float, ...]:
    if kind != MetricFamily.HISTOGRAM:
        if buckets is not None:
            raise MetricError(f"metric family '{family}': buckets are for histograms only")
        return ()
    if buckets is None:
        raise MetricError(f"metric family '{family}' is a histogram: its metrics need buckets")
    bounds = tuple(_number(family, b) for b in buckets)
    if not bounds or any(b >= c for b, c in zip(bounds, bounds[1:])) \
            or any(math.isinf(b) for b in bounds):
        raise MetricError(f"metric family '{family}': buckets {list(buckets)} must be finite "
                          "upper bounds in increasing order, at least one")
    return bounds


def _number(family: str, value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or math.isnan(value):
        raise MetricError(f"metric '{family}': {value!r} is not a number")
    return float(value)


def _number_text(value: float) -> str:
    if value == math.inf:
        return "+Inf"
    if value == -math.inf:
        return "-Inf"
    return repr(int(value)) if value.is_integer() and abs(value) < 2 ** 53 else repr(value)


def _help_text(text: str) -> str:
    return text.replace("\\", "\\\\").replace("\n", "\\n")


def label_text(labels: tuple[tuple[str, str], ...]) -> str:
    """`{name="value",...}` with values escaped as Prometheus' text format wants them; ""
    for no labels. The server's own metrics write their labels with it too."""
    if not labels:
        return ""
    return "{" + ",".join(f'{key}="{_escape(value)}"' for key, value in labels) + "}"


def _escape(value: str) -> str:
    """A label value as Prometheus' text format quotes it."""
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
