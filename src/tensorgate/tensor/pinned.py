"""Page-locked host storage, so host→device copies can run asynchronously (CUDA only)."""

from __future__ import annotations

import functools

import numpy as np
import torch

from tensorgate.tensor.buffer import ALIGNMENT

__all__ = ["cuda_available", "pinned_storage"]


@functools.lru_cache(maxsize=1)
def cuda_available() -> bool:
    """Whether a CUDA device is usable (False on CPU builds of torch)."""
    return bool(torch.cuda.is_available())


def pinned_storage(nbytes: int) -> np.ndarray:
    """A 1-D uint8 array of `nbytes` in page-locked memory, 64-byte aligned.

    The array holds the torch tensor that owns the pinned allocation, so it stays alive.
    """
    raw = torch.empty(nbytes + ALIGNMENT - 1, dtype=torch.uint8, pin_memory=True).numpy()
    shift = (-raw.ctypes.data) % ALIGNMENT
    return raw[shift:shift + nbytes]
