"""The repository tools/triton_diff.py serves with Triton and with tensorgate: Python-backend
models written against Triton 2.51's Python backend (no response parameters, which 2.51's
pb_utils lacks), each there for cases of triton_diff_cases.py."""

from __future__ import annotations

import pathlib
import shutil
import textwrap

ROOT = pathlib.Path(__file__).resolve().parent.parent
TESTDATA = ROOT / "tests" / "testdata" / "triton_python"
DATATYPES = ("BOOL", "UINT8", "UINT16", "UINT64", "INT8", "INT32", "INT64", "FP16", "FP32",
             "FP64", "BF16", "STRING")

# OUT = IN (plus a number, for the versions that say which they are)
_ECHO = """\
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        return [pb_utils.InferenceResponse([pb_utils.Tensor(
            "OUT", pb_utils.get_input_tensor_by_name(r, "IN").as_numpy(){plus})])
            for r in requests]
"""

_ECHO_CONFIG = """\
name: "{name}"
backend: "python"
max_batch_size: {batch}
{extra}
input [ {{ name: "IN" data_type: TYPE_{datatype} dims: [ {dims} ] }} ]
output [ {{ name: "OUT" data_type: TYPE_{datatype} dims: [ {dims} ]{label} }} ]
"""

# decoupled: IN = n gets n responses (OUT = 0 .. n-1), then the final flag sent alone; with
# n < 0 one error response with the flag
_STREAM_COUNT = """\
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        for request in requests:
            sender = request.get_response_sender()
            count = int(pb_utils.get_input_tensor_by_name(request, "IN").as_numpy()[0])
            if count < 0:
                sender.send(pb_utils.InferenceResponse(error=pb_utils.TritonError(
                    "IN must not be negative")),
                    flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
                continue
            for value in range(count):
                sender.send(pb_utils.InferenceResponse(
                    [pb_utils.Tensor("OUT", np.array([value], np.int32))]))
            sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
"""

# decoupled: OUT = IN, sent with the final flag
_STREAM_ECHO = """\
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        for request in requests:
            sender = request.get_response_sender()
            value = pb_utils.get_input_tensor_by_name(request, "IN").as_numpy()
            sender.send(pb_utils.InferenceResponse([pb_utils.Tensor("OUT", value)]),
                        flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
"""

# a sequence's running sum of IN, kept by correlation id
_SEQUENCE_SUM = """\
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.sums = {}

    def execute(self, requests):
        responses = []
        for request in requests:
            key, flags = request.correlation_id(), request.flags()
            if flags & pb_utils.TRITONSERVER_REQUEST_FLAG_SEQUENCE_START:
                self.sums[key] = 0
            value = pb_utils.get_input_tensor_by_name(request, "IN").as_numpy()
            self.sums[key] = self.sums.get(key, 0) + int(value.sum())
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor(
                "SUM", np.array([[self.sums[key]]], np.int32))]))
            if flags & pb_utils.TRITONSERVER_REQUEST_FLAG_SEQUENCE_END:
                self.sums.pop(key, None)
        return responses
"""

# decoupled, IN (BYTES) saying how to answer through the response sender; OUT (BYTES) says
# what the model saw (an exception's type where a send was refused). "report" answers with
# what the last request's refused sends raised.
_STREAM_PROBE = """\
import threading

import numpy as np
import triton_python_backend_utils as pb_utils

FINAL = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL


def _out(text):
    return pb_utils.InferenceResponse([pb_utils.Tensor(
        "OUT", np.array([text.encode()], dtype=np.object_))])


class TritonPythonModel:
    def initialize(self, args):
        self.refused = []

    def _try(self, send):
        try:
            send()
        except Exception as error:  # what a refused send raises is the report
            self.refused.append(type(error).__name__)

    def execute(self, requests):
        for request in requests:
            how = pb_utils.get_input_tensor_by_name(request, "IN").as_numpy()[0].decode()
            sender = request.get_response_sender()
            if how == "report":
                sender.send(_out(",".join(self.refused) or "-"), flags=FINAL)
                self.refused = []
            elif how == "send after the final flag":
                sender.send(_out("one"), flags=FINAL)
                self._try(lambda: sender.send(_out("two")))
                self._try(lambda: sender.send(flags=FINAL))
            elif how == "send what is not a response":
                self._try(lambda: sender.send("text"))
                sender.send(_out("after"), flags=FINAL)
            elif how == "an error, then more":
                sender.send(pb_utils.InferenceResponse(error=pb_utils.TritonError("first")))
                sender.send(_out("second"), flags=FINAL)
            elif how == "an error with the final flag":
                sender.send(pb_utils.InferenceResponse(error=pb_utils.TritonError(
                    "last", pb_utils.TritonError.INVALID_ARG)), flags=FINAL)
            elif how == "raise":
                raise pb_utils.TritonModelException("raised in a decoupled execute")
            elif how == "return a list":
                return [_out("listed")]
            elif how == "from a thread":
                threading.Thread(target=lambda s=sender: (
                    s.send(_out("threaded")), s.send(flags=FINAL))).start()
            elif how == "cancelled?":
                sender.send(_out(str(sender.is_cancelled())), flags=FINAL)
            else:
                sender.send(_out("unknown: " + how), flags=FINAL)
        return None
"""

