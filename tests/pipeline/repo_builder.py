"""Small real models written into a Triton-layout repository for the pipeline tests."""

from __future__ import annotations

import pathlib
import re
import textwrap

import torch

LINEAR_SEED = 0


def write_config(repo: pathlib.Path, name: str, text: str) -> pathlib.Path:
    folder = repo / name
    (folder / "1").mkdir(parents=True, exist_ok=True)
    (folder / "config.pbtxt").write_text(textwrap.dedent(text))
    return folder


def linear_module() -> torch.nn.Module:
    torch.manual_seed(LINEAR_SEED)
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))


class Sequences(torch.nn.Module):
    """x: [rows, sequence, 8], z: [rows, 4, 8], mask: [rows, sequence] -> [rows, 4]: inputs
    with a variable dim, a fixed one, and one of another input's size (input_bounds.py)."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(LINEAR_SEED)
        self.linear = torch.nn.Linear(8, 4)

    def forward(self, x: torch.Tensor, z: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        return (self.linear(x) * mask.unsqueeze(-1)).sum(1) + self.linear(z).sum(1)


def export_sequences(low: int, high: int) -> torch.export.ExportedProgram:
    """Sequences exported with x's sequence dim (and mask's: one symbol) from `low` to
    `high`, z's fixed at 4."""
    batch = torch.export.Dim("batch", min=1, max=8)
    sequence = torch.export.Dim("sequence", min=low, max=high)
    return torch.export.export(
        Sequences().eval(), (torch.randn(2, 5, 8), torch.randn(2, 4, 8), torch.ones(2, 5)),
        dynamic_shapes={"x": {0: batch, 1: sequence}, "z": {0: batch},
                        "mask": {0: batch, 1: sequence}})


def write_sequences_config(repo: pathlib.Path, platform: str, extra: str) -> pathlib.Path:
    """Model "sequences" (Sequences) with every non-batch dim -1: its folder."""
    return write_config(repo, "sequences", f"""
        name: "sequences"
        platform: "{platform}"
        max_batch_size: 8
        input [ {{ name: "x" data_type: TYPE_FP32 dims: [-1, 8] }},
                {{ name: "z" data_type: TYPE_FP32 dims: [-1, 8] }},
                {{ name: "mask" data_type: TYPE_FP32 dims: [-1] }} ]
        output [ {{ name: "y" data_type: TYPE_FP32 dims: [4] }} ]
        {extra}
        """)


def sequences_refusal(length: int, z_length: int, mask_length: int, low: int, high: int
                      ) -> list[str] | None:
    """The parts of the message a request to export_sequences(low, high) with these
    sequence lengths is refused with, or None where the model takes it. The inputs are
    checked in config order, then the dims they must share."""
    def outside(size: int) -> bool:
        return not low <= size <= high
    ranged = f"the model takes {low} to {high} in dim 1 (the sizes it was exported for)"
    if outside(length):
        return ["input 'x'", ranged]
    if z_length != 4:
        return ["input 'z'", "the model takes exactly 4 in dim 1"]
    if outside(mask_length):
        return ["input 'mask'", ranged]
    if mask_length != length:
        return [f"input 'mask' of model 'sequences' has {mask_length} in dim 1, and input 'x' "
                f"{length} in dim 1; the model takes one size in both"]
    return None


