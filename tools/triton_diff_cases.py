"""The requests tools/triton_diff.py sends to Triton and to tensorgate: each case a name
(KNOWN in triton_diff.py names the deliberate differences by it) and a request. Mostly
literal data; cases run in the order given, and some go on from the ones before them
(sequences, model control), as their comments say."""

from __future__ import annotations

import copy
import gzip
import json
import pathlib
import struct
import zlib
from dataclasses import dataclass, field
from typing import Any


@dataclass
class Http:
    name: str
    method: str
    path: str
    body: bytes = b""
    headers: dict[str, str] = field(default_factory=dict)
    keys_only: bool = False  # compare the answer's structure, not its values (timings...)
    probe: bool = False  # compare the report in the probe model's OUT, not the answer


@dataclass
class Grpc:
    name: str
    method: str
    message: Any
    keys_only: bool = False
    probe: bool = False  # compare the report in the probe model's OUT, not the answer


@dataclass
class Stream:
    """Requests sent one after another on one ModelStreamInfer stream: (request id, model,
    IN value (an INT32, or BYTES for a str), ask for an empty final response)."""
    name: str
    requests: list[tuple[str, str, int | str, bool]]


@dataclass
class Frames:
    """HTTP/2 frames (type, flags, stream, payload) sent on a new gRPC connection after its
    preface and an empty SETTINGS, nothing read meanwhile."""
    name: str
    frames: list[tuple[int, int, int, bytes]]


@dataclass
class Packed:
    """A gRPC call sent raw with this grpc-accept-encoding (None: none), to servers started
    with --grpc-infer-response-compression-level `level`; what comes back is the encoding
    its answer names and whether its message is flagged compressed and inflates whole."""
    name: str
    level: str
    method: str
    message: bytes
    accept: str | None


# -- the corpus ------------------------------------------------------------------------------

F4 = [1.0, 2.0, 3.0, 4.0]
ADD: dict[str, Any] = {
    "inputs": [{"name": n, "shape": [1, 4], "datatype": "FP32", "data": F4}
               for n in ("INPUT0", "INPUT1")],
    "outputs": [{"name": "OUTPUT0"}, {"name": "OUTPUT1"}]}
INFER = "/v2/models/add_sub/infer"


def _js(value: Any) -> bytes:
    return json.dumps(value).encode()


def _add(**changes: Any) -> bytes:
    document = copy.deepcopy(ADD)
    for key, value in changes.items():
        if value is None:
            document.pop(key, None)
        else:
            document[key] = value
    return _js(document)


def _first(**changes: Any) -> bytes:
    document = copy.deepcopy(ADD)
    for key, value in changes.items():
        if value is None:
            document["inputs"][0].pop(key)
        else:
            document["inputs"][0][key] = value
    return _js(document)


def _binary(sizes: tuple[Any, Any] = (16, 16), data: bytes | None = None,
            header_length: str | None = None) -> tuple[bytes, dict[str, str]]:
    header = _js({"inputs": [{"name": n, "shape": [1, 4], "datatype": "FP32",
                              "parameters": {"binary_data_size": s}}
                             for n, s in zip(("INPUT0", "INPUT1"), sizes)]})
    tensors = data if data is not None else struct.pack("<8f", *F4, *F4)
    return header + tensors, {"Inference-Header-Content-Length":
                              header_length or str(len(header))}


def _binary_one(datatype: str, shape: list[int], data: bytes) -> tuple[bytes, dict[str, str]]:
    """An echo model's request with its input as binary data, its output asked as JSON."""
    header = _js({"inputs": [{"name": "IN", "shape": shape, "datatype": datatype,
                              "parameters": {"binary_data_size": len(data)}}],
                  "outputs": [{"name": "OUT", "parameters": {"binary_data": False}}]})
    return header + data, {"Inference-Header-Content-Length": str(len(header))}


def _echo(datatype: str, data: list[Any]) -> bytes:
    return _js({"inputs": [{"name": "IN", "shape": [len(data)], "datatype": datatype,
                            "data": data}]})


