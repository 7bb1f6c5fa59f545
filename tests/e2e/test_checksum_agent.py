"""A model whose config names Triton's checksum agent loads only while its files have the
digests the config gives; one that does not is refused before any of its code runs, and the
server keeps serving the rest (repository/checksum_agent.py)."""

from __future__ import annotations

import hashlib
import pathlib

import numpy as np
import pytest
import torch
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from tests.e2e.conftest import start_server, stop_server
from tests.pipeline import repo_builder as rb


def _infer(client: httpclient.InferenceServerClient, model: str) -> np.ndarray:
    item = httpclient.InferInput("INPUT__0", [1, 4], "FP32")
    item.set_data_from_numpy(np.ones((1, 4), np.float32))
    return client.infer(model, [item]).as_numpy("OUTPUT__0")


def _checked(folder: pathlib.Path, model_py: str) -> None:
    """The model's config names its model.py by SHA256 (with that text) and its weights by
    MD5 (as they are)."""
    sha256 = hashlib.sha256(model_py.encode()).hexdigest()
    md5 = hashlib.md5((folder / "1" / "scale.pt").read_bytes()).hexdigest()
    with (folder / "config.pbtxt").open("a") as config:
        config.write(f'model_repository_agents {{ agents [ {{ name: "checksum" '
                     f'parameters {{ key: "SHA256:1/model.py" value: "{sha256}" }} '
                     f'parameters {{ key: "MD5:1/scale.pt" value: "{md5}" }} }} ] }}\n')


def test_a_model_loads_only_with_the_files_its_checksums_name(tmp_path: pathlib.Path) -> None:
    repo = tmp_path / "repo"
    for name in ("checked", "tampered", "unknown_agent"):
        rb.add_python(repo, name)
    for name in ("checked", "tampered"):
        _checked(repo / name, rb.PYTHON_MODEL)
    # tampered's model.py, changed after its checksum was taken, leaves a mark when imported
    marker = tmp_path / "tampered-code-ran"
    model_py = repo / "tampered" / "1" / "model.py"
    model_py.write_text(f"import pathlib\npathlib.Path({str(marker)!r}).touch()\n"
                        + rb.PYTHON_MODEL)
    with (repo / "unknown_agent" / "config.pbtxt").open("a") as config:
        config.write('model_repository_agents { agents [ { name: "decrypt" } ] }\n')
    server = start_server(repo, tmp_path / "server.log", "--model-control-mode", "explicit",
                          "--load-model", "checked")
    try:
        with httpclient.InferenceServerClient(f"127.0.0.1:{server.port}") as client:
            assert client.is_model_ready("checked")
            np.testing.assert_array_equal(_infer(client, "checked"), np.full((1, 4), 3.0))
            with pytest.raises(InferenceServerException) as refused:
                client.load_model("tampered")
            got = hashlib.sha256(model_py.read_bytes()).hexdigest()
            expected = hashlib.sha256(rb.PYTHON_MODEL.encode()).hexdigest()
            assert (f"'1/model.py' has the SHA256 digest {got}; its checksum agent expects "
                    f"{expected}: not loaded") in refused.value.message()
            assert not marker.exists()  # refused before its code was imported
            assert not client.is_model_ready("tampered")
            with pytest.raises(InferenceServerException,
                               match="names the agent 'decrypt', which tensorgate does not "
                                     "have"):
                client.load_model("unknown_agent")
            # put back as its checksum says, it loads; the first served throughout
            model_py.write_text(rb.PYTHON_MODEL)
            client.load_model("tampered")
            np.testing.assert_array_equal(_infer(client, "tampered"), np.full((1, 4), 3.0))
            np.testing.assert_array_equal(_infer(client, "checked"), np.full((1, 4), 3.0))
            # weights changed under a served model: its reload is refused, and the version
            # loaded before goes on serving (with the weights it read then)
            weights = repo / "checked" / "1" / "scale.pt"
            torch.save({"scale": torch.tensor(5.0)}, weights)
            with pytest.raises(InferenceServerException,
                               match=r"'1/scale.pt' has the MD5 digest [0-9a-f]{32}; its "):
                client.load_model("checked")
            assert client.is_model_ready("checked")
            np.testing.assert_array_equal(_infer(client, "checked"), np.full((1, 4), 3.0))
    finally:
        stop_server(server)