# what a model's execute saw, from its load's model_warmup samples on: each call's requests
# (ids, flags, inputs' shapes and datatypes, and their values where they are zeros), all of
# it in SEEN
_WARMED = """\
import json

import numpy as np
import triton_python_backend_utils as pb_utils


def _tensor(request, name):
    value = pb_utils.get_input_tensor_by_name(request, name).as_numpy()
    zeros = value.dtype == object and all(v == b"" for v in value.flat) or \\
        value.dtype != object and not value.any()
    shown = value.tolist() if value.dtype != object else [v.decode() for v in value.flat]
    return [list(value.shape), str(value.dtype), shown if zeros else "random"]


class TritonPythonModel:
    def initialize(self, args):
        self.seen = []

    def execute(self, requests):
        self.seen.append([{"id": r.request_id(), "flags": r.flags(),
                           "TEXT": _tensor(r, "TEXT"), "NUM": _tensor(r, "NUM")}
                          for r in requests])
        answer = np.array([[json.dumps(self.seen).encode()]], dtype=np.object_)
        return [pb_utils.InferenceResponse([pb_utils.Tensor("SEEN", answer)])
                for _ in requests]
"""

_WARMED_CONFIG = """\
name: "warmed"
backend: "python"
max_batch_size: 4
input [ { name: "TEXT" data_type: TYPE_STRING dims: [ 2 ] },
        { name: "NUM" data_type: TYPE_FP32 dims: [ 3 ] } ]
output [ { name: "SEEN" data_type: TYPE_STRING dims: [ 1 ] } ]
metric_tags { key: "team" value: "diff" }
model_warmup [
  { name: "zeros" batch_size: 2
    inputs { key: "TEXT" value: { data_type: TYPE_STRING dims: [ 2 ] zero_data: true } }
    inputs { key: "NUM" value: { data_type: TYPE_FP32 dims: [ 3 ] zero_data: true } } },
  { name: "random" batch_size: 1 count: 2
    inputs { key: "TEXT" value: { data_type: TYPE_STRING dims: [ 2 ] random_data: true } }
    inputs { key: "NUM" value: { data_type: TYPE_FP32 dims: [ 3 ] random_data: true } } }
]
"""

# an echo whose load fails while its folder holds a file "fail"
_FRAGILE = """\
import os

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        if os.path.exists(os.path.join(args["model_repository"], "fail")):
            raise pb_utils.TritonModelException("asked to fail")

    def execute(self, requests):
        return [pb_utils.InferenceResponse([pb_utils.Tensor(
            "OUT", pb_utils.get_input_tensor_by_name(r, "IN").as_numpy())]) for r in requests]
"""

_ENSEMBLE = """\
name: "ensemble_add"
platform: "ensemble"
max_batch_size: 8
input [ { name: "A" data_type: TYPE_FP32 dims: [ 4 ] },
        { name: "B" data_type: TYPE_FP32 dims: [ 4 ] } ]
output [ { name: "SUM" data_type: TYPE_FP32 dims: [ 4 ] },
         { name: "DIFF" data_type: TYPE_FP32 dims: [ 4 ] } ]
ensemble_scheduling { step [ {
  model_name: "add_sub" model_version: -1
  input_map { key: "INPUT0" value: "A" } input_map { key: "INPUT1" value: "B" }
  output_map { key: "OUTPUT0" value: "SUM" } output_map { key: "OUTPUT1" value: "DIFF" }
} ] }
"""

# tools/triton_diff_probe.py's model: what a Python model sees, reported as JSON
_PROBE_CONFIG = """\
name: "probe"
backend: "python"
max_batch_size: 0
input [ { name: "IN" data_type: TYPE_STRING dims: [ 1 ] } ]
output [ { name: "OUT" data_type: TYPE_STRING dims: [ 1 ] } ]
parameters { key: "colour" value: { string_value: "blue" } }
instance_group [ { count: 1 kind: KIND_CPU } ]
"""

