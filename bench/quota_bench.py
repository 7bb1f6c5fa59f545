"""tensorgate inside a CPU quota, as a container with a CPU limit runs it: the server alone in
a cgroup whose quota is `--cpus` CPUs, the load from outside it.

Needs root and a writable cgroup hierarchy (v2 at /sys/fs/cgroup, or v1's cpu controller
at /sys/fs/cgroup/cpu): it makes the cgroup `tensorgate-quota-bench`, puts each server in it
as it starts, and removes it at the end. Per source tree (alternating the order over the
rounds), the built-in repository: sequential identity and resnet50 (P50/P99 over one
keep-alive connection), then identity and resnet50 with wrk at 4 and 16 connections
(QPS, P99); and the cgroup's throttled periods while the server ran. Every answer's size is
checked.

    .venv/bin/python bench/quota_bench.py --before /tmp/tg-old/src [--cpus 1.0] [--rounds 2]
"""

from __future__ import annotations

import argparse
import os
import pathlib
import shutil
import statistics
import sys
import tempfile
import time
from typing import Any

import numpy as np

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "src"))
sys.path.insert(0, str(HERE))

from ab_bench import add_tree_options, serve, trees_of  # noqa: E402
from compare_wire import (OIP_BINARY, Connection, check_load, latency_figures,  # noqa: E402
                          raw_request, wrk_load)
from tensorgate.builtin.repository import write_default_repository  # noqa: E402

_NAME = "tensorgate-quota-bench"
_SHAPES = {"identity": (1, 3, 224, 224), "resnet50": (1, 3, 224, 224)}
_OUTPUT = {"identity": 3 * 224 * 224, "resnet50": 1000}


class Quota:
    """A cgroup with a CPU quota that processes are moved into; v2 where mounted, else v1."""

    def __init__(self, cpus: float, period_us: int = 100_000) -> None:
        v2 = pathlib.Path("/sys/fs/cgroup")
        if (v2 / "cgroup.controllers").exists():
            self.folder = v2 / _NAME
            self.folder.mkdir(exist_ok=True)
            (self.folder / "cpu.max").write_text(f"{int(cpus * period_us)} {period_us}")
            self._stat, self._procs = "cpu.stat", "cgroup.procs"
        else:
            self.folder = pathlib.Path("/sys/fs/cgroup/cpu") / _NAME
            self.folder.mkdir(exist_ok=True)
            (self.folder / "cpu.cfs_period_us").write_text(str(period_us))
            (self.folder / "cpu.cfs_quota_us").write_text(str(int(cpus * period_us)))
            self._stat, self._procs = "cpu.stat", "tasks"

    def enter_command(self, command: list[str]) -> list[str]:
        """`command` run from a shell that first moves itself into the cgroup."""
        return ["sh", "-c", f'echo $$ > {self.folder / self._procs} && exec "$@"', "sh",
                *command]

    def throttled(self) -> tuple[int, int]:
        """(periods, periods throttled) so far."""
        stat = dict(line.split() for line in (self.folder / self._stat).read_text().splitlines())
        return int(stat["nr_periods"]), int(stat["nr_throttled"])

    def remove(self) -> None:
        for _ in range(50):  # empty once its last process has gone
            try:
                self.folder.rmdir()
                return
            except OSError:
                time.sleep(0.1)


def measure(src: pathlib.Path, models: pathlib.Path, quota: Quota, work: pathlib.Path,
            seconds: float) -> dict[str, Any]:
    process, port, _ = serve(src, models, wrap=quota.enter_command)
    before = quota.throttled()
    found: dict[str, Any] = {}
    try:
        x = np.random.default_rng(0).standard_normal(_SHAPES["identity"]).astype(np.float32)
        for model, count in (("identity", 2000), ("resnet50", 150)):
            path, headers, body = OIP_BINARY.build("/v2/models/{model}/infer", model, x)
            raw = raw_request(port, path, headers, body)
            smallest = OIP_BINARY.min_body(_OUTPUT[model])
            connection = Connection(port)
            samples = []
            for n in range(count + count // 10):
                began = time.perf_counter_ns()
                status, _, answer = connection.exchange(raw)
                took = time.perf_counter_ns() - began
                if status != 200 or len(answer) < smallest:
                    raise RuntimeError(f"{model}: answer {status}, {len(answer)} bytes")
                if n >= count // 10:  # the first tenth warms
                    samples.append(took // 1000)
            connection.close()
            found[f"{model} sequential"] = latency_figures(np.array(samples))
            for connections in (4, 16):
                wrk_load(port, raw, connections, 1.0, smallest, work)  # its warm-up
                point = wrk_load(port, raw, connections, seconds, smallest, work)
                check_load(point, f"{model} at {connections}")
                found[f"{model} {connections}"] = point
    finally:
        process.terminate()
        process.wait(timeout=60)
    after = quota.throttled()
    found["throttled"] = (after[1] - before[1]) / max(1, after[0] - before[0])
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_tree_options(parser)
    parser.add_argument("--cpus", type=float, default=1.0, help="the cgroup's CPU quota")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--seconds", type=float, default=4.0, help="per wrk point")
    args = parser.parse_args()
    trees = trees_of(args)
    work = pathlib.Path(tempfile.mkdtemp(prefix="tg-quota-"))
    quota = Quota(args.cpus)
    runs: dict[str, list[dict[str, Any]]] = {name: [] for name in trees}
    try:
        models = write_default_repository(work / "models")
        for r in range(args.rounds):
            order = list(trees.items()) if r % 2 == 0 else list(trees.items())[::-1]
            for name, src in order:
                runs[name].append(measure(src, models, quota, work, args.seconds))
                print(f"round {r + 1}, {name} done", flush=True)
    finally:
        quota.remove()
        shutil.rmtree(work, ignore_errors=True)
    print(f"\nthe server in a cgroup of {args.cpus:g} CPU(s) on {os.cpu_count()} cores, the "
          f"load from outside it; medians of {args.rounds} rounds\n")
    print("| tree | identity P50 / P99 µs | resnet50 P50 / P99 ms | identity 4 / 16 conns "
          "QPS (P99 ms) | resnet50 4 / 16 conns QPS (P99 ms) | periods throttled |")
    print("|---|---:|---:|---:|---:|---:|")
    for name, found in runs.items():
        def med(key: str, field: str) -> float:
            return statistics.median(run[key][field] for run in found)
        print(f"| {name} | {med('identity sequential', 'p50_us'):,.0f} / "
              f"{med('identity sequential', 'p99_us'):,.0f} | "
              f"{med('resnet50 sequential', 'p50_us') / 1e3:,.1f} / "
              f"{med('resnet50 sequential', 'p99_us') / 1e3:,.1f} | "
              + " / ".join(f"{med(f'identity {c}', 'qps'):,.0f} "
                           f"({med(f'identity {c}', 'p99_us') / 1e3:,.1f})" for c in (4, 16))
              + " | "
              + " / ".join(f"{med(f'resnet50 {c}', 'qps'):,.1f} "
                           f"({med(f'resnet50 {c}', 'p99_us') / 1e3:,.0f})" for c in (4, 16))
              + f" | {statistics.median(run['throttled'] for run in found):.0%} |")


if __name__ == "__main__":
    main()
