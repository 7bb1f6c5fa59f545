"""The one handler behind every front end: health, metadata, config, statistics, repository
control and inference. Front ends decode, call this, and encode; they know nothing else."""

from __future__ import annotations

import pathlib
import struct
from collections.abc import AsyncGenerator
from typing import Any

import numpy as np

from tensorgate.errors import (InvalidArgumentError, NotFoundError, UnavailableError,
                              UnimplementedError)
from tensorgate.log_settings import LogSettings
from tensorgate.pipeline.engine import Engine, InferenceRequest, InferenceResult
from tensorgate.pipeline.postprocess import topk_classify
from tensorgate.pipeline.trace import Trace
from tensorgate.pipeline.work import SequenceFlags
from tensorgate.protocol.generate_codec import GenerateInput, generate_request
from tensorgate.protocol.infer_codec import MAX_JSON_VALUES, DecodedRequest, json_values_bounded
from tensorgate.protocol.request_parameters import model_parameters
from tensorgate.repository.model_config import ModelSpec
from tensorgate.repository.upload import UploadedFiles
from tensorgate.tensor.copies import CopyLedger, record_copy
from tensorgate.tensor.pinned import cuda_available
from tensorgate.tensor.shm import SharedMemoryRegistry
from tensorgate.tensor.view import TensorView
from tensorgate.tracing import Tracer

__all__ = ["EXTENSIONS", "Answer", "DataPlane", "parse_version"]

# What inference gives a front end: the result, the outputs to send, which of them go as
# binary, and which were written into shared-memory regions (region, offset, byte_size).
Answer = tuple[InferenceResult, dict[str, TensorView], dict[str, bool],
               dict[str, tuple[str, int, int]]]

# Exactly what is implemented; tritonclient and perf_analyzer read this list.
EXTENSIONS = ["binary_tensor_data", "classification", "generate", "logging",
              "model_configuration", "model_repository", "model_repository(unload_dependents)",
              "parameters", "schedule_policy", "sequence", "sequence(string_id)", "statistics",
              "trace"]


def parse_version(text: str | None) -> int | None:
    """A URL or message version: "" means the latest; otherwise decimal, not starting with 0."""
    if not text:
        return None
    if not text.isdecimal() or text.startswith("0"):
        raise NotFoundError(f"model version '{text}' is not a version number")
    return int(text)


def _one_repository(repository: str) -> None:
    """A request may name its repository (/v2/repository/{name}/..., gRPC repository_name);
    the server serves one, so a name is refused as Triton refuses it, not read as that one
    (a client that meant another server's repository must not act on this one's models)."""
    if repository:
        raise UnimplementedError(f"repository '{repository}': naming a repository is not "
                                 "supported: the server serves one model repository; leave "
                                 "the name out (POST /v2/repository/index, "
                                 "/v2/repository/models/{model}/load)")


