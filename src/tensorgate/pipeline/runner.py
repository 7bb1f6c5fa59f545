"""A loaded model artifact behind one interface, built on (and only used by) its executor thread.

    model.pt   TorchScript (repository/script_archive.py: what `torch.jit.load` gives, its
               tensors read with the GIL free onto the CPU); its forward runs without the GIL
    model.pt2  a `torch.export` program (`torch.export.load`) or an AOTInductor package
    model.py   a `tensorgate.Model` subclass with stage hooks, or Triton's Python backend's
               `class TritonPythonModel` (pipeline/triton_python.py)

`run` takes the batched inputs by config name (and, where `takes_requests`, the batch's
`RequestInfo`s) and returns the model's raw result; `name_outputs` maps a raw result
(tensor, sequence or mapping) onto the config's output names.
"""

from __future__ import annotations

import importlib.util
import inspect
import pathlib
import sys
import threading
import types
import warnings
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch

from tensorgate.errors import InternalError
from tensorgate.model import NO_PARAMETERS, Model, ModelContext, RequestInfo
from tensorgate.pipeline.input_bounds import (CompiledShapes, program_shapes, size_range,
                                              user_input_values)
from tensorgate.pipeline.torch_io import Argument, as_strings, input_order, output_positions
from tensorgate.pipeline.triton_python import TritonPythonRunner, install_module
from tensorgate.repository.model_config import ModelConfigError, ModelSpec
from tensorgate.repository.model_file import is_aoti_package, wrong_model_file
from tensorgate.repository.script_archive import load_script_module

__all__ = ["Runner", "import_model_file", "load_runner", "name_outputs"]

# torch 2.13 deprecates TorchScript, but existing Triton repositories are full of model.pt:
# loading them is this server's job, not the user's mistake, so say nothing per load.
warnings.filterwarnings("ignore", message=r"`torch\.jit\.load` is deprecated",
                        category=DeprecationWarning)


def name_outputs(raw: Any, spec: ModelSpec,
                 positions: Mapping[str, int] | None = None) -> dict[str, Any]:
    """The config's output names → the model's results: by name from a mapping; else from a
    tuple by `positions` (a TorchScript model's, pipeline/torch_io), or in config order (a
    stateful model's state outputs after them), one result per name."""
    names = [output.name for output in spec.model_outputs]
    if isinstance(raw, Mapping):
        missing = [n for n in names if n not in raw]
        if missing:
            raise InternalError(f"model '{spec.name}' returned outputs {sorted(raw)}; the config "
                                f"also names {missing}")
        return {n: raw[n] for n in names}
    values = [raw] if not isinstance(raw, (list, tuple)) else list(raw)
    if positions is not None:
        beyond = [n for n in names if positions[n] >= len(values)]
        if beyond:
            raise InternalError(f"model '{spec.name}' returned {len(values)} outputs; its config "
                                f"takes " + ", ".join(f"'{n}' from position {positions[n]}"
                                                      for n in beyond))
        return {n: values[positions[n]] for n in names}
    if len(values) != len(names):
        raise InternalError(f"model '{spec.name}' returned {len(values)} outputs; its config "
                            f"names {len(names)}: {', '.join(names)}")
    return dict(zip(names, values))


class Runner:
    """`run(inputs)` on the executor; `postprocess(raw)` wherever the pipeline puts it."""

    def __init__(self, forward: Callable[..., Any],
                 postprocess: Callable[[Any], Any] | None, module: torch.nn.Module | None,
                 *, stateless: Callable[[], bool] | None = None, takes_requests: bool = False,
                 requests: TritonPythonRunner | None = None,
                 output_positions: dict[str, int] | None = None) -> None:
        self.run = forward
        # Where each output is in the tuple the model returns (TorchScript and torch.export:
        # Triton's PyTorch-backend rules); None: config order, one result per output.
        self.output_positions = output_positions
        # A model that takes requests one by one, answering each with its outputs by name or
        # an error of its own (a Triton Python-backend model): the executor hands it the
        # requests ungathered, and calls its `close` when the instance stops.
        self.requests = requests
        # run(inputs, requests): a Python model whose preprocess reads its requests
        self.takes_requests = takes_requests
        self.postprocess = postprocess
        self.module = module  # for CUDA-graph capture and device moves; None for Python models
        # True when two threads may run `run` at once without the GIL and without touching
        # shared state: a TorchScript module in eval mode whose forward assigns no attribute
        # (_sets_attributes), once `decide_sharing` has asked `stateless`. A Python model may
        # keep state.
        self.shareable = False
        self._stateless = stateless
        # What a torch.export program's inputs take (input_bounds.py)
        self.shapes: CompiledShapes | None = None

    def decide_sharing(self) -> None:
        """Decide `shareable`; the executor calls it after the warm-up. A TorchScript module
        read from a file compiles each method the first time it is used: its first forward
        compiles them with the GIL let go, where reading the graph first compiled them
        holding it (the built-in ResNet-50 held every other thread 40 ms; 3-4 ms after a
        forward: bench/reload_stall_bench.py)."""
        if self._stateless is not None:
            self.shareable, self._stateless = self._stateless(), None


