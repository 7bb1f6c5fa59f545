"""config.pbtxt parsing: Triton's schema, exact errors naming the file and the field."""

from __future__ import annotations

import json
import pathlib
import re
from dataclasses import replace

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tritonclient.grpc import model_config_pb2 as pb

from tensorgate.errors import (InvalidArgumentError, ModelConfigError, NotFoundError,
                               TensorgateError)
from tensorgate.repository.layout import (ModelRepositories, artifact_path, discover_models,
                                         load_source)
from tensorgate.repository.model_config import QueuePolicy, parse_model_config

FULL = """
name: "resnet50"
platform: "pytorch_libtorch"
max_batch_size: 64
input [ { name: "INPUT__0" data_type: TYPE_FP32 format: FORMAT_NCHW dims: [ 3, 224, 224 ] } ]
output [ { name: "OUTPUT__0" data_type: TYPE_FP32 dims: [ 1000 ] label_filename: "labels.txt" } ]
dynamic_batching {
  preferred_batch_size: [ 4, 8 ]
  max_queue_delay_microseconds: 100
  default_queue_policy { max_queue_size: 16 default_timeout_microseconds: 5000
                         allow_timeout_override: true }
}
instance_group [ { count: 2 kind: KIND_CPU } ]
version_policy: { latest: { num_versions: 2 } }
parameters: { key: "INTRA_OP_THREAD_COUNT" value: { string_value: "1" } }
"""


def test_full_config_is_honoured() -> None:
    spec = parse_model_config(FULL, "resnet50/config.pbtxt", "resnet50")
    assert spec.max_batch_size == 64 and spec.platform == "pytorch_libtorch"
    assert spec.inputs[0].name == "INPUT__0" and spec.inputs[0].dims == (3, 224, 224)
    assert spec.inputs[0].datatype.name == "FP32"
    assert spec.outputs[0].label_filename == "labels.txt"
    b = spec.batching
    assert b is not None and b.preferred_batch_sizes == (4, 8) and b.max_queue_delay_us == 100
    assert b.queues == (QueuePolicy(16, 5000, True),) and b.level(0) == b.level(3) == 0
    assert spec.instance_groups[0].count == 2 and spec.instance_groups[0].kind == "KIND_CPU"
    assert spec.version_policy == ("latest", (2,))
    assert spec.parameters == {"INTRA_OP_THREAD_COUNT": "1"}
    assert spec.config_dict()["input"][0]["data_type"] == "TYPE_FP32"


def test_config_json_writes_64_bit_integers_as_numbers_and_defaults_too() -> None:
    """Triton's /config and a Python-backend model's `model_config`: `"dims": [3, 224, 224]`,
    not protobuf's `["3", "224", "224"]`, and `max_batch_size: 0` present."""
    config = parse_model_config(FULL, "x", "resnet50").config_dict()
    assert config["input"][0]["dims"] == [3, 224, 224]
    batching = config["dynamic_batching"]
    assert batching["max_queue_delay_microseconds"] == 100
    assert batching["default_queue_policy"]["default_timeout_microseconds"] == 5000
    assert parse_model_config(FULL, "x", "resnet50").config_dict() == json.loads(
        json.dumps(config))  # plain JSON values
    unbatched = parse_model_config('name: "m"\ninput { name: "a" data_type: TYPE_INT64 '
                                   'dims: [-1] }\noutput { name: "b" data_type: TYPE_INT64 '
                                   'dims: [2] }', "m/config.pbtxt", "m").config_dict()
    assert unbatched["max_batch_size"] == 0 and unbatched["output"][0]["dims"] == [2]
    levels = parse_model_config(
        'name: "m"\nmax_batch_size: 2\ninput { name: "a" data_type: TYPE_FP32 dims: [1] }\n'
        'output { name: "b" data_type: TYPE_FP32 dims: [1] }\ndynamic_batching { '
        'priority_levels: 2 default_priority_level: 1 priority_queue_policy { key: 2 value { '
        'default_timeout_microseconds: 7 } } }', "m/config.pbtxt", "m").config_dict()
    assert levels["dynamic_batching"]["priority_queue_policy"]["2"][
        "default_timeout_microseconds"] == 7


