"""Decode a request body's tensor into torch: tensorgate's view vs the usual ways.

Prints ns per decode and bytes copied for an FP32 [1,3,224,224] body (602,112 bytes), and
the view path at other payload sizes to show it does not scale with bytes. Writes the numbers
to bench/results/tensor_bench.json.

    .venv/bin/python bench/tensor_bench.py [--quick]
"""

from __future__ import annotations

import argparse
import json
import pathlib
import platform
import statistics
import time
from collections.abc import Callable

import numpy as np
import torch

from tensorgate.tensor import CopyLedger, TensorView

RESULTS = pathlib.Path(__file__).parent / "results"
HEADER_BYTES = 200  # a JSON header in front of the tensor, as in a binary-extension request


def _time_ns(fn: Callable[[], object], number: int, repeat: int) -> float:
    """Median over `repeat` runs of the mean ns per call over `number` calls."""
    runs = []
    for _ in range(repeat):
        start = time.perf_counter_ns()
        for _ in range(number):
            fn()
        runs.append((time.perf_counter_ns() - start) / number)
    return statistics.median(runs)


def _body(shape: tuple[int, ...]) -> tuple[bytearray, np.ndarray]:
    values = np.random.default_rng(0).standard_normal(shape).astype("<f4")
    return bytearray(b"{" * HEADER_BYTES) + bytearray(values.tobytes()), values


def bench(quick: bool) -> dict[str, object]:
    shape = (1, 3, 224, 224)
    body, values = _body(shape)
    nbytes = values.nbytes
    body_address = np.frombuffer(body, np.uint8).ctypes.data
    reps = (2_000, 5) if quick else (20_000, 7)
    rows = []

    ledger = CopyLedger()

    def view() -> torch.Tensor:
        return TensorView(body, "FP32", shape, HEADER_BYTES, ledger=ledger).torch()

    out = view()
    assert out.data_ptr() == body_address + HEADER_BYTES and torch.equal(out, torch.from_numpy(values))
    ledger.bytes = 0
    ns = _time_ns(view, *reps)
    rows.append({"method": "tensorgate TensorView(...).torch()", "ns": ns,
                 "bytes_copied": ledger.bytes / (reps[0] * reps[1] + 0)})

    def tensor_frombuffer() -> torch.Tensor:
        return torch.tensor(np.frombuffer(body, "<f4", values.size, HEADER_BYTES).reshape(shape))

    out = tensor_frombuffer()
    assert out.data_ptr() != body_address + HEADER_BYTES and torch.equal(out, torch.from_numpy(values))
    rows.append({"method": "torch.tensor(numpy.frombuffer(...))",
                 "ns": _time_ns(tensor_frombuffer, max(reps[0] // 20, 50), reps[1]),
                 "bytes_copied": out.numel() * out.element_size()})

    text = json.dumps({"name": "INPUT__0", "shape": list(shape), "datatype": "FP32",
                       "data": values.reshape(-1).tolist()})

    def json_list() -> torch.Tensor:
        request = json.loads(text)
        return torch.tensor(request["data"], dtype=torch.float32).reshape(request["shape"])

    out = json_list()
    assert torch.equal(out, torch.from_numpy(values))
    rows.append({"method": "JSON list: json.loads + torch.tensor(list)",
                 "ns": _time_ns(json_list, 1, 3 if quick else 5),
                 "bytes_copied": out.numel() * out.element_size(),
                 "json_bytes": len(text)})

    scaling = []
    for dims in ((1, 3, 8, 8), (1, 3, 224, 224), (16, 3, 224, 224)):
        b, v = _body(dims)
        scaling.append({"shape": list(dims), "bytes": v.nbytes, "ns": _time_ns(
            lambda b=b, d=dims: TensorView(b, "FP32", d, HEADER_BYTES).torch(), *reps)})
    return {"payload_bytes": nbytes, "rows": rows, "view_scaling": scaling,
            "machine": platform.machine(), "python": platform.python_version(),
            "torch": torch.__version__, "numpy": np.__version__,
            "date": time.strftime("%Y-%m-%d")}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer repetitions")
    result = bench(parser.parse_args().quick)
    print(f"decode FP32 [1,3,224,224] ({result['payload_bytes']:,} bytes) into a torch tensor")
    print(f"{'method':<46}{'ns/decode':>14}{'bytes copied':>14}")
    for row in result["rows"]:
        print(f"{row['method']:<46}{row['ns']:>14,.0f}{row['bytes_copied']:>14,.0f}")
    print("\nview path vs payload size (must stay flat)")
    print(f"{'shape':<22}{'bytes':>14}{'ns/decode':>14}")
    for row in result["view_scaling"]:
        print(f"{str(row['shape']):<22}{row['bytes']:>14,}{row['ns']:>14,.0f}")
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "tensor_bench.json").write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
