"""gRPC front end: `inference.GRPCInferenceService` on grpcio's asyncio server.

Thin: decode with protocol/grpc_codec, call the data plane, encode. Errors are translated
here and only here, through protocol/status.py's table.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import grpc
from tritonclient.grpc import service_pb2 as pb
from tritonclient.grpc import service_pb2_grpc as pb_grpc

from tensorgate.dataplane import DataPlane
from tensorgate.errors import TensorgateError, UnimplementedError
from tensorgate.protocol.grpc_codec import (decode_model_infer, encode_model_infer,
                                            statistics_message)
from tensorgate.protocol.status import codes_for
from tensorgate.tensor.copies import CopyLedger

__all__ = ["GrpcFrontEnd"]

log = logging.getLogger("tensorgate.grpc")
T = TypeVar("T")


async def _answer(context: grpc.aio.ServicerContext, call: Callable[[], Awaitable[T]]) -> T:
    try:
        return await call()
    except TensorgateError as error:
        await context.abort(getattr(grpc.StatusCode, codes_for(error)[1]), error.message)
    except Exception as error:  # a bug: answer, log, keep serving
        log.exception("unexpected error in a gRPC call")
        await context.abort(grpc.StatusCode.INTERNAL, f"internal error: {type(error).__name__}: "
                                                      f"{error}")
    raise AssertionError("unreachable: abort raises")


class _Servicer(pb_grpc.GRPCInferenceServiceServicer):
    def __init__(self, dataplane: DataPlane) -> None:
        self.dp = dataplane

    async def ServerLive(self, request: Any, context: Any) -> pb.ServerLiveResponse:
        return pb.ServerLiveResponse(live=self.dp.live())

    async def ServerReady(self, request: Any, context: Any) -> pb.ServerReadyResponse:
        return pb.ServerReadyResponse(ready=self.dp.ready())

    async def ModelReady(self, request: Any, context: Any) -> pb.ModelReadyResponse:
        return pb.ModelReadyResponse(ready=self.dp.model_ready(request.name, request.version))

    async def ServerMetadata(self, request: Any, context: Any) -> pb.ServerMetadataResponse:
        meta = self.dp.server_metadata()
        return pb.ServerMetadataResponse(name=meta["name"], version=meta["version"],
                                         extensions=meta["extensions"])

    async def ModelMetadata(self, request: Any, context: Any) -> pb.ModelMetadataResponse:
        async def call() -> pb.ModelMetadataResponse:
            meta = self.dp.model_metadata(request.name, request.version)
            tensors = pb.ModelMetadataResponse.TensorMetadata
            return pb.ModelMetadataResponse(
                name=meta["name"], versions=meta["versions"], platform=meta["platform"],
                inputs=[tensors(**t) for t in meta["inputs"]],
                outputs=[tensors(**t) for t in meta["outputs"]])
        return await _answer(context, call)

    async def ModelConfig(self, request: Any, context: Any) -> pb.ModelConfigResponse:
        async def call() -> pb.ModelConfigResponse:
            spec = self.dp.engine.spec(request.name)
            return pb.ModelConfigResponse(config=spec.config)
        return await _answer(context, call)

    async def ModelStatistics(self, request: Any, context: Any) -> pb.ModelStatisticsResponse:
        async def call() -> pb.ModelStatisticsResponse:
            return statistics_message(self.dp.statistics(request.name, request.version))
        return await _answer(context, call)

    async def SystemSharedMemoryRegister(self, request: Any, context: Any) -> Any:
        async def call() -> pb.SystemSharedMemoryRegisterResponse:
            self.dp.shm.register(request.name, request.key, request.offset, request.byte_size)
            return pb.SystemSharedMemoryRegisterResponse()
        return await _answer(context, call)

    async def SystemSharedMemoryUnregister(self, request: Any, context: Any) -> Any:
        async def call() -> pb.SystemSharedMemoryUnregisterResponse:
            self.dp.shm.unregister(request.name or None)
            return pb.SystemSharedMemoryUnregisterResponse()
        return await _answer(context, call)

    async def SystemSharedMemoryStatus(self, request: Any, context: Any) -> Any:
        async def call() -> pb.SystemSharedMemoryStatusResponse:
            response = pb.SystemSharedMemoryStatusResponse()
            for region in self.dp.shm.status(request.name or None):
                status = response.regions[region["name"]]
                status.name, status.key = region["name"], region["key"]
                status.offset, status.byte_size = region["offset"], region["byte_size"]
            return response
        return await _answer(context, call)

    async def RepositoryIndex(self, request: Any, context: Any) -> pb.RepositoryIndexResponse:
        entries = self.dp.repository_index(request.ready)
        index = pb.RepositoryIndexResponse.ModelIndex
        return pb.RepositoryIndexResponse(models=[index(**e) for e in entries])

    async def RepositoryModelLoad(self, request: Any, context: Any) -> Any:
        async def call() -> pb.RepositoryModelLoadResponse:
            if request.parameters:
                raise UnimplementedError("loading with override parameters is not supported")
            await self.dp.load(request.model_name)
            return pb.RepositoryModelLoadResponse()
        return await _answer(context, call)

    async def RepositoryModelUnload(self, request: Any, context: Any) -> Any:
        async def call() -> pb.RepositoryModelUnloadResponse:
            await self.dp.unload(request.model_name)
            return pb.RepositoryModelUnloadResponse()
        return await _answer(context, call)

    async def ModelInfer(self, request: Any, context: Any) -> pb.ModelInferResponse:
        async def call() -> pb.ModelInferResponse:
            ledger = CopyLedger()
            decoded = decode_model_infer(request, ledger, self.dp.shm)
            result, outputs, _, in_shm = await self.dp.infer(
                request.model_name, request.model_version, decoded, ledger)
            return encode_model_infer(result.model, result.version, result.id, outputs, ledger,
                                      bool(decoded.parameters.get("tensorgate_report_copies")),
                                      in_shm)
        return await _answer(context, call)


class GrpcFrontEnd:
    def __init__(self, dataplane: DataPlane, max_message_bytes: int) -> None:
        options = [("grpc.max_receive_message_length", max_message_bytes),
                   ("grpc.max_send_message_length", max_message_bytes)]
        self._server = grpc.aio.server(options=options)
        pb_grpc.add_GRPCInferenceServiceServicer_to_server(_Servicer(dataplane), self._server)

    async def start(self, host: str, port: int) -> int:
        bound = self._server.add_insecure_port(f"{host}:{port}")
        await self._server.start()
        return bound

    async def stop(self, grace_s: float) -> None:
        await self._server.stop(grace_s)
