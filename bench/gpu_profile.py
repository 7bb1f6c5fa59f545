"""Where a tensorgate server's time goes: py-spy samples of the server (every thread, idle
included) while a socket client loads identity and resnet50 over HTTP at 1 and 16
connections, with the server's own per-batch statistics for each run.

    python3 bench/gpu_profile.py --out DIR [--seconds 5] [--py-spy PATH]
                                 [--baseline-src OLD/src] [--instances 2] [--rounds 2]
    python3 bench/gpu_profile.py --summarize DIR/this-resnet50-16.txt ...

Run by bench/gpu_check.sh on the GPU machine (its `profile` step), where the comparison
showed where tensorgate misses issue 5's GPU goals; it runs on the CPU too. Each run's
stacks are DIR/{server}-{model}-{connections}.txt (py-spy's raw format: one collapsed stack
and its sample count a line), read afterwards with any flame-graph tool. With
--baseline-src (an earlier commit's src/, packed by `BASELINE=REV pack_device.sh`), that
server is measured too, in turn with this tree's, and the ratios printed: a change's
before and after in one run. With --instances N, this tree is measured a second way too,
identity and resnet50 configured with `instance_group [{ count: N kind: KIND_AUTO }]` (N
executor threads, each with its own CUDA stream and graphs, on one GPU: Triton's usual
advice), and its ratios printed beside the default's: whether a second instance fills the
GPU while the first gathers and scatters on the host. Each server's start-up is printed
with what its models' loads took, by step (load, warm-up, CUDA graphs)."""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from typing import Any

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "src"))
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))

from compare_wire import socket_load  # noqa: E402
from server_bench import OUTPUT_BYTES, binary_request, serve_logged  # noqa: E402

from tensorgate.builtin.repository import write_default_repository  # noqa: E402

_PHASES = ("queue", "compute_input", "compute_infer", "compute_output")


def _stats(port: int, model: str) -> dict[str, Any]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/v2/models/{model}/stats",
                                timeout=10) as answer:
        stats: dict[str, Any] = json.load(answer)["model_stats"][0]
    return stats


def _per_batch(before: dict[str, Any], after: dict[str, Any]) -> dict[str, float]:
    """Microseconds per batch run of each phase between two statistics, and rows per run."""
    runs = after["execution_count"] - before["execution_count"]
    rows = after["inference_count"] - before["inference_count"]
    figures = {"runs": runs, "rows_per_run": rows / max(runs, 1)}
    for phase in _PHASES:
        ns = (after["inference_stats"][phase]["ns"] - before["inference_stats"][phase]["ns"])
        # per request as Triton counts it; times rows over runs gives per batch run
        figures[phase] = ns / max(rows, 1) / 1e3
    return figures


def _start(repo: pathlib.Path, log: pathlib.Path, source: pathlib.Path | None
           ) -> tuple[subprocess.Popen[bytes], int, float]:
    """The server on `repo`, its package from `source` when given: the process, its HTTP
    port and its start-up seconds."""
    environment = dict(os.environ)
    if source is not None:
        environment["PYTHONPATH"] = os.pathsep.join(
            [str(source), *filter(None, [environment.get("PYTHONPATH")])])
    process, ports, startup = serve_logged(repo, log, env=environment, timeout_s=120)
    return process, ports["http"], startup


def _instances_repository(repo: pathlib.Path, count: int) -> pathlib.Path:
    """A copy of `repo` whose identity and resnet50 run `count` instances each, on the
    GPU where there is one (KIND_AUTO)."""
    copy = repo.with_name(f"{repo.name}-x{count}")
    shutil.rmtree(copy, ignore_errors=True)
    shutil.copytree(repo, copy)
    for model in ("identity", "resnet50"):
        config = copy / model / "config.pbtxt"
        config.write_text(config.read_text()
                          + f"instance_group [ {{ count: {count} kind: KIND_AUTO }} ]\n")
    return copy


def _load_steps(log: pathlib.Path) -> str:
    """What each model's load took, by step, from the server's ready lines."""
    found = re.findall(r"model (\S+) v\d+ ready on [^\n]*?; (load [^\n]*)",
                       log.read_text(errors="replace"))
    return "; ".join(f"{model}: {steps}" for model, steps in found) or "no load steps logged"


