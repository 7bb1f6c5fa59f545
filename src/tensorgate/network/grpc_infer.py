"""ModelInfer's run, shared by the unary call (network/grpc_unary) and ModelStreamInfer's
stream (network/grpc_stream): a request message split and decoded in steps where it is
large, kept in its place among its connection's requests when it is a sequence's, run
through the data plane, and its response (or a decoupled model's responses) encoded as
parts to send one after another."""

from __future__ import annotations

import time
from collections.abc import AsyncGenerator
from typing import TYPE_CHECKING, Any

from tritonclient.grpc import service_pb2 as pb

from tensorgate.dataplane import Answer, DataPlane, parse_version
from tensorgate.errors import TensorgateError
from tensorgate.network import http2, in_steps
from tensorgate.network.in_order import InOrder, Turn
from tensorgate.protocol.grpc_codec import (TensorSpans, decode_model_infer_steps,
                                            encode_model_infer_parts, split_model_infer_steps)
from tensorgate.protocol.infer_codec import TENSORS_A_STEP, DecodedRequest
from tensorgate.protocol.steps import run_through
from tensorgate.tensor.copies import CopyLedger

if TYPE_CHECKING:
    from tensorgate.pipeline.trace import Trace

__all__ = ["model_infer", "model_infer_responses", "split_request"]


async def split_request(message: Any, in_order: InOrder, turn: Turn | None
                        ) -> tuple[pb.ModelInferRequest, TensorSpans, Turn | None]:
    """split_model_infer of a request message, in steps when it has many fields (a hostile
    65,000 held the loop for 155 ms); and its turn: `turn`, or one taken before the first
    wait, since it may be a sequence's and the next request must not pass it (ended here if
    the split fails; else the caller's to end)."""
    steps = split_model_infer_steps(memoryview(message))
    try:
        next(steps)
    except StopIteration as done:  # a few fields, split in one go: the ordinary request
        request, spans = done.value
        return request, spans, turn
    taken = in_order.turn() if turn is None else None
    try:
        request, spans = await in_steps(steps)
    except BaseException:
        if taken is not None:
            taken.end()
        raise
    return request, spans, turn or taken


