"""A Python model's weights (ModelContext.load_weights) read with the GIL free.

`torch.load` reads tensors' bytes holding the GIL: a 40 MB file here held it up to 18 ms (in
some loads; 1-2 ms in others), and the event loop, which needs the GIL for every request,
stops as long — a reload stalls every other model's clients. Here the file is mapped
(`torch.load(mmap=True)`: only its small pickle is read, under a millisecond) and each
storage copied out of the mapping by a torch copy, which lets go of the GIL while it runs
(the same file: 8-9 ms a load where torch.load took 17-20 ms, the GIL held up to 5.6 ms;
beside back-to-back reloads, a small request's longest wait 9.6 -> 6.6 ms:
bench/upload_stall_bench.py). The copies share storage as the file's tensors did (tied
weights stay tied) and leave nothing mapped: a served model never reads a file that may be
replaced, or cut short, under it. A file of the old (pre-zip) format, or holding a tensor
that is not plain strided memory (quantized, sparse), is read by `torch.load` as before, as
is one the mapped load fails on (its error is then torch.load's own).
"""

from __future__ import annotations

import pathlib
import zipfile
from typing import Any

import torch

__all__ = ["load_weights"]


class _NotPlain(Exception):
    """A tensor a storage copy does not rebuild."""


def load_weights(path: pathlib.Path, device: torch.device) -> Any:
    """What `torch.load(path, map_location=device, weights_only=True)` returns."""
    if zipfile.is_zipfile(path):  # torch.save's format since torch 1.6: it maps
        try:
            mapped = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
            return _copied(mapped, device, {})
        except Exception:  # noqa: BLE001 - read as torch.load reads it, which says what failed
            pass
    return torch.load(path, map_location=device, weights_only=True)


Storages = dict[tuple[int, int], torch.UntypedStorage]  # a mapped storage's copy, by place


def _copied(value: Any, device: torch.device, storages: Storages) -> Any:
    """`value` with each tensor in it a copy on `device`; dicts and lists changed in place
    (a state_dict's OrderedDict keeps its `_metadata`), tuples made again."""
    if isinstance(value, torch.Tensor):
        return _tensor(value, device, storages)
    if isinstance(value, dict):
        for key, item in value.items():
            value[key] = _copied(item, device, storages)
    elif isinstance(value, list):
        for index, item in enumerate(value):
            value[index] = _copied(item, device, storages)
    elif isinstance(value, tuple):
        items = [_copied(item, device, storages) for item in value]
        return getattr(type(value), "_make", type(value))(items)  # a namedtuple's _make
    return value


def _tensor(value: torch.Tensor, device: torch.device, storages: Storages) -> torch.Tensor:
    if value.layout is not torch.strided or value.is_quantized or value.device.type != "cpu":
        raise _NotPlain
    storage = value.untyped_storage()
    key = (storage.data_ptr(), storage.nbytes())  # two storages of one mapping differ in both
    copy = storages.get(key)
    if copy is None:  # the first tensor of this storage: the storage copied whole, once
        whole = torch.empty(0, dtype=torch.uint8).set_(storage)
        copy = whole.to(device, copy=True).untyped_storage()  # the GIL let go meanwhile
        storages[key] = copy
    out = torch.empty(0, dtype=value.dtype, device=device)
    out.set_(copy, value.storage_offset(), value.size(), value.stride())
    if isinstance(value, torch.nn.Parameter):
        return torch.nn.Parameter(out, requires_grad=value.requires_grad)
    return out.requires_grad_(value.requires_grad)
