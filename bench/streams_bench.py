"""What a decoupled Triton Python model gains when its instance is free once `execute`
returns (as on Triton) instead of when its request's last response is out: the model
streams TOKENS responses a request, one per simulated step (2 ms), under a closed-loop
load of 8 gRPC-stream-like clients (in-process, `Engine.infer_stream`), one instance.

- `threads` — `execute` hands each request's response sender to a thread of the model's
  own and returns (Triton's decoupled examples, and engines that generate in the
  background);
- `async` — `async def execute` awaits each step (Triton's async execute);
- `generator` and `generator-8` — a tensorgate Model whose forward yields each step's
  response: it runs on the instance's executor thread, which steps one request at a time
  (the default) or interleaves up to 8 (`streams_per_instance: 8`). The step blocks that
  thread (as a model's compute would): interleaving cannot add throughput, it moves each
  request's first response ahead of the streams already running.

Prints requests/s, tokens/s, time to first token and to the last (P50/P99); writes
bench/results/streams_bench.json. `--src` runs it on another checkout's `src` (the code
before a change, for a before/after in one sitting); `--step-ms 0` makes the server's own
cost per response the whole of it:

    .venv/bin/python bench/streams_bench.py [--requests 20] [--step-ms 2] [--src OTHER/src]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import pathlib
import platform
import shutil
import sys
import tempfile
import time

import numpy as np

ROOT = pathlib.Path(__file__).resolve().parents[1]
RESULTS = pathlib.Path(__file__).parent / "results"
CLIENTS = 8
TOKENS = 16
STEP_S = 0.002

THREADS = '''
import threading, time
import numpy as np
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def execute(self, requests):
        for request in requests:
            threading.Thread(target=self._stream, args=(request.get_response_sender(),),
                             daemon=True).start()
        return None

    def _stream(self, sender):
        for token in range({tokens}):
            time.sleep({step_s})
            sender.send(pb_utils.InferenceResponse(
                [pb_utils.Tensor("TOKEN", np.array([token], np.int32))]))
        sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
'''

ASYNC = '''
import asyncio
import numpy as np
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    async def execute(self, requests):
        senders = [request.get_response_sender() for request in requests]
        for token in range({tokens}):
            await asyncio.sleep({step_s})
            for sender in senders:
                sender.send(pb_utils.InferenceResponse(
                    [pb_utils.Tensor("TOKEN", np.array([token], np.int32))]))
        for sender in senders:
            sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        return None
'''

GENERATOR = '''
import time
import torch
from tensorgate import Model

class Generator(Model):
    def forward(self, inputs):
        for token in range({tokens}):
            time.sleep({step_s})
            yield {{"TOKEN": torch.tensor([token], dtype=torch.int32)}}
'''

STREAMS = 'parameters {{ key: "streams_per_instance" value {{ string_value: "{streams}" }} }}'
MODELS = ("threads", "async", "generator", "generator-8")

CONFIG = """
name: "{name}"
backend: "python"
max_batch_size: 0
model_transaction_policy {{ decoupled: true }}
input [ {{ name: "PROMPT" data_type: TYPE_INT32 dims: [ 1 ] }} ]
output [ {{ name: "TOKEN" data_type: TYPE_INT32 dims: [ 1 ] }} ]
instance_group [ {{ count: 1 kind: KIND_CPU }} ]
{extra}
"""


def _write(root: pathlib.Path, step_s: float) -> None:
    for name, code, extra in (("threads", THREADS, ""), ("async", ASYNC, ""),
                              ("generator", GENERATOR, ""),
                              ("generator-8", GENERATOR, STREAMS.format(streams=8))):
        (root / name / "1").mkdir(parents=True)
        (root / name / "config.pbtxt").write_text(CONFIG.format(name=name, extra=extra))
        (root / name / "1" / "model.py").write_text(code.format(tokens=TOKENS, step_s=step_s))


async def _load(engine: object, api: object, model: str, per_client: int) -> dict[str, float]:
    """CLIENTS closed-loop clients, each streaming `per_client` requests one after another."""
    first: list[float] = []
    last: list[float] = []
    tokens = 0

    async def client() -> None:
        nonlocal tokens
        for _ in range(per_client):
            view = api.TensorView.from_numpy(np.array([1], np.int32), name="PROMPT")
            started = time.perf_counter()
            got = 0
            async for _result in engine.infer_stream(api.InferenceRequest(model,
                                                                          {"PROMPT": view})):
                if not got:
                    first.append(time.perf_counter() - started)
                got += 1
            last.append(time.perf_counter() - started)
            assert got == TOKENS, f"{model}: {got} responses, not {TOKENS}"
            tokens += got

    started = time.perf_counter()
    await asyncio.gather(*(client() for _ in range(CLIENTS)))
    wall = time.perf_counter() - started
    first_ms, last_ms = np.array(first) * 1e3, np.array(last) * 1e3
    return {"requests": len(last), "requests_per_s": len(last) / wall,
            "tokens_per_s": tokens / wall,
            "first_p50_ms": float(np.percentile(first_ms, 50)),
            "first_p99_ms": float(np.percentile(first_ms, 99)),
            "last_p50_ms": float(np.percentile(last_ms, 50)),
            "last_p99_ms": float(np.percentile(last_ms, 99))}


async def measure(api: object, per_client: int, step_s: float = STEP_S,
                  models: tuple[str, ...] = MODELS) -> dict[str, dict[str, float]]:
    root = pathlib.Path(tempfile.mkdtemp(prefix="tg-streams-bench-"))
    try:
        _write(root, step_s)
        engine = api.Engine(root)
        await engine.start(list(models))
        results: dict[str, dict[str, float]] = {}
        for model in models:  # warm-up
            await _load(engine, api, model, 1)
        for model in (*models, *models[::-1]):  # alternating rounds
            got = await _load(engine, api, model, per_client)
            kept = results.setdefault(model, {k: 0.0 for k in got})
            for key, value in got.items():
                kept[key] += value / 2
        await engine.shutdown()
        return results
    finally:
        shutil.rmtree(root, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=20, help="requests per client")
    parser.add_argument("--step-ms", type=float, default=STEP_S * 1e3,
                        help="the model's time per response (default 2)")
    parser.add_argument("--src", type=pathlib.Path, default=ROOT / "src",
                        help="the tensorgate source to measure (default: this checkout's)")
    parser.add_argument("--models", default=",".join(MODELS),
                        help=f"which of {', '.join(MODELS)} (default: all)")
    args = parser.parse_args()
    sys.path.insert(0, str(args.src.resolve()))
    import tensorgate as api  # noqa: PLC0415 - from the source asked for
    step_s = args.step_ms / 1e3
    results = asyncio.run(measure(api, args.requests, step_s, tuple(args.models.split(","))))
    print(f"{CLIENTS} clients, {args.requests} requests each, {TOKENS} responses a request, "
          f"one every {args.step_ms:g} ms; source {args.src} (2 rounds, alternating)")
    print("| model | requests/s | tokens/s | first P50 ms | first P99 ms | last P50 ms | "
          "last P99 ms |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for name, r in results.items():
        print(f"| {name} | {r['requests_per_s']:.1f} | {r['tokens_per_s']:.0f} | "
              f"{r['first_p50_ms']:.1f} | {r['first_p99_ms']:.1f} | {r['last_p50_ms']:.1f} | "
              f"{r['last_p99_ms']:.1f} |")
    RESULTS.mkdir(exist_ok=True)
    out = RESULTS / "streams_bench.json"
    if args.src.resolve() == (ROOT / "src").resolve():  # results of this checkout only
        out.write_text(json.dumps({
            "machine": platform.platform(), "python": platform.python_version(),
            "date": time.strftime("%Y-%m-%d"), "clients": CLIENTS, "tokens": TOKENS,
            "step_s": step_s, "requests_per_client": args.requests, "results": results},
            indent=2) + "\n")
        print(f"wrote {out.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
