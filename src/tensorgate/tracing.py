"""Triton's trace extension: which requests are traced, at what level, and where their
traces go — set at start (`--trace-config`), read and changed while the server runs (HTTP
`/v2[/models/M]/trace/setting`, gRPC `TraceSetting`).

Settings are global, and per model where a client set some for it: a model's unset settings
follow the global ones; clearing one (null) gives it back the global value, and clearing a
global one gives back the value the server started with. The trace file cannot be changed
from outside, as log_file cannot: any client could otherwise choose a file for the server
to write.

Traces are written off the loop, one write at a time and in order, in the loop's default
executor. With log_frequency N, each N traces of a setting go to `<file>.<index>`. With 0,
Triton writes `<file>` only at shutdown; here the file is also appended every
APPEND_EVERY traces, staying one JSON array, so that a long run neither holds every trace
nor loses them all to a crash. At most MAX_HELD traces, holding at most MAX_HELD_BYTES of
tensors, wait to be written: past that, requests go untraced and are counted in `dropped`
(a slow disk, or TENSORS on every request, must not grow the server without end). At
shutdown the server waits for them a bounded time; what is left then is not written.

In opentelemetry mode (Triton's `--trace-config mode=opentelemetry`) the same settings
choose the requests, and an exporter (tensorgate/tracing_otlp.py) sends them as spans
instead of a file: there is no file nor log_frequency, TENSORS is not traced, a rate of 0
traces only requests whose caller's W3C traceparent says it sampled them, and those are
traced whatever the rate and count.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from typing import Any, BinaryIO, Protocol

from tensorgate.errors import InvalidArgumentError
from tensorgate.pipeline.trace import SpanContext, Trace
from tensorgate.trace_settings import check_level, check_number, parse_setting
from tensorgate.tracing_otlp import parse_traceparent

__all__ = ["APPEND_EVERY", "MAX_HELD", "MAX_HELD_BYTES", "ExportDone", "TraceExporter",
           "Tracer"]

log = logging.getLogger("tensorgate.trace")

_FIXED = ("trace_file", "trace_mode")  # shown, and set only when the server starts
MAX_HELD = 10_000
MAX_HELD_BYTES = 256 << 20
APPEND_EVERY = 256
_TAIL = b"\n]\n"  # how every trace file ends: appending writes over it
_ATTRIBUTES = {"trace_level": "level", "trace_rate": "rate", "trace_count": "count",
               "log_frequency": "log_frequency"}


class TraceExporter(Protocol):
    """Where opentelemetry mode's traces go (tracing_otlp.OtlpExporter)."""

    def add(self, trace: Trace) -> bool: ...

    async def close(self, timeout_s: float) -> None: ...


# called back by an exporter once a batch of traces is sent (True) or dropped (False)
ExportDone = Callable[[list[Trace], bool], None]


class _Scope:
    """One setting's values and its sampling state: the global one, or a model's."""

    __slots__ = ("own", "level", "rate", "count", "log_frequency", "seen", "pending")

    def __init__(self, level: tuple[str, ...], rate: int, count: int,
                 log_frequency: int) -> None:
        self.own: dict[str, Any] = {}  # a model's: the settings a client set for it
        self.level = level
        self.rate = rate
        self.count = count             # traces still to take; -1: no end
        self.log_frequency = log_frequency
        self.seen = 0                  # requests since the last one traced
        self.pending: list[Trace] = []  # finished, not yet handed to the writer

    def set(self, name: str, value: Any) -> None:
        setattr(self, _ATTRIBUTES[name], value)

    def get(self, name: str) -> Any:
        return getattr(self, _ATTRIBUTES[name])

    @property
    def tracing(self) -> bool:
        return bool(self.level) and self.count != 0


