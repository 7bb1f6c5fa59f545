"""The tracer on its own: which requests it samples, how traces are written (a file per
log_frequency traces, or one JSON array appended to), the bound on traces waiting to be
written, and the settings as the config and the command line take them."""

from __future__ import annotations

import asyncio
import json
import pathlib

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tensorgate import tracing
from tensorgate.cli_triton import trace_settings
from tensorgate.config import ServerConfig
from tensorgate.errors import InvalidArgumentError
from tensorgate.tensor.copies import CopyLedger
from tensorgate.tensor.view import TensorView
from tensorgate.trace_settings import SETTINGS
from tensorgate.tracing import Tracer


def _run(tracer: Tracer, model: str, requests: int) -> list[int]:
    """Offer `requests` requests to the tracer; the ids of those it traced, finished."""
    taken = []
    for _ in range(requests):
        trace = tracer.sample(model)
        if trace is not None:
            trace.stamp("REQUEST_START")
            trace.finish()
            taken.append(trace.id)
    return taken


def _read(path: pathlib.Path) -> list[dict]:
    return json.loads(path.read_text())


def test_off_by_default_and_nothing_is_sampled() -> None:
    tracer = Tracer()
    assert not tracer.on
    assert _run(tracer, "m", 5) == []
    with pytest.raises(InvalidArgumentError, match="tracing needs a file to write, and the "
                                                   "server has none"):
        tracer.update({"trace_level": ["TIMESTAMPS"]})
    assert not tracer.on


def test_one_in_rate_while_count_lasts(tmp_path: pathlib.Path) -> None:
    tracer = Tracer(tmp_path / "t.json", ["TIMESTAMPS"], rate=3, count=2)
    assert tracer.on
    assert _run(tracer, "m", 20) == [1, 2]  # the 3rd and 6th requests; then count is spent
    assert tracer.current()["trace_count"] == "0"
    tracer.update({"trace_count": "1", "trace_rate": "1"})
    assert _run(tracer, "m", 3) == [3]


def test_a_model_with_settings_of_its_own_is_sampled_on_its_own(tmp_path: pathlib.Path) -> None:
    tracer = Tracer(tmp_path / "t.json")
    tracer.update({"trace_level": ["TIMESTAMPS"], "trace_rate": "1"}, model="a")
    assert tracer.on
    assert len(_run(tracer, "a", 4)) == 4
    assert _run(tracer, "b", 4) == []  # the global setting is off
    tracer.update({"trace_level": None, "trace_rate": None}, model="a")
    assert not tracer.on
    assert tracer.current("a") == tracer.current()


def test_a_models_count_left_survives_a_change_of_its_other_settings(
        tmp_path: pathlib.Path) -> None:
    tracer = Tracer(tmp_path / "t.json")
    tracer.update({"trace_level": ["TIMESTAMPS"], "trace_rate": "1", "trace_count": "3"}, "a")
    assert len(_run(tracer, "a", 1)) == 1
    assert tracer.update({"trace_rate": "2"}, "a")["trace_count"] == "2"
    assert tracer.update({"trace_count": None}, "a")["trace_count"] == "-1"  # the global one
    assert tracer.update({"trace_count": "5"}, "a")["trace_count"] == "5"


def test_log_frequency_writes_a_file_each_n_traces(tmp_path: pathlib.Path) -> None:
    file = tmp_path / "t.json"
    tracer = Tracer(file, ["TIMESTAMPS"], rate=1, log_frequency=2)
    _run(tracer, "m", 5)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["t.json.0", "t.json.1"]
    assert [e["id"] for e in _read(tmp_path / "t.json.1") if "model_name" in e] == [3, 4]
    asyncio.run(tracer.close())  # the fifth, at shutdown
    assert [e["id"] for e in _read(tmp_path / "t.json.2") if "model_name" in e] == [5]


