"""Does a large V2 JSON request stall everyone else? Small binary requests' latency, alone
and while one client sends large JSON bodies back to back, for one or two source trees.

The event loop decodes every request; a JSON body of a few MB takes it tens of ms to parse
into arrays and to write its answer. Each round starts each server in turn (alternating the
order): tensorgate from each source tree, and peers installed by bench/peers/install.sh
(`--peers triton`: its Python-backend identity, as bench/compare.py serves it). In it, wrk
drives `identity` [1,3,224,224] with the binary extension at one connection (the "small"
client), first alone, then beside a second wrk at one connection sending `identity`
[batch,3,224,224] as V2 JSON. Every answer's size is checked.

`--hostile MB` makes the second client's body one a careless or hostile client could send:
`identity` [1,3,224,224] as V2 JSON and beside it a key holding `{}` after `{}` up to MB
megabytes, each a Python object to a parser that makes them all. Any answer counts (a server
may refuse it or serve the input); the server's peak RSS is reported.

    .venv/bin/python bench/json_stall_bench.py [--before /tmp/tg-old/src] [--peers triton]
        [--nested] [--hostile 57]
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
from typing import Any

import numpy as np

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "src"))
sys.path.insert(0, str(HERE))

from ab_bench import add_tree_options, serve, trees_of  # noqa: E402
from compare import start  # noqa: E402
from compare_servers import servers  # noqa: E402
from compare_wire import (OIP_BINARY, OIP_JSON, OIP_NESTED_JSON, check_load,  # noqa: E402
                          raw_request, wrk_load)
from tensorgate.builtin.repository import write_default_repository  # noqa: E402
from tensorgate.pipeline.executor import default_intra_op_threads  # noqa: E402

_PATH = "/v2/models/{model}/infer"


def _hostile_body(x: np.ndarray, megabytes: int) -> tuple[str, dict[str, str], bytes]:
    path, headers, body = OIP_JSON.build(_PATH, "identity", x)
    junk = b'{}' + b',{}' * ((megabytes * 1_000_000 - len(body)) // 3)
    return path, headers, body[:-1] + b',"junk":[' + junk + b']}'


def peak_rss_mb(pid: int) -> float:
    """A process's peak resident memory so far (VmHWM), MB."""
    for line in pathlib.Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def measure(target: pathlib.Path | str, work: pathlib.Path, seconds: float,
            batch: int, nested: bool = False, hostile_mb: int = 0) -> dict[str, Any]:
    """The small client's figures alone and beside the JSON client, and the JSON client's;
    `target` a tensorgate source tree or a peer's name."""
    rng = np.random.default_rng(0)
    small_x = rng.standard_normal((1, 3, 224, 224)).astype(np.float32)
    large_x = rng.standard_normal((batch, 3, 224, 224)).astype(np.float32)
    pid = None  # tensorgate's, whose peak RSS is read
    if isinstance(target, str):
        running, _ = start(servers()[target], work, small_x)
        port, stop = running.ports.http, running.stop
    else:
        process, port, _ = serve(target, work / "models")
        pid = process.pid

        def stop() -> None:
            process.terminate()
            process.wait(timeout=30)
    try:
        small = raw_request(port, *OIP_BINARY.build(_PATH, "identity", small_x))
        wire = OIP_NESTED_JSON if nested else OIP_JSON
        if hostile_mb:
            large = raw_request(port, *_hostile_body(small_x, hostile_mb))
            smallest, status = 0, 0
        else:
            large = raw_request(port, *wire.build(_PATH, "identity", large_x))
            smallest, status = OIP_JSON.min_body(large_x.size), 200
        (work / "small").mkdir(exist_ok=True)
        (work / "large").mkdir(exist_ok=True)
        wrk_load(port, small, 1, 1, OIP_BINARY.min_body(small_x.size), work / "small")
        wrk_load(port, large, 1, 1, smallest, work / "large", status)
        alone = wrk_load(port, small, 1, seconds, OIP_BINARY.min_body(small_x.size),
                         work / "small")
        beside: dict[str, Any] = {}

        def json_client() -> None:
            beside.update(wrk_load(port, large, 1, seconds + 2, smallest, work / "large",
                                   status))
        thread = threading.Thread(target=json_client)
        thread.start()
        mixed = wrk_load(port, small, 1, seconds, OIP_BINARY.min_body(small_x.size),
                         work / "small")
        thread.join()
        peak = peak_rss_mb(pid) if pid is not None else float("nan")
    finally:
        stop()
    for name, point in (("small alone", alone), ("small beside JSON", mixed),
                        ("JSON", beside)):
        check_load(point, f"{target}, {name}")
    return {"alone": alone, "mixed": mixed, "json": beside, "json_bytes": len(large),
            "peak_rss_mb": peak}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_tree_options(parser)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--seconds", type=float, default=8.0)
    parser.add_argument("--batch", type=int, default=4, help="rows of the JSON request")
    parser.add_argument("--nested", action="store_true",
                        help="the JSON request's data nested in its shape (x.tolist())")
    parser.add_argument("--hostile", type=int, default=0, metavar="MB",
                        help="the JSON request: identity beside MB megabytes of {} (see above)")
    parser.add_argument("--peers", default="", help="peers to measure too, comma-separated "
                                                    "(triton, mlserver)")
    args = parser.parse_args()
    if shutil.which("wrk") is None:
        parser.error("wrk is not installed (apt-get install wrk)")
    trees: dict[str, pathlib.Path | str] = {**trees_of(args)}
    work = pathlib.Path(tempfile.mkdtemp(prefix="tg-stall-"))
    write_default_repository(work / "models")
    for name in filter(None, args.peers.split(",")):
        peer = servers()[name]
        if (why := peer.installed()) is not None:
            parser.error(f"{name}: {why}")
        peer.prepare(peer, work, default_intra_op_threads())
        trees[name] = name
    runs: dict[str, list[dict[str, Any]]] = {tree: [] for tree in trees}
    try:
        for r in range(args.rounds):
            for tree in list(trees) if r % 2 == 0 else list(trees)[::-1]:
                found = measure(trees[tree], work, args.seconds, args.batch, args.nested,
                                args.hostile)
                runs[tree].append(found)
                print(f"round {r + 1} {tree}: small P99 alone {found['alone']['p99_us']:,} µs, "
                      f"beside JSON {found['mixed']['p99_us']:,} µs (max "
                      f"{found['mixed']['max_us']:,}); JSON {found['json']['qps']:.1f} QPS; "
                      f"peak RSS {found['peak_rss_mb']:,.0f} MB",
                      flush=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    size = runs[next(iter(trees))][0]["json_bytes"] / 1e6
    sent = (f"[1,3,224,224] and {args.hostile} MB of {{}}" if args.hostile else
            f"[{args.batch},3,224,224]")
    print(f"\nidentity [1,3,224,224] binary at 1 connection, alone and beside one connection "
          f"sending {sent} as V2 JSON{' nested' if args.nested else ''} "
          f"({size:.1f} MB a request); medians of "
          f"{args.rounds} rounds\n")
    print("| server | small P50 / P99 / max µs, alone | small P50 / P99 / max µs, beside JSON "
          "| JSON QPS | JSON P50 ms | peak RSS MB |\n|---|---:|---:|---:|---:|---:|")
    for tree, found in runs.items():
        def median(load: str, key: str) -> float:
            return statistics.median(f[load][key] for f in found)
        print(f"| {tree} | {median('alone', 'p50_us'):,.0f} / {median('alone', 'p99_us'):,.0f} "
              f"/ {median('alone', 'max_us'):,.0f} | {median('mixed', 'p50_us'):,.0f} / "
              f"{median('mixed', 'p99_us'):,.0f} / {median('mixed', 'max_us'):,.0f} "
              f"| {median('json', 'qps'):.1f} | {median('json', 'p50_us') / 1000:.1f} "
              f"| {statistics.median(f['peak_rss_mb'] for f in found):,.0f} |")


if __name__ == "__main__":
    main()
