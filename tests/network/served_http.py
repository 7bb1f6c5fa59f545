"""An HTTP front end served in the test's own loop, over an engine on a repository: for
tests that watch the connection from inside the process (the loop's turns, its writes)."""

from __future__ import annotations

import contextlib
import pathlib
from collections.abc import AsyncIterator
from typing import TypeVar

from tensorgate.dataplane import DataPlane
from tensorgate.network import ConnectionBudget
from tensorgate.network.http import HttpFrontEnd
from tensorgate.pipeline.engine import Engine
from tensorgate.tensor.pool import BufferPool

Plane = TypeVar("Plane", bound=DataPlane)


@contextlib.asynccontextmanager
async def served_http(repo: pathlib.Path, plane_type: type[Plane],
                      max_request_bytes: int = 1 << 20
                      ) -> AsyncIterator[tuple[Plane, HttpFrontEnd, int]]:
    """The front end on 127.0.0.1 over an engine serving `repo` (an empty folder: no
    models), its data plane a `plane_type`: the plane, the front end, its port. Shut down on
    the way out however the test leaves."""
    pool = BufferPool()
    engine = Engine(repo, pool=pool)
    await engine.start()
    plane = plane_type(engine, "test")
    plane.started = True
    front = HttpFrontEnd(plane, pool, max_request_bytes, budget=ConnectionBudget())
    try:
        yield plane, front, await front.start("127.0.0.1", 0)
    finally:
        front.stop_accepting()
        await front.close()
        await engine.shutdown(1.0)
