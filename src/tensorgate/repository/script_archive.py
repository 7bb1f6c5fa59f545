"""A TorchScript file loaded with its tensors' bytes copied while the GIL is free.

`torch.jit.load` is one C++ call that holds the GIL while it reads every tensor record of the
archive, and the event loop, which needs the GIL for every request, stops as long: a reload
stalls every other model's clients (a thread ticking every 0.5 ms beside the load waited up
to 18-23 ms for a 40 MB file, 160-200 ms for a 400 MB one). Here the archive's pickles and
code, which are small, are put in an archive in memory laid out as torch.package lays out a
TorchScript module it holds; the tensor records are mapped and copied out by torch copies,
which let go of the GIL, into the storage context from which torch.package's import takes
storages by the keys the pickles name; torch's importer then builds the module from the
small archive and reads no tensor bytes (the same ticks: 3-7 ms and 9-14 ms, the loads
themselves 2-4 times faster). The same unpickler, tied tensors still tied: only where the
bytes come from differs, and the copies leave nothing mapped. For the CPU only: onto a GPU,
torch.jit.load reads the file as before (load_script_module says why).

The archive is read by torch's own reader, which checks what torch.jit.load's checks and
inflates the code as it does: a sweep of every bit of a small file found Python's zipfile
reading archives torch's refuses (a central directory's sizes or disk numbers, the zip64 end
record damaged); since, the two differ only where torch.jit.load's own answer changes from
call to call (damaged compressed code).

Left to `torch.jit.load`, as before: an archive whose data and constants pickles name the
same storage key (the package's import keeps one table of keys for both; torch.jit.save's
archives number each pickle's storages from 0: a module holding tensors both as attributes
and as constants of its code); one not laid out as torch.jit.save lays it out (the old
model.json format, a tensor's record compressed or encrypted, a record named twice); a
storage whose record is not as long as its pickle says; and any archive this reading fails
on, so that the error a user sees is torch's own.
"""

from __future__ import annotations

import io
import logging
import mmap
import pathlib
import pickle
import zipfile
from collections.abc import Iterable
from typing import Any

import torch

__all__ = ["load_script_module"]

_log = logging.getLogger(__name__)

# Where torch.package's import of a TorchScript module looks (import.cpp): its pickles
# under .data/ts_code/<id>/, its code under .data/ts_code/code/, storages by key.
_PACKAGED = ".data/ts_code/"
_ID = "0"
_TENSOR_FOLDERS = {"data.pkl": "data", "constants.pkl": "constants"}

# The storage classes a TorchScript pickle names (`torch.FloatStorage`...), by their
# element's type: a storage's bytes are its element count times that type's size.
_STORAGE_TYPES = {f"{name}Storage": dtype for name, dtype in {
    "Float": torch.float32, "Double": torch.float64, "Half": torch.float16,
    "BFloat16": torch.bfloat16, "Long": torch.int64, "Int": torch.int32,
    "Short": torch.int16, "Char": torch.int8, "Byte": torch.uint8, "Bool": torch.bool,
    "ComplexFloat": torch.complex64, "ComplexDouble": torch.complex128,
    "QInt8": torch.qint8, "QUInt8": torch.quint8, "QInt32": torch.qint32,
    "QUInt4x2": torch.quint4x2, "QUInt2x4": torch.quint2x4}.items()}


class _NotThisWay(Exception):
    """An archive this reading leaves to torch.jit.load, and why."""


def load_script_module(path: pathlib.Path, device: torch.device) -> Any:
    """What `torch.jit.load(path, map_location=device)` returns. Onto a GPU, torch.jit.load
    reads it: the storage context would hold every storage's host copy until the import ends
    (the whole model in host memory at once, where torch.jit.load holds one record's at a
    time while it moves each to the device), and this reading has not yet run on a GPU."""
    if device.type == "cpu":
        try:
            return mapped_load(path, device)
        except Exception as error:  # noqa: BLE001 - torch.jit.load reads it, or says what is wrong
            _log.debug("%s: read by torch.jit.load (%s)", path, error)
    return torch.jit.load(str(path), map_location=device)  # type: ignore[no-untyped-call]


