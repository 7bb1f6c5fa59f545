"""Batch and unbatch: pure functions that check the batch-size invariant.

`gather_rows` stacks per-request inputs along dim 0 into one pooled staging buffer through
the counted copy function (a single request passes through untouched: no copy), or, for a
model on a GPU, straight into one tensor on its device: each request's rows go from the
(pinned) buffer they arrived in to the device, asynchronously on the current stream, where
a host staging buffer cost a second copy of every byte and a quarter of the executor's time
(bench/RESULTS.md, "Where a GPU server's time goes").
`split_rows` cuts a batched output back into per-request views (slices: no copy).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from tensorgate.errors import InternalError
from tensorgate.tensor.copies import CopyLedger, CopyReason, copy_into
from tensorgate.tensor.pool import BufferPool

__all__ = ["gather_rows", "split_rows"]


def gather_rows(parts: Sequence[Any], ledgers: Sequence[CopyLedger | None],
                pool: BufferPool, device: torch.device | None = None) -> Any:
    """Concatenate `parts` (tensors, or numpy object arrays for BYTES) along dim 0: in a
    pooled host buffer, or in a tensor on `device` when one is given (the copies are then
    asynchronous on the current stream: the parts must outlive its work)."""
    if len(parts) == 1:
        return parts[0]
    first = parts[0]
    if isinstance(first, np.ndarray):  # BYTES: object references, no tensor bytes move
        return np.concatenate(parts, axis=0)
    rows = sum(int(p.shape[0]) for p in parts)
    shape = (rows, *first.shape[1:])
    count = rows
    for dim in first.shape[1:]:
        count *= int(dim)
    if count == 0:
        return torch.empty(shape, dtype=first.dtype, device=device)
    if device is not None:
        batch = torch.empty(shape, dtype=first.dtype, device=device)
    else:
        # Capacity for the next power of two of rows: batch sizes then share a few size
        # classes, so the pool reuses staging buffers instead of faulting in fresh pages for
        # each size (pages beyond `rows` are never written, so never resident).
        buffer = pool.acquire((count // rows) * (1 << (rows - 1).bit_length())
                              * first.element_size())
        batch = torch.frombuffer(buffer, dtype=first.dtype, count=count).view(shape)
    reason: CopyReason = "batch" if device is None else "device"
    start = 0
    for part, ledger in zip(parts, ledgers):
        end = start + int(part.shape[0])
        copy_into(batch[start:end], part, reason, ledger, non_blocking=device is not None)
        start = end
    return batch


def split_rows(output: Any, rows: Sequence[int], model: str, output_name: str) -> list[Any]:
    """Per-request slices of a batched output; the model must return exactly sum(rows) rows."""
    total = sum(rows)
    found = output.shape[0] if getattr(output, "ndim", 0) else None
    if found != total:
        raise InternalError(f"model '{model}' output '{output_name}' has "
                            f"{'no batch dim' if found is None else f'{found} rows'} for a batch "
                            f"of {total}; the first dim of every output must be the batch")
    if len(rows) == 1:
        return [output]
    pieces = []
    start = 0
    for n in rows:
        pieces.append(output[start:start + n])
        start += n
    return pieces