class Tracer:
    """The server's trace settings, the sampling they ask for, and the writing of traces."""

    def __init__(self, file: str | os.PathLike[str] | None = None,
                 level: Sequence[str] = (), rate: int = 1000, count: int = -1,
                 log_frequency: int = 0,
                 exporter: Callable[[ExportDone], TraceExporter] | None = None) -> None:
        """`exporter`: opentelemetry mode, given what to call back when traces are sent."""
        self.file = os.fspath(file) if file else ""
        self._exporter = exporter(self._exported) if exporter is not None else None
        try:
            if self._exporter is not None and (self.file or log_frequency):
                raise InvalidArgumentError("opentelemetry mode sends spans, not a file: no "
                                           "trace file nor log_frequency")
            levels = check_level(list(level), self._exporter is not None)
            for name, number in (("trace_rate", rate), ("trace_count", count),
                                 ("log_frequency", log_frequency)):
                check_number(name, number, self._exporter is not None)
        except InvalidArgumentError as error:
            raise ValueError(error.message) from None
        if levels and not self.file and self._exporter is None:
            raise ValueError("tracing needs a file to write: give one with "
                             "--trace-config triton,file=PATH")
        self._start: dict[str, Any] = {"trace_level": levels, "trace_rate": rate,
                                       "trace_count": count, "log_frequency": log_frequency}
        self._global = _Scope(levels, rate, count, log_frequency)
        self._models: dict[str, _Scope] = {}
        self.on = self._tracing()       # whether any request may be traced: checked first
        self.dropped = 0                # requests left untraced: MAX_HELD traces waited
        self.written = 0                # traces in the file (counted by the writer)
        self._last_id = 0
        self._unwritten = 0             # traces sampled or collected, not yet written
        self._held_bytes = 0            # their tensors' bytes, once collected
        self._abandoned = False         # shutdown stopped waiting: write no more
        self._index = 0                 # the next `<file>.<index>`
        self._writes: deque[tuple[str, bool, list[Trace]]] = deque()  # (path, append, traces)
        self._writing: asyncio.Future[None] | None = None
        self._begun: set[str] = set()   # files this server has written once (the writer's)

    @property
    def mode(self) -> str:
        """Triton's trace mode: "triton" (a file) or "opentelemetry" (spans)."""
        return "triton" if self._exporter is None else "opentelemetry"

    # -- settings --------------------------------------------------------------------------

    def current(self, model: str | None = None) -> dict[str, str | list[str]]:
        """The settings that apply to `model`'s requests (None: the global ones), as the
        trace extension writes them: strings, and the level as a list."""
        scope = self._scope(model)
        return {"trace_file": self.file, "trace_level": list(scope.level) or ["OFF"],
                "trace_rate": str(scope.rate), "trace_count": str(scope.count),
                "log_frequency": str(scope.log_frequency), "trace_mode": self.mode}

    def update(self, changes: Mapping[str, Any], model: str | None = None
               ) -> dict[str, str | list[str]]:
        """Check every change, then make them all (none if one is wrong): a value sets, None
        clears. `model` must name a model the server has (the caller checks). Returns the
        settings now."""
        otel = self._exporter is not None
        parsed = {name: parse_setting(name, value, self.file, otel)
                  for name, value in changes.items()}
        if model is None:
            after = {n: self._start[n] if v is None else v for n, v in parsed.items()
                     if n not in _FIXED}
            level = after.get("trace_level", self._global.level)
        else:
            scope = self._models.get(model)
            own = dict(scope.own) if scope is not None else {}
            for name, value in parsed.items():
                if name in _FIXED:
                    continue
                if value is None:
                    own.pop(name, None)
                else:
                    own[name] = value
            level = own.get("trace_level", self._global.level)
        if level and not self.file and not otel:
            raise InvalidArgumentError("tracing needs a file to write, and the server has "
                                       "none: start it with --trace-config triton,file=PATH")
        if model is None:
            self._flush(self._global)
            for name, value in after.items():
                self._global.set(name, value)
                for scope in self._models.values():
                    if name not in scope.own:
                        scope.set(name, value)
        else:
            self._set_model(model, own, [name for name in parsed if name not in _FIXED])
        self.on = self._tracing()
        return self.current(model)

    def _tracing(self) -> bool:
        """Whether some request may be traced: a scope with a level and a count left; in
        opentelemetry mode a level is enough (a caller's sampled trace ignores the count)."""
        scopes = [self._global, *self._models.values()]
        if self._exporter is not None:
            return any(scope.level for scope in scopes)
        return any(scope.tracing for scope in scopes)

    def _set_model(self, model: str, own: dict[str, Any], changed: list[str]) -> None:
        """`own`: the model's settings after the update, which named `changed`. What the
        update did not name keeps its state (a count already partly spent stays so)."""
        scope = self._models.get(model)
        if scope is not None:
            self._flush(scope)
        if not own:
            self._models.pop(model, None)  # every setting follows the global ones again
            return
        if scope is None:
            scope = self._models[model] = _Scope(self._global.level, self._global.rate,
                                                 self._global.count,
                                                 self._global.log_frequency)
            changed = list(own)
        for name in changed:
            scope.set(name, own[name] if name in own else self._global.get(name))
        scope.own = own

    def _scope(self, model: str | None) -> _Scope:
        if model is None or not self._models:
            return self._global
        return self._models.get(model, self._global)

    # -- sampling --------------------------------------------------------------------------

    def sample(self, model: str, traceparent: str | None = None) -> Trace | None:
        """A new trace when `model`'s setting takes this request (one in trace_rate, while
        trace_count lasts), else None. Callers check `on` first. In opentelemetry mode
        `traceparent` (the request's W3C header) puts the trace in the caller's, and takes
        the request whatever the rate and count when the caller sampled it."""
        scope = self._scope(model)
        if not scope.level:
            return None
        caller = None
        if self._exporter is not None and traceparent:
            caller = parse_traceparent(traceparent)
        counted = caller is None or not caller[2]
        if counted:
            if scope.count == 0 or scope.rate == 0:
                return None
            scope.seen += 1
            if scope.seen < scope.rate:
                return None
            scope.seen = 0
        if self._unwritten >= MAX_HELD or self._held_bytes >= MAX_HELD_BYTES:
            if not self.dropped:
                log.warning("traces are made faster than they are written: requests go "
                            "untraced while %d (%d MB) wait; raise trace_rate",
                            self._unwritten, self._held_bytes >> 20)
            self.dropped += 1
            return None
        if scope.count > 0 and counted:
            scope.count -= 1
        self._unwritten += 1
        context = None
        if self._exporter is not None:
            context = (SpanContext.begin(caller[0], caller[1]) if caller is not None
                       else SpanContext.begin())
        return Trace(self.next_id(), model, self, "TENSORS" in scope.level, context=context)

    def statistics(self) -> tuple[int, int, int]:
        """For metrics: traces written, waiting to be written, and requests left untraced
        because too many waited."""
        return self.written, self._unwritten, self.dropped

    def next_id(self) -> int:
        self._last_id += 1
        return self._last_id

    # -- writing ---------------------------------------------------------------------------

    def collect(self, trace: Trace) -> None:
        """A finished trace (Trace.finish calls this on the loop)."""
        if trace.parent_id:
            self._unwritten += 1  # a step's trace: not counted when its ensemble's was taken
        self._held_bytes += trace.nbytes
        if self._exporter is not None:
            if not self._exporter.add(trace):
                self._exported([trace], False)
            return
        scope = self._scope(trace.sampled_for)
        scope.pending.append(trace)
        every = scope.log_frequency or APPEND_EVERY
        if len(scope.pending) >= every:
            self._flush(scope)

    def _flush(self, scope: _Scope) -> None:
        if not scope.pending:
            return
        traces, scope.pending = scope.pending, []
        if scope.log_frequency:
            path, append = f"{self.file}.{self._index}", False
            self._index += 1
        else:
            path, append = self.file, True
        self._writes.append((path, append, traces))
        self._next_write()

    def _next_write(self) -> None:
        if self._writing is not None or not self._writes or self._abandoned:
            return
        path, append, traces = self._writes.popleft()
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:  # no loop (a script, a test): write now
            self._write(path, append, traces)
            self._release(traces)
            self._next_write()
            return
        self._writing = loop.run_in_executor(None, self._write, path, append, traces)
        self._writing.add_done_callback(lambda done: self._written(done, traces))

    def _written(self, done: asyncio.Future[None], traces: list[Trace]) -> None:
        self._writing = None
        self._release(traces)
        if not done.cancelled() and done.exception() is not None:
            log.error("could not write %d traces: %s", len(traces), done.exception())
        self._next_write()

    def _exported(self, traces: list[Trace], sent: bool) -> None:
        """The exporter's word on `traces`: sent, or dropped (its queue was full, or the
        collector did not take them)."""
        self._release(traces)
        if sent:
            self.written += len(traces)
        else:
            self.dropped += len(traces)

    def _release(self, traces: list[Trace]) -> None:
        self._unwritten -= len(traces)
        self._held_bytes -= sum(trace.nbytes for trace in traces)

    def _write(self, path: str, append: bool, traces: list[Trace]) -> None:
        """In the executor: the traces' entries into `path`, as one JSON array, each trace
        written as soon as it is made (TENSORS text is slow to make: ~60 ms for 150,000
        floats), stopping early once shutdown has stopped waiting."""
        file: BinaryIO
        if append and path in self._begun:
            file = open(path, "r+b")
            file.seek(-len(_TAIL), os.SEEK_END)
            separator = b",\n"
        else:
            file = open(path, "wb")
            file.write(b"[\n")
            separator = b""
            self._begun.add(path)
        with file:
            for trace in traces:
                if self._abandoned:
                    break
                for entry in trace.records():
                    file.write(separator + json.dumps(entry, separators=(",", ":")).encode())
                    separator = b",\n"
                self.written += 1  # only this thread writes it; the loop reads it
            file.write(_TAIL)

    async def close(self, timeout_s: float = 10.0) -> None:
        """Shutdown: write every trace held, waiting at most `timeout_s` for it; what is
        not written by then is let go (and said)."""
        if self._exporter is not None:
            await self._exporter.close(timeout_s)
            return
        self._flush(self._global)
        for scope in self._models.values():
            self._flush(scope)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        while self._writing is not None:
            try:
                await asyncio.wait_for(asyncio.shield(self._writing), deadline - loop.time())
            except asyncio.TimeoutError:
                self._abandoned = True
                log.warning("%d traces were not written: shutdown waits at most %g s for "
                            "them", self._unwritten, timeout_s)
                return
            except Exception:
                pass  # logged by _written