def mapped_load(path: pathlib.Path, device: torch.device) -> Any:
    """The module, its storages copied from a mapping of the file; raises where
    load_script_module leaves the file to torch.jit.load (`_NotThisWay` for a kind of archive
    this does not read, the error met for a damaged one). The archive is read by torch's own
    reader, which checks what torch.jit.load's does (its central directory) and reads the small
    records as it does; the tensors' records, copied from the mapping, are checked as torch's
    reader checks a record it reads: its local header's signature, its bytes inside the file."""
    reader = torch._C.PyTorchFileReader(str(path))
    names = set(reader.get_all_records())
    if "data.pkl" not in names or "constants.pkl" not in names:
        raise _NotThisWay("not torch.jit.save's layout (no data.pkl or constants.pkl)")
    small = {_packaged(name): reader.get_record(name) for name in names
             if name.split("/", 1)[0] not in ("data", "constants", "extra")}
    named: set[str] = set()
    wanted: dict[str, tuple[str, int]] = {}  # storage key -> its record, its bytes
    for pickled, folder in _TENSOR_FOLDERS.items():
        sizes = _storage_sizes(small[_packaged(pickled)])
        if named & sizes.keys():
            raise _NotThisWay(f"storage keys named by both pickles: {named & sizes.keys()}")
        named |= sizes.keys()
        for key, nbytes in sizes.items():
            if nbytes == 0:
                continue  # the importer reads no record for an empty storage
            record = f"{folder}/{key}"
            if record not in names or reader.get_record_size(record) != nbytes:
                raise _NotThisWay(f"storage {record}: no record of {nbytes} bytes")
            wanted[key] = record, nbytes
    _check_stored(path, (record for record, _ in wanted.values()))
    context = torch._C.DeserializationStorageContext()
    with open(path, "rb") as file:
        # A private, copy-on-write mapping: writable, so that torch views it without warning
        # of a read-only buffer; nothing writes to it
        with mmap.mmap(file.fileno(), 0, access=mmap.ACCESS_COPY) as mapped:
            for key, (record, nbytes) in wanted.items():
                context.add_storage(key, _copied(mapped, reader, record, nbytes))
    packaged = torch._C.PyTorchFileReader(io.BytesIO(_archive(small)))
    module = torch._C._import_ir_module_from_package(
        torch._C.CompilationUnit(), packaged, context, device, _ID)
    return torch.jit._recursive.wrap_cpp_module(module)  # type: ignore[no-untyped-call]


def _check_stored(path: pathlib.Path, records: Iterable[str]) -> None:
    """That each record is stored as it is (torch.jit.save compresses none of its tensors;
    a compressed one's bytes in the file are not the tensor's), found in the central
    directory by Python's reader (torch's says nothing of a record's compression)."""
    with zipfile.ZipFile(path) as archive:
        infos = archive.infolist()
        prefix = infos[0].filename.split("/", 1)[0] + "/" if infos else ""
        by_name = {info.filename: info for info in infos}
        if len(by_name) != len(infos):
            raise _NotThisWay("a record named twice")
        for record in records:
            info = by_name.get(prefix + record)
            if info is None or info.compress_type != zipfile.ZIP_STORED or info.flag_bits & 0x1:
                raise _NotThisWay(f"record {record}: not stored as it is")


def _packaged(name: str) -> str:
    """A record's name in the archive torch.package's import reads."""
    if name in _TENSOR_FOLDERS:
        return f"archive/{_PACKAGED}{_ID}/{name}"
    if name.startswith("code/"):
        return f"archive/{_PACKAGED}{name}"
    return f"archive/{name}"  # version, byteorder, .data/version, .data/serialization_id


def _archive(records: dict[str, bytes]) -> bytes:
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w", zipfile.ZIP_STORED) as archive:
        for name, body in records.items():
            archive.writestr(name, body)
    return out.getvalue()


def _copied(mapped: mmap.mmap, reader: Any, record: str, size: int) -> torch.Tensor:
    """A record's `size` bytes copied out of the mapping, the GIL let go while they are."""
    header = reader.get_record_header_offset(record)
    if mapped[header:header + 4] != b"PK\x03\x04":  # as torch's reader checks
        raise ValueError(f"record {record}: no local header at {header}")
    start = reader.get_record_offset(record)
    if start + size > len(mapped):
        raise ValueError(f"record {record} runs past the end of the file")
    source = torch.frombuffer(mapped, dtype=torch.uint8, count=size, offset=start)
    copy = torch.empty(size, dtype=torch.uint8)
    copy.copy_(source)
    return copy


class _StorageType:
    def __init__(self, dtype: torch.dtype) -> None:
        self.itemsize = dtype.itemsize


class _StandIn:
    """Whatever else a pickle names (the module's classes, torch's rebuild functions):
    built from anything, and nothing."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        pass

    def __setstate__(self, state: Any) -> None:
        pass

    def __setitem__(self, key: Any, value: Any) -> None:
        pass

    def append(self, item: Any) -> None:
        pass

    def extend(self, items: Any) -> None:
        pass


class _StorageNames(pickle.Unpickler):
    """Reads a TorchScript pickle for the storages it names; every global is a stand-in, so
    that nothing of the file runs."""

    def __init__(self, pickled: bytes) -> None:
        super().__init__(io.BytesIO(pickled))
        self.sizes: dict[str, int] = {}

    def find_class(self, module: str, name: str) -> Any:
        if module == "torch" and name.endswith("Storage"):
            dtype = _STORAGE_TYPES.get(name)
            if dtype is None:
                raise _NotThisWay(f"a storage of unknown type torch.{name}")
            return _StorageType(dtype)
        return _StandIn

    def persistent_load(self, pid: Any) -> Any:
        if not (isinstance(pid, tuple) and len(pid) == 5 and pid[0] == "storage"):
            raise _NotThisWay(f"a persistent id that is not a storage: {pid!r:.80}")
        _, kind, key, _, numel = pid
        if not isinstance(kind, _StorageType) or not isinstance(key, str) or (
                type(numel) is not int or numel < 0):
            raise _NotThisWay(f"a storage named unlike torch.jit.save's: {pid!r:.80}")
        if self.sizes.setdefault(key, numel * kind.itemsize) != numel * kind.itemsize:
            raise _NotThisWay(f"storage {key!r} named with two sizes")
        return None


def _storage_sizes(pickled: bytes) -> dict[str, int]:
    """Each storage key a pickle names, with its size in bytes."""
    names = _StorageNames(pickled)
    names.load()
    return names.sizes
