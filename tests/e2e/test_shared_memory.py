"""System shared memory through tritonclient: inputs read in place, outputs written into the
client's region, keys confined, bounds checked, unregister safe while a request runs."""

from __future__ import annotations

import asyncio
import base64
import uuid

import numpy as np
import pytest
import torch
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
import tritonclient.http.aio as aioclient
import tritonclient.utils.shared_memory as shm
from tritonclient.utils import InferenceServerException

from tensorgate.errors import InvalidArgumentError, UnavailableError
from tensorgate.tensor.shm import SharedMemoryRegistry
from tests.e2e.conftest import RunningServer

VALUE = np.arange(12, dtype=np.float32).reshape(1, 3, 4)


@pytest.fixture
def regions():
    """Input and output regions made the way clients make them; removed after the test."""
    tag = uuid.uuid4().hex[:8]
    made = []

    def make(name: str, size: int) -> tuple[str, str, object]:
        key = f"/tgtest_{tag}_{name}"
        handle = shm.create_shared_memory_region(f"{name}_{tag}", key, size)
        made.append(handle)
        return f"{name}_{tag}", key, handle
    yield make
    for handle in made:
        shm.destroy_shared_memory_region(handle)


@pytest.mark.parametrize("module", [httpclient, grpcclient], ids=["http", "grpc"])
def test_identity_through_shared_memory(server: RunningServer, regions, module) -> None:
    url = server.url if module is httpclient else server.grpc_url
    with module.InferenceServerClient(url) as client:
        _identity_through_shm(client, module, regions)


def _identity_through_shm(client, module, regions) -> None:
    in_name, in_key, in_handle = regions("in", VALUE.nbytes)
    out_name, out_key, out_handle = regions("out", VALUE.nbytes)
    shm.set_shared_memory_region(in_handle, [VALUE])
    client.register_system_shared_memory(in_name, in_key, VALUE.nbytes)
    client.register_system_shared_memory(out_name, out_key, VALUE.nbytes)
    try:
        item = module.InferInput("INPUT__0", [1, 3, 4], "FP32")
        item.set_shared_memory(in_name, VALUE.nbytes)
        out = module.InferRequestedOutput("OUTPUT__0")
        out.set_shared_memory(out_name, VALUE.nbytes)
        result = client.infer("identity", [item], outputs=[out],
                              parameters={"tensorgate_report_copies": True})
        got = shm.get_contents_as_numpy(out_handle, np.float32, [1, 3, 4])
        assert got.tobytes() == VALUE.tobytes()
        response = result.get_response()
        copied = (response["parameters"]["tensorgate_copied_bytes"] if module is httpclient
                  else response.parameters["tensorgate_copied_bytes"].int64_param)
        assert copied == VALUE.nbytes  # only the model's own output write into the region
        status = client.get_system_shared_memory_status()
        names = ({r["name"] for r in status} if module is httpclient
                 else set(status.regions))
        assert {in_name, out_name} <= names
        # the output travelled in the region, so the answer names it and nothing more, as
        # Triton's does (the C++ client takes `parameters` for binary data's)
        if module is httpclient:
            entry = response["outputs"][0]
            assert entry == {"name": "OUTPUT__0", "datatype": "FP32", "shape": [1, 3, 4]}
    finally:
        client.unregister_system_shared_memory(in_name)
        client.unregister_system_shared_memory(out_name)


@pytest.mark.parametrize("key, message", [
    ("/", r"the key must be one plain name"),
    ("/a/b", r"the key must be one plain name"),
    ("../etc/passwd", r"the key must be one plain name"),
    ("/tensorgate_internal", r"the key is not allowed on this server: keys beginning "
                             r"'tensorgate', 'triton_python_backend', 'tritonpy' name "
                             r"servers' own regions"),
    ("/triton_python_backend_shm_region_1", r"the key is not allowed on this server"),
    ("/tgtest_does_not_exist_%s" % uuid.uuid4().hex[:6], r"the key cannot be opened"),
])
def test_hostile_keys_are_refused_without_echo(server: RunningServer, key: str,
                                               message: str) -> None:
    with httpclient.InferenceServerClient(server.url) as client, \
            pytest.raises(InferenceServerException, match=message) as raised:
        client.register_system_shared_memory("evil", key, 64)
    assert raised.value.status() == "400"
    plain = key.strip("/")
    assert not plain or plain not in raised.value.message()  # keys never appear in errors


def test_bounds_are_checked(server: RunningServer, regions) -> None:
    with httpclient.InferenceServerClient(server.url) as client:
        _bounds(client, regions)


def _bounds(client, regions) -> None:
    name, key, _ = regions("small", 64)
    with pytest.raises(InferenceServerException, match=r"exceeds the object's 64 bytes"):
        client.register_system_shared_memory(name, key, 64, offset=32)
    client.register_system_shared_memory(name, key, 64)
    try:
        item = httpclient.InferInput("INPUT__0", [1, 3, 4], "FP32")
        item.set_shared_memory(name, 48, offset=32)
        with pytest.raises(InferenceServerException,
                           match=r"48 bytes at offset 32 run past the 64-byte region"):
            client.infer("identity", [item])
        with pytest.raises(InferenceServerException, match=r"already registered"):
            client.register_system_shared_memory(name, key, 64)
    finally:
        client.unregister_system_shared_memory(name)
    item = httpclient.InferInput("INPUT__0", [1, 3, 4], "FP32")
    item.set_shared_memory(name, 48)
    with pytest.raises(InferenceServerException, match=rf"region '{name}' is not registered"):
        client.infer("identity", [item])


