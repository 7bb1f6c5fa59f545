"""The engine against calling the model directly, in one run: identity and resnet50, batch 1.

Prints P50/P99 latency of each and the engine's added overhead (µs), then resnet50 again
while identity requests keep the event loop busy, plus the GC pauses seen. Writes
bench/results/engine_bench.json.

    .venv/bin/python bench/engine_bench.py [--quick] [--device cpu|cuda]

The direct call is the same TorchScript file, loaded, warmed and called on one thread with
the same intra-op thread count and CPUs as the executor: the floor the engine is measured
against. Direct and engine runs alternate in rounds, so the machine's noise hits both. The
engine's own time a request, outside the forward, is also read from its statistics (mean
latency less the mean compute_infer of the same requests), which that noise cannot reach.
"""

from __future__ import annotations

import argparse
import asyncio
import concurrent.futures
import gc
import json
import os
import pathlib
import platform
import queue
import sys
import tempfile
import threading
import time
import warnings
from typing import Any

import numpy as np
import torch

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "src"))

from tensorgate import Engine, InferenceRequest, TensorView  # noqa: E402
from tensorgate.builtin.repository import write_default_repository  # noqa: E402
from tensorgate.pipeline.executor import default_intra_op_threads  # noqa: E402
from tensorgate.pipeline.placement import plan_placement  # noqa: E402

RESULTS = pathlib.Path(__file__).parent / "results"


class GcPauses:
    """Collector pauses, timed with gc.callbacks."""

    def __init__(self) -> None:
        self.pauses_ns: list[int] = []
        self._start = 0

    def __call__(self, phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            self._start = time.perf_counter_ns()
        else:
            self.pauses_ns.append(time.perf_counter_ns() - self._start)

    def summary(self) -> dict[str, float]:
        p = self.pauses_ns
        return {"count": len(p), "max_us": max(p, default=0) / 1e3,
                "total_ms": sum(p) / 1e6}


def percentiles(samples_ns: list[int]) -> dict[str, float]:
    a = np.array(samples_ns) / 1e3
    return {"p50_us": float(np.percentile(a, 50)), "p99_us": float(np.percentile(a, 99)),
            "max_us": float(a.max()), "n": len(samples_ns)}


class DirectModel:
    """The floor: the same TorchScript file loaded, warmed and called on one thread of its own
    (pinned like the engine's executor when a placement is given). `measure(n)` returns
    n per-call latencies, so the floor can be sampled in rounds between engine runs."""

    def __init__(self, path: pathlib.Path, device: str, threads: int,
                 cpus: frozenset[int] | None) -> None:
        self._jobs: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._main, args=(path, device, threads, cpus),
                                        name="bench-direct", daemon=True)
        self._thread.start()

    def _main(self, path: pathlib.Path, device: str, threads: int,
              cpus: frozenset[int] | None) -> None:
        if cpus:
            os.sched_setaffinity(0, cpus)
        torch.set_num_threads(threads)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)
            module = torch.jit.load(str(path), map_location=device)
        x = torch.randn(1, 3, 224, 224)
        with torch.inference_mode():
            for _ in range(5):
                module(x.to(device))
            while True:
                job = self._jobs.get()
                if job is None:
                    return
                n, future = job
                samples = []
                for _ in range(n):
                    start = time.perf_counter_ns()
                    y = module(x.to(device))
                    if device == "cuda":
                        y = y.cpu()
                    samples.append(time.perf_counter_ns() - start)
                future.set_result(samples)

    async def measure(self, n: int) -> list[int]:
        future: concurrent.futures.Future[list[int]] = concurrent.futures.Future()
        self._jobs.put((n, future))
        return await asyncio.wrap_future(future)

    def close(self) -> None:
        self._jobs.put(None)
        self._thread.join()


async def engine_sequential(engine: Engine, model: str, shape: tuple[int, ...],
                            n: int, warm: int = 5) -> list[int]:
    x = torch.randn(shape)
    view = TensorView.from_torch(x, name="INPUT__0")
    for _ in range(warm):
        await engine.infer(InferenceRequest(model, {"INPUT__0": view}))
    samples = []
    for _ in range(n):
        start = time.perf_counter_ns()
        await engine.infer(InferenceRequest(model, {"INPUT__0": view}))
        samples.append(time.perf_counter_ns() - start)
    return samples


STAGES = ("queue", "compute_input", "compute_infer", "compute_output", "success")


