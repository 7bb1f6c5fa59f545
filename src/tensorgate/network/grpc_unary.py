"""A unary gRPC call (ModelInfer, and the other methods of GRPCInferenceService and Health
but ModelStreamInfer, network/grpc_stream's) on one HTTP/2 stream: its request message read
as it arrives (network/grpc_messages), run once whole through the data plane
(network/grpc_infer for ModelInfer, network/grpc_methods' table for the others), answered
with its status in trailers; or refused, its error answered in the headers alone."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from tensorgate.errors import TensorgateError
from tensorgate.network import http2, in_steps, stalled_message
from tensorgate.network.eager import EagerRun
from tensorgate.network.grpc_compression import (packed_message, response_encoding,
                                                 response_headers)
from tensorgate.network.grpc_infer import model_infer
from tensorgate.network.grpc_messages import (CODES, OK_TRAILERS, CallHeaders, Failure,
                                              MessageReader, error_block, framed,
                                              inflate_message)
from tensorgate.network.grpc_methods import MODEL_INFER, UNARY
from tensorgate.protocol.status import codes_for
from tensorgate.tensor.copies import CopyLedger

if TYPE_CHECKING:
    from tensorgate.network.grpc import GrpcFrontEnd

__all__ = ["ANSWERED", "UnaryCall"]

log = logging.getLogger("tensorgate.grpc")

_MORE_THAN_ONE = "a unary call carried more than one request message"


class _Answered:
    """A stream answered as soon as its headers arrived (refused): what follows is ignored."""

    def data_received(self, data: memoryview) -> None:
        pass

    def receive_buffer(self, limit: int) -> memoryview | None:
        return None

    def data_written(self, nbytes: int, copied: bool = False) -> None:
        pass

    def end_received(self) -> None:
        pass

    def cancelled(self) -> None:
        pass

    def drained(self) -> None:
        pass

    def waiting(self) -> bool:
        return False

    def timed_out(self, quiet_s: float, limit_s: float) -> None:
        pass


ANSWERED = _Answered()


class UnaryCall:
    """One unary RPC on one stream: collects its request message, runs it, answers."""

    __slots__ = ("front", "connection", "stream", "path", "deadline_ns", "forwarded",
                 "traceparent", "reader", "packing",
                 "_request", "_task", "_answered", "_began_ns", "_received_ns")

    def __init__(self, front: GrpcFrontEnd, connection: http2.Http2Connection,
                 stream: http2.Http2Stream, call: CallHeaders) -> None:
        self.front = front
        self.connection = connection
        self.stream = stream
        self.path = call.path
        self.deadline_ns = call.deadline_ns
        self.forwarded = call.forwarded
        self.traceparent = call.traceparent
        # the encoding its answer goes in (grpc_compression.py), None: as it is
        self.packing = (response_encoding(front.response_compression, call.accept_encoding)
                        if front.response_compression != "none" and call.path == MODEL_INFER
                        else None)
        self.reader = MessageReader(front.pool, front.max_message_bytes, call.encoding,
                                    place=call.path == MODEL_INFER, on_message=self._whole,
                                    acquire=lambda n: front.relief.acquire(front.pool, n, self))
        # the message once whole: its bytes, encoding and copy ledger
        self._request: tuple[Any, str, CopyLedger] | None = None
        self._task: EagerRun | None = None  # the call being run
        self._answered = False
        self._began_ns = time.monotonic_ns()  # the call's headers came; its message whole:
        self._received_ns = 0                 # for traces

    # -- the request, as HTTP/2 delivers it ------------------------------------------------

    def _whole(self, message: Any, encoding: str, ledger: CopyLedger) -> None:
        if self._request is not None:
            raise Failure("INTERNAL", _MORE_THAN_ONE)
        self._request = (message, encoding, ledger)
        self._received_ns = time.monotonic_ns()

    def data_received(self, data: memoryview) -> None:
        if not self._answered:
            self._reading(self._feed, data)

    def _feed(self, data: memoryview) -> None:
        if self._request is not None:
            raise Failure("INTERNAL", _MORE_THAN_ONE)
        self.reader.feed(data)
        if self._request is not None and self.reader.partial:
            raise Failure("INTERNAL", _MORE_THAN_ONE)

    def _reading(self, step: Callable[..., None], *args: Any) -> None:
        """A step of reading the request; what it refuses answers the call."""
        try:
            step(*args)
        except Failure as failure:
            self._fail(failure.code, failure.message)
        except TensorgateError as error:  # a malformed message, found while placing it
            self._fail(codes_for(error)[1], error.message)

    def receive_buffer(self, limit: int) -> memoryview | None:
        if self._answered or self._request is not None:
            return None
        return self.reader.receive_buffer(limit)

    def data_written(self, nbytes: int, copied: bool = False) -> None:
        self._reading(self.reader.data_written, nbytes, copied)

    def end_received(self) -> None:
        if self._answered:
            return
        if self._request is None:
            self._fail("INTERNAL", "the call ended without a whole request message"
                       if self.reader.partial else "the call ended without a request message")
            return
        # run at once, not on the loop's next turn (network/eager.py); an answer given
        # inside end_received is one the connection expects (a refused call's, say)
        run = self._task = EagerRun(self._run(), asyncio.get_running_loop())
        run.start()

    def cancelled(self) -> None:
        self._answered = True
        if self._task is not None and not self._task.done():
            self._task.cancel()  # the client reset the stream: its queued request is dropped
        self.reader.close()
        self._request = None

    def drained(self) -> None:
        pass  # a unary response goes out whole

    def waiting(self) -> bool:
        """Its message, or the end of the request, has not all arrived."""
        return not self._answered and self._task is None

    def timed_out(self, quiet_s: float, limit_s: float) -> None:
        self._fail("DEADLINE_EXCEEDED", stalled_message(quiet_s, limit_s))

    def body_eta(self, now_ns: int) -> float | None:
        """network.SlowReceiver: its message, while it arrives into a pooled buffer."""
        return None if self._answered else self.reader.arrival_eta(now_ns)

    def refuse_slow(self, eta_s: float, limit_s: float) -> int:
        return self.reader.give_way(eta_s, limit_s, self._fail)

    # -- running it ------------------------------------------------------------------------

    async def _run(self) -> None:
        assert self._request is not None
        message, encoding, ledger = self._request
        self._request = None
        method = self.path.rsplit("/", 1)[-1]
        dp = self.front.dataplane
        trace = None
        turn = None
        try:
            if encoding != "identity":
                inflating = inflate_message(message, encoding, self.front.max_message_bytes,
                                            ledger, self.reader.acquire)
                if self.path == MODEL_INFER:
                    # a request of a sequence may be inside: its place among the
                    # connection's is kept while it decompresses in steps
                    turn = self.connection.in_order.turn()
                message = await in_steps(inflating)
            if self.path == MODEL_INFER:
                parts, trace = await model_infer(
                    dp, self.connection, message, ledger, self.deadline_ns,
                    forwarded=self.forwarded, received=(self._began_ns, self._received_ns),
                    traceparent=self.traceparent, turn=turn)
                if self.packing is not None:
                    parts = [await in_steps(packed_message(parts, self.packing, ledger))]
            else:
                decode, handler = UNARY[self.path]
                request = await in_steps(decode(message))
                parts = [(await handler(dp, request)).SerializeToString()]
        except asyncio.CancelledError:
            return
        except Failure as failure:
            self._fail(failure.code, failure.message)
            return
        except TensorgateError as error:
            self._fail(codes_for(error)[1], error.message)
            return
        except Exception as error:  # a bug: answer, log, keep serving
            log.exception("unexpected error in gRPC %s", method)
            self._fail("INTERNAL", f"internal error: {type(error).__name__}: {error}")
            return
        finally:
            message = None
            if turn is not None:
                turn.end()
        self._answered = True
        self.reader.close()
        if trace is not None:
            trace.stamp("GRPC_SEND_START")
        self.connection.respond(self.stream, response_headers(self.packing),
                                framed(parts, self.packing is not None), OK_TRAILERS)
        if trace is not None:
            trace.stamp("GRPC_SEND_END")
            trace.finish()

    # -- answering errors ------------------------------------------------------------------

    def _fail(self, code: str, message: str) -> None:
        if self._answered:
            return
        self._answered = True
        self.reader.close()
        self._request = None
        self.connection.respond_headers(self.stream, error_block(CODES[code], message))
