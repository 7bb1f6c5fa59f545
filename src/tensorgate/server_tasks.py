"""The server's periodic work, each a task the server starts and cancels at its stop:
metrics sampled off the loop, the pool trimmed when quiet, stalled requests and idle
connections expired, long model calls warned of, and the repository followed
(--model-control-mode poll)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable

from tensorgate.errors import NotFoundError, TensorgateError
from tensorgate.gpu_metrics import GpuSampler, NvmlError
from tensorgate.network.grpc import GrpcFrontEnd
from tensorgate.network.http import HttpFrontEnd
from tensorgate.pipeline.engine import Engine
from tensorgate.repository.layout import ModelRepositories
from tensorgate.tensor.pool import QUIET_IDLE_BYTES, BufferPool, default_pool

__all__ = ["POOL_TRIM_PERIOD_S", "expire_stalled", "fingerprints", "follow_repository",
           "gpu_sampler", "sample_every", "trim_when_quiet", "watch_model_calls"]

log = logging.getLogger("tensorgate.server")

POOL_TRIM_PERIOD_S = 1.0  # the pool goes back to its quiet size 1–2 s after the last request


async def sample_every(sample: Callable[[], object], period_s: float) -> None:
    """Triton's CPU or GPU metrics every `period_s`, read off the loop (/proc files, NVML)."""
    loop = asyncio.get_running_loop()
    while True:
        await asyncio.sleep(period_s)
        await loop.run_in_executor(None, sample)


def gpu_sampler() -> GpuSampler | None:
    """NVML's sampler with its first sample taken, or None, said once: at info where the
    server has a GPU to watch, at debug on a machine without one."""
    try:
        sampler = GpuSampler()
    except NvmlError as error:
        log.log(logging.INFO if default_pool().statistics().pinned else logging.DEBUG,
                "GPU metrics (nv_gpu_*) are not collected: %s", error)
        return None
    sampler.sample()
    log.info("GPU metrics (nv_gpu_*) from NVML for %s", ", ".join(sampler.uuids))
    return sampler


async def trim_when_quiet(pool: BufferPool) -> None:
    """Give the pool's idle excess back once a period passes with no buffer acquired."""
    while True:
        await asyncio.sleep(POOL_TRIM_PERIOD_S)
        freed = pool.trim_if_quiet(QUIET_IDLE_BYTES)
        if freed:
            log.debug("pool: %d idle bytes freed after a quiet period", freed)


async def watch_model_calls(engine: Engine, warn_s: float) -> None:
    """Warn once a call when an instance's call into its model has run `warn_s` or more: a
    model that deadlocks or hangs holds its instance with nothing else saying so (the metric
    tensorgate_model_call_seconds shows the same, growing)."""
    warned: set[tuple[str, float]] = set()  # (instance, when its call began)
    while True:
        await asyncio.sleep(min(5.0, warn_s / 2))
        running = set()
        for call in engine.model_calls():
            if call.seconds < warn_s:
                continue
            key = (call.instance, call.since)
            running.add(key)
            if key not in warned:
                warned.add(key)
                rows = call.rows
                what = (f"a batch of {rows} row{'s' if rows != 1 else ''}" if rows
                        else "a streaming step")
                ids = call.request_ids
                named = (f" (request{'s' if len(ids) > 1 else ''} "
                         f"{', '.join(ids[:5])}{', ...' if len(ids) > 5 else ''})"
                         if ids else "")
                log.warning("model %s v%d: %s%s has been in the model for %.0f s on %s and "
                            "has not returned (--model-call-warn-secs %g)", call.model,
                            call.version, what, named, call.seconds, call.instance, warn_s)
        warned &= running  # calls that ended are forgotten


async def expire_stalled(fronts: list[HttpFrontEnd | GrpcFrontEnd], period_s: float
                          ) -> None:
    """Every `period_s`: requests whose bytes stopped arriving are answered, idle HTTP/1.1
    connections closed (one sweep for all connections: no timer per read)."""
    while True:
        await asyncio.sleep(period_s)
        now = time.monotonic()
        for front in fronts:
            front.expire(now)


async def fingerprints(repositories: ModelRepositories
                        ) -> dict[str, tuple[object, ...]] | None:
    """The repositories' models as fingerprints, read on a worker thread (file system calls
    never run on the loop); None when a repository cannot be read."""
    try:
        return await asyncio.to_thread(repositories.fingerprints)
    except (TensorgateError, OSError) as error:
        log.warning("repository poll: cannot read %s: %s", repositories, error)
        return None


async def follow_repository(engine: Engine, seen: dict[str, tuple[object, ...]],
                             period_s: float) -> None:
    """--model-control-mode poll: every `period_s`, load models added to a repository,
    reload those whose files changed, unload those removed. A reload that fails leaves the
    served versions serving (the index reports the failure); the model is tried again
    when its files change again."""
    while True:
        await asyncio.sleep(period_s)
        current = await fingerprints(engine.repositories)
        if current is None:
            continue  # an unreadable repository is not an empty one: unload nothing
        for name in sorted(set(seen) - set(current)):
            log.info("repository poll: model %s was removed; unloading it", name)
            with contextlib.suppress(NotFoundError):
                await engine.unload(name)
        for name in sorted(current):
            if seen.get(name) == current[name]:
                continue
            log.info("repository poll: model %s %s; loading it", name,
                     "changed" if name in seen else "was added")
            try:
                await engine.load(name)
            except TensorgateError as error:
                log.error("repository poll: model %s failed to load: %s", name, error.message)
        seen = current