@pytest.mark.parametrize("text, message", [
    ('name: "m"\nmax_batch_sise: 4', r'^m/config\.pbtxt: 2:1 : Message type "inference\.'
                                     r'ModelConfig" has no field named "max_batch_sise"\.$'),
    ('name: "m"\nmax_batch_size: "four"', r"^m/config\.pbtxt: 2:17 : .*Couldn't parse integer"),
    ('name: "other"', r"^m/config\.pbtxt: field 'name' is 'other' but the model directory is "
                      r"'m'; they must match$"),
    ('name: "m" input [ { name: "a" data_type: TYPE_FP32 dims: [ 0 ] } ]',
     r"input 'a' has dims \[0\]; each must be -1 \(variable\) or positive$"),
    ('name: "m" input [ { name: "a" dims: [ 1 ] } ]', r"input 'a' has no 'data_type'$"),
    ('name: "m" max_batch_size: 4 dynamic_batching { preferred_batch_size: [ 8 ] }',
     r"'preferred_batch_size' \[8\] must lie in \[1, max_batch_size=4\]$"),
    ('name: "m" dynamic_batching { }', r"'dynamic_batching' needs 'max_batch_size' above 0$"),
    ('name: "m" max_batch_size: -1', r"field 'max_batch_size' is -1"),
    ('name: "m" input [ { name: "a" data_type: TYPE_FP32 dims: [1] }, '
     '{ name: "a" data_type: TYPE_FP32 dims: [1] } ]', r"input names must be unique; repeated: a$"),
    ('name: "m" version_policy { latest { num_versions: 0 } }', r"num_versions is 0"),
    ('name: "m" input [ { name: "a" data_type: TYPE_FP32 dims: [1] } ] sequence_batching { '
     'state [ { input_name: "IN_S" output_name: "OUT_S" data_type: TYPE_FP32 dims: [1] } ] } '
     'model_transaction_policy { decoupled: true }',
     r"sequence_batching 'state' \(implicit state\) with a decoupled model is not supported: "
     r"keep the state in the model, by its CORRID$"),
    ('name: "m" max_batch_size: 1 dynamic_batching { priority_levels: 2 }',
     r"'default_priority_level' is 0; with 'priority_levels: 2' it must lie in \[1, 2\]$"),
    ('name: "m" max_batch_size: 1 dynamic_batching { priority_levels: 2 default_priority_level: 1 '
     'priority_queue_policy { key: 3 value { max_queue_size: 1 } } }',
     r"'priority_queue_policy' names levels \[3\]; with 'priority_levels: 2' they must lie in "
     r"\[1, 2\]$"),
    ('name: "m" max_batch_size: 1 dynamic_batching { '
     'priority_queue_policy { key: 1 value { max_queue_size: 1 } } }',
     r"'priority_queue_policy' names levels \[1\]; it needs 'priority_levels'$"),
    ('name: "m" max_batch_size: 1 dynamic_batching { priority_levels: 5000 '
     'default_priority_level: 1 }', r"'priority_levels' is 5000; at most 1000 are supported$"),
])
def test_invalid_configs_name_file_and_field(text: str, message: str) -> None:
    with pytest.raises(ModelConfigError, match=message):
        parse_model_config(text, "m/config.pbtxt", "m")


PRIORITIES = """
name: "ranked"
max_batch_size: 4
dynamic_batching {
  priority_levels: 3
  default_priority_level: 2
  default_queue_policy { max_queue_size: 8 default_timeout_microseconds: 1000 }
  priority_queue_policy { key: 1 value { max_queue_size: 2 allow_timeout_override: true } }
  priority_queue_policy { key: 3 value { timeout_action: DELAY
                                         default_timeout_microseconds: 500 } }
}
"""


def test_priority_levels_have_their_own_queue_policies() -> None:
    b = parse_model_config(PRIORITIES, "ranked/config.pbtxt", "ranked").batching
    assert b is not None
    assert b.queues == (QueuePolicy(2, 0, True), QueuePolicy(8, 1000),
                        QueuePolicy(0, 500, delay_on_timeout=True))
    # 0 and priorities past the last level mean the default level, as in Triton
    assert [b.level(p) for p in (0, 1, 2, 3, 4, 1 << 40)] == [1, 0, 1, 2, 1, 1]


