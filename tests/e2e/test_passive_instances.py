"""Triton's `instance_group { passive: true }`: a passive group's instances are loaded and
initialized, and the scheduler gives them no request (pipeline/version_instances.py); as in
Triton, they are not warmed up and their rate limiter resources are not registered. A config
whose every group is passive is refused by name, since no instance would answer."""

from __future__ import annotations

import pathlib
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from tests.e2e.conftest import start_server, stop_server
from tests.pipeline import repo_builder as rb
from tests.pipeline import sequence_models as sm

WHO = '''
import pathlib

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    """Answers each request with the name of the instance that ran it; each instance leaves
    a file named after itself when initialized, and another when it first runs (its warm-up
    or a request), and sleeps 10 ms a call (requests overlap)."""

    def initialize(self, args):
        self.name = args["model_instance_name"]
        self.folder = pathlib.Path(args["model_repository"])
        (self.folder / f"initialized-{self.name}").touch()

    def execute(self, requests):
        import time
        (self.folder / f"ran-{self.name}").touch()
        time.sleep(0.01)
        name = np.array([[self.name.encode()]], dtype=object)
        return [pb_utils.InferenceResponse([pb_utils.Tensor("WHO", name)]) for _ in requests]
'''

GROUPS = """
instance_group [ { name: "active" count: 1 kind: KIND_CPU },
                 { name: "standby" count: 2 kind: KIND_CPU passive: true } ]
"""
WARMUP = """
model_warmup [ { name: "zeros" batch_size: 1
                 inputs { key: "X" value: { data_type: TYPE_FP32 dims: [1] zero_data: true } }
               } ]
"""
# the passive group needs more of R than --rate-limit-resource gives (2): were its needs
# registered, the load would fail saying it could never run
LIMITED = """
instance_group [ { name: "active" count: 1 kind: KIND_CPU
                   rate_limiter { resources [ { name: "R" count: 1 } ] } },
                 { name: "standby" count: 1 kind: KIND_CPU passive: true
                   rate_limiter { resources [ { name: "R" count: 5 } ] } } ]
"""


def _who(repo: pathlib.Path, name: str, groups: str) -> None:
    folder = rb.write_config(repo, name, f"""
        name: "{name}"
        backend: "python"
        max_batch_size: 0
        input [ {{ name: "X" data_type: TYPE_FP32 dims: [1] }} ]
        output [ {{ name: "WHO" data_type: TYPE_STRING dims: [1, 1] }} ]
        {groups}
        """)
    (folder / "1" / "model.py").write_text(WHO)


def _ask(url: str, model: str) -> str:
    item = httpclient.InferInput("X", [1], "FP32")
    item.set_data_from_numpy(np.zeros(1, np.float32))
    with httpclient.InferenceServerClient(url) as client:
        return str(client.infer(model, [item]).as_numpy("WHO")[0, 0].decode())


def test_passive_instances_are_loaded_and_given_no_request(tmp_path: pathlib.Path) -> None:
    repo = tmp_path / "repo"
    _who(repo, "who", GROUPS + WARMUP)
    _who(repo, "limited", LIMITED)
    _who(repo, "all_passive", GROUPS.replace('count: 1 kind: KIND_CPU }',
                                             'count: 1 kind: KIND_CPU passive: true }'))
    # a stateful model with a passive group: its sequences go to the active instance
    sm.add_accumulate(repo, "accumulate")
    with (repo / "accumulate" / "config.pbtxt").open("a") as config:
        config.write(GROUPS)
    server = start_server(repo, tmp_path / "server.log", "--model-control-mode", "explicit",
                          "--load-model", "who", "--load-model", "accumulate",
                          "--load-model", "limited", "--rate-limit", "execution_count",
                          "--rate-limit-resource", "R:2")
    try:
        # 24 requests from 8 clients at once: the two idle passive instances take none
        with ThreadPoolExecutor(8) as pool:
            answered = list(pool.map(lambda _: _ask(server.url, "who"), range(24)))
        assert answered == ["active_0"] * 24
        # initialized all the same, as Triton initializes them, and never run: not even
        # the config's warm-up sample, which Triton gives no passive instance
        assert {p.name for p in (repo / "who").glob("initialized-*")} == {
            "initialized-active_0", "initialized-standby_0", "initialized-standby_1"}
        assert _ask(server.url, "limited") == "active_0"
        assert {p.name for p in (repo / "who").glob("ran-*")} == {"ran-active_0"}
        with httpclient.InferenceServerClient(server.url) as client:
            groups = client.get_model_config("who")["instance_group"]
            assert [(g["name"], g.get("passive", False)) for g in groups] == [
                ("active", False), ("standby", True)]
            with pytest.raises(InferenceServerException,
                               match="every instance_group is passive: no instance would "
                                     "take a request"):
                client.load_model("all_passive")
            for sequence in (7, 8, 9):  # interleaved, each adding up its own
                totals = []
                for step, value in enumerate((1.0, 2.0, 3.0)):
                    item = httpclient.InferInput("INPUT", [1, 1], "FP32")
                    item.set_data_from_numpy(np.full((1, 1), value * sequence, np.float32))
                    result = client.infer("accumulate", [item], sequence_id=sequence,
                                          sequence_start=step == 0, sequence_end=step == 2)
                    totals.append(float(result.as_numpy("TOTAL")[0, 0]))
                assert totals == [sequence * 1.0, sequence * 3.0, sequence * 6.0]
        assert _ask(server.url, "who") == "active_0"
    finally:
        assert stop_server(server) == 0, server.log.read_text()