class DataPlane:
    def __init__(self, engine: Engine, version: str, allow_shared_memory: bool = False,
                 model_control_mode: str = "none", log_settings: LogSettings | None = None,
                 tracer: Tracer | None = None, strict_readiness: bool = True,
                 server_id: str = "tensorgate") -> None:
        """`model_control_mode` other than "explicit" refuses the load/unload API, as in
        Triton: what is served is then the repository's business, not any client's.
        `strict_readiness` (Triton's default): the server is ready only while no model
        it should serve failed to load. `server_id`: its name in the server metadata."""
        self.engine = engine
        self.log_settings = log_settings or LogSettings()
        self.tracer = tracer or Tracer()
        self.model_control_mode = model_control_mode
        self.strict_readiness = strict_readiness
        self.version = version
        self.server_id = server_id
        self.started = False
        self.shm = SharedMemoryRegistry(allow_shared_memory)
        self.extensions = EXTENSIONS + (["system_shared_memory"] if allow_shared_memory else [])
        if allow_shared_memory and cuda_available():
            self.extensions.append("cuda_shared_memory")

    # -- health and metadata ---------------------------------------------------------------

    def live(self) -> bool:
        return True

    def ready(self) -> bool:
        """Triton's server readiness: started and not shutting down, and with strict
        readiness every model it tried to load serving (one unloaded through the API is
        not missing)."""
        if not (self.started and self.engine.is_serving()):
            return False
        return not (self.strict_readiness and self.engine.unavailable())

    def server_metadata(self) -> dict[str, Any]:
        return {"name": self.server_id, "version": self.version, "extensions": self.extensions}

    def model_ready(self, name: str, version: str | None) -> bool:
        try:
            return self.engine.is_ready(name, parse_version(version))
        except NotFoundError:
            return False

    def model_metadata(self, name: str, version: str | None) -> dict[str, Any]:
        spec = self.engine.spec(name, parse_version(version))
        batch = [-1] if spec.max_batch_size > 0 else []
        return {
            "name": spec.name,
            "versions": [str(v) for v in self.engine.versions(name)],
            "platform": spec.platform or spec.backend,
            "inputs": [{"name": i.name, "datatype": i.datatype.name,
                        "shape": batch + list(i.dims)} for i in spec.inputs],
            "outputs": [{"name": o.name, "datatype": o.datatype.name,
                         "shape": batch + list(o.dims)} for o in spec.outputs],
        }

    def model_config(self, name: str, version: str | None) -> dict[str, Any]:
        return self.engine.spec(name, parse_version(version)).config_dict()

    def statistics(self, name: str | None, version: str | None) -> dict[str, Any]:
        return {"model_stats": self.engine.statistics(name or None, parse_version(version))}

    # -- repository ------------------------------------------------------------------------

    def repository_index(self, ready_only: bool = False,
                         repository: str = "") -> list[dict[str, str]]:
        """`repository`: the name a request gave its repository, which must be none."""
        _one_repository(repository)
        index = self.engine.index()
        return [e for e in index if e.get("state") == "READY"] if ready_only else index

    async def load(self, name: str, config: str | None = None, repository: str = "",
                   files: UploadedFiles | None = None) -> None:
        """`config`: a JSON model config to load with instead of the repository's; `files`:
        the model's folder, uploaded (path → content; the engine takes them only with
        --allow-model-upload)."""
        _one_repository(repository)
        self.check_model_control("load")
        if config is not None and len(config) > MAX_JSON_VALUES:  # else it cannot be over
            json_values_bounded(config.encode(), "load parameter 'config'")
        await self.engine.load(name, config, files)

    async def unload(self, name: str, dependents: bool = False, repository: str = "") -> None:
        """`dependents`: Triton's unload_dependents (an ensemble's step models too)."""
        _one_repository(repository)
        self.check_model_control("unload")
        await self.engine.unload(name, dependents=dependents)

    async def load_folder(self, name: str, folder: pathlib.Path) -> None:
        """Serve the model in `folder` as `name`: a SageMaker multi-model endpoint's load,
        whose control is SageMaker's (the API's model control mode does not apply)."""
        await self.engine.load_folder(name, folder)

    async def unload_folder(self, name: str) -> None:
        """Unload a model load_folder served (its failed load forgotten too)."""
        await self.engine.unload(name, dependents=True)

    @property
    def takes_uploads(self) -> bool:
        """Whether a load's files are taken (--allow-model-upload); when not, a front end
        need not decode them: the load is refused for them unread."""
        return self.engine.takes_uploads

    def check_model_control(self, action: str) -> None:
        """UnavailableError unless models may be loaded and unloaded through the API; a front
        end asks before it reads a load's body (load asks again)."""
        if self.model_control_mode != "explicit":
            raise UnavailableError(
                f"model {action} is not allowed: the server runs with --model-control-mode "
                f"{self.model_control_mode}; start it with --model-control-mode explicit to "
                "load and unload models through the API")

    # -- tracing ---------------------------------------------------------------------------

    def trace_settings(self, model: str | None, changes: dict[str, Any] | None = None
                       ) -> dict[str, str | list[str]]:
        """The trace settings of `model` (None: the global ones), after `changes` if any."""
        if model and model not in {entry["name"] for entry in self.engine.index()}:
            raise NotFoundError(f"unknown model '{model}' for trace settings; models are: "
                                f"{', '.join(self.engine.model_names()) or 'none'}")
        if changes:
            return self.tracer.update(changes, model or None)
        return self.tracer.current(model or None)

    def trace(self, model: str, traceparent: str | None = None) -> Trace | None:
        """A trace for a request to `model` when a trace setting samples it (mostly None).
        The front end stamps its own times on it and finishes it once it has answered.
        `traceparent`: the request's W3C trace context, if it sent one."""
        return self.tracer.sample(model, traceparent) if self.tracer.on else None

    # -- inference -------------------------------------------------------------------------

    async def infer(self, name: str, version: str | None, decoded: DecodedRequest,
                    ledger: CopyLedger, trace: Trace | None = None) -> Answer:
        """Run `decoded` (a model that is not decoupled) and answer it."""
        number = parse_version(version)
        spec = self.engine.spec(name, number)
        result = await self.engine.infer(_request(name, number, spec, decoded, ledger, trace))
        return self._respond(spec, result, decoded, ledger)

    def generate_request(self, name: str, version: str | None, fields: dict[str, Any],
                         ledger: CopyLedger) -> DecodedRequest:
        """The inference a generate-extension request (`fields`, its JSON object) asks for."""
        spec = self.engine.spec(name, parse_version(version))
        inputs = [GenerateInput(i.name, i.datatype, tuple(i.dims)) for i in spec.inputs]
        return generate_request(spec.name, fields, inputs, spec.max_batch_size > 0, ledger)

    def is_decoupled(self, name: str, version: str | None) -> bool:
        return self.engine.is_decoupled(name, parse_version(version))

    async def infer_stream(self, name: str, version: str | None, decoded: DecodedRequest,
                           ledger: CopyLedger, trace: Trace | None = None
                           ) -> AsyncGenerator[Answer, None]:
        """A decoupled model's responses to `decoded`, each as `infer` returns its one."""
        number = parse_version(version)
        spec = self.engine.spec(name, number)
        responses = self.engine.infer_stream(_request(name, number, spec, decoded, ledger,
                                                      trace))
        try:
            async for result in responses:
                yield self._respond(spec, result, decoded, ledger)
        finally:
            await responses.aclose()

    def _respond(self, spec: ModelSpec, result: InferenceResult, decoded: DecodedRequest,
                 ledger: CopyLedger) -> Answer:
        name = spec.name
        outputs = result.outputs
        if result.error is not None:  # an error response of a decoupled model: no outputs
            return result, outputs, {}, {}
        binary = {n: decoded.binary_default or decoded.raw_binary for n in outputs}
        in_shm: dict[str, tuple[str, int, int]] = {}
        for requested in decoded.outputs or ():
            if requested.binary is not None:
                binary[requested.name] = requested.binary
            if requested.classification:
                outputs[requested.name] = _classify(spec, outputs[requested.name],
                                                    requested.classification, ledger,
                                                    self.engine.label_lines(name, requested.name))
            if requested.shm is not None:
                region, offset, size = requested.shm
                self.shm.write_output(region, offset, size, outputs[requested.name], ledger)
                in_shm[requested.name] = requested.shm
        return result, outputs, binary, in_shm


