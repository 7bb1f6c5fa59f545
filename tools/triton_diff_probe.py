"""The `probe` model of tools/triton_diff.py's repository (copied there as its model.py):
what a Python model sees of its server — `args`, its config as JSON, pb_utils's names and
helpers, its requests, tensors, errors, BLS — reported as JSON, so that the same probe run
on Triton and on tensorgate shows where the two Python backends differ.

IN (BYTES [1]) names the probe; OUT (BYTES [1]) is its report: a JSON object. A probe
that fails reports {"raised": the exception's type, "error": its words}; the words are
masked when compared, the type is not. The `execute ...` probes instead answer in a way
whose handling by the server is compared (an error response, a raise, a wrong output).
"""

import json
import os

import numpy as np
import triton_python_backend_utils as pb_utils

_TYPES = ("TYPE_BOOL", "TYPE_UINT8", "TYPE_UINT16", "TYPE_UINT32", "TYPE_UINT64",
          "TYPE_INT8", "TYPE_INT16", "TYPE_INT32", "TYPE_INT64", "TYPE_FP16", "TYPE_FP32",
          "TYPE_FP64", "TYPE_STRING", "TYPE_BF16")
_NUMPY = (np.bool_, np.uint8, np.uint16, np.uint32, np.uint64, np.int8, np.int16, np.int32,
          np.int64, np.float16, np.float32, np.float64, np.object_, np.bytes_, np.str_,
          np.complex64)


def _plain(value):
    """`value` as JSON can hold it, saying what it was."""
    if isinstance(value, np.ndarray):
        return {"ndarray": str(value.dtype), "shape": list(value.shape),
                "values": _plain(value.tolist()),
                "contiguous": bool(value.flags["C_CONTIGUOUS"])}
    if isinstance(value, (bytes, bytearray)):
        return f"bytes:{bytes(value)!r}"
    if isinstance(value, (list, tuple)):
        return [_plain(item) for item in value]
    if isinstance(value, dict):
        return {str(key): _plain(item) for key, item in value.items()}
    if isinstance(value, (bool, int, float, str)) or value is None:
        return value
    if isinstance(value, np.generic):
        return {type(value).__name__: _plain(value.item())}
    if isinstance(value, type):  # numpy's by their dtype's name, not numpy 1 or 2's type's
        if issubclass(value, np.generic):
            return f"numpy:{np.dtype(value).name}"
        return f"type:{value.__module__}.{value.__name__}"
    if hasattr(value, "__index__"):  # Triton's error codes and memory types are enums
        return int(value)
    if isinstance(value, np.dtype):
        return f"dtype:{value}"
    return f"{type(value).__name__}"


def _attempt(call):
    try:
        return {"value": _plain(call())}
    except Exception as error:  # noqa: BLE001 - what was raised is the report
        return {"raised": type(error).__name__, "error": str(error)}


def _torch():
    import torch  # both servers' environments have it; only this probe needs it
    return torch


def _public(thing):
    return sorted(name for name in dir(thing) if not name.startswith("_"))


def _tensor(make):
    """A Tensor made by `make`, and what its accessors say."""
    def report():
        tensor = make()
        return {"name": tensor.name(), "shape": _plain(tensor.shape()),
                "is_cpu": tensor.is_cpu(), "as_numpy": _attempt(tensor.as_numpy)}
    return _attempt(report)


