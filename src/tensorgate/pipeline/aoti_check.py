"""Whether an AOTInductor package can serve what its config lets in, checked before it loads.

An AOTInductor package runs its compiled code on whatever tensors it is given: its own
checks of sizes, strides and dtypes run only in a process started with
AOTI_RUNTIME_CHECK_INPUTS=1 (PyTorch's default is off). Unchecked, code compiled for one
shape reads another as if it were that one. Measured here: a Linear+ReLU package compiled for
exactly 2 rows, given 3, answered 3 rows from kernels sized for 2; one compiled for 1 row,
served with max_batch_size 8, failed every batch the batcher gathered (its answer kept 1 row);
a config's dims [9] where the package takes [8] failed its warm-up in the words of an op
deep inside ("mat1 and mat2 shapes cannot be multiplied"). Given fewer rows than its fixed
size, compiled code's fixed loops would read past the input.

So before a package serves, a child process with the checks on (aoti_child.py) is given
zeros shaped as the config says, 1 row and 2 (contiguous: run where taken), then
max_batch_size rows (a meta tensor: its sizes and strides are checked before its device, so
nothing is computed or allocated). A refusal that names a dimension the config fixes, a
dtype, a stride (a channels-last export) or the number of inputs fails the load, saying what
to change; the batch sizes the refusals name are held against max_batch_size. The server's
own copy then runs unchecked, as PyTorch runs it: the checks cost nothing per batch.

Inductor compiles a dynamic batch dim for 2 rows or more (0/1 specialization) even where the
export said `Dim("batch", min=1)`, whose program takes 1 row; its code is sized by the row
count, so such a package serves a batch of 1 as PyTorch runs it by default. A package whose
batch dim starts above 2, or is fixed at more than one row, cannot serve a batch of 1 and is
refused.

A dim the config leaves variable (-1) is only as free as the package's code: a package
compiled with a sequence dim of at most 64 was exported to take no more, and one compiled for
exactly 16 answered a request of 1 with 16 rows, 15 of them read past the input (measured
here; unchecked, what lies past it may be another request's bytes). Dims of one symbol
(input_ids and a mask of one length, edges of one more) are sized from the first's size: a
shorter mask was read past. So the child first learns each such dim's range from the checks'
refusals, and how dims are sized from one another (a*s + b), and input_bounds.py holds
requests to them (an input's dims as the model takes it: reshaped, where its config says
so). A package whose dims are related otherwise (a product of two) is refused: its sizes
could not be checked. A ragged input's flat dim (its requests' elements end to end) is
learned as any other, its ties by runs given the batch inputs the server would make for
each size tried; a batch input's count, its range alone: they bound the batches the
scheduler forms (input_bounds.py, RaggedLimits).
"""

from __future__ import annotations

import json
import logging
import os
import pathlib
import signal
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from typing import Any

import torch

from tensorgate.pipeline.aoti_child import ANSWER, BOUNDS, SIZE, TOO_SMALL, first_line
from tensorgate.pipeline.input_bounds import CompiledShapes, bounded_spec
from tensorgate.pipeline.made_inputs import warmup_inputs, zeros_refused
from tensorgate.pipeline.torch_io import input_order
from tensorgate.repository.model_config import ModelConfigError, ModelSpec, TiedDim

__all__ = ["check_aoti_package"]

log = logging.getLogger("tensorgate.engine")

CHECK_TIMEOUT_S = 300.0  # the child imports torch and loads the package: seconds, not minutes
_CHECKS_ON = "AOTI_RUNTIME_CHECK_INPUTS"
_CHILD = pathlib.Path(__file__).with_name("aoti_child.py")  # run as a file: torch, no more


def unpack_refusal() -> str | None:
    """Why no AOTInductor package can load here, or None: torch unpacks a package's compiled
    code into the temporary directory (TMPDIR, else /tmp) and maps it to run it, which a
    directory mounted noexec refuses ("failed to map segment from shared object", deep in
    the checking child's error). Docker's `--tmpfs /tmp` is noexec unless told `:exec`."""
    folder = tempfile.gettempdir()
    try:
        flags = os.statvfs(folder).f_flag
    except OSError:
        return None  # the loader's own error will say
    if flags & os.ST_NOEXEC:
        return (f"AOTInductor packages unpack their compiled code into the temporary "
                f"directory {folder} (TMPDIR) to run it, and it is mounted noexec: mount it "
                f"exec (docker run --tmpfs /tmp:exec) or set TMPDIR to a directory that is")
    return None


