"""tensorgate.python_backend, the `triton_python_backend_utils` a Triton Python model
imports: its tensors are views (DLPack and numpy share memory with what they wrap), its type
tables agree with Triton's config enum, BYTES serialize and deserialize as the wire does."""

from __future__ import annotations

import json
import pathlib

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from tritonclient.grpc import model_config_pb2 as config_pb

from tensorgate import python_backend as pb_utils
from tensorgate import python_backend_server
from tensorgate.tensor.bytes_codec import decode_bytes_tensor


def test_tensors_share_memory_with_what_they_wrap() -> None:
    array = np.arange(6, dtype=np.float32).reshape(2, 3)
    tensor = pb_utils.Tensor("x", array)
    assert tensor.as_numpy() is array and tensor.shape() == [2, 3]
    assert tensor.triton_dtype() == config_pb.TYPE_FP32 and tensor.is_cpu()
    viewed = torch.utils.dlpack.from_dlpack(tensor.to_dlpack())
    assert viewed.data_ptr() == array.ctypes.data  # no copy
    back = pb_utils.Tensor.from_dlpack("y", torch.utils.dlpack.to_dlpack(viewed))
    assert back.as_numpy().ctypes.data == array.ctypes.data and back.name() == "y"
    assert torch.from_dlpack(back).data_ptr() == array.ctypes.data  # __dlpack__ too


def test_tensor_refuses_what_triton_refuses() -> None:
    with pytest.raises(pb_utils.TritonModelException, match="use np.object_ for BYTES"):
        pb_utils.Tensor("s", np.array(["a", "b"]))
    with pytest.raises(pb_utils.TritonModelException, match="complex128"):
        pb_utils.Tensor("c", np.array([1j]))
    complex_ = torch.zeros(2, dtype=torch.complex64)  # a torch dtype no datatype holds
    with pytest.raises(pb_utils.TritonModelException, match="complex64"):
        pb_utils.Tensor.from_dlpack("c", torch.utils.dlpack.to_dlpack(complex_))
    with pytest.raises(pb_utils.TritonModelException, match="complex64"):
        pb_utils.Tensor("c", complex_)
    with pytest.raises(TypeError, match="'output_tensors' must be a list"):
        pb_utils.InferenceResponse(pb_utils.Tensor("t", np.zeros(1)))
    text = pb_utils.Tensor("t", np.array([b"a"], dtype=np.object_))
    with pytest.raises(pb_utils.TritonModelException, match="BYTES, which DLPack cannot carry"):
        text.to_dlpack()
    brain = pb_utils.Tensor("b", torch.zeros(2, dtype=torch.bfloat16))
    with pytest.raises(pb_utils.TritonModelException, match="BF16, which numpy cannot hold"):
        brain.as_numpy()
    assert brain.triton_dtype() == config_pb.TYPE_BF16


def test_a_given_triton_dtype_reads_the_bytes_as_that_type() -> None:
    raw = np.array([1.0, 2.0], dtype=np.float32).view(np.uint8)
    tensor = pb_utils.Tensor("x", raw, triton_dtype=config_pb.TYPE_FP32)
    assert tensor.as_numpy().tolist() == [1.0, 2.0]


@pytest.mark.parametrize("config_name, numpy_type", [
    ("TYPE_BOOL", np.bool_), ("TYPE_UINT8", np.uint8), ("TYPE_UINT32", np.uint32),
    ("TYPE_INT16", np.int16), ("TYPE_INT32", np.int32), ("TYPE_INT64", np.int64),
    ("TYPE_FP16", np.float16), ("TYPE_FP32", np.float32), ("TYPE_FP64", np.float64),
    ("TYPE_STRING", np.object_)])
def test_type_tables_agree_with_triton_s_config_enum(config_name: str, numpy_type: type) -> None:
    number = config_pb.DataType.Value(config_name)
    by_name = pb_utils.triton_string_to_numpy(config_name)
    # TYPE_BOOL is Python's bool in Triton's table, which numpy reads as its own bool
    assert by_name is (bool if config_name == "TYPE_BOOL" else numpy_type)
    assert pb_utils.TRITON_STRING_TO_NUMPY[config_name] is by_name
    assert np.dtype(by_name) == np.dtype(numpy_type)
    assert pb_utils.triton_to_numpy_type(number) is numpy_type
    assert pb_utils.numpy_to_triton_type(numpy_type) == number


