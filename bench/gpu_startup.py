"""Where a TorchScript model's start-up goes on a GPU, step by step, and what TorchScript's
own optimising costs there.

On the H200 the server took 14.4 s from launch to its first answer, Triton 10.9 (issue 5's
comparison), and nothing said where. Each variant runs in a fresh process (a new CUDA
context and TorchScript state), loading one built-in model as an executor does
(`load_runner` on the device, a warm-up at batch 1, the check at batch 2, then one CUDA
graph per batch size of `graph_batch_sizes`, each size's capture timed alone):

    default      as the server loads it
    no-fuser     TorchScript's tensor-expression fuser off (it compiles fused kernels at
                 run time, per shape it specialises for)
    no-optimize  the graph executor not optimising (the config's DISABLE_OPTIMIZED_EXECUTION)

    python3 bench/gpu_startup.py [--device cuda] [--model resnet50] [--variants ...]

Prints one column a variant, a row a step (seconds), and the slowest graph sizes. Run by
bench/gpu_check.sh's `startup` step; on a CPU (`--device cpu`) it times the same steps with
eager runs at each size in place of captures, as a rehearsal.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import pathlib
import subprocess
import sys
import tempfile
import time
from typing import Any

HERE = pathlib.Path(__file__).resolve().parent
SRC = HERE.parent / "src"
VARIANTS = ("default", "no-fuser", "no-optimize")
REPO = pathlib.Path(tempfile.gettempdir()) / "tensorgate-startup-repo"
_STEPS = ("import torch", "device ready", "load", "warm-up", "batch-2 check", "CUDA graphs",
          "total")


def _child(variant: str, device_name: str, model: str) -> dict[str, Any]:
    """One variant, in this process: its steps' seconds and each graph size's."""
    began = time.perf_counter()
    steps: dict[str, float] = {}
    import torch
    steps["import torch"] = time.perf_counter() - began

    sys.path.insert(0, str(SRC))
    from tensorgate.builtin.repository import write_default_repository
    from tensorgate.pipeline.cuda_graphs import GraphSet, graph_batch_sizes
    from tensorgate.pipeline.made_inputs import warmup_inputs
    from tensorgate.pipeline.runner import load_runner
    from tensorgate.model import ModelContext
    from tensorgate.repository.model_config import parse_model_config

    if variant == "no-fuser":
        torch._C._jit_set_texpr_fuser_enabled(False)
    elif variant == "no-optimize":
        torch._C._set_graph_executor_optimize(False)
    device = torch.device(device_name if device_name == "cpu" else f"{device_name}:0")
    started = time.perf_counter()
    stream = None
    if device.type == "cuda":
        torch.cuda.set_device(device)
        stream = torch.cuda.Stream(device)
        torch.zeros(1, device=device).add_(1)
        torch.cuda.synchronize(device)
    steps["device ready"] = time.perf_counter() - started

    repo = write_default_repository(REPO)  # (written by the parent: not timed)
    spec = parse_model_config((repo / model / "config.pbtxt").read_text())
    context = ModelContext(model, 1, repo / model / "1", device, spec.max_batch_size, {}, 0)
    sizes: dict[int, float] = {}
    with torch.inference_mode(), (torch.cuda.stream(stream) if stream is not None
                                  else contextlib.nullcontext()):
        started = time.perf_counter()
        runner = load_runner(repo / model / "1" / "model.pt", "torchscript", spec, context)
        steps["load"] = time.perf_counter() - started
        for step, rows in (("warm-up", 1), ("batch-2 check", 2)):
            zeros = warmup_inputs(spec, rows, device)
            assert zeros is not None
            started = time.perf_counter()
            runner.run(dict(zeros))
            if stream is not None:
                stream.synchronize()
            steps[step] = time.perf_counter() - started
        runner.decide_sharing()  # as the executor does after its warm-up (in the total only)
        for rows in sorted(graph_batch_sizes(spec), reverse=True):  # as capture goes
            started = time.perf_counter()
            if stream is not None:
                GraphSet.capture(runner.run, spec, device, stream, [rows])
            else:  # the rehearsal: what a capture's warm-up runs cost, eagerly
                zeros = warmup_inputs(spec, rows, device)
                assert zeros is not None
                for _ in range(4):
                    runner.run(dict(zeros))
            sizes[rows] = time.perf_counter() - started
    steps["CUDA graphs"] = sum(sizes.values())
    steps["total"] = time.perf_counter() - began
    return {"variant": variant, "torch": torch.__version__, "steps": steps, "sizes": sizes}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--model", default="resnet50")
    parser.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=VARIANTS)
    parser.add_argument("--child", choices=VARIANTS, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(_child(args.child, args.device, args.model)))
        return
    sys.path.insert(0, str(SRC))
    from tensorgate.builtin.repository import write_default_repository
    write_default_repository(REPO)
    found = []
    for variant in args.variants:
        done = subprocess.run([sys.executable, __file__, "--child", variant, "--device",
                               args.device, "--model", args.model], capture_output=True,
                              text=True, timeout=600, env={**os.environ, "PYTHONWARNINGS":
                                                           "ignore"})
        if done.returncode != 0:
            print(f"{variant}: failed ({done.returncode}): {done.stderr.strip()[-800:]}")
            continue
        found.append(json.loads(done.stdout.strip().splitlines()[-1]))
    if not found:
        return
    print(f"{args.model} on {args.device}, torch {found[0]['torch']}: seconds a step, each "
          "variant in a fresh process")
    print(f"{'step':15}" + "".join(f"{r['variant']:>13}" for r in found))
    for step in _STEPS:
        print(f"{step:15}" + "".join(f"{r['steps'][step]:>13.2f}" for r in found))
    for r in found:
        slowest = sorted(r["sizes"].items(), key=lambda item: -item[1])[:4]
        print(f"{r['variant']}: graph sizes, slowest: "
              + ", ".join(f"{rows} rows {seconds:.2f} s" for rows, seconds in slowest))


if __name__ == "__main__":
    main()
