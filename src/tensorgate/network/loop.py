"""Which event loop runs the server. asyncio is the default: on the 2-core VMs uvloop's
`call_soon_threadsafe` round trip measured 54 µs against asyncio's 21 µs (bench/RESULTS.md),
and every inference crosses that way once."""

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