def test_log_frequency_zero_appends_to_one_json_array(tmp_path: pathlib.Path) -> None:
    file = tmp_path / "t.json"
    file.write_text("left by an earlier run")

    async def serve() -> None:  # writes go through the loop's executor, as in the server
        _run(tracer, "m", tracing.APPEND_EVERY * 2 + 5)
        await asyncio.sleep(0)
        await tracer.close()

    tracer = Tracer(file, ["TIMESTAMPS"], rate=1)
    asyncio.run(serve())
    heads = [e["id"] for e in _read(file) if "model_name" in e]
    assert heads == list(range(1, tracing.APPEND_EVERY * 2 + 6))


def test_traces_waiting_to_be_written_are_bounded(tmp_path: pathlib.Path,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(tracing, "MAX_HELD", 3)
    tracer = Tracer(tmp_path / "t.json", ["TIMESTAMPS"], rate=1)
    held = [tracer.sample("m") for _ in range(5)]  # none finished: all still to be written
    assert [t is not None for t in held] == [True, True, True, False, False]
    assert tracer.dropped == 2
    for trace in held[:3]:
        assert trace is not None
        trace.finish()
    asyncio.run(tracer.close())
    assert tracer.sample("m") is not None  # written: room again


def test_a_trace_as_triton_writes_it(tmp_path: pathlib.Path) -> None:
    tracer = Tracer(tmp_path / "t.json", ["TIMESTAMPS", "TENSORS"], rate=1)
    trace = tracer.sample("ens")
    assert trace is not None
    ledger = CopyLedger()
    trace.begin("ens", 2, "req-7", {"TEXT": TensorView.from_array(
        np.array([b"a", "b\u00e9".encode()], dtype=object), name="TEXT")}, ledger)
    trace.stamp("QUEUE_START", 1)  # earlier than REQUEST_START: written in time order
    step = trace.child("step")
    step.begin("step", 1, "", {"X": TensorView.from_array(np.arange(4, dtype=np.int32)
                                                          .reshape(2, 2), name="X")}, ledger)
    assert ledger.bytes > 0  # the tensors kept are copies, counted
    records = trace.records()
    assert records[0] == {"id": 1, "model_name": "ens", "model_version": 2,
                          "request_id": "req-7"}
    assert [s["name"] for s in records[1]["timestamps"]] == ["QUEUE_START", "REQUEST_START"]
    assert records[2] == {"id": 1, "activity": "TENSOR_QUEUE_INPUT",
                          "tensor": {"name": "TEXT", "data": "a,b\u00e9", "shape": "2",
                                     "dtype": "BYTES"}}
    assert step.records()[0]["parent_id"] == 1
    assert step.records()[2]["tensor"]["data"] == "0,1,2,3"


def test_server_config_checks_trace_settings(tmp_path: pathlib.Path) -> None:
    config = ServerConfig(trace_file=tmp_path / "t.json", trace_level=("timestamps",))
    assert config.trace_level == ("TIMESTAMPS",)
    assert ServerConfig(trace_level=("OFF",)).trace_level == ()
    with pytest.raises(ValueError, match="^trace_level needs trace_file"):
        ServerConfig(trace_level=("TIMESTAMPS",))
    with pytest.raises(ValueError, match="^trace_level 'ALL' is not one of TIMESTAMPS, "
                                         "TENSORS"):
        ServerConfig(trace_file=tmp_path / "t.json", trace_level=("ALL",))
    with pytest.raises(ValueError, match="^trace_log_frequency must be 0 or more, got -1$"):
        ServerConfig(trace_log_frequency=-1)


def test_trace_config_arguments_as_tritons() -> None:
    assert trace_settings(["level=TIMESTAMPS", "level=TENSORS", "rate=100", "count=5",
                           "mode=triton", "triton,file=/tmp/t.json",
                           "triton,log-frequency=50"]) == {
        "trace_level": "TIMESTAMPS,TENSORS", "trace_rate": "100", "trace_count": "5",
        "trace_mode": "triton", "trace_file": "/tmp/t.json", "trace_log_frequency": "50"}
    assert trace_settings(["mode=opentelemetry", "opentelemetry,url=collector:4318/v1/traces",
                           "opentelemetry,resource=service.name=a",
                           "opentelemetry,resource=deployment=b,c",
                           "opentelemetry,bsp_max_queue_size=10",
                           "opentelemetry,bsp_schedule_delay=20",
                           "opentelemetry,bsp_max_export_batch_size=5"]) == {
        "trace_mode": "opentelemetry", "trace_otel_url": "collector:4318/v1/traces",
        "trace_otel_resource": ("service.name=a", "deployment=b,c"),
        "trace_bsp_max_queue_size": "10", "trace_bsp_schedule_delay_ms": "20",
        "trace_bsp_max_export_batch_size": "5"}
    with pytest.raises(ValueError, match="unknown setting 'speed'; global settings are: "
                                         "level, rate, count, mode"):
        trace_settings(["speed=1"])
    with pytest.raises(ValueError, match="unknown setting 'file'; opentelemetry settings "
                                         "are: url, resource"):
        trace_settings(["opentelemetry,file=/tmp/t.json"])
    with pytest.raises(ValueError, match="unknown mode 'jaeger'; modes are triton, "
                                         "opentelemetry"):
        trace_settings(["jaeger,url=x"])
    with pytest.raises(ValueError, match="is not \\[MODE,\\]SETTING=VALUE"):
        trace_settings(["TIMESTAMPS"])


_VALUES = st.one_of(st.none(), st.booleans(), st.integers(-5, 5), st.floats(),
                    st.text(max_size=8), st.lists(st.text(max_size=12), max_size=3),
                    st.dictionaries(st.text(max_size=3), st.integers(), max_size=2))


@settings(max_examples=300, deadline=None)
@given(changes=st.dictionaries(st.sampled_from([*SETTINGS, "trace_mode", ""]),
                               _VALUES, max_size=4),
       model=st.sampled_from([None, "m"]))
def test_any_change_is_made_or_refused_by_name(changes: dict, model: str | None) -> None:
    tracer = Tracer("/nonexistent/t.json")
    before = (tracer.current(), tracer.current("m"))
    try:
        after = tracer.update(changes, model)
    except InvalidArgumentError as error:
        assert "trace" in error.message or "setting" in error.message
        assert (tracer.current(), tracer.current("m")) == before  # all or nothing
        return
    assert after == tracer.current(model)
    assert int(after["trace_rate"]) >= 1 and int(after["trace_count"]) >= -1
    assert tracer.on == any(s["trace_level"] != ["OFF"] and s["trace_count"] != "0"
                            for s in (tracer.current(), tracer.current("m")))


def test_tensors_held_for_writing_are_bounded_in_bytes(tmp_path: pathlib.Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(tracing, "MAX_HELD_BYTES", 1000)
    tracer = Tracer(tmp_path / "t.json", ["TENSORS"], rate=1)
    view = {"X": TensorView.from_array(np.zeros(200, np.float32), name="X")}  # 800 bytes
    for expected in (True, True, False):
        trace = tracer.sample("m")
        assert (trace is not None) == expected
        if trace is not None:
            trace.begin("m", 1, "", view, CopyLedger())
            trace.finish()  # held: log_frequency 0 writes every APPEND_EVERY traces
    assert tracer.dropped == 1


def test_shutdown_stops_waiting_for_traces_and_says_so(tmp_path: pathlib.Path,
                                                       caplog: pytest.LogCaptureFixture) -> None:
    file = tmp_path / "t.json"
    tracer = Tracer(file, ["TENSORS"], rate=1)
    view = {"X": TensorView.from_array(np.arange(100_000, dtype=np.float32), name="X")}

    async def serve() -> None:
        for _ in range(100):  # ~20 ms each to write as text: 2 s in all
            trace = tracer.sample("m")
            assert trace is not None
            trace.begin("m", 1, "", view, CopyLedger())
            trace.finish()
        await tracer.close(timeout_s=0.05)

    asyncio.run(serve())
    assert "traces were not written: shutdown waits at most 0.05 s" in caplog.text
    written = [e for e in _read(file) if "model_name" in e] if file.exists() else []
    assert len(written) < 100
