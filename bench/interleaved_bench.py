"""Sequential latency of two source trees of tensorgate, their requests interleaved.

Both servers run at once, each from its tree; one client sends `identity` requests (HTTP,
binary tensor extension, one keep-alive connection to each) one after another, to one
server and then the other, alternating which goes first. A machine whose speed drifts from
minute to minute (these shared VMs: the same tree's sequential P50 read 0.9 ms and 2.0 ms
ten minutes apart) slows both alike, where runs one after the other (bench/ab_bench.py,
bench/compare.py) can put the drift between them. Also counted: the client's recv calls a
request, each a wait for more of the answer. Every answer's status and size checked.
`--triton-python`: identity as a Triton user writes it (bench/peers/triton_model.py, the
repository compare.py's tensorgate-tritonpy row serves), not the built-in TorchScript one.
`--bls`: a Triton Python model that calls the built-in identity through BLS for each request
(`pb_utils.InferenceRequest(...).exec()` on its thread), then answers with what came back.
`--detector`: the built-in detector (FP32 [1,3,64,64] in, NMS in the post-processing pool),
its four outputs in binary.

    git worktree add /tmp/tg-old <commit>
    .venv/bin/python bench/interleaved_bench.py --before /tmp/tg-old/src [--after src]
        [--requests 3000] [--runs 3] [--triton-python | --bls | --detector]
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import shutil
import statistics
import sys
import tempfile
import textwrap

import numpy as np

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "src"))
sys.path.insert(0, str(HERE))

from ab_bench import serve  # noqa: E402
from compare_servers import triton_python_repository  # noqa: E402
from compare_wire import OIP_BINARY, Connection, raw_request, timed_exchange  # noqa: E402
from tensorgate.builtin.repository import write_default_repository  # noqa: E402


def bls_caller(target: str) -> str:
    """A Triton model.py that calls `target` (INPUT__0 -> OUTPUT__0) through BLS for each
    request and answers with what came back."""
    return textwrap.dedent(f'''
        import triton_python_backend_utils as pb_utils


        class TritonPythonModel:
            """{target}, called through BLS for each request."""

            def execute(self, requests):
                responses = []
                for request in requests:
                    called = pb_utils.InferenceRequest(
                        model_name="{target}", requested_output_names=["OUTPUT__0"],
                        inputs=[pb_utils.get_input_tensor_by_name(request, "INPUT__0")]).exec()
                    if called.has_error():
                        raise pb_utils.TritonModelException(called.error().message())
                    responses.append(pb_utils.InferenceResponse(
                        [pb_utils.get_output_tensor_by_name(called, "OUTPUT__0")]))
                return responses
        ''').lstrip()


def bls_repository(root: pathlib.Path) -> None:
    """The built-in repository and `bls` beside it: identity's config, the Python backend."""
    write_default_repository(root)
    config = (root / "identity" / "config.pbtxt").read_text()
    (root / "bls" / "1").mkdir(parents=True)
    (root / "bls" / "config.pbtxt").write_text(
        config.replace('"identity"', '"bls"').replace('platform: "pytorch_libtorch"',
                                                      'backend: "python"'))
    (root / "bls" / "1" / "model.py").write_text(bls_caller("identity"))


class CountingConnection(Connection):
    """A Connection that counts its recv calls."""

    recvs = 0

    def _recv(self, buffer: bytearray) -> None:
        self.recvs += 1
        super()._recv(buffer)


def _detector_request() -> tuple[str, dict[str, str], bytes, int]:
    """The detector's request (IMAGE, its outputs in binary), and the least answer size."""
    x = np.random.default_rng(0).random((1, 3, 64, 64), dtype=np.float32)
    header = json.dumps({"inputs": [{"name": "IMAGE", "shape": list(x.shape), "datatype": "FP32",
                                     "parameters": {"binary_data_size": x.nbytes}}],
                         "parameters": {"binary_data_output": True}}).encode()
    return ("/v2/models/detector/infer",
            {"Content-Type": "application/octet-stream",
             "Inference-Header-Content-Length": str(len(header))},
            header + x.tobytes(), 4 * (20 * 4 + 20) + 8 * 20 + 4)  # boxes, scores, classes, count


