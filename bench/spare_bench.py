"""A light model beside a heavy one on a CPU: what the heavy model's spare on the loop's core
costs the light model, and gives the heavy one.

One server holds the built-in identity (light: it runs on the loop's core) and resnet50,
either left to its defaults (one instance and a spare on the loop's core) or at
`instance_group [{ count: 1 }]` (no spare). identity is driven at --light-connections and
resnet50 at --heavy-connections at once (wrk, every answer's size checked), for --seconds;
rounds alternate the order. With --before, another source tree is measured too, in turn.
With --light-rate, identity is instead sent at that many requests a second, one at a time on
one keep-alive connection (a light model's steady trickle, which leaves the loop room for the
spare to run): the light model's latency while the spare runs. With --heavy-postprocess topk,
resnet50 answers its top 5 classes as Triton's classification strings, post-processed in the
engine's pool (pipeline/postprocess_pool.py) while the loop is busy.

    git worktree add /tmp/tg-old <commit>
    .venv/bin/python bench/spare_bench.py [--before /tmp/tg-old/src] [--rounds 2]
        [--seconds 8] [--light-connections 8 | --light-rate 100] [--heavy-connections 4]
        [--heavy-postprocess topk]
    (apt-get install wrk)
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
from compare_wire import Connection, check_load, latency_figures, wrk_load  # noqa: E402
from server_bench import OUTPUT_BYTES, binary_request  # noqa: E402

from tensorgate.builtin.repository import write_default_repository  # noqa: E402

SETUPS = {"spare": "", "no spare": "instance_group [ { count: 1 kind: KIND_CPU } ]\n"}
TOP_K = 5
# resnet50's top 5 as "score:index" strings (Triton's classification format), each at least
# "0.000000:0": the least an answer's body holds, binary, with each string's 4-byte length
TOPK_BYTES = TOP_K * (4 + len("0.000000:0"))


def _repository(work: pathlib.Path, extra: str, postprocess: str) -> pathlib.Path:
    built = write_default_repository(pathlib.Path(tempfile.gettempdir())
                                     / "tensorgate-bench-repo")
    root = pathlib.Path(tempfile.mkdtemp(dir=work))
    for name in ("identity", "resnet50"):
        shutil.copytree(built / name, root / name)
    config = root / "resnet50" / "config.pbtxt"
    text = config.read_text()
    if postprocess == "topk":
        scores = 'data_type: TYPE_FP32 dims: [ 1000 ]'
        assert scores in text, "resnet50's built-in config changed: update this bench"
        text = text.replace(scores, f'data_type: TYPE_STRING dims: [ {TOP_K} ]') + (
            'parameters { key: "postprocess" value { string_value: "topk" } }\n'
            f'parameters {{ key: "topk_k" value {{ string_value: "{TOP_K}" }} }}\n')
    config.write_text(text + extra)
    return root


def _measure(src: pathlib.Path, models: pathlib.Path, args: argparse.Namespace,
             work: pathlib.Path) -> dict[str, dict[str, Any]]:
    process, port, _ = serve(src, models)
    found: dict[str, dict[str, Any]] = {}
    try:
        def drive(model: str, connections: int) -> None:
            smallest = (TOPK_BYTES if model == "resnet50" and args.heavy_postprocess
                        else OUTPUT_BYTES[model])
            found[model] = wrk_load(port, binary_request(model, port), connections,
                                    args.seconds, smallest,
                                    pathlib.Path(tempfile.mkdtemp(dir=work)))

        def trickle() -> None:
            time.sleep(1.0)  # resnet50's load (and its spare) under way first
            found["identity"] = paced(port, binary_request("identity", port), args.light_rate,
                                      args.seconds - 2.0)
        light = (threading.Thread(target=trickle) if args.light_rate else
                 threading.Thread(target=drive, args=("identity", args.light_connections)))
        drivers = [light,
                   threading.Thread(target=drive, args=("resnet50", args.heavy_connections))]
        for driver in drivers:
            driver.start()
        for driver in drivers:
            driver.join()
    finally:
        process.terminate()
        process.wait(timeout=30)
    for model, point in found.items():
        check_load(point, f"{src} {model}")
    return found


def paced(port: int, raw: bytes, rate: float, seconds: float) -> dict[str, Any]:
    """`raw` sent `rate` times a second for `seconds`, one at a time on one keep-alive
    connection (after a warm-up), each answer's status and size checked: wrk_load's fields."""
    connection = Connection(port)
    samples: list[int] = []
    bad = 0
    try:
        for _ in range(5):
            connection.exchange(raw)
        start = time.monotonic()
        due = start
        while due < start + seconds:
            sent = time.perf_counter_ns()
            status, _, body = connection.exchange(raw)
            samples.append(time.perf_counter_ns() - sent)
            bad += status != 200 or len(body) < OUTPUT_BYTES["identity"]
            due += 1.0 / rate
            time.sleep(max(0.0, due - time.monotonic()))
    finally:
        connection.close()
    return {"qps": len(samples) / seconds, **latency_figures(np.array(samples) / 1e3),
            "bad": bad, "errors": 0}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_tree_options(parser)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--seconds", type=float, default=8.0)
    parser.add_argument("--light-connections", type=int, default=8)
    parser.add_argument("--light-rate", type=float, default=0.0,
                        help="identity requests a second, paced on one connection "
                             "(instead of --light-connections)")
    parser.add_argument("--heavy-connections", type=int, default=4)
    parser.add_argument("--heavy-postprocess", choices=["topk"], default="",
                        help="resnet50 answers its top 5 classes, post-processed in the pool")
    args = parser.parse_args()
    trees = trees_of(args)
    work = pathlib.Path(tempfile.mkdtemp(prefix="tg-spare-"))
    runs: dict[tuple[str, str], list[dict[str, dict[str, Any]]]] = {}
    try:
        repositories = {setup: _repository(work, extra, args.heavy_postprocess)
                        for setup, extra in SETUPS.items()}
        for round_index in range(args.rounds):
            order = [(tree, setup) for tree in trees for setup in SETUPS]
            for tree, setup in (order if round_index % 2 == 0 else order[::-1]):
                runs.setdefault((tree, setup), []).append(
                    _measure(trees[tree], repositories[setup], args, work))
    finally:
        shutil.rmtree(work, ignore_errors=True)
    light = (f"{args.light_rate:g} requests/s on one connection" if args.light_rate
             else f"{args.light_connections} connections")
    heavy = f"resnet50 (top {TOP_K})" if args.heavy_postprocess else "resnet50"
    print(f"identity at {light} beside {heavy} at {args.heavy_connections}, "
          f"{args.seconds:g} s, medians of {args.rounds} round(s)")
    print(f"{'tree':10} {'resnet50':9} {'identity QPS':>12} {'P50 ms':>7} {'P99 ms':>7} "
          f"{'max ms':>7} {'resnet50 QPS':>12} {'P50 ms':>7} {'P99 ms':>7}")
    for (tree, setup), found in runs.items():
        def median(model: str, key: str, scale: float = 1.0) -> float:
            return statistics.median(r[model][key] for r in found) / scale
        print(f"{tree:10} {setup:9} {median('identity', 'qps'):>12,.0f} "
              f"{median('identity', 'p50_us', 1e3):>7.1f} "
              f"{median('identity', 'p99_us', 1e3):>7.1f} "
              f"{median('identity', 'max_us', 1e3):>7.1f} {median('resnet50', 'qps'):>12.1f} "
              f"{median('resnet50', 'p50_us', 1e3):>7.0f} "
              f"{median('resnet50', 'p99_us', 1e3):>7.0f}")


if __name__ == "__main__":
    main()
