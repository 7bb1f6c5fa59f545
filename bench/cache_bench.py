"""What the response cache gives and costs, in-process: the built-in resnet50 and identity
(602 KB in and out), each served without and with `response_cache { enable: true }`.
Batch 1, one request at a time: P50/P99 of a hit (the same request again), of a miss (a new
input each time: hashing it, running the model, copying the answer in) and of the model
uncached. Writes bench/results/cache_bench.json.

    .venv/bin/python bench/cache_bench.py [--requests 1000]
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
from tensorgate.builtin.repository import default_repository  # noqa: E402

RESULTS = pathlib.Path(__file__).parent / "results"


def _repository(root: pathlib.Path) -> pathlib.Path:
    source = default_repository()
    for name in ("identity", "resnet50"):
        shutil.copytree(source / name, root / name)
        cached = root / f"{name}_cached"
        shutil.copytree(source / name, cached)
        config = (cached / "config.pbtxt").read_text().replace(f'"{name}"', f'"{name}_cached"')
        (cached / "config.pbtxt").write_text(config + "response_cache { enable: true }\n")
    return root


def _request(model: str, seed: int) -> InferenceRequest:
    generator = torch.Generator().manual_seed(seed)
    tensor = torch.rand((1, 3, 224, 224), generator=generator)
    return InferenceRequest(model, {"INPUT__0": TensorView.from_torch(tensor, name="INPUT__0")})


async def _latencies(engine: Engine, model: str, count: int, fresh: bool) -> list[float]:
    """µs per request; `fresh`: a new input each time (requests made before timing)."""
    requests = [_request(model, i if fresh else 0) for i in range(count)]
    out = []
    for request in requests:
        started = time.perf_counter_ns()
        await engine.infer(request)
        out.append((time.perf_counter_ns() - started) / 1e3)
    return out


async def _measure(requests: int) -> dict[str, dict[str, float]]:
    with tempfile.TemporaryDirectory() as folder:
        engine = Engine(_repository(pathlib.Path(folder)), response_cache_bytes=256 << 20)
        await engine.start()
        rows: dict[str, dict[str, float]] = {}
        for name, count in (("identity", requests), ("resnet50", max(requests // 10, 50))):
            await _latencies(engine, name, 20, fresh=False)  # warm
            cases = {"uncached": (name, False), "cached, miss": (f"{name}_cached", True),
                     "cached, hit": (f"{name}_cached", False)}
            for case, (model, fresh) in cases.items():
                values = np.array(await _latencies(engine, model, count, fresh))
                rows[f"{name} {case}"] = {"p50_us": float(np.percentile(values, 50)),
                                          "p99_us": float(np.percentile(values, 99)),
                                          "requests": count}
        await engine.shutdown()
        return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=1000)
    args = parser.parse_args()
    torch.manual_seed(0)
    rows = asyncio.run(_measure(args.requests))
    print(f"{'case':28} {'P50 µs':>10} {'P99 µs':>10} {'requests':>9}")
    for case, row in rows.items():
        print(f"{case:28} {row['p50_us']:10.1f} {row['p99_us']:10.1f} {row['requests']:9d}")
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "cache_bench.json").write_text(json.dumps(
        {"machine": platform.machine(), "python": platform.python_version(),
         "torch": torch.__version__, "date": time.strftime("%Y-%m-%d"), "rows": rows},
        indent=2))


if __name__ == "__main__":
    main()
