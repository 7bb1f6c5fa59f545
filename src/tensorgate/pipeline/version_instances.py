"""One model version's instances: built from its config, started, loaded and warmed up.

Where each instance runs (pipeline/instance_plan.py), whether the others run the first's
copy of a TorchScript model or each load their own, the spare on the loop's cores, the
scheduler that feeds them, and a failed load's instances stopped before its error is
raised; at the end, versions retired (drained, then stopped). The Engine (engine.py) owns
versions once they are loaded: it routes requests to them and says when to retire them.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Iterable
from dataclasses import replace

from tensorgate.errors import UnavailableError
from tensorgate.pipeline.aoti_check import check_aoti_package
from tensorgate.pipeline.batch_cap import GATHER_BYTES
from tensorgate.pipeline.executor import ExecutorThread
from tensorgate.pipeline.executor_settings import ExecutorSettings
from tensorgate.pipeline.handoff import LoopMailbox
from tensorgate.pipeline.instance_plan import (group_devices, loop_cores_help, model_filename,
                                               on_loop_cores, passive_instances, rate_claims,
                                               release_claims, setup_text, shares_weights,
                                               wants_spare)
from tensorgate.pipeline.loop_load import LoopLoad
from tensorgate.pipeline.model_options import (cpu_affinity, flag, int_parameter,
                                               streams_per_instance)
from tensorgate.pipeline.placement import Placement
from tensorgate.pipeline.postprocess import build_postprocessor
from tensorgate.pipeline.postprocess_pool import PostprocessPool
from tensorgate.pipeline.rate_limiter import Claim, RateLimiter
from tensorgate.pipeline.scheduler import Scheduler
from tensorgate.pipeline.served_config import served_spec
from tensorgate.pipeline.served_models import ServedVersion
from tensorgate.pipeline.sequences import SequenceScheduler
from tensorgate.pipeline.stats import ModelStatistics
from tensorgate.repository.layout import ModelSource, artifact_path
from tensorgate.repository.model_config import ModelConfigError, ModelSpec
from tensorgate.repository.model_file import is_aoti_package
from tensorgate.tensor.pool import BufferPool

__all__ = ["STOP_WAIT_S", "VersionInstances"]

log = logging.getLogger("tensorgate.engine")  # what a load says is the engine's, as before

STOP_WAIT_S = 5.0  # how long a refused load waits for its instances to let go of the model


def _never(*_: object) -> None:
    """A passive instance's scheduler callbacks: it is given no batch to report on."""