class Sized(torch.nn.Module):
    """x: [rows, s, 8], edges: [rows, s + 1], pairs: [rows, 2*s] -> [rows, 4]: inputs a
    model sizes from one s other than as equals (input_bounds.py)."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(LINEAR_SEED)
        self.linear = torch.nn.Linear(8, 4)

    def forward(self, x: torch.Tensor, edges: torch.Tensor, pairs: torch.Tensor
                ) -> torch.Tensor:
        return self.linear(x).sum(1) * (edges.sum(1, keepdim=True) + pairs.sum(1, keepdim=True))


def export_sized() -> torch.export.ExportedProgram:
    """Sized exported with s from 1 to 16 (edges s + 1, pairs 2*s: `Dim` arithmetic)."""
    batch = torch.export.Dim("batch", min=1, max=8)
    length = torch.export.Dim("length", min=1, max=16)
    return torch.export.export(
        Sized().eval(), (torch.randn(2, 5, 8), torch.randn(2, 6), torch.randn(2, 10)),
        dynamic_shapes={"x": {0: batch, 1: length}, "edges": {0: batch, 1: length + 1},
                        "pairs": {0: batch, 1: 2 * length}})


class PairsFirst(torch.nn.Module):
    """pairs: [rows, 2*s], x: [rows, s] -> [rows, 1]: the first input sized 2*s."""

    def forward(self, pairs: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        return pairs.sum(1, keepdim=True) + x.sum(1, keepdim=True)


def export_pairs_first(batched: bool) -> torch.export.ExportedProgram:
    """PairsFirst with s from 1 to 16; a batch dim from 1 to 8 where `batched`, else 1."""
    length = torch.export.Dim("length", min=1, max=16)
    batch = {0: torch.export.Dim("batch", min=1, max=8)} if batched else {}
    return torch.export.export(PairsFirst(), (torch.randn(2 if batched else 1, 10),
                                              torch.randn(2 if batched else 1, 5)),
                               dynamic_shapes={"pairs": {**batch, 1: 2 * length},
                                               "x": {**batch, 1: length}})


class Product(torch.nn.Module):
    """x [rows, s], w [rows, t], y [rows, s*t]: a dim sized from two others."""

    def forward(self, x: torch.Tensor, w: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        grid = y.view(y.shape[0], x.shape[1], w.shape[1]) * x.unsqueeze(-1) * w.unsqueeze(1)
        return grid.sum((1, 2)).unsqueeze(1)


def export_product() -> torch.export.ExportedProgram:
    """Product with every dim Dim.AUTO (y's dim 1 the product s*t)."""
    auto = torch.export.Dim.AUTO
    return torch.export.export(Product(), (torch.randn(2, 3), torch.randn(2, 5),
                                           torch.randn(2, 15)),
                               dynamic_shapes={name: {0: auto, 1: auto}
                                               for name in ("x", "w", "y")})


class RaggedWeighted(torch.nn.Module):
    """Ragged x and w of one length (their elements end to end), ENDS where each request
    ends: each request's sum of x * w, with tensor ops only (a package runs no Python
    loop)."""

    def forward(self, x: torch.Tensor, w: torch.Tensor, ends: torch.Tensor) -> torch.Tensor:
        owner = torch.searchsorted(ends.to(torch.int64), torch.arange(x.shape[0]), right=True)
        return torch.zeros(ends.shape[0], dtype=x.dtype).index_add(0, owner,
                                                                   x * w).unsqueeze(1)


class RaggedPairs(torch.nn.Module):
    """Ragged x of 2*n (pairs) and w of n, ENDS where each request's w ends: each request's
    sum of its pairs' sums times w."""

    def forward(self, x: torch.Tensor, w: torch.Tensor, ends: torch.Tensor) -> torch.Tensor:
        owner = torch.searchsorted(ends.to(torch.int64), torch.arange(w.shape[0]), right=True)
        pairs = x.view(-1, 2).sum(1) * w
        return torch.zeros(ends.shape[0], dtype=x.dtype).index_add(0, owner, pairs).unsqueeze(1)


def export_ragged(pairs: bool) -> torch.export.ExportedProgram:
    """RaggedPairs (`pairs`: x 2*n with n to 1000, ENDS of 1 to 3 requests) or
    RaggedWeighted (x and w of one n to 4096, ENDS of 1 to 8)."""
    n = torch.export.Dim("n", min=1, max=1000 if pairs else 4096)
    ends = torch.tensor([3, 7, 12], dtype=torch.int32)
    return torch.export.export(
        RaggedPairs() if pairs else RaggedWeighted(),
        (torch.randn(24 if pairs else 12), torch.randn(12), ends),
        dynamic_shapes={"x": {0: 2 * n if pairs else n}, "w": {0: n},
                        "ends": {0: torch.export.Dim("requests", min=1,
                                                     max=3 if pairs else 8)}})


def ragged_pairs_refusal(model: str, x: int, w: int, guarded: bool) -> str | None:
    """What RaggedPairs served as `model` refuses a request of x and w elements with; None
    where it is answered (4*w for x of ones and w of twos). `guarded`: the exported
    program, whose guard refuses n = 1 (learned at its warm-up); its package takes n = 1."""
    where = f"of model '{model}' has"
    exported = "(the sizes it was exported for)"
    if x > 2000:
        return (f"input 'x' {where} {x} elements; the model takes at most 2000 from a request "
                f"{exported}")
    if w > 1000:
        return (f"input 'w' {where} {w} elements; the model takes at most 1000 from a request "
                f"{exported}")
    for name, count, fewest in (("x", x, 4), ("w", w, 2)) if guarded else ():
        if count < fewest:
            return (f"input '{name}' {where} {count} elements; the model takes at least "
                    f"{fewest} from a request (the sizes it was exported for: fewer failed "
                    "its guard)")
    if x % 2:
        return (f"input 'x' {where} {x} elements; the model takes 2*n of them, for a whole n "
                f"{exported}")
    if w != x // 2:
        return (f"input 'w' {where} {w} elements, and input 'x' {x}; the model takes {x // 2} "
                f"there: it takes n elements of 'w' where it takes 2*n of 'x', for one n "
                f"{exported}")
    return None


def write_ragged_config(repo: pathlib.Path, name: str, platform: str, source: str
                        ) -> pathlib.Path:
    """Model `name` (RaggedWeighted or RaggedPairs) with ragged x and w and ENDS (as
    BATCH_ACCUMULATED_ELEMENT_COUNT of `source`): its folder. Batches form at once (no
    batch_cap's slow start) within 0.2 s."""
    return write_config(repo, name, f"""
        name: "{name}"
        platform: "{platform}"
        max_batch_size: 8
        input [ {{ name: "x" data_type: TYPE_FP32 dims: [-1] allow_ragged_batch: true }},
                {{ name: "w" data_type: TYPE_FP32 dims: [-1] allow_ragged_batch: true }} ]
        output [ {{ name: "SUM" data_type: TYPE_FP32 dims: [1] }} ]
        batch_input {{ kind: BATCH_ACCUMULATED_ELEMENT_COUNT target_name: "ends"
                       data_type: TYPE_INT32 source_input: "{source}" }}
        dynamic_batching {{ max_queue_delay_microseconds: 200000 }}
        parameters {{ key: "batch_cap" value {{ string_value: "off" }} }}
        """)


def write_sized_config(repo: pathlib.Path, name: str, platform: str, edges: str = "[-1]"
                       ) -> pathlib.Path:
    """Model `name` (Sized) with x [-1, 8], edges `edges`, pairs [-1]: its folder."""
    return write_config(repo, name, f"""
        name: "{name}"
        platform: "{platform}"
        max_batch_size: 8
        input [ {{ name: "x" data_type: TYPE_FP32 dims: [-1, 8] }},
                {{ name: "edges" data_type: TYPE_FP32 dims: {edges} }},
                {{ name: "pairs" data_type: TYPE_FP32 dims: [-1] }} ]
        output [ {{ name: "y" data_type: TYPE_FP32 dims: [4] }} ]
        dynamic_batching {{ max_queue_delay_microseconds: 2000 }}
        """)


def sized_refusal(length: int, edges: int, pairs: int, rows: int = 1) -> str | None:
    """The message a request to export_sized()'s model "sized" with these lengths (and
    rows) is refused with (ranges first, input by input, then the sizes s makes), or None
    where it is taken."""
    for name, size, low, high in (("x", length, 1, 16), ("edges", edges, 2, 17),
                                  ("pairs", pairs, 2, 32)):
        if not low <= size <= high:
            return (f"input '{name}' of model 'sized' has shape "
                    f"[{rows},{size}{',8' if name == 'x' else ''}]; the model takes {low} to "
                    f"{high} in dim 1 (the sizes it was exported for)")
    for name, size, taken, formula in (("edges", edges, length + 1, "s + 1"),
                                       ("pairs", pairs, 2 * length, "2*s")):
        if size != taken:
            return (f"input '{name}' of model 'sized' has {size} in dim 1, and input 'x' "
                    f"{length} in dim 1; the model takes {taken} there: it sizes dim 1 of "
                    f"'x' as s and dim 1 of '{name}' as {formula}, for one s (the sizes it "
                    "was exported for)")
    return None


class Identity(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x


class Failing(torch.nn.Module):
    """Raises when any input is negative: lets a test fail one batch on purpose."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if bool((x < 0).any()):
            raise RuntimeError("negative input")
        return x + 1


def add_torchscript(repo: pathlib.Path, name: str, module: torch.nn.Module, dims: list[int],
                    out_dims: list[int], batching: str = "", max_batch: int = 8,
                    extra: str = "") -> None:
    folder = write_config(repo, name, f"""
        name: "{name}"
        platform: "pytorch_libtorch"
        max_batch_size: {max_batch}
        input [ {{ name: "INPUT__0" data_type: TYPE_FP32 dims: {dims} }} ]
        output [ {{ name: "OUTPUT__0" data_type: TYPE_FP32 dims: {out_dims} }} ]
        {batching}
        {extra}
        """)
    torch.jit.script(module.eval()).save(str(folder / "1" / "model.pt"))


def add_exported(repo: pathlib.Path, name: str, module: torch.nn.Module, batching: str = "") -> None:
    folder = write_config(repo, name, f"""
        name: "{name}"
        platform: "torch_aoti"
        max_batch_size: 8
        input [ {{ name: "x" data_type: TYPE_FP32 dims: [8] }} ]
        output [ {{ name: "y" data_type: TYPE_FP32 dims: [4] }} ]
        {batching}
        """)
    batch = torch.export.Dim("batch", min=1, max=8)
    program = torch.export.export(module.eval(), (torch.randn(2, 8),),
                                  dynamic_shapes={"input": {0: batch}})
    torch.export.save(program, str(folder / "1" / "model.pt2"))


PYTHON_MODEL = '''
import time

import torch

from tensorgate import Model


class Scaled(Model):
    """Doubles its input after an optional sleep of delay_s × rows ** delay_power; postprocess
    adds one."""

    def setup(self, context):
        self.delay = float(context.parameters.get("delay_s", "0"))
        self.power = float(context.parameters.get("delay_power", "0"))
        self.scale = context.load_weights("scale.pt")["scale"]

    def preprocess(self, inputs):
        return inputs["INPUT__0"]

    def forward(self, batch):
        if self.delay:
            time.sleep(self.delay * batch.shape[0] ** self.power)
        return batch * self.scale

    def postprocess(self, outputs):
        return {"OUTPUT__0": outputs + 1}
'''


def add_python(repo: pathlib.Path, name: str, batching: str = "", delay_s: float = 0.0,
               max_batch: int = 8, delay_power: float = 0.0, extra: str = "") -> None:
    folder = write_config(repo, name, f"""
        name: "{name}"
        backend: "python"
        max_batch_size: {max_batch}
        input [ {{ name: "INPUT__0" data_type: TYPE_FP32 dims: [4] }} ]
        output [ {{ name: "OUTPUT__0" data_type: TYPE_FP32 dims: [4] }} ]
        {batching}
        parameters {{ key: "delay_s" value {{ string_value: "{delay_s}" }} }}
        parameters {{ key: "delay_power" value {{ string_value: "{delay_power}" }} }}
        {extra}
        """)
    (folder / "1" / "model.py").write_text(PYTHON_MODEL)
    torch.save({"scale": torch.tensor(2.0)}, folder / "1" / "scale.pt")


def add_decoupled_int32(repo: pathlib.Path, name: str, source: str) -> None:
    """A decoupled Triton Python model `name`, IN and OUT INT32 [1], without batching;
    `source` is its model.py."""
    folder = write_config(repo, name, f"""
        name: "{name}"
        backend: "python"
        max_batch_size: 0
        model_transaction_policy {{ decoupled: true }}
        input [ {{ name: "IN" data_type: TYPE_INT32 dims: [1] }} ]
        output [ {{ name: "OUT" data_type: TYPE_INT32 dims: [1] }} ]
        """)
    (folder / "1" / "model.py").write_text(source)


GATED_SENDER = '''
import threading

import numpy as np
import triton_python_backend_utils as pb_utils

GO = threading.Event()
STARTED = []  # a None a request whose thread waits (not its sender: that would keep it)


class TritonPythonModel:
    def execute(self, requests):
        for request in requests:
            sender = request.get_response_sender()
            threading.Thread(target=self._answer, args=(sender,), daemon=True).start()
        return None

    def _answer(self, sender):
        STARTED.append(None)
        GO.wait(10)
'''


def add_gated_sender(repo: pathlib.Path, name: str, send: str) -> None:
    """A decoupled Triton Python model `name` (add_decoupled_int32) whose requests each get
    a thread of the model's own, counted in its module's STARTED, which waits for its GO
    event and then runs `send` (code that sends with `sender`)."""
    add_decoupled_int32(repo, name, GATED_SENDER + textwrap.indent(textwrap.dedent(send),
                                                                    " " * 8))


def add_named_config(folder: pathlib.Path, name: str, max_batch: int) -> pathlib.Path:
    """configs/<name>.pbtxt (--model-config-name): the folder's config.pbtxt with another
    max_batch_size."""
    text = (folder / "config.pbtxt").read_text()
    (folder / "configs").mkdir(exist_ok=True)
    path = folder / "configs" / f"{name}.pbtxt"
    path.write_text(re.sub(r"max_batch_size: \d+", f"max_batch_size: {max_batch}", text))
    return path


class Heavy(torch.nn.Module):
    """About 2 ms of matrix work per [64, 256] row on one thread (0.13 ms a round, 16 rounds
    by default): a "heavy" model to the placement code (LIGHT_FORWARD_NS is 0.5 ms), small
    enough for a test."""

    def __init__(self, rounds: int = 16) -> None:
        super().__init__()
        generator = torch.Generator().manual_seed(0)
        self.weight = torch.nn.Parameter(torch.randn(256, 256, generator=generator) * 0.06)
        self.rounds = rounds

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for _ in range(self.rounds):
            x = torch.tanh(x @ self.weight)
        return x


COUNTER = '''
import time

import torch

from tensorgate import Model


class Counter(Model):
    """For an input whose first value is n, yields n responses, the k-th all k. A negative
    n raises after the first response. `made` counts responses made, for the tests."""

    made = 0

    def setup(self, context):
        self.delay = float(context.parameters.get("delay_s", "0"))

    def forward(self, inputs):
        x = inputs["INPUT__0"]
        count = int(x.flatten()[0].item())
        for k in range(abs(count)):
            if count < 0 and k == 1:
                raise ValueError("stopped after one response")
            if self.delay:
                time.sleep(self.delay)
            Counter.made += 1
            yield {"OUTPUT__0": torch.full_like(x, float(k))}
'''


def add_counter(repo: pathlib.Path, name: str, delay_s: float = 0.0,
                 extra: str = "") -> None:
    """A decoupled Python model: see COUNTER."""
    folder = write_config(repo, name, f"""
        name: "{name}"
        backend: "python"
        max_batch_size: 4
        input [ {{ name: "INPUT__0" data_type: TYPE_FP32 dims: [4] }} ]
        output [ {{ name: "OUTPUT__0" data_type: TYPE_FP32 dims: [4] }} ]
        dynamic_batching {{ }}
        model_transaction_policy {{ decoupled: true }}
        parameters {{ key: "delay_s" value {{ string_value: "{delay_s}" }} }}
        {extra}
        """)
    (folder / "1" / "model.py").write_text(COUNTER)


WORDS = '''
import time

import numpy as np

from tensorgate import Model


class Words(Model):
    """A decoupled text model, as a token streamer is: for a text, yields each of its words in
    capitals as `text_output`, one response each, after `delay_s`, at most `max_tokens` (a
    request parameter) of them; each response's parameter "index" is its word's place, and
    the last word's response also has "finish_reason" ("length": cut at max_tokens, else
    "stop"). The word "boom" raises; "forever" yields "forever" until the client leaves."""

    def setup(self, context):
        self.delay = float(context.parameters.get("delay_s", "0"))

    def preprocess(self, inputs, requests):
        limit = requests[0].parameters.get("max_tokens", -1)
        return inputs["text_input"].reshape(-1)[0].decode(), limit, requests[0]

    def forward(self, batch):
        text, limit, request = batch
        words = text.split()
        index = 0
        while words and limit != 0:
            limit -= 1
            word = words.pop(0)
            request.response_parameters["index"] = index
            index += 1
            if not words or limit == 0:
                request.response_parameters["finish_reason"] = "stop" if not words else "length"
            if word == "boom":
                raise ValueError("boom")
            if word == "forever":
                words.append(word)
            if self.delay:
                time.sleep(self.delay)
            yield {"text_output": np.array([[word.upper().encode()]], dtype=object)}
'''

SHOUT = '''
import numpy as np

from tensorgate import Model


class Shout(Model):
    """A batched text model: `text_input` in capitals as `text_output`, and its length."""

    def forward(self, inputs):
        texts = [t.decode() for t in inputs["text_input"].reshape(-1)]
        return {"text_output": np.array([[t.upper().encode()] for t in texts], dtype=object),
                "length": np.array([[len(t)] for t in texts], dtype=np.int32)}
'''


PARAMS = '''
import json

import numpy as np

from tensorgate import Model


class Params(Model):
    """Answers each row of its batch with what that row's request carried, as JSON: its id,
    its rows of the batch, its parameters, and how many requests the batch held. A request
    with an "echo" parameter gets it back, and its row count, as response parameters; one
    with "answer_badly" gets a response parameter no response can carry."""

    def preprocess(self, inputs, requests):
        rows = []
        for request in requests:
            if "echo" in request.parameters:
                request.response_parameters["echo"] = request.parameters["echo"]
                request.response_parameters["rows"] = request.rows.stop - request.rows.start
            if "answer_badly" in request.parameters:
                request.response_parameters["bad"] = [1, 2]
            seen = json.dumps({"id": request.id, "rows": [request.rows.start, request.rows.stop],
                               "parameters": dict(request.parameters),
                               "requests": len(requests)}, sort_keys=True).encode()
            rows += [[seen]] * (request.rows.stop - request.rows.start)
        return np.array(rows, dtype=object)

    def forward(self, batch):
        return {"SEEN": batch}
'''


def add_params_model(repo: pathlib.Path, name: str, extra: str = "") -> None:
    """A batched Python model (PARAMS) that answers with what each request's parameters
    were; requests wait up to 0.5 s to batch, or until 8 rows fill a batch (no measured
    batch cap: batches would start at one row until a few had shown what a row costs)."""
    folder = write_config(repo, name, f"""
        name: "{name}"
        backend: "python"
        max_batch_size: 8
        input [ {{ name: "INPUT" data_type: TYPE_FP32 dims: [1] }} ]
        output [ {{ name: "SEEN" data_type: TYPE_STRING dims: [1] }} ]
        dynamic_batching {{ max_queue_delay_microseconds: 500000 }}
        parameters {{ key: "batch_cap" value {{ string_value: "false" }} }}
        {extra}
        """)
    (folder / "1" / "model.py").write_text(PARAMS)


def add_text_models(repo: pathlib.Path, delay_s: float = 0.0) -> None:
    """"words" (decoupled, WORDS) and "shout" (batched, SHOUT): Python text models."""
    folder = write_config(repo, "words", f"""
        name: "words"
        backend: "python"
        max_batch_size: 1
        input [ {{ name: "text_input" data_type: TYPE_STRING dims: [1] }} ]
        output [ {{ name: "text_output" data_type: TYPE_STRING dims: [1] }} ]
        model_transaction_policy {{ decoupled: true }}
        parameters {{ key: "delay_s" value {{ string_value: "{delay_s}" }} }}
        """)
    (folder / "1" / "model.py").write_text(WORDS)
    folder = write_config(repo, "shout", """
        name: "shout"
        backend: "python"
        max_batch_size: 4
        input [ { name: "text_input" data_type: TYPE_STRING dims: [1] } ]
        output [ { name: "text_output" data_type: TYPE_STRING dims: [1] },
                 { name: "length" data_type: TYPE_INT32 dims: [1] } ]
        dynamic_batching { }
        """)
    (folder / "1" / "model.py").write_text(SHOUT)
