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


def write_repository(root: pathlib.Path) -> None:
    """Triton-compatible models of tests/testdata (add_sub, int_double) and an echo model
    per datatype, written against Triton 2.51's Python backend (no response parameters)."""
    for model in ("add_sub", "int_double"):
        shutil.copytree(TESTDATA / model, root / model)
    for datatype in DATATYPES:
        folder = root / f"echo_{datatype.lower()}"
        (folder / "1").mkdir(parents=True)
        (folder / "config.pbtxt").write_text(textwrap.dedent(f"""\
            name: "echo_{datatype.lower()}"
            backend: "python"
            max_batch_size: 0
            input [ {{ name: "IN" data_type: TYPE_{datatype} dims: [ -1 ] }} ]
            output [ {{ name: "OUT" data_type: TYPE_{datatype} dims: [ -1 ] }} ]
            """))
        (folder / "1" / "model.py").write_text(textwrap.dedent("""\
            import triton_python_backend_utils as pb_utils


            class TritonPythonModel:
                def execute(self, requests):
                    return [pb_utils.InferenceResponse([pb_utils.Tensor(
                        "OUT", pb_utils.get_input_tensor_by_name(r, "IN").as_numpy())])
                        for r in requests]
            """))
    folder = root / "stream_echo"
    (folder / "1").mkdir(parents=True)
    (folder / "config.pbtxt").write_text(textwrap.dedent("""\
        name: "stream_echo"
        backend: "python"
        max_batch_size: 0
        model_transaction_policy { decoupled: true }
        input [ { name: "IN" data_type: TYPE_INT32 dims: [ 1 ] } ]
        output [ { name: "OUT" data_type: TYPE_INT32 dims: [ 1 ] } ]
        """))
    (folder / "1" / "model.py").write_text(textwrap.dedent("""\
        import triton_python_backend_utils as pb_utils


        class TritonPythonModel:
            def execute(self, requests):
                for request in requests:
                    sender = request.get_response_sender()
                    value = pb_utils.get_input_tensor_by_name(request, "IN").as_numpy()
                    sender.send(pb_utils.InferenceResponse([pb_utils.Tensor("OUT", value)]),
                                flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        """))
    _stream_count(root)
    folder = root / "classes"
    (folder / "1").mkdir(parents=True)
    (folder / "config.pbtxt").write_text(
        (root / "echo_fp32" / "config.pbtxt").read_text().replace("echo_fp32", "classes")
        .replace('"OUT" data_type: TYPE_FP32 dims: [ -1 ]',
                 '"OUT" data_type: TYPE_FP32 dims: [ -1 ] label_filename: "labels.txt"'))
    (folder / "labels.txt").write_text("cat\ndog\nbird\n")  # fewer than the scores
    shutil.copy(root / "echo_fp32" / "1" / "model.py", folder / "1" / "model.py")
    folder = root / "sequence_sum"
    (folder / "1").mkdir(parents=True)
    (folder / "config.pbtxt").write_text(textwrap.dedent("""\
        name: "sequence_sum"
        backend: "python"
        max_batch_size: 4
        sequence_batching { max_sequence_idle_microseconds: 5000000 }
        input [ { name: "IN" data_type: TYPE_INT32 dims: [ 1 ] } ]
        output [ { name: "SUM" data_type: TYPE_INT32 dims: [ 1 ] } ]
        instance_group [ { count: 1 kind: KIND_CPU } ]
        """))
    (folder / "1" / "model.py").write_text(textwrap.dedent("""\
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
        """))
    folder = root / "echo_text"  # one BYTES element: what a raw binary body can be
    shutil.copytree(root / "echo_string", folder)
    (folder / "config.pbtxt").write_text((folder / "config.pbtxt").read_text().replace(
        "echo_string", "echo_text").replace("dims: [ -1 ]", "dims: [ 1 ]"))
    folder = root / "fragile"
    (folder / "1").mkdir(parents=True)
    (folder / "config.pbtxt").write_text(
        (root / "echo_int32" / "config.pbtxt").read_text().replace("echo_int32", "fragile"))
    (folder / "1" / "model.py").write_text(textwrap.dedent("""\
        import os

        import triton_python_backend_utils as pb_utils


        class TritonPythonModel:
            def initialize(self, args):  # fails while its folder holds a file "fail"
                if os.path.exists(os.path.join(args["model_repository"], "fail")):
                    raise pb_utils.TritonModelException("asked to fail")

            def execute(self, requests):
                return [pb_utils.InferenceResponse([pb_utils.Tensor(
                    "OUT", pb_utils.get_input_tensor_by_name(r, "IN").as_numpy())])
                    for r in requests]
        """))
    for name, policy in (("versions_all", "all { }"), ("versions_latest", "latest { num_versions: 1 }"),
                         ("versions_specific", "specific { versions: [ 1, 3 ] }")):
        folder = root / name
        (folder / "config.pbtxt").parent.mkdir(parents=True)
        (folder / "config.pbtxt").write_text(textwrap.dedent(f"""\
            name: "{name}"
            backend: "python"
            max_batch_size: 4
            version_policy {{ {policy} }}
            dynamic_batching {{ priority_levels: 2 default_priority_level: 2 }}
            input [ {{ name: "IN" data_type: TYPE_INT32 dims: [ 1 ] }} ]
            output [ {{ name: "OUT" data_type: TYPE_INT32 dims: [ 1 ] }} ]
            """))
        for version in (1, 2, 3):  # each answers IN plus its version
            (folder / str(version)).mkdir()
            (folder / str(version) / "model.py").write_text(textwrap.dedent(f"""\
                import triton_python_backend_utils as pb_utils


                class TritonPythonModel:
                    def execute(self, requests):
                        return [pb_utils.InferenceResponse([pb_utils.Tensor("OUT",
                            pb_utils.get_input_tensor_by_name(r, "IN").as_numpy() + {version})])
                            for r in requests]
                """))
    folder = root / "ensemble_add"
    (folder / "1").mkdir(parents=True)
    (folder / "config.pbtxt").write_text(textwrap.dedent("""\
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
        """))


def _stream_count(root: pathlib.Path) -> None:
    """IN = n: n responses (OUT = 0 .. n-1), then the final flag sent alone."""
    folder = root / "stream_count"
    (folder / "1").mkdir(parents=True)
    (folder / "config.pbtxt").write_text(
        (root / "stream_echo" / "config.pbtxt").read_text().replace("stream_echo",
                                                                      "stream_count"))
    (folder / "1" / "model.py").write_text(textwrap.dedent("""\
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
        """))
