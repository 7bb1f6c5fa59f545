"""What request rescheduling (Triton's `iterative_sequence`) buys a model that generates a
step at a time: the same Triton Python model logic served two ways, in-process, under the
same closed-loop load of 8 clients whose requests need 1 to 32 steps (seeded, the same
draws for both):

- `whole` — request-level batching (dynamic_batching): one execute runs every step of its
  batch, so a batch ends when its longest request does, and short requests wait for it;
- `stepwise` — continuous batching (iterative_sequence, `oldest`): one execute is one step of
  each running request; a request that is done leaves, a waiting one joins at the next step.

A step is simulated (`time.sleep` of 2 ms + 0.2 ms a row: the launch cost and the per-row
cost of a small decoder step), so what is measured is the scheduling, not a network.
Prints requests/s, P50/P99 latency, and rows per execute; writes
bench/results/iterative_bench.json.

    .venv/bin/python bench/iterative_bench.py [--requests 40]   # per client
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

from tensorgate import Engine, InferenceRequest, TensorView  # noqa: E402

RESULTS = pathlib.Path(__file__).parent / "results"
CLIENTS = 8
MAX_STEPS = 32

STEP = '''
import time
def step(rows):
    time.sleep(0.002 + 0.0002 * rows)
'''

STEPWISE = STEP + '''
import numpy as np
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def initialize(self, args):
        self.done = {}

    def execute(self, requests):
        step(len(requests))
        responses = []
        for request in requests:
            key = request.correlation_id()
            if request.flags() & pb_utils.TRITONSERVER_REQUEST_FLAG_SEQUENCE_START:
                self.done[key] = 0
            self.done[key] += 1
            steps = int(pb_utils.get_input_tensor_by_name(request, "STEPS").as_numpy().ravel()[0])
            if self.done[key] < steps:
                request.set_release_flags(pb_utils.TRITONSERVER_REQUEST_RELEASE_RESCHEDULE)
                responses.append(None)
                continue
            del self.done[key]
            responses.append(pb_utils.InferenceResponse(
                [pb_utils.Tensor("ROWS", np.array([[len(requests)]], np.int32))]))
        return responses
'''

WHOLE = STEP + '''
import numpy as np
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def execute(self, requests):
        steps = [int(pb_utils.get_input_tensor_by_name(r, "STEPS").as_numpy().ravel()[0])
                 for r in requests]
        for _ in range(max(steps)):
            step(len(requests))
        return [pb_utils.InferenceResponse(
            [pb_utils.Tensor("ROWS", np.array([[len(requests)]], np.int32))])
            for _ in requests]
'''

CONFIG = """
name: "{name}"
backend: "python"
max_batch_size: {clients}
input [ {{ name: "STEPS" data_type: TYPE_INT32 dims: [ 1 ] }} ]
output [ {{ name: "ROWS" data_type: TYPE_INT32 dims: [ 1 ] }} ]
instance_group [ {{ count: 1 kind: KIND_CPU }} ]
parameters {{ key: "batch_cap" value {{ string_value: "off" }} }}
{scheduling}
"""
SCHEDULING = {
    "whole": "dynamic_batching { }",
    "stepwise": f"sequence_batching {{ iterative_sequence: true "
                f"oldest {{ max_candidate_sequences: {CLIENTS} }} }}",
}


def _write(root: pathlib.Path) -> None:
    for name, code in (("whole", WHOLE), ("stepwise", STEPWISE)):
        (root / name / "1").mkdir(parents=True)
        (root / name / "config.pbtxt").write_text(CONFIG.format(
            name=name, clients=CLIENTS, scheduling=SCHEDULING[name]))
        (root / name / "1" / "model.py").write_text(code)


async def _load(engine: Engine, model: str, draws: np.ndarray) -> dict[str, float]:
    """CLIENTS closed-loop clients, each sending its row of `draws` one after another."""
    latencies: list[float] = []

    async def client(steps: np.ndarray) -> None:
        for n in steps:
            view = TensorView.from_torch(torch.tensor([[int(n)]], dtype=torch.int32),
                                         name="STEPS")
            started = time.perf_counter()
            await engine.infer(InferenceRequest(model, {"STEPS": view}))
            latencies.append(time.perf_counter() - started)

    before = engine.statistics(model)[0]
    started = time.perf_counter()
    await asyncio.gather(*(client(row) for row in draws))
    wall = time.perf_counter() - started
    after = engine.statistics(model)[0]
    executions = after["execution_count"] - before["execution_count"]
    rows = after["inference_count"] - before["inference_count"]
    ms = np.array(latencies) * 1e3
    return {"requests": len(latencies), "requests_per_s": len(latencies) / wall,
            "p50_ms": float(np.percentile(ms, 50)), "p99_ms": float(np.percentile(ms, 99)),
            "executions": executions, "rows_per_execution": rows / executions,
            "steps_per_s": float(draws.sum()) / wall}


async def measure(per_client: int) -> dict[str, dict[str, float]]:
    root = pathlib.Path(tempfile.mkdtemp(prefix="tg-iterative-bench-"))
    try:
        _write(root)
        engine = Engine(root)
        await engine.start(["whole", "stepwise"])
        rng = np.random.default_rng(0)
        warm = rng.integers(1, MAX_STEPS + 1, size=(CLIENTS, 2))
        draws = rng.integers(1, MAX_STEPS + 1, size=(CLIENTS, per_client))
        results: dict[str, dict[str, float]] = {}
        for model in ("whole", "stepwise"):
            await _load(engine, model, warm)
        for model in ("whole", "stepwise", "whole", "stepwise"):  # alternating rounds
            got = await _load(engine, model, draws)
            kept = results.setdefault(model, {k: 0.0 for k in got})
            for key, value in got.items():
                kept[key] += value / 2
        await engine.shutdown()
        return results
    finally:
        shutil.rmtree(root, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=40, help="requests per client")
    args = parser.parse_args()
    results = asyncio.run(measure(args.requests))
    print(f"{CLIENTS} clients, {args.requests} requests each, 1-{MAX_STEPS} steps a request "
          "(2 rounds, alternating; means of the rounds)")
    print("| model | requests/s | steps/s | P50 ms | P99 ms | executions | rows / execution |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for name, r in results.items():
        print(f"| {name} | {r['requests_per_s']:.1f} | {r['steps_per_s']:.0f} | "
              f"{r['p50_ms']:.1f} | {r['p99_ms']:.1f} | {r['executions']:.0f} | "
              f"{r['rows_per_execution']:.2f} |")
    ratio = results["stepwise"]["requests_per_s"] / results["whole"]["requests_per_s"]
    print(f"stepwise / whole requests/s: {ratio:.2f}x")
    RESULTS.mkdir(exist_ok=True)
    out = RESULTS / "iterative_bench.json"
    out.write_text(json.dumps({"machine": platform.platform(), "python": platform.python_version(),
                               "torch": torch.__version__, "date": time.strftime("%Y-%m-%d"),
                               "clients": CLIENTS, "requests_per_client": args.requests,
                               "results": results}, indent=2) + "\n")
    print(f"wrote {out.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