_POLICIES = {"versions_all": "all { }", "versions_latest": "latest { num_versions: 1 }",
             "versions_specific": "specific { versions: [ 1, 3 ] }"}


def write_repository(root: pathlib.Path) -> None:
    """add_sub and int_double from tests/testdata, an echo model per datatype, and one model
    for each thing a case looks at (streams, sequences, classes, versions, a failed load,
    an ensemble, the Python backend's API as a model sees it)."""
    for model in ("add_sub", "int_double", "auto_complete"):  # the last has no config.pbtxt
        shutil.copytree(TESTDATA / model, root / model)
    for datatype in DATATYPES:
        _echo(root, f"echo_{datatype.lower()}", datatype)
    _echo(root, "echo_text", "STRING", dims="1")  # one element: what a raw body can be
    _echo(root, "classes", "FP32", label=' label_filename: "labels.txt"')
    (root / "classes" / "labels.txt").write_text("cat\ndog\nbird\n")  # fewer than scores
    for name, source, datatype in (("stream_echo", _STREAM_ECHO, "INT32"),
                                   ("stream_count", _STREAM_COUNT, "INT32"),
                                   ("stream_probe", _STREAM_PROBE, "STRING")):
        _model(root, name, _ECHO_CONFIG.format(
            name=name, batch=0, extra="model_transaction_policy { decoupled: true }",
            datatype=datatype, dims="1", label=""), {1: source})
    _model(root, "sequence_sum", _ECHO_CONFIG.format(
        name="sequence_sum", batch=4, datatype="INT32", dims="1", label="",
        extra="sequence_batching { max_sequence_idle_microseconds: 5000000 }",
    ).replace('name: "OUT"', 'name: "SUM"'), {1: _SEQUENCE_SUM})
    _model(root, "fragile", _ECHO_CONFIG.format(name="fragile", batch=0, extra="",
                                                 datatype="INT32", dims="-1", label=""),
           {1: _FRAGILE})
    for name, policy in _POLICIES.items():  # version v answers IN + v
        _model(root, name, _ECHO_CONFIG.format(
            name=name, batch=4, datatype="INT32", dims="1", label="",
            extra=f"version_policy {{ {policy} }}\n"
                  "dynamic_batching { priority_levels: 2 default_priority_level: 2 }"),
            {v: _ECHO.format(plus=f" + {v}") for v in (1, 2, 3)})
    _model(root, "ensemble_add", _ENSEMBLE, {1: None})
    _model(root, "warmed", _WARMED_CONFIG, {1: _WARMED})
    _model(root, "probe", _PROBE_CONFIG, {1: (ROOT / "tools" / "triton_diff_probe.py"
                                              ).read_text()})
    _named_configs(root)


CONFIG_NAME = "diff"  # both servers run with --model-config-name diff


def _named_configs(root: pathlib.Path) -> None:
    """Models for --model-config-name: one whose configs/diff.pbtxt batches where its
    config.pbtxt does not, one with another machine's config only (configs/v100.pbtxt), one
    whose only config is configs/diff.pbtxt."""
    def config(name: str, batch: int) -> str:
        return _ECHO_CONFIG.format(name=name, batch=batch, extra="", datatype="INT32",
                                   dims="1", label="")

    for name, named in (("named_config", {CONFIG_NAME: 4}), ("other_config", {"v100": 4}),
                        ("named_only", {CONFIG_NAME: 2})):
        _model(root, name, config(name, 0), {1: _ECHO.format(plus="")})
        if name == "named_only":
            (root / name / "config.pbtxt").unlink()
        (root / name / "configs").mkdir()
        for file, batch in named.items():
            (root / name / "configs" / f"{file}.pbtxt").write_text(config(name, batch))


def _echo(root: pathlib.Path, name: str, datatype: str, dims: str = "-1",
          label: str = "") -> None:
    _model(root, name, _ECHO_CONFIG.format(name=name, batch=0, extra="", datatype=datatype,
                                           dims=dims, label=label),
           {1: _ECHO.format(plus="")})


def _model(root: pathlib.Path, name: str, config: str,
           versions: dict[int, str | None]) -> None:
    """Model `name`: its config.pbtxt, and each version's folder with its model.py (None:
    an empty folder, an ensemble's)."""
    folder = root / name
    folder.mkdir(parents=True)
    (folder / "config.pbtxt").write_text(textwrap.dedent(config))
    for version, source in versions.items():
        (folder / str(version)).mkdir()
        if source is not None:
            (folder / str(version) / "model.py").write_text(source)
