"""The embedded default repository, written on first use into a cache directory.

    identity   FP32 [3,224,224] → the same; max_batch_size 64, dynamic batching
    resnet50   FP32 [3,224,224] → FP32 [1000]; random weights (seed 0), TorchScript
    detector   FP32 [3,64,64] → boxes, scores, classes, count after batched NMS

Nothing is downloaded: the weights are random with fixed seeds, so the compute and memory
are those of the real networks. A finished repository is marked by a stamp file, so a start
that was interrupted half-way rebuilds it.
"""

from __future__ import annotations

import os
import pathlib
import textwrap
import warnings

import torch

from tensorgate.builtin.nets import Identity, TinyDetector, resnet50

__all__ = ["default_repository", "write_default_repository"]

_STAMP = ".tensorgate-complete-v1"

_CONFIGS = {
    "identity": """
        name: "identity"
        platform: "pytorch_libtorch"
        max_batch_size: 64
        input [ { name: "INPUT__0" data_type: TYPE_FP32 dims: [ 3, 224, 224 ] } ]
        output [ { name: "OUTPUT__0" data_type: TYPE_FP32 dims: [ 3, 224, 224 ] } ]
        dynamic_batching { }
        """,
    "resnet50": """
        name: "resnet50"
        platform: "pytorch_libtorch"
        max_batch_size: 64
        input [ { name: "INPUT__0" data_type: TYPE_FP32 dims: [ 3, 224, 224 ] } ]
        output [ { name: "OUTPUT__0" data_type: TYPE_FP32 dims: [ 1000 ] } ]
        dynamic_batching { }
        """,
    "detector": """
        name: "detector"
        platform: "pytorch_libtorch"
        max_batch_size: 16
        input [ { name: "IMAGE" data_type: TYPE_FP32 dims: [ 3, 64, 64 ] } ]
        output [
          { name: "BOXES" data_type: TYPE_FP32 dims: [ 20, 4 ] },
          { name: "SCORES" data_type: TYPE_FP32 dims: [ 20 ] },
          { name: "CLASSES" data_type: TYPE_INT64 dims: [ 20 ] },
          { name: "COUNT" data_type: TYPE_INT32 dims: [ 1 ] }
        ]
        dynamic_batching { }
        parameters { key: "postprocess" value { string_value: "nms" } }
        parameters { key: "nms_iou_threshold" value { string_value: "0.5" } }
        parameters { key: "nms_score_threshold" value { string_value: "0.3" } }
        parameters { key: "nms_max_detections" value { string_value: "20" } }
        """,
}


def _networks() -> dict[str, torch.nn.Module]:
    return {"identity": Identity(), "resnet50": resnet50(seed=0),
            "detector": TinyDetector(size=64, classes=3, seed=0).eval()}


def write_default_repository(root: pathlib.Path) -> pathlib.Path:
    """Write the three models under `root` (idempotent); returns `root`."""
    if (root / _STAMP).is_file():
        return root
    root.mkdir(parents=True, exist_ok=True)
    for name, module in _networks().items():
        folder = root / name
        (folder / "1").mkdir(parents=True, exist_ok=True)
        (folder / "config.pbtxt").write_text(textwrap.dedent(_CONFIGS[name]).lstrip())
        with warnings.catch_warnings():  # TorchScript is deprecated upstream; we still serve it
            warnings.simplefilter("ignore", DeprecationWarning)
            scripted = torch.jit.script(module.eval())
            partial = folder / "1" / "model.pt.partial"
            scripted.save(str(partial))  # type: ignore[no-untyped-call]
        os.replace(partial, folder / "1" / "model.pt")
    (root / _STAMP).write_text("complete\n")
    return root


def default_repository() -> pathlib.Path:
    """The embedded repository in the user's cache ($XDG_CACHE_HOME or ~/.cache)."""
    cache = pathlib.Path(os.environ.get("XDG_CACHE_HOME") or pathlib.Path.home() / ".cache")
    return write_default_repository(cache / "tensorgate" / "models-v1")