def test_type_lookups_answer_what_has_no_type_as_triton_s_do() -> None:
    """Triton's module (tools/triton_diff.py's probe model compared them): a type name with
    no numpy type is a KeyError, a number with none is None, and so is numpy's str_."""
    with pytest.raises(KeyError, match="no numpy type for config type 'TYPE_X'"):
        pb_utils.triton_string_to_numpy("TYPE_X")
    with pytest.raises(KeyError, match="'TYPE_BF16'"):
        pb_utils.triton_string_to_numpy("TYPE_BF16")
    assert pb_utils.triton_to_numpy_type(99) is None
    assert pb_utils.triton_to_numpy_type(config_pb.TYPE_BF16) is None
    assert pb_utils.triton_to_numpy_type(0) is None
    assert pb_utils.numpy_to_triton_type(np.complex64) is None
    assert pb_utils.numpy_to_triton_type(np.str_) is None
    assert pb_utils.numpy_to_triton_type(np.bytes_) == config_pb.TYPE_STRING


def test_the_rest_of_triton_s_module() -> None:
    """What Triton's pb_utils has besides: its decoupled check, PreferredMemory for BLS
    calls (with its memory kinds numbered as Triton's module numbers them), set_flags,
    Logger.LogLevel."""
    assert pb_utils.using_decoupled_model_transaction_policy(
        {"model_transaction_policy": {"decoupled": True}}) is True
    assert pb_utils.using_decoupled_model_transaction_policy(
        {"model_transaction_policy": {}}) is False
    assert pb_utils.using_decoupled_model_transaction_policy({}) is False
    assert (pb_utils.TRITONSERVER_MEMORY_GPU, pb_utils.TRITONSERVER_MEMORY_CPU) == (0, 1)
    memory = pb_utils.PreferredMemory(pb_utils.TRITONSERVER_MEMORY_CPU, 0)
    request = pb_utils.InferenceRequest(model_name="m", preferred_memory=memory)
    request.set_flags(pb_utils.TRITONSERVER_REQUEST_FLAG_SEQUENCE_START)
    assert request.flags() == pb_utils.TRITONSERVER_REQUEST_FLAG_SEQUENCE_START
    assert pb_utils.Logger.LogLevel.ERROR == pb_utils.Logger.ERROR
    with pytest.raises(pb_utils.TritonModelException, match="no response sender"):
        request.get_response_sender()  # a BLS request's


def test_every_name_triton_s_module_has_is_here() -> None:
    """Triton 2.51's triton_python_backend_utils' names (tools/triton_diff.py, "probe api
    module"), its imports included: a model may reach numpy as pb_utils.np. Two left with
    the Tensor's move to python_backend_tensor.py, and only the diff against Triton saw it."""
    tritons = ("InferenceRequest", "InferenceResponse", "Logger", "MetricFamily",
               "ModelConfig", "PreferredMemory", "TRITONSERVER_MEMORY_CPU",
               "TRITONSERVER_MEMORY_GPU", "TRITONSERVER_REQUEST_FLAG_SEQUENCE_END",
               "TRITONSERVER_REQUEST_FLAG_SEQUENCE_START", "TRITONSERVER_REQUEST_RELEASE_ALL",
               "TRITONSERVER_REQUEST_RELEASE_RESCHEDULE", "TRITONSERVER_RESPONSE_COMPLETE_FINAL",
               "TRITON_STRING_TO_NUMPY", "Tensor", "TritonError", "TritonModelException",
               "deserialize_bytes_tensor", "get_input_config_by_name",
               "get_input_tensor_by_name", "get_model_dir", "get_output_config_by_name",
               "get_output_tensor_by_name", "is_model_ready", "json", "load_model", "np",
               "numpy_to_triton_type", "serialize_byte_tensor", "struct",
               "triton_string_to_numpy", "triton_to_numpy_type", "unload_model",
               "using_decoupled_model_transaction_policy")
    assert [name for name in tritons if not hasattr(pb_utils, name)] == []
    assert pb_utils.np is np


def test_get_model_dir_is_the_running_model_s_folder(tmp_path) -> None:
    before = python_backend_server.running_in(str(tmp_path))
    try:
        assert pb_utils.get_model_dir() == str(tmp_path)
    finally:
        python_backend_server.running_in(before)
    # elsewhere (a thread of the model's own): the folder of the module that asks
    assert pb_utils.get_model_dir() == str(pathlib.Path(__file__).parent)