def _model(repo: pathlib.Path, name: str, config: str, versions: dict[str, str]) -> None:
    (repo / name).mkdir(parents=True)
    (repo / name / "config.pbtxt").write_text(config)
    for version, filename in versions.items():
        (repo / name / version).mkdir()
        (repo / name / version / filename).write_bytes(b"")


def test_layout_versions_and_artifacts(tmp_path: pathlib.Path) -> None:
    _model(tmp_path, "a", 'name: "a" platform: "pytorch_libtorch"',
           {"1": "model.pt", "3": "model.pt", "07": "model.pt", "x": "model.pt"})
    _model(tmp_path, "b", 'name: "b" version_policy { all { } } backend: "python"',
           {"1": "model.py", "2": "model.py"})
    _model(tmp_path, "c", 'name: "c" version_policy { specific { versions: [ 2 ] } }',
           {"1": "model.pt2", "2": "model.pt2"})
    (tmp_path / "not_a_model").mkdir()
    assert discover_models(tmp_path) == ["a", "b", "c"]
    a = load_source(tmp_path, "a")
    assert a.versions == (3,)  # latest 1; "07" and "x" are not versions
    assert artifact_path(a, 3) == (tmp_path / "a" / "3" / "model.pt", "torchscript")
    assert load_source(tmp_path, "b").versions == (1, 2)
    c = load_source(tmp_path, "c")
    assert c.versions == (2,) and artifact_path(c, 2)[1] == "pt2"
    with pytest.raises(NotFoundError, match=r"^no model '\.\.' in repository"):
        load_source(tmp_path, "..")


def test_several_repositories_are_one_namespace(tmp_path: pathlib.Path) -> None:
    """Triton's --model-repository repeated: the names of all of them, each model from the
    one that holds it; a name two hold is neither's, by an error naming both folders; a
    folder that is not a model (no config, no model.py) holds nothing."""
    first, second, third = tmp_path / "one", tmp_path / "two", tmp_path / "three"
    _model(first, "a", 'name: "a"', {"1": "model.pt"})
    _model(first, "both", 'name: "both"', {"1": "model.pt"})
    _model(second, "b", 'name: "b"', {"2": "model.pt"})
    _model(second, "both", 'name: "both"', {"1": "model.pt"})
    (second / "a").mkdir()  # not a model: "a" is still first's alone
    third.mkdir()
    repositories = ModelRepositories.of([first, second, third])
    assert str(repositories) == f"{first}, {second}, {third}"
    assert repositories.names() == ["a", "b", "both"]
    assert (repositories.holder("a"), repositories.holder("b")) == (first, second)
    assert load_source(repositories.holder("b"), "b").directory == second / "b"
    with pytest.raises(InvalidArgumentError, match=(
            rf"^model 'both' is not unique across the model repositories: it is in "
            rf"'{re.escape(str(first / 'both'))}', '{re.escape(str(second / 'both'))}'; "
            r"remove or rename all but one$")):
        repositories.holder("both")
    for name in ("c", "..", ".", "", "a/1", "../one/a"):
        with pytest.raises(NotFoundError, match=(
                rf"^no model '{re.escape(name)}' in any of the repositories "
                rf"'{re.escape(str(first))}', '{re.escape(str(second))}', ")):
            repositories.holder(name)
    with pytest.raises(NotFoundError, match=r"^no model 'b' in repository '.*one'$"):
        ModelRepositories.of(first).holder("b")
    with pytest.raises(ValueError, match=r"^'.*one' and '.*one/\.\./one', the same folder"):
        ModelRepositories.of([first, first / ".." / "one"])
    with pytest.raises(NotFoundError, match=r"^model repository '.*four' is not a directory"):
        ModelRepositories.of([first, tmp_path / "four"]).names()
    prints = repositories.fingerprints()
    assert set(prints) == {"a", "b", "both"}
    both = {entry[0] for entry in prints["both"]}  # type: ignore[index]
    assert str(first / "both" / "config.pbtxt") in both
    assert str(second / "both" / "config.pbtxt") in both


