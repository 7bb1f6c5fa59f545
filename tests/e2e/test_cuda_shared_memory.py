"""CUDA shared memory through tritonclient, on a GPU: the client's device memory, shared by
its CUDA IPC handle (made here by torch, the same cudaIpcMemHandle_t that tritonclient's
cuda_shared_memory utilities send), is the request's input and receives its output; a
region that claims more than its allocation is refused. Skipped without a CUDA device.

Only tritonclient's gRPC client is imported up front: the HTTP case is skipped where its
client (gevent) cannot be imported."""

from __future__ import annotations

import base64
from collections.abc import Iterator

import pytest
import torch
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException

from tests.e2e.conftest import RunningServer, start_server, stop_server
from tests.pipeline import repo_builder as rb

pytestmark = [pytest.mark.cuda,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]

VALUE = torch.arange(24, dtype=torch.float32).reshape(2, 3, 4)
IPC_HANDLE_BYTES = 64  # sizeof(cudaIpcMemHandle_t), what tritonclient sends


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    root = tmp_path_factory.mktemp("cuda_shm")
    rb.add_torchscript(root / "models", "identity", rb.Identity(), [3, 4], [3, 4])
    running = start_server(root / "models", root / "server.log", "--allow-shared-memory")
    yield running
    assert stop_server(running) == 0, running.log.read_text()


def _shared(tensor: torch.Tensor) -> tuple[str, int, int]:
    """`tensor`'s allocation as a client shares it: (base64 IPC handle, byte offset of the
    tensor in it, bytes from the allocation's start to the tensor's end)."""
    shared = tensor.untyped_storage()._share_cuda_()
    handle, offset = shared[1], shared[3]
    if len(handle) == 2 + IPC_HANDLE_BYTES:  # torch's own framing: a version byte, a type byte
        if handle[1:2] != b"c":  # an expandable segment: no cudaIpcMemHandle_t to send
            pytest.skip("torch shares this allocation as an expandable segment")
        handle = handle[2:]
    assert len(handle) == IPC_HANDLE_BYTES, handle
    return base64.b64encode(handle).decode(), offset, offset + tensor.nbytes


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_identity_through_cuda_shared_memory(server: RunningServer, protocol: str) -> None:
    module = pytest.importorskip(f"tritonclient.{protocol}")
    http = protocol == "http"
    source = VALUE.to("cuda")
    target = torch.full_like(source, -1.0)
    torch.cuda.synchronize()
    in_handle, in_offset, in_size = _shared(source)
    out_handle, out_offset, out_size = _shared(target)
    with module.InferenceServerClient(server.url if http else server.grpc_url) as client:
        client.register_cuda_shared_memory("gpu_in", in_handle, 0, in_size)
        client.register_cuda_shared_memory("gpu_out", out_handle, 0, out_size)
        try:
            status = client.get_cuda_shared_memory_status()
            names = {r["name"] for r in status} if http else set(status.regions)
            assert names == {"gpu_in", "gpu_out"}
            item = module.InferInput("INPUT__0", list(VALUE.shape), "FP32")
            item.set_shared_memory("gpu_in", VALUE.nbytes, offset=in_offset)
            out = module.InferRequestedOutput("OUTPUT__0")
            out.set_shared_memory("gpu_out", VALUE.nbytes, offset=out_offset)
            client.infer("identity", [item], outputs=[out])
            torch.cuda.synchronize()
            torch.testing.assert_close(target.cpu(), VALUE)
        finally:
            client.unregister_cuda_shared_memory()
        status = client.get_cuda_shared_memory_status()
        assert (status == [] if http else not status.regions)


def test_a_region_larger_than_its_allocation_is_refused(server: RunningServer) -> None:
    memory = torch.zeros(1 << 20, dtype=torch.uint8, device="cuda")
    handle, _, _ = _shared(memory)
    with grpcclient.InferenceServerClient(server.grpc_url) as client:
        with pytest.raises(InferenceServerException,
                           match=r"region 'too_big': byte_size 1099511627776 exceeds the \d+ "
                                 r"bytes of the allocation its handle names"):
            client.register_cuda_shared_memory("too_big", handle, 0, 1 << 40)
        with pytest.raises(InferenceServerException, match=r"device_id 99 is not a GPU"):
            client.register_cuda_shared_memory("far", handle, 99, 64)
        assert not client.get_cuda_shared_memory_status().regions


def test_the_server_names_the_extension(server: RunningServer) -> None:
    with grpcclient.InferenceServerClient(server.grpc_url) as client:
        assert "cuda_shared_memory" in client.get_server_metadata().extensions