@settings(max_examples=200, deadline=None)
@given(items=st.lists(st.binary(max_size=12) | st.text(max_size=6) | st.integers(), max_size=6))
def test_bytes_serialize_in_the_wire_layout_and_back(items: list[bytes | str | int]) -> None:
    """As Triton's: bytes, in the wire layout; each element that is not bytes as its str()
    in UTF-8; () for an empty tensor."""
    array = np.array(items, dtype=np.object_)
    serialized = pb_utils.serialize_byte_tensor(array)
    expected = [i if isinstance(i, bytes) else str(i).encode() for i in items]
    if not items:
        assert serialized == ()
        return
    assert isinstance(serialized, bytes)
    assert decode_bytes_tensor(memoryview(serialized), 0, len(serialized), (len(items),),
                               "x").tolist() == expected
    assert pb_utils.deserialize_bytes_tensor(serialized).tolist() == expected


def test_bytes_serialize_only_objects_and_numpy_bytes() -> None:
    assert pb_utils.serialize_byte_tensor(np.array([[b"ab"], [b"c"]])) == \
        b"\x02\x00\x00\x00ab\x01\x00\x00\x00c"  # numpy bytes, in C order
    assert pb_utils.serialize_byte_tensor(np.array([1, 2], np.int32)) is None
    assert pb_utils.serialize_byte_tensor(np.array(["a"])) is None  # numpy str_, as Triton


def test_deserialize_refuses_an_element_past_the_end() -> None:
    with pytest.raises(pb_utils.TritonModelException, match="runs past the end"):
        pb_utils.deserialize_bytes_tensor(b"\x05\x00\x00\x00abc")


def test_requests_responses_and_errors() -> None:
    tensor = pb_utils.Tensor("x", np.zeros(1, np.float32))
    request = pb_utils.incoming_request([tensor], "id-1", 7, ["y"], json.dumps({"k": 1}), 3,
                                        lambda: True)
    assert pb_utils.get_input_tensor_by_name(request, "x") is tensor
    assert pb_utils.get_input_tensor_by_name(request, "z") is None
    assert (request.request_id(), request.correlation_id(), request.flags()) == ("id-1", 7, 3)
    assert json.loads(request.parameters()) == {"k": 1} and request.is_cancelled()
    with pytest.raises(pb_utils.TritonModelException, match="has no response sender"):
        request.get_response_sender()  # the server gave it no way to make one
    bls = pb_utils.InferenceRequest(model_name="other", inputs=[tensor],
                                    requested_output_names=["y"], model_version=2)
    assert (bls.model_name(), bls.model_version(), bls.inputs()) == ("other", 2, [tensor])
    python_backend_server.serve_bls(None)  # as before an engine starts, or after it stopped
    with pytest.raises(pb_utils.TritonModelException, match="no server is running to take "
                                                            "BLS requests"):
        bls.exec()
    response = pb_utils.InferenceResponse([tensor], parameters={"n": 1})
    assert pb_utils.get_output_tensor_by_name(response, "x") is tensor
    assert not response.has_error() and json.loads(response.parameters()) == {"n": 1}
    with pytest.raises(TypeError, match="must be a list"):
        pb_utils.InferenceResponse(tensor)  # type: ignore[arg-type]
    error = pb_utils.TritonError("bad", pb_utils.TritonError.NOT_FOUND)
    assert pb_utils.InferenceResponse(error=error).error() is error
    assert (error.message(), error.code()) == ("bad", pb_utils.TritonError.NOT_FOUND)
    assert pb_utils.TritonError("x").code() == pb_utils.TritonError.INTERNAL


def test_a_sender_takes_nothing_after_its_final_flag() -> None:
    sent: list[tuple[object, int]] = []
    sender = pb_utils.InferenceResponseSender(lambda r, f: sent.append((r, f)), lambda: False)
    response = pb_utils.InferenceResponse([])
    with pytest.raises(TypeError, match="send\\(\\) takes a pb_utils.InferenceResponse, not a str"):
        sender.send("text")  # type: ignore[arg-type]  # TypeError, as Triton's raises
    sender.send(response)
    sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
    with pytest.raises(pb_utils.TritonModelException, match="already sent its final flag"):
        sender.send(response)
    assert sent == [(response, 0), (None, pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)]


