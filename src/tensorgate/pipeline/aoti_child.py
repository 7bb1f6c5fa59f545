"""The child process of aoti_check.py: loads an AOTInductor package with its input checks on
(AOTI_RUNTIME_CHECK_INPUTS=1, set by the parent), learns the sizes its code takes in the dims
it is asked about, then prints, per try, what it said.

Run as a file, not a module of the package, so that it imports torch and nothing more.
Argument: JSON {"path", "device", "batched", "rows", "inputs": [{"dtype", "shape",
"probe"}], "tries": [{"rows", "view"}]} (shapes of one row where batched; "probe": the dims
of that input to learn the range of; "rows": the batch the probes use). It prints one line
`aoti-bounds: <JSON>` (per input, {"dim", "low", "high"} per probed dim, high null where
unbounded; null where the checks refused something else: the tries then say what), then a
line `aoti-check: <JSON>` per try, null where the package ran, else its refusal.

The probes and a try with "view" pass meta tensors: the generated checks take each input's
dtype, sizes and strides, then its device, so a meta tensor of sizes they take is refused
for its device, and nothing is computed or allocated whatever the sizes. The tries that run
give the probed dims the least size the checks took.
"""

import json
import re
import sys
from collections.abc import Callable
from typing import Any

import torch

ANSWER = "aoti-check: "
BOUNDS = "aoti-bounds: "
# what the generated checks say when they refuse a size (torch/_inductor's cpp wrapper)
SIZE = re.compile(r"input_handles\[(\d+)\]: (dim value is too small|dim value is too large|"
                  r"unmatched dim value) at (\d+), expected(?: it)?(?: to be)?:? (?:>= |<= )?"
                  r"(\d+)")
TOO_SMALL = "dim value is too small"
# what the generated code's assert_size_stride says of an input whose size is not the one
# its symbol took from an earlier input (given==expected)
UNEQUAL = re.compile(r"expected size (\d+)==(\d+), stride \S+ at dim=(\d+)")
BIG = 2**31 - 1  # past any bound an export gives a dim; a meta tensor of it holds nothing


def _loaded(path: str) -> Callable[[list[torch.Tensor]], Any]:
    """The package's runner, called with its inputs in order: torch's C++ loader itself,
    which spares importing torch._inductor (0.9 s of the child's 3.1 here), else the way
    `aoti_load_package` goes."""
    try:
        loader = torch._C._aoti.AOTIModelPackageLoader(path, "model", False, 1, -1)
        return lambda inputs: loader.boxed_run(inputs)
    except Exception:  # another torch, another model name: the public way
        from torch._inductor import aoti_load_package
        package = aoti_load_package(path)
        return lambda inputs: package(*inputs)


def _refusal(run: Callable[[list[torch.Tensor]], Any], inputs: list[torch.Tensor]) -> str | None:
    try:
        with torch.inference_mode():
            run(inputs)
    except Exception as error:  # the refusal is the answer
        return str(error) or type(error).__name__
    return None


def _probed(run: Callable[[list[torch.Tensor]], Any], request: dict[str, Any],
            dtypes: list[torch.dtype], device: torch.device
            ) -> tuple[list[list[dict[str, Any]]], list[list[int]]] | None:
    """Per input, the range of each dim it asks about, and the least shapes the checks take
    (batch: `rows`); None where the checks refuse something other than a size."""
    items = request["inputs"]
    shapes = [([request["rows"], *item["shape"][1:]] if request["batched"] else
               list(item["shape"])) for item in items]

    def meta(index: int, shape: list[int]) -> list[torch.Tensor]:
        """Inputs before `index` as real zeros its checks took, then metas from it on."""
        return ([torch.zeros(s, dtype=t, device=device)
                 for s, t in zip(shapes[:index], dtypes[:index])]
                + [torch.empty(shape, dtype=dtypes[index], device="meta")]
                + [torch.empty(s, dtype=t, device="meta")
                   for s, t in zip(shapes[index + 1:], dtypes[index + 1:])])

    def refused_size(error: str | None, index: int) -> re.Match[str] | None:
        size = SIZE.search(error or "")
        return size if size is not None and int(size[1]) == index else None

    ranges = []
    for index, item in enumerate(items):
        least: dict[int, tuple[int, str]] = {}
        for _ in range(len(shapes[index]) + 1):  # each dim is refused once at most
            error = _refusal(run, meta(index, shapes[index]))
            size = refused_size(error, index)
            if size is None:
                break
            dim, bound = int(size[3]), int(size[4])
            shapes[index][dim] = bound
            least[dim] = (bound, size[2])
        if f"input_handles[{index}]: unmatched device type" not in (error or ""):
            return None  # a dtype, a stride, the number of inputs: the tries say what
        found = []
        for dim in item["probe"]:
            error = _refusal(run, meta(index, [BIG if d == dim else n
                                               for d, n in enumerate(shapes[index])]))
            size = refused_size(error, index)
            if size is not None and int(size[3]) == dim:
                high: int | None = int(size[4])
            elif f"input_handles[{index}]: unmatched device type" in (error or ""):
                high = None
            else:
                return None
            low, kind = least.get(dim, (1, ""))
            if kind == TOO_SMALL and low == 2:
                low = 1  # inductor's 0/1 specialization: its code takes 1 (aoti_check.py)
            found.append({"dim": dim, "low": low, "high": high})
        ranges.append(found)
    return ranges, shapes


