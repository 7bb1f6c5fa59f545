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
is one the mapped load fails on (its error is then torch.load's own), or one that torch.load's
reader would refuse and the mapped load does not check: a record whose local header lacks its
signature ("invalid header or archive is corrupted"), a storage whose size in the pickle is
not its record's (found by the damaged-file test and a sweep of every byte and bit of a small
file; the checks cost 1.4-2.0 ms for resnet50's 326 records, 14-15 ms the mapped load itself).
"""

from __future__ import annotations

import mmap
import pathlib
import zipfile
from typing import Any

import torch

__all__ = ["load_weights"]


class _NotPlain(Exception):
    """A tensor a storage copy does not rebuild."""


def load_weights(path: pathlib.Path, device: torch.device) -> Any:
    """What `torch.load(path, map_location=device, weights_only=True)` returns."""
    if _is_zipfile(path):  # torch.save's format since torch 1.6: it maps
        try:
            sizes = _record_sizes(path)
            if sizes is None:
                raise _NotPlain  # torch.load says what is wrong
            mapped = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
            storages: Storages = {}
            copied = _copied(mapped, device, storages)
            if sorted(nbytes for _, nbytes in storages) != sizes:
                raise _NotPlain  # a storage the pickle sizes unlike its record: torch.load
            return copied  # refuses that, the mapped load reads past or short of it
        except Exception:  # noqa: BLE001 - read as torch.load reads it, which says what failed
            pass
    return torch.load(path, map_location=device, weights_only=True)


def _is_zipfile(path: pathlib.Path) -> bool:
    """zipfile.is_zipfile, False where it raises: it lets BadZipFile out for some damaged
    end records (a zip64 locator's disk count) that torch.load's reader does not read."""
    try:
        return zipfile.is_zipfile(path)
    except zipfile.BadZipFile:
        return False


def _record_sizes(path: pathlib.Path) -> list[int] | None:
    """The sizes of the archive's storage records (`<archive>/data/<key>`), sorted; None
    where a record's local header does not begin with its signature, as torch.load's
    reader checks and its mapped load does not."""
    with open(path, "rb") as file, zipfile.ZipFile(file) as archive:
        records = archive.infolist()
        with mmap.mmap(file.fileno(), 0, access=mmap.ACCESS_READ) as mapped:
            if not all(mapped[r.header_offset:r.header_offset + 4] == b"PK\x03\x04"
                       for r in records):
                return None
    return sorted(r.file_size for r in records
                  if r.filename.count("/") == 2 and r.filename.split("/")[1] == "data")


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
