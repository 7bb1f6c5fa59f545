"""Latency summaries: the value at each quantile is the true nearest-rank value to within
half a bucket (under 0.4 %), over a window of the last 60 s; counts and sums are all-time."""

from __future__ import annotations

import math
import re

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tensorgate.metrics import LatencyMetrics, render_metrics
from tensorgate.pipeline.stats import SUMMARY_STAGES, ModelStatistics, StageTimes
from tensorgate.pipeline.summary import LatencySummaries, parse_quantiles

QUANTILES = (0.5, 0.9, 0.95, 0.99, 0.999)


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def _nearest_rank(values_us: list[int], quantile: float) -> int:
    ordered = sorted(values_us)
    return ordered[max(1, math.ceil(quantile * len(ordered) - 1e-9)) - 1]


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(0, 30_000_000), min_size=1, max_size=400),
       st.sampled_from(QUANTILES + (0.01, 0.25, 0.75)))
def test_each_quantile_is_the_nearest_rank_within_half_a_bucket(values_us: list[int],
                                                                 quantile: float) -> None:
    summaries = LatencySummaries(["request"], clock=Clock())
    for us in values_us:
        summaries.observe(us * 1000 + 999)  # ns within the µs: counted as that µs
    [value], count, total = summaries.read("request", [quantile])
    truth = _nearest_rank(values_us, quantile)
    assert abs(value - truth) <= max(0.004 * truth, 0) + 1e-9, (value, truth)
    if truth < 256:
        assert value == truth  # small durations are their own bucket
    assert (count, total) == (len(values_us), sum(values_us))


def test_a_long_tailed_distribution_reads_as_numpy_says() -> None:
    rng = np.random.default_rng(7)
    values_us = [int(v) for v in rng.lognormal(7, 1, 50_000)]
    summaries = LatencySummaries(["request"], clock=Clock())
    for us in values_us:
        summaries.observe(us * 1000)
    got, _, _ = summaries.read("request", QUANTILES)
    for quantile, value in zip(QUANTILES, got):
        truth = _nearest_rank(values_us, quantile)
        assert value == pytest.approx(truth, rel=0.004), quantile


def test_the_window_forgets_what_aged_past_60_s_but_not_the_count_and_sum() -> None:
    clock = Clock()
    summaries = LatencySummaries(["request", "queue"], clock=clock)
    for _ in range(10):
        summaries.observe(250_000, 7_000)  # 250 µs, in a queue for 7 µs
    clock.now += 30
    summaries.observe(100_000)  # 100 µs, a request that never queued (a failure)
    [median], count, total = summaries.read("request", [0.5])
    assert (median, count, total) == (250.0, 11, 2_600)
    assert summaries.read("queue", [0.5]) == ([7.0], 10, 70)
    clock.now += 31  # the first ten are 61 s old, the last 31 s
    [median], count, _ = summaries.read("request", [0.5])
    assert median == 100.0 and count == 11
    assert math.isnan(summaries.read("queue", [0.5])[0][0])  # nothing queued in the window
    clock.now += 1_000  # idle far past the window: empty, and it takes new ones again
    assert math.isnan(summaries.read("request", [0.5])[0][0])
    summaries.observe(2_000_000)
    assert summaries.read("request", [0.99])[0] == [pytest.approx(2000, rel=0.004)]


def test_summary_quantiles_are_tritons_form() -> None:
    assert parse_quantiles("0.99:0.001, 0.5:0.05") == (0.5, 0.99)
    for bad in ("0.5", "0.5:0", "1:0.01", "x:0.1", ""):
        with pytest.raises(ValueError, match=r"^summary_quantiles '"):
            parse_quantiles(bad)


def _served(stats: ModelStatistics, us: int) -> None:
    times = StageTimes()
    times.total_ns, times.queue_ns, times.input_ns = us * 1000, 10_000, 20_000
    times.infer_ns, times.output_ns = (us - 40) * 1000, 5_000
    stats.record_success(times, 0)


def test_the_exposition_has_tritons_summary_rows_and_counters_can_be_left_out() -> None:
    stats = ModelStatistics("m", 2, summaries=True)
    for us in (100, 150, 200, 250):
        _served(stats, us)
    stats.record_failure(50_000, "BACKEND")
    text = render_metrics([(stats, 0)], latencies=LatencyMetrics(
        counters=False, summary_quantiles=(0.5, 0.99)))
    assert "# TYPE nv_inference_request_summary_us summary" in text
    assert 'nv_inference_request_summary_us_count{model="m",version="2"} 5' in text
    assert 'nv_inference_request_summary_us_sum{model="m",version="2"} 750' in text
    # five requests, 50..250 µs: the median is the third, P99 the fifth
    assert 'nv_inference_request_summary_us{model="m",version="2",quantile="0.5"} 150' in text
    assert 'nv_inference_request_summary_us{model="m",version="2",quantile="0.99"} 250' in text
    assert 'nv_inference_queue_summary_us_count{model="m",version="2"} 4' in text
    assert 'nv_inference_compute_infer_summary_us{model="m",version="2",quantile="0.5"} 110' in text
    for stage in SUMMARY_STAGES:
        assert f"# TYPE nv_inference_{stage}_summary_us summary" in text
    assert "_duration_us" not in text  # counter_latencies=false
    assert "nv_inference_request_success" in text
    # the default writes the counters and no summary
    default = render_metrics([(stats, 0)])
    assert "nv_inference_request_duration_us" in default and "_summary_us" not in default


def test_a_version_without_summaries_writes_none_and_histogram_in_ms_is_opt_in() -> None:
    stats = ModelStatistics("m", 1)
    _served(stats, 300)
    stats.first_response_latency.add(1_500_000)  # 1.5 ms
    text = render_metrics([(stats, 0)], latencies=LatencyMetrics(
        summary_quantiles=(0.5,), first_response_histogram=True))
    assert "_summary_us" not in text
    buckets = dict(re.findall(r'^nv_inference_first_response_histogram_ms_bucket\{model="m",'
                              r'version="1",le="([^"]+)"\} (\d+)$', text, re.M))
    assert buckets["1"] == "0" and buckets["1.5"] == "1" and buckets["+Inf"] == "1"
    assert 'nv_inference_first_response_histogram_ms_sum{model="m",version="1"} 1.5' in text
    assert "nv_inference_first_response_histogram_ms" not in render_metrics([(stats, 0)])