def _ties(run: Callable[[list[torch.Tensor]], Any], dtypes: list[torch.dtype],
          ranges: list[list[dict[str, Any]]], shapes: list[list[int]],
          device: torch.device) -> list[list[list[int]]]:
    """Groups ([input, dim] each) of probed dims the package's code takes as one size: it
    reads the size from the first input that has it, and with the checks on holds the
    others to it (assert_size_stride). Each probed dim that can is given a size of its own;
    a refusal says the size given and the one expected, so the dim given the first joins
    the dim of the second, until the package runs (on zeros this small). Empty where a
    refusal names sizes no probed dim has (a relation other than equality)."""
    sizes = [list(shape) for shape in shapes]
    owner: dict[int, tuple[int, int]] = {}  # a probed dim's own size -> (input, dim)
    for index, found in enumerate(ranges):
        for item in found:
            size = sizes[index][item["dim"]]
            while size in owner:
                size += 1
            if item["high"] is None or size <= item["high"]:
                sizes[index][item["dim"]] = size
                owner[size] = (index, item["dim"])
    joined: dict[tuple[int, int], tuple[int, int]] = {}
    for _ in range(len(owner) + 1):
        error = _refusal(run, [torch.zeros(size, dtype=dtype, device=device)
                               for size, dtype in zip(sizes, dtypes)])
        if error is None:
            break
        unequal = [(int(given), int(expected), int(dim))
                   for given, expected, dim in UNEQUAL.findall(error) if given != expected]
        if not unequal:
            return []
        given, expected, dim = unequal[0]
        if given not in owner or expected not in owner or owner[given][1] != dim:
            return []
        index, dim = owner.pop(given)
        sizes[index][dim] = expected
        joined[(index, dim)] = owner[expected]
    else:
        return []
    groups: dict[tuple[int, int], list[list[int]]] = {}
    for member, first in joined.items():
        groups.setdefault(first, [list(first)]).append(list(member))
    return list(groups.values())


def main(request: dict[str, Any]) -> None:
    device = torch.device(request["device"])
    if device.type == "cuda":
        torch.cuda.set_device(device)
    run = _loaded(request["path"])
    dtypes = [getattr(torch, item["dtype"]) for item in request["inputs"]]
    probed = _probed(run, request, dtypes, device)
    print(BOUNDS + json.dumps(None if probed is None else
                              {"ranges": probed[0],
                               "ties": _ties(run, dtypes, *probed, device)}), flush=True)
    for attempt in request["tries"]:
        inputs = []
        for index, (item, dtype) in enumerate(zip(request["inputs"], dtypes)):
            shape = list(item["shape"])
            if probed is not None:
                for dim in item["probe"]:
                    shape[dim] = probed[1][index][dim]
            if request["batched"]:
                shape[0] = attempt["rows"]
            if attempt["view"]:
                inputs.append(torch.empty(shape, dtype=dtype, device="meta"))
            else:
                inputs.append(torch.zeros(shape, dtype=dtype, device=device))
        print(ANSWER + json.dumps(_refusal(run, inputs)), flush=True)


if __name__ == "__main__":
    main(json.loads(sys.argv[1]))