def test_missing_artifact_and_versions(tmp_path: pathlib.Path) -> None:
    _model(tmp_path, "a", 'name: "a" platform: "pytorch_libtorch"', {"1": "model.py"})
    with pytest.raises(ModelConfigError, match=r"no model artifact found; looked for model\.pt, "
                                               r"model\.pt2, model\.py \(platform "
                                               r"'pytorch_libtorch'"):
        artifact_path(load_source(tmp_path, "a"), 1)
    _model(tmp_path, "empty", 'name: "empty"', {})
    with pytest.raises(ModelConfigError, match=r"no version directory matches"):
        load_source(tmp_path, "empty")
    # another framework's model in a Triton repository: said so, not only what was looked for
    for name, field in (("onnx", 'platform: "onnxruntime_onnx"'), ("trt", 'backend: "tensorrt"')):
        _model(tmp_path, name, f'name: "{name}" {field}', {"1": "model.onnx"})
        with pytest.raises(ModelConfigError) as refused:
            artifact_path(load_source(tmp_path, name), 1)
        value = field.split('"')[1]
        assert str(refused.value) == (
            f"{tmp_path / name / '1'}: no model artifact found, and {field.split(':')[0]} "
            f"'{value}' is not served here: tensorgate serves PyTorch models (pytorch_libtorch: "
            "model.pt; torch_aoti or pytorch_export: model.pt2; the python backend: model.py) "
            "and ensembles")


def test_a_python_model_without_config_is_found_and_completed_by_the_loader_s_step(
        tmp_path: pathlib.Path) -> None:
    """A model.py without config.pbtxt is a model (Triton's auto-complete); `complete` gets
    the config named and the folder of the version served last, and its result is checked
    as a config.pbtxt would be."""
    for version in ("1", "2"):
        (tmp_path / "py" / version).mkdir(parents=True)
        (tmp_path / "py" / version / "model.py").write_text("")
    assert discover_models(tmp_path) == ["py"]
    seen = []

    def complete(config: pb.ModelConfig, folder: pathlib.Path) -> pb.ModelConfig:
        seen.append((config.name, config.backend, folder))
        config.max_batch_size = 4
        config.input.add(name="X", data_type=pb.TYPE_FP32, dims=[2])
        return config

    source = load_source(tmp_path, "py", complete=complete)
    assert seen == [("py", "python", tmp_path / "py" / "2")]
    assert source.spec.max_batch_size == 4 and source.spec.input("X") is not None
    with pytest.raises(ModelConfigError, match="has no config.pbtxt, and nothing said what the "
                                               "model's inputs and outputs are"):
        load_source(tmp_path, "py")  # no step to complete it (auto-complete disabled)
    with pytest.raises(ModelConfigError, match="default_model_filename '../../x.py' must be a "
                                               "file name"):  # never imported to complete it
        load_source(tmp_path, "py", json.dumps({"default_model_filename": "../../x.py"}),
                    complete=complete)
    assert len(seen) == 1
    with pytest.raises(ModelConfigError, match="input 'X' has no 'data_type'"):
        load_source(tmp_path, "py", complete=lambda config, folder: pb.ModelConfig(
            name="py", backend="python", input=[pb.ModelInput(name="X", dims=[1])]))


