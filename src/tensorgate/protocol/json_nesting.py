"""A nested JSON array's brackets, and whether they are those of evenly nested lists: what
json_slices (numbers) and json_strings (strings) need to read `x.tolist()` a slice at a time
as numpy reads it whole, its values in row-major order."""

from __future__ import annotations

import numpy as np

__all__ = ["Brackets", "MAX_NESTING", "even_lists"]

_OPEN, _CLOSE = 0x5B, 0x5D


class Brackets:
    """A nested array's brackets: where each is in the body (`at`, in order) and the depth
    after it (`levels`: 1 after the array's own `[`, 0 after its `]`)."""

    __slots__ = ("at", "levels", "opens")

    def __init__(self, at: np.ndarray, levels: np.ndarray,
                 opens: np.ndarray | None = None) -> None:
        self.at, self.levels = at, levels
        # which are `[` (found from the levels when not given)
        self.opens = np.diff(levels, prepend=0) > 0 if opens is None else opens


MAX_NESTING = 32  # numpy makes arrays of up to 64 dimensions; orjson parses 1,024 deep


def even_lists(brackets: Brackets) -> int | None:
    """How deep the innermost lists are, if the brackets are those of evenly nested lists
    of some shape (their widths are the slices' to check); None otherwise, or nested deeper
    than MAX_NESTING."""
    skeleton = np.where(brackets.opens, np.uint8(_OPEN), np.uint8(_CLOSE)).tobytes()
    dims = len(skeleton) - len(skeleton.lstrip(b"["))
    if not 2 <= dims <= MAX_NESTING:
        return None
    expected = b"[]"
    for level in range(dims - 1, 0, -1):
        # Evenly nested, the first list at this level opens at level - 1 and closes with the
        # first run of as many `]` as there are levels from it down, and holds `dim` of the
        # lists below. Read so, any skeleton gives some shape; comparing it with that shape's
        # own skeleton decides.
        run = dims - level + 1
        close = skeleton.find(b"]" * run)
        dim, rest = divmod(close + run - level - 1, len(expected))
        if close < 0 or rest or dim < 1:
            return None
        expected = b"[" + expected * dim + b"]"
    return dims if expected == skeleton else None
