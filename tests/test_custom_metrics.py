"""Models' own metrics (Triton's custom metrics API, `pb_utils.MetricFamily`): what each kind
allows, what is refused and why, the Prometheus text they render, and that a metric lives
as long as the model keeps it."""

from __future__ import annotations

import gc

import pytest

from tensorgate import python_backend as pb_utils
from tensorgate.custom_metrics import MetricError, render_custom_metrics


def _rows(prefix: str) -> list[str]:
    return [row for row in render_custom_metrics() if prefix in row]


def test_counters_gauges_and_histograms_render_as_prometheus_text() -> None:
    counter = pb_utils.MetricFamily("t_tokens_total", "Tokens made", pb_utils.MetricFamily.COUNTER)
    made = counter.Metric(labels={"model": "m", "quote": 'a"b\\c\nd'})
    made.increment(3)
    made.increment(0.5)
    gauge = pb_utils.MetricFamily("t_queue", "Queued", pb_utils.MetricFamily.GAUGE).Metric()
    gauge.set(4)
    gauge.increment(-6)
    histogram = pb_utils.MetricFamily("t_seconds", "Latency", pb_utils.MetricFamily.HISTOGRAM
                                      ).Metric(labels={"m": "x"}, buckets=[0.1, 1.0])
    for value in (0.05, 0.1, 0.5, 9):
        histogram.observe(value)
    assert made.value() == 3.5 and gauge.value() == -2
    assert _rows("t_tokens_total") == [
        "# HELP t_tokens_total Tokens made", "# TYPE t_tokens_total counter",
        't_tokens_total{model="m",quote="a\\"b\\\\c\\nd"} 3.5']
    assert _rows("t_queue") == ["# HELP t_queue Queued", "# TYPE t_queue gauge", "t_queue -2"]
    assert _rows("t_seconds") == [
        "# HELP t_seconds Latency", "# TYPE t_seconds histogram",
        't_seconds_bucket{m="x",le="0.1"} 2', 't_seconds_bucket{m="x",le="1"} 3',
        't_seconds_bucket{m="x",le="+Inf"} 4', 't_seconds_sum{m="x"} 9.65',
        't_seconds_count{m="x"} 4']


def test_the_same_name_and_labels_give_the_same_family_and_metric() -> None:
    family = pb_utils.MetricFamily("t_same", "Same", pb_utils.MetricFamily.COUNTER)
    metric = family.Metric(labels={"a": "1"})
    again = pb_utils.MetricFamily("t_same", "Same", pb_utils.MetricFamily.COUNTER)
    assert again is family and again.Metric(labels={"a": "1"}) is metric
    assert family.Metric(labels={"a": "2"}) is not metric
    # what Triton's raises, so a model's `except pb_utils.TritonModelException` catches it
    # (tools/triton_diff.py "probe metrics: ...")
    with pytest.raises(pb_utils.TritonModelException,
                       match="already exists as a counter described 'Same'"):
        pb_utils.MetricFamily("t_same", "Same", pb_utils.MetricFamily.GAUGE)
    assert MetricError is pb_utils.TritonModelException


def test_a_metric_lives_as_long_as_the_model_keeps_it() -> None:
    family = pb_utils.MetricFamily("t_life", "Life", pb_utils.MetricFamily.GAUGE)
    kept = family.Metric(labels={"k": "kept"})
    dropped = family.Metric(labels={"k": "dropped"})
    assert len(_rows("t_life{")) == 2
    del dropped
    gc.collect()
    assert _rows("t_life{") == ['t_life{k="kept"} 0']
    del family, kept
    gc.collect()
    assert _rows("t_life") == []  # nothing of the family is left: it goes too


@pytest.mark.parametrize("make, message", [
    (lambda: pb_utils.MetricFamily("bad name", "", pb_utils.MetricFamily.GAUGE),
     "is not a Prometheus metric name"),
    (lambda: pb_utils.MetricFamily("nv_inference_count", "", pb_utils.MetricFamily.GAUGE),
     "are the server's own"),
    (lambda: pb_utils.MetricFamily("t_kind", "", 7), "kind 7 is not MetricFamily.COUNTER"),
    (lambda: pb_utils.MetricFamily("t_l", "", 0).Metric(labels={"le": "x"}),
     "label name 'le' is not a Prometheus label name"),
    (lambda: pb_utils.MetricFamily("t_l", "", 0).Metric(labels={"a": 1}),
     "label 'a' is int 1; label values are strings"),
    (lambda: pb_utils.MetricFamily("t_c", "", 0).Metric().increment(-1),
     "is a counter: it cannot be incremented by -1"),
    (lambda: pb_utils.MetricFamily("t_c", "", 0).Metric().set(1), "only a gauge is set"),
    (lambda: pb_utils.MetricFamily("t_c", "", 0).Metric().increment("1"), "is not a number"),
    (lambda: pb_utils.MetricFamily("t_c", "", 0).Metric().increment(float("nan")),
     "is not a number"),
    (lambda: pb_utils.MetricFamily("t_c", "", 0).Metric(buckets=[1]),
     "buckets are for histograms only"),
    (lambda: pb_utils.MetricFamily("t_h", "", 2).Metric(), "its metrics need buckets"),
    (lambda: pb_utils.MetricFamily("t_h", "", 2).Metric(buckets=[2, 1]),
     "increasing order"),
    (lambda: pb_utils.MetricFamily("t_h", "", 2).Metric(buckets=[1]).increment(1),
     "observe\\(\\), not increment"),
    (lambda: pb_utils.MetricFamily("t_h", "", 2).Metric(buckets=[1]).value(),
     "value\\(\\) is for counters and gauges"),
])
def test_what_the_api_refuses_it_names(make, message: str) -> None:
    with pytest.raises(MetricError, match=message):
        make()


def test_label_sets_per_family_are_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("tensorgate.custom_metrics.MAX_METRICS_PER_FAMILY", 3)
    family = pb_utils.MetricFamily("t_bound", "", pb_utils.MetricFamily.COUNTER)
    kept = [family.Metric(labels={"id": str(i)}) for i in range(3)]
    with pytest.raises(MetricError, match="has 3 label sets already"):
        family.Metric(labels={"id": "3"})
    assert len(kept) == 3
