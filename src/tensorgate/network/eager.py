"""A request's handler coroutine, run on the loop without an asyncio Task.

A task's first step waits for the loop's next turn (`call_soon`), and each of its steps goes
through `Task.__step`, the task registry's WeakSet and a copied context. An HTTP request's
handler runs a few microseconds of Python and then awaits one future (its model's answer):
`EagerRun` starts it at once, in the callback that completed the request, and resumes it
from that future's done callback. What a connection needs of it is what it used of a task:
`done()` and `cancel()`, with a task's meaning.

The handler may await futures (and what awaits them: coroutines, `asyncio.Queue`, async
generators) and `asyncio.sleep(0)`; nothing in it may ask for `asyncio.current_task()`,
which is None here.
"""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any

__all__ = ["EagerRun"]


class EagerRun:
    """`coro` driven as a task would drive it, from `start()` on."""

    __slots__ = ("_coro", "_loop", "_waiting", "_must_cancel", "_done")

    def __init__(self, coro: Coroutine[Any, Any, None], loop: asyncio.AbstractEventLoop) -> None:
        self._coro = coro
        self._loop = loop
        self._waiting: asyncio.Future[Any] | None = None  # the future it awaits
        self._must_cancel = False  # cancelled when not awaiting a future that could be
        self._done = False

    def start(self) -> None:
        """Run it until it first waits (or ends), now. Separate from construction so that
        the caller holds it before any of it runs: a handler may finish at once, and what
        it does on finishing may start the next one."""
        self._step()

    def done(self) -> bool:
        return self._done

    def cancel(self) -> bool:
        """As `Task.cancel`: the awaited future is cancelled, so the coroutine meets
        CancelledError where it awaits; if that future is done already (its callback is on
        its way) or it awaits nothing, CancelledError is thrown in at its next step."""
        if self._done:
            return False
        waiting = self._waiting
        if waiting is None or not waiting.cancel():
            self._must_cancel = True
        return True

    def _wake(self, future: asyncio.Future[Any]) -> None:
        self._waiting = None
        self._step()

    def _step(self) -> None:
        coro = self._coro
        try:
            if self._must_cancel:
                self._must_cancel = False
                yielded = coro.throw(asyncio.CancelledError())
            else:
                yielded = coro.send(None)
        except (StopIteration, asyncio.CancelledError):
            self._done = True
            return
        except BaseException:
            self._done = True
            raise
        if getattr(yielded, "_asyncio_future_blocking", False):  # `await` of a future
            yielded._asyncio_future_blocking = False
            self._waiting = yielded
            yielded.add_done_callback(self._wake)
        elif yielded is None:  # a bare yield (asyncio.sleep(0)): the loop's next turn
            self._loop.call_soon(self._step)
        else:
            self._done = True
            coro.close()
            raise RuntimeError(f"a request handler yielded {yielded!r}, which is no future")
