"""Property tests: bytes → view → numpy/torch → bytes is exact, for any datatype, shape and
offset, and awkward numpy sources come out right (with the copies they need counted)."""

from __future__ import annotations

import numpy as np
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from tensorgate.errors import InvalidArgumentError
from tensorgate.tensor import DATATYPES, CopyLedger, TensorView

FIXED = [dt for dt in DATATYPES if not dt.is_bytes]
shapes = st.lists(st.integers(0, 5), min_size=0, max_size=4)


def _payload(dt, count: int, data) -> bytes:
    if dt.name == "BOOL":
        return bytes(data.draw(st.lists(st.integers(0, 1), min_size=count, max_size=count)))
    return data.draw(st.binary(min_size=count * dt.itemsize, max_size=count * dt.itemsize))


@settings(max_examples=300, suppress_health_check=[HealthCheck.too_slow])
@given(dt=st.sampled_from(FIXED), shape=shapes, offset=st.integers(0, 70), tail=st.integers(0, 9),
       writable=st.booleans(), data=st.data())
def test_round_trip_bytes_view_numpy_torch(dt, shape, offset, tail, writable, data) -> None:
    count = int(np.prod(shape, dtype=np.int64))
    payload = _payload(dt, count, data)
    body = b"\xee" * offset + payload + b"\xdd" * tail
    owner = bytearray(body) if writable else body
    view = TensorView(owner, dt, shape, offset, nbytes=len(payload))
    assert view.memoryview().tobytes() == payload

    tensor = view.torch()
    assert tuple(tensor.shape) == tuple(shape) and tensor.dtype == dt.torch
    assert tensor.reshape(-1).view(torch.uint8).numpy().tobytes() == payload
    if dt.numpy is not None:
        array = view.numpy()
        assert array.shape == tuple(shape) and array.tobytes() == payload
    rebuilt = TensorView.from_torch(tensor)
    assert rebuilt.memoryview().tobytes() == payload


def _awkward(array: np.ndarray, how: str) -> np.ndarray:
    if how == "fortran":
        return np.asfortranarray(array)
    if how == "strided":
        return np.repeat(array, 2, axis=-1)[..., ::2] if array.ndim else array
    if how == "big-endian":
        return array.astype(array.dtype.newbyteorder(">"))
    if how == "read-only":
        array = array.copy()
        array.setflags(write=False)
        return array
    if how == "zero-stride":
        return np.broadcast_to(array, (2,) + array.shape)
    return array


numeric = st.sampled_from(["?", "u1", "<u2", "<u4", "<u8", "i1", "<i2", "<i4", "<i8", "<f2",
                           "<f4", "<f8"])


@settings(max_examples=300, suppress_health_check=[HealthCheck.too_slow])
@given(array=hnp.arrays(numeric, hnp.array_shapes(min_dims=0, max_dims=4, min_side=0,
                                                  max_side=4)),
       how=st.sampled_from(["plain", "fortran", "strided", "big-endian", "read-only",
                            "zero-stride"]))
def test_awkward_numpy_sources(array: np.ndarray, how: str) -> None:
    source = _awkward(array, how)
    ledger = CopyLedger()
    view = TensorView.from_numpy(source, ledger=ledger)
    expected = np.ascontiguousarray(source).astype(source.dtype.newbyteorder("<"))
    assert view.shape == source.shape and view.count == source.size
    assert view.nbytes == expected.nbytes and view.offset == 0
    assert view.memoryview().tobytes() == expected.tobytes()
    out = view.numpy()
    assert out.dtype == view.datatype.numpy
    assert out.tobytes() == expected.tobytes()
    needs_copy = source.size > 0 and not (source.flags.c_contiguous and source.dtype.isnative)
    assert (ledger.bytes > 0) == needs_copy
    if needs_copy:
        assert ledger.bytes == source.size * source.dtype.itemsize
    elif source.size:
        assert out.ctypes.data == source.ctypes.data


@settings(max_examples=500)
@given(body=st.binary(max_size=64), dtype=st.sampled_from([dt.name for dt in DATATYPES]),
       shape=st.lists(st.integers(-3, 2**40), max_size=5), offset=st.integers(-2, 80))
def test_hostile_view_arguments_fail_cleanly(body: bytes, dtype: str, shape: list[int],
                                             offset: int) -> None:
    try:
        view = TensorView(body, dtype, shape, offset, name="fuzz")
    except InvalidArgumentError as error:
        assert "fuzz" in str(error)
        return
    assert view.offset + view.nbytes <= len(body)
    if view.datatype.is_bytes:
        assert view.numpy().shape == tuple(shape)
    elif view.datatype.numpy is not None:
        assert view.numpy().nbytes == view.nbytes
