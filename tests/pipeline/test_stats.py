"""Latency histograms: each duration lands in the first bucket whose bound holds it, and the
exposition is cumulative, as Prometheus' histogram_quantile reads it."""

from __future__ import annotations

import re

from tensorgate.metrics import render_metrics
from tensorgate.pipeline.stats import LATENCY_BOUNDS_US, Histogram, ModelStatistics, StageTimes


def test_a_duration_on_a_bound_counts_in_that_bound_s_bucket() -> None:
    histogram = Histogram()
    for us in (0, 50, 51, 100, LATENCY_BOUNDS_US[-1], LATENCY_BOUNDS_US[-1] + 1):
        histogram.add(us * 1000)
    assert histogram.counts[0] == 2  # 0 and exactly 50 µs: le="0.00005"
    assert histogram.counts[1] == 2  # 51 and 100 µs
    assert histogram.counts[-2] == 1 and histogram.counts[-1] == 1  # 10 s; above every bound
    assert histogram.count == 6 and histogram.ns == (202 + 2 * LATENCY_BOUNDS_US[-1]) * 1000


def test_the_exposition_is_cumulative_with_sum_and_count() -> None:
    stats = ModelStatistics("m", 3)
    for us in (40, 300, 300, 20_000):
        times = StageTimes()
        times.total_ns = us * 1000
        times.queue_ns = 10_000
        stats.record_success(times, 0)
    text = render_metrics([(stats, 0)])
    buckets = dict(re.findall(r'^tensorgate_request_duration_seconds_bucket\{model="m",'
                              r'version="3",le="([^"]+)"\} (\d+)$', text, re.M))
    assert buckets["0.00005"] == "1" and buckets["0.00025"] == "1"
    assert buckets["0.0005"] == "3" and buckets["0.025"] == "4" and buckets["+Inf"] == "4"
    assert 'tensorgate_request_duration_seconds_count{model="m",version="3"} 4' in text
    assert 'tensorgate_request_duration_seconds_sum{model="m",version="3"} 0.020640000' in text
    assert 'tensorgate_queue_duration_seconds_bucket{model="m",version="3",le="0.00005"} 4' in text
    # no decoupled responses yet: no first-response histogram
    assert "tensorgate_first_response_duration_seconds" not in text
