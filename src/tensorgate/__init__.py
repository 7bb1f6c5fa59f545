"""tensorgate: a low-latency inference server for PyTorch models (Open Inference Protocol)."""

from tensorgate.errors import Status, TensorgateError
from tensorgate.tensor import (DATATYPES, BufferPool, CopyLedger, DataType, HostBuffer,
                               TensorView, copy_into, datatype, default_pool, process_copies)

__version__ = "0.1.0"

__all__ = [
    "BufferPool",
    "CopyLedger",
    "DATATYPES",
    "DataType",
    "HostBuffer",
    "Status",
    "TensorView",
    "TensorgateError",
    "copy_into",
    "datatype",
    "default_pool",
    "process_copies",
]