@dataclass(frozen=True)
class _Input:
    name: str
    dtype: str              # torch's name: "float32"
    shape: list[int]        # as the model takes it, variable dims as 1
    variable: list[bool]    # per dim: the config leaves it free (or it is the batch dim)
    # the variable dims of a client's input (as the model takes it) whose range and ties
    # the child learns: a ragged input's flat dim too
    probe: tuple[int, ...] = ()
    bound: tuple[int, ...] = ()  # dims whose range alone it learns (a batch input's count)
    ragged: bool = False
    made: dict[str, Any] | None = None  # a batch input: how the server makes it (the child)


def check_aoti_package(path: pathlib.Path, spec: ModelSpec, device: torch.device
                       ) -> ModelSpec:
    """Refuse (ModelConfigError) a package on `device` that cannot serve what `spec` lets
    in; else `spec`, its inputs bounded where the package's code bounds a variable dim.
    Runs a child process: call it off the event loop."""
    refusal = unpack_refusal()
    if refusal is not None:
        raise ModelConfigError(str(path), refusal)
    inputs = warmup_inputs(spec, 1, torch.device("meta"))  # shapes and dtypes, no memory
    if inputs is None:
        log.warning("%s: the AOTInductor package's input ranges are not checked: %s", path,
                    zeros_refused(spec, 1))
        return spec
    batched = spec.max_batch_size > 0
    order = input_order(spec, None, str(path))
    given = [_described(name, inputs[name], spec, batched, order) for name in order]
    if len(spec.ragged_inputs) > 1 and not _makeable(spec):
        log.warning("%s: how the AOTInductor package sizes its ragged inputs %s from one "
                    "another is not learned (a batch input's ragged source has more than one "
                    "dim a request, whose elements cannot be shared out into requests of any "
                    "size): a request whose ragged inputs disagree is not refused", path,
                    ", ".join(f"'{name}'" for name in order if name in spec.ragged_inputs))
    # (rows, as a view): 1 row and 2 of zeros, run where taken; then max_batch_size rows
    # as a meta tensor, whose sizes are checked and nothing run
    tries = [(1, False)] + ([(2, False)] if batched else [])
    if spec.max_batch_size > 2:
        tries.append((spec.max_batch_size, True))
    made = {rows: _batch_input_values(spec, rows) for rows, view in tries if not view}
    shapes, answers = _ask_child(path, device, min(spec.max_batch_size, 2), given,
                                 [(rows, view, made.get(rows, {})) for rows, view in tries])
    warned: set[str] = set()
    for (rows, view), answer in zip(tries, answers):
        if answer is not None:
            _judge(str(path), spec, given, answer, rows, view, warned)
    if shapes is None:
        return spec
    if isinstance(shapes["ties"], str):
        probed = [f"dim {dim} of '{item.name}'" for item in given for dim in item.probe]
        raise ModelConfigError(str(path), "the AOTInductor package sizes the variable dims of "
                                          f"its inputs ({', '.join(probed)}) from one another "
                                          f"in a way not learned here ({shapes['ties']}), so "
                                          "a request's sizes could not be checked, and "
                                          "unchecked sizes are read past: give those dims "
                                          "fixed sizes in the config")
    return bounded_spec(str(path), spec, "the AOTInductor package", CompiledShapes(
        {item.name: [(dim["dim"], dim["low"], dim["high"]) for dim in found]
         for item, found in zip(given, shapes["ranges"])},
        [[TiedDim(given[index].name, dim, a, b) for index, dim, a, b in group]
         for group in shapes["ties"]]))


