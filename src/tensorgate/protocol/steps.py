"""Protocol work done in steps: a generator that yields between slices of a long decode or
encode and returns its result. The front end awaits a turn of the event loop at each yield
(network.in_steps), so that one large request does not hold every other client; elsewhere
the steps run straight through."""

from __future__ import annotations

from collections.abc import Generator
from typing import Any, TypeVar

__all__ = ["Steps", "run_through"]

Steps = Generator[None, None, Any]
T = TypeVar("T")


def run_through(steps: Generator[None, None, T]) -> T:
    """The steps' result, run without a pause."""
    while True:
        try:
            next(steps)
        except StopIteration as done:
            result: T = done.value
            return result
