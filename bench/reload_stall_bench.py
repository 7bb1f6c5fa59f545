"""Does reloading a real network stall the other models' clients? Small binary requests'
latency alone and beside a client that reloads a built-in model back to back.

A reload reads the model's file, builds the module, warms it up and decides whether its
instances may share one copy; every step that holds the GIL holds the event loop, which
every other client's request needs. For each source tree in turn (alternating the order
over the rounds), the server starts on the built-in repository (explicit model control,
every model loaded), a lean socket client sends `identity` [1,3,224,224] with the binary
extension back to back on one connection, alone, then beside a client that POSTs
/v2/repository/models/MODEL/load for each of `--models` back to back. Every answer is checked.

What a stall costs shows in the slowest requests, counted here from every request's own
time: how many took over 20 ms and over 50 ms for each reload, and the longest. (wrk is not
used: it corrects its percentiles for coordinated omission, adding a request every mean
interval across each stall, so its P99 follows the longest stall rather than how many there
were.) The server's RSS is read after each phase: what the reloads left it holding.

    .venv/bin/python bench/reload_stall_bench.py [--before /tmp/tg-old/src] [--models resnet50]
"""

from __future__ import annotations

import argparse
import pathlib
import shutil
import statistics
import sys
import tempfile
import threading
import time
from typing import Any

import numpy as np

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "src"))
sys.path.insert(0, str(HERE))

from ab_bench import add_tree_options, serve, trees_of  # noqa: E402
from compare import memory_tree  # noqa: E402
from compare_wire import OIP_BINARY, Connection, raw_request  # noqa: E402
from tensorgate.builtin.repository import write_default_repository  # noqa: E402
from upload_stall_bench import loads_back_to_back  # noqa: E402

_PATH = "/v2/models/{model}/infer"


def requests_for(port: int, raw: bytes, smallest: int, seconds: float) -> np.ndarray:
    """Send `raw` back to back on one connection for `seconds`; each request's ms. Raises on
    an answer that is not 200 with a whole body."""
    connection = Connection(port)
    took = []
    try:
        end = time.perf_counter() + seconds
        while (began := time.perf_counter()) < end:
            status, _, body = connection.exchange(raw)
            took.append(time.perf_counter() - began)
            if status != 200 or len(body) < smallest:
                raise RuntimeError(f"identity answered {status} with {len(body)} bytes")
    finally:
        connection.close()
    return np.array(took) * 1e3


def figures(ms: np.ndarray, reloads: int) -> dict[str, float]:
    per = max(reloads, 1)
    return {"requests": ms.size, "p50_ms": float(np.percentile(ms, 50)),
            "max_ms": float(ms.max()), "over_20": float((ms > 20).sum()) / per,
            "over_50": float((ms > 50).sum()) / per, "reloads": reloads}


def measure(src: pathlib.Path, work: pathlib.Path, seconds: float, models: list[str]
            ) -> dict[str, Any]:
    """identity's figures alone and beside each model's reloads; each reload's seconds."""
    x = np.random.default_rng(0).standard_normal((1, 3, 224, 224)).astype(np.float32)
    process, port, _ = serve(src, work / "models", "--model-control-mode", "explicit",
                             "--load-model", "*")
    try:
        small = raw_request(port, *OIP_BINARY.build(_PATH, "identity", x))
        smallest = OIP_BINARY.min_body(x.size)
        requests_for(port, small, smallest, 1.0)  # warm-up
        found: dict[str, Any] = {"alone": figures(requests_for(port, small, smallest,
                                                               seconds), 0)}
        found["alone"]["rss_mb"] = memory_tree(process.pid)["rss_mb"]
        for model in models:
            stop, times = threading.Event(), []
            loader = threading.Thread(target=loads_back_to_back,
                                      args=(port, model, b"", stop, times))
            loader.start()
            try:
                ms = requests_for(port, small, smallest, seconds)
            finally:
                stop.set()
                loader.join()
            if not times:
                raise RuntimeError(f"no reload of {model} finished in {seconds} s")
            found[model] = figures(ms, len(times))
            found[model]["rss_mb"] = memory_tree(process.pid)["rss_mb"]
            found[model + "_s"] = statistics.median(times)
    finally:
        process.terminate()
        process.wait(timeout=60)
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_tree_options(parser)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--models", nargs="+", default=["resnet50"],
                        choices=["resnet50", "detector", "identity"])
    args = parser.parse_args()
    trees = trees_of(args)
    work = pathlib.Path(tempfile.mkdtemp(prefix="tg-reload-"))
    write_default_repository(work / "models")
    runs: dict[str, list[dict[str, Any]]] = {tree: [] for tree in trees}
    try:
        for r in range(args.rounds):
            for tree in list(trees) if r % 2 == 0 else list(trees)[::-1]:
                found = measure(trees[tree], work, args.seconds, args.models)
                runs[tree].append(found)
                print(f"round {r + 1} {tree}: alone max {found['alone']['max_ms']:.1f} ms; "
                      + "; ".join(f"beside {found[m]['reloads']} {m} reloads: max "
                                  f"{found[m]['max_ms']:.1f} ms, over 20 / 50 ms a reload "
                                  f"{found[m]['over_20']:.1f} / {found[m]['over_50']:.1f}"
                                  for m in args.models), flush=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print(f"\nidentity [1,3,224,224] binary, back to back on 1 connection, alone and beside "
          f"back-to-back reloads of each built-in model; medians of {args.rounds} rounds "
          f"(requests over 20 and 50 ms counted per reload; RSS after each phase)\n")
    print("| server | load | requests | P50 ms | max ms | over 20 ms a reload | over 50 ms a "
          "reload | reload s | RSS after, MB |\n|---|---|---:|---:|---:|---:|---:|---:|---:|")
    for tree, found in runs.items():
        for load in ("alone", *args.models):
            def median(key: str) -> float:
                return statistics.median(f[load][key] for f in found)
            reload_s = (f"{statistics.median(f[load + '_s'] for f in found):.2f}"
                        if load != "alone" else "")
            over = (f"{median('over_20'):.1f} | {median('over_50'):.1f}" if load != "alone"
                    else f"{median('over_20'):.0f} in all | {median('over_50'):.0f} in all")
            print(f"| {tree} | {load} | {median('requests'):,.0f} | {median('p50_ms'):.2f} | "
                  f"{median('max_ms'):.1f} | {over} | {reload_s} | {median('rss_mb'):,.0f} |")


if __name__ == "__main__":
    main()