def _positional(call: Callable[..., Any], spec: ModelSpec, arguments: Sequence[Argument] | None,
                source: pathlib.Path, *,
                strings: bool = False) -> Callable[[dict[str, torch.Tensor]], Any]:
    """`call` with the inputs as positional arguments; with `strings`, each BYTES input as a
    `List[str]` (TorchScript's type for it) and a lone `List[str]` result as one output."""
    names = input_order(spec, arguments, str(source))
    texts = {i.name for i in spec.model_inputs if i.datatype.is_bytes} if strings else set()
    lone_strings = strings and _returns_strings(call)
    if not texts and not lone_strings:
        def forward(inputs: dict[str, torch.Tensor]) -> Any:
            return call(*[inputs[n] for n in names])
        return forward
    converters = [as_strings if n in texts else None for n in names]

    def forward_strings(inputs: dict[str, Any]) -> Any:
        result = call(*[inputs[n] if convert is None else convert(inputs[n])
                        for n, convert in zip(names, converters)])
        return (result,) if lone_strings else result
    return forward_strings


def _returns_strings(forward: Any) -> bool:
    """Whether a TorchScript forward returns one `List[str]` (not a tuple of them)."""
    returns = forward.schema.returns
    return len(returns) == 1 and str(returns[0].type) == "List[str]"


def _script_arguments(module: Any) -> list[Any]:
    """A TorchScript module's forward arguments after `self` (schema `Argument`s)."""
    arguments = list(module.forward.schema.arguments)
    if arguments and arguments[0].type.kind() == "ClassType":
        arguments = arguments[1:]
    return arguments


def _load_torchscript(path: pathlib.Path, spec: ModelSpec, device: torch.device) -> Runner:
    try:
        module = load_script_module(path, device)
    except RuntimeError as error:  # torch.save's files read as "corrupted": say what it is
        wrong = wrong_model_file(path, "torchscript")
        if wrong is None:
            raise
        raise ModelConfigError(str(path), wrong) from error
    module.eval()
    arguments = _script_arguments(module)
    positions = output_positions(spec)
    # The module's forward, called as a method: nn.Module.__call__'s hook checks in front of
    # it cost 5 µs a batch on a cold cache, and a TorchScript module has no Python hooks
    forward = module.forward

    def stateless() -> bool:  # asked once the warm-up ran (Runner.decide_sharing)
        return not _sets_attributes(module)

    if len(arguments) == 1 and arguments[0].type.kind() == "DictType":
        def by_dict(inputs: dict[str, torch.Tensor]) -> Any:
            return forward(inputs)  # forward(self, inputs: Dict[str, Tensor]): names as keys
        return Runner(by_dict, None, module, stateless=stateless,
                      output_positions=positions)
    names = [Argument(a.name, a.has_default_value(), str(a.type) == "List[str]")
             for a in arguments]
    return Runner(_positional(forward, spec, names, path, strings=True), None, module,
                  stateless=stateless, output_positions=positions)