def _measure(label: str, source: pathlib.Path | None, repo: pathlib.Path, args: Any,
             rows: dict[tuple[str, str, int], list[dict[str, float]]]) -> None:
    """One server (tensorgate from `source`, else this tree's), every row of the table;
    py-spy's stacks in args.out/{label}-{model}-{connections}.txt."""
    log = args.out / f"{label}-server.log"
    process, port, startup = _start(repo, log, source)
    print(f"{label}: server up in {startup:.1f} s ({_load_steps(log)})")
    try:
        for model in ("identity", "resnet50"):
            try:
                _stats(port, model)
            except urllib.error.HTTPError as error:  # not loaded: the server's log says why
                print(f"{model}: no statistics ({error}); the server's log:\n"
                      f"{log.read_text(errors='replace')[-3000:]}")
                continue
            raw = binary_request(model, port)
            for connections in (1, 16):
                before = _stats(port, model)
                spy = None
                if args.py_spy:
                    spy = subprocess.Popen(
                        [args.py_spy, "record", "--pid", str(process.pid), "--idle",
                         "--threads", "--nonblocking", "--rate", "200", "--format", "raw",
                         "--duration", str(int(args.seconds)),
                         "--output", str(args.out / f"{label}-{model}-{connections}.txt")],
                        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
                    time.sleep(0.3)  # attached before the load starts
                load = socket_load(port, raw, connections, args.seconds - 0.6,
                                   OUTPUT_BYTES[model])
                if spy is not None:
                    _, errors = spy.communicate(timeout=args.seconds + 30)
                    if spy.returncode != 0:
                        print(f"py-spy failed ({spy.returncode}): {errors.strip()[-300:]}")
                figures = {**_per_batch(before, _stats(port, model)), "qps": load["qps"],
                           "p50_ms": load["p50_us"] / 1e3, "p99_ms": load["p99_us"] / 1e3}
                rows.setdefault((label, model, connections), []).append(figures)
                print(f"{label:9} {model:9} {connections:>5} {figures['qps']:>8,.0f} "
                      f"{figures['p50_ms']:>8.2f} {figures['p99_ms']:>8.2f} "
                      f"{figures['rows_per_run']:>8.2f} "
                      + " ".join(f"{figures[p]:>16,.1f}" for p in _PHASES)
                      + f"  bad {load['bad']}, errors {load['errors']}")
    finally:
        process.send_signal(signal.SIGTERM)
        process.wait(timeout=60)


def summarize(path: pathlib.Path, top: int = 6) -> str:
    """py-spy's raw stacks (`path`) per thread (numbered names collapsed: one line for a
    pool): its samples, the frames it was in last (leaf) and anywhere (inclusive) most
    often, each as a share of its samples — the figures bench/RESULTS.md quotes."""
    threads: dict[str, dict[str, Any]] = {}
    for line in path.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        frames = stack.split(";")
        name = re.sub(r"\d+$", "N", frames[0].partition(": ")[2] or frames[0])
        seen = threads.setdefault(name, {"n": 0, "leaf": {}, "in": {}})
        seen["n"] += int(count)
        seen["leaf"][frames[-1]] = seen["leaf"].get(frames[-1], 0) + int(count)
        for frame in set(frames[1:]):
            seen["in"][frame] = seen["in"].get(frame, 0) + int(count)
    said = [f"{path.name}:"]
    for name, seen in sorted(threads.items(), key=lambda item: -item[1]["n"]):
        said.append(f"  {name}: {seen['n']} samples")
        for kind in ("leaf", "in"):
            # (frames in nearly every sample, the thread's own start, say nothing)
            best = sorted(((c, f) for f, c in seen[kind].items() if c < 0.98 * seen["n"]),
                          reverse=True)[:top if kind == "leaf" else 2 * top]
            said += [f"    {kind:4} {100 * c / seen['n']:5.1f}%  {f}" for c, f in best]
    return "\n".join(said)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=pathlib.Path, default=pathlib.Path("/tmp/tg-profiles"))
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--py-spy", default=shutil.which("py-spy"))
    parser.add_argument("--baseline-src", type=pathlib.Path, default=None,
                        help="a folder holding another tensorgate package (an earlier "
                             "commit's src/): measured too, in turn, with ratios")
    parser.add_argument("--instances", type=int, default=0,
                        help="also this tree with identity and resnet50 at this many "
                             "instances each (KIND_AUTO), with ratios")
    parser.add_argument("--rounds", type=int, default=1,
                        help="times each server is measured, in alternating order")
    parser.add_argument("--summarize", type=pathlib.Path, nargs="+", default=None,
                        help="print what these stacks files (from an earlier run) say, "
                             "per thread, and measure nothing")
    args = parser.parse_args()
    if args.summarize:
        print("\n".join(summarize(path) for path in args.summarize))
        return
    args.out.mkdir(parents=True, exist_ok=True)
    repo = write_default_repository(pathlib.Path(tempfile.gettempdir()) / "tensorgate-profile")
    variants: list[tuple[str, pathlib.Path | None, pathlib.Path]] = [("this", None, repo)]
    if args.baseline_src is not None:
        variants.insert(0, ("baseline", args.baseline_src.resolve(), repo))
    if args.instances > 1:
        variants.append((f"x{args.instances}", None,
                         _instances_repository(repo, args.instances)))
    print(f"py-spy: {args.py_spy or 'missing, no stacks'}; per request as Triton counts it")
    print(f"{'server':9} {'model':9} {'conns':>5} {'QPS':>8} {'P50 ms':>8} {'P99 ms':>8} "
          f"{'rows/run':>8} " + " ".join(f"{p + ' µs':>16}" for p in _PHASES))
    rows: dict[tuple[str, str, int], list[dict[str, float]]] = {}
    for round_index in range(args.rounds):
        order = variants if round_index % 2 == 0 else variants[::-1]
        for label, source, served in order:
            _measure(label, source, served, args, rows)
    for label, against in (("this", "baseline"), (f"x{args.instances}", "this")):
        if not any(key[0] == label for key in rows) or not any(key[0] == against
                                                               for key in rows):
            continue
        print(f"{label} / {against}, mean over rounds:")
        for (measured, model, connections), these in rows.items():
            base = rows.get((against, model, connections))
            if measured != label or not base:
                continue
            ratio = {key: (sum(r[key] for r in these) / len(these))
                     / max(sum(r[key] for r in base) / len(base), 1e-9)
                     for key in ("qps", "p50_ms", "p99_ms", "compute_input")}
            print(f"  {model:9} {connections:>3} connections: QPS {ratio['qps']:.2f}×, "
                  f"P50 {ratio['p50_ms']:.2f}×, P99 {ratio['p99_ms']:.2f}×, "
                  f"compute_input {ratio['compute_input']:.2f}×")


if __name__ == "__main__":
    main()
