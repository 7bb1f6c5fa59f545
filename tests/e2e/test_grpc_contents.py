"""gRPC inputs sent in typed `contents` (what KServe's SDK and hand-written clients send),
through grpcio over a real socket: served exactly for every numeric datatype, in any form
protobuf accepts; malformed contents refused naming what is wrong, the server serving on; and
a message of 60 million one-byte varints (INT64, 480 MB decoded) served without protobuf
unpacking it first (7 s on the loop and +2.8 GB in-process before). A sequence's requests on
one stream keep their order while large contents decode in steps; FP32 contents arrive
aligned and are read in place, as raw tensors are."""

from __future__ import annotations

from collections.abc import Iterator

import grpc
import numpy as np
import pytest
import torch
from tritonclient.grpc import service_pb2 as pb

from tensorgate.protocol.protobuf_wire import varint_bytes
from tests.e2e.conftest import RunningServer, memory_bytes, start_server, stop_server
from tests.pipeline import repo_builder as rb
from tests.protocol.wire_bytes import field

ECHO = """
from tensorgate import Model


class Echo(Model):
    def forward(self, inputs):
        return {"Y": inputs["X"]}
"""

TALLY = """
import torch

from tensorgate import Model


class Tally(Model):
    \"\"\"How many values came, and their sum.\"\"\"

    def forward(self, inputs):
        values = inputs["X"]
        return {"N": torch.stack([torch.tensor(values.numel()), values.sum()])}
"""