async def _decode(dp: DataPlane, message: Any, ledger: CopyLedger, deadline_ns: int | None,
                  request: pb.ModelInferRequest | None, spans: TensorSpans | None,
                  forwarded: dict[str, str] | None, in_order: InOrder, turn: Turn | None
                  ) -> tuple[pb.ModelInferRequest, DecodedRequest]:
    if request is None or spans is None:
        request, spans, turn = await split_request(message, in_order, turn)
    steps = decode_model_infer_steps(request, ledger, dp.shm, message=message, spans=spans)
    # Typed contents taken out of the message are decoded a piece at a time, the loop
    # serving others between pieces (60 MB of varints: 0.5 s), and many tensors a step's
    # worth at a time; anything else in one go. A request in a sequence keeps its place
    # among its connection's: the next must not pass it while it waits. (`turn`: the place
    # taken as it arrived, by a request that waited before it could be read, decompressing
    # or split in steps; not a sequence's, it gives its place up.)
    if "sequence_id" not in request.parameters:
        if turn is not None:
            turn.end()
        turn = None
    elif turn is None:
        turn = in_order.turn()
    try:
        decoded: DecodedRequest = (
            run_through(steps) if spans.contents is None
            and len(request.inputs) <= TENSORS_A_STEP and len(request.outputs) <= TENSORS_A_STEP
            else await in_steps(steps))
        if turn is not None:
            await turn.wait()
    finally:
        if turn is not None:
            turn.end()  # the caller goes into the pipeline before it next waits
    decoded.forwarded = forwarded
    if deadline_ns is not None and decoded.timeout_us is None:
        # at least 1 µs: an expired deadline must time out in the queue (0 would mean none)
        decoded.timeout_us = max(1, (deadline_ns - time.monotonic_ns()) // 1000)
    return request, decoded


def _encode(answer: Answer, decoded: DecodedRequest, connection: http2.Http2Connection,
            ledger: CopyLedger, final: bool | None) -> list[Any]:
    result, outputs, _, in_shm = answer
    joined = connection.joined_bytes(
        [v.nbytes for n, v in outputs.items() if not in_shm or n not in in_shm])
    return encode_model_infer_parts(result.model, result.version, result.id, outputs, ledger,
                                    bool(decoded.parameters.get("tensorgate_report_copies")),
                                    in_shm, copies_to_come=joined, final=final,
                                    parameters=result.parameters)


async def model_infer(dp: DataPlane, connection: http2.Http2Connection, message: Any,
                      ledger: CopyLedger, deadline_ns: int | None,
                      request: pb.ModelInferRequest | None = None,
                      spans: TensorSpans | None = None,
                      forwarded: dict[str, str] | None = None,
                      received: tuple[int, int] = (0, 0), traceparent: str | None = None,
                      turn: Turn | None = None, streamed: bool = False
                      ) -> tuple[list[Any], Trace | None]:
    """Run one ModelInferRequest (its bytes, split already where `request` is given);
    returns the ModelInferResponse as parts to send one after another, and the request's
    trace if it is traced (the caller stamps its sending and finishes it). `forwarded`: the
    call's metadata to pass to the model as parameters; `received`: when its message began
    to arrive and when it was whole (ns); `traceparent`: the caller's W3C trace context;
    `turn`: its place among the connection's requests, if it took one as it arrived;
    `streamed`: it came on a ModelStreamInfer stream, where its one response says it is
    the last (`triton_final_response`, as Triton marks every streamed response)."""
    request, decoded = await _decode(dp, message, ledger, deadline_ns, request, spans,
                                     forwarded, connection.in_order, turn)
    trace = _trace(dp, request.model_name, received, traceparent)
    try:
        answer = await dp.infer(request.model_name, request.model_version, decoded, ledger,
                                trace)
        flagged = bool(decoded.parameters.get("triton_enable_empty_final_response"))
        return _encode(answer, decoded, connection, ledger,
                       True if streamed or flagged else None), trace
    except BaseException:
        if trace is not None:
            trace.finish()
        raise


def _trace(dp: DataPlane, model: str, received: tuple[int, int],
           traceparent: str | None) -> Trace | None:
    trace = dp.trace(model, traceparent)
    if trace is not None:
        trace.stamp("GRPC_WAITREAD_START", received[0])
        trace.stamp("GRPC_WAITREAD_END", received[1])
    return trace


async def model_infer_responses(dp: DataPlane, connection: http2.Http2Connection,
                                message: Any, ledger: CopyLedger, deadline_ns: int | None,
                                request: pb.ModelInferRequest, spans: TensorSpans,
                                forwarded: dict[str, str] | None = None,
                                received: tuple[int, int] = (0, 0),
                                traceparent: str | None = None, turn: Turn | None = None
                                ) -> AsyncGenerator[list[Any] | TensorgateError, None]:
    """A decoupled model's ModelInferResponses to one request, as parts, as they come, each
    saying whether it is the last (`triton_final_response`, as Triton marks them): true only
    where the model said so as it sent it (a Triton model's send with the final flag). A
    model's end that came apart from a response (a generator's, or a send of the flag
    alone) gets an empty response saying it is the last only with
    `triton_enable_empty_final_response`, as on Triton. An error response that is not the
    last comes as its TensorgateError, for the stream to send as an error, and more follow."""
    request, decoded = await _decode(dp, message, ledger, deadline_ns, request, spans,
                                     forwarded, connection.in_order, turn)
    flagged = bool(decoded.parameters.get("triton_enable_empty_final_response"))
    trace = _trace(dp, request.model_name, received, traceparent)
    answers = dp.infer_stream(request.model_name, request.model_version, decoded, ledger,
                              trace)
    ended = False  # by a response the model marked as its last
    try:
        async for answer in answers:
            if answer[0].error is not None:
                yield answer[0].error
                continue
            ended = answer[0].final
            yield _encode(answer, decoded, connection, ledger, ended)
    finally:
        await answers.aclose()
        if trace is not None:
            trace.finish()
    if flagged and not ended:
        spec = dp.engine.spec(request.model_name, parse_version(request.model_version))
        version = request.model_version or str(max(dp.engine.versions(spec.name)))
        yield encode_model_infer_parts(spec.name, int(version), request.id, {}, ledger,
                                       final=True)