def _batch_input_values(spec: ModelSpec, rows: int) -> dict[str, dict[str, Any]]:
    """The batch inputs a ragged model gets with one request of `rows` rows of zeros, as the
    server makes them ({"shape", "values"} by name): their values mean something (where
    each request ends), and zeros there made a package index past its input."""
    targets = {item.target for item in spec.batch_inputs}
    inputs = warmup_inputs(spec, rows, torch.device("cpu")) if targets else None
    return {name: {"shape": list(value.shape), "values": value.flatten().tolist()}
            for name, value in (inputs or {}).items() if name in targets}


def _described(name: str, zeros: torch.Tensor, spec: ModelSpec, batched: bool,
               order: tuple[str, ...]) -> _Input:
    config = next((t for t in spec.model_inputs if t.name == name), None)
    dims = list(config.reshape or config.dims) if config is not None else []
    variable = ([True] if batched else []) + [d == -1 for d in dims]
    if config is None or len(variable) != zeros.dim():  # computed by the server: not checked
        variable = [True] * zeros.dim()
    probe: tuple[int, ...] = ()
    bound: tuple[int, ...] = ()
    made = None
    batch_input = next((b for b in spec.batch_inputs if b.target == name), None)
    if config is not None and config.ragged:
        # its elements end to end: ties are learned only where the child can make the batch
        # inputs for any count of them (a source of one dim per request: see `_makeable`)
        probe, bound = ((0,), ()) if _makeable(spec) else ((), (0,))
    elif spec.input(name) is not None and config is not None:
        probe = tuple(d for d, free in enumerate(variable) if free and not (batched and d == 0))
    elif batch_input is not None:
        bound = (0,)
        source = spec.input(batch_input.source)
        made = {"kind": batch_input.kind, "source": order.index(batch_input.source),
                "ragged": source is not None and source.ragged}
    return _Input(name, str(zeros.dtype).removeprefix("torch."), list(zeros.shape), variable,
                  probe, bound, config is not None and config.ragged, made)


def _makeable(spec: ModelSpec) -> bool:
    """Whether each batch input whose source is ragged can be made for any count of its
    source's elements shared out between requests: a source of one dim per request."""
    return all(source is None or not source.ragged or len(source.dims) == 1
               for source in (spec.input(b.source) for b in spec.batch_inputs))


def _judge(where: str, spec: ModelSpec, given: list[_Input], error: str, rows: int,
           view: bool, warned: set[str]) -> None:
    """Refuse the load for the package's refusal of `rows` rows, unless it is one the
    server never asks of it. A meta `view` is refused anyway: only its sizes count."""
    size = SIZE.search(error)
    if size is None:  # a dtype, a stride, the number of inputs, the device: the config's fault
        if view:
            return
        raise ModelConfigError(where, "the AOTInductor package refuses zeros shaped as the "
                                      f"config says ({_shapes(given)}): {first_line(error)}")
    index, kind, dim, bound = int(size[1]), size[2], int(size[3]), int(size[4])
    name = given[index].name if index < len(given) else ""
    config = spec.input(name)
    if (config is not None and config.ragged) or \
            any(item.target == name for item in spec.batch_inputs):
        # counts, not rows: a ragged input's elements end to end, a batch input's requests
        if kind == TOO_SMALL and bound <= 2:
            return  # inductor's 0/1 specialization: its code takes 1
    elif spec.max_batch_size > 0 and dim == 0:  # the batch dim
        if rows > spec.max_batch_size:
            return  # never asked of it
        if kind == TOO_SMALL and rows == 1 and bound <= 2:
            return  # inductor's 0/1 specialization: see the module docstring
        if kind == "dim value is too large" or (kind == "unmatched dim value" and bound == 1):
            compiled = "exactly 1 row" if bound == 1 else f"at most {bound} rows"
            raise ModelConfigError(where, f"the AOTInductor package was compiled for batches "
                                          f"of {compiled}, and max_batch_size is "
                                          f"{spec.max_batch_size}: set max_batch_size to "
                                          f"{bound}{' or less' if bound > 1 else ''}, or "
                                          f"export it with a dynamic batch dim, "
                                          f"{_dynamic(spec)}")
        compiled = (f"at least {bound} rows" if kind == TOO_SMALL
                    else f"exactly {bound} rows")
        raise ModelConfigError(where, f"the AOTInductor package was compiled for batches of "
                                      f"{compiled}, and the batcher makes batches of any size "
                                      f"from 1 to max_batch_size {spec.max_batch_size}: export "
                                      f"it with a dynamic batch dim, {_dynamic(spec)}, or "
                                      "serve it with max_batch_size 0 and the batch in its dims")
    if view:
        return
    item = given[index] if index < len(given) else None
    if item is not None and dim < len(item.variable) and item.variable[dim]:
        if item.name not in warned:
            warned.add(item.name)
            log.warning("%s: dim %d of input '%s' is variable in the config, and the package "
                        "bounds it (%s); sizes outside are not checked here", where, dim,
                        item.name, first_line(error))
        return
    raise ModelConfigError(where, "the AOTInductor package refuses zeros shaped as the config "
                                  f"says ({_shapes(given)}): {first_line(error)}")