def test_config_lookups() -> None:
    config = {"input": [{"name": "a", "data_type": "TYPE_FP32"}],
              "output": [{"name": "b", "data_type": "TYPE_INT64"}]}
    assert pb_utils.get_input_config_by_name(config, "a") == config["input"][0]
    assert pb_utils.get_output_config_by_name(config, "b") == config["output"][0]
    assert pb_utils.get_output_config_by_name(config, "a") is None
    assert pb_utils.get_input_config_by_name({}, "a") is None


def _config(**given: object) -> pb_utils.ModelConfig:
    return pb_utils.ModelConfig(json.dumps({"name": "m", "max_batch_size": 0, "input": [],
                                            "output": [], **given}))


def test_model_config_completes_what_the_config_leaves_open() -> None:
    config = _config(input=[{"name": "A", "data_type": "TYPE_INVALID", "dims": []}])
    config.add_input({"name": "A", "data_type": "TYPE_FP32", "dims": (4,), "optional": True})
    config.add_input({"name": "B", "data_type": "TYPE_INT64", "dims": [-1]})
    config.add_output({"name": "Y", "data_type": "TYPE_STRING", "dims": [1]})
    config.set_max_batch_size(8)
    config.set_dynamic_batching()
    config.set_model_transaction_policy({"decoupled": True})
    assert config.as_dict() == {
        "name": "m", "max_batch_size": 8, "dynamic_batching": {},
        "model_transaction_policy": {"decoupled": True},
        "input": [{"name": "A", "data_type": "TYPE_FP32", "dims": [4], "optional": True},
                  {"name": "B", "data_type": "TYPE_INT64", "dims": [-1]}],
        "output": [{"name": "Y", "data_type": "TYPE_STRING", "dims": [1]}]}
    kept = _config(max_batch_size=2, dynamic_batching={"max_queue_delay_microseconds": 5})
    kept.set_max_batch_size(4)  # a smaller configured size stands (Triton's documentation)
    kept.set_dynamic_batching()  # and the configured batcher's settings
    assert kept.as_dict()["max_batch_size"] == 2
    assert kept.as_dict()["dynamic_batching"] == {"max_queue_delay_microseconds": 5}


@pytest.mark.parametrize("call, message", [
    (lambda c: c.add_input({"name": "A", "data_type": "TYPE_FP32"}),
     "input 'A' in auto-complete-config function for model 'm' is missing 'dims'"),
    (lambda c: c.add_input({"data_type": "TYPE_FP32", "dims": [1]}), "missing 'name'"),
    (lambda c: c.add_output({"name": "Y", "data_type": "TYPE_FP32", "dims": [1],
                             "optional": True}), "contains property other than"),
    (lambda c: c.add_input({"name": "C", "data_type": "TYPE_FP16", "dims": [3]}),
     "configuration expects datatype TYPE_FP32 for input 'C', model provides TYPE_FP16"),
    (lambda c: c.add_input({"name": "C", "data_type": "TYPE_FP32", "dims": [4]}),
     r"the model expects dims \[4\] but the model configuration specifies dims \[3\]"),
    (lambda c: c.set_max_batch_size(2),
     "configuration specified max_batch_size 3, but auto-complete-config function for model "
     "'m' specified max_batch_size 2"),
    (lambda c: c.set_max_batch_size(-1), "must be an integer, 0 or more"),
    (lambda c: c.set_model_transaction_policy({"decoupled": False}),
     "decoupled property .* already set to True"),
    (lambda c: c.set_model_transaction_policy({"invalid": "argument"}),
     "contains property other than 'decoupled': invalid"),
    (lambda c: c.add_input("A"), "is a str, not a dict"),
])
def test_model_config_refuses_what_contradicts_the_config(call, message: str) -> None:
    config = _config(max_batch_size=3, model_transaction_policy={"decoupled": True},
                     input=[{"name": "C", "data_type": "TYPE_FP32", "dims": [3]}])
    before = json.dumps(config.as_dict())
    with pytest.raises(ValueError, match=message):
        call(config)
    assert json.dumps(config.as_dict()) == before


def test_set_dynamic_batching_refuses_another_batcher() -> None:
    with pytest.raises(ValueError, match="scheduling_choice as 'sequence_batching'"):
        _config(sequence_batching={}).set_dynamic_batching()
