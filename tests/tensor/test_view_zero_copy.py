"""Zero copy, proven by address: a view's arrays and tensors sit where its bytes are."""

from __future__ import annotations

import mmap

import numpy as np
import pytest
import torch

from tensorgate.tensor import DATATYPES, CopyLedger, TensorView

FIXED = [dt for dt in DATATYPES if not dt.is_bytes]


def address_of(obj: object) -> int:
    return int(np.frombuffer(obj, np.uint8).ctypes.data)  # type: ignore[call-overload]


def _sources(size: int) -> dict[str, object]:
    anonymous = mmap.mmap(-1, size)
    return {
        "bytes": bytes(size),
        "bytearray": bytearray(size),
        "memoryview-bytes": memoryview(bytes(size)),
        "memoryview-bytearray": memoryview(bytearray(size)),
        "mmap": anonymous,
        "memoryview-mmap": memoryview(anonymous),
    }


@pytest.mark.parametrize("source_kind", list(_sources(8)))
@pytest.mark.parametrize("dt", FIXED, ids=str)
@pytest.mark.parametrize("elements_before", [0, 1, 5, 64])
def test_numpy_torch_and_dlpack_alias_the_buffer(source_kind: str, dt, elements_before: int) -> None:
    shape = (2, 3, 4)
    offset = elements_before * dt.itemsize
    size = offset + 24 * dt.itemsize + 40  # a larger body: the tensor sits inside it
    source = _sources(size)[source_kind]
    base = address_of(source)
    ledger = CopyLedger()
    view = TensorView(source, dt, shape, offset, name="INPUT__0", ledger=ledger)

    tensor = view.torch()
    assert tensor.data_ptr() == base + offset
    assert tensor.dtype == dt.torch and tuple(tensor.shape) == shape
    assert torch.from_dlpack(view).data_ptr() == base + offset
    if dt.numpy is not None:
        array = view.numpy()
        assert array.ctypes.data == base + offset
        assert array.dtype == dt.numpy and array.shape == shape
    assert view.address == base + offset
    assert ledger.bytes == 0 and ledger.calls == 0


def test_writes_through_the_view_reach_the_owner() -> None:
    body = bytearray(64)
    TensorView(body, "INT32", [4], 16).torch()[:] = torch.tensor([1, 2, 3, 4], dtype=torch.int32)
    assert np.frombuffer(body, "<i4", 4, 16).tolist() == [1, 2, 3, 4]


def test_read_only_owner_gives_read_only_array_and_no_warning() -> None:
    view = TensorView(bytes(range(16)), "UINT8", [16])
    assert view.readonly
    assert not view.numpy().flags.writeable
    assert view.torch().tolist() == list(range(16))  # filterwarnings=error: no warning here


def test_misaligned_offset_is_copied_once_and_counted() -> None:
    body = bytearray(4 * 6 + 1)
    body[1:] = np.arange(6, dtype="<f4").tobytes()
    base = address_of(body)
    ledger = CopyLedger()
    view = TensorView(body, "FP32", [2, 3], 1, ledger=ledger)
    first = view.torch()
    assert first.data_ptr() != base + 1 and first.data_ptr() % 64 == 0
    assert first.flatten().tolist() == [0.0, 1.0, 2.0, 3.0, 4.0, 5.0]
    assert (ledger.bytes, ledger.calls) == (24, 1)
    second = view.numpy()  # the view now points at the aligned copy: no second copy
    assert second.ctypes.data == first.data_ptr()
    assert (ledger.bytes, ledger.calls) == (24, 1)


def test_aligned_to_64_copies_only_when_needed() -> None:
    body = bytearray(1024)
    base = address_of(body)
    at = (-base) % 64 + 64  # an offset whose address is on a 64-byte boundary
    ledger = CopyLedger()
    on_boundary = TensorView(body, "FP32", [8], at, ledger=ledger)
    assert on_boundary.aligned(64) is on_boundary
    off_boundary = TensorView(body, "FP32", [8], at + 4, ledger=ledger)
    moved = off_boundary.aligned(64)
    assert moved is not off_boundary and moved.address % 64 == 0
    assert moved.numpy().tobytes() == bytes(body[at + 4:at + 36])
    assert ledger.bytes == 32


def test_empty_and_scalar_tensors() -> None:
    empty = TensorView(b"", "FP32", [0, 3])
    assert empty.numpy().shape == (0, 3) and tuple(empty.torch().shape) == (0, 3)
    scalar = TensorView(np.array(2.5, dtype="<f8").tobytes(), "FP64", [])
    assert scalar.numpy().shape == () and scalar.torch().item() == 2.5


def test_bf16_via_torch_only() -> None:
    values = torch.tensor([1.5, -2.0, 3.25], dtype=torch.bfloat16)
    body = bytearray(values.view(torch.uint16).numpy().tobytes())
    view = TensorView(body, "BF16", [3])
    tensor = view.torch()
    assert tensor.dtype == torch.bfloat16 and torch.equal(tensor, values)
    assert tensor.data_ptr() == address_of(body)


def test_view_of_a_pooled_buffer_is_aligned(pool) -> None:
    buffer = pool.acquire(602_112)
    view = TensorView(buffer, "FP32", [1, 3, 224, 224])
    assert view.torch().data_ptr() == buffer.address and buffer.address % 64 == 0


def test_from_numpy_is_zero_copy_for_wire_layout_arrays() -> None:
    array = np.arange(12, dtype=np.float32).reshape(3, 4)
    ledger = CopyLedger()
    view = TensorView.from_numpy(array, ledger=ledger)
    assert view.numpy().ctypes.data == array.ctypes.data
    assert view.memoryview().tobytes() == array.tobytes()
    assert ledger.bytes == 0


def test_from_torch_is_zero_copy_when_contiguous() -> None:
    tensor = torch.arange(10, dtype=torch.int16)
    assert TensorView.from_torch(tensor).torch().data_ptr() == tensor.data_ptr()
    bf = torch.ones(4, dtype=torch.bfloat16)
    assert TensorView.from_torch(bf).torch().data_ptr() == bf.data_ptr()
    graded = torch.ones(2, 3, requires_grad=True) * 2  # (a model run outside inference mode)
    view = TensorView.from_torch(graded)
    assert view.torch().data_ptr() == graded.data_ptr() and not view.torch().requires_grad
    assert (view.shape, view.count, view.nbytes) == ((2, 3), 6, 24)
