"""Instances of a CPU TorchScript model: memory, start-up and throughput as the count grows.

The built-in resnet50 (102 MB of FP32 weights) alone in a repository, served with
`instance_group [{ count: N kind: KIND_CPU }]` for each N of --counts (0: none, the
server's own choice: one instance and, heavy on a CPU, a spare): the server's start-up
(launch to ready), its RSS and PSS after load and again after N connections (or
--connections) drove it for --seconds (wrk where installed, else the socket client; every
answer's size checked), and
the QPS they got. With --before, a second source tree is measured too, in turn (rounds
alternate which goes first), with after/before ratios. Writes
bench/results/instances_bench.json.

    git worktree add /tmp/tg-old <commit>
    .venv/bin/python bench/instances_bench.py [--before /tmp/tg-old/src] [--counts 1,2,4]
        [--seconds 6] [--rounds 1] [--connections N]
"""

from __future__ import annotations

import argparse
import json
import pathlib
import platform
import shutil
import statistics
import sys
import tempfile
import time

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "src"))
sys.path.insert(0, str(HERE))

from ab_bench import add_tree_options, serve, trees_of  # noqa: E402
from compare import memory_tree  # noqa: E402
from compare_wire import socket_load, wrk_load  # noqa: E402
from server_bench import OUTPUT_BYTES, binary_request  # noqa: E402

from tensorgate.builtin.repository import write_default_repository  # noqa: E402


def _repository(work: pathlib.Path, count: int) -> pathlib.Path:
    """resnet50 alone, at `count` CPU instances (0: no instance_group, the server's choice)."""
    built = write_default_repository(pathlib.Path(tempfile.gettempdir())
                                     / "tensorgate-bench-repo")
    root = work / f"x{count}"
    shutil.copytree(built / "resnet50", root / "resnet50")
    if count:
        config = root / "resnet50" / "config.pbtxt"
        config.write_text(config.read_text()
                          + f"instance_group [ {{ count: {count} kind: KIND_CPU }} ]\n")
    return root


def _measure(src: pathlib.Path, models: pathlib.Path, count: int, seconds: float,
             work: pathlib.Path, connections: int) -> dict[str, float]:
    started = time.perf_counter()
    process, port, _ = serve(src, models)
    startup = time.perf_counter() - started
    try:
        loaded = memory_tree(process.pid)
        raw = binary_request("resnet50", port)
        if shutil.which("wrk"):
            point = wrk_load(port, raw, connections, seconds, OUTPUT_BYTES["resnet50"], work)
        else:
            point = socket_load(port, raw, connections, seconds, OUTPUT_BYTES["resnet50"])
        if point["bad"] or point["errors"]:
            raise RuntimeError(f"{src}, {count} instances: {point['bad']} bad answers, "
                               f"{point['errors']} errors")
        served = memory_tree(process.pid)
    finally:
        process.terminate()
        process.wait(timeout=30)
    return {"startup_s": startup, "rss_loaded_mb": loaded["rss_mb"],
            "pss_loaded_mb": loaded["pss_mb"], "rss_served_mb": served["rss_mb"],
            "qps": point["qps"], "p99_ms": point["p99_us"] / 1e3}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_tree_options(parser)
    parser.add_argument("--counts", default="1,2,4")
    parser.add_argument("--seconds", type=float, default=6.0)
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--connections", type=int, default=0,
                        help="connections driving each server (default: N, its instances)")
    parser.add_argument("--json", type=pathlib.Path,
                        default=HERE / "results" / "instances_bench.json")
    args = parser.parse_args()
    trees = trees_of(args)
    counts = [int(c) for c in args.counts.split(",")]
    work = pathlib.Path(tempfile.mkdtemp(prefix="tg-instances-"))
    found: dict[str, dict[int, list[dict[str, float]]]] = {name: {} for name in trees}
    try:
        repositories = {count: _repository(work, count) for count in counts}
        for round_index in range(args.rounds):
            order = list(trees.items())
            if round_index % 2:
                order.reverse()
            for count in counts:
                for name, src in order:
                    found[name].setdefault(count, []).append(
                        _measure(src, repositories[count], count, args.seconds, work,
                                 args.connections or max(count, 1)))
    finally:
        shutil.rmtree(work, ignore_errors=True)
    keys = ("startup_s", "rss_loaded_mb", "pss_loaded_mb", "rss_served_mb", "qps", "p99_ms")
    medians = {name: {count: {key: statistics.median(r[key] for r in runs) for key in keys}
                      for count, runs in by_count.items()} for name, by_count in found.items()}
    print(f"resnet50 (TorchScript) at N CPU instances, "
          f"{args.connections or 'N'} connections, {args.seconds:g} s, "
          f"medians of {args.rounds} round(s); {platform.node()}")
    print(f"{'tree':10} {'N':>2} {'start-up s':>10} {'RSS loaded MB':>13} {'PSS loaded MB':>13} "
          f"{'RSS served MB':>13} {'QPS':>7} {'P99 ms':>8}")
    for name, by_count in medians.items():
        for count, m in by_count.items():
            print(f"{name:10} {count:>2} {m['startup_s']:>10.2f} {m['rss_loaded_mb']:>13,.0f} "
                  f"{m['pss_loaded_mb']:>13,.0f} {m['rss_served_mb']:>13,.0f} "
                  f"{m['qps']:>7.1f} {m['p99_ms']:>8.1f}")
    if "before" in medians:
        print("after / before:")
        for count in counts:
            a, b = medians["after"][count], medians["before"][count]
            print(f"  N={count}: " + ", ".join(f"{key} {a[key] / b[key]:.2f}" for key in keys))
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps({"date": time.strftime("%Y-%m-%d %H:%M"),
                                     "machine": platform.platform(), "seconds": args.seconds,
                                     "rounds": args.rounds, "medians": medians,
                                     "runs": found}, indent=1) + "\n")


if __name__ == "__main__":
    main()
