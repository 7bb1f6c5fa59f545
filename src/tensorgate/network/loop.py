"""Which event loop runs the server: uvloop where it is installed (`auto`, the default; it is
a dependency but on Windows), else asyncio. A bare thread hand-off is slower on uvloop (54 µs
against 21 with an idle worker, bench/RESULTS.md), but with its transports doing the rest of
a request the server is faster on it: 8 identity connections cost 0.92 of asyncio's server
CPU a request over HTTP and 0.90 over gRPC (bench/ab_bench.py, twenty-seventh session). That
took its transports never holding a view of a pooled answer (network/socket_send.py)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from typing import Any

__all__ = ["run_loop"]


def run_loop(main: Coroutine[Any, Any, Any], choice: str) -> Any:
    if choice in ("uvloop", "auto"):
        try:
            import uvloop
        except ImportError:
            if choice == "uvloop":
                raise RuntimeError("--loop uvloop, but uvloop is not installed") from None
        else:
            runner: Callable[[Coroutine[Any, Any, Any]], Any] = uvloop.run
            return runner(main)
    return asyncio.run(main)