def http_cases() -> list[Http]:
    cases = [Http(f"GET {path}", "GET", path, keys_only=path.endswith("stats")) for path in (
        "/v2", "/v2/health/live", "/v2/health/ready", "/v2/models/add_sub",
        "/v2/models/add_sub/versions/1", "/v2/models/add_sub/versions/2",
        "/v2/models/add_sub/versions/x", "/v2/models/nope", "/v2/models/add_sub/ready",
        "/v2/models/nope/ready", "/v2/models/add_sub/versions/2/ready",
        "/v2/models/add_sub/config", "/v2/models/nope/config", "/v2/models/add_sub/stats",
        "/v2/models/nope/stats", "/v2/models/stats", "/v3", "/v2/models",
        "/v2/models/add_sub/infer", "/v2/models/int_double", "/v2/logging",
        "/v2/trace/setting", "/v2/models/add_sub/trace/setting")]
    cases += [Http(f"POST {path}", "POST", path) for path in (
        "/v2/health/live", "/v2/repository/index", "/v2/models/add_sub/ready",
        "/v2/repository/models/nope/load", "/v2/repository/models/nope/unload")]
    cases += [
        Http("GET /v2/models/add_sub/versions/1/stats", "GET",
             "/v2/models/add_sub/versions/1/stats", keys_only=True),
        Http("stats version 3", "GET", "/v2/models/add_sub/versions/3/stats"),
        Http("PUT infer", "PUT", INFER, _add()),
        Http("repo index ready", "POST", "/v2/repository/index", _js({"ready": True})),
        Http("repo index bad json", "POST", "/v2/repository/index", b"{"),
        Http("repo index list", "POST", "/v2/repository/index", b"[]"),
        Http("repo index ready str", "POST", "/v2/repository/index", _js({"ready": "yes"})),
        Http("load bad body", "POST", "/v2/repository/models/add_sub/load", b"{"),
        Http("logging bad", "POST", "/v2/logging", _js({"log_info": "x"})),
        Http("shm register bad key", "POST", "/v2/systemsharedmemory/region/r/register",
             _js({"key": "/tgdiff_none", "offset": 0, "byte_size": 16})),
        Http("ok json", "POST", INFER, _add()),
        Http("ok json v1", "POST", "/v2/models/add_sub/versions/1/infer", _add()),
        Http("json v7", "POST", "/v2/models/add_sub/versions/7/infer", _add()),
        Http("json no model", "POST", "/v2/models/nope/infer", _add()),
        Http("json id", "POST", INFER, _add(id="abc")),
        Http("json id empty", "POST", INFER, _add(id="")),
        Http("json id number", "POST", INFER, _add(id=5)),
        Http("json id long", "POST", INFER, _add(id="i" * 5000)),
        Http("json id unicode", "POST", INFER, _add(id="é☃\n\"x")),
        Http("json no outputs", "POST", INFER, _add(outputs=None)),
        Http("json output unknown", "POST", INFER, _add(outputs=[{"name": "NOPE"}])),
        Http("json output binary", "POST", INFER, _add(outputs=[
            {"name": "OUTPUT0", "parameters": {"binary_data": True}}])),
        Http("json output binary str", "POST", INFER, _add(outputs=[
            {"name": "OUTPUT0", "parameters": {"binary_data": "yes"}}])),
        Http("json output classification", "POST", INFER, _add(outputs=[
            {"name": "OUTPUT0", "parameters": {"classification": 2}}])),
        Http("json output no name", "POST", INFER, _add(outputs=[{}])),
        Http("json binary_data_output", "POST", INFER,
             _add(outputs=None, parameters={"binary_data_output": True})),
        Http("json binary_data_output listed", "POST", INFER,
             _add(parameters={"binary_data_output": True})),
        Http("json binary_data_output str", "POST", INFER,
             _add(parameters={"binary_data_output": "yes"})),
        Http("json params bad", "POST", INFER, _add(parameters=[1])),
        Http("json dtype FP64", "POST", INFER, _first(datatype="FP64")),
        Http("json dtype bogus", "POST", INFER, _first(datatype="FLOAT")),
        Http("json shape 1x5", "POST", INFER, _first(shape=[1, 5], data=F4 + [5.0])),
        Http("json shape 4", "POST", INFER, _first(shape=[4])),
        Http("json shape 9x4", "POST", INFER, _js({"inputs": [
            {"name": n, "shape": [9, 4], "datatype": "FP32", "data": F4 * 9}
            for n in ("INPUT0", "INPUT1")]})),
        Http("json shape neg", "POST", INFER, _first(shape=[-1, 4])),
        Http("json shape str", "POST", INFER, _first(shape=["1", 4])),
        Http("json shape float", "POST", INFER, _first(shape=[1.0, 4])),
        Http("json shape missing", "POST", INFER, _first(shape=None)),
        Http("json data short", "POST", INFER, _first(data=F4[:3])),
        Http("json data long", "POST", INFER, _first(data=F4 + [1.0])),
        Http("json data nested", "POST", INFER, _first(data=[F4])),
        Http("json data str", "POST", INFER, _first(data=["1", "2", "3", "4"])),
        Http("json data bool", "POST", INFER, _first(data=[True, False, True, False])),
        Http("json data null", "POST", INFER, _first(data=[None, 1.0, 2.0, 3.0])),
        Http("json data int", "POST", INFER, _first(data=[1, 2, 3, 4])),
        Http("json data huge", "POST", INFER, _first(data=[1e300, 1, 2, 3])),
        Http("json data scalar", "POST", INFER, _first(data=1.0)),
        Http("json name missing", "POST", INFER, _first(name=None)),
        Http("json datatype missing", "POST", INFER, _first(datatype=None)),
        Http("json input unknown", "POST", INFER, _js({"inputs": ADD["inputs"] + [
            {"name": "X", "shape": [1, 4], "datatype": "FP32", "data": F4}]})),
        Http("json input twice", "POST", INFER, _js({"inputs": ADD["inputs"] +
                                                     [ADD["inputs"][0]]})),
        Http("json input missing", "POST", INFER, _js({"inputs": ADD["inputs"][:1]})),
        Http("json inputs missing", "POST", INFER, _js({})),
        Http("json inputs not list", "POST", INFER, _js({"inputs": {}})),
        Http("json body array", "POST", INFER, b"[]"),
        Http("json body empty", "POST", INFER, b""),
        Http("json body garbage", "POST", INFER, b"{not json"),
        Http("json body trailing", "POST", INFER, _add() + b"xx"),
        Http("json utf8 bad", "POST", INFER, b'{"inputs": "\xff"}'),
        Http("json gzip", "POST", INFER, gzip.compress(_add()), {"Content-Encoding": "gzip"}),
        Http("json deflate", "POST", INFER, zlib.compress(_add()),
             {"Content-Encoding": "deflate"}),
        Http("json br", "POST", INFER, _add(), {"Content-Encoding": "br"}),
        Http("json gzip bad", "POST", INFER, b"not gzip", {"Content-Encoding": "gzip"}),
        Http("json accept gzip", "POST", INFER, _add(), {"Accept-Encoding": "gzip"}),
        Http("json accept deflate", "POST", INFER, _add(), {"Accept-Encoding": "deflate"}),
        Http("bin ok", "POST", INFER, *_binary()),
        Http("bin size short", "POST", INFER, *_binary((12, 16), struct.pack("<7f", *F4[:3],
                                                                               *F4))),
        Http("bin body short", "POST", INFER, *_binary(data=struct.pack("<6f", *F4, 1, 2))),
        Http("bin body long", "POST", INFER, *_binary(data=struct.pack("<9f", *F4, *F4, 1))),
        Http("bin hcl big", "POST", INFER, *_binary(header_length="100000")),
        Http("bin hcl neg", "POST", INFER, *_binary(header_length="-1")),
        Http("bin hcl str", "POST", INFER, *_binary(header_length="abc")),
        Http("bin hcl plus", "POST", INFER, *_binary(header_length="+100")),
        Http("bin size neg", "POST", INFER, *_binary((-16, 16))),
        Http("bin size str", "POST", INFER, *_binary(("16", 16))),
        Http("bin size float", "POST", INFER, *_binary((16.0, 16))),
        Http("shm unknown region", "POST", INFER, _js({"inputs": [
            {"name": n, "shape": [1, 4], "datatype": "FP32", "parameters": {
                "shared_memory_region": "nope", "shared_memory_byte_size": 16}}
            for n in ("INPUT0", "INPUT1")]})),
        Http("decoupled infer", "POST", "/v2/models/stream_echo/infer", _js({"inputs": [
            {"name": "IN", "shape": [1], "datatype": "INT32", "data": [2]}]})),
    ]
    integer = "/v2/models/int_double/infer"
    for name, data, datatype in (("int ok", [3], "INT32"), ("int float data", [3.5], "INT32"),
                                 ("int overflow", [2**40], "INT32"),
                                 ("int neg overflow", [-2**40], "INT32"),
                                 ("int bool data", [True], "INT32"),
                                 ("int string data", ["3"], "INT32"),
                                 ("int dtype INT64", [3], "INT64")):
        cases.append(Http(name, "POST", integer, _js({"inputs": [
            {"name": "IN", "shape": [1], "datatype": datatype, "data": data}]})))
    for name, datatype, data in (
            ("bool ok", "BOOL", [True, False]), ("bool ints", "BOOL", [1, 0]),
            ("bool strings", "BOOL", ["true"]), ("uint8 ok", "UINT8", [0, 255]),
            ("uint8 past range", "UINT8", [256]), ("uint8 negative", "UINT8", [-1]),
            ("uint8 fraction", "UINT8", [1.0]), ("uint64 ok", "UINT64", [0, 2**64 - 1]),
            ("uint64 past 64 bits", "UINT64", [2**64]), ("uint64 high", "UINT64", [2**63]),
            ("int64 ok", "INT64", [-2**63, 2**63 - 1]), ("int64 past range", "INT64", [2**63]),
            ("int64 fraction", "INT64", [1.5]), ("int8 ok", "INT8", [-128, 127]),
            ("int8 past range", "INT8", [128]), ("fp16 json", "FP16", [0.5]),
            ("fp32 ok", "FP32", [0.1, 1e38, 1e-45]), ("fp32 past range", "FP32", [3.5e38]),
            ("fp64 ok", "FP64", [0.1, 1e308, 5e-324]), ("bf16 json", "BF16", [1.0]),
            ("bytes ok", "BYTES", ["a", "é", ""]), ("bytes numbers", "BYTES", [1])):
        model = "echo_string" if datatype == "BYTES" else f"echo_{datatype.lower()}"
        cases.append(Http(name, "POST", f"/v2/models/{model}/infer", _echo(datatype, data)))
    cases.append(Http("bytes nonstr", "POST", "/v2/models/echo_string/infer",
                      _echo("BYTES", [1, 2])))
    pair = [{"name": "A", "shape": [1, 4], "datatype": "FP32", "data": F4},
            {"name": "B", "shape": [1, 4], "datatype": "FP32", "data": [1, 1, 1, 1]}]
    ensemble = "/v2/models/ensemble_add"
    cases += [Http("ensemble infer", "POST", f"{ensemble}/infer", _js({"inputs": pair})),
              Http("ensemble one output", "POST", f"{ensemble}/infer",
                   _js({"inputs": pair, "outputs": [{"name": "DIFF"}]})),
              Http("ensemble missing input", "POST", f"{ensemble}/infer",
                   _js({"inputs": pair[:1]})),
              Http("ensemble metadata", "GET", ensemble),
              Http("ensemble config", "GET", f"{ensemble}/config", keys_only=True)]
    parameters: dict[str, Any]
    for name, parameters in (  # in order: each goes on from the ones before it
            ("sequence without an id", {}), ("sequence id without start", {"sequence_id": 51}),
            ("sequence start", {"sequence_id": 52, "sequence_start": True}),
            ("sequence continues", {"sequence_id": 52}),
            ("sequence starts again", {"sequence_id": 52, "sequence_start": True}),
            ("sequence ends", {"sequence_id": 52, "sequence_end": True}),
            ("sequence after its end", {"sequence_id": 52}),
            ("sequence start and end", {"sequence_id": 53, "sequence_start": True,
                                        "sequence_end": True}),
            ("sequence id 0", {"sequence_id": 0, "sequence_start": True}),
            ("sequence start without an id", {"sequence_start": True}),
            ("sequence string id", {"sequence_id": "s", "sequence_start": True}),
            ("sequence string id continues", {"sequence_id": "s"}),
            ("sequence string id ends", {"sequence_id": "s", "sequence_end": True}),
            ("sequence empty string id", {"sequence_id": "", "sequence_start": True}),
            ("sequence id 2**64 - 1", {"sequence_id": 2**64 - 1, "sequence_start": True}),
            ("sequence id 2**64 - 1 ends", {"sequence_id": 2**64 - 1, "sequence_end": True}),
            ("sequence string '77'", {"sequence_id": "77", "sequence_start": True}),
            ("sequence number 77 is another", {"sequence_id": 77}),
            ("sequence string '77' ends", {"sequence_id": "77", "sequence_end": True}),
            ("sequence start not a bool", {"sequence_id": 54, "sequence_start": 1})):
        cases.append(Http(name, "POST", "/v2/models/sequence_sum/infer", _js({
            "inputs": [{"name": "IN", "shape": [1, 1], "datatype": "INT32", "data": [1]}],
            "parameters": parameters})))
    for name, model, route, document in (
            ("generate", "int_double", "generate", {"IN": [3]}),
            ("generate a scalar", "int_double", "generate", {"IN": 3}),
            ("generate batched", "add_sub", "generate", {"INPUT0": F4, "INPUT1": F4}),
            ("generate a field no input has", "int_double", "generate", {"IN": [3], "X": 1}),
            ("generate without an input", "int_double", "generate", {}),
            ("generate a string for a number", "int_double", "generate", {"IN": ["3"]}),
            ("generate a decoupled model", "stream_echo", "generate", {"IN": [3]}),
            ("generate_stream", "stream_echo", "generate_stream", {"IN": [3]}),
            ("generate_stream counts", "stream_count", "generate_stream", {"IN": [2]}),
            ("generate_stream not decoupled", "int_double", "generate_stream", {"IN": [3]}),
            ("generate unknown model", "nope", "generate", {"IN": [3]})):
        cases.append(Http(name, "POST", f"/v2/models/{model}/{route}", _js(document)))
    for name, parameters in (
            ("priority on a model without levels", {"priority": 3}),
            ("priority negative", {"priority": -1}),
            ("priority a string", {"priority": "high"}),
            ("timeout", {"timeout": 5_000_000}),
            ("timeout a string", {"timeout": "5"}),
            ("timeout negative", {"timeout": -1}),
            ("a triton_ parameter", {"triton_custom": 1}),
            ("a headers parameter", {"headers": {"a": "b"}}),
            ("a custom parameter", {"mine": "yes", "count": 2, "ratio": 0.5})):
        cases.append(Http(name, "POST", INFER, _add(parameters=parameters)))
    binary_text = struct.pack("<I", 2) + b"\xff\xfe"
    cases.append(Http("bytes not UTF-8 answered as JSON", "POST", "/v2/models/echo_string/infer",
                      *_binary_one("BYTES", [1], binary_text)))
    raw = {"Inference-Header-Content-Length": "0"}  # the body is the one input's bytes
    cases += [
        Http("raw binary request", "POST", "/v2/models/int_double/infer",
             struct.pack("<i", 21), raw),
        Http("raw binary request, variable dims", "POST", "/v2/models/echo_fp32/infer",
             struct.pack("<3f", 1, 2, 3), raw),
        Http("raw binary request, BYTES of dims [-1]", "POST", "/v2/models/echo_string/infer",
             b"ab", raw),
        Http("raw binary request, BYTES", "POST", "/v2/models/echo_text/infer", b"ab", raw),
        Http("raw binary request, BYTES with a length", "POST", "/v2/models/echo_text/infer",
             struct.pack("<I", 2) + b"ab", raw),
        Http("raw binary request, BYTES empty", "POST", "/v2/models/echo_text/infer", b"",
             raw),
        Http("raw binary request, two inputs", "POST", INFER, struct.pack("<8f", *F4, *F4), raw),
        Http("raw binary request, too short", "POST", "/v2/models/int_double/infer", b"\x01",
             raw),
        Http("raw binary request, empty", "POST", "/v2/models/int_double/infer", b"", raw),
    ]
    one = _js({"inputs": [{"name": "IN", "shape": [1, 1], "datatype": "INT32", "data": [10]}]})
    for model in ("versions_all", "versions_latest", "versions_specific"):
        base = f"/v2/models/{model}"
        cases += [Http(f"{model} metadata", "GET", base),
                  Http(f"{model} infer", "POST", f"{base}/infer", one),
                  Http(f"{model} stats", "GET", f"{base}/stats", keys_only=True)]
        for version in (1, 2, 3, 4):
            cases += [Http(f"{model} v{version} infer", "POST",
                           f"{base}/versions/{version}/infer", one),
                      Http(f"{model} v{version} ready", "GET", f"{base}/versions/{version}/ready")]
    for priority in (0, 1, 2, 3):  # the model has two priority levels
        cases.append(Http(f"priority {priority} of two levels", "POST",
                          "/v2/models/versions_all/infer", _js({
                              "inputs": [{"name": "IN", "shape": [1, 1], "datatype": "INT32",
                                          "data": [10]}], "parameters": {"priority": priority}})))
    load = "/v2/repository/models/add_sub/load"
    smaller = json.dumps({
        "name": "add_sub", "backend": "python", "max_batch_size": 2,
        "input": [{"name": n, "data_type": "TYPE_FP32", "dims": [4]} for n in ("INPUT0",
                                                                             "INPUT1")],
        "output": [{"name": n, "data_type": t, "dims": [d]} for n, t, d in (
            ("OUTPUT0", "TYPE_FP32", 4), ("OUTPUT1", "TYPE_FP32", 4),
            ("REQUESTS", "TYPE_INT32", 1))]})
    three = _js({"inputs": [{"name": n, "shape": [3, 4], "datatype": "FP32", "data": F4 * 3}
                            for n in ("INPUT0", "INPUT1")]})
    cases += [  # in order; the last loads add_sub as its repository has it again
        Http("load with a config", "POST", load, _js({"parameters": {"config": smaller}})),
        Http("config after a load with a config", "GET", "/v2/models/add_sub/config"),
        Http("infer past the loaded config's batch", "POST", INFER, three),
        Http("load with a config that is not JSON", "POST", load,
             _js({"parameters": {"config": "{"}})),
        Http("load with a config not a string", "POST", load,
             _js({"parameters": {"config": {"name": "add_sub"}}})),
        Http("load with another model's config", "POST", load,
             _js({"parameters": {"config": smaller.replace('"add_sub"', '"other"')}})),
        Http("load again without a config", "POST", load, b""),
        Http("infer after the load without a config", "POST", INFER, three),
    ]
    scores = [0.5, 3.0, -1.0, 3.0, 2.0]
    for name, model, datatype, data, count, binary in (
            ("classification labels", "classes", "FP32", scores, 4, False),
            ("classification past the count", "classes", "FP32", scores, 9, False),
            ("classification binary", "classes", "FP32", scores, 2, True),
            ("classification int", "echo_int64", "INT64", [2**24, 2**24 + 1, -3], 2, False),
            ("classification uint8", "echo_uint8", "UINT8", [8, 3, 9], 3, False),
            ("classification negative", "classes", "FP32", scores, -1, False)):
        cases.append(Http(name, "POST", f"/v2/models/{model}/infer", _js({
            "inputs": [{"name": "IN", "shape": [len(data)], "datatype": datatype,
                        "data": data}],
            "outputs": [{"name": "OUT", "parameters": {"classification": count,
                                                       "binary_data": binary}}]})))
    return cases


