"""Triton's generate extension over HTTP: `/generate` (one JSON object in, one out) and
`/generate_stream` (each response as a Server-Sent Event as the model makes it), both
through the data plane's infer_stream (protocol/generate_codec.py codes them)."""

from __future__ import annotations

import logging
from collections.abc import AsyncGenerator
from typing import Any

from tensorgate.dataplane import Answer, DataPlane
from tensorgate.errors import InternalError, InvalidArgumentError, TensorgateError
from tensorgate.network.http_request import (JSON_HEADERS, HttpRequest, StreamedResponse,
                                             compressed, decompressed, request_trace)
from tensorgate.protocol.generate_codec import (decode_generate_body, encode_generate_response,
                                                sse_event)
from tensorgate.protocol.infer_codec import json_error
from tensorgate.protocol.request_parameters import forward_headers

__all__ = ["generate", "generate_stream"]

log = logging.getLogger("tensorgate.http")


async def _generate_answers(dp: DataPlane, request: HttpRequest, model: str,
                            version: str) -> AsyncGenerator[Answer, None]:
    """The responses to a generate request: one from a model that is not decoupled, any
    number from one that is (dp.infer_stream takes both). A compressed body is
    decompressed a piece at a time, as infer's (48 MB in one go held the loop 110 ms)."""
    body, length = request.body, request.length
    if compressed(request):
        body, length = await decompressed(request)
    decoded = dp.generate_request(model, version, decode_generate_body(body, length),
                                  request.ledger)
    decoded.forwarded = forward_headers(request.headers.items(), request.forward)
    answers = dp.infer_stream(model, version, decoded, request.ledger,
                              request_trace(dp, request, model))
    try:
        async for answer in answers:
            yield answer
    finally:
        await answers.aclose()


async def generate(dp: DataPlane, request: HttpRequest, model: str, version: str) -> Any:
    """Triton's generate extension: one JSON object in, one out (protocol/generate_codec.py).
    A decoupled model may answer it only with exactly one response."""
    answers = _generate_answers(dp, request, model, version)
    answer: bytes | None = None
    try:
        async for result, outputs, _, _ in answers:
            if result.error is not None:  # a decoupled model's error response
                try:
                    raise result.error
                finally:  # its traceback holds this frame: not the result too (a cycle)
                    del result
            if answer is not None:
                raise InvalidArgumentError(
                    f"model '{model}' is decoupled and sent more than one response; call "
                    "generate_stream to receive each as it comes")
            answer = encode_generate_response(result.model, result.version, outputs)
    finally:
        await answers.aclose()
    if answer is None:
        raise InternalError(f"model '{model}' sent no response; generate needs one")
    return 200, JSON_HEADERS, [answer]


_EVENT_STREAM = [("Content-Type", "text/event-stream; charset=utf-8"),
                 ("Cache-Control", "no-cache")]


async def generate_stream(dp: DataPlane, request: HttpRequest, model: str,
                           version: str) -> Any:
    """Each response as one Server-Sent Event, as the model makes it. The first is awaited
    before answering, so that a request that fails before it gets an HTTP error status; an
    error after it comes as an event `{"error": ...}` and ends the stream, but for a
    decoupled model's error response that is not its last, after which more come."""
    answers = _generate_answers(dp, request, model, version)
    try:
        first = await anext(answers, None)
    except BaseException:
        await answers.aclose()
        raise
    return StreamedResponse(200, _EVENT_STREAM, _events(first, answers, request))


async def _events(first: Answer | None, answers: AsyncGenerator[Answer, None],
                  request: HttpRequest) -> AsyncGenerator[bytes, None]:
    try:
        answer = first
        while answer is not None:
            result, outputs, _, _ = answer
            if result.error is not None:
                yield sse_event(json_error(result.error.message))
            else:
                yield sse_event(encode_generate_response(result.model, result.version, outputs))
            answer = await anext(answers, None)
    except TensorgateError as error:
        yield sse_event(json_error(error.message))
    except Exception as error:  # a bug: tell the client, log, keep serving
        log.exception("unexpected error streaming %s", request.path)
        yield sse_event(json_error(f"internal error: {type(error).__name__}: {error}"))
    finally:
        await answers.aclose()
