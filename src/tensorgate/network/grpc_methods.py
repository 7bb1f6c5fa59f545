"""What each gRPC method but ModelInfer does (its run is network/grpc_infer's, shared by the
unary call and the stream): the table of the unary methods of
`inference.GRPCInferenceService` and `grpc.health.v1.Health`, each a request type and a
handler over the data plane, and each method's API group."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from google.protobuf import descriptor_pb2, descriptor_pool, message_factory
from tritonclient.grpc import service_pb2 as pb

from tensorgate.dataplane import DataPlane
from tensorgate.errors import InvalidArgumentError, NotFoundError
from tensorgate.protocol.grpc_codec import parse_bounded_steps, statistics_message
from tensorgate.protocol.load_message import LoadRequest, split_load_steps
from tensorgate.protocol.steps import Steps
from tensorgate.repository.upload import uploaded_files

__all__ = ["API_GROUP", "INFERENCE_SERVICE", "MODEL_INFER", "MODEL_STREAM_INFER", "UNARY"]

INFERENCE_SERVICE = "inference.GRPCInferenceService"
# the two inference methods, which UNARY's table does not hold: each has its own call
MODEL_INFER = f"/{INFERENCE_SERVICE}/ModelInfer"  # network/grpc_unary.py
MODEL_STREAM_INFER = f"/{INFERENCE_SERVICE}/ModelStreamInfer"  # network/grpc_stream.py
_HEALTH_SERVICE = "grpc.health.v1.Health"


def _health_messages() -> tuple[Any, Any]:
    """grpc.health.v1's two messages, built from their descriptor (health.proto) in a pool of
    our own: no generated module to ship, no clash with grpcio-health-checking's."""
    proto = descriptor_pb2.FieldDescriptorProto
    file = descriptor_pb2.FileDescriptorProto(name="tensorgate/grpc_health_v1.proto",
                                              package="grpc.health.v1", syntax="proto3")
    request = file.message_type.add(name="HealthCheckRequest")
    request.field.add(name="service", number=1, type=proto.TYPE_STRING,
                      label=proto.LABEL_OPTIONAL)
    response = file.message_type.add(name="HealthCheckResponse")
    status = response.enum_type.add(name="ServingStatus")
    for number, name in enumerate(("UNKNOWN", "SERVING", "NOT_SERVING", "SERVICE_UNKNOWN")):
        status.value.add(name=name, number=number)
    response.field.add(name="status", number=1, type=proto.TYPE_ENUM, label=proto.LABEL_OPTIONAL,
                       type_name=".grpc.health.v1.HealthCheckResponse.ServingStatus")
    pool = descriptor_pool.DescriptorPool()
    pool.Add(file)
    classes = message_factory.GetMessages([file], pool=pool)
    return classes["grpc.health.v1.HealthCheckRequest"], \
        classes["grpc.health.v1.HealthCheckResponse"]


HealthCheckRequest, HealthCheckResponse = _health_messages()
_SERVING, _NOT_SERVING = 1, 2

Handler = Callable[[DataPlane, Any], Awaitable[Any]]


async def _health_check(dp: DataPlane, request: Any) -> Any:
    # "" is the whole server (what Kubernetes' gRPC probe asks by default); the inference
    # service is the same thing: it serves when every model is ready ("readiness" too).
    # "liveness" serves while the server runs, its models loading or not: the name a
    # Kubernetes gRPC liveness probe gives in `service`, so a slow load is not restarted.
    if request.service == "liveness":
        return HealthCheckResponse(status=_SERVING if dp.live() else _NOT_SERVING)
    if request.service not in ("", INFERENCE_SERVICE, "readiness"):
        raise NotFoundError(f"unknown service '{request.service}' for health checks; known: "
                            f"'' (the server, ready), '{INFERENCE_SERVICE}' and 'readiness' "
                            f"(the same), 'liveness' (live)")
    return HealthCheckResponse(status=_SERVING if dp.ready() else _NOT_SERVING)


async def _server_live(dp: DataPlane, request: Any) -> Any:
    return pb.ServerLiveResponse(live=dp.live())


async def _server_ready(dp: DataPlane, request: Any) -> Any:
    return pb.ServerReadyResponse(ready=dp.ready())


async def _model_ready(dp: DataPlane, request: Any) -> Any:
    return pb.ModelReadyResponse(ready=dp.model_ready(request.name, request.version))