def shm_cases(keys: tuple[str, str]) -> list[Http]:
    """System shared memory, in order: two regions the client made (32 bytes each: INPUT0's
    values then INPUT1's, and room for outputs) registered, read, written, let go of."""
    region = "/v2/systemsharedmemory/region"
    floats = {"shape": [1, 4], "datatype": "FP32"}

    def placed(name: str, region_name: str, offset: int, size: int = 16) -> dict[str, Any]:
        return {"name": name, **floats, "parameters": {
            "shared_memory_region": region_name, "shared_memory_offset": offset,
            "shared_memory_byte_size": size}}

    def infer(inputs: list[dict[str, Any]], outputs: list[dict[str, Any]] | None = None
              ) -> bytes:
        return _js({"inputs": inputs, **({"outputs": outputs} if outputs else {})})

    def output(offset: int) -> list[dict[str, Any]]:
        return [{"name": "OUTPUT1", "parameters": {
            "shared_memory_region": "diff_out", "shared_memory_offset": offset,
            "shared_memory_byte_size": 16}}]

    both = [placed("INPUT0", "diff_in", 0), placed("INPUT1", "diff_in", 16)]
    return [
        Http("shm register", "POST", f"{region}/diff_in/register",
             _js({"key": keys[0], "offset": 0, "byte_size": 32})),
        Http("shm register its name again", "POST", f"{region}/diff_in/register",
             _js({"key": keys[1], "offset": 0, "byte_size": 32})),
        Http("shm register past its end", "POST", f"{region}/diff_far/register",
             _js({"key": keys[1], "offset": 16, "byte_size": 32})),
        Http("shm register an output", "POST", f"{region}/diff_out/register",
             _js({"key": keys[1], "offset": 0, "byte_size": 32})),
        Http("shm status", "GET", "/v2/systemsharedmemory/status"),
        Http("shm status of one", "GET", f"{region}/diff_in/status"),
        Http("shm inputs", "POST", INFER, infer(both)),
        Http("shm inputs and an output", "POST", INFER, infer(both, output(16))),
        Http("shm output past the region", "POST", INFER, infer(both, output(24))),
        Http("shm input size not the shape's", "POST", INFER,
             infer([placed("INPUT0", "diff_in", 0, 12), both[1]])),
        Http("shm input past the region", "POST", INFER,
             infer([placed("INPUT0", "diff_in", 24), both[1]])),
        Http("shm input offset negative", "POST", INFER,
             infer([placed("INPUT0", "diff_in", -4), both[1]])),
        Http("shm input of a region not registered", "POST", INFER,
             infer([placed("INPUT0", "diff_none", 0), both[1]])),
        Http("shm unregister one", "POST", f"{region}/diff_out/unregister"),
        Http("shm status after one is gone", "GET", "/v2/systemsharedmemory/status"),
        Http("shm unregister all", "POST", "/v2/systemsharedmemory/unregister"),
        Http("shm status after all are gone", "GET", "/v2/systemsharedmemory/status"),
    ]


