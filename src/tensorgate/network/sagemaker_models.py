"""SageMaker's multi-model endpoint (SAGEMAKER_MULTI_MODEL=true): SageMaker unpacks each
model's archive where it likes under /opt/ml/models and tells the server to load it, call it
and unload it, by a name of its own (a hash), through these routes of its port:

- `POST /models` `{"model_name": NAME, "url": FOLDER}`: load the model in FOLDER (the
  folder itself where it holds a config.pbtxt, else its one model folder, or among several
  its ensemble's), served by the name in the header X-Amzn-SageMaker-Target-Model (the
  archive's name; NAME without it). 409 if NAME is loaded already; 507 when the load ran
  out of memory (SageMaker then unloads others and tries again).
- `GET /models`, `GET /models/NAME`: `{"models": [{"modelName", "modelUrl"}]}`, one's.
- `POST /models/NAME/invoke`: an inference of it, as /invocations (sagemaker_routes.py).
- `DELETE /models/NAME`: unload it.

The folders loaded must lie under `root` (TENSORGATE_SAGEMAKER_MODELS_ROOT, /opt/ml/models),
links resolved: a load runs the folder's code, and only SageMaker's archives are meant. An
archive of several model folders is an ensemble and its steps: the ensemble is served by the
name given, its steps by their own (unloaded with it). As Triton's (src/sagemaker_server.cc;
tools/triton_diff.py holds the two side by side).
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import pathlib
import re
from collections.abc import Awaitable, Callable
from typing import Any

from tensorgate.dataplane import DataPlane
from tensorgate.errors import InvalidArgumentError, TensorgateError
from tensorgate.network.http_request import JSON_HEADERS, HttpRequest, Routed
from tensorgate.protocol.infer_codec import json_error, parse_json
from tensorgate.protocol.status import codes_for

__all__ = ["MultiModels"]

log = logging.getLogger("tensorgate.sagemaker")

# words of an error that ran out of memory (Triton's list, in short): 507, which SageMaker
# answers by unloading models to make room
_OUT_OF_MEMORY = ("out of memory", "OutOfMemory", "MemoryError", "OOM", "CUDA_OUT_OF_MEMORY",
                  "failed to allocate memory", "No space left on device")


class MultiModels:
    """The models SageMaker loaded: its name for each → (the name served, its folder)."""

    def __init__(self, root: pathlib.Path,
                 infer: Callable[[DataPlane, HttpRequest, str], Awaitable[Any]]) -> None:
        """`infer(dp, request, model)`: an inference of a loaded model, as /invocations."""
        self.root = root
        self.loaded: dict[str, tuple[str, str]] = {}
        self._loading: set[str] = set()
        self._infer = infer

    def route(self, method: str, parts: list[str]) -> Routed:
        """/models[/NAME[/invoke]], its segments after "models"."""
        if not parts:
            if method == "GET":
                return self.list, ()
            return (self.load, ()) if method == "POST" else (405, "use GET or POST")
        if len(parts) == 1:
            if method == "GET":
                return self.describe, (parts[0],)
            return (self.unload, (parts[0],)) if method == "DELETE" else \
                (405, "use GET or DELETE")
        if len(parts) == 2 and parts[1] == "invoke":
            return (self.invoke, (parts[0],)) if method == "POST" else (405, "use POST")
        return 404, f"no route for /models/{'/'.join(parts)}"

    @property
    def api_group(self) -> dict[Any, str]:
        return {self.list: "model-repository", self.describe: "model-repository",
                self.load: "model-repository", self.unload: "model-repository",
                self.invoke: "inference"}

    async def list(self, dp: DataPlane, request: HttpRequest) -> Any:
        models = [{"modelName": name, "modelUrl": url}
                  for name, (served, url) in self.loaded.items()
                  if dp.model_ready(served, None)]
        return 200, JSON_HEADERS, [json.dumps({"models": models}).encode()]

    async def describe(self, dp: DataPlane, request: HttpRequest, name: str) -> Any:
        if name not in self.loaded:
            return _not_loaded(name)
        return 200, JSON_HEADERS, [json.dumps({"modelName": name,
                                               "modelUrl": self.loaded[name][1]}).encode()]

    async def invoke(self, dp: DataPlane, request: HttpRequest, name: str) -> Any:
        if name not in self.loaded:
            return _not_loaded(name)
        return await self._infer(dp, request, self.loaded[name][0])

    async def load(self, dp: DataPlane, request: HttpRequest) -> Any:
        name, url = _load_body(request)
        served = request.headers.get("x-amzn-sagemaker-target-model") or name
        if name in self.loaded or name in self._loading:
            return 409, JSON_HEADERS, [json_error(f"model '{name}' is loaded already")]
        if any(served == other for other, _ in self.loaded.values()) or \
                dp.model_ready(served, None):
            return 409, JSON_HEADERS, [json_error(f"a model named '{served}' is served already")]
        self._loading.add(name)
        try:
            # (off the loop: it reads the folder, and its models' configs)
            folder = await asyncio.get_running_loop().run_in_executor(
                None, self._model_folder, url)
            log.info("SageMaker model %s: loading %s from %s", name, served, folder)
            await dp.load_folder(served, folder)
        except TensorgateError as error:
            await dp.unload_folder(served)  # its failure is not the server's (readiness)
            code = 507 if any(word in error.message for word in _OUT_OF_MEMORY) \
                else codes_for(error)[0]
            return code, JSON_HEADERS, [json_error(error.message)]
        finally:
            self._loading.discard(name)
        self.loaded[name] = (served, os.path.abspath(url))  # as Triton lists it
        return 200, JSON_HEADERS, [b""]

    async def unload(self, dp: DataPlane, request: HttpRequest, name: str) -> Any:
        if name not in self.loaded:
            return _not_loaded(name)
        served, _ = self.loaded.pop(name)
        log.info("SageMaker model %s: unloading %s", name, served)
        await dp.unload_folder(served)
        return 200, JSON_HEADERS, [b""]

    def _model_folder(self, url: str) -> pathlib.Path:
        """The model folder a load's url names, which must lie under the root (where links
        lead, too)."""
        folder = self._under_root(url, url)
        if not folder.is_dir():
            raise InvalidArgumentError(f"url '{url}' is not a folder")
        if (folder / "config.pbtxt").is_file():
            return folder
        models = sorted(p for p in folder.iterdir() if p.is_dir() and not p.name.startswith("."))
        if len(models) == 1:
            return self._under_root(str(models[0]), url)
        if not models:
            raise InvalidArgumentError(f"url '{url}' holds no model folder (nor a config.pbtxt)")
        ensembles = [p for p in models if _ensemble(p)]
        if len(ensembles) == 1:  # an ensemble and its steps: the ensemble is the model
            for step in models:  # (its steps load from the folders beside it)
                self._under_root(str(step), url)
            return self._under_root(str(ensembles[0]), url)
        raise InvalidArgumentError(
            f"url '{url}' holds {len(models)} model folders ({', '.join(p.name for p in models)}"
            f") and {len(ensembles) or 'no'} ensembles: an archive of several models must "
            "hold one ensemble, whose steps the others are")

    def _under_root(self, path: str, url: str) -> pathlib.Path:
        root = os.path.realpath(self.root)
        where = os.path.realpath(path)
        if os.path.commonpath([root, where]) != root:
            raise InvalidArgumentError(f"url '{url}' is not under {self.root}, where SageMaker "
                                       "unpacks models (TENSORGATE_SAGEMAKER_MODELS_ROOT)"
                                       + (f": {path} leads to {where}" if path != url else ""))
        return pathlib.Path(where)


def _ensemble(folder: pathlib.Path) -> bool:
    """Whether a model folder's config.pbtxt says platform "ensemble"."""
    try:
        text = (folder / "config.pbtxt").read_text(errors="replace")
    except OSError:
        return False
    return re.search(r'\bplatform\s*:\s*"ensemble"', text) is not None


def _load_body(request: HttpRequest) -> tuple[str, str]:
    body = parse_json(memoryview(request.body)[:request.length], "the load request") \
        if request.length else None
    if not isinstance(body, dict) or not all(isinstance(body.get(key), str) and body[key]
                                             for key in ("model_name", "url")):
        raise InvalidArgumentError('a SageMaker load must be a JSON object {"model_name": '
                                   'NAME, "url": FOLDER}')
    return body["model_name"], body["url"]


def _not_loaded(name: str) -> Any:
    return 404, JSON_HEADERS, [json_error(f"model '{name}' is not loaded (SageMaker's name)")]
