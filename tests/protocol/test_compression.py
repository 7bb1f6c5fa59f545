"""Request decompression into pooled buffers: what comes out, where it lands, what it
counts, and what is refused."""

from __future__ import annotations

import gzip
import zlib

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tensorgate.errors import InvalidArgumentError, PoolExhaustedError
from tensorgate.protocol import compression
from tensorgate.protocol.compression import inflate, inflate_steps
from tensorgate.tensor.copies import CopyLedger
from tensorgate.tensor.pool import BufferPool

_LIMIT = 8 << 20


def _packed(data: bytes, encoding: str) -> bytes:
    return gzip.compress(data) if encoding == "gzip" else zlib.compress(data)


def _address(view: memoryview) -> int:
    return np.frombuffer(view, np.uint8).ctypes.data


@settings(max_examples=60, deadline=None)
@given(data=st.binary(max_size=5000), repeat=st.integers(1, 600),
       encoding=st.sampled_from(["gzip", "deflate"]), pad=st.integers(0, 63))
def test_what_comes_out_is_what_went_in_at_the_pad(data: bytes, repeat: int, encoding: str,
                                                  pad: int) -> None:
    """Any size (past the first guess and the chunk, so that buffers grow): the bytes,
    the pad honoured in a pooled buffer, and each output byte counted twice plus what
    growing moved."""
    pool = BufferPool(64 << 20)
    original = data * repeat
    ledger = CopyLedger()
    out = inflate(_packed(original, encoding), encoding, _LIMIT, "body", ledger,
                  pool.acquire, pad)
    assert out is not None and bytes(out) == original
    assert (_address(out) - pad) % 64 == 0 if original else True
    assert pool.statistics().bytes_in_use >= len(original)
    assert ledger.bytes >= 2 * len(original)


def test_a_gzip_body_is_decompressed_into_one_buffer_of_its_stated_size() -> None:
    """gzip's trailer says how large: one buffer, nothing moved, two writes a byte."""
    original = np.arange(3 << 18, dtype=np.float32).tobytes()  # 3 MiB, past the chunk size
    pool = BufferPool(64 << 20)
    ledger = CopyLedger()
    out = inflate(gzip.compress(original), "gzip", _LIMIT, "body", ledger, pool.acquire, 16)
    assert out is not None and bytes(out) == original
    assert pool.statistics().misses == 1
    assert ledger.bytes == 2 * len(original)


def test_decompression_yields_a_turn_to_the_loop_each_mib() -> None:
    """In steps (protocol.steps), the same bytes: 12 MB of gzipped random floats took 43 ms
    in one go, the loop waiting."""
    original = np.random.default_rng(5).standard_normal(6 << 18).astype(np.float32).tobytes()
    steps = inflate_steps(gzip.compress(original, 1), "gzip", 64 << 20, "body", CopyLedger(),
                          BufferPool(64 << 20).acquire)
    turns = 0
    while True:
        try:
            next(steps)
        except StopIteration as done:
            out = done.value
            break
        turns += 1
    assert out is not None and bytes(out) == original
    assert turns >= len(original) // (1 << 20) - 1


def test_a_false_size_in_the_gzip_trailer_is_refused_and_its_buffer_given_back() -> None:
    """The trailer's size only sizes the first buffer (if deflate could make that much of
    the body): zlib checks it, and the body is refused by name when it lies."""
    original = b"tensor bytes " * 40_000
    packed = bytearray(gzip.compress(original))
    pool = BufferPool(64 << 20)
    for stated in (1, 1000 * len(packed), 0xFFFF_FFFF):
        packed[-4:] = stated.to_bytes(4, "little")
        with pytest.raises(InvalidArgumentError, match="incorrect length check"):
            inflate(bytes(packed), "gzip", _LIMIT, "body", CopyLedger(), pool.acquire)
        assert pool.statistics().bytes_in_use == 0


@pytest.mark.parametrize("encoding", ["gzip", "deflate"])
def test_the_limit_is_exact(encoding: str) -> None:
    pool = BufferPool(64 << 20)
    at_limit = _packed(b"\0" * 100_000, encoding)
    assert len(inflate(at_limit, encoding, 100_000, "body", CopyLedger(), pool.acquire)) == 100_000
    past = _packed(b"\0" * 100_001, encoding)
    assert inflate(past, encoding, 100_000, "body", CopyLedger(), pool.acquire) is None


def test_a_bomb_stops_at_the_limit_without_holding_more() -> None:
    """64 MB of zeros in 64 KB: refused having held at most the limit (and a buffer
    class's rounding) of the pool, which then has it all back."""
    bomb = zlib.compress(b"\0" * (64 << 20), 9)
    pool = BufferPool(1 << 30)
    most = []

    def acquire(nbytes: int):
        buffer = pool.acquire(nbytes)
        most.append(pool.statistics().bytes_in_use)
        return buffer
    assert inflate(bomb, "deflate", 4 << 20, "body", CopyLedger(), acquire) is None
    assert max(most) <= 2 * (5 << 20)
    assert pool.statistics().bytes_in_use == 0


def test_a_full_pool_refuses_the_decompressed_body_by_name() -> None:
    pool = BufferPool(1 << 20)
    with pytest.raises(PoolExhaustedError):
        inflate(gzip.compress(b"\0" * (2 << 20)), "gzip", _LIMIT, "body", CopyLedger(),
                pool.acquire)
    assert pool.statistics().bytes_in_use == 0