def failure_cases() -> list[Http]:
    """A model whose load fails (while the folder `fragile` holds a file "fail"), then
    loads again once it is gone (main makes the file before the failed load and removes it
    before the one that works)."""
    fragile = "/v2/models/fragile"
    infer = _js({"inputs": [{"name": "IN", "shape": [1], "datatype": "INT32", "data": [1]}]})
    return [
        Http("unload before a failed load", "POST", "/v2/repository/models/fragile/unload"),
        Http("a failed load", "POST", "/v2/repository/models/fragile/load"),
        Http("index after a failed load", "POST", "/v2/repository/index"),
        Http("ready after a failed load", "GET", f"{fragile}/ready"),
        Http("metadata after a failed load", "GET", fragile),
        Http("infer after a failed load", "POST", f"{fragile}/infer", infer),
        Http("server ready after a failed load", "GET", "/v2/health/ready"),
        Http("a load that works again", "POST", "/v2/repository/models/fragile/load"),
        Http("index after the load works", "POST", "/v2/repository/index"),
        Http("infer after the load works", "POST", f"{fragile}/infer", infer),
    ]


# (the metric API's misuses are not asked: Triton 2.51's stub aborted now and then, a boost
# lock_exception, when a model's metric call was refused; compared by hand on 2026-12-04,
# they raise TritonModelException on both, which tests/test_custom_metrics.py holds ours to)
PROBES = ("args", "config", "config helpers", "api module", "api classes", "api request",
          "constants", "types", "bytes helpers", "tensors", "response", "request", "bls",
          "preferred memory")
