"""Latency histograms: each duration lands in the first bucket whose bound holds it, and the
exposition is cumulative, as Prometheus' histogram_quantile reads it."""

from __future__ import annotations

import re

from tensorgate.metrics import LatencyMetrics, render_metrics
from tensorgate.pipeline.stats import (LATENCY_BOUNDS_US, Histogram, ModelCall, ModelStatistics,
                                       StageTimes)


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


def test_a_models_own_bounds_and_tags_are_in_its_rows() -> None:
    """model_metrics' bounds (ns) bucket that version's durations, written in the family's
    unit; metric_tags label every row of the version, histograms and counters alike."""
    tags = (("_team", 'se"arch'),)
    stats = ModelStatistics("m", 2, tags=tags, bounds={"request": (500, 1_000_000),
                                                       "first_response": (2_000_000,)})
    other = ModelStatistics("m", 3)  # another version: its own rows, the default buckets
    for ns in (400, 500, 501, 2_000_000):
        times = StageTimes()
        times.total_ns = ns
        stats.record_success(times, 10)
    stats.first_response_latency.add(1_500_000)
    stats.load_s = 1.25
    text = render_metrics([(stats, 0), (other, 0)],
                          latencies=LatencyMetrics(first_response_histogram=True))
    labels = 'model="m",version="2",_team="se\\"arch"'
    buckets = re.findall(rf'^tensorgate_request_duration_seconds_bucket\{{{re.escape(labels)},'
                         r'le="([^"]+)"\} (\d+)$', text, re.M)
    assert buckets == [("5e-07", "2"), ("0.001", "3"), ("+Inf", "4")]
    assert f"tensorgate_first_response_duration_seconds_bucket{{{labels},le=\"0.002\"}} 1" in text
    assert f"nv_inference_first_response_histogram_ms_bucket{{{labels},le=\"2\"}} 1" in text
    assert f"nv_inference_request_success{{{labels}}} 4" in text
    assert f"nv_model_load_duration_secs{{{labels}}} 1.250000000" in text
    assert f'nv_inference_request_failure{{{labels},reason="BACKEND"}} 0' in text
    # each version's copies are its own row: two versions served at once are two series
    assert f"tensorgate_copied_bytes_total{{{labels}}} 40" in text
    assert 'tensorgate_copied_bytes_total{model="m",version="3"} 0' in text
    default = re.findall(r'^tensorgate_queue_duration_seconds_bucket\{model="m",version="3",'
                         r'le="([^"]+)"\}', text, re.M)
    assert default == [*(f"{b / 1e6:.6f}".rstrip("0").rstrip(".") for b in LATENCY_BOUNDS_US),
                       "+Inf"]
    calls = [ModelCall("m", 2, "m_0", 0.0, 0, ())]
    text = render_metrics([(stats, 0)], calls=calls)
    assert f'tensorgate_model_call_seconds{{{labels},instance="m_0"}} 0' in text
