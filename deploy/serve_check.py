"""Check a tensorgate that deploy/build_check.sh started from the image: it gets ready, and
answers its built-in models over HTTP and gRPC through tritonclient (identity byte for byte,
resnet50's top 3 as Triton's classification extension writes them), or with `--package DIR`
the AOTInductor package `--make-package DIR` wrote (a repository of one model, "lin", and the
answer its module gave), or with `--sagemaker-port` the SageMaker image (deploy/sagemaker)
serving the repository `--make-sagemaker-model DIR` wrote (the built-in identity alone, as
SageMaker unpacks a model into /opt/ml/model) on SageMaker's /ping and /invocations. Prints
the start-up time (from `--started`, a time.time() taken just before the start) and exits 1
on a wrong answer.

    .venv/bin/python deploy/serve_check.py --http-port 18500 --grpc-port 18501 --started T
    .venv/bin/python deploy/serve_check.py --make-package DIR     (needs a C++ compiler)
    .venv/bin/python deploy/serve_check.py --http-port ... --started T --package DIR
    .venv/bin/python deploy/serve_check.py --make-sagemaker-model DIR
    .venv/bin/python deploy/serve_check.py --sagemaker-port 18500 --started T
"""

from __future__ import annotations

import argparse
import http.client
import json
import pathlib
import shutil
import sys
import tempfile
import time
import warnings
import urllib.error
import urllib.request

import numpy as np
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient


def wait_ready(http_port: int, limit_s: float, path: str = "/v2/health/ready") -> float:
    """When (time.time()) `path` first answered 200, polled every 50 ms."""
    deadline = time.time() + limit_s
    while time.time() < deadline:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{http_port}{path}",
                                        timeout=2) as answer:
                if answer.status == 200:
                    return time.time()
        except (urllib.error.URLError, ConnectionError, TimeoutError):
            pass
        time.sleep(0.05)
    raise TimeoutError(f"not ready on 127.0.0.1:{http_port} within {limit_s:.0f} s")


def check(http_port: int, grpc_port: int) -> list[str]:
    """What the image answered wrong; empty when all is right."""
    wrong = []
    x = np.random.default_rng(0).random((1, 3, 224, 224), dtype=np.float32)
    http = httpclient.InferenceServerClient(f"127.0.0.1:{http_port}")
    image = httpclient.InferInput("INPUT__0", list(x.shape), "FP32")
    image.set_data_from_numpy(x)
    if not np.array_equal(http.infer("identity", [image]).as_numpy("OUTPUT__0"), x):
        wrong.append("identity over HTTP: not the bytes sent")
    top = http.infer("resnet50", [image], outputs=[
        httpclient.InferRequestedOutput("OUTPUT__0", class_count=3)]).as_numpy("OUTPUT__0")
    if top is None or top.shape != (1, 3) or not all(b":" in entry for entry in top[0]):
        wrong.append(f"resnet50's top 3 over HTTP: {top!r}")
    grpc = grpcclient.InferenceServerClient(f"127.0.0.1:{grpc_port}")
    image_g = grpcclient.InferInput("INPUT__0", list(x.shape), "FP32")
    image_g.set_data_from_numpy(x)
    if not np.array_equal(grpc.infer("identity", [image_g]).as_numpy("OUTPUT__0"), x):
        wrong.append("identity over gRPC: not the bytes sent")
    return wrong


_PACKAGE_CONFIG = """name: "lin"
platform: "torch_aoti"
max_batch_size: 8
input [ { name: "x" data_type: TYPE_FP32 dims: [8] } ]
output [ { name: "y" data_type: TYPE_FP32 dims: [4] } ]
"""


def make_package(folder: pathlib.Path) -> None:
    """A repository of one AOTInductor package, "lin" (Linear(8, 4), rows 1 to 8), in
    `folder`, and its module's answer to a row of ones in folder/expected.npy."""
    import torch  # here only: the checks above need none of it
    torch.manual_seed(0)
    module = torch.nn.Linear(8, 4).eval()
    program = torch.export.export(module, (torch.randn(2, 8),), dynamic_shapes={
        "input": {0: torch.export.Dim("batch", min=1, max=8)}})
    version = folder / "lin" / "1"
    version.mkdir(parents=True, exist_ok=True)
    with warnings.catch_warnings():  # torch's own deprecations, inside the compile
        warnings.simplefilter("ignore")
        torch._inductor.aoti_compile_and_package(program, package_path=str(version / "model.pt2"))
    (folder / "lin" / "config.pbtxt").write_text(_PACKAGE_CONFIG)
    with torch.no_grad():
        np.save(folder / "expected.npy", module(torch.ones(1, 8)).numpy())


def check_package(http_port: int, folder: pathlib.Path) -> list[str]:
    """What the image answered wrong for make_package's model; empty when all is right."""
    client = httpclient.InferenceServerClient(f"127.0.0.1:{http_port}")
    row = httpclient.InferInput("x", [1, 8], "FP32")
    row.set_data_from_numpy(np.ones((1, 8), dtype=np.float32))
    answer = client.infer("lin", [row]).as_numpy("y")
    expected = np.load(folder / "expected.npy")
    if answer is None or answer.shape != expected.shape or not np.allclose(
            answer, expected, rtol=1e-5, atol=1e-6):
        return [f"the package's answer {answer!r}, its module's {expected!r}"]
    return []