def _sets_attributes(module: Any) -> bool:
    """Whether a TorchScript module's forward, the methods it calls inlined, assigns an
    attribute (`self.cache = ...`): state kept across calls, which two threads running the
    module at once would race on (a slot written twice at once can free its old value
    twice), so its instances each keep their own copy. An attribute tensor changed in place
    is not looked for: BatchNorm's forward holds one such change in a branch only training
    takes, and every scripted network would look stateful. Unknown (a graph that cannot be
    read): stateful."""
    try:
        graph = module.forward.graph.copy()
        torch._C._jit_pass_inline(graph)
        return bool(graph.findAllNodes("prim::SetAttr", True))
    except Exception:  # noqa: BLE001 - a module we cannot read is not shared
        return True


# torch.export.load keeps the deserializer it is using in a global while it runs, and a
# second load meanwhile fails ("_CURRENT_DESERIALIZER is already set"): two exported models
# of one repository, loaded by their executors at once, failed one of them at every start.
_EXPORT_LOAD = threading.Lock()


def _load_pt2(path: pathlib.Path, spec: ModelSpec, device: torch.device) -> Runner:
    # A package is told by its listing and loaded as one: torch.export.load, given one,
    # first probes the CPU's vector instructions with the C++ compiler, and where there is
    # none (deploy/Dockerfile's image) logs a traceback of some 50 lines and asks to
    # "regenerate your package" before failing.
    if is_aoti_package(path):
        return _load_package(path, spec, None)
    try:
        with _EXPORT_LOAD:
            program = torch.export.load(str(path))
    except Exception as export_error:  # not an ExportedProgram: try an AOTInductor package
        return _load_package(path, spec, export_error)
    _check_batch_range(program, spec, path)
    module = program.module().to(device)
    arguments = _python_arguments(module.forward)
    runner = Runner(_positional(module, spec, arguments, path), None, module,
                    output_positions=output_positions(spec))
    runner.shapes = program_shapes(program, input_order(spec, arguments, str(path)))
    return runner


def _load_package(path: pathlib.Path, spec: ModelSpec, export_error: Exception | None
                  ) -> Runner:
    """An AOTInductor package's runner; ModelConfigError saying what the file is when it is
    not one (with why torch.export.load refused it, where that was tried)."""
    try:
        from torch._inductor import aoti_load_package
        compiled = aoti_load_package(str(path))
    except Exception as error:
        if export_error is None:
            raise ModelConfigError(str(path), f"an AOTInductor package that does not load: "
                                              f"{error}") from None
        wrong = wrong_model_file(path, "pt2")
        raise ModelConfigError(str(path), wrong or f"neither a torch.export program nor an "
                                                   f"AOTInductor package: {export_error}"
                               ) from None
    return Runner(_positional(compiled, spec, None, path), None, None,
                  output_positions=output_positions(spec))


def _check_batch_range(program: Any, spec: ModelSpec, path: pathlib.Path) -> None:
    """Refuse a program whose batch dim cannot take every batch the batcher makes (1 to
    max_batch_size rows): its guards would fail whole gathered batches under load, though
    each request alone passed ("Guard failed: input.size()[0] <= 4" for a batch of 6, every
    request of it answered with that). A lower bound of 2 is torch's 0/1 specialization
    (Dim.AUTO / Dim.DYNAMIC), and its program takes 1 row."""
    if spec.max_batch_size == 0 or spec.ragged_inputs:  # ragged: RaggedLimits bound batches
        return
    rows = _first_batch_dim(program)
    if rows is None:
        return
    low, high = rows
    fix = (f"export it with torch.export.Dim('batch', min=1, max={spec.max_batch_size}) for "
           f"its batch dim")
    if low == high and low != 1:
        raise ModelConfigError(str(path), f"the exported program takes batches of exactly "
                                          f"{low} rows, and the batcher makes batches of any "
                                          f"size from 1 to max_batch_size "
                                          f"{spec.max_batch_size}: {fix}")
    if high is not None and high < spec.max_batch_size:
        raise ModelConfigError(str(path), f"the exported program takes batches of at most "
                                          f"{high} row{'s' if high > 1 else ''}, and "
                                          f"max_batch_size is {spec.max_batch_size}: set "
                                          f"max_batch_size to {high}"
                                          f"{' or less' if high > 1 else ''}, or {fix}")
    if low > 2:
        raise ModelConfigError(str(path), f"the exported program takes batches of at least "
                                          f"{low} rows, and the batcher makes batches from 1 "
                                          f"row: {fix}")


