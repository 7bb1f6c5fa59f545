"""A TorchScript or torch.export model gets each config input as the forward argument and each
output from the returned position that Triton's PyTorch backend would use: by forward
argument name, by `<name>__<index>`, else in config order; a dict-taking forward gets one
dict. A config that cannot be placed fails its load naming the inputs."""

from __future__ import annotations

import asyncio
import pathlib
from typing import Dict, List, Optional, Tuple

import numpy as np
import pytest
import torch

from tensorgate import Engine, InferenceRequest, TensorView
from tensorgate.errors import ModelConfigError, TensorgateError
from tensorgate.pipeline.torch_io import Argument, input_order, output_positions, strings_array
from tensorgate.repository.model_config import ModelSpec, parse_model_config
from tests.pipeline import repo_builder as rb
from tests.pipeline.conftest import run


class Subtract(torch.nn.Module):
    """Two inputs that must not be swapped, two outputs that must not be swapped."""

    def forward(self, a: torch.Tensor, b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return a - b, a * 2


class MaybeMasked(torch.nn.Module):
    def forward(self, x: torch.Tensor, mask: Optional[torch.Tensor] = None) -> torch.Tensor:
        return x if mask is None else x * mask


class DictSubtract(torch.nn.Module):
    def forward(self, inputs: Dict[str, torch.Tensor]) -> torch.Tensor:
        return inputs["a"] - inputs["b"]


def _tensors(entries: list[tuple[str, list[int]]]) -> str:
    return ", ".join(f'{{ name: "{name}" data_type: TYPE_FP32 dims: {dims} }}'
                     for name, dims in entries)


def _config(name: str, inputs: list[str], outputs: list[str], extra: str = "") -> str:
    return f"""
        name: "{name}"
        platform: "pytorch_libtorch"
        max_batch_size: 4
        input [ {_tensors([(n, [2]) for n in inputs])} ]
        output [ {_tensors([(n, [2]) for n in outputs])} ]
        {extra}
        """


def _spec(inputs: list[str], outputs: list[str], extra: str = "") -> ModelSpec:
    return parse_model_config(_config("m", inputs, outputs, extra), "m/config.pbtxt")


ARGS = [Argument("a"), Argument("b")]


@pytest.mark.parametrize(("inputs", "arguments", "expected"), [
    (["b", "a"], ARGS, ("a", "b")),                       # forward argument names
    (["IN__1", "IN__0"], ARGS, ("IN__0", "IN__1")),       # <name>__<index>
    (["IN__1", "IN__0"], None, ("IN__0", "IN__1")),       # an AOTInductor package: no names
    (["Y", "X"], ARGS, ("Y", "X")),                       # neither: the config's order
    (["b", "IN__0"], ARGS, ("b", "IN__0")),               # mixed: the config's order
    (["a__x", "b__1"], ARGS, ("a__x", "b__1")),           # 'x' is no index: config order
])
def test_inputs_take_tritons_argument_positions(inputs: list[str], arguments: list[Argument] | None,
                                                expected: tuple[str, ...]) -> None:
    assert input_order(_spec(inputs, ["OUT"]), arguments, "src") == expected


SEQUENCE = """sequence_batching {{ control_input [
    {{ name: "{start}" control [ {{ kind: CONTROL_SEQUENCE_START fp32_false_true: [0, 1] }} ] }} ]
    state [ {{ input_name: "{state_in}" output_name: "{state_out}" data_type: TYPE_FP32
               dims: [2] }} ] }}"""


def test_server_set_inputs_by_index_by_name_or_in_the_arguments_left() -> None:
    indexed = _spec(["IN__2"], ["OUT"], SEQUENCE.format(start="START__0", state_in="S__1",
                                                        state_out="S_OUT"))
    assert input_order(indexed, None, "src") == ("START__0", "S__1", "IN__2")
    named = _spec(["x"], ["OUT"], SEQUENCE.format(start="start", state_in="S_IN",
                                                  state_out="S_OUT"))
    arguments = [Argument("start"), Argument("x"), Argument("state")]
    assert input_order(named, arguments, "src") == ("start", "x", "S_IN")


def test_outputs_by_index_else_config_order() -> None:
    assert output_positions(_spec(["a"], ["OUT__1", "OUT__0"])) == {"OUT__1": 1, "OUT__0": 0}
    assert output_positions(_spec(["a"], ["OUT__1"])) == {"OUT__1": 1}
    assert output_positions(_spec(["a"], ["Y", "X"])) == {"Y": 0, "X": 1}
    stateful = _spec(["IN__0"], ["OUT__1"], SEQUENCE.format(start="START__1", state_in="S_IN",
                                                            state_out="S_OUT"))
    assert output_positions(stateful) == {"OUT__1": 1, "S_OUT": 0}


@pytest.mark.parametrize(("inputs", "arguments", "message"), [
    (["a", "b", "c"], ARGS, r"^src: the config gives 3 inputs \(a, b, c\); the model's forward "
                            r"takes 2 \(a, b\)$"),
    (["IN__0", "X__0"], None, r"^src: inputs 'IN__0' and 'X__0' are both forward argument 0$"),
    (["IN__0", "IN__2"], None, r"^src: input 'IN__2' is forward argument 2, but the model has "
                               r"2 inputs \(0 to 1\)$"),
])
def test_a_config_that_cannot_be_placed_names_the_inputs(inputs: list[str],
                                                         arguments: list[Argument] | None,
                                                         message: str) -> None:
    with pytest.raises(ModelConfigError, match=message):
        input_order(_spec(inputs, ["OUT"]), arguments, "src")


def test_arguments_with_defaults_may_be_left_out() -> None:
    arguments = [Argument("a"), Argument("b", has_default=True)]
    assert input_order(_spec(["a"], ["OUT"]), arguments, "src") == ("a",)


# -- served: the engine runs real TorchScript and torch.export models --------------------------

def _save(repo: pathlib.Path, name: str, module: torch.nn.Module, inputs: list[str],
          outputs: list[str], exported: bool = False) -> None:
    folder = rb.write_config(repo, name, _config(name, inputs, outputs).replace(
        "pytorch_libtorch", "torch_aoti" if exported else "pytorch_libtorch"))
    if exported:
        example = (torch.ones(2, 2), torch.ones(2, 2))
        batch = torch.export.Dim("batch", min=1, max=4)  # max_batch_size 4: any batch of it
        torch.export.save(torch.export.export(module, example,
                                              dynamic_shapes=({0: batch}, {0: batch})),
                          str(folder / "1" / "model.pt2"))
    else:
        torch.jit.script(module.eval()).save(str(folder / "1" / "model.pt"))


async def _infer(engine: Engine, model: str,
                 values: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    request = InferenceRequest(model, {n: TensorView.from_torch(v, name=n)
                                       for n, v in values.items()})
    result = await engine.infer(request)
    return {name: view.torch().clone() for name, view in result.outputs.items()}


def test_served_models_get_their_inputs_in_place(tmp_path: pathlib.Path) -> None:
    _save(tmp_path, "by_name", Subtract(), ["b", "a"], ["OUTPUT__1", "OUTPUT__0"])
    _save(tmp_path, "by_index", Subtract(), ["B__1", "A__0"], ["DOUBLE__1"])
    _save(tmp_path, "by_dict", DictSubtract(), ["b", "a"], ["OUT"])
    _save(tmp_path, "exported", Subtract(), ["b", "a"], ["OUTPUT__1", "OUTPUT__0"], exported=True)
    _save(tmp_path, "optional", MaybeMasked(), ["INPUT__0"], ["OUTPUT__0"])  # mask left out
    a = torch.tensor([[5.0, 7.0]])
    b = torch.tensor([[1.0, 2.0]])

    async def scenario() -> None:
        engine = Engine(tmp_path)
        await engine.start()
        try:
            for model in ("by_name", "exported"):
                out = await _infer(engine, model, {"b": b, "a": a})
                torch.testing.assert_close(out["OUTPUT__0"], a - b)
                torch.testing.assert_close(out["OUTPUT__1"], a * 2)
            out = await _infer(engine, "by_index", {"B__1": b, "A__0": a})
            assert list(out) == ["DOUBLE__1"]
            torch.testing.assert_close(out["DOUBLE__1"], a * 2)
            out = await _infer(engine, "by_dict", {"b": b, "a": a})
            torch.testing.assert_close(out["OUT"], a - b)
            out = await _infer(engine, "optional", {"INPUT__0": a})
            torch.testing.assert_close(out["OUTPUT__0"], a)
        finally:
            await engine.shutdown()
    run(scenario())


def test_a_model_whose_forward_does_not_fit_its_config_fails_its_load(tmp_path: pathlib.Path) -> None:
    _save(tmp_path, "three", Subtract(), ["a", "b", "c"], ["OUTPUT__0"])

    async def scenario() -> None:
        engine = Engine(tmp_path)
        try:
            with pytest.raises(ModelConfigError, match=r"the config gives 3 inputs \(a, b, c\); "
                                                       r"the model's forward takes 2 \(a, b\)$"):
                await engine.load("three")
        finally:
            await engine.shutdown()
    run(scenario())


def test_an_output_position_beyond_what_the_model_returns_fails_the_request(
        tmp_path: pathlib.Path) -> None:
    _save(tmp_path, "short", Subtract(), ["a", "b"], ["OUTPUT__0", "OUTPUT__5"])

    async def scenario() -> None:
        engine = Engine(tmp_path)
        await engine.start()
        try:
            with pytest.raises(TensorgateError, match=r"model 'short' returned 2 outputs; its "
                                                      r"config takes 'OUTPUT__5' from position 5"):
                await _infer(engine, "short", {"a": torch.ones(1, 2), "b": torch.ones(1, 2)})
        finally:
            await engine.shutdown()
    run(scenario())


# -- the PyTorch backend's run-time switches ---------------------------------------------------

TORCH_MODES = '''
import torch

from tensorgate import Model


class TorchModes(Model):
    """Answers what its executor thread runs it under."""

    def forward(self, batch):
        x = batch["INPUT__0"]
        modes = [torch.is_inference_mode_enabled(), torch.is_grad_enabled(),
                 torch._C._get_graph_executor_optimize()]
        return torch.tensor([modes], dtype=torch.float32).expand(x.shape[0], 3)
'''


def _modes_model(repo: pathlib.Path, name: str, parameters: dict[str, str]) -> None:
    entries = " ".join(f'parameters {{ key: "{k}" value {{ string_value: "{v}" }} }}'
                       for k, v in parameters.items())
    folder = rb.write_config(repo, name, f"""
        name: "{name}"
        backend: "python"
        max_batch_size: 4
        input [ {{ name: "INPUT__0" data_type: TYPE_FP32 dims: [1] }} ]
        output [ {{ name: "OUTPUT__0" data_type: TYPE_FP32 dims: [3] }} ]
        {entries}
        """)
    (folder / "1" / "model.py").write_text(TORCH_MODES)


def test_inference_mode_and_optimized_execution_follow_the_config(
        tmp_path: pathlib.Path, caplog: pytest.LogCaptureFixture) -> None:
    _modes_model(tmp_path, "defaults", {})
    _modes_model(tmp_path, "switched", {"INFERENCE_MODE": "false",
                                        "DISABLE_OPTIMIZED_EXECUTION": "true",
                                        "ENABLE_TENSOR_FUSER": "false"})

    async def scenario() -> None:
        engine = Engine(tmp_path)
        await engine.start()
        try:
            one = {"INPUT__0": torch.zeros(1, 1)}
            defaults = (await _infer(engine, "defaults", one))["OUTPUT__0"]
            switched = (await _infer(engine, "switched", one))["OUTPUT__0"]
        finally:
            await engine.shutdown()
        # [inference mode, grad enabled, graph executor optimises]
        assert defaults.tolist() == [[1.0, 0.0, 1.0]]
        assert switched.tolist() == [[0.0, 0.0, 0.0]]  # no_grad, not inference mode
    run(scenario())
    assert torch._C._get_graph_executor_optimize()  # the executor's thread's own setting
    warnings = [r.getMessage() for r in caplog.records if "not acted on" in r.getMessage()]
    assert warnings == ["model switched: parameters taken and not acted on: ENABLE_TENSOR_FUSER "
                        "(a process-wide torch switch)"]


# -- strings: TYPE_STRING inputs and outputs as List[str], as Triton's PyTorch backend -------

class Shout(torch.nn.Module):
    """Strings in, strings and their lengths out: what a tokenizer-in-TorchScript model does."""

    def forward(self, text: List[str], scale: torch.Tensor) -> Tuple[List[str], torch.Tensor]:
        shouted = [t.upper() + "!" for t in text]
        lengths = torch.tensor([len(t) for t in text], dtype=torch.float32)
        return shouted, lengths.reshape(scale.shape[0], -1) * scale


class Words(torch.nn.Module):
    """One string in, its words out: a lone List[str] result of any length."""

    def forward(self, text: List[str]) -> List[str]:
        return text[0].split(" ")


class Lengths(torch.nn.Module):
    def forward(self, text: torch.Tensor) -> torch.Tensor:
        return text


def add_string_models(repo: pathlib.Path) -> None:
    folder = rb.write_config(repo, "shout", """
        name: "shout"
        platform: "pytorch_libtorch"
        max_batch_size: 8
        input [ { name: "TEXT" data_type: TYPE_STRING dims: [2] },
                { name: "SCALE" data_type: TYPE_FP32 dims: [1] } ]
        output [ { name: "SHOUTED" data_type: TYPE_STRING dims: [2] },
                 { name: "LENGTH" data_type: TYPE_FP32 dims: [2] } ]
        dynamic_batching { max_queue_delay_microseconds: 200000 }
        parameters { key: "batch_cap" value { string_value: "off" } }
        """)
    torch.jit.script(Shout().eval()).save(str(folder / "1" / "model.pt"))
    _add_unbatched(repo, "words", Words(), ("TEXT", "STRING", [1]), ("WORDS", "STRING", [-1]))


def _add_unbatched(repo: pathlib.Path, name: str, module: torch.nn.Module,
                   given: tuple[str, str, list[int]], made: tuple[str, str, list[int]]) -> None:
    """A TorchScript model without batching: one input and one output (name, type, dims)."""
    entry = '{{ name: "{}" data_type: TYPE_{} dims: {} }}'.format
    folder = rb.write_config(repo, name, f"""
        name: "{name}"
        platform: "pytorch_libtorch"
        max_batch_size: 0
        input [ {entry(*given)} ]
        output [ {entry(*made)} ]
        """)
    torch.jit.script(module.eval()).save(str(folder / "1" / "model.pt"))


def _text(rows: list[list[bytes]]) -> TensorView:
    return TensorView.from_numpy(np.array(rows, dtype=object), name="TEXT")


def test_string_inputs_batch_as_one_list_and_string_outputs_take_the_config_shape(
        tmp_path: pathlib.Path) -> None:
    add_string_models(tmp_path)
    first = [[b"ab", b"c"]]
    second = [[b"de", b"fgh"], [b"\xc3\xa9t\xc3\xa9", b""]]  # "été": UTF-8 as sent

    async def scenario() -> None:
        engine = Engine(tmp_path)
        await engine.start()
        try:
            results = await asyncio.gather(*(
                engine.infer(InferenceRequest("shout", {
                    "TEXT": _text(rows),
                    "SCALE": TensorView.from_torch(torch.full((len(rows), 1), scale),
                                                   name="SCALE")}))
                for rows, scale in ((first, 1.0), (second, 10.0))))
            assert engine.statistics("shout")[0]["execution_count"] == 1  # one batch of three
            one, two = (r.outputs for r in results)
            assert one["SHOUTED"].numpy().tolist() == [[b"AB!", b"C!"]]
            assert one["LENGTH"].torch().tolist() == [[2.0, 1.0]]
            assert two["SHOUTED"].numpy().tolist() == [[b"DE!", b"FGH!"],
                                                       ["éTé!".encode(), b"!"]]  # ASCII upper
            # TorchScript's len counts the bytes of a string
            assert two["LENGTH"].torch().tolist() == [[20.0, 30.0], [50.0, 0.0]]
            words = await engine.infer(InferenceRequest("words", {
                "TEXT": _text([b"to be or not"])}))
            assert words.outputs["WORDS"].shape == (4,)
            assert words.outputs["WORDS"].numpy().tolist() == [b"to", b"be", b"or", b"not"]
        finally:
            await engine.shutdown()
    run(scenario())


def test_a_string_input_on_a_tensor_argument_fails_the_load_naming_both(
        tmp_path: pathlib.Path) -> None:
    _add_unbatched(tmp_path, "tensor_arg", Lengths(), ("text", "STRING", [1]),
                   ("OUT", "STRING", [1]))
    _add_unbatched(tmp_path, "list_arg", Words(), ("TEXT", "FP32", [1]), ("WORDS", "STRING", [-1]))

    async def scenario() -> None:
        engine = Engine(tmp_path)
        try:
            with pytest.raises(ModelConfigError, match=r"input 'text' is TYPE_STRING; forward "
                                                       r"argument 'text' must be List\[str\]"):
                await engine.load("tensor_arg")
            with pytest.raises(ModelConfigError, match=r"forward argument 'text' is List\[str\]; "
                                                       r"input 'TEXT' on it must be TYPE_STRING, "
                                                       r"not TYPE_FP32"):
                await engine.load("list_arg")
        finally:
            await engine.shutdown()
    run(scenario())


def test_strings_that_do_not_fill_the_config_dims_fail_naming_the_output() -> None:
    array = strings_array(["a", b"b", "c", "d"], [2], 2, "m", "OUT")
    assert array.shape == (2, 2) and array.tolist() == [[b"a", b"b"], [b"c", b"d"]]
    assert strings_array(["a"] * 6, [-1, 3], 1, "m", "OUT").shape == (1, 2, 3)
    assert strings_array([], [-1], None, "m", "OUT").shape == (0,)
    with pytest.raises(TensorgateError, match=r"^model 'm' returned 3 strings for output 'OUT', "
                                              r"which do not fill its dims \[2\] for a batch "
                                              r"of 2$"):
        strings_array(["a", "b", "c"], [2], 2, "m", "OUT")
    with pytest.raises(TensorgateError, match=r"do not fill its dims \[-1, -1\]$"):
        strings_array(["a", "b"], [-1, -1], None, "m", "OUT")


def test_a_string_the_model_returns_that_is_not_utf8_fails_only_its_request(
        tmp_path: pathlib.Path) -> None:
    add_string_models(tmp_path)

    async def scenario() -> None:
        engine = Engine(tmp_path)
        await engine.start()
        try:
            with pytest.raises(TensorgateError, match=r"model 'words' raised UnicodeDecodeError"):
                await engine.infer(InferenceRequest("words", {"TEXT": _text([b"\xff x"])}))
            words = await engine.infer(InferenceRequest("words", {"TEXT": _text([b"still up"])}))
            assert words.outputs["WORDS"].numpy().tolist() == [b"still", b"up"]
        finally:
            await engine.shutdown()
    run(scenario())


# -- an output's config `reshape`: the model's shape of it, sent in the config's dims ----------

class Flat(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.sum(dim=1)  # [batch]: one value a row, no trailing dim


def test_an_output_reshape_gives_clients_the_config_dims(tmp_path: pathlib.Path) -> None:
    for name, module in (("flat", Flat()), ("wrong", rb.Identity())):  # wrong: [batch, 2]
        folder = rb.write_config(tmp_path, name, f"""
            name: "{name}"
            platform: "pytorch_libtorch"
            max_batch_size: 4
            input [ {{ name: "x" data_type: TYPE_FP32 dims: [2] }} ]
            output [ {{ name: "y" data_type: TYPE_FP32 dims: [1] reshape {{ shape: [ ] }} }} ]
            """)
        torch.jit.script(module.eval()).save(str(folder / "1" / "model.pt"))

    async def scenario() -> None:
        engine = Engine(tmp_path)
        await engine.start()
        try:
            out = await _infer(engine, "flat", {"x": torch.tensor([[1.0, 2.0], [3.0, 4.0]])})
            assert out["y"].tolist() == [[3.0], [7.0]]  # [2, 1], not the model's [2]
            with pytest.raises(TensorgateError, match=r"model 'wrong' output 'y' has shape "
                                                      r"\[3, 2\], which does not reshape to "
                                                      r"\[3, 1\] as its config's dims ask"):
                await _infer(engine, "wrong", {"x": torch.ones(3, 2)})
        finally:
            await engine.shutdown()
    run(scenario())
