"""What of tensorgate's is left in reference cycles: such objects are freed only by the
garbage collector, whose generations the server freezes after loading, so whatever they hold
(a request's pooled buffers, a connection) waits for a collection, which is also a pause.
Tests that use this turn the collector off (tests/conftest.py's `collector_off`) so that
nothing is collected before they look."""

from __future__ import annotations

import gc
from collections import Counter


def cyclic_garbage() -> Counter[str]:
    """tensorgate's objects that only the collector would free, by type (then freed)."""
    gc.set_debug(gc.DEBUG_SAVEALL)
    try:
        gc.collect()
        found = Counter(type(o).__qualname__ for o in gc.garbage
                        if type(o).__module__.startswith("tensorgate"))
    finally:
        gc.garbage.clear()
        gc.set_debug(0)
        gc.collect()
    return found