def _first_batch_dim(program: Any) -> tuple[int, int | None] | None:
    """(fewest, most) rows the program's first input takes in its dim 0 (most None: no
    bound); None where it has no such input."""
    values = user_input_values(program)
    if not values or not isinstance(values[0], torch.Tensor) or values[0].dim() == 0:
        return None
    return size_range(program, values[0].shape[0])


def _python_arguments(function: Callable[..., Any]) -> list[Argument] | None:
    """A Python callable's parameters, or None where `*args` / `**kwargs` hide them."""
    parameters = inspect.signature(function).parameters.values()
    if any(p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD) for p in parameters):
        return None
    return [Argument(p.name, p.default is not p.empty) for p in parameters]


def import_model_file(path: pathlib.Path, module_name: str) -> types.ModuleType:
    """Run `path` (a model.py) as module `module_name`, registered in sys.modules (its
    classes' pickling and dataclasses look there), with `triton_python_backend_utils`
    importable."""
    loader_spec = importlib.util.spec_from_file_location(module_name, path)
    if loader_spec is None or loader_spec.loader is None:
        raise ModelConfigError(str(path), "cannot be imported")
    module = importlib.util.module_from_spec(loader_spec)
    sys.modules[module_name] = module
    install_module()  # before the model's own `import triton_python_backend_utils`
    loader_spec.loader.exec_module(module)
    return module


def _load_python(path: pathlib.Path, spec: ModelSpec, context: ModelContext) -> Runner:
    module_name = f"tensorgate_model_{spec.name}_{context.version}"
    module = import_model_file(path, module_name)
    classes = [obj for obj in vars(module).values()
               if isinstance(obj, type) and issubclass(obj, Model) and obj is not Model
               and obj.__module__ == module_name]
    triton_class = getattr(module, "TritonPythonModel", None)
    if not classes and isinstance(triton_class, type):  # Triton's Python backend's API
        adapter = TritonPythonRunner(triton_class, spec, context)
        return Runner(adapter.run, None, None, requests=adapter)
    if len(classes) != 1:
        found = ", ".join(c.__name__ for c in classes) or "none"
        raise ModelConfigError(str(path), f"must define exactly one tensorgate.Model subclass "
                                          f"or a class TritonPythonModel; found {found}")
    model = classes[0]()
    model.setup(context)
    overridden = type(model).postprocess is not Model.postprocess
    postprocess = model.postprocess if overridden else None
    if type(model).preprocess is Model.preprocess or not _takes_requests(model.preprocess):
        def forward(inputs: dict[str, torch.Tensor]) -> Any:
            return model.forward(model.preprocess(inputs))
        return Runner(forward, postprocess, None)

    batched = spec.max_batch_size > 0

    def forward_requests(inputs: dict[str, torch.Tensor],
                         requests: Sequence[RequestInfo] | None = None) -> Any:
        if requests is None:  # a warm-up run: one request without parameters
            rows = next((len(v) for v in inputs.values()), 1) if batched else 1
            requests = (RequestInfo("", slice(0, rows), NO_PARAMETERS),)
        return model.forward(model.preprocess(inputs, requests))
    return Runner(forward_requests, postprocess, None, takes_requests=True)


def _takes_requests(preprocess: Callable[..., Any]) -> bool:
    """Whether a bound `preprocess` takes a second positional argument (the requests)."""
    positional = 0
    for parameter in inspect.signature(preprocess).parameters.values():
        if parameter.kind is inspect.Parameter.VAR_POSITIONAL:
            return True
        if parameter.kind in (inspect.Parameter.POSITIONAL_ONLY,
                              inspect.Parameter.POSITIONAL_OR_KEYWORD):
            positional += 1
    return positional >= 2


def load_runner(path: pathlib.Path, kind: str, spec: ModelSpec, context: ModelContext) -> Runner:
    """Load `path` as `kind` for `context.device`. Call on the executor thread only."""
    if kind == "torchscript":
        return _load_torchscript(path, spec, context.device)
    if kind == "pt2":
        return _load_pt2(path, spec, context.device)
    if kind == "python":
        return _load_python(path, spec, context)
    raise ModelConfigError(str(path), f"unknown artifact kind '{kind}'")