ANSWERS = ("error response", "error code INVALID_ARG", "error code NOT_FOUND",
           "error code UNAVAILABLE", "error code UNSUPPORTED", "error code ALREADY_EXISTS",
           "error code CANCELLED", "error code UNKNOWN", "raise", "raise ValueError",
           "output wrong datatype", "output wrong shape", "output unknown", "output missing",
           "output twice", "not a response", "an empty list", "through the sender")


def _probe(what: str, **changes: Any) -> bytes:
    body = {"inputs": [{"name": "IN", "shape": [1], "datatype": "BYTES", "data": [what]}],
            "outputs": [{"name": "OUT"}], **changes}
    return _js({k: v for k, v in body.items() if v is not None})


def probe_cases() -> list[Http]:
    """The probe model's reports (tools/triton_diff_probe.py), then its answers of each kind
    the server has to take from a model (errors, raises, outputs not as configured)."""
    path = "/v2/models/probe/infer"
    cases = [Http(f"probe {what}", "POST", path, _probe(what), probe=True) for what in PROBES]
    cases.append(Http("probe request with an id and parameters", "POST", path, _probe(
        "request", id="rid-7", parameters={"a": 1, "b": "x", "c": True, "d": 1.5}),
        probe=True))
    cases.append(Http("probe request asking no output", "POST", path, _probe(
        "request", outputs=None), probe=True))
    cases.append(Http("probe request with a timeout and a priority", "POST", path, _probe(
        "request", parameters={"timeout": 5000000, "priority": 0}), probe=True))
    cases.append(Http("probe request with sequence parameters", "POST", path, _probe(
        "request", parameters={"sequence_id": 7, "sequence_start": True}), probe=True))
    cases.append(Http("probe request with binary_data_output", "POST", path, _probe(
        "request", parameters={"binary_data_output": False}), probe=True))
    cases += [Http(f"probe answer: {how}", "POST", path, _probe(f"execute {how}"))
              for how in ANSWERS]
    cases += [Http(f"config of {model}", "GET", f"/v2/models/{model}/config")
              for model in ("probe", "warmed", "stream_probe", "sequence_sum", "classes")]
    # what a model's model_warmup samples gave it at load, then a client's request
    cases.append(Http("model_warmup's requests as the model saw them", "POST",
                      "/v2/models/warmed/infer", _js({"id": "client", "inputs": [
                          {"name": "TEXT", "shape": [1, 2], "datatype": "BYTES",
                           "data": ["", ""]},
                          {"name": "NUM", "shape": [1, 3], "datatype": "FP32",
                           "data": [0, 0, 0]}]})))
    # a model with no config.pbtxt, its config made by its auto_complete_config
    four = {"shape": [1, 4], "datatype": "FP32", "data": F4}
    cases += [
        Http("auto-completed config", "GET", "/v2/models/auto_complete/config"),
        Http("auto-completed metadata", "GET", "/v2/models/auto_complete"),
        Http("auto-completed infer, the optional input left out", "POST",
             "/v2/models/auto_complete/infer", _js({"inputs": [{"name": "INPUT0", **four}]})),
        Http("auto-completed infer", "POST", "/v2/models/auto_complete/infer", _js({
            "inputs": [{"name": "INPUT0", **four}, {"name": "INPUT1", **four}]})),
    ]
    # --model-config-name diff: configs/diff.pbtxt where a model has one
    cases += [Http(f"config of {model} (--model-config-name)", "GET",
                   f"/v2/models/{model}/config")
              for model in ("named_config", "other_config", "named_only")]
    cases += [Http(f"infer {model} in a batch of 2 (--model-config-name)", "POST",
                   f"/v2/models/{model}/infer", _js({"inputs": [
                       {"name": "IN", "shape": [2, 1], "datatype": "INT32", "data": [4, 5]}]}))
              for model in ("named_config", "named_only")]
    return cases


# the model the upload cases send: IN + 100, under a name the repository does not hold
_UPLOADED_SOURCE = b"""\
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        return [pb_utils.InferenceResponse([pb_utils.Tensor(
            "OUT", pb_utils.get_input_tensor_by_name(r, "IN").as_numpy() + 100)])
            for r in requests]
"""


def _uploaded_config(name: str) -> str:
    return json.dumps({"name": name, "backend": "python", "max_batch_size": 4,
                       "input": [{"name": "IN", "data_type": "TYPE_INT32", "dims": [1]}],
                       "output": [{"name": "OUT", "data_type": "TYPE_INT32", "dims": [1]}]})


def upload_cases() -> list[Http]:
    """Model upload: a load's `file:<path>` parameters (base64 over HTTP) form the folder
    the model loads from, with the load's `config` its config. In order: a new model
    uploaded, served, unloaded; a repository model's files replaced, then its own again; the
    last upload unloaded. Sent after the other HTTP and gRPC cases: Triton is not ready
    once a model is unloaded."""
    import base64

    source = base64.b64encode(_UPLOADED_SOURCE).decode()
    load = "/v2/repository/models/{}/load".format
    one = _js({"inputs": [{"name": "IN", "shape": [1, 1], "datatype": "INT32", "data": [5]}]})

    def upload(name: str, **files: Any) -> bytes:
        return _js({"parameters": {"config": _uploaded_config(name), **files}})
    return [
        Http("upload without a config", "POST", load("uploaded"),
             _js({"parameters": {"file:1/model.py": source}})),
        Http("upload content not base64", "POST", load("uploaded"),
             upload("uploaded", **{"file:1/model.py": "not base64!"})),
        Http("upload content not a string", "POST", load("uploaded"),
             upload("uploaded", **{"file:1/model.py": 5})),
        Http("upload with a path out of its folder", "POST", load("uploaded"),
             upload("uploaded", **{"file:../tgdiff_escape/1/model.py": source})),
        Http("upload with an empty path", "POST", load("uploaded"),
             upload("uploaded", **{"file:": source})),
        Http("upload with no version folder", "POST", load("uploaded"),
             upload("uploaded", **{"file:model.py": source})),
        Http("upload a new model", "POST", load("uploaded"),
             upload("uploaded", **{"file:1/model.py": source})),
        Http("upload: infer the uploaded model", "POST", "/v2/models/uploaded/infer", one),
        Http("upload: config of the uploaded model", "GET", "/v2/models/uploaded/config"),
        Http("upload: index after an upload", "POST", "/v2/repository/index"),
        Http("upload: load the uploaded model again without files", "POST", load("uploaded")),
        Http("upload: infer after loading it without files", "POST", "/v2/models/uploaded/infer", one),
        Http("upload: unload the uploaded model", "POST", "/v2/repository/models/uploaded/unload"),
        Http("upload: index after unloading the uploaded model", "POST", "/v2/repository/index"),
        Http("upload two versions", "POST", load("uploaded"), _js({"parameters": {
            "config": _uploaded_config("uploaded").replace(
                '"backend"', '"version_policy": {"all": {}}, "backend"'),
            "file:1/model.py": source, "file:2/model.py": source}})),
        Http("upload: ready of the second uploaded version", "GET",
             "/v2/models/uploaded/versions/2/ready"),
        Http("upload with a config.pbtxt file", "POST", load("uploaded"),
             upload("uploaded", **{"file:1/model.py": source,
                                   "file:config.pbtxt": base64.b64encode(
                                       b'name: "uploaded"\nbackend: "python"\n').decode()})),
        Http("upload over a repository model", "POST", load("echo_int32"),
             upload("echo_int32", **{"file:1/model.py": source})),
        Http("upload: infer the replaced repository model", "POST", "/v2/models/echo_int32/infer",
             one),
        Http("upload: load the repository model again", "POST", load("echo_int32")),
        Http("upload: infer the repository model again", "POST", "/v2/models/echo_int32/infer", one),
        Http("upload: unload it at the end", "POST", "/v2/repository/models/uploaded/unload"),
        Http("upload: server ready after it is unloaded", "GET", "/v2/health/ready"),
    ]