@pytest.mark.parametrize("encoding", ["gzip", "deflate"])
def test_a_truncated_stream_is_refused_by_name(encoding: str) -> None:
    packed = _packed(bytes(range(256)) * 5000, encoding)
    pool = BufferPool(64 << 20)
    for cut in (1, len(packed) // 2, len(packed) - 1):
        with pytest.raises(InvalidArgumentError, match=f"^the {encoding} message is truncated"):
            inflate(packed[:cut], encoding, _LIMIT, "message", CopyLedger(), pool.acquire)


def test_bytes_that_are_not_the_format_are_refused_by_name() -> None:
    pool = BufferPool(64 << 20)
    with pytest.raises(InvalidArgumentError, match="^the gzip body cannot be decompressed: "):
        inflate(b"\x1f\x8bnot gzip at all", "gzip", _LIMIT, "body", CopyLedger(), pool.acquire)


def test_input_is_fed_a_slice_at_a_time(monkeypatch: pytest.MonkeyPatch) -> None:
    """zlib copies the input it leaves unread on every call: fed whole, a large
    incompressible body would be copied once per output chunk (quadratic)."""
    original = np.random.default_rng(0).bytes(3 << 20)
    packed = zlib.compress(original, 1)
    fed = []

    make = zlib.decompressobj

    class Counting:
        def __init__(self) -> None:
            self._inner = make()

        def decompress(self, data, max_length):
            fed.append(len(data))
            return self._inner.decompress(data, max_length)

        def __getattr__(self, name):
            return getattr(self._inner, name)

    monkeypatch.setattr(compression.zlib, "decompressobj", lambda wbits: Counting())
    out = inflate(packed, "deflate", _LIMIT, "body", CopyLedger(), BufferPool(64 << 20).acquire)
    assert out is not None and bytes(out) == original
    assert max(fed) <= 256 << 10


@settings(max_examples=200, deadline=None)
@given(original=st.binary(max_size=3000), encoding=st.sampled_from(["gzip", "deflate"]),
       cut=st.integers(0, 4000), flips=st.lists(st.tuples(st.integers(0, 4000),
                                                           st.integers(1, 255)), max_size=4),
       limit=st.integers(0, 5000))
def test_hostile_bytes_are_refused_by_name_or_come_out_whole(
        original: bytes, encoding: str, cut: int, flips: list[tuple[int, int]],
        limit: int) -> None:
    """Any cut and any flipped bytes of a compressed body: the result is the original
    (within the limit), None (past it) or InvalidArgumentError naming the format; never
    another error, and every pooled buffer goes back."""
    whole = _packed(original, encoding)
    packed = bytearray(whole[:cut])
    for where, mask in flips:
        if where < len(packed):
            packed[where] ^= mask
    intact = packed == whole
    pool = BufferPool(1 << 20)
    try:
        out = inflate(bytes(packed), encoding, limit, "body", CopyLedger(), pool.acquire)
    except InvalidArgumentError as error:
        assert error.message.startswith(f"the {encoding} body ") and not intact
    else:
        if intact:
            assert (out is None) == (len(original) > limit)
            assert out is None or bytes(out) == original
        else:
            assert out is None or len(out) <= limit
        del out
    assert pool.statistics().bytes_in_use == 0


def _steps(steps) -> tuple[bytes, int]:  # type: ignore[no-untyped-def]
    turns = 0
    while True:
        try:
            next(steps)
        except StopIteration as done:
            return done.value, turns
        turns += 1


@pytest.mark.parametrize("encoding", ["gzip", "deflate"])
def test_an_answer_is_compressed_at_the_fastest_level_a_slice_at_a_time(encoding: str) -> None:
    """Answers: zlib's fastest level (a 1.6 MB JSON answer took 151 ms at the default, 23 at
    1), 256 KiB of input a step, the loop's turn between steps; the parts read as one body."""
    values = np.random.default_rng(0).random(400_000).astype(np.float32)
    parts = [b'{"head": 1}', memoryview(values.tobytes()), b"tail"]
    packed, turns = _steps(compression.deflate_steps(parts, encoding))
    whole = b"".join(bytes(p) for p in parts)
    if encoding == "gzip":
        assert gzip.decompress(packed) == whole
        assert packed[8] == 4  # XFL: "compressor used fastest algorithm" (RFC 1952)
    else:
        assert zlib.decompress(packed) == whole
        assert packed[1] >> 6 == 0  # FLEVEL 0: the fastest (RFC 1950)
    assert turns == len(values.tobytes()) // (256 << 10)  # 1.6 MB view: 6 full slices, 7 steps


def test_binary_tensors_are_worth_compressing_only_where_samples_shrink() -> None:
    rng = np.random.default_rng(1)
    noise = memoryview(rng.standard_normal(150_528).astype(np.float32).tobytes())
    gradient = memoryview(np.tile(np.arange(224, dtype=np.uint8), 3 * 224).tobytes())
    assert not compression.worth_compressing([noise])  # FP32 noise: about 0.9 at best
    assert compression.worth_compressing([memoryview(bytes(602_112))])
    assert compression.worth_compressing([noise[:100], gradient])  # the largest decides
    assert not compression.worth_compressing([memoryview(rng.bytes(1000))])  # a small one
    assert compression.worth_compressing([])  # nothing binary: a JSON answer
