"""tensorgate: a low-latency inference server for PyTorch models (Open Inference Protocol)."""

from tensorgate.errors import Status, TensorgateError
from tensorgate.model import Model, ModelContext, RequestInfo
from tensorgate.pipeline.engine import Engine, InferenceRequest, InferenceResult
from tensorgate.tensor import (DATATYPES, BufferPool, CopyLedger, DataType, HostBuffer,
                               TensorView, copy_into, datatype, default_pool, process_copies)

__version__ = "0.1.0"

__all__ = [
    "BufferPool",
    "CopyLedger",
    "DATATYPES",
    "DataType",
    "Engine",
    "HostBuffer",
    "InferenceRequest",
    "InferenceResult",
    "Model",
    "ModelContext",
    "RequestInfo",
    "Status",
    "TensorView",
    "TensorgateError",
    "copy_into",
    "datatype",
    "default_pool",
    "process_copies",
]