def stage_times(engine: Engine, model: str) -> dict[str, int]:
    """The model's time so far (ns) in each stage of its statistics, and its request count
    ("success": a request's whole time in the engine, from its arrival to its answer)."""
    stats = engine.statistics(model)[0]["inference_stats"]
    return {"count": stats["success"]["count"], **{k: stats[k]["ns"] for k in STAGES}}


async def with_background(engine: Engine, n: int, clients: int) -> tuple[list[int], int]:
    """resnet50 sequentially while `clients` identity loops keep the event loop busy."""
    stop = asyncio.Event()
    served = 0
    view = TensorView.from_torch(torch.randn(1, 3, 224, 224), name="INPUT__0")

    async def background() -> None:
        nonlocal served
        while not stop.is_set():
            await engine.infer(InferenceRequest("identity", {"INPUT__0": view}))
            served += 1

    tasks = [asyncio.create_task(background()) for _ in range(clients)]
    await asyncio.sleep(0.2)
    result = await engine_sequential(engine, "resnet50", (1, 3, 224, 224), n)
    stop.set()
    await asyncio.gather(*tasks)
    return result, served


async def concurrent_clients(engine: Engine, model: str, clients: int, per_client: int) -> dict[str, float]:
    """`clients` single-image requesters at once; dynamic batching gathers them."""
    view = TensorView.from_torch(torch.randn(1, 3, 224, 224), name="INPUT__0")
    samples: list[int] = []

    async def client() -> None:
        for _ in range(per_client):
            start = time.perf_counter_ns()
            await engine.infer(InferenceRequest(model, {"INPUT__0": view}))
            samples.append(time.perf_counter_ns() - start)

    await asyncio.gather(*(client() for _ in range(clients)))  # warm the batch sizes
    samples.clear()
    started = time.perf_counter()
    await asyncio.gather(*(client() for _ in range(clients)))
    elapsed = time.perf_counter() - started
    return {**percentiles(samples), "clients": clients, "per_s": len(samples) / elapsed}