class TritonPythonModel:
    def initialize(self, args):
        self.args = dict(args)
        self.config = json.loads(args["model_config"])
        # custom metrics, which the tool reads back from each server's /metrics
        # (each family kept as long as its metrics: Triton's refuses a metric its family
        # outlived)
        family = pb_utils.MetricFamily
        self.families = [
            family(name="probe_requests", description="requests the probe saw",
                   kind=family.COUNTER),
            family(name="probe_last_length", description="the last IN's length",
                   kind=family.GAUGE),
            family(name="probe_lengths", description="IN's lengths", kind=family.HISTOGRAM)]
        self.counted = self.families[0].Metric(labels={"model": "probe"})
        self.length = self.families[1].Metric(labels={"model": "probe", "k": "v"})
        self.lengths = self.families[2].Metric(labels={}, buckets=[4, 16, 64])

    def execute(self, requests):
        whats = [pb_utils.get_input_tensor_by_name(request, "IN").as_numpy()[0].decode()
                 for request in requests]
        if "execute through the sender" in whats:  # a model not decoupled may, since 23.10
            for request in requests:
                request.get_response_sender().send(pb_utils.InferenceResponse([
                    pb_utils.Tensor("OUT", np.array([b"sent"], dtype=np.object_))]),
                    flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
            return None
        if "execute an empty list" in whats:
            return []
        responses = []
        for what in whats:
            self.counted.increment(1)
            self.length.set(len(what))
            self.lengths.observe(len(what))
        for request, what in zip(requests, whats):
            if what.startswith("execute "):
                responses.append(self._answer(what[8:]))
                continue
            report = getattr(self, "probe_" + what.replace(" ", "_"))(request)
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor(
                "OUT", np.array([json.dumps(report, sort_keys=True)], dtype=np.object_))]))
        return responses

    # -- what initialize was given ----------------------------------------------------------

    def probe_args(self, request):
        shown = {key: value for key, value in self.args.items()
                 if key not in ("model_config", "model_repository")}
        shown["model_repository"] = os.path.basename(self.args["model_repository"])
        shown["keys"] = sorted(self.args)
        shown["types"] = sorted({type(value).__name__ for value in self.args.values()})
        shown["get_model_dir"] = _attempt(lambda: [os.path.basename(pb_utils.get_model_dir()),
                                                   pb_utils.get_model_dir() == self.args[
                                                       "model_repository"]])
        return shown

    def probe_config(self, request):
        return self.config

    def probe_config_helpers(self, request):
        out = pb_utils.get_output_config_by_name(self.config, "OUT")
        return {
            "input IN": pb_utils.get_input_config_by_name(self.config, "IN"),
            "input NOPE": pb_utils.get_input_config_by_name(self.config, "NOPE"),
            "output OUT": out,
            "output type": _plain(pb_utils.triton_string_to_numpy(out["data_type"])),
            "decoupled": _attempt(lambda: pb_utils.using_decoupled_model_transaction_policy(
                self.config)),
        }

    # -- pb_utils's names -------------------------------------------------------------------

    def probe_api_module(self, request):
        return _public(pb_utils)

    def probe_api_classes(self, request):
        return {name: _public(getattr(pb_utils, name)) for name in (
            "Tensor", "InferenceRequest", "InferenceResponse", "TritonError", "Logger",
            "ModelConfig", "TritonModelException", "MetricFamily", "Metric", "PreferredMemory")
            if hasattr(pb_utils, name)}

    def probe_api_request(self, request):
        return {"type": type(request).__name__, "names": _public(request)}

    def probe_constants(self, request):
        names = [name for name in _public(pb_utils) if name.isupper()]
        codes = [name for name in _public(pb_utils.TritonError) if name.isupper()]
        return {"pb_utils": {name: _plain(getattr(pb_utils, name)) for name in names},
                "TritonError": {name: _plain(getattr(pb_utils.TritonError, name))
                                for name in codes}}

    # -- pb_utils's helpers -----------------------------------------------------------------

    def probe_types(self, request):
        return {
            "triton_string_to_numpy": {name: _attempt(
                lambda name=name: pb_utils.triton_string_to_numpy(name)) for name in _TYPES},
            "triton_to_numpy_type": {number: _attempt(
                lambda number=number: pb_utils.triton_to_numpy_type(number))
                for number in range(0, 16)},
            "numpy_to_triton_type": {np.dtype(kind).name: _attempt(
                lambda kind=kind: pb_utils.numpy_to_triton_type(kind)) for kind in _NUMPY},
        }

    def probe_bytes_helpers(self, request):
        arrays = {
            "bytes": np.array([b"a", b"bc"], dtype=np.object_),
            "str": np.array(["a", "\u00e9"], dtype=np.object_),
            "unicode": np.array(["ab", "c"]),
            "fixed bytes": np.array([b"ab", b"c"]),
            "2-d": np.array([[b"a"], [b"b"]], dtype=np.object_),
            "empty": np.array([], dtype=np.object_),
            "numbers": np.array([1, 2], dtype=np.int32),
            "ints in object": np.array([1, 2], dtype=np.object_),
        }
        report = {name: _attempt(lambda array=array: pb_utils.serialize_byte_tensor(array))
                  for name, array in arrays.items()}
        report["deserialize"] = _attempt(lambda: pb_utils.deserialize_bytes_tensor(
            b"\x01\x00\x00\x00a\x00\x00\x00\x00"))
        return report

    def probe_tensors(self, request):
        return {
            "float32": _tensor(lambda: pb_utils.Tensor("A", np.arange(6, dtype=np.float32
                                                                           ).reshape(2, 3))),
            "scalar": _tensor(lambda: pb_utils.Tensor("B", np.array(3, np.int64))),
            "strided": _tensor(lambda: pb_utils.Tensor(
                "C", np.arange(8, dtype=np.int32)[::2])),
            "transposed": _tensor(lambda: pb_utils.Tensor(
                "D", np.arange(6, dtype=np.int16).reshape(2, 3).T)),
            "list": _tensor(lambda: pb_utils.Tensor("E", [1, 2])),
            "object str": _tensor(lambda: pb_utils.Tensor(
                "F", np.array(["x", "y"], dtype=np.object_))),
            "object bytes": _tensor(lambda: pb_utils.Tensor(
                "G", np.array([b"x"], dtype=np.object_))),
            "unicode": _tensor(lambda: pb_utils.Tensor("H", np.array(["x"]))),
            "bool": _tensor(lambda: pb_utils.Tensor("I", np.array([True, False]))),
            "complex": _tensor(lambda: pb_utils.Tensor("J", np.array([1j]))),
            "uint32": _tensor(lambda: pb_utils.Tensor("K", np.array([7], np.uint32))),
            "from_dlpack": _tensor(lambda: pb_utils.Tensor.from_dlpack(
                "L", _torch().arange(3, dtype=_torch().float32))),
            "from_dlpack capsule": _tensor(lambda: pb_utils.Tensor.from_dlpack(
                "N", _torch().utils.dlpack.to_dlpack(_torch().arange(2)))),
            "to_dlpack back": _attempt(lambda: _torch().utils.dlpack.from_dlpack(
                pb_utils.Tensor("M", np.arange(3, dtype=np.float64)).to_dlpack()).numpy()),
        }

    def probe_response(self, request):
        tensor = pb_utils.Tensor("T", np.array([1], np.int32))
        plain = pb_utils.InferenceResponse([tensor])
        failed = pb_utils.InferenceResponse(error=pb_utils.TritonError("no"))
        return {
            "outputs": [t.name() for t in plain.output_tensors()],
            "has_error": plain.has_error(), "error": _plain(plain.error()),
            "failed has_error": failed.has_error(),
            "failed outputs": len(failed.output_tensors()),
            "failed code": int(failed.error().code()),
            "error code default": int(pb_utils.TritonError("x").code()),
            "error code given": int(pb_utils.TritonError(
                "x", pb_utils.TritonError.NOT_FOUND).code()),
            "error message": pb_utils.TritonError("words").message(),
            "get_output_tensor_by_name": pb_utils.get_output_tensor_by_name(plain, "T").name(),
            "get_output_tensor_by_name missing": _plain(
                pb_utils.get_output_tensor_by_name(plain, "U")),
            "outputs not a list": _attempt(lambda: pb_utils.InferenceResponse(tensor)),
            "exception message": _attempt(
                lambda: pb_utils.TritonModelException("m").message()),
        }

    # -- the request itself -----------------------------------------------------------------

    def probe_preferred_memory(self, request):
        memory = pb_utils.PreferredMemory(pb_utils.TRITONSERVER_MEMORY_GPU, 1)
        return {name: _plain(getattr(memory, name)) for name in _public(memory)}

    def probe_request(self, request):
        given = [(t.name(), _plain(t.shape()), str(t.as_numpy().dtype), t.is_cpu())
                 for t in request.inputs()]
        return {
            "request_id": request.request_id(),
            "correlation_id": _plain(request.correlation_id()),
            "flags": request.flags(),
            "requested_output_names": sorted(request.requested_output_names()),
            "parameters": _attempt(lambda: json.loads(request.parameters())),
            "timeout": _attempt(request.timeout),
            "inputs": given,
            "missing input": _plain(pb_utils.get_input_tensor_by_name(request, "NOPE")),
            "is_cancelled": request.is_cancelled(),
            "as_numpy writeable": bool(request.inputs()[0].as_numpy().flags["WRITEABLE"]),
            "response sender": _attempt(lambda: type(request.get_response_sender()).__name__),
        }

    # -- BLS --------------------------------------------------------------------------------

    def _bls(self, model, inputs, outputs=(), **more):
        def run():
            response = pb_utils.InferenceRequest(
                model_name=model, inputs=inputs, requested_output_names=list(outputs),
                **more).exec()
            if response.has_error():
                return {"error": response.error().message(),
                        "code": int(response.error().code())}
            return {t.name(): _plain(t.as_numpy()) for t in response.output_tensors()}
        return _attempt(run)

    @staticmethod
    def _bls_stream(model, value):
        """A decoupled model's responses to IN = value, each as its outputs."""
        return _attempt(lambda: [
            {t.name(): _plain(t.as_numpy()) for t in response.output_tensors()}
            for response in pb_utils.InferenceRequest(
                model_name=model, requested_output_names=["OUT"],
                inputs=[pb_utils.Tensor("IN", np.array([value], np.int32))]).exec(
                    decoupled=True)])

    def probe_bls(self, request):
        four = np.array([[1, 2, 3, 4]], np.float32)
        pair = [pb_utils.Tensor("INPUT0", four), pb_utils.Tensor("INPUT1", four)]
        return {
            "add_sub": self._bls("add_sub", pair, ["OUTPUT0", "OUTPUT1"]),
            "one output": self._bls("add_sub", pair, ["OUTPUT1"]),
            "no outputs asked": self._bls("add_sub", pair),
            "unknown output": self._bls("add_sub", pair, ["NOPE"]),
            "missing input": self._bls("add_sub", pair[:1], ["OUTPUT0"]),
            "wrong datatype": self._bls("add_sub", [pb_utils.Tensor(
                "INPUT0", four.astype(np.float64)), pair[1]], ["OUTPUT0"]),
            "no model": self._bls("nope", pair, ["OUTPUT0"]),
            "decoupled without decoupled=True": self._bls(
                "stream_echo", [pb_utils.Tensor("IN", np.array([3], np.int32))], ["OUT"]),
            "decoupled": self._bls_stream("stream_count", 2),
            "decoupled, the final flag with the last": self._bls_stream("stream_echo", 4),
            "preferred memory": self._bls("add_sub", pair, ["OUTPUT0"], preferred_memory=(
                pb_utils.PreferredMemory(pb_utils.TRITONSERVER_MEMORY_CPU, 0))),
            "model ready": _attempt(lambda: pb_utils.is_model_ready("add_sub")),
            "model ready nope": _attempt(lambda: pb_utils.is_model_ready("nope")),
        }

    # -- answers the server has to handle ---------------------------------------------------

    def _answer(self, how):
        text = np.array([b"x"], dtype=np.object_)
        if how == "error response":
            return pb_utils.InferenceResponse(error=pb_utils.TritonError("refused here"))
        if how.startswith("error code "):
            code = getattr(pb_utils.TritonError, how[11:])
            return pb_utils.InferenceResponse(error=pb_utils.TritonError("coded", code))
        if how == "raise":
            raise pb_utils.TritonModelException("raised here")
        if how == "raise ValueError":
            raise ValueError("a plain exception")
        if how == "output wrong datatype":
            return pb_utils.InferenceResponse([pb_utils.Tensor("OUT", np.array([1.5]))])
        if how == "output wrong shape":
            return pb_utils.InferenceResponse([pb_utils.Tensor(
                "OUT", np.array([b"a", b"b"], dtype=np.object_))])
        if how == "output unknown":
            return pb_utils.InferenceResponse([pb_utils.Tensor("OUT", text),
                                               pb_utils.Tensor("EXTRA", text)])
        if how == "output missing":
            return pb_utils.InferenceResponse([])
        if how == "output twice":
            return pb_utils.InferenceResponse([pb_utils.Tensor("OUT", text),
                                               pb_utils.Tensor("OUT", text)])
        if how == "not a response":
            return "a string"
        raise pb_utils.TritonModelException(f"no such answer: {how}")