def test_a_model_file_without_its_config_or_version_folder_is_a_model_that_says_so(
        tmp_path: pathlib.Path) -> None:
    """A folder with a model file and no config.pbtxt, or a model file beside its config
    but in no version folder, was skipped or refused without saying where the file should
    be: now each is a model whose load says what is missing. A hidden folder (an editor's
    or a notebook's copies) and a folder of other files are still not models."""
    (tmp_path / "unconfigured" / "1").mkdir(parents=True)
    (tmp_path / "unconfigured" / "1" / "model.pt").write_bytes(b"")
    (tmp_path / "loose").mkdir()
    (tmp_path / "loose" / "model.pt2").write_bytes(b"")
    (tmp_path / "loose_py").mkdir()
    (tmp_path / "loose_py" / "model.py").write_text("")
    (tmp_path / "unversioned").mkdir()
    (tmp_path / "unversioned" / "model.pt").write_bytes(b"")
    (tmp_path / "unversioned" / "config.pbtxt").write_text('platform: "pytorch_libtorch"')
    (tmp_path / ".ipynb_checkpoints" / "1").mkdir(parents=True)
    (tmp_path / ".ipynb_checkpoints" / "1" / "model.pt").write_bytes(b"")
    (tmp_path / "notes").mkdir()
    (tmp_path / "notes" / "README.md").write_text("not a model")
    assert discover_models(tmp_path) == ["loose", "loose_py", "unconfigured", "unversioned"]
    needs = ("has no config.pbtxt: a TorchScript or torch.export model needs one giving its "
             "inputs, outputs and max_batch_size, which the file does not say (as on "
             "Triton's PyTorch backend); only a model.py may come without it")
    said = {}
    for name in discover_models(tmp_path):
        with pytest.raises(ModelConfigError) as refused:
            load_source(tmp_path, name, complete=lambda config, folder: config)
        said[name] = str(refused.value)
    assert said == {
        "unconfigured": f"{tmp_path / 'unconfigured'}: {needs}",
        "loose": f"{tmp_path / 'loose'}: {needs}; model.pt2 lies in the model's folder "
                 f"itself: move it into a version folder ({tmp_path / 'loose' / '1'}"
                 "/model.pt2)",
        "loose_py": f"{tmp_path / 'loose_py'}: has no version folder holding its model.py; "
                    "model.py lies in the model's folder itself: move it into a version "
                    f"folder ({tmp_path / 'loose_py' / '1'}/model.py)",
        "unversioned": f"{tmp_path / 'unversioned'}: no version directory matches the "
                       "version policy latest [1]; model.pt lies in the model's folder "
                       f"itself: move it into a version folder ({tmp_path / 'unversioned'}"
                       "/1/model.pt)"}
    with pytest.raises(NotFoundError):
        load_source(tmp_path, "notes")


def test_a_load_request_s_config_must_be_a_json_object(tmp_path: pathlib.Path) -> None:
    """protobuf's JSON parser takes "[]" as an empty config, and a model of nothing
    loaded from it."""
    _model(tmp_path, "m", 'name: "m" platform: "pytorch_libtorch"', {"1": "model.pt"})
    for text in ("[]", " [1]", "1", "null", '"m"', ""):
        with pytest.raises(ModelConfigError, match=r"^the load request's 'config' of model "
                                                   r"'m': must be a JSON object$"):
            load_source(tmp_path, "m", text)


_FIELDS = [f.name for f in pb.ModelConfig.DESCRIPTOR.fields]
_TENSOR_FIELDS = [f.name for f in pb.ModelInput.DESCRIPTOR.fields] + \
    [f.name for f in pb.ModelOutput.DESCRIPTOR.fields]
_SCALARS = st.one_of(st.none(), st.booleans(), st.integers(-2**70, 2**70),
                     st.floats(allow_nan=False), st.text(max_size=12),
                     st.sampled_from(["TYPE_FP32", "TYPE_STRING", "KIND_GPU", "python",
                                      "ensemble", "pytorch_libtorch", "-1"]))
_VALUES = st.recursive(_SCALARS, lambda inner: st.one_of(
    st.lists(inner, max_size=4),
    st.dictionaries(st.sampled_from(_FIELDS + _TENSOR_FIELDS), inner, max_size=4)),
    max_leaves=12)
_TENSOR = st.dictionaries(st.sampled_from(_TENSOR_FIELDS), _VALUES, max_size=5)
_CONFIGS = st.fixed_dictionaries({}, optional={
    "name": st.just("m"), "max_batch_size": _VALUES, "input": st.lists(_TENSOR, max_size=3),
    "output": st.lists(_TENSOR, max_size=3)}).flatmap(
    lambda base: st.dictionaries(st.sampled_from(_FIELDS), _VALUES, max_size=4).map(
        lambda extra: {**extra, **base}))


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_CONFIGS)
def test_any_config_a_load_request_sends_is_served_or_refused_by_name(
        tmp_path_factory: pytest.TempPathFactory, config: dict[str, object]) -> None:
    """A load request's `config` is a client's JSON: whatever it holds, the load takes it
    or refuses it with a config error (a 400 naming the field), never another exception
    (a 500). 3,000 examples found only '[]' taken as an empty config."""
    root = tmp_path_factory.mktemp("fuzzed")
    _model(root, "m", 'name: "m" platform: "pytorch_libtorch"', {"1": "model.pt"})
    try:
        load_source(root, "m", json.dumps(config))
    except TensorgateError:
        pass