async def bench(args: argparse.Namespace) -> dict[str, Any]:
    repo = write_default_repository(pathlib.Path(tempfile.gettempdir()) / "tensorgate-bench-repo")
    threads = default_intra_op_threads()
    n_identity, n_resnet = (300, 40) if args.quick else (2000, 300)
    # Direct and engine alternate, so machine noise hits both: resnet50's P50 drifts by
    # several ms from one minute to the next on these VMs, so it alternates every 20 calls.
    rounds = {"identity": 2, "resnet50": 2} if args.quick else {"identity": 5, "resnet50": 15}
    pauses = GcPauses()
    engine = Engine(repo, device=args.device, placement=args.placement)
    await engine.start(["identity", "resnet50"])
    placement = plan_placement(args.placement)
    compute = placement.compute_cpus if placement else None
    samples: dict[str, dict[str, list[int]]] = {}
    stages_us: dict[str, dict[str, float]] = {}  # the engine path's mean time by stage
    served = 0
    gc.callbacks.append(pauses)
    try:
        for model, n in (("identity", n_identity), ("resnet50", n_resnet)):
            direct = DirectModel(repo / model / "1" / "model.pt", args.device, threads, compute)
            paths: dict[str, list[int]] = {"direct": [], "engine": [], "engine_busy_loop": []}
            spent = dict.fromkeys(("count", *STAGES), 0)  # by the engine path's requests
            for _ in range(rounds[model]):
                paths["direct"] += await direct.measure(n // rounds[model])
                await engine_sequential(engine, model, (1, 3, 224, 224), 0)  # its warm-ups
                before = stage_times(engine, model)
                paths["engine"] += await engine_sequential(engine, model, (1, 3, 224, 224),
                                                           n // rounds[model], warm=0)
                for key, value in stage_times(engine, model).items():
                    spent[key] += value - before[key]
                if model == "resnet50":
                    busy, count = await with_background(engine, n // rounds[model], clients=4)
                    paths["engine_busy_loop"] += busy
                    served += count
            direct.close()
            samples[model] = {k: v for k, v in paths.items() if v}
            stages_us[model] = {k: spent[k] / spent["count"] / 1e3 for k in STAGES}
        per_client = 2 if args.quick else (30 if args.device == "cuda" else 4)
        concurrent_16 = await concurrent_clients(engine, "resnet50", 16, per_client)
    finally:
        gc.callbacks.remove(pauses)
        await engine.shutdown()
    rows: dict[str, Any] = {m: {k: percentiles(v) for k, v in paths.items()}
                            for m, paths in samples.items()}
    for model, stages in stages_us.items():
        rows[model]["engine"]["stages_mean_us"] = stages
        rows[model]["engine"]["mean_us"] = float(np.mean(samples[model]["engine"])) / 1e3
    rows["resnet50"]["background_identity_requests"] = served
    rows["resnet50"]["concurrent_16"] = concurrent_16
    return {"rows": rows, "gc": pauses.summary(), "intra_op_threads": threads,
            "placement": args.placement, "rounds": rounds,
            "device": args.device, "cores": os.cpu_count(), "machine": platform.machine(),
            "python": platform.python_version(), "torch": torch.__version__,
            "date": time.strftime("%Y-%m-%d"),
            "gpu": torch.cuda.get_device_name() if args.device == "cuda" else None}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    parser.add_argument("--placement", default="auto", choices=["auto", "none"],
                        help="CPU placement of the loop and executors (pipeline/placement.py)")
    parser.add_argument("--switch-interval", type=float, default=None,
                        help="sys.setswitchinterval in seconds (CPython's default is 0.005)")
    parser.add_argument("--gc-threshold", type=int, default=None,
                        help="generation-0 GC threshold (CPython's default is 700)")
    args = parser.parse_args()
    if args.switch_interval:
        sys.setswitchinterval(args.switch_interval)
    if args.gc_threshold:
        gc.set_threshold(args.gc_threshold, *gc.get_threshold()[1:])
    result = asyncio.run(bench(args))
    result["switch_interval_s"] = sys.getswitchinterval()
    result["gc_threshold"] = gc.get_threshold()
    rows = result["rows"]
    print(f"engine vs direct call, batch 1, {result['device']}, "
          f"{result['intra_op_threads']} intra-op thread(s), {result['cores']} cores, "
          f"placement {result['placement']}")
    print(f"{'model':<10}{'path':<26}{'P50 µs':>12}{'P99 µs':>12}{'n':>7}")
    for model, r in rows.items():
        for path in ("direct", "engine", "engine_busy_loop"):
            if path in r:
                p = r[path]
                print(f"{model:<10}{path:<26}{p['p50_us']:>12,.1f}{p['p99_us']:>12,.1f}{p['n']:>7}")
    for model, r in rows.items():
        added50 = r["engine"]["p50_us"] - r["direct"]["p50_us"]
        ratio99 = r["engine"]["p99_us"] / r["direct"]["p99_us"]
        print(f"{model}: engine adds {added50:,.1f} µs at P50; P99 ratio {ratio99:.3f}")
    print("the engine's own time a request (means, µs; queue: until its executor starts it; "
          "hand-offs: from the batch's end there until the loop records the answer)")
    print(f"{'model':<10}{'outside the forward':>20}{'queue':>8}{'input':>8}{'output':>8}"
          f"{'hand-offs':>11}{'caller':>8}")
    for model, r in rows.items():
        st = r["engine"]["stages_mean_us"]
        inside = st["queue"] + st["compute_input"] + st["compute_infer"] + st["compute_output"]
        print(f"{model:<10}{r['engine']['mean_us'] - st['compute_infer']:>20,.1f}"
              f"{st['queue']:>8,.1f}{st['compute_input']:>8,.1f}{st['compute_output']:>8,.1f}"
              f"{st['success'] - inside:>11,.1f}{r['engine']['mean_us'] - st['success']:>8,.1f}")
    busy = rows["resnet50"]["engine_busy_loop"]
    print(f"resnet50 with a busy loop: P99 ratio {busy['p99_us'] / rows['resnet50']['direct']['p99_us']:.3f}"
          f" ({rows['resnet50']['background_identity_requests']} identity requests alongside)")
    c = rows["resnet50"]["concurrent_16"]
    print(f"resnet50, 16 concurrent single-image clients: {c['per_s']:,.1f} img/s, "
          f"P50 {c['p50_us'] / 1e3:,.2f} ms, P99 {c['p99_us'] / 1e3:,.2f} ms")
    gcs = result["gc"]
    print(f"switch interval {result['switch_interval_s'] * 1e3:.2f} ms, gc thresholds "
          f"{result['gc_threshold']}")
    print(f"GC during the engine runs: {gcs['count']} collections, max pause "
          f"{gcs['max_us']:.0f} µs, {gcs['total_ms']:.1f} ms in all")
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / f"engine_bench_{result['device']}.json").write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
