"""A Triton Python model's responses as tensorgate's answers: those execute returns, those
sent through a request's response sender (the one each of a model not decoupled sends, kept
until execute returns: `SentAnswers`; each of a decoupled one's, to its sink as it is sent:
`deliver_to`), and the error a response carries as the one the client gets."""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping, Sequence
from functools import partial
from typing import Any, NamedTuple

from tensorgate import python_backend as pb_utils
from tensorgate.errors import (AlreadyExistsError, CancelledError, InternalError,
                               InvalidArgumentError, NotFoundError, TensorgateError,
                               UnavailableError, UnimplementedError)
from tensorgate.model import NO_PARAMETERS, Parameter
from tensorgate.pipeline.work import response_parameter_error

__all__ = ["CANCEL_POLL_S", "Answer", "SentAnswers", "Sink", "answer_of", "deliver_to"]

CANCEL_POLL_S = 0.1  # how often a decoupled wait looks whether its client has gone

_ERRORS: dict[int, type[TensorgateError]] = {
    pb_utils.TritonError.INVALID_ARG: InvalidArgumentError,
    pb_utils.TritonError.NOT_FOUND: NotFoundError,
    pb_utils.TritonError.UNAVAILABLE: UnavailableError,
    pb_utils.TritonError.UNSUPPORTED: UnimplementedError,
    pb_utils.TritonError.ALREADY_EXISTS: AlreadyExistsError,
    pb_utils.TritonError.CANCELLED: CancelledError,
}


class Answer(NamedTuple):
    """One response of the model: its outputs by name, and the parameters it carries."""

    outputs: dict[str, Any]
    parameters: Mapping[str, Parameter]


# Where a decoupled request's responses go, from the thread that sent each: the response
# (its error, as the model answered with one; None: the final flag came alone) and whether
# it was the last (the final flag).
Sink = Callable[[Answer | TensorgateError | None, bool], None]

_SETTING_UP = threading.Lock()  # a batch's SentAnswers, made ready for its first sender


class SentAnswers:
    """What a model not decoupled sent through its requests' senders, by request: one
    response and the final flag each, from execute or later from any thread."""

    def __init__(self, model: str, count: int) -> None:
        self.model = model
        self.count = count  # execute's requests
        self.used = False  # a sender was asked for: what follows is made then

    def sender_maker(self, index: int, cancelled: Callable[[], bool]
                     ) -> Callable[[], pb_utils.InferenceResponseSender]:
        """What makes request `index`'s sender when the model first asks for it; `cancelled`
        says whether its client has gone. Neither holds the request, which holds its
        maker and then its sender: a cycle back to it would leave each request, its tensors
        and this batch's answers to the garbage collector."""
        return partial(self._sender_for, index, cancelled)

    def _sender_for(self, index: int, cancelled: Callable[[], bool]
                    ) -> pb_utils.InferenceResponseSender:
        """Request `index`'s sender (seldom asked for, by a model not decoupled: a batch
        that asks for none pays for none of this)."""
        with _SETTING_UP:
            if not self.used:
                count = self.count
                self._responses: list[pb_utils.InferenceResponse | None] = [None] * count
                self._final = [False] * count
                self._asked = [False] * count  # for its sender
                self._over = False  # answered: later sends are refused
                self._changed = threading.Condition()
                self.used = True
        self._asked[index] = True
        return pb_utils.InferenceResponseSender(partial(self._deliver, index), cancelled)

    def _deliver(self, index: int, response: pb_utils.InferenceResponse | None,
                 flags: int) -> None:
        with self._changed:
            if self._over:
                raise pb_utils.TritonModelException(
                    f"model '{self.model}' is not decoupled and this request was answered "
                    "already: nothing more is sent for it")
            twice = response is not None and self._responses[index] is not None
            if not twice and response is not None:
                self._responses[index] = response
            if flags & pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL:
                self._final[index] = True
                self._changed.notify_all()
            if twice:
                raise pb_utils.TritonModelException(
                    f"model '{self.model}' is not decoupled: it sends one response per "
                    "request (model_transaction_policy { decoupled: true } for more)")

    def answer(self, index: int) -> Answer | TensorgateError | None:
        """The response sent for request `index` (its final flag or not), or None."""
        with self._changed:
            self._over = True
            response = self._responses[index]
        return None if response is None else answer_of(response, self.model)

    def wait(self, cancelled: Sequence[Callable[[], bool]]) -> list[Answer | TensorgateError]:
        """Each request's answer once its final flag has come (execute returned None): the
        response sent, or an error for one sent without a response, or whose sender execute
        never asked for (nothing could answer it: the instance waits for none); a request
        whose client has gone meanwhile is cancelled."""
        answers: list[Answer | TensorgateError] = []
        with self._changed:
            asked = list(self._asked)  # as execute returned
            for index, gone in enumerate(cancelled):
                if not asked[index]:
                    answers.append(InternalError(
                        f"model '{self.model}': execute returned None without asking for the "
                        f"response sender of request {index}; a model not decoupled answers "
                        "each request in execute's list or through its sender"))
                    continue
                while not self._final[index] and not gone():
                    self._changed.wait(CANCEL_POLL_S)
                response = self._responses[index]
                if not self._final[index]:
                    answers.append(CancelledError(f"request {index} of model '{self.model}' "
                                                  "was cancelled before it was answered"))
                elif response is None:
                    answers.append(InternalError(
                        f"model '{self.model}' sent the final flag for a request with no "
                        "response: a model not decoupled sends one response per request"))
                else:
                    answers.append(answer_of(response, self.model))
            self._over = True
        return answers


def deliver_to(sink: Sink, model: str) -> Callable[[pb_utils.InferenceResponse | None, int], None]:
    """A response sender's delivery: each response as the sink takes it."""
    def deliver(response: pb_utils.InferenceResponse | None, flags: int) -> None:
        sink(None if response is None else answer_of(response, model),
             bool(flags & pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL))
    return deliver


def answer_of(response: pb_utils.InferenceResponse, model: str) -> Answer | TensorgateError:
    """A response as the answer its client gets: its outputs and parameters, or the error
    it carries (Triton's code as ours; the model's own words)."""
    error = response.error()
    if error is not None:  # the model's message as it wrote it, as Triton passes it on
        code = error.code() if isinstance(error, pb_utils.TritonError) else None
        return _ERRORS.get(code, InternalError)(str(error))
    given = response.parameter_values()
    invalid = response_parameter_error(model, given)
    if invalid is not None:
        return invalid
    return Answer({tensor.name(): tensor.value() for tensor in response.output_tensors()},
                  given or NO_PARAMETERS)