class CountUp(torch.nn.Module):
    """Stateful: which request of its sequence this is, and how many values it sent."""

    def forward(self, x: torch.Tensor, start: torch.Tensor, ready: torch.Tensor,
                seen: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        seen = seen + ready.to(torch.int64)
        return seen, torch.full_like(seen, x.shape[1]), seen


COUNT_UP = """
name: "count_up"
platform: "pytorch_libtorch"
max_batch_size: 1
input [ { name: "X" data_type: TYPE_INT64 dims: [-1] } ]
output [ { name: "SEEN" data_type: TYPE_INT64 dims: [1] },
         { name: "SIZE" data_type: TYPE_INT64 dims: [1] } ]
sequence_batching {
  control_input [
    { name: "START" control [ { kind: CONTROL_SEQUENCE_START int32_false_true: [0, 1] } ] },
    { name: "READY" control [ { kind: CONTROL_SEQUENCE_READY int32_false_true: [0, 1] } ] }
  ]
  state [ { input_name: "SEEN_IN" output_name: "SEEN_OUT" data_type: TYPE_INT64 dims: [1] } ]
}
"""

# datatype → (config type, contents field, values to send)
RNG = np.random.default_rng(3)
CASES = {
    "BOOL": ("TYPE_BOOL", "bool_contents", RNG.integers(0, 2, 5000).astype(bool)),
    "INT8": ("TYPE_INT8", "int_contents", RNG.integers(-128, 128, 5000).astype(np.int8)),
    "INT32": ("TYPE_INT32", "int_contents",
              RNG.integers(-2**31, 2**31, 5000).astype(np.int32)),
    "INT64": ("TYPE_INT64", "int64_contents",
              RNG.integers(-2**63, 2**63 - 1, 5000, dtype=np.int64) >> RNG.integers(0, 63, 5000)),
    "UINT16": ("TYPE_UINT16", "uint_contents", RNG.integers(0, 2**16, 5000).astype(np.uint16)),
    "UINT64": ("TYPE_UINT64", "uint64_contents",
               RNG.integers(0, 2**64 - 1, 5000, dtype=np.uint64)),
    "FP32": ("TYPE_FP32", "fp32_contents", RNG.standard_normal(5000).astype(np.float32)),
    "FP64": ("TYPE_FP64", "fp64_contents", RNG.standard_normal(5000)),
}


def _model(root, name: str, config_type: str, source: str, output: str, out_type: str) -> None:
    folder = rb.write_config(root, name, f"""
        name: "{name}"
        backend: "python"
        max_batch_size: 0
        input [ {{ name: "X" data_type: {config_type} dims: [-1] }} ]
        output [ {{ name: "{output}" data_type: {out_type} dims: [-1] }} ]
        """)
    (folder / "1" / "model.py").write_text(source)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    root = tmp_path_factory.mktemp("grpc-contents")
    for name, (config_type, _, _) in CASES.items():
        _model(root / "models", f"echo_{name.lower()}", config_type, ECHO, "Y", config_type)
    _model(root / "models", "tally", "TYPE_INT64", TALLY, "N", "TYPE_INT64")
    folder = rb.write_config(root / "models", "count_up", COUNT_UP)
    torch.jit.script(CountUp().eval()).save(str(folder / "1" / "model.pt"))
    running = start_server(root / "models", root / "server.log",
                           "--model-control-mode", "explicit", "--load-model", "*")
    yield running
    assert stop_server(running) == 0, (root / "server.log").read_text()


def _call(server: RunningServer, message: bytes) -> pb.ModelInferResponse:
    """ModelInfer with these request bytes, as they are: grpcio frames them, no more."""
    options = [("grpc.max_send_message_length", -1), ("grpc.max_receive_message_length", -1)]
    with grpc.insecure_channel(server.grpc_url, options=options) as channel:
        infer = channel.unary_unary("/inference.GRPCInferenceService/ModelInfer",
                                    request_serializer=lambda data: data,
                                    response_deserializer=pb.ModelInferResponse.FromString)
        answer: pb.ModelInferResponse = infer(message, timeout=120)
        return answer


def _request(model: str, datatype: str, count: int) -> pb.ModelInferRequest:
    request = pb.ModelInferRequest(model_name=model)
    request.inputs.add(name="X", datatype=datatype, shape=[count])
    return request


def _still_serving(server: RunningServer) -> None:
    request = _request("echo_fp32", "FP32", 3)
    request.inputs[0].contents.fp32_contents.extend([1.5, 2.5, -3.0])
    answer = _call(server, request.SerializeToString())
    assert np.frombuffer(answer.raw_output_contents[0], "<f4").tolist() == [1.5, 2.5, -3.0]


@pytest.mark.parametrize("datatype", sorted(CASES))
@pytest.mark.parametrize("count", [3, 5000])
def test_typed_contents_are_served_exactly(server: RunningServer, datatype: str,
                                           count: int) -> None:
    """3 elements (parsed by protobuf with the request) and 5,000 (taken out and read from
    the wire): the model gets the values sent, bit for bit."""
    _, field, values = CASES[datatype]
    values = values[:count]
    request = _request(f"echo_{datatype.lower()}", datatype, count)
    getattr(request.inputs[0].contents, field).extend(values.tolist())
    answer = _call(server, request.SerializeToString())
    assert answer.outputs[0].datatype == datatype and list(answer.outputs[0].shape) == [count]
    assert answer.raw_output_contents[0] == values.astype(values.dtype.newbyteorder("<")).tobytes()


def test_contents_in_two_runs_and_unpacked_elements_are_read_as_protobuf_reads_them(
        server: RunningServer) -> None:
    """int64_contents in two packed runs, then three elements unpacked; an unknown field."""
    item = pb.ModelInferRequest.InferInputTensor(name="X", datatype="INT64", shape=[1205])
    item.parameters["pad"].string_param = "p" * 2000
    runs = (field(3, b"".join(varint_bytes(v) for v in range(600)))
            + field(9, b"unknown") + field(3, b"".join(varint_bytes(v) for v in range(600, 1202)))
            + b"".join(bytes([3 << 3]) + varint_bytes(v) for v in (7, 8, 9)))
    message = (pb.ModelInferRequest(model_name="tally").SerializeToString()
               + field(5, item.SerializeToString() + field(5, runs)))
    answer = _call(server, message)
    assert np.frombuffer(answer.raw_output_contents[0], "<i8").tolist() == [
        1205, sum(range(1202)) + 7 + 8 + 9]


@pytest.mark.parametrize("contents, error", [
    (field(3, varint_bytes(1) + b"\x80"), "InferTensorContents is malformed: its last varint runs "
                                      "past the end of its field"),
    (field(3, b"\x01\x02"), "input 'X': contents has 2 elements; shape [3] needs 3"),
    (field(3, b"\x01\x02\x03\x04"), "input 'X': contents has 4 elements; shape [3] needs 3"),
])
def test_malformed_contents_are_refused_and_the_server_serves_on(
        server: RunningServer, contents: bytes, error: str) -> None:
    item = pb.ModelInferRequest.InferInputTensor(name="X", datatype="INT64", shape=[3])
    item.parameters["pad"].string_param = "p" * 2000
    message = (pb.ModelInferRequest(model_name="tally").SerializeToString()
               + field(5, item.SerializeToString() + field(5, contents)))
    with pytest.raises(grpc.RpcError) as raised:
        _call(server, message)
    assert raised.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert raised.value.details() == error
    _still_serving(server)


def test_sixty_million_varints_are_decoded_without_protobufs_copy(
        server: RunningServer) -> None:
    """60 MB of one-byte INT64 varints, under the default 64 MiB limit: 480 MB as a tensor.
    Parsed by protobuf (8 bytes a varint), serialized again and decoded, the same request
    grew the process by 2.8 GB in-process; now by the tensor and a few pieces."""
    count = 60_000_000
    item = pb.ModelInferRequest.InferInputTensor(name="X", datatype="INT64", shape=[count])
    message = (pb.ModelInferRequest(model_name="tally").SerializeToString()
               + field(5, item.SerializeToString() + field(5, field(3, bytes([1]) * count))))
    peak = memory_bytes("VmHWM", server.process.pid)
    answer = _call(server, message)
    assert np.frombuffer(answer.raw_output_contents[0], "<i8").tolist() == [count, count]
    assert memory_bytes("VmHWM", server.process.pid) - peak < 1200 << 20
    _still_serving(server)


def test_a_sequence_s_requests_on_a_stream_run_in_order_whatever_their_contents(
        server: RunningServer) -> None:
    """A stream's requests run side by side; large typed contents are decoded a piece at a
    time, the loop serving others between pieces. A sequence's next request must not pass
    one still decoding: its first (30 million varints) and second (one) both run, in order."""
    def step(values: bytes, count: int, **flags: bool) -> bytes:
        item = pb.ModelInferRequest.InferInputTensor(name="X", datatype="INT64",
                                                     shape=[1, count])
        item.parameters["pad"].string_param = "p" * 2000  # taken out even when short
        request = pb.ModelInferRequest(model_name="count_up")
        request.parameters["sequence_id"].int64_param = 77
        for flag, on in flags.items():
            request.parameters[flag].bool_param = on
        return request.SerializeToString() + field(5, item.SerializeToString()
                                                    + field(5, field(3, values)))

    requests = [step(bytes([1]) * 30_000_000, 30_000_000, sequence_start=True),
                step(bytes([1]), 1, sequence_end=True)]
    assert _count_up_on_a_stream(server, requests) == [(1, 30_000_000), (2, 1)]


def _count_up_on_a_stream(server: RunningServer, requests: list[bytes],
                          compression: grpc.Compression | None = None
                          ) -> list[tuple[int, int]]:
    """Each answer of count_up to `requests` sent on one stream, as (which request of its
    sequence it was, how many values it sent), sorted; every answer without an error."""
    with grpc.insecure_channel(server.grpc_url) as channel:
        call = channel.stream_stream("/inference.GRPCInferenceService/ModelStreamInfer",
                                     request_serializer=lambda data: data,
                                     response_deserializer=pb.ModelStreamInferResponse.FromString)
        answers = list(call(iter(requests), timeout=60, compression=compression))
    assert [a.error_message for a in answers] == [""] * len(requests)
    return sorted((int(np.frombuffer(a.infer_response.raw_output_contents[0], "<i8")[0]),
                   int(np.frombuffer(a.infer_response.raw_output_contents[1], "<i8")[0]))
                  for a in answers)


def test_a_sequence_s_compressed_requests_on_a_stream_run_in_order(
        server: RunningServer) -> None:
    """Compressed messages are decompressed a piece at a time too: a sequence's request
    keeps the place it took as it arrived, so its next (small, decompressed at once) does
    not pass it. Both in gzip: the first 30 million raw zero bytes (INT64, 3.75 million
    values), the second one value."""
    def step(values: np.ndarray, **flags: bool) -> bytes:
        request = pb.ModelInferRequest(model_name="count_up")
        request.inputs.add(name="X", datatype="INT64", shape=[1, values.size])
        request.raw_input_contents.append(values.astype("<i8").tobytes())
        request.parameters["sequence_id"].int64_param = 78
        for flag, on in flags.items():
            request.parameters[flag].bool_param = on
        return request.SerializeToString()

    requests = [step(np.zeros(3_750_000, np.int64), sequence_start=True),
                step(np.ones(1, np.int64), sequence_end=True)]
    assert _count_up_on_a_stream(server, requests, grpc.Compression.Gzip) == [
        (1, 3_750_000), (2, 1)]


def test_a_sequence_s_request_of_many_fields_keeps_its_place_on_a_stream(
        server: RunningServer) -> None:
    """A message of many fields is split a step of fields at a time (65,000 held the loop
    for 155 ms); the sequence's request after it, split at once, must not pass it. The first
    carries 6,000 parameters (24,000 parts: a few dozen steps), both answered in order."""
    def step(count: int, padding: int, **flags: bool) -> bytes:
        request = pb.ModelInferRequest(model_name="count_up")
        request.inputs.add(name="X", datatype="INT64", shape=[1, count])
        request.raw_input_contents.append(np.ones(count, "<i8").tobytes())
        request.parameters["sequence_id"].int64_param = 79
        for flag, on in flags.items():
            request.parameters[flag].bool_param = on
        for k in range(padding):
            request.parameters[f"pad{k}"].int64_param = k
        return request.SerializeToString()

    requests = [step(3, 6000, sequence_start=True), step(1, 0, sequence_end=True)]
    assert _count_up_on_a_stream(server, requests) == [(1, 3), (2, 1)]


def test_fp32_contents_are_received_like_raw_tensors_without_a_copy(
        server: RunningServer) -> None:
    """The receiver places the message so that the packed floats start 64-byte aligned, as
    it does a raw tensor: the model reads them where they arrived. The server's reported
    copies are those of a raw request (what HTTP/2 framing makes it copy), not the tensor's
    602,112 bytes more (an unaligned view had to be copied). The two messages differ by a
    few bytes, and where frames fall with them: what is copied of them differs a little."""
    values = np.random.default_rng(0).standard_normal(150_528).astype(np.float32)
    copied = {}
    for contents in (False, True):
        request = _request("echo_fp32", "FP32", values.size)
        request.parameters["tensorgate_report_copies"].bool_param = True
        if contents:
            request.inputs[0].contents.fp32_contents.extend(values.tolist())
        else:
            request.raw_input_contents.append(values.tobytes())
        answer = _call(server, request.SerializeToString())
        assert answer.raw_output_contents[0] == values.tobytes()
        copied[contents] = answer.parameters["tensorgate_copied_bytes"].int64_param
    assert copied[True] <= copied[False] + 4096 and copied[True] < values.nbytes // 4