def grpc_upload_cases() -> list[Grpc]:
    """Model upload over gRPC: `file:` parameters are bytes_param."""
    from tritonclient.grpc import service_pb2 as pb

    def upload(name: str, kind: str = "bytes_param", with_config: bool = True) -> Any:
        request = pb.RepositoryModelLoadRequest(model_name=name)
        if with_config:
            request.parameters["config"].string_param = _uploaded_config(name)
        value = _UPLOADED_SOURCE if kind == "bytes_param" else _UPLOADED_SOURCE.decode()
        setattr(request.parameters["file:1/model.py"], kind, value)
        return request

    def infer(name: str) -> Any:
        request = pb.ModelInferRequest(model_name=name)
        request.inputs.add(name="IN", datatype="INT32", shape=[1, 1])
        request.raw_input_contents.append(struct.pack("<i", 7))
        return request
    return [
        Grpc("grpc upload without a config", "RepositoryModelLoad",
             upload("uploaded_g", with_config=False)),
        Grpc("grpc upload as a string", "RepositoryModelLoad",
             upload("uploaded_g", "string_param")),
        Grpc("grpc upload", "RepositoryModelLoad", upload("uploaded_g")),
        Grpc("grpc upload: infer the uploaded model", "ModelInfer", infer("uploaded_g")),
        Grpc("grpc upload: unload the uploaded model", "RepositoryModelUnload",
             pb.RepositoryModelUnloadRequest(model_name="uploaded_g")),
    ]


