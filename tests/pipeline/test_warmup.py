"""`model_warmup`: the config's samples run (each `count` times, at its batch size, with zeros,
random data or a file's bytes) before the model serves; a sample the model fails fails the
load naming the sample; bad samples are refused at parse time naming the field."""

from __future__ import annotations

import pathlib
import struct

import numpy as np
import pytest
import torch

from tensorgate import Engine, InferenceRequest, TensorView
from tensorgate.errors import InternalError, ModelConfigError
from tensorgate.repository.model_config import parse_model_config
from tests.pipeline import repo_builder as rb
from tests.pipeline import sequence_models as sm
from tests.pipeline.conftest import run

WARMED = '''
import torch

from tensorgate import Model


class Warmed(Model):
    """Remembers each forward's rows and input sum; answers with how many came before it and
    the first one's rows and sum. Its TEXT input must be b"hi"."""

    def setup(self, context):
        self.seen = []

    def forward(self, inputs):
        if any(t != b"hi" for t in inputs["TEXT"].reshape(-1)):
            raise ValueError(f"TEXT is {inputs['TEXT'].tolist()}")
        x = inputs["INPUT__0"]
        out = torch.zeros_like(x)
        out[:, 0] = len(self.seen)
        if self.seen:
            out[:, 1], out[:, 2] = self.seen[0]
        self.seen.append((x.shape[0], float(x.sum())))
        return {"OUTPUT__0": out}
'''


@pytest.fixture(scope="module")
def warm_repo(tmp_path_factory: pytest.TempPathFactory) -> pathlib.Path:
    root = tmp_path_factory.mktemp("warmup")
    folder = rb.write_config(root, "warmed", """
        name: "warmed"
        backend: "python"
        max_batch_size: 4
        input [ { name: "INPUT__0" data_type: TYPE_FP32 dims: [4] },
                { name: "TEXT" data_type: TYPE_STRING dims: [1] } ]
        output [ { name: "OUTPUT__0" data_type: TYPE_FP32 dims: [4] } ]
        model_warmup [ {
          name: "from files" batch_size: 2 count: 3
          inputs { key: "INPUT__0" value: { data_type: TYPE_FP32 dims: [4]
                                            input_data_file: "four_floats" } }
          inputs { key: "TEXT" value: { data_type: TYPE_STRING dims: [1]
                                        input_data_file: "hi" } } } ]
        """)
    (folder / "1" / "model.py").write_text(WARMED)
    (folder / "warmup").mkdir()
    (folder / "warmup" / "four_floats").write_bytes(np.array([1, 2, 3, 4], "<f4").tobytes())
    (folder / "warmup" / "hi").write_bytes(struct.pack("<I", 2) + b"hi")
    rb.add_torchscript(root, "fails_warmup", rb.Failing(), [4], [4], extra="""
        model_warmup [ { name: "negative" batch_size: 1
          inputs { key: "INPUT__0" value: { data_type: TYPE_FP32 dims: [4]
                                            input_data_file: "negative" } } } ]""")
    (root / "fails_warmup" / "warmup").mkdir()
    (root / "fails_warmup" / "warmup" / "negative").write_bytes(
        np.full(4, -1.0, "<f4").tobytes())
    return root


def test_the_config_samples_run_before_the_model_serves(warm_repo: pathlib.Path) -> None:
    async def scenario() -> None:
        engine = Engine(warm_repo)
        await engine.start(["warmed"])
        text = np.array([[b"hi"]], dtype=object)
        result = await engine.infer(InferenceRequest("warmed", {
            "INPUT__0": TensorView.from_torch(torch.zeros(1, 4), name="INPUT__0"),
            "TEXT": TensorView.from_numpy(text, name="TEXT")}))
        before, rows, total = result.outputs["OUTPUT__0"].torch()[0, :3].tolist()
        # three runs of the sample, each two rows of [1, 2, 3, 4]
        assert (before, rows, total) == (3.0, 2.0, 20.0)
        await engine.shutdown()
    run(scenario())


def test_a_failing_sample_fails_the_load_naming_it(warm_repo: pathlib.Path) -> None:
    async def scenario() -> None:
        engine = Engine(warm_repo)
        with pytest.raises(InternalError, match=r"^model 'fails_warmup' failed its warm-up "
                                                r"sample 'negative' \(batch 1\) with "
                                                r"(?s:.*)negative input"):
            await engine.load("fails_warmup")
        await engine.shutdown()
    run(scenario())


BASE = """
name: "m"
max_batch_size: 2
input [ { name: "a" data_type: TYPE_FP32 dims: [-1] },
        { name: "b" data_type: TYPE_INT32 dims: [1] optional: true } ]
output [ { name: "y" data_type: TYPE_FP32 dims: [1] } ]
"""


