"""Triton's `metric_tags` and `model_metrics` in config.pbtxt: taken as labels and bucket
bounds, or refused naming what is wrong (repository/metrics_config.py)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from tritonclient.grpc import model_config_pb2 as pb

from tensorgate.repository.metrics_config import MAX_BUCKETS, MAX_METRIC_TAGS
from tensorgate.repository.model_config import ModelConfigError, parse_model_config


def _control(family: str, buckets: str) -> str:
    return (f'model_metrics {{ metric_control [ {{ metric_identifier {{ family: "{family}" }} '
            f'histogram_options {{ buckets: {buckets} }} }} ] }}')


def test_tags_are_labels_with_an_underscore_sorted_by_key() -> None:
    spec = parse_model_config('name: "m" metric_tags { key: "team" value: "search" } '
                              'metric_tags { key: "Tier2" value: "a \\"b\\"\\n" }')
    assert spec.metric_tags == (("_Tier2", 'a "b"\n'), ("_team", "search"))
    assert spec.ignored == ()  # acted on: not among the fields served without


@pytest.mark.parametrize("key", ["", "_team", "team-a", "é", "a b", "x" * 129])
def test_a_tag_key_that_cannot_make_a_label_is_refused(key: str) -> None:
    config = pb.ModelConfig(name="m")
    config.metric_tags[key] = "v"
    with pytest.raises(ModelConfigError, match=f"metric_tags key {key!r} cannot name a label"):
        parse_model_config(str(config))


def test_tags_and_their_values_are_bounded() -> None:
    config = pb.ModelConfig(name="m")
    for index in range(MAX_METRIC_TAGS + 1):
        config.metric_tags[f"k{index}"] = "v"
    with pytest.raises(ModelConfigError, match=f"has {MAX_METRIC_TAGS + 1} tags; at most"):
        parse_model_config(str(config))
    config = pb.ModelConfig(name="m")
    config.metric_tags["k"] = "v" * 257
    with pytest.raises(ModelConfigError, match="value of 'k' has 257 characters; at most 256"):
        parse_model_config(str(config))


def test_buckets_are_kept_in_ns_for_the_histogram_the_family_names() -> None:
    spec = parse_model_config('name: "m" ' + _control("tensorgate_request_duration_seconds",
                                                      "[0.0005, 0.001, 2.5]"))
    assert spec.histogram_bounds == (("request", (500_000, 1_000_000, 2_500_000_000)),)
    spec = parse_model_config('name: "m" ' + _control("nv_inference_first_response_histogram_ms",
                                                      "[0, 1, 100]"))
    assert spec.histogram_bounds == (("first_response", (0, 1_000_000, 100_000_000)),)
    assert spec.ignored == ()


def test_the_same_histogram_in_ms_and_in_s_must_agree() -> None:
    def both(seconds: str) -> str:
        return ('name: "m" model_metrics { metric_control [ '
                '{ metric_identifier { family: "nv_inference_first_response_histogram_ms" } '
                '  histogram_options { buckets: [1, 10] } }, '
                '{ metric_identifier { family: "tensorgate_first_response_duration_seconds" } '
                f'  histogram_options {{ buckets: {seconds} }} }} ] }}')

    spec = parse_model_config(both("[0.001, 0.01]"))
    assert spec.histogram_bounds == (("first_response", (1_000_000, 10_000_000)),)
    with pytest.raises(ModelConfigError, match=r"metric_control\[1\] sets tensorgate_first_"
                                               r"response_duration_seconds's buckets, and "
                                               r"nv_inference_first_response_histogram_ms set "
                                               r"other buckets for the same histogram"):
        parse_model_config(both("[0.001, 0.02]"))


def test_a_family_the_server_does_not_write_is_served_without_and_said() -> None:
    spec = parse_model_config('name: "m" ' + _control("nv_inference_queue_duration_histogram_us",
                                                      "[100, 1000]"))
    assert spec.histogram_bounds == ()
    assert spec.ignored == ("model_metrics.metric_control[0] (family "
                            "'nv_inference_queue_duration_histogram_us' is not one this "
                            "server writes)",)


@pytest.mark.parametrize("buckets, message", [
    ("[]", r"gives no histogram_options.buckets"),
    ("[1, 1]", r"must increase, each by 1 ns or more; 1.0 follows 1"),
    ("[2, 1]", r"must increase, each by 1 ns or more; 1.0 follows 2"),
    ("[0.0000000001, 0.0000000002]", r"must increase, each by 1 ns or more"),
    ("[-1]", r"bucket bound -1.0 is not a duration"),
    ("[inf]", r"bucket bound inf is not a duration"),
    ("[nan]", r"bucket bound nan is not a duration"),
    ("[1e300]", r"bucket bound 1e\+300 is not a duration \(a number from 0 to 2\^63 ns"),
    (f"[{', '.join(str(n) for n in range(1, MAX_BUCKETS + 2))}]",
     f"gives {MAX_BUCKETS + 1} buckets; at most {MAX_BUCKETS}"),
])
def test_bad_buckets_are_refused_by_name(buckets: str, message: str) -> None:
    with pytest.raises(ModelConfigError, match=r"model_metrics.metric_control\[0\] "
                                               r"\(tensorgate_queue_duration_seconds\)(: )?.*"
                                               + message):
        parse_model_config('name: "m" ' + _control("tensorgate_queue_duration_seconds",
                                                   buckets))


def test_a_control_without_histogram_options_is_refused() -> None:
    with pytest.raises(ModelConfigError, match="gives no histogram_options.buckets"):
        parse_model_config('name: "m" model_metrics { metric_control [ { metric_identifier '
                           '{ family: "tensorgate_queue_duration_seconds" } } ] }')


_FAMILIES = st.sampled_from(["nv_inference_first_response_histogram_ms",
                             "tensorgate_request_duration_seconds",
                             "tensorgate_first_response_duration_seconds", "other", ""])


@settings(max_examples=300, deadline=None)
@given(tags=st.dictionaries(st.text(max_size=8), st.text(max_size=8), max_size=4),
       controls=st.lists(st.tuples(_FAMILIES, st.lists(st.floats(), max_size=5)), max_size=3))
def test_any_tags_and_buckets_are_taken_or_refused_by_name(
        tags: dict[str, str], controls: list[tuple[str, list[float]]]) -> None:
    """Whatever a config (or a client's load `config`) gives, the spec holds labels that
    Prometheus can read and ascending bounds, or the load fails with a config error."""
    config = pb.ModelConfig(name="m")
    for key, value in tags.items():
        config.metric_tags[key] = value
    for family, buckets in controls:
        control = config.model_metrics.metric_control.add()
        control.metric_identifier.family = family
        control.histogram_options.buckets.extend(buckets)
    try:
        spec = parse_model_config(str(config))
    except ModelConfigError:
        return
    for label, _ in spec.metric_tags:
        assert label.startswith("_") and not label.startswith("__")
        assert label[1:].replace("_", "").isalnum() and label.isascii()
    for _, bounds in spec.histogram_bounds:
        assert bounds and all(a < b for a, b in zip(bounds, bounds[1:])) and bounds[0] >= 0
