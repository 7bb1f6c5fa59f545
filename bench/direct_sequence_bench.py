"""A direct sequence batcher's latency for lone requests: one sequence's requests, one at a
time, to a stateful model whose config gives `direct { max_queue_delay_microseconds }` and
no `minimum_slot_utilization` (Triton runs such a batch at once), and the same with a
utilization no lone request reaches (it waits the delay). P50/P99 over --requests, in-process
through the Engine. With --before, another source tree is measured too, in its own process.

    .venv/bin/python bench/direct_sequence_bench.py [--before /tmp/tg-old/src] [--delay-us 5000]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import pathlib
import subprocess
import sys
import tempfile
import time

ROOT = pathlib.Path(__file__).resolve().parent.parent


def _measure(source: str, delay_us: int, requests: int) -> dict[str, list[float]]:
    """Each model's P50 and P99 in ms, served from the tree at `source`."""
    sys.path[:0] = [source, str(ROOT)]
    import torch

    from tensorgate import Engine, InferenceRequest, TensorView
    from tensorgate.pipeline.work import SequenceFlags
    from tests.pipeline import sequence_models as sm

    async def latencies(root: pathlib.Path) -> dict[str, list[float]]:
        engine = Engine(root)
        await engine.start()
        x = TensorView.from_torch(torch.zeros(1, 1), name="INPUT")
        found = {}
        try:
            for model in ("no_utilization", "half_utilization"):
                times = []
                for index in range(requests):
                    flags = SequenceFlags(7, index == 0, index == requests - 1)
                    started = time.perf_counter()
                    await engine.infer(InferenceRequest(model, {"INPUT": x}, sequence=flags))
                    times.append((time.perf_counter() - started) * 1e3)
                times.sort()
                found[model] = [times[len(times) // 2], times[int(len(times) * 0.99) - 1]]
        finally:
            await engine.shutdown()
        return found

    with tempfile.TemporaryDirectory() as folder:
        root = pathlib.Path(folder)
        sm.add_rows(root, "no_utilization", delay_us=delay_us)
        sm.add_rows(root, "half_utilization", delay_us=delay_us, utilization=0.5)
        return asyncio.run(latencies(root))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--before", help="another tree's src folder, measured the same way")
    parser.add_argument("--delay-us", type=int, default=5000)
    parser.add_argument("--requests", type=int, default=200)
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(_measure(args.child, args.delay_us, args.requests)))
        return
    trees = [("this tree", str(ROOT / "src"))]
    if args.before:
        trees.insert(0, ("before", args.before))
    print(f"direct, max_queue_delay {args.delay_us} us, {args.requests} lone requests")
    print(f"{'tree':>10} {'model':>17} {'P50 ms':>7} {'P99 ms':>7}")
    for label, source in trees:
        out = subprocess.run([sys.executable, __file__, "--child", source, "--delay-us",
                              str(args.delay_us), "--requests", str(args.requests)],
                             check=True, capture_output=True, text=True,
                             env=dict(os.environ, PYTHONPATH=source)).stdout
        for model, (p50, p99) in json.loads(out.splitlines()[-1]).items():
            print(f"{label:>10} {model:>17} {p50:>7.2f} {p99:>7.2f}")


if __name__ == "__main__":
    main()
