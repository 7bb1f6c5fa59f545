"""A Triton Python model's batches through TritonPythonRunner, one at a time: a model that
is not decoupled answering through its requests' response senders (Triton allows it since
23.10) — which request gets what when a batch mixes senders, forgets one, or sends too
much — and a model_warmup sample of several rows, given as Triton gives it."""

from __future__ import annotations

import pathlib
import threading
from typing import Any

import numpy as np
import pytest
import torch

from tensorgate.model import NO_PARAMETERS, ModelContext, RequestInfo
from tensorgate.pipeline.triton_python import Answer, RequestInputs, TritonPythonRunner
from tensorgate.python_backend import (TRITONSERVER_RESPONSE_COMPLETE_FINAL, InferenceResponse,
                                       Tensor, TritonModelException, get_model_dir)
from tensorgate.repository.model_config import parse_model_config

CONFIG = ('name: "sent" backend: "python" max_batch_size: BATCH '
          'input [ { name: "IN" data_type: TYPE_INT32 dims: [ 1 ] } ] '
          'output [ { name: "OUT" data_type: TYPE_INT32 dims: [ 1 ] } ]')


def _runner(model: type, tmp_path: pathlib.Path, batch: int = 0) -> TritonPythonRunner:
    context = ModelContext("sent", 1, tmp_path, torch.device("cpu"), batch)
    return TritonPythonRunner(model, parse_model_config(CONFIG.replace("BATCH", str(batch))), context)


def _requests(*values: int) -> list[RequestInputs]:
    return [RequestInputs({"IN": np.array([value], np.int32)},
                          RequestInfo(str(value), slice(0, 1), NO_PARAMETERS), ("OUT",), 0, 0,
                          lambda: False) for value in values]


def _out(request: Any) -> InferenceResponse:
    value = request.inputs()[0].as_numpy()
    return InferenceResponse([Tensor("OUT", value * 2)])


def _values(answers: list[Any]) -> list[Any]:
    return [answer.outputs["OUT"].tolist() if isinstance(answer, Answer) else answer.message
            for answer in answers]


def test_a_batch_s_requests_each_answered_through_its_sender(tmp_path: pathlib.Path) -> None:
    """One in execute, one from a thread after execute returned; a request whose sender
    execute never asked for gets an error at once, rather than holding the instance."""
    class Model:
        def execute(self, requests: list[Any]) -> None:
            first, second, _ = requests
            first.get_response_sender().send(_out(first),
                                              flags=TRITONSERVER_RESPONSE_COMPLETE_FINAL)
            sender = second.get_response_sender()
            threading.Timer(0.05, lambda: sender.send(
                _out(second), flags=TRITONSERVER_RESPONSE_COMPLETE_FINAL)).start()

    answers = _runner(Model, tmp_path).run_each(_requests(1, 2, 3))
    assert _values(answers) == [
        [2], [4], "model 'sent': execute returned None without asking for the response sender "
                  "of request 2; a model not decoupled answers each request in execute's list "
                  "or through its sender"]


def test_a_sender_takes_one_response_and_nothing_once_answered(tmp_path: pathlib.Path) -> None:
    refusals: list[str] = []
    kept: list[Any] = []

    class Model:
        def execute(self, requests: list[Any]) -> list[InferenceResponse]:
            sender = requests[0].get_response_sender()
            kept.append(requests[1].get_response_sender())  # asked for, not used in execute
            sender.send(_out(requests[0]))
            with pytest.raises(TritonModelException) as twice:
                sender.send(_out(requests[0]), flags=TRITONSERVER_RESPONSE_COMPLETE_FINAL)
            refusals.append(str(twice.value))
            return [InferenceResponse([Tensor("OUT", np.array([0], np.int32))])
                    for _ in requests]  # the sent one stands for the first

    answers = _runner(Model, tmp_path).run_each(_requests(5, 6))
    assert _values(answers) == [[10], [0]]
    assert refusals == ["model 'sent' is not decoupled: it sends one response per request "
                        "(model_transaction_policy { decoupled: true } for more)"]
    with pytest.raises(TritonModelException, match="this request was answered already"):
        kept[0].send(InferenceResponse([Tensor("OUT", np.array([7], np.int32))]))  # too late


def test_a_warm_up_sample_of_several_rows_is_as_many_requests(tmp_path: pathlib.Path) -> None:
    """Triton 2.51 gives a Python model a model_warmup sample of batch_size 2 as two
    requests of one row in one execute (tools/triton_diff.py "model_warmup's requests as
    the model saw them"): a model that takes a row a request warms up there, and here."""
    seen: list[list[list[int]]] = []

    class Model:
        def execute(self, requests: list[Any]) -> list[InferenceResponse]:
            seen.append([r.inputs()[0].as_numpy().tolist() for r in requests])
            return [_out(r) for r in requests]

    runner = _runner(Model, tmp_path, batch=4)
    outputs = runner.run({"IN": np.array([[3], [4]], np.int32)})
    assert seen == [[[[3]], [[4]]]]
    assert outputs["OUT"].tolist() == [[6]]  # the first request's
    runner.run({"IN": np.array([[5]], np.int32)})
    assert seen[-1] == [[[5]]]
    # the model's folder was this thread's only while execute ran
    assert get_model_dir() == str(pathlib.Path(__file__).parent)