async def _server_metadata(dp: DataPlane, request: Any) -> Any:
    meta = dp.server_metadata()
    return pb.ServerMetadataResponse(name=meta["name"], version=meta["version"],
                                     extensions=meta["extensions"])


async def _model_metadata(dp: DataPlane, request: Any) -> Any:
    meta = dp.model_metadata(request.name, request.version)
    tensors = pb.ModelMetadataResponse.TensorMetadata
    return pb.ModelMetadataResponse(
        name=meta["name"], versions=meta["versions"], platform=meta["platform"],
        inputs=[tensors(**t) for t in meta["inputs"]],
        outputs=[tensors(**t) for t in meta["outputs"]])


async def _model_config(dp: DataPlane, request: Any) -> Any:
    return pb.ModelConfigResponse(config=dp.engine.spec(request.name).config)


async def _model_statistics(dp: DataPlane, request: Any) -> Any:
    return statistics_message(dp.statistics(request.name, request.version))


async def _shm_register(dp: DataPlane, request: Any) -> Any:
    dp.shm.register(request.name, request.key, request.offset, request.byte_size)
    return pb.SystemSharedMemoryRegisterResponse()


async def _shm_unregister(dp: DataPlane, request: Any) -> Any:
    dp.shm.unregister(request.name or None)
    return pb.SystemSharedMemoryUnregisterResponse()


async def _shm_status(dp: DataPlane, request: Any) -> Any:
    response = pb.SystemSharedMemoryStatusResponse()
    for region in dp.shm.status(request.name or None):
        status = response.regions[region["name"]]
        status.name, status.key = region["name"], region["key"]
        status.offset, status.byte_size = region["offset"], region["byte_size"]
    return response


async def _cuda_shm_register(dp: DataPlane, request: Any) -> Any:
    dp.shm.register_cuda(request.name, request.raw_handle, request.device_id, request.byte_size)
    return pb.CudaSharedMemoryRegisterResponse()


async def _cuda_shm_unregister(dp: DataPlane, request: Any) -> Any:
    dp.shm.unregister(request.name or None, "cuda")
    return pb.CudaSharedMemoryUnregisterResponse()


async def _cuda_shm_status(dp: DataPlane, request: Any) -> Any:
    response = pb.CudaSharedMemoryStatusResponse()
    for region in dp.shm.status(request.name or None, "cuda"):
        status = response.regions[region["name"]]
        status.name, status.device_id = region["name"], region["device_id"]
        status.byte_size = region["byte_size"]
    return response


async def _repository_index(dp: DataPlane, request: Any) -> Any:
    index = pb.RepositoryIndexResponse.ModelIndex
    return pb.RepositoryIndexResponse(models=[index(**e) for e in
                                              dp.repository_index(request.ready,
                                                                  request.repository_name)])


async def _repository_load(dp: DataPlane, request: LoadRequest) -> Any:
    dp.check_model_control("load")  # before the parameters are read, as over HTTP
    parameters = request.message.parameters
    config = None
    if "config" in parameters:
        value = parameters["config"]
        if value.WhichOneof("parameter_choice") != "string_param":
            raise InvalidArgumentError("load parameter 'config' must be a string: the model "
                                       "config as JSON text")
        config = value.string_param
    # the long files are views of the message, taken out of it (load_message.py)
    await dp.load(request.message.model_name, config, request.message.repository_name,
                  uploaded_files({**parameters, **request.files},
                                 _file_content if dp.takes_uploads else None))
    return pb.RepositoryModelLoadResponse()


def _file_content(key: str, value: Any) -> bytes | memoryview:
    """A gRPC load's file parameter: its content, a bytes_param as Triton takes it (a long
    one a view of the message already)."""
    if isinstance(value, memoryview):
        return value
    if value.WhichOneof("parameter_choice") != "bytes_param":
        raise InvalidArgumentError(f"load parameter {key!r} must be a bytes parameter "
                                   "(bytes_param): the file's content")
    content: bytes = value.bytes_param
    return content


async def _repository_unload(dp: DataPlane, request: Any) -> Any:
    dependents = False
    if "unload_dependents" in request.parameters:
        value = request.parameters["unload_dependents"]
        if value.WhichOneof("parameter_choice") != "bool_param":
            raise InvalidArgumentError("unload parameter 'unload_dependents' must be a bool")
        dependents = value.bool_param
    await dp.unload(request.model_name, dependents, request.repository_name)
    return pb.RepositoryModelUnloadResponse()


