"""gather_rows / split_rows: values, counted copies, and staging buffers that batch sizes share."""

from __future__ import annotations

import pytest
import torch

from tensorgate.errors import InternalError
from tensorgate.pipeline.batching import gather_rows, split_rows
from tensorgate.tensor.copies import CopyLedger, process_copies
from tensorgate.tensor.pool import BufferPool

ROW = (3, 224, 224)


def _requests(rows: list[int]) -> list[torch.Tensor]:
    return [torch.full((n, *ROW), float(i)) for i, n in enumerate(rows)]


def test_gather_stacks_rows_and_counts_each_copy_to_its_request() -> None:
    pool = BufferPool(1 << 30)
    parts = _requests([1, 2, 1])
    ledgers = [CopyLedger() for _ in parts]
    batch = gather_rows(parts, ledgers, pool)
    assert batch.shape == (4, *ROW)
    assert [float(batch[i, 0, 0, 0]) for i in range(4)] == [0.0, 1.0, 1.0, 2.0]
    assert [ledger.bytes for ledger in ledgers] == [p.numel() * 4 for p in parts]
    assert batch.data_ptr() % 64 == 0


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=[
    pytest.mark.cuda, pytest.mark.skipif(not torch.cuda.is_available(),
                                         reason="needs a CUDA device")])])
def test_gather_onto_a_device_takes_no_host_staging(device: str) -> None:
    """For a model on a GPU the rows go straight to a tensor on its device, each copy counted
    once, as a device copy, to its request; the pool is not asked for a staging buffer.
    (Here on the CPU too: the same copies into a fresh tensor on the device named.)"""
    pool = BufferPool(1 << 30)
    parts = _requests([1, 2, 1])
    ledgers = [CopyLedger() for _ in parts]
    before = process_copies().by_reason
    batch = gather_rows(parts, ledgers, pool, torch.device(device))
    after = process_copies().by_reason
    assert batch.device.type == device and batch.shape == (4, *ROW)
    torch.testing.assert_close(batch.cpu(), torch.cat(parts))
    assert [(ledger.bytes, ledger.calls) for ledger in ledgers] == [
        (p.numel() * 4, 1) for p in parts]
    moved = sum(p.numel() * 4 for p in parts)
    assert after["device"][0] - before.get("device", (0, 0))[0] == moved
    assert after.get("batch") == before.get("batch")  # no host staging copy
    assert pool.statistics().misses == pool.statistics().hits == 0


def test_one_request_passes_through_uncopied() -> None:
    part = torch.ones((2, *ROW))
    ledger = CopyLedger()
    assert gather_rows([part], [ledger], BufferPool(1 << 30)) is part
    assert ledger.bytes == 0


def test_batch_sizes_between_powers_of_two_reuse_one_staging_buffer() -> None:
    """Staging for 5, 6, 7 and 8 rows comes from one size class: after the first batch every
    gather is a pool hit, not fresh pages (bench/RESULTS.md: fresh pages cost 10× the copy)."""
    pool = BufferPool(1 << 30, idle_limit_bytes=256 << 20)
    for rows in (5, 6, 7, 8, 6, 5):
        batch = gather_rows(_requests([1] * rows), [None] * rows, pool)
        assert batch.shape[0] == rows
        del batch
    stats = pool.statistics()
    assert (stats.misses, stats.hits) == (1, 5)


def test_split_rows_gives_views_and_checks_the_row_count() -> None:
    output = torch.arange(12.0).reshape(4, 3)
    pieces = split_rows(output, [1, 3], "m", "OUT")
    assert [p.shape[0] for p in pieces] == [1, 3]
    assert all(p.data_ptr() == output[start].data_ptr() for p, start in zip(pieces, (0, 1)))
    with pytest.raises(InternalError, match="3 rows for a batch of 4"):
        split_rows(output[:3], [1, 3], "m", "OUT")
