"""Check a tensorgate that deploy/build_check.sh started from the image: it gets ready, and
answers its built-in models over HTTP and gRPC through tritonclient (identity byte for byte,
resnet50's top 3 as Triton's classification extension writes them). Prints the start-up time
(from `--started`, a time.time() taken just before the start) and exits 1 on a wrong answer.

    .venv/bin/python deploy/serve_check.py --http-port 18500 --grpc-port 18501 --started T
"""

from __future__ import annotations

import argparse
import sys
import time
import urllib.error
import urllib.request

import numpy as np
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient


def wait_ready(http_port: int, limit_s: float) -> float:
    """Seconds until /v2/health/ready answers 200 (time.time()), polled every 50 ms."""
    deadline = time.time() + limit_s
    while time.time() < deadline:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{http_port}/v2/health/ready",
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


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--http-port", type=int, required=True)
    parser.add_argument("--grpc-port", type=int, required=True)
    parser.add_argument("--started", type=float, required=True, help="time.time() at start")
    parser.add_argument("--limit-s", type=float, default=180.0)
    args = parser.parse_args()
    ready = wait_ready(args.http_port, args.limit_s)
    print(f"start-up to ready: {ready - args.started:.2f} s")
    wrong = check(args.http_port, args.grpc_port)
    for line in wrong:
        print(f"WRONG: {line}")
    if not wrong:
        print("identity over HTTP and gRPC, resnet50's top 3: answered right")
    return 1 if wrong else 0


if __name__ == "__main__":
    sys.exit(main())
