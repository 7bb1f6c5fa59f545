"""Tensor bytes: datatypes, aligned pooled buffers, zero-copy views and the counted copy."""

from tensorgate.tensor.buffer import ALIGNMENT, HostBuffer
from tensorgate.tensor.copies import (CopyLedger, CopyTotals, copy_into, process_copies,
                                      record_copy)
from tensorgate.tensor.dtypes import (DATATYPES, DataType, datatype, datatype_from_config,
                                      datatype_of_numpy, datatype_of_torch)
from tensorgate.tensor.pool import BufferPool, PoolStatistics, default_pool
from tensorgate.tensor.view import TensorView

__all__ = [
    "ALIGNMENT",
    "BufferPool",
    "CopyLedger",
    "CopyTotals",
    "DATATYPES",
    "DataType",
    "HostBuffer",
    "PoolStatistics",
    "TensorView",
    "copy_into",
    "datatype",
    "datatype_from_config",
    "datatype_of_numpy",
    "datatype_of_torch",
    "default_pool",
    "process_copies",
    "record_copy",
]
