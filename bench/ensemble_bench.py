"""What an ensemble step costs: the built-in `identity` (FP32 [1,3,224,224]) called twice
in a row by the client, against an ensemble that chains it twice, in-process, batch 1, one
request at a time. Prints P50/P99 of each and the ensemble's overhead; copies per request
(tensors pass from step to step as views: expect 0). Writes bench/results/ensemble_bench.json.

    .venv/bin/python bench/ensemble_bench.py [--requests 3000]
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
import torch

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "src"))

from tensorgate import Engine, InferenceRequest, TensorView  # noqa: E402
from tensorgate.builtin.repository import write_default_repository  # noqa: E402

RESULTS = pathlib.Path(__file__).parent / "results"
TWICE = """
name: "twice"
platform: "ensemble"
max_batch_size: 64
input [ { name: "IMAGE" data_type: TYPE_FP32 dims: [ 3, 224, 224 ] } ]
output [ { name: "OUT" data_type: TYPE_FP32 dims: [ 3, 224, 224 ] } ]
ensemble_scheduling { step [
  { model_name: "identity" model_version: -1 input_map { key: "INPUT__0" value: "IMAGE" }
    output_map { key: "OUTPUT__0" value: "MID" } },
  { model_name: "identity" model_version: -1 input_map { key: "INPUT__0" value: "MID" }
    output_map { key: "OUTPUT__0" value: "OUT" } } ] }
"""


async def measure(requests: int) -> dict[str, dict[str, float]]:
    root = pathlib.Path(tempfile.mkdtemp(prefix="tg-ensemble-bench-"))
    try:
        write_default_repository(root)
        (root / "twice" / "1").mkdir(parents=True)
        (root / "twice" / "config.pbtxt").write_text(TWICE)
        engine = Engine(root)
        await engine.start(["identity", "twice"])
        x = torch.randn(1, 3, 224, 224)

        async def two_calls() -> int:
            first = await engine.infer(InferenceRequest(
                "identity", {"INPUT__0": TensorView.from_torch(x, name="INPUT__0")}))
            second = await engine.infer(InferenceRequest(
                "identity", {"INPUT__0": first.outputs["OUTPUT__0"]}))
            return first.ledger.bytes + second.ledger.bytes

        async def ensemble() -> int:
            result = await engine.infer(InferenceRequest(
                "twice", {"IMAGE": TensorView.from_torch(x, name="IMAGE")}))
            return result.ledger.bytes

        samples: dict[str, list[int]] = {"two calls": [], "ensemble": []}
        copied: dict[str, int] = {"two calls": 0, "ensemble": 0}
        for round_ in range(10):  # alternating rounds: noise hits both
            for name, call in (("two calls", two_calls), ("ensemble", ensemble)):
                for i in range(requests // 10 + (20 if round_ == 0 else 0)):
                    started = time.perf_counter_ns()
                    copied[name] += await call()
                    if round_ or i >= 20:
                        samples[name].append(time.perf_counter_ns() - started)
        await engine.shutdown()
    finally:
        shutil.rmtree(root)
    rows = {}
    for name, values in samples.items():
        a = np.array(values) / 1e3
        rows[name] = {"p50_us": float(np.percentile(a, 50)), "p99_us": float(np.percentile(a, 99)),
                      "n": len(values), "copied_bytes_per_request": copied[name] / len(values)}
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=3000)
    args = parser.parse_args()
    rows = asyncio.run(measure(args.requests))
    print(f"{'identity twice, batch 1':<26}{'P50 µs':>9}{'P99 µs':>9}{'copied B/req':>14}")
    for name, row in rows.items():
        print(f"{name:<26}{row['p50_us']:>9.0f}{row['p99_us']:>9.0f}"
              f"{row['copied_bytes_per_request']:>14.0f}")
    overhead = rows["ensemble"]["p50_us"] - rows["two calls"]["p50_us"]
    print(f"ensemble overhead at P50: {overhead:+.0f} µs")
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "ensemble_bench.json").write_text(json.dumps(
        {"date": time.strftime("%Y-%m-%d %H:%M"), "machine": platform.machine(),
         "python": platform.python_version(), "torch": torch.__version__, "rows": rows,
         "overhead_p50_us": overhead}, indent=2))


if __name__ == "__main__":
    main()
