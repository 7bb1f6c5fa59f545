"""What ties `triton_python_backend_utils` (python_backend.py) to the running server, for
the functions a model calls that reach outside its own request: where BLS requests, loads
and unloads go (the engine serves them: pipeline/bls.py), and the model folder whose code
this thread runs (`get_model_dir()`). python_backend.py exports them under Triton's names.
"""

from __future__ import annotations

import concurrent.futures
import os
import sys
import threading
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Protocol

from tensorgate.errors import TritonModelException

if TYPE_CHECKING:
    from tensorgate.python_backend import InferenceRequest

__all__ = ["BlsRunner", "bls_runner", "get_model_dir", "is_model_ready", "load_model",
           "running_in", "serve_bls", "unload_model"]


class BlsRunner(Protocol):
    """What runs a model's BLS requests: the server's engine (pipeline/bls.py)."""

    def exec(self, request: InferenceRequest, decoupled: bool) -> Any: ...

    def submit(self, request: InferenceRequest) -> concurrent.futures.Future[Any]: ...

    def load_model(self, name: str, config: str, files: Mapping[str, bytes] | None
                   ) -> None: ...

    def unload_model(self, name: str, dependents: bool) -> None: ...

    def is_model_ready(self, name: str, version: str) -> bool: ...


_bls: BlsRunner | None = None


def serve_bls(runner: BlsRunner | None, replacing: BlsRunner | None = None) -> None:
    """Where models' BLS requests go from now on (the engine sets it when it starts, and
    takes its own away when it stops: `replacing` is only replaced)."""
    global _bls
    if replacing is None or _bls is replacing:
        _bls = runner


def bls_runner() -> BlsRunner:
    """Where a model's BLS call goes now; raises while no server runs (a model's code run
    outside one, as in its own unit tests)."""
    if _bls is None:
        raise TritonModelException("no server is running to take BLS requests")
    return _bls


def load_model(model_name: str, config: str = "", files: Mapping[str, bytes] | None = None
               ) -> None:
    """Load (or reload) a model of the repository, `config` (JSON) standing in for its
    config.pbtxt; waits until it is ready. Only with --model-control-mode explicit, as on
    Triton. `files` ({"file:1/model.py": content, ...}, with `config`) are the model's folder,
    uploaded, as a load request's file parameters (only with --allow-model-upload)."""
    bls_runner().load_model(model_name, config, files)


def unload_model(model_name: str, unload_dependents: bool = False) -> None:
    """Unload a model (its requests drain first); waits until it is gone."""
    bls_runner().unload_model(model_name, unload_dependents)


_where = threading.local()  # the model folder of what runs on this thread (get_model_dir)


def get_model_dir() -> str:
    """The folder of the running model's version (where its model.py is), as Triton's
    stub gives it: the one whose initialize, execute or finalize this thread runs, else (a
    thread of the model's own) the folder of the module that calls this."""
    found: str | None = getattr(_where, "directory", None)
    if found is None:
        calling = sys._getframe(1).f_globals.get("__file__")
        if calling is None:
            raise TritonModelException("get_model_dir: not called from a model")
        found = os.path.dirname(os.path.abspath(calling))
    return found


def running_in(directory: str | None) -> str | None:
    """Say that this thread now runs the model in `directory` (None: no model); returns
    what it ran before (not part of Triton's API: the server calls it)."""
    before: str | None = getattr(_where, "directory", None)
    _where.directory = directory
    return before


def is_model_ready(model_name: str, model_version: str = "") -> bool:
    """Whether the model (that version: "" for any) is loaded and serving."""
    return bls_runner().is_model_ready(model_name, model_version)