def test_fields_served_without_are_listed() -> None:
    spec = parse_model_config('name: "m" optimization { cuda { graphs: true } } '
                              'response_cache { enable: true } model_operations { '
                              'op_library_filename: "ops.so" }', "m/config.pbtxt")
    # graphs: true is what a GPU model gets anyway
    assert spec.ignored == ("model_operations",)
    assert spec.response_cache
    assert not parse_model_config('name: "m" response_cache { enable: false }').response_cache
    for policy in ("model_transaction_policy { decoupled: true }", "sequence_batching { }"):
        with pytest.raises(ModelConfigError, match=r"'response_cache' cannot be enabled on a "
                                                   r"decoupled or stateful"):
            parse_model_config(f'name: "m" response_cache {{ enable: true }} {policy}')


def test_other_backends_fields_are_named_as_served_without() -> None:
    """TensorRT's, DALI's and Triton's host-policy and namespace fields change nothing a
    PyTorch model computes: the load names each one, where they were dropped unsaid."""
    spec = parse_model_config("""
        name: "m" max_batch_size: 4
        input [ { name: "x" data_type: TYPE_FP32 dims: [2] is_non_linear_format_io: true } ]
        output [ { name: "y" data_type: TYPE_FP32 dims: [2] } ]
        instance_group [ { count: 1 kind: KIND_CPU },
                         { count: 1 kind: KIND_CPU host_policy: "numa0" profile: [ "0" ]
                           secondary_devices [ { kind: KIND_NVDLA device_id: 0 } ] } ]
        sequence_batching { state [ { input_name: "s_in" output_name: "s_out"
            data_type: TYPE_FP32 dims: [1] use_growable_memory: true } ] }
        """)
    assert spec.ignored == ("instance_group[1].host_policy",
                            "instance_group[1].secondary_devices",
                            "instance_group[1].profile", "input 'x' is_non_linear_format_io",
                            "sequence_batching.state[0].use_growable_memory")
    ensemble = parse_model_config(
        'name: "e" platform: "ensemble" max_batch_size: 4 ensemble_scheduling { step [ { '
        'model_name: "m" model_version: -1 model_namespace: "team" } ] }')
    assert ensemble.ignored == ("ensemble_scheduling.step[0].model_namespace (model names "
                                "are one namespace here)",)


def test_a_shape_tensor_is_refused_by_name() -> None:
    with pytest.raises(ModelConfigError, match=r"input 'shape' is_shape_tensor: a TensorRT "
                                               r"shape tensor, which tensorgate does not "
                                               r"serve"):
        parse_model_config('name: "m" max_batch_size: 4 input [ { name: "shape" data_type: '
                           'TYPE_INT32 dims: [2] is_shape_tensor: true } ]')


@pytest.mark.parametrize("field, value", [
    ("label_filename", "../../../etc/passwd"), ("label_filename", "sub/labels.txt"),
    ("label_filename", ".."), ("default_model_filename", "../2/model.py"),
    ("default_model_filename", "/abs/model.pt"),
])
def test_files_a_config_names_stay_in_the_model_directory(field: str, value: str) -> None:
    text = FULL.replace('label_filename: "labels.txt"', "")
    if field == "label_filename":
        text = text.replace("dims: [ 1000 ]", f'dims: [ 1000 ] label_filename: "{value}"')
    else:
        text += f'default_model_filename: "{value}"\n'
    with pytest.raises(ModelConfigError, match=f"{field} '{re.escape(value)}' must be a file "
                                               "name in"):
        parse_model_config(text, "resnet50/config.pbtxt", "resnet50")


def test_a_json_config_overrides_the_repository_s(tmp_path: pathlib.Path) -> None:
    folder = tmp_path / "resnet50"
    (folder / "1").mkdir(parents=True)
    (folder / "config.pbtxt").write_text(FULL)
    given = parse_model_config(FULL, "x", "resnet50").config_dict()
    given["max_batch_size"] = 8
    source = load_source(tmp_path, "resnet50", json.dumps(given))
    assert source.spec.max_batch_size == 8 and source.versions == (1,)
    assert load_source(tmp_path, "resnet50").spec.max_batch_size == 64
    with pytest.raises(ModelConfigError, match="^the load request's 'config' of model "
                                               "'resnet50': .*max_batch_sise"):
        load_source(tmp_path, "resnet50", json.dumps({**given, "max_batch_sise": 1}))
    with pytest.raises(NotFoundError):  # an override still needs the model's directory
        load_source(tmp_path, "resnet51", json.dumps(given))