class VersionInstances:
    """Builds a version's instances with the engine's shared parts: the buffer pool, the
    post-processing pool, the placement, the rate limiter, the device asked for and the
    torch threads an instance gets."""

    def __init__(self, pool: BufferPool, postprocess: PostprocessPool,
                 placement: Placement | None, limiter: RateLimiter | None, device: str,
                 threads: int, summaries: bool, loop_load: LoopLoad) -> None:
        self._pool = pool
        self._postprocess = postprocess
        self._placement = placement
        self._limiter = limiter
        self._device = device
        self._threads = threads
        self._summaries = summaries  # each version keeps its latencies' quantile summaries
        self._loop_load = loop_load

    async def load(self, source: ModelSource, version: int, cached: bool
                   ) -> tuple[ModelSpec, Scheduler | SequenceScheduler, list[ExecutorThread],
                              ModelStatistics, list[Claim]]:
        """Version `version` of `source`'s model, its instances started, loaded and warmed
        up: its spec as served, its scheduler, instances, statistics (`cached`: its requests
        go through the response cache) and rate-limiter claims. A failed load stops every
        instance it started before raising."""
        loop = asyncio.get_running_loop()
        spec = source.spec
        by_group = group_devices(spec, self._device)
        devices = [device for group in by_group for device in group]
        chosen = model_filename(spec, devices)
        artifact, kind = artifact_path(source, version, chosen)
        if chosen:
            log.info("model %s v%d loads %s: cc_model_filenames' file for its GPUs' compute "
                     "capability", spec.name, version, chosen)
        if spec.decoupled and kind != "python":
            raise ModelConfigError(str(artifact), "'model_transaction_policy { decoupled: true }' "
                                                  "needs a Python model (model.py) whose forward "
                                                  "yields its responses")
        stats = ModelStatistics.of(spec, version, cached=cached, summaries=self._summaries)
        if kind == "pt2" and await loop.run_in_executor(None, is_aoti_package, artifact):
            spec = await loop.run_in_executor(None, check_aoti_package, artifact, spec,
                                              devices[0])
        # /config shows the default file it loaded; a cc_model_filenames file, as configured
        spec = served_spec(spec, "" if chosen else artifact.name, by_group)
        # a passive group's instances load, are not warmed up and are given no request
        # (Triton's instance_group passive: true); model_spec refuses a config with none
        # active
        passive = passive_instances(spec, by_group)
        scheduler: Scheduler | SequenceScheduler
        if spec.sequence is not None:  # each instance batches its own sequences
            scheduler = SequenceScheduler(spec, stats, loop, len(devices) - len(passive),
                                          source.directory)
            taking = iter(scheduler.instances)
            feeds = [None if i in passive else next(taking) for i in range(len(devices))]
        else:
            on_cpu = all(device.type == "cpu" for device in devices)
            scheduler = Scheduler(spec, stats, loop, measured_cap=flag(spec, "batch_cap", True),
                                  gather_bytes=GATHER_BYTES if on_cpu else None)
            feeds = [None if i in passive else scheduler for i in range(len(devices))]
        postprocessor = build_postprocessor(spec, source.directory)
        claims = rate_claims(self._limiter, spec, version, by_group)
        spares: set[int] = set()  # instances that run only when the others are busy
        said_datatype: set[str] = set()  # one warning a version (ExecutorSettings)
        sharing = shares_weights(spec, kind, devices)  # the first loads what all run

        def instance(index: int, first: ExecutorThread | None = None,
                     spare: bool = False) -> ExecutorThread:
            """Instance `index`; with `first`, running the model `first` loaded; with
            `spare`, on the loop's cores, run only when the others are busy."""
            settings = ExecutorSettings(
                spec=spec, version=version, artifact=artifact, kind=kind,
                directory=source.directory / str(version), device=devices[index],
                intra_op_threads=int_parameter(spec, ("INTRA_OP_THREAD_COUNT", "NUM_THREADS"),
                                                self._threads),
                cpu_affinity=cpu_affinity(spec), placement=self._placement,
                cuda_graphs=flag(spec, "cuda_graphs", True),
                postprocessor=postprocessor, instance=index,
                inference_mode=flag(spec, "INFERENCE_MODE", True),
                jit_optimize=not flag(spec, "DISABLE_OPTIMIZED_EXECUTION", False),
                streams_per_instance=streams_per_instance(spec),
                shared_runner=first.runner if first is not None else None,
                said_datatype=said_datatype,
                passive=index in passive and not (sharing and index == 0))
            if spare:
                assert self._placement is not None
                settings = on_loop_cores(self._placement, settings)
                spares.add(index)
            feed = feeds[index]
            executor = ExecutorThread(
                f"tg-exec-{spec.name}-v{version}-{index}", settings,
                LoopMailbox.for_loop(loop), self._pool, self._postprocess,
                *((feed.on_batch_done, feed.on_idle, feed.on_stream_end)
                  if feed is not None else (_never,) * 3))
            if first is not None:
                executor.forward_ns = first.forward_ns  # placed as the first measured it
            executor.start()
            return executor

        executors = []
        if sharing:
            executors.append(instance(0))  # loads and warms the model the others run
            try:
                await executors[0].ready
            except Exception:
                await self.abandon(executors, claims)
                executors.clear()  # (whose `ready` holds the error this frame raises)
                raise
            loaded = executors[0].runner
            first = executors[0] if loaded is not None and loaded.shareable else None
            if first is None:
                log.info("model %s v%d: each instance loads its own copy: its forward "
                         "assigns attributes, state two threads must not share",
                         spec.name, version)
            # The last of a heavy model's instances runs on the loop's cores as a spare, as
            # the one the server adds when left to its defaults: with all on the other
            # cores, instance_group count 2 served ResNet-50 on 2 cores at half the
            # defaults' rate (13 against 26 requests/s, bench/RESULTS.md)
            last = max(set(range(len(devices))) - passive)
            on_loop = first is not None and loop_cores_help(self._placement, spec, first)
            executors += [instance(index, first, on_loop and index == last)
                          for index in range(1, len(devices))]
        else:  # each its own copy, loaded at once
            executors += [instance(index) for index in range(len(devices))]
        results = await asyncio.gather(*(e.ready for e in executors), return_exceptions=True)
        errors = [r for r in results if isinstance(r, BaseException)]
        if errors:
            await self.abandon(executors, claims)
            executors.clear()
            try:  # the error leaves without this frame holding it (a cycle through its
                raise errors[0]  # traceback, kept for the collector)
            finally:
                del results, errors
        # an exported program's ranges (input_bounds.py), as the first instance that loaded
        # and warmed it up has them (not a passive one: it is not warmed up)
        spec = next(e.settings.spec for e in executors
                    if not e.settings.passive and e.settings.shared_runner is None)
        taking_feeds = [feed for feed in dict.fromkeys(feeds) if feed is not None]
        for feed in taking_feeds:
            feed.hold_ragged(spec.ragged_limits)
        if spec.decoupled and all(e.runner is not None and e.runner.requests is not None
                                  for e in executors):
            if "streams_per_instance" in spec.parameters:
                await self.abandon(executors, claims)
                raise ModelConfigError(str(artifact), "parameter 'streams_per_instance' is for "
                                                      "a tensorgate Model, whose forward yields "
                                                      "its responses; a Triton Python model's "
                                                      "requests stream through their response "
                                                      "senders once execute returns")
            for feed in taking_feeds:  # a Triton Python model's requests stream
                feed.batch_decoupled()
        elif spec.decoupled and spec.sequence is not None:
            await self.abandon(executors, claims)
            raise ModelConfigError(str(artifact), "'sequence_batching' with a decoupled model "
                                                  "needs a Triton Python model (class "
                                                  "TritonPythonModel), whose requests stream "
                                                  "through their response senders")
        elif any(e.runner is not None and e.runner.requests is not None for e in executors):
            for feed in taking_feeds:  # its execute takes the requests, ungathered
                feed.takes_requests_one_by_one()
        for index, (executor, given, claim) in enumerate(zip(executors, feeds, claims)):
            if given is not None:  # (none: passive)
                given.add_executor(executor, spare=index in spares, claim=claim,
                                   spare_when=self._loop_load.leaves_room)
        shared = sum(e.settings.shared_runner is not None for e in executors)
        log.info("model %s v%d ready on %s%s%s", spec.name, version,
                 ", ".join(f"{e.settings.device} ({e.cpus}{', a spare' if i in spares else ''}"
                           f"{', passive' if i in passive else ''})"
                           for i, e in enumerate(executors)),
                 f"; the last {shared} run the first's copy of the model" if shared else "",
                 setup_text(executors))
        if isinstance(scheduler, Scheduler) and wants_spare(self._placement, spec, executors):
            await self._add_spare(spec, version, scheduler, executors)
        return (spec, scheduler, executors, stats,
                [claim for claim in claims if claim is not None])

    async def retire(self, versions: Iterable[ServedVersion], drain_timeout_s: float) -> None:
        """Versions the engine no longer serves (unloaded, replaced, or loaded as the engine
        shut down): they stop taking requests, drain within `drain_timeout_s`, answer what
        could not finish with a reason, and their instances let go of the model."""
        versions = list(versions)
        reason = UnavailableError("the model is being unloaded; the request was not run")
        for v in versions:  # 1. stop accepting
            v.scheduler.close(reason)
        deadline = time.monotonic() + drain_timeout_s
        while any(v.scheduler.busy for v in versions) and time.monotonic() < deadline:
            await asyncio.sleep(0.002)  # 2. drain: queued and running work finishes
        for v in versions:  # 3. answer what could not finish, with a reason
            queued = v.scheduler.fail_queued(reason)
            running = v.scheduler.fail_running(UnavailableError(
                f"model '{v.spec.name}' was unloaded while this request ran; the drain "
                f"deadline of {drain_timeout_s} s passed"))
            if queued or running:
                log.warning("model %s v%d: %d queued and %d running requests answered with an "
                            "error at unload", v.spec.name, v.version, queued, running)
        for v in versions:  # 4. stop executors, release the model and the device
            for executor in v.executors:
                executor.stop()
            release_claims(self._limiter, v.claims)
        stopping = [e.stopped for v in versions for e in v.executors]
        if stopping:
            await asyncio.wait(stopping, timeout=max(deadline - time.monotonic(), 1.0))

    async def abandon(self, executors: list[ExecutorThread],
                      claims: list[Claim | None]) -> None:
        """A load that failed: its instances let go of the model, its claims are forgotten."""
        for executor in executors:
            executor.stop()
        await asyncio.wait([e.stopped for e in executors], timeout=STOP_WAIT_S)
        release_claims(self._limiter, claims)

    async def _add_spare(self, spec: ModelSpec, version: int, scheduler: Scheduler,
                         executors: list[ExecutorThread]) -> None:
        """Run the first instance's model (the same weights, no second copy) on the loop's
        cores, for batches that arrive while the first instance is busy."""
        first = executors[0]
        assert self._placement is not None
        settings = replace(on_loop_cores(self._placement, first.settings),
                           shared_runner=first.runner)
        spare = ExecutorThread(f"tg-exec-{spec.name}-v{version}-spare", settings,
                               LoopMailbox.for_loop(asyncio.get_running_loop()),
                               self._pool, self._postprocess,
                               scheduler.on_batch_done, scheduler.on_idle,
                               scheduler.on_stream_end)
        spare.forward_ns = first.forward_ns  # what a batch should take (idle_time.py)
        spare.start()
        try:
            await spare.ready
        except Exception as error:  # noqa: BLE001 - the model serves on without it
            log.warning("model %s v%d: no spare instance: %s", spec.name, version, error)
            return
        executors.append(spare)
        scheduler.add_executor(spare, spare=True, spare_when=self._loop_load.leaves_room)
        log.info("model %s v%d: a spare instance on %s for batches that arrive while the "
                 "first is busy", spec.name, version, spare.cpus)