@pytest.mark.parametrize(("sample", "message"), [
    ('name: "w" batch_size: 3 inputs { key: "a" value: { data_type: TYPE_FP32 dims: [2] '
     'zero_data: true } }', r"model_warmup 'w' has batch_size 3; it must lie in \[1, 2\]$"),
    ('name: "w" batch_size: 1', r"model_warmup 'w' gives no data for inputs \['a'\]$"),
    ('name: "w" batch_size: 1 inputs { key: "a" value: { data_type: TYPE_FP32 dims: [2] '
     'zero_data: true } } inputs { key: "c" value: { data_type: TYPE_FP32 dims: [1] '
     'zero_data: true } }', r"model_warmup 'w' names input 'c'; the model's inputs are: a, b$"),
    ('name: "w" batch_size: 1 inputs { key: "a" value: { data_type: TYPE_INT32 dims: [2] '
     'zero_data: true } }', r"model_warmup 'w': input 'a' is TYPE_INT32; the model's input "
                            r"is FP32$"),
    ('name: "w" batch_size: 1 inputs { key: "a" value: { data_type: TYPE_FP32 dims: [-1] '
     'zero_data: true } }', r"input 'a' has dims \[-1\]; the model's input has \[-1\] \(fix "
                            r"every variable dim\)$"),
    ('name: "w" batch_size: 1 inputs { key: "a" value: { data_type: TYPE_FP32 dims: [2] } }',
     r"input 'a' needs zero_data, random_data or input_data_file$"),
    ('name: "w" batch_size: 1 inputs { key: "a" value: { data_type: TYPE_FP32 dims: [2] '
     'input_data_file: "../../etc/passwd" } }',
     r"input_data_file '../../etc/passwd' must be a file name in the model's warmup folder$"),
    ('batch_size: 1', r"a model_warmup sample has no 'name'$"),
    ('name: "w" batch_size: 2 inputs { key: "a" value: { data_type: TYPE_FP32 '
     'dims: [200000000] zero_data: true } }',
     r"input 'a' of 2 × \[200000000\] is 1,600,000,000 bytes; a warm-up input may be at most "
     r"1,073,741,824$"),
    ('name: "w" batch_size: 1 count: 10001 inputs { key: "a" value: { data_type: TYPE_FP32 '
     'dims: [1] zero_data: true } }', r"model_warmup 'w' has count 10001; at most 10000 runs "
                                     r"are allowed$"),
])
def test_bad_warmup_samples_are_refused_naming_the_field(sample: str, message: str) -> None:
    with pytest.raises(ModelConfigError, match=message):
        parse_model_config(BASE + f"model_warmup [ {{ {sample} }} ]", "m/config.pbtxt")


def test_a_sample_may_leave_out_optional_inputs_and_count_defaults_to_once() -> None:
    spec = parse_model_config(BASE + 'model_warmup [ { name: "w" batch_size: 2 inputs { key: '
                                     '"a" value: { data_type: TYPE_FP32 dims: [3] '
                                     'random_data: true } } } ]', "m/config.pbtxt")
    (sample,) = spec.warmup
    assert (sample.batch_size, sample.count, [n for n, _ in sample.inputs]) == (2, 1, ["a"])


def test_a_sample_is_reshaped_as_requests_are(tmp_path: pathlib.Path) -> None:
    folder = rb.write_config(tmp_path, "flat", """
        name: "flat"
        platform: "pytorch_libtorch"
        max_batch_size: 2
        input [ { name: "INPUT__0" data_type: TYPE_FP32 dims: [2, 2] reshape: { shape: [4] } } ]
        output [ { name: "OUTPUT__0" data_type: TYPE_FP32 dims: [4] } ]
        model_warmup [ { name: "square" batch_size: 2
          inputs { key: "INPUT__0" value: { data_type: TYPE_FP32 dims: [2, 2]
                                            zero_data: true } } } ]
        """)
    torch.jit.script(torch.nn.Linear(4, 4).eval()).save(str(folder / "1" / "model.pt"))

    async def scenario() -> None:
        engine = Engine(tmp_path)
        await engine.load("flat")  # a [2, 2, 2] warm-up would fail in a Linear(4, 4)
        assert engine.is_ready("flat")
        await engine.shutdown()
    run(scenario())


def test_zeros_for_an_input_a_sample_leaves_out_are_bounded_as_named_ones(
        tmp_path: pathlib.Path) -> None:
    """A stateful model's state input, which its samples do not name, is warmed with zeros:
    no more of them than a named input may have (a config's state dims could ask for any)."""
    folder = rb.write_config(tmp_path, "huge_state", sm.ACCUMULATE.format(
        name="huge_state", strategy="oldest { }", idle_us=1_000_000, initial="", max_batch=2
    ).replace('data_type: TYPE_FP32\n            dims: [1]', 'data_type: TYPE_FP32\n'
              '            dims: [200000000]') + """
        model_warmup [ { name: "w" batch_size: 2
          inputs { key: "INPUT" value: { data_type: TYPE_FP32 dims: [1] zero_data: true } } } ]
        """)
    torch.jit.script(sm.Accumulate().eval()).save(str(folder / "1" / "model.pt"))

    async def scenario() -> None:
        engine = Engine(tmp_path)
        with pytest.raises(ModelConfigError, match=r"model 'huge_state', warm-up sample 'w' "
                                                   r"leaves out input 'TOTAL_IN', whose zeros "
                                                   r"would be 1,600,000,000 bytes; a warm-up "
                                                   r"input may be at most 1,073,741,824$"):
            await engine.load("huge_state")
        await engine.shutdown()
    run(scenario())
