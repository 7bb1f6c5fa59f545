"""An eager `model.py` against the same network as TorchScript, in one server: does an eager
model need a process of its own?

DESIGN.md measured that an eager `nn.Module` re-takes the GIL at every op and slowed 13× beside
a busy pure-Python thread, and left open whether the server must run eager models out of
process. Here the built-in resnet50 (TorchScript) and `resnet50_eager` (a tensorgate `Model`
whose forward calls the same `nets.resnet50(seed=0)` eagerly) are served side by side, and
each is timed batch 1, one request at a time over HTTP (binary tensors, a lean socket client),
first with the server otherwise idle, then while `wrk` drives `identity` at --connections
connections, which keeps the event loop's thread busy with Python. Rounds alternate the order.
Writes bench/results/eager_bench.json.

    .venv/bin/python bench/eager_bench.py [--requests 60] [--rounds 2] [--connections 4]
        [--src /tmp/tg-old/src]
    (apt-get install wrk)
"""

from __future__ import annotations

import argparse
import json
import pathlib
import platform
import shutil
import sys
import tempfile
import textwrap
import threading
import time
from typing import Any

import numpy as np
import torch

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "src"))
sys.path.insert(0, str(HERE))

from ab_bench import serve  # noqa: E402
from compare_wire import OIP_BINARY, Connection, raw_request, wrk_load  # noqa: E402
from tensorgate.builtin.repository import write_default_repository  # noqa: E402

RESULTS = HERE / "results"
MODELS = ("resnet50", "resnet50_eager")
_EAGER_MODEL = '''
    from tensorgate import Model
    from tensorgate.builtin.nets import resnet50


    class EagerResNet(Model):
        """The built-in resnet50's network, run eagerly (no TorchScript)."""

        def setup(self, context):
            self.net = resnet50(seed=0).eval()

        def forward(self, inputs):
            return {"OUTPUT__0": self.net(inputs["INPUT__0"])}
'''


def repository(root: pathlib.Path) -> pathlib.Path:
    """The built-in identity and resnet50, and resnet50_eager beside them."""
    models = write_default_repository(root / "models")
    shutil.rmtree(models / "detector")
    eager = models / "resnet50_eager"
    (eager / "1").mkdir(parents=True)
    config = (models / "resnet50" / "config.pbtxt").read_text()
    (eager / "config.pbtxt").write_text(config.replace('"resnet50"', '"resnet50_eager"')
                                        .replace('platform: "pytorch_libtorch"',
                                                 'backend: "python"'))
    (eager / "1" / "model.py").write_text(textwrap.dedent(_EAGER_MODEL).lstrip())
    return models


def sequential(port: int, model: str, x: np.ndarray, count: int,
               reference: np.ndarray) -> np.ndarray:
    """`count` batch-1 requests one after another (after 3 unmeasured): latencies in ms.
    Every answer must be resnet50's for `x`."""
    path, headers, body = OIP_BINARY.build(f"/v2/models/{model}/infer", model, x)
    raw = raw_request(port, path, headers, body)
    connection = Connection(port)
    ms = []
    try:
        for i in range(count + 3):
            begin = time.perf_counter_ns()
            status, answer_headers, answer = connection.exchange(raw)
            elapsed = (time.perf_counter_ns() - begin) / 1e6
            if status != 200:
                raise RuntimeError(f"{model}: HTTP {status}: {bytes(answer[:300])!r}")
            got = OIP_BINARY.decode(answer_headers, bytes(answer))
            if not np.allclose(got, reference, rtol=1e-3, atol=1e-3):
                raise RuntimeError(f"{model}: the answer is not resnet50's")
            if i >= 3:
                ms.append(elapsed)
    finally:
        connection.close()
    return np.array(ms)


def figures(ms: np.ndarray) -> dict[str, float]:
    return {f"p{q}_ms": round(float(np.percentile(ms, q)), 2) for q in (50, 90, 99)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=60)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--connections", type=int, default=4)
    parser.add_argument("--src", type=pathlib.Path, default=HERE.parent / "src",
                        help="the tree whose server is measured (a worktree's src: before)")
    args = parser.parse_args()
    work = pathlib.Path(tempfile.mkdtemp(prefix="tg-eager-"))
    x = np.random.default_rng(0).standard_normal((1, 3, 224, 224)).astype(np.float32)
    samples: dict[str, dict[str, list[float]]] = {m: {"idle": [], "busy": []} for m in MODELS}
    identity_qps: dict[str, list[float]] = {m: [] for m in MODELS}
    process, port, _ = serve(args.src, repository(work))
    try:
        reference = _answer(port, x)
        path, headers, body = OIP_BINARY.build("/v2/models/identity/infer", "identity", x)
        identity = raw_request(port, path, headers, body)
        for r in range(args.rounds):
            for model in MODELS if r % 2 == 0 else MODELS[::-1]:
                samples[model]["idle"] += sequential(port, model, x, args.requests,
                                                     reference).tolist()
                load: dict[str, Any] = {}
                seconds = args.requests * 0.25 + 5  # outlasts the requests below
                driver = threading.Thread(target=lambda: load.update(wrk_load(
                    port, identity, args.connections, seconds, x.nbytes, work)))
                driver.start()
                time.sleep(1.0)
                samples[model]["busy"] += sequential(port, model, x, args.requests,
                                                     reference).tolist()
                driver.join()
                if load.get("bad"):
                    raise RuntimeError(f"wrk counted {load['bad']} bad identity answers")
                identity_qps[model].append(load["qps"])
                print(f"round {r + 1}: {model} done", flush=True)
    finally:
        process.kill()
        process.wait()
        shutil.rmtree(work, ignore_errors=True)
    rows = {m: {"idle": figures(np.array(s["idle"])), "busy": figures(np.array(s["busy"])),
                "identity_qps": round(float(np.median(identity_qps[m])))}
            for m, s in samples.items()}
    print(f"\nresnet50 batch 1 over HTTP, {args.rounds} x {args.requests} requests each; busy: "
          f"wrk drives identity at {args.connections} connections beside it\n")
    print("| model | idle P50 ms | idle P99 ms | busy P50 ms | busy P99 ms | busy / idle P50 "
          "| identity QPS beside it |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for model, row in rows.items():
        idle, busy = row["idle"], row["busy"]
        print(f"| {model} | {idle['p50_ms']:.1f} | {idle['p99_ms']:.1f} | {busy['p50_ms']:.1f} "
              f"| {busy['p99_ms']:.1f} | {busy['p50_ms'] / idle['p50_ms']:.2f} "
              f"| {row['identity_qps']:,} |")
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "eager_bench.json").write_text(json.dumps({
        "date": time.strftime("%Y-%m-%d %H:%M"), "machine": platform.processor() or
        platform.machine(), "torch": torch.__version__,
        "args": {**vars(args), "src": str(args.src)}, "models": rows,
        "samples_ms": samples}))


def _answer(port: int, x: np.ndarray) -> np.ndarray:
    """The TorchScript resnet50's answer for `x`, which both models must give."""
    path, headers, body = OIP_BINARY.build("/v2/models/resnet50/infer", "resnet50", x)
    connection = Connection(port)
    try:
        status, answer_headers, answer = connection.exchange(
            raw_request(port, path, headers, body))
        if status != 200:
            raise RuntimeError(f"resnet50: HTTP {status}")
        return OIP_BINARY.decode(answer_headers, bytes(answer))
    finally:
        connection.close()


if __name__ == "__main__":
    main()
