"""Requests that must reach the pipeline in the order they arrived, though each may wait on
the loop on its way there (a sequence's requests on one gRPC connection, whose large typed
contents decode a piece at a time).

Each takes its turn as it arrives, before it first waits; once ready it waits for the turn
before it to be over, and ends its own turn just before it goes into the pipeline. The next
one runs only when this one next waits, inside the pipeline, with its place taken there: so
order holds, and a request with nothing before it waits for nothing.
"""

from __future__ import annotations

import asyncio

__all__ = ["InOrder", "Turn"]


def _finish(over: asyncio.Future[None]) -> None:
    if not over.done():
        over.set_result(None)


class Turn:
    """One request's place: `wait()` for those before it, then `end()` (always: a request
    that fails or is cancelled ends its turn too, or those after it would wait forever)."""

    __slots__ = ("_before", "_over")

    def __init__(self, before: asyncio.Future[None] | None, over: asyncio.Future[None]) -> None:
        self._before, self._over = before, over

    async def wait(self) -> None:
        if self._before is not None and not self._before.done():
            # shielded: a cancelled request must not cancel the turn before it
            await asyncio.shield(self._before)
        self._before = None

    def end(self) -> None:
        """Over now, if those before are; else as soon as they are (a request that failed
        before its wait must not let the next pass one before it)."""
        before = self._before
        if before is None or before.done():
            _finish(self._over)
        else:
            before.add_done_callback(lambda _: _finish(self._over))


class InOrder:
    """The turns of one connection's ordered requests."""

    __slots__ = ("_last",)

    def __init__(self) -> None:
        self._last: asyncio.Future[None] | None = None

    def turn(self) -> Turn:
        """The next turn, after every one taken so far."""
        over: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        turn = Turn(self._last, over)
        self._last = over
        return turn