def _request(name: str, number: int | None, spec: ModelSpec, decoded: DecodedRequest,
             ledger: CopyLedger, trace: Trace | None) -> InferenceRequest:
    inputs = _raw_input(spec, decoded, ledger) if decoded.raw_binary else decoded.inputs
    wanted = [o.name for o in decoded.outputs] if decoded.outputs else None
    sequence = SequenceFlags(*decoded.sequence) if decoded.sequence is not None else None
    parameters = model_parameters(decoded.parameters)
    if decoded.forwarded:  # a forwarded header wins over a parameter of its name: a proxy
        # in front of the server sets the header, the client the body
        parameters = {**parameters, **decoded.forwarded}
    return InferenceRequest(name, inputs, number, wanted, decoded.timeout_us, decoded.id,
                            ledger, decoded.priority, sequence, parameters, trace)


def _raw_input(spec: ModelSpec, decoded: DecodedRequest,
               ledger: CopyLedger) -> dict[str, TensorView]:
    """Shape the single input of a raw binary request (Inference-Header-Content-Length: 0).
    A BYTES input's body is its one element's bytes, as Triton reads it (an image file sent
    as it is): no 4-byte length before them, which the element gets here (a copy)."""
    if len(spec.inputs) != 1:
        raise InvalidArgumentError(f"a raw binary request needs a model with one input; "
                                   f"'{spec.name}' has {len(spec.inputs)}")
    item = spec.inputs[0]
    body = decoded.inputs[""]
    nbytes = body.nbytes
    dims = list(item.dims)
    if item.datatype.is_bytes:
        if dims not in ([1], [-1]):
            raise InvalidArgumentError(f"a raw binary request's body is one BYTES element: "
                                       f"input '{item.name}' needs dims [1], not {dims}")
        element = bytearray(struct.pack("<I", nbytes))
        element += body.memoryview()
        record_copy(len(element), "decode", ledger)
        shape = [1, 1] if spec.max_batch_size > 0 else [1]
        return {item.name: TensorView(element, item.datatype, shape, nbytes=len(element),
                                      name=item.name, ledger=ledger)}
    if -1 in dims:
        if dims.count(-1) > 1:
            raise InvalidArgumentError(f"a raw binary request cannot shape input '{item.name}' "
                                       f"with dims {dims}: more than one variable dim")
        known = item.datatype.itemsize * int(np.prod([d for d in dims if d != -1]))
        if known == 0 or nbytes % known:
            raise InvalidArgumentError(f"a raw binary body of {nbytes} bytes does not fit input "
                                       f"'{item.name}' with dims {dims}")
        dims[dims.index(-1)] = nbytes // known
    shape = ([1] if spec.max_batch_size > 0 else []) + dims
    return {item.name: TensorView(body.owner, item.datatype, shape, body.offset,
                                  nbytes=nbytes, name=item.name)}


def _classify(spec: ModelSpec, view: TensorView, k: int, ledger: CopyLedger,
              labels: list[str]) -> TensorView:
    values = view.torch()
    if values.ndim == 0:
        raise InvalidArgumentError(f"output '{view.name}' is a scalar; classification needs "
                                   "scores")
    rows = values.reshape(values.shape[0], -1) if spec.max_batch_size > 0 else values.reshape(1, -1)
    classes = topk_classify(rows, k, labels)
    if spec.max_batch_size == 0:
        classes = classes.reshape(-1)
    return TensorView.from_numpy(classes, name=view.name, ledger=ledger)
