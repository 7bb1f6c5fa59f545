"""Triton's response cache: a model whose config says `response_cache { enable: true }`
answers a request it has answered before — the same version, the same inputs byte for byte
(names, datatypes, shapes) and the same outputs asked for — from here, without queueing or
running (a reload of the version is a new load: what the one before computed is not
served for it). One cache for the server (`--response-cache-bytes`), bounded in bytes, the least
recently used entry out first.

Keys are SHA-256 digests of the request, computed on the event loop (hashlib releases the
GIL on large buffers, but the loop waits: about 0.5 ms per MB here, with the CPU's SHA
instructions; BLAKE2b measured 40 % slower), so a cache pays where a model costs more than
hashing its inputs. The digest is cryptographic on purpose: with a fast non-cryptographic
hash a client could craft a request that collides with another's and have the other served
its answer. Entries own copies of the output
bytes (counted as "cache" copies to the request that filled them), never views of pooled
request buffers, so a cached answer holds no request's memory.
"""

from __future__ import annotations

import hashlib
import time
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from tensorgate.tensor.copies import CopyLedger, record_copy
from tensorgate.tensor.view import TensorView

__all__ = ["CacheStatistics", "ResponseCache"]

_ENTRY_OVERHEAD = 256  # bytes an entry costs beyond its tensors: key, dict, views (a guess)


@dataclass(frozen=True)
class CacheStatistics:
    limit_bytes: int
    bytes: int
    entries: int
    hits: int
    misses: int
    evictions: int
    lookup_ns: int = 0  # lookups' time, hits and misses, the digest included (`lookup`)
    insertion_ns: int = 0  # insertions' time (`put`), evictions and copies included


class ResponseCache:
    """Outputs by request digest, least recently used first out, within `limit_bytes`."""

    def __init__(self, limit_bytes: int) -> None:
        if limit_bytes <= 0:
            raise ValueError(f"a response cache needs a positive size, got {limit_bytes}")
        self.limit_bytes = limit_bytes
        self._entries: OrderedDict[bytes, tuple[dict[str, TensorView], int]] = OrderedDict()
        self._bytes = 0
        self._hits = 0
        self._misses = 0
        self._evictions = 0
        self._lookup_ns = 0
        self._insertion_ns = 0

    @staticmethod
    def key(model: str, load: int, inputs: Mapping[str, TensorView],
            outputs: Sequence[str] | None, parameters: Mapping[str, Any] | None = None) -> bytes:
        """The request's digest: model, the load of its version that answers it, each input
        (sorted by name) with its datatype, shape and bytes, the outputs asked for (None:
        all) and the request parameters its model sees (they may change its answer)."""
        digest = hashlib.sha256()
        digest.update(f"{model}\0{load}\0".encode())
        for name in sorted(inputs):
            view = inputs[name]
            digest.update(f"{name}\0{view.datatype.name}\0{view.shape}\0{view.nbytes}\0"
                          .encode())
            digest.update(view.memoryview())
        digest.update(repr(sorted(outputs) if outputs is not None else None).encode())
        if parameters:  # repr tells True from 1 and 1 from 1.0 and "1"
            digest.update(repr(sorted(parameters.items())).encode())
        return digest.digest()

    def lookup(self, model: str, load: int, inputs: Mapping[str, TensorView],
               outputs: Sequence[str] | None, parameters: Mapping[str, Any] | None
               ) -> tuple[bytes, dict[str, TensorView] | None]:
        """The request's key (`key`) and its cached outputs (`get`), timed for Triton's
        nv_cache_lookup_duration."""
        started = time.monotonic_ns()
        key = self.key(model, load, inputs, outputs, parameters)
        found = self.get(key)
        self._lookup_ns += time.monotonic_ns() - started
        return key, found

    def get(self, key: bytes) -> dict[str, TensorView] | None:
        """A fresh dict of the cached outputs (callers may replace entries), or None."""
        entry = self._entries.get(key)
        if entry is None:
            self._misses += 1
            return None
        self._entries.move_to_end(key)
        self._hits += 1
        return dict(entry[0])

    def put(self, key: bytes, outputs: Mapping[str, TensorView], ledger: CopyLedger) -> None:
        """Keep copies of `outputs` under `key`, evicting the least recently used to fit; an
        answer larger than the whole cache is not kept."""
        started = time.monotonic_ns()
        size = _ENTRY_OVERHEAD + sum(view.nbytes for view in outputs.values())
        if size > self.limit_bytes or key in self._entries:
            return
        while self._bytes + size > self.limit_bytes:
            _, (_, freed) = self._entries.popitem(last=False)
            self._bytes -= freed
            self._evictions += 1
        kept = {}
        for name, view in outputs.items():
            owned = bytearray(view.memoryview())
            record_copy(view.nbytes, "cache", ledger)
            kept[name] = TensorView(owned, view.datatype, view.shape, nbytes=view.nbytes,
                                    name=name)
        self._entries[key] = (kept, size)
        self._bytes += size
        self._insertion_ns += time.monotonic_ns() - started

    def statistics(self) -> CacheStatistics:
        return CacheStatistics(self.limit_bytes, self._bytes, len(self._entries), self._hits,
                               self._misses, self._evictions, self._lookup_ns,
                               self._insertion_ns)
