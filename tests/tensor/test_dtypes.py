"""The datatype table: sizes, numpy and torch equivalents, config names, clear errors."""

import numpy as np
import pytest
import torch

from tensorgate.errors import DatatypeError
from tensorgate.tensor import (DATATYPES, datatype, datatype_from_config, datatype_of_numpy,
                               datatype_of_torch)

EXPECTED_SIZES = {
    "BOOL": 1, "UINT8": 1, "UINT16": 2, "UINT32": 4, "UINT64": 8, "INT8": 1, "INT16": 2,
    "INT32": 4, "INT64": 8, "FP16": 2, "BF16": 2, "FP32": 4, "FP64": 8, "BYTES": 0,
}


def test_table_has_every_protocol_datatype() -> None:
    assert {dt.name: dt.itemsize for dt in DATATYPES} == EXPECTED_SIZES


@pytest.mark.parametrize("dt", [d for d in DATATYPES if not d.is_bytes], ids=str)
def test_sizes_agree_with_numpy_and_torch(dt) -> None:
    assert dt.storage.itemsize == dt.itemsize
    assert torch.empty((), dtype=dt.torch).element_size() == dt.itemsize
    if dt.numpy is not None:
        assert dt.numpy.itemsize == dt.itemsize
        assert dt.numpy.byteorder in "=<|"
        assert datatype_of_numpy(dt.numpy) is dt
        assert datatype_of_numpy(dt.numpy.newbyteorder(">")) is dt
    assert datatype_of_torch(dt.torch) is dt


def test_config_names_map_to_the_same_table() -> None:
    for dt in DATATYPES:
        assert datatype_from_config(dt.config_name) is dt
        assert datatype(dt.name) is dt
    assert datatype_from_config("TYPE_STRING").name == "BYTES"


def test_bf16_is_torch_only_and_bytes_numpy_only() -> None:
    assert datatype("BF16").numpy is None and datatype("BF16").torch is torch.bfloat16
    assert datatype("BYTES").torch is None and datatype("BYTES").numpy == np.dtype(object)
    for dtype in ("S3", "U2", object):
        assert datatype_of_numpy(np.dtype(dtype)).name == "BYTES"


def test_unknown_names_list_the_valid_ones() -> None:
    with pytest.raises(DatatypeError, match=r"^tensor 'x': unknown datatype 'FP33'; datatypes "
                                            r"are: BOOL, UINT8, .*, FP64, BYTES$"):
        datatype("FP33", "x")
    with pytest.raises(DatatypeError, match=r"unknown config data_type 'TYPE_FP33'"):
        datatype_from_config("TYPE_FP33")
    with pytest.raises(DatatypeError, match=r"no protocol datatype for numpy dtype 'complex64'"):
        datatype_of_numpy(np.dtype(np.complex64))
    with pytest.raises(DatatypeError, match=r"no protocol datatype for torch dtype"):
        datatype_of_torch(torch.complex64)
    with pytest.raises(DatatypeError):
        datatype(None)  # type: ignore[arg-type]
