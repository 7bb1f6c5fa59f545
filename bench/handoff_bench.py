"""A batch's hand-off from the event loop to an executor thread and back, alone: the old way
(queue.SimpleQueue to the thread, loop.call_soon_threadsafe back) against pipeline/handoff.py's
(ThreadInbox and LoopMailbox, each woken by a write that lets the GIL go).

Each round trip: the loop puts a future, the thread takes it, runs a little Python (a sum of
50 numbers) and hands the future's result back; the loop awaits it. Both threads on one core
(where placement `auto` puts a light model's executor) and on two; uvloop, as the server
runs. Context switches are all the process's threads', from /proc (voluntary and not), a
round trip. Each point in a process of its own, the ways alternating, --rounds times.

    .venv/bin/python bench/handoff_bench.py [--trips 5000] [--rounds 3]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import pathlib
import queue
import statistics
import subprocess
import sys
import threading
import time

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "src"))

from tensorgate.pipeline.handoff import LoopMailbox, ThreadInbox  # noqa: E402

RESULTS = HERE / "results"
WAYS = ("old", "new")


def _switches() -> int:
    """Every thread's switches: /proc/self/status counts the calling thread's only."""
    total = 0
    for task in pathlib.Path("/proc/self/task").iterdir():
        text = (task / "status").read_text()
        total += sum(int(line.split()[1]) for line in text.splitlines() if line.startswith(
            ("voluntary_ctxt_switches", "nonvoluntary_ctxt_switches")))
    return total


def one_point(way: str, cpus: set[int], trips: int) -> dict[str, float]:
    """`trips` round trips the `way` way, both threads on `cpus`: latency quantiles (µs)
    and context switches a trip."""
    import uvloop

    os.sched_setaffinity(0, cpus)
    result: dict[str, float] = {}

    async def main() -> None:
        loop = asyncio.get_running_loop()
        if way == "old":
            inbox: queue.SimpleQueue[object] | ThreadInbox = queue.SimpleQueue()

            def back(future: asyncio.Future[int], value: int) -> None:
                loop.call_soon_threadsafe(future.set_result, value)
        else:
            inbox = ThreadInbox()
            mailbox = LoopMailbox.for_loop(loop)

            def back(future: asyncio.Future[int], value: int) -> None:
                mailbox.post(future.set_result, value)

        def work() -> None:
            os.sched_setaffinity(0, {max(cpus)})  # (one core: the same; two: the other)
            while True:
                future = inbox.get()
                if future is None:
                    return
                back(future, sum(range(50)))  # type: ignore[arg-type]

        os.sched_setaffinity(0, {min(cpus)})
        thread = threading.Thread(target=work, daemon=True)
        thread.start()
        for _ in range(200):  # warm
            future = loop.create_future()
            inbox.put(future)
            await future
        times = []
        switched = _switches()
        for _ in range(trips):
            started = time.perf_counter_ns()
            future = loop.create_future()
            inbox.put(future)
            await future
            times.append(time.perf_counter_ns() - started)
        switched = _switches() - switched
        inbox.put(None)
        thread.join()
        times.sort()
        result.update({f"p{q}_us": times[len(times) * q // 100] / 1000 for q in (50, 90, 99)})
        result["switches"] = switched / trips

    uvloop.run(main())
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--trips", type=int, default=5000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--point", help=argparse.SUPPRESS)  # way:cpus, in a child
    args = parser.parse_args()
    if args.point:
        way, cpus = args.point.split(":")
        print(json.dumps(one_point(way, {int(c) for c in cpus.split(",")}, args.trips)))
        return
    layouts = {"one core": "0"}
    if len(os.sched_getaffinity(0)) > 1:
        layouts["two cores"] = "0,1"
    points: dict[tuple[str, str], list[dict[str, float]]] = {}
    for r in range(args.rounds):
        for layout, cpus in layouts.items():
            for way in WAYS if r % 2 == 0 else WAYS[::-1]:
                out = subprocess.run([sys.executable, __file__, "--point", f"{way}:{cpus}",
                                      "--trips", str(args.trips)], check=True,
                                     capture_output=True, text=True).stdout
                points.setdefault((layout, way), []).append(json.loads(out))
    print(f"loop -> thread -> loop, {args.trips:,} round trips a point, {args.rounds} rounds "
          f"(medians), uvloop, {os.cpu_count()} cores\n")
    print("| threads on | way | P50 µs | P90 µs | P99 µs | context switches a trip |")
    print("|---|---|---:|---:|---:|---:|")
    table = {}
    for (layout, way), runs in points.items():
        row = {key: statistics.median(run[key] for run in runs) for key in runs[0]}
        table[f"{layout}, {way}"] = row
        print(f"| {layout} | {way} | {row['p50_us']:.1f} | {row['p90_us']:.1f} | "
              f"{row['p99_us']:.1f} | {row['switches']:.2f} |")
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "handoff_bench.json").write_text(json.dumps(
        {"date": time.strftime("%Y-%m-%d %H:%M"), "trips": args.trips, "points": table},
        indent=1))


if __name__ == "__main__":
    main()