async def _log_settings(dp: DataPlane, request: Any) -> Any:
    """An empty request reads the settings; each given one is changed (logging extension)."""
    changes = {}
    for name, value in request.settings.items():
        kind = value.WhichOneof("parameter_choice")
        if kind is None:
            raise InvalidArgumentError(f"log setting '{name}' has no value")
        changes[name] = getattr(value, kind)
    settings = dp.log_settings.update(changes) if changes else dp.log_settings.current()
    response = pb.LogSettingsResponse()
    for name, setting in settings.items():
        entry = response.settings[name]
        if isinstance(setting, bool):
            entry.bool_param = setting
        elif isinstance(setting, int):
            entry.uint32_param = setting
        else:
            entry.string_param = setting
    return response


async def _trace_setting(dp: DataPlane, request: Any) -> Any:
    """A request without settings reads them; each given one is changed, and one without
    values cleared (trace extension; tritonclient sends None that way)."""
    changes = {name: list(value.value) or None for name, value in request.settings.items()}
    settings = dp.trace_settings(request.model_name, changes)
    response = pb.TraceSettingResponse()
    for name, setting in settings.items():
        response.settings[name].value.extend(setting if isinstance(setting, list) else [setting])
    return response


_INFERENCE: dict[str, Handler] = {
    "ServerLive": _server_live,
    "ServerReady": _server_ready,
    "ModelReady": _model_ready,
    "ServerMetadata": _server_metadata,
    "ModelMetadata": _model_metadata,
    "ModelConfig": _model_config,
    "ModelStatistics": _model_statistics,
    "SystemSharedMemoryRegister": _shm_register,
    "SystemSharedMemoryUnregister": _shm_unregister,
    "SystemSharedMemoryStatus": _shm_status,
    "CudaSharedMemoryRegister": _cuda_shm_register,
    "CudaSharedMemoryUnregister": _cuda_shm_unregister,
    "CudaSharedMemoryStatus": _cuda_shm_status,
    "RepositoryIndex": _repository_index,
    "RepositoryModelLoad": _repository_load,
    "RepositoryModelUnload": _repository_unload,
    "LogSettings": _log_settings,
    "TraceSetting": _trace_setting,
}


def _parsed(message_type: Any) -> Callable[[Any], Steps]:
    """A method's request decoder: the message parsed whole (bounded) by protobuf."""
    return lambda message: parse_bounded_steps(message_type, bytes(message))


# path → (request decoder, handler); each inference method's request type is <Method>Request,
# parsed whole, but RepositoryModelLoad's, whose uploaded files are taken out first
UNARY: dict[str, tuple[Callable[[Any], Steps], Handler]] = {
    **{f"/{INFERENCE_SERVICE}/{name}": (_parsed(getattr(pb, f"{name}Request")), handler)
       for name, handler in _INFERENCE.items() if name != "RepositoryModelLoad"},
    f"/{INFERENCE_SERVICE}/RepositoryModelLoad": (split_load_steps, _repository_load),
    f"/{_HEALTH_SERVICE}/Check": (_parsed(HealthCheckRequest), _health_check),
}

# Each method's API group, for restricted APIs (protocol/restricted.py); by the path's last part
API_GROUP = {
    "ServerLive": "health", "ServerReady": "health", "ModelReady": "health", "Check": "health",
    "ServerMetadata": "metadata", "ModelMetadata": "metadata",
    "ModelInfer": "inference", "ModelStreamInfer": "inference",
    "ModelConfig": "model-config", "ModelStatistics": "statistics",
    "RepositoryIndex": "model-repository", "RepositoryModelLoad": "model-repository",
    "RepositoryModelUnload": "model-repository",
    "SystemSharedMemoryRegister": "shared-memory", "SystemSharedMemoryUnregister":
    "shared-memory", "SystemSharedMemoryStatus": "shared-memory",
    "CudaSharedMemoryRegister": "shared-memory", "CudaSharedMemoryUnregister":
    "shared-memory", "CudaSharedMemoryStatus": "shared-memory",
    "LogSettings": "logging", "TraceSetting": "trace"}
