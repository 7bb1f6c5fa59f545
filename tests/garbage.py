"""What of tensorgate's is left in reference cycles: such objects are freed only by the
garbage collector, whose generations the server freezes after loading, so whatever they hold
(a request's pooled buffers, a connection) waits for a collection, which is also a pause.
Tests that use this turn the collector off (tests/conftest.py's `collector_off`) so that
nothing is collected before they look."""

from __future__ import annotations

import gc
from collections import Counter
from collections.abc import Callable
from typing import Any


def cyclic_garbage(spared: Callable[[list[Any]], set[int]] | None = None) -> Counter[str]:
    """tensorgate's objects that only the collector would free, by type (then freed);
    `spared(garbage)`: the ids of those not to count (held by a cycle that is not ours)."""
    gc.set_debug(gc.DEBUG_SAVEALL)
    try:
        gc.collect()
        left_out = spared(gc.garbage) if spared is not None else set()
        found = Counter(type(o).__qualname__ for o in gc.garbage
                        if type(o).__module__.startswith("tensorgate") and id(o) not in left_out)
    finally:
        gc.garbage.clear()
        gc.set_debug(0)
        gc.collect()
    return found
