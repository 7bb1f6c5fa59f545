"""The one copy function: it copies right and counts every byte and call."""

import numpy as np
import pytest
import torch

from tensorgate.tensor import CopyLedger, copy_into, process_copies, record_copy


def test_copy_counts_in_the_ledger_and_the_process() -> None:
    before = process_copies()
    ledger = CopyLedger()
    src = np.arange(24, dtype=np.float32).reshape(2, 3, 4)
    dst = np.empty_like(src)
    assert copy_into(dst, src, "batch", ledger) == 96
    assert np.array_equal(dst, src)
    after = process_copies()
    assert (ledger.bytes, ledger.calls) == (96, 1)
    assert after.bytes - before.bytes == 96 and after.calls - before.calls == 1
    old = before.by_reason.get("batch", (0, 0))
    assert after.by_reason["batch"] == (old[0] + 96, old[1] + 1)


def test_copy_swaps_byte_order_and_follows_strides() -> None:
    src = np.arange(12, dtype=">i4").reshape(3, 4)[:, ::2]
    dst = np.empty((3, 2), dtype="<i4")
    copy_into(dst, src, "byteswap")
    assert dst.tolist() == [[0, 2], [4, 6], [8, 10]]


def test_copy_with_torch_tensors() -> None:
    ledger = CopyLedger()
    src = torch.arange(6, dtype=torch.int64).reshape(2, 3)
    dst = np.zeros((2, 3), dtype=np.int64)
    copy_into(dst, src, "device", ledger)
    assert dst.tolist() == src.tolist()
    assert ledger.bytes == 48


def test_copy_refuses_mismatched_shapes_and_dtypes() -> None:
    with pytest.raises(ValueError, match=r"^copy_into: destination shape \(2,\) differs from "
                                         r"source shape \(3,\)$"):
        copy_into(np.empty(2), np.empty(3), "layout")
    with pytest.raises(ValueError, match="dtype"):
        copy_into(torch.empty(2, dtype=torch.int32), torch.empty(2), "layout")


def test_record_copy_for_decoders() -> None:
    ledger = CopyLedger()
    record_copy(10, "decode", ledger)
    record_copy(5, "decode", ledger)
    assert (ledger.bytes, ledger.calls) == (15, 2)