def _dynamic(spec: ModelSpec) -> str:
    return f"torch.export.Dim('batch', min=1, max={spec.max_batch_size})"


def _shapes(given: list[_Input]) -> str:
    return ", ".join(f"'{i.name}' {i.dtype} {i.shape}" for i in given)


def _ask_child(path: pathlib.Path, device: torch.device, probe_rows: int, given: list[_Input],
               tries: list[tuple[int, bool, dict[str, dict[str, Any]]]]
               ) -> tuple[dict[str, Any] | None, list[str | None]]:
    """The ranges of the dims `given` asks about and their ties (None: not learned; see
    aoti_child.py), and each try's refusal (None: it ran), from a child process with the
    checks on; `probe_rows`: the batch the child's probes use (0: not batched); each try:
    rows, as a view, and the inputs the server makes for it, by name."""
    order = {item.name: index for index, item in enumerate(given)}
    request = json.dumps({"path": str(path), "device": str(device),
                          "batched": probe_rows > 0, "rows": probe_rows,
                          "tries": [{"rows": rows, "view": view,
                                     "made": {str(order[name]): value
                                              for name, value in made.items() if name in order}}
                                    for rows, view, made in tries],
                          "inputs": [{"name": i.name, "dtype": i.dtype, "shape": i.shape,
                                      "probe": i.probe, "bound": i.bound, "ragged": i.ragged,
                                      "made": i.made} for i in given]})
    try:
        done = subprocess.run([sys.executable, str(_CHILD), request],
                              capture_output=True, text=True, timeout=CHECK_TIMEOUT_S,
                              env=dict(os.environ, **{_CHECKS_ON: "1"},
                                       PYTHONFAULTHANDLER="1"))  # a crash names its frame
    except subprocess.TimeoutExpired:
        raise ModelConfigError(str(path), f"checking the AOTInductor package's input ranges "
                                          f"took over {CHECK_TIMEOUT_S:g} s") from None
    lines = done.stdout.splitlines()
    answers: list[str | None] = [json.loads(line[len(ANSWER):])
                                 for line in lines if line.startswith(ANSWER)]
    if answers:
        shapes = next((json.loads(line[len(BOUNDS):]) for line in lines
                       if line.startswith(BOUNDS)), None)
        return shapes, answers
    raise ModelConfigError(str(path), f"the AOTInductor package could not be loaded to check "
                                      f"its input ranges ({_exit(done.returncode)}): "
                                      f"{_last_words(done.stderr)}")


def _exit(code: int) -> str:
    if code >= 0:
        return f"exit {code}"
    try:
        return f"killed by {signal.Signals(-code).name}"
    except ValueError:
        return f"killed by signal {-code}"


def _last_words(stderr: str) -> str:
    """What a failed child said last; for a crash (faulthandler's dump, innermost frame
    first), where in the child it was: the frame under 'most recent call first'."""
    lines = stderr.strip().splitlines()
    for index, line in enumerate(lines):
        if "most recent call first" in line and index + 1 < len(lines):
            return f"crashed at {lines[index + 1].strip()}"
    return lines[-1] if lines else "(nothing on stderr)"
