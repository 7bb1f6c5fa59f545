"""A file damaged as the loaders' damage tests damage one: cut short, or one bit flipped."""

from __future__ import annotations

import pathlib


def damaged_copy(good: bytes, folder: pathlib.Path, cut: bool, at: float, bit: int
                 ) -> pathlib.Path:
    """`good` cut at the fraction `at` of its length, or with bit `bit` of the byte there
    flipped, written to `folder`/damaged.pt."""
    place = int(at * len(good))
    damaged = bytearray(good[:place] if cut else good)
    if not cut:
        damaged[place] ^= 1 << bit
    path = folder / "damaged.pt"
    path.write_bytes(damaged)
    return path
