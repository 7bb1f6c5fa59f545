"""A call into a model that does not return is visible: `tensorgate_model_call_seconds`
grows for its instance while it runs, and a warning names it once past
--model-call-warn-secs; a call that returned is forgotten and its gauge is 0 again."""

from __future__ import annotations

import pathlib
import re
import threading
import time

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

from tests.e2e.conftest import RunningServer, scrape, start_server, stop_server, value
from tests.pipeline import repo_builder as rb

SLOW_S = 2.5


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> RunningServer:
    root = tmp_path_factory.mktemp("model_calls") / "models"
    rb.add_python(root, "sleepy", delay_s=SLOW_S, max_batch=1)
    rb.add_python(root, "quick", max_batch=1)
    rb.add_counter(root, "stream", delay_s=0.04)  # a response every 40 ms
    running = start_server(root, root.parent / "server.log", "--model-call-warn-secs", "0.5",
                           "--placement", "none")  # (placement times sleepy at load: 5 s)
    yield running
    assert stop_server(running) == 0, running.log.read_text()


def _infer(server: RunningServer, model: str, request_id: str = "") -> np.ndarray:
    with httpclient.InferenceServerClient(server.url, network_timeout=30) as client:
        tensor = httpclient.InferInput("INPUT__0", [1, 4], "FP32")
        tensor.set_data_from_numpy(np.ones((1, 4), np.float32))
        return client.infer(model, [tensor], request_id=request_id).as_numpy("OUTPUT__0")


def test_a_long_call_shows_in_the_gauge_and_is_warned_of_once(server: RunningServer) -> None:
    answers: list[np.ndarray] = []
    caller = threading.Thread(target=lambda: answers.append(_infer(server, "sleepy",
                                                                  "stuck-1")))
    caller.start()
    seen = 0.0
    for _ in range(40):  # up to 2 s into a 2.5 s call
        seen = value(scrape(server), "tensorgate_model_call_seconds", model="sleepy",
                     version="1", instance="tg-exec-sleepy-v1-0")
        if seen > 1.0:
            break
        time.sleep(0.05)
    assert 1.0 < seen < SLOW_S + 1
    assert value(scrape(server), "tensorgate_model_call_seconds", model="quick",
                 version="1", instance="tg-exec-quick-v1-0") == 0
    caller.join(timeout=30)
    assert len(answers) == 1 and answers[0].shape == (1, 4)
    _infer(server, "quick")
    assert value(scrape(server), "tensorgate_model_call_seconds", model="sleepy",
                 version="1", instance="tg-exec-sleepy-v1-0") == 0
    log = pathlib.Path(server.log).read_text()
    warned = re.findall(r"WARNING tensorgate\.server: model (\S+) v1: a batch of 1 row "
                        r"\(request (\S+)\) has been in the model for \d+ s on (\S+) and has "
                        r"not returned \(--model-call-warn-secs 0\.5\)", log)
    assert warned == [("sleepy", "stuck-1", "tg-exec-sleepy-v1-0")], log


def test_a_long_stream_of_short_steps_is_not_a_long_call(server: RunningServer) -> None:
    """A request streaming for 1.2 s (30 responses, 40 ms apart) is 30 calls into the model,
    none near --model-call-warn-secs 0.5: no warning, and the gauge stays below a step."""
    arrived: list[object] = []
    highest = 0.0
    with grpcclient.InferenceServerClient(server.grpc_url) as client:
        client.start_stream(callback=lambda result, error: arrived.append(error or result))
        item = grpcclient.InferInput("INPUT__0", [1, 4], "FP32")
        item.set_data_from_numpy(np.full((1, 4), 30, np.float32))
        client.async_stream_infer("stream", [item])
        for _ in range(100):  # bounded: 30 responses at 40 ms come in about 1.2 s
            highest = max(highest, value(scrape(server), "tensorgate_model_call_seconds",
                                         model="stream", version="1",
                                         instance="tg-exec-stream-v1-0"))
            if len(arrived) >= 30:
                break
            time.sleep(0.03)
        client.stop_stream()
    assert len(arrived) == 30 and all(not isinstance(a, Exception) for a in arrived)
    assert highest < 0.3
    assert "WARNING tensorgate.server: model stream" not in pathlib.Path(server.log).read_text()
