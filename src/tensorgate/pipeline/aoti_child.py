"""The child process of aoti_check.py: loads an AOTInductor package with its input checks on
(AOTI_RUNTIME_CHECK_INPUTS=1, set by the parent) and prints, per try, what it said.

Run as a file, not a module of the package, so that it imports torch and nothing more.
Argument: JSON {"path", "device", "batched", "inputs": [{"dtype", "shape"}], "tries":
[{"rows", "view"}]} (shapes of one row where batched); a line `aoti-check: <JSON>` per try,
null where the package ran, else its refusal. A try with "view" passes stride-0 views of `rows` rows: refused by the package's
stride checks at the latest, which come after its size checks, so nothing is computed.
"""

import json
import sys
from collections.abc import Callable
from typing import Any

import torch

ANSWER = "aoti-check: "


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


def main(request: dict[str, Any]) -> None:
    device = torch.device(request["device"])
    if device.type == "cuda":
        torch.cuda.set_device(device)
    run = _loaded(request["path"])
    for attempt in request["tries"]:
        inputs = []
        for item in request["inputs"]:
            dtype = getattr(torch, item["dtype"])
            shape = ([attempt["rows"], *item["shape"][1:]] if request["batched"]
                     else item["shape"])
            if attempt["view"]:
                inputs.append(torch.zeros((), dtype=dtype, device=device).expand(shape))
            else:
                inputs.append(torch.zeros(shape, dtype=dtype, device=device))
        answer = None
        try:
            with torch.inference_mode():
                run(inputs)
        except Exception as error:  # the refusal is the answer
            answer = str(error) or type(error).__name__
        print(ANSWER + json.dumps(answer), flush=True)


if __name__ == "__main__":
    main(json.loads(sys.argv[1]))