_SAGEMAKER_BINARY = "application/vnd.sagemaker-triton.binary+json;json-header-size="


def make_sagemaker_model(folder: pathlib.Path) -> None:
    """The built-in identity model alone in `folder`: what SageMaker unpacks into
    /opt/ml/model (its one model, so that no SAGEMAKER_TRITON_DEFAULT_MODEL_NAME is needed)."""
    from tensorgate.builtin.repository import write_default_repository
    with tempfile.TemporaryDirectory() as scratch:
        write_default_repository(pathlib.Path(scratch))
        shutil.copytree(pathlib.Path(scratch) / "identity", folder / "identity")


def check_sagemaker(port: int) -> list[str]:
    """What the SageMaker image answered wrong on /invocations, in JSON and binary."""
    wrong = []
    x = np.random.default_rng(0).random((1, 3, 224, 224), dtype=np.float32)
    small = {"inputs": [{"name": "INPUT__0", "datatype": "FP32", "shape": [1, 3, 224, 224],
                         "data": x.ravel().tolist()}]}
    status, _, body = _post(port, "/invocations", json.dumps(small).encode(),
                            {"Content-Type": "application/json"})
    if status != 200 or not np.array_equal(
            np.array(json.loads(body)["outputs"][0]["data"], np.float32), x.ravel()):
        wrong.append(f"identity on /invocations in JSON: {status} {body[:200]!r}")
    head = json.dumps({"inputs": [{"name": "INPUT__0", "datatype": "FP32",
                                   "shape": [1, 3, 224, 224],
                                   "parameters": {"binary_data_size": x.nbytes}}],
                       "outputs": [{"name": "OUTPUT__0",
                                    "parameters": {"binary_data": True}}]}).encode()
    status, kind, body = _post(port, "/invocations", head + x.tobytes(),
                               {"Content-Type": f"{_SAGEMAKER_BINARY}{len(head)}"})
    size = int(kind[len(_SAGEMAKER_BINARY):]) if kind.startswith(_SAGEMAKER_BINARY) else -1
    if status != 200 or size < 0 or body[size:] != x.tobytes():
        wrong.append(f"identity on /invocations in binary: {status} {kind} {body[:200]!r}")
    return wrong


def _post(port: int, path: str, body: bytes, headers: dict[str, str]
          ) -> tuple[int, str, bytes]:
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    try:
        connection.request("POST", path, body=body, headers=headers)
        answer = connection.getresponse()
        return answer.status, answer.getheader("Content-Type", ""), answer.read()
    finally:
        connection.close()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--http-port", type=int)
    parser.add_argument("--grpc-port", type=int)
    parser.add_argument("--started", type=float, help="time.time() at start")
    parser.add_argument("--limit-s", type=float, default=180.0)
    parser.add_argument("--make-package", type=pathlib.Path, metavar="DIR")
    parser.add_argument("--package", type=pathlib.Path, metavar="DIR",
                        help="check the model --make-package wrote there")
    parser.add_argument("--make-sagemaker-model", type=pathlib.Path, metavar="DIR")
    parser.add_argument("--sagemaker-port", type=int,
                        help="check the SageMaker image's routes on this port")
    args = parser.parse_args()
    if args.make_package is not None:
        make_package(args.make_package)
        return 0
    if args.make_sagemaker_model is not None:
        make_sagemaker_model(args.make_sagemaker_model)
        return 0
    if args.sagemaker_port is not None and args.started is not None:
        ready = wait_ready(args.sagemaker_port, args.limit_s, "/ping")
        print(f"start-up to /ping 200: {ready - args.started:.2f} s")
        wrong = check_sagemaker(args.sagemaker_port)
        for line in wrong:
            print(f"WRONG: {line}")
        if not wrong:
            print("SageMaker image: identity from /opt/ml/model on /invocations, JSON and "
                  "binary: answered right")
        return 1 if wrong else 0
    if args.http_port is None or args.started is None:
        parser.error("--http-port and --started are needed for a check")
    ready = wait_ready(args.http_port, args.limit_s)
    print(f"start-up to ready: {ready - args.started:.2f} s")
    if args.package is not None:
        wrong, right = check_package(args.http_port, args.package), \
            "an AOTInductor package from a read-only /mnt: answered as its module"
    else:
        if args.grpc_port is None:
            parser.error("--grpc-port is needed to check the built-in models")
        wrong, right = check(args.http_port, args.grpc_port), \
            "identity over HTTP and gRPC, resnet50's top 3: answered right"
    for line in wrong:
        print(f"WRONG: {line}")
    if not wrong:
        print(right)
    return 1 if wrong else 0


if __name__ == "__main__":
    sys.exit(main())