def run(trees: dict[str, pathlib.Path], models: pathlib.Path, requests: int,
        warmup: int, model: str = "identity") -> dict[str, tuple[np.ndarray, float]]:
    """Both trees served, `requests` each interleaved: per tree its latencies (µs) and the
    client's recv calls a request."""
    if model == "detector":
        path, headers, body, smallest = _detector_request()
    else:
        x = np.random.default_rng(0).standard_normal((1, 3, 224, 224)).astype(np.float32)
        path, headers, body = OIP_BINARY.build("/v2/models/{model}/infer", model, x)
        smallest = OIP_BINARY.min_body(x.size)
    processes, connections, raws = {}, {}, {}
    try:
        for tree, src in trees.items():
            processes[tree], port, _ = serve(src, models, "--model-control-mode", "explicit",
                                               "--load-model", "identity",
                                               "--load-model", model)
            raws[tree] = raw_request(port, path, headers, body)
            connections[tree] = CountingConnection(port)
        names = list(trees)
        for _ in range(warmup):
            for tree in names:
                connections[tree].exchange(raws[tree])
        for connection in connections.values():
            connection.recvs = 0
        samples = {tree: np.empty(requests) for tree in names}
        for i in range(requests):
            for tree in (names if i % 2 == 0 else names[::-1]):
                samples[tree][i] = timed_exchange(connections[tree], raws[tree], smallest,
                                                  tree) / 1e3
        return {tree: (samples[tree], connections[tree].recvs / requests) for tree in names}
    finally:
        for connection in connections.values():
            connection.close()
        for process in processes.values():
            process.terminate()
        for process in processes.values():
            process.wait(timeout=30)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--before", type=pathlib.Path, required=True,
                        help="the src folder of the tree before the change")
    parser.add_argument("--after", type=pathlib.Path, default=HERE.parent / "src")
    parser.add_argument("--requests", type=int, default=3000, help="a tree, a run")
    parser.add_argument("--warmup", type=int, default=200)
    parser.add_argument("--runs", type=int, default=3, help="server pairs started afresh")
    parser.add_argument("--triton-python", action="store_true",
                        help="identity as a Triton Python-backend model.py")
    parser.add_argument("--bls", action="store_true",
                        help="identity called through BLS by a Triton Python model")
    parser.add_argument("--detector", action="store_true",
                        help="the built-in detector (NMS in the post-processing pool)")
    args = parser.parse_args()
    trees = {"before": args.before, "after": args.after}
    work = pathlib.Path(tempfile.mkdtemp(prefix="tg-interleaved-"))
    if args.triton_python:  # its model.py loads the built-in TorchScript file, as compare's
        write_default_repository(work / "builtin")
        os.environ.update(TG_BENCH_MODELS=str(work / "builtin"),
                          TG_BENCH_PEERS=str(HERE / "peers"))
        triton_python_repository(work / "models")
    elif args.bls:
        bls_repository(work / "models")
    else:
        write_default_repository(work / "models")
    rows = []
    try:
        for r in range(args.runs):
            found = run(trees, work / "models", args.requests, args.warmup,
                        "bls" if args.bls else "detector" if args.detector else "identity")
            p50 = {t: float(np.percentile(found[t][0], 50)) for t in trees}
            rows.append((r + 1, p50, {t: float(np.percentile(found[t][0], 99)) for t in trees},
                         {t: found[t][1] for t in trees}))
            print(f"run {r + 1}: P50 before {p50['before']:,.0f} µs, after "
                  f"{p50['after']:,.0f} µs", flush=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print("\n| run | P50 before µs | P50 after µs | after − before µs | P99 before µs "
          "| P99 after µs | recv calls a request, before / after |")
    print("|---:|---:|---:|---:|---:|---:|---:|")
    for run_, p50, p99, recvs in rows:
        print(f"| {run_} | {p50['before']:,.0f} | {p50['after']:,.0f} | "
              f"{p50['after'] - p50['before']:+,.0f} | {p99['before']:,.0f} | "
              f"{p99['after']:,.0f} | {recvs['before']:.2f} / {recvs['after']:.2f} |")
    change = statistics.median(p50["after"] - p50["before"] for _, p50, _, _ in rows)
    print(f"\nmedian P50 change over the runs: {change:+,.0f} µs "
          f"({args.requests:,} requests a tree a run, "
          f"{'detector' if args.detector else 'identity'}"
          f"{' (Triton model.py)' if args.triton_python else ''}"
          f"{' called through BLS' if args.bls else ''}, HTTP binary, sequential)")


if __name__ == "__main__":
    main()
