"""What sequence batching costs: one small TorchScript model that adds its input to a running
total, served twice in-process — as a stateful model (the server keeps the total as implicit
state and sets START/READY), and as a stateless model whose client sends the total and the
flags itself. Batch 1, one request at a time (P50/P99), then 8 sequences (8 clients) at once
(requests/s and rows per batch). Writes bench/results/sequence_bench.json.

    .venv/bin/python bench/sequence_bench.py [--requests 4000]
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

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT))

from tensorgate import Engine, InferenceRequest, TensorView  # noqa: E402
from tensorgate.pipeline.work import SequenceFlags  # noqa: E402
from tests.pipeline.sequence_models import Accumulate, add_accumulate  # noqa: E402

RESULTS = pathlib.Path(__file__).parent / "results"
STATELESS = """
name: "stateless"
platform: "pytorch_libtorch"
max_batch_size: 8
input [ { name: "INPUT" data_type: TYPE_FP32 dims: [1] },
        { name: "START" data_type: TYPE_FP32 dims: [1] },
        { name: "READY" data_type: TYPE_FP32 dims: [1] },
        { name: "TOTAL_IN" data_type: TYPE_FP32 dims: [1] } ]
output [ { name: "TOTAL" data_type: TYPE_FP32 dims: [1] },
         { name: "ROWS" data_type: TYPE_FP32 dims: [1] },
         { name: "TOTAL_OUT" data_type: TYPE_FP32 dims: [1] } ]
dynamic_batching { }
"""
CLIENTS = 8


def _view(value: float, name: str) -> TensorView:
    return TensorView.from_torch(torch.full((1, 1), value), name=name)


async def measure(requests: int) -> dict[str, dict[str, float]]:
    root = pathlib.Path(tempfile.mkdtemp(prefix="tg-sequence-bench-"))
    try:
        add_accumulate(root, "stateful", "oldest { }", max_batch=8)
        (root / "stateless" / "1").mkdir(parents=True)
        (root / "stateless" / "config.pbtxt").write_text(STATELESS)
        torch.jit.script(Accumulate().eval()).save(str(root / "stateless" / "1" / "model.pt"))
        engine = Engine(root)
        await engine.start(["stateful", "stateless"])
        totals = {}  # the stateless clients' own state, by client

        async def stateful(client: int, step: int, end: bool = False) -> float:
            result = await engine.infer(InferenceRequest(
                "stateful", {"INPUT": _view(1.0, "INPUT")},
                sequence=SequenceFlags(client + 1, step == 0, end)))
            return float(result.outputs["ROWS"].torch()[0, 0])

        async def stateless(client: int, step: int, end: bool = False) -> float:
            total = 0.0 if step == 0 else totals[client]
            result = await engine.infer(InferenceRequest("stateless", {
                "INPUT": _view(1.0, "INPUT"), "START": _view(float(step == 0), "START"),
                "READY": _view(1.0, "READY"), "TOTAL_IN": _view(total, "TOTAL_IN")}))
            totals[client] = float(result.outputs["TOTAL_OUT"].torch()[0, 0])
            return float(result.outputs["ROWS"].torch()[0, 0])

        calls = {"stateful": stateful, "stateless": stateless}
        samples: dict[str, list[int]] = {name: [] for name in calls}
        steps = {name: 0 for name in calls}
        for round_ in range(10):  # alternating rounds: noise hits both
            for name, call in calls.items():
                for i in range(requests // 10 + (50 if round_ == 0 else 0)):
                    started = time.perf_counter_ns()
                    await call(0, steps[name])
                    steps[name] += 1
                    if round_ or i >= 50:
                        samples[name].append(time.perf_counter_ns() - started)
        for name, call in calls.items():  # the end frees its sequence's slot for the next part
            await call(0, steps[name], end=True)
        rows: dict[str, dict[str, float]] = {}
        for name, call in calls.items():
            a = np.array(samples[name]) / 1e3
            rows[name] = {"p50_us": float(np.percentile(a, 50)),
                          "p99_us": float(np.percentile(a, 99)), "n": len(a)}

            async def client(index: int, call=call) -> list[float]:
                return [await call(index, step) for step in range(requests // CLIENTS)]
            started = time.perf_counter()
            seen = await asyncio.gather(*(client(i) for i in range(1, CLIENTS + 1)))
            elapsed = time.perf_counter() - started
            rows[name]["qps_8_clients"] = CLIENTS * (requests // CLIENTS) / elapsed
            rows[name]["rows_per_batch"] = float(np.mean([r for s in seen for r in s]))
        await engine.shutdown()
    finally:
        shutil.rmtree(root)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=4000)
    args = parser.parse_args()
    rows = asyncio.run(measure(args.requests))
    print(f"{'accumulate, in-process':<24}{'P50 µs':>9}{'P99 µs':>9}{'QPS @8':>9}"
          f"{'rows/batch @8':>15}")
    for name, row in rows.items():
        print(f"{name:<24}{row['p50_us']:>9.0f}{row['p99_us']:>9.0f}"
              f"{row['qps_8_clients']:>9.0f}{row['rows_per_batch']:>15.1f}")
    overhead = rows["stateful"]["p50_us"] - rows["stateless"]["p50_us"]
    print(f"sequence batching at P50: {overhead:+.0f} µs a request")
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "sequence_bench.json").write_text(json.dumps(
        {"date": time.strftime("%Y-%m-%d %H:%M"), "machine": platform.machine(),
         "python": platform.python_version(), "torch": torch.__version__, "rows": rows,
         "overhead_p50_us": overhead}, indent=2))


if __name__ == "__main__":
    main()