def test_instance_counts_are_bounded() -> None:
    """A config (perhaps a client's load override) cannot start thousands of threads."""
    base = 'name: "m" platform: "pytorch_libtorch" '
    groups = parse_model_config(base + "instance_group [ { count: 200 kind: KIND_CPU }, "
                                       "{ count: 56 kind: KIND_CPU } ]").instance_groups
    assert sum(g.count for g in groups) == 256
    with pytest.raises(ModelConfigError, match=r"instance_group asks for 300 instances; at "
                                               r"most 256 are served \(each is a thread\)"):
        parse_model_config(base + "instance_group [ { count: 150 kind: KIND_GPU "
                                  "gpus: [ 0, 1 ] } ]")


def test_an_input_s_bounds_refuse_sizes_outside_them_and_give_the_least_for_zeros() -> None:
    """`bounds` (learned from a compiled model at load) narrow what a variable dim takes;
    a dim left (0, None) is as free as its -1, and zeros take each dim's least size."""
    spec = parse_model_config('name: "m" max_batch_size: 4 input [ { name: "x" '
                              'data_type: TYPE_FP32 dims: [ -1, -1, -1, 8 ] } ] output [ { '
                              'name: "y" data_type: TYPE_FP32 dims: [ 1 ] } ]', "m")
    free = spec.inputs[0]
    assert free.outside_bounds((0, 99, 1, 8)) is None and free.least_dims() == [1, 1, 1, 8]
    bounded = replace(free, bounds=((2, 16), (0, None), (4, 4), (8, 8)))
    assert bounded.least_dims() == [2, 1, 4, 8]
    assert bounded.row_bytes() == 4 * 2 * 1 * 4 * 8
    assert bounded.outside_bounds((2, 0, 4, 8)) is None
    assert bounded.outside_bounds((16, 10**9, 4, 8)) is None
    assert bounded.outside_bounds((1, 1, 4, 8)) == (0, "2 to 16")
    assert bounded.outside_bounds((17, 1, 4, 8)) == (0, "2 to 16")
    assert bounded.outside_bounds((3, 1, 5, 8)) == (2, "exactly 4")
    assert replace(free, bounds=((3, None), (0, None), (0, None), (8, 8))).outside_bounds(
        (2, 1, 1, 8)) == (0, "3 or more")


def test_a_model_file_under_a_platform_no_one_serves_is_not_loaded(
        tmp_path: pathlib.Path) -> None:
    """platform "torch_export" (a typo of pytorch_export) beside model.pt2 loaded the file
    anyway, as did "onnxruntime_onnx" beside a stray model.pt; Triton refuses an unknown
    platform. The error names a close match."""
    _model(tmp_path, "typo", 'name: "typo" platform: "torch_export"', {"1": "model.pt2"})
    with pytest.raises(ModelConfigError) as refused:
        artifact_path(load_source(tmp_path, "typo"), 1)
    assert str(refused.value) == (
        f"{tmp_path / 'typo' / '1'}: platform 'torch_export' is not one tensorgate serves (did "
        "you mean 'pytorch_export'?), so model.pt2 is not loaded by it: pytorch_libtorch "
        "serves model.pt, torch_aoti or pytorch_export model.pt2, backend python model.py, "
        "and platform ensemble its steps")
    _model(tmp_path, "other", 'name: "other" platform: "onnxruntime_onnx"', {"1": "model.pt"})
    with pytest.raises(ModelConfigError, match=r"platform 'onnxruntime_onnx' is not one "
                                               r"tensorgate serves, so model\.pt is not loaded"):
        artifact_path(load_source(tmp_path, "other"), 1)
    # a backend likewise: "pyhton" beside a model.py served it as a Python model
    _model(tmp_path, "misspelt", 'name: "misspelt" backend: "pyhton"', {"1": "model.py"})
    with pytest.raises(ModelConfigError) as refused:
        artifact_path(load_source(tmp_path, "misspelt"), 1)
    assert str(refused.value).startswith(
        f"{tmp_path / 'misspelt' / '1'}: backend 'pyhton' is not one tensorgate serves (did "
        "you mean 'python'?), so model.py is not loaded by it: ")