def grpc_cases() -> list[Grpc]:
    from tritonclient.grpc import service_pb2 as pb

    floats = struct.pack("<4f", *F4)

    def infer(model: str = "add_sub", version: str = "", names: tuple[str, ...] = (
              "INPUT0", "INPUT1"), shapes: tuple[list[int], ...] = ([1, 4], [1, 4]),
              datatypes: tuple[str, ...] = ("FP32", "FP32"),
              raw: list[bytes] | None = None) -> Any:
        request = pb.ModelInferRequest(model_name=model, model_version=version)
        for name, shape, datatype in zip(names, shapes, datatypes):
            request.inputs.add(name=name, datatype=datatype, shape=shape)
        request.raw_input_contents.extend([floats, floats] if raw is None else raw)
        return request

    def typed(datatype: str, contents: str, values: list[Any]) -> Any:
        model = "echo_string" if datatype in ("BYTES", "STRING") else f"echo_{datatype.lower()}"
        request = pb.ModelInferRequest(model_name=model)
        item = request.inputs.add(name="IN", datatype=datatype.replace("STRING", "BYTES"),
                                  shape=[len(values)])
        getattr(item.contents, contents).extend(values)
        return request

    both = infer()
    both.inputs[0].contents.fp32_contents.extend(F4)

    def probe(what: str, **parameters: Any) -> Any:
        """The probe model's `what` over gRPC, with typed request parameters."""
        request = pb.ModelInferRequest(model_name="probe", id="g-1")
        item = request.inputs.add(name="IN", datatype="BYTES", shape=[1])
        item.contents.bytes_contents.append(what.encode())
        for key, value in parameters.items():
            setattr(request.parameters[key], value[0], value[1])
        return request
    neg_timeout = infer()
    neg_timeout.parameters["timeout"].int64_param = -5
    cases = [
        Grpc("grpc ok", "ModelInfer", infer()),
        Grpc("grpc v7", "ModelInfer", infer(version="7")),
        Grpc("grpc vx", "ModelInfer", infer(version="x")),
        Grpc("grpc no model", "ModelInfer", infer(model="nope")),
        Grpc("grpc short raw", "ModelInfer", infer(raw=[floats[:12], floats])),
        Grpc("grpc long raw", "ModelInfer", infer(raw=[floats + floats[:4], floats])),
        Grpc("grpc one raw", "ModelInfer", infer(raw=[floats])),
        Grpc("grpc three raw", "ModelInfer", infer(raw=[floats] * 3)),
        Grpc("grpc contents and raw", "ModelInfer", both),
        Grpc("grpc dtype bogus", "ModelInfer", infer(datatypes=("FLOAT", "FP32"))),
        Grpc("grpc shape 4", "ModelInfer", infer(shapes=([4], [1, 4]))),
        Grpc("grpc batch mismatch", "ModelInfer", infer(shapes=([2, 4], [1, 4]),
                                                        raw=[floats * 2, floats])),
        Grpc("grpc missing input", "ModelInfer", infer(names=("INPUT0",), raw=[floats])),
        Grpc("grpc unknown input", "ModelInfer", infer(names=("INPUT0", "X"))),
        Grpc("grpc input twice", "ModelInfer", infer(names=("INPUT0", "INPUT0"))),
        Grpc("grpc timeout neg", "ModelInfer", neg_timeout),
        Grpc("grpc decoupled unary", "ModelInfer", infer(
            model="stream_echo", names=("IN",), shapes=([1],), datatypes=("INT32",),
            raw=[struct.pack("<i", 2)])),
        Grpc("grpc uint64 contents", "ModelInfer", typed("UINT64", "uint64_contents",
                                                         [0, 2**64 - 1])),
        Grpc("grpc int8 past range", "ModelInfer", typed("INT8", "int_contents", [128])),
        Grpc("grpc uint8 past range", "ModelInfer", typed("UINT8", "uint_contents", [256])),
        Grpc("grpc uint16 past range", "ModelInfer", typed("UINT16", "uint_contents",
                                                           [70000])),
        Grpc("grpc bool contents", "ModelInfer", typed("BOOL", "bool_contents",
                                                       [True, False])),
        Grpc("grpc fp16 contents", "ModelInfer", typed("FP16", "fp32_contents", [1.0])),
        Grpc("grpc fp32 as fp64", "ModelInfer", typed("FP32", "fp64_contents", [1.0])),
        Grpc("grpc int32 as int64", "ModelInfer", typed("INT32", "int64_contents", [1])),
        Grpc("grpc bytes contents", "ModelInfer", typed("STRING", "bytes_contents",
                                                        [b"a", b"\xff"])),
        Grpc("grpc model ready nope", "ModelReady", pb.ModelReadyRequest(name="nope")),
        Grpc("grpc metadata nope", "ModelMetadata", pb.ModelMetadataRequest(name="nope")),
        Grpc("grpc metadata version x", "ModelMetadata",
             pb.ModelMetadataRequest(name="add_sub", version="x")),
        Grpc("grpc config nope", "ModelConfig", pb.ModelConfigRequest(name="nope")),
        Grpc("grpc stats nope", "ModelStatistics", pb.ModelStatisticsRequest(name="nope")),
        Grpc("grpc stats version 3", "ModelStatistics",
             pb.ModelStatisticsRequest(name="add_sub", version="3")),
        Grpc("grpc load nope", "RepositoryModelLoad",
             pb.RepositoryModelLoadRequest(model_name="nope")),
        Grpc("grpc unload nope", "RepositoryModelUnload",
             pb.RepositoryModelUnloadRequest(model_name="nope")),
        Grpc("grpc shm status nope", "SystemSharedMemoryStatus",
             pb.SystemSharedMemoryStatusRequest(name="nope")),
        Grpc("grpc shm register bad key", "SystemSharedMemoryRegister",
             pb.SystemSharedMemoryRegisterRequest(name="r", key="/tgdiff_none",
                                                  byte_size=16)),
        Grpc("grpc trace nope", "TraceSetting", pb.TraceSettingRequest(model_name="nope")),
        Grpc("grpc trace settings", "TraceSetting", pb.TraceSettingRequest(), keys_only=True),
        Grpc("grpc server live", "ServerLive", pb.ServerLiveRequest()),
        Grpc("grpc server ready", "ServerReady", pb.ServerReadyRequest()),
        Grpc("grpc server metadata", "ServerMetadata", pb.ServerMetadataRequest()),
        Grpc("grpc model ready", "ModelReady", pb.ModelReadyRequest(name="add_sub")),
        Grpc("grpc model ready version 2", "ModelReady",
             pb.ModelReadyRequest(name="add_sub", version="2")),
        Grpc("grpc metadata", "ModelMetadata", pb.ModelMetadataRequest(name="add_sub")),
        Grpc("grpc metadata of an ensemble", "ModelMetadata",
             pb.ModelMetadataRequest(name="ensemble_add")),
        Grpc("grpc config", "ModelConfig", pb.ModelConfigRequest(name="int_double")),
        Grpc("grpc config of a batching model", "ModelConfig",
             pb.ModelConfigRequest(name="add_sub")),
        Grpc("grpc statistics", "ModelStatistics", pb.ModelStatisticsRequest(name="add_sub"),
             keys_only=True),
        Grpc("grpc repository index", "RepositoryIndex", pb.RepositoryIndexRequest()),
        Grpc("grpc repository index ready", "RepositoryIndex",
             pb.RepositoryIndexRequest(ready=True)),
        Grpc("grpc log settings", "LogSettings", pb.LogSettingsRequest(), keys_only=True),
        Grpc("grpc shm status", "SystemSharedMemoryStatus",
             pb.SystemSharedMemoryStatusRequest()),
        Grpc("grpc unload", "RepositoryModelUnload",
             pb.RepositoryModelUnloadRequest(model_name="int_double")),
        Grpc("grpc ready after an unload", "ModelReady", pb.ModelReadyRequest(name="int_double")),
        Grpc("grpc index after an unload", "RepositoryIndex", pb.RepositoryIndexRequest()),
        Grpc("grpc load", "RepositoryModelLoad",
             pb.RepositoryModelLoadRequest(model_name="int_double")),
        Grpc("grpc ready after a load", "ModelReady", pb.ModelReadyRequest(name="int_double")),
        Grpc("grpc probe request with typed parameters", "ModelInfer", probe(
            "request", flag=("bool_param", True), count=("int64_param", -3),
            text=("string_param", "x"), ratio=("double_param", 0.5)), probe=True),
        Grpc("grpc probe request with a uint64 parameter", "ModelInfer", probe(
            "request", big=("uint64_param", 2**63 + 1)), probe=True),
        Grpc("grpc probe request with a timeout and a sequence", "ModelInfer", probe(
            "request", timeout=("int64_param", 4000000), sequence_id=("int64_param", 9),
            sequence_start=("bool_param", True)), probe=True),
        Grpc("grpc probe request with a string sequence id", "ModelInfer", probe(
            "request", sequence_id=("string_param", "s-9"), sequence_end=("bool_param", True)),
            probe=True),
    ]
    return cases


def stream_cases() -> list[Stream]:
    return [
        Stream("stream final flag with the response", [
            ("a", "stream_echo", 5, False), ("b", "stream_echo", 6, True)]),
        Stream("stream final flag alone", [
            ("a", "stream_count", 2, False), ("b", "stream_count", 2, True),
            ("c", "stream_count", 0, False), ("d", "stream_count", 0, True)]),
        Stream("stream not decoupled", [
            ("a", "int_double", 4, False), ("b", "int_double", 5, True)]),
        Stream("stream errors carry on", [
            ("a", "stream_count", -1, True), ("b", "nope", 1, False),
            ("c", "stream_count", 1, False)]),
    ] + [Stream(f"stream probe: {how}", [("a", "stream_probe", how, False),
                                          ("b", "stream_probe", "report", False)])
         for how in ("send after the final flag", "send what is not a response",
                     "an error, then more", "an error with the final flag", "raise",
                     "return a list", "from a thread", "cancelled?")]


SAGEMAKER_MODEL = "echo_fp32"  # both servers' SAGEMAKER_TRITON_DEFAULT_MODEL_NAME
_SAGEMAKER_BINARY = "application/vnd.sagemaker-triton.binary+json;json-header-size="