def test_unregister_while_a_request_runs(server: RunningServer, regions) -> None:
    name, key, handle = regions("busy", 16)
    value = np.ones((1, 4), np.float32)
    shm.set_shared_memory_region(handle, [value])

    async def scenario() -> object:
        async with aioclient.InferenceServerClient(server.url) as client:
            await client.register_system_shared_memory(name, key, 16)
            item = aioclient.InferInput("INPUT__0", [1, 4], "FP32")
            item.set_shared_memory(name, 16)
            running = asyncio.ensure_future(client.infer("slow", [item]))
            await asyncio.sleep(0.1)  # the slow model (0.3 s) now holds a view of the region
            await client.unregister_system_shared_memory(name)
            return await running
    result = asyncio.run(asyncio.wait_for(scenario(), 60))
    assert result.as_numpy("OUTPUT__0").tolist() == [[3.0, 3.0, 3.0, 3.0]]


def test_registrations_are_bounded(regions, monkeypatch: pytest.MonkeyPatch) -> None:
    """Past the registry's limit a region is refused by name, the others still serve, and
    unregistering one makes room again (the limit made 3 here; it is 4096)."""
    monkeypatch.setattr(SharedMemoryRegistry, "max_regions", 3)
    registry = SharedMemoryRegistry(enabled=True)
    made = [regions(f"bound{i}", 64) for i in range(4)]
    for name, key, _ in made[:3]:
        registry.register(name, key, 0, 64)
    name, key, _ = made[3]
    with pytest.raises(UnavailableError, match=rf"^cannot register shared-memory region "
                                               rf"'{name}': 3 regions are registered"):
        registry.register(name, key, 0, 64)
    assert sorted(r["name"] for r in registry.status()) == sorted(n for n, _, _ in made[:3])
    registry.unregister(made[0][0])
    registry.register(name, key, 0, 64)
    registry.unregister()


def test_disabled_registry_refuses() -> None:
    registry = SharedMemoryRegistry(enabled=False)
    with pytest.raises(UnavailableError, match=r"start it with --allow-shared-memory"):
        registry.register("r", "/k", 0, 8)


@pytest.mark.parametrize("module", [httpclient, grpcclient], ids=["http", "grpc"])
def test_cuda_shared_memory_status_unregister_and_bad_registrations(server: RunningServer,
                                                                    module) -> None:
    url = server.url if module is httpclient else server.grpc_url
    handle = base64.b64encode(b"\0" * 64).decode()
    with module.InferenceServerClient(url) as client:
        status = client.get_cuda_shared_memory_status()
        assert (status == [] if module is httpclient else not status.regions)
        client.unregister_cuda_shared_memory()  # what perf_analyzer does before and after
        client.unregister_cuda_shared_memory("never_registered")  # no error, as on Triton
        with pytest.raises(InferenceServerException,
                           match=r"cuda shared-memory region 'never_registered' is not "
                                 r"registered"):
            client.get_cuda_shared_memory_status("never_registered")
        with pytest.raises(InferenceServerException,
                           match=r"region 'gpu_in': raw_handle must be the 64 bytes of a CUDA "
                                 r"IPC memory handle"):
            client.register_cuda_shared_memory("gpu_in", base64.b64encode(b"\0" * 63).decode(),
                                               0, 64)
        with pytest.raises(InferenceServerException,
                           match=r"region 'gpu_in': byte_size must be above 0"):
            client.register_cuda_shared_memory("gpu_in", handle, 0, 0)
        if not torch.cuda.is_available():
            with pytest.raises(InferenceServerException,
                               match=r"cannot register CUDA shared-memory region 'gpu_in': this "
                                     r"server has no CUDA device"):
                client.register_cuda_shared_memory("gpu_in", handle, 0, 64)
        assert client.is_server_live()


def test_a_cuda_handle_that_is_not_base64_is_refused_by_name(server: RunningServer) -> None:
    with httpclient.InferenceServerClient(server.url) as client:
        with pytest.raises(InferenceServerException,
                           match=r"region 'gpu_in': raw_handle must be \{\"b64\": the base64 of "
                                 r"the CUDA IPC memory handle\}"):
            client.register_cuda_shared_memory("gpu_in", "not base64!", 0, 64)


def test_a_disabled_registry_refuses_cuda_regions_too() -> None:
    registry = SharedMemoryRegistry(enabled=False)
    with pytest.raises(UnavailableError, match=r"^cuda shared memory is disabled on this "
                                               r"server; start it with --allow-shared-memory$"):
        registry.register_cuda("r", b"\0" * 64, 0, 8)


def test_a_grpc_input_in_a_region_with_typed_contents_too_is_refused(regions) -> None:
    """Data from a region and data in the message: which is the input? Refused by name, as
    raw bytes beside a region are; the region alone decodes."""
    from tritonclient.grpc import service_pb2 as pb

    from tensorgate.protocol.grpc_codec import decode_model_infer
    from tensorgate.tensor import CopyLedger

    registry = SharedMemoryRegistry(enabled=True)
    name, key, handle = regions("typed", 16)
    shm.set_shared_memory_region(handle, [np.arange(4, dtype=np.float32)])
    registry.register(name, key, 0, 16)
    request = pb.ModelInferRequest(model_name="m")
    item = request.inputs.add(name="x", datatype="FP32", shape=[4])
    item.parameters["shared_memory_region"].string_param = name
    item.parameters["shared_memory_byte_size"].int64_param = 16
    assert decode_model_infer(request, CopyLedger(), registry).inputs["x"].numpy().tolist() == [
        0.0, 1.0, 2.0, 3.0]
    item.contents.fp32_contents.extend([9.0] * 4)
    with pytest.raises(InvalidArgumentError, match="input 'x' names a shared-memory region and "
                                                   "also carries data"):
        decode_model_infer(request, CopyLedger(), registry)
    registry.unregister()