def sagemaker_cases() -> list[Http]:
    """SageMaker's routes (--allow-sagemaker) on echo_fp32: /ping, /invocations with JSON and
    with binary tensors marked by the Content-Type (in, out, both), and what is refused."""
    values = struct.pack("<3f", 1.5, -2.0, 3.25)
    json_body = _echo("FP32", [1.5, -2.0, 3.25])

    def binary(output_binary: bool) -> bytes:
        return _js({"inputs": [{"name": "IN", "shape": [3], "datatype": "FP32",
                                "parameters": {"binary_data_size": 12}}],
                    "outputs": [{"name": "OUT", "parameters": {"binary_data": output_binary}}]})

    def marked(head: bytes, size: int | str | None = None, before: str = "") -> dict[str, str]:
        return {"Content-Type": f"{before}{_SAGEMAKER_BINARY}{len(head) if size is None else size}"}

    head_json, head_binary = binary(False), binary(True)
    binary_out = _js({"inputs": [{"name": "IN", "shape": [3], "datatype": "FP32",
                                  "data": [1.5, -2.0, 3.25]}],
                      "outputs": [{"name": "OUT", "parameters": {"binary_data": True}}]})
    return [
        Http("sagemaker GET /ping", "GET", "/ping"),
        Http("sagemaker POST /ping", "POST", "/ping"),
        Http("sagemaker json", "POST", "/invocations", json_body,
             {"Content-Type": "application/json"}),
        Http("sagemaker json no content type", "POST", "/invocations", json_body),
        Http("sagemaker json with a query", "POST", "/invocations?x=1", json_body),
        Http("sagemaker binary in", "POST", "/invocations", head_json + values,
             marked(head_json)),
        Http("sagemaker binary in and out", "POST", "/invocations", head_binary + values,
             marked(head_binary)),
        Http("sagemaker binary out", "POST", "/invocations", binary_out),
        Http("sagemaker accept gzip", "POST", "/invocations", binary_out,
             {"Accept-Encoding": "gzip"}),
        Http("sagemaker header size past the body", "POST", "/invocations",
             head_json + values, marked(head_json, 9999)),
        Http("sagemaker header size not a number", "POST", "/invocations",
             head_json + values, marked(head_json, "abc")),
        Http("sagemaker binary type not first", "POST", "/invocations", head_json + values,
             marked(head_json, before="text/plain;")),
        Http("sagemaker v2 header ignored", "POST", "/invocations", head_json + values,
             {"Inference-Header-Content-Length": str(len(head_json))}),
        Http("sagemaker bad json", "POST", "/invocations", b"{bad"),
        Http("sagemaker wrong input", "POST", "/invocations", _js({"inputs": [
            {"name": "NOPE", "shape": [1], "datatype": "FP32", "data": [1]}]})),
        Http("sagemaker GET /invocations", "GET", "/invocations"),
        Http("sagemaker /invocations/", "POST", "/invocations/", json_body),
        Http("sagemaker GET /models", "GET", "/models"),
        Http("sagemaker GET /models/x", "GET", "/models/x"),
        Http("sagemaker invoke", "POST", "/models/x/invoke", json_body),
        Http("sagemaker v2 path", "GET", "/v2/health/ready"),
    ]


def multi_model_cases(root: pathlib.Path) -> list[Http]:
    """A SageMaker multi-model endpoint's life, in order: `root`/h2/model holds echo_int32
    (one model folder in the archive's folder, as SageMaker unpacks it), h3/model
    ensemble_add and its step add_sub."""
    url = str(root / "h2" / "model")
    call = _echo("INT32", [3, 4])
    return [
        Http("multi-model list none", "GET", "/models"),
        Http("multi-model load", "POST", "/models", _js({"model_name": "h2", "url": url})),
        Http("multi-model list", "GET", "/models"),
        Http("multi-model describe", "GET", "/models/h2"),
        Http("multi-model invoke", "POST", "/models/h2/invoke", call),
        Http("multi-model load again", "POST", "/models",
             _js({"model_name": "h2", "url": url})),
        Http("multi-model load no url", "POST", "/models", _js({"model_name": "h9"})),
        Http("multi-model load a folder that is not there", "POST", "/models",
             _js({"model_name": "h9", "url": str(root / "h9" / "model")})),
        Http("multi-model describe another", "GET", "/models/h9"),
        Http("multi-model invoke another", "POST", "/models/h9/invoke", call),
        Http("multi-model PUT", "PUT", "/models"),
        Http("multi-model unload", "DELETE", "/models/h2"),
        Http("multi-model describe unloaded", "GET", "/models/h2"),
        Http("multi-model invoke unloaded", "POST", "/models/h2/invoke", call),
        Http("multi-model unload again", "DELETE", "/models/h2"),
        Http("multi-model list after", "GET", "/models"),
        Http("multi-model load after unload", "POST", "/models",
             _js({"model_name": "h2", "url": url})),
        Http("multi-model invoke after reload", "POST", "/models/h2/invoke", call),
        Http("multi-model load an ensemble", "POST", "/models",
             _js({"model_name": "h3", "url": str(root / "h3" / "model")}),
             {"X-Amzn-SageMaker-Target-Model": "sums.tar.gz"}),
        Http("multi-model invoke the ensemble", "POST", "/models/h3/invoke", _js({"inputs": [
            {"name": "A", "shape": [1, 4], "datatype": "FP32", "data": [1, 2, 3, 4]},
            {"name": "B", "shape": [1, 4], "datatype": "FP32", "data": [4, 3, 2, 1]}]}),
            {"X-Amzn-SageMaker-Target-Model": "sums.tar.gz"}),
        Http("multi-model list with the ensemble", "GET", "/models"),
        Http("multi-model unload the ensemble", "DELETE", "/models/h3",
             headers={"X-Amzn-SageMaker-Target-Model": "sums.tar.gz"}),
        Http("multi-model step unloaded with it", "GET", "/v2/models/add_sub/ready"),
    ]


_PING = 6


def frames_cases() -> list[Frames]:
    """A client's PINGs on a connection with no call open (gRPC's ping policy, Triton's
    defaults: --grpc-http2-max-ping-strikes 2, 2 h between PINGs while idle)."""
    def pings(count: int) -> list[tuple[int, int, int, bytes]]:
        return [(_PING, 0, 0, n.to_bytes(8, "big")) for n in range(count)]
    return [Frames("three PINGs on an idle connection", pings(3)),
            Frames("four PINGs on an idle connection", pings(4))]


def packed_cases() -> list[Packed]:
    """Inference answers compressed at each level Triton's flag takes but none, for each
    grpc-accept-encoding a client may send (grpcio's: identity,deflate,gzip); a stream's; and
    a method that is not inference."""
    from tritonclient.grpc import service_pb2 as pb

    request = pb.ModelInferRequest(model_name="echo_fp32")
    tensor = request.inputs.add(name="IN", datatype="FP32")
    tensor.shape.extend([256])
    request.raw_input_contents.append(bytes(1024))
    infer = request.SerializeToString()
    cases = []
    for level in ("low", "medium", "high"):
        for accept in (None, "identity,deflate,gzip", "identity,gzip", "identity,deflate",
                       "identity"):
            cases.append(Packed(f"compressed {level}, accepting {accept}", level,
                                "ModelInfer", infer, accept))
        cases.append(Packed(f"compressed {level}, a stream", level, "ModelStreamInfer", infer,
                            "identity,deflate,gzip"))
        cases.append(Packed(f"compressed {level}, ServerLive", level, "ServerLive", b"",
                            "identity,deflate,gzip"))
    return cases
