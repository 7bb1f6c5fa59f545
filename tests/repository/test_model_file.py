"""What a model file holds, told without unpickling it (repository/model_file.py): each kind
PyTorch writes, a pickle that would run code if loaded (it is not), and any bytes at all."""

from __future__ import annotations

import io
import pathlib
import pickle
import zipfile

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from tensorgate.repository.model_file import ModelFile, inspect_model_file, wrong_model_file


def _module() -> torch.nn.Module:
    return torch.nn.Sequential(torch.nn.Linear(4, 2)).eval()


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, pathlib.Path]:
    folder = tmp_path_factory.mktemp("model_files")
    module = _module()
    made = {name: folder / name for name in ("script", "module", "state_dict", "checkpoint",
                                             "legacy", "legacy_dict", "export")}
    torch.jit.script(module).save(str(made["script"]))
    torch.save(module, made["module"])
    torch.save(module.state_dict(), made["state_dict"])
    torch.save({"model": module.state_dict(), "epoch": 3}, made["checkpoint"])
    torch.save(module, made["legacy"], _use_new_zipfile_serialization=False)
    torch.save({"w": torch.ones(2)}, made["legacy_dict"], _use_new_zipfile_serialization=False)
    torch.export.save(torch.export.export(module, (torch.zeros(2, 4),)), made["export"])
    return made


def test_each_kind_pytorch_writes_is_told_apart(files: dict[str, pathlib.Path]) -> None:
    assert {name: inspect_model_file(path) for name, path in files.items()} == {
        "script": ModelFile("torchscript"),
        "module": ModelFile("checkpoint", "torch.nn.modules.container.Sequential"),
        "state_dict": ModelFile("checkpoint", "collections.OrderedDict"),
        "checkpoint": ModelFile("checkpoint", "dict"),
        "legacy": ModelFile("legacy checkpoint", "torch.nn.modules.container.Sequential"),
        "legacy_dict": ModelFile("legacy checkpoint", "dict"),
        "export": ModelFile("export")}


def test_what_to_do_instead_is_said_for_the_wrong_kind_only(
        files: dict[str, pathlib.Path]) -> None:
    assert wrong_model_file(files["script"], "torchscript") is None
    assert wrong_model_file(files["export"], "pt2") is None
    assert wrong_model_file(files["script"], "pt2") == (
        "script is TorchScript (torch.jit.save): name it model.pt (a model.pt2 is a "
        "torch.export program or an AOTInductor package)")
    assert wrong_model_file(files["export"], "torchscript") == (
        "export is a torch.export program (torch.export.save): name it model.pt2 (a model.pt "
        "is TorchScript)")
    said = wrong_model_file(files["state_dict"], "torchscript")
    assert said is not None and said.startswith(
        "state_dict is a dict (a state_dict or a training checkpoint: weights without the "
        "code that runs them) written by torch.save, not a model tensorgate loads (it does "
        "not unpickle models")
    assert "torch.jit.script(module).save(path)" in said and "model.pt2" in said
    legacy = wrong_model_file(files["legacy"], "pt2")
    assert legacy is not None and legacy.startswith(
        "legacy is a pickled torch.nn.modules.container.Sequential written by torch.save in "
        "its pre-1.6 format, not a model")


class _Trap:
    """Unpickled, it would call open() to make a file: the inspection must not."""

    def __init__(self, path: str) -> None:
        self.path = path

    def __reduce__(self) -> tuple[object, tuple[str, str]]:
        return (open, (self.path, "w"))


def test_a_pickle_that_would_run_code_is_named_not_run(tmp_path: pathlib.Path) -> None:
    made = tmp_path / "made-by-unpickling"
    hostile = tmp_path / "model.pt"
    with zipfile.ZipFile(hostile, "w") as archive:  # torch.save's layout, a hostile object
        archive.writestr("model/data.pkl", pickle.dumps(_Trap(str(made)), protocol=2))
        archive.writestr("model/version", "3\n")
    assert inspect_model_file(hostile) == ModelFile("checkpoint", "io.open")
    legacy = tmp_path / "legacy.pt"
    legacy.write_bytes(b"".join(pickle.dumps(part, protocol=2) for part in (
        0x1950A86A20F9469CFC6C, 1001, {"protocol_version": 1001})) +
        pickle.dumps(_Trap(str(made)), protocol=2))
    assert inspect_model_file(legacy) == ModelFile("legacy checkpoint", "io.open")
    assert not made.exists()


def test_files_that_are_nothing_of_the_sort_are_unknown(tmp_path: pathlib.Path) -> None:
    cases = {"empty": b"", "text": b"not a model\n", "pickle-ish": b"\x80",
             "zip of nothing": _zip({"a/readme": b"hello"}),
             "cut short": _zip({"a/data.pkl": pickle.dumps({"w": 1}, protocol=2)})[:40]}
    for name, data in cases.items():
        (tmp_path / name).write_bytes(data)
    found = {name: inspect_model_file(tmp_path / name).kind for name in cases}
    assert found == dict.fromkeys(cases, "unknown")
    assert inspect_model_file(tmp_path / "missing").kind == "unknown"
    assert all(wrong_model_file(tmp_path / name, "torchscript") is None
               for name in cases)


def test_a_pickle_claiming_a_huge_string_is_not_read_for_it(tmp_path: pathlib.Path) -> None:
    """pickletools reads a string's length from the file, then asks for that many bytes: a
    file claiming 2**56 made it ask Python for an impossible buffer (MemoryError, found by
    the fuzz below), and a few GB would have been allocated. At most 64 KiB is read."""
    huge = b"\x8d" + (1 << 56).to_bytes(8, "little") + b"x"  # BINUNICODE8 of 2**56 bytes
    legacy_magic = pickle.dumps(0x1950A86A20F9469CFC6C, protocol=2)
    cases = {"bare": b"\x80\x02" + huge,
             "after the magic": legacy_magic + b"\x80\x02" + huge,
             "as data.pkl": _zip({"m/data.pkl": b"\x80\x02" + huge})}
    for name, data in cases.items():
        (tmp_path / name).write_bytes(data)
    assert {name: inspect_model_file(tmp_path / name) for name in cases} == {
        "bare": ModelFile("unknown"), "after the magic": ModelFile("unknown"),
        "as data.pkl": ModelFile("checkpoint")}


def _zip(members: dict[str, bytes]) -> bytes:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        for name, data in members.items():
            archive.writestr(name, data)
    return buffer.getvalue()


@settings(max_examples=150, deadline=None)
@given(st.binary(max_size=512), st.booleans())
def test_any_bytes_are_inspected_without_an_error(tmp_path_factory: pytest.TempPathFactory,
                                                   data: bytes, as_pickle: bool) -> None:
    path = tmp_path_factory.mktemp("fuzz") / "model.pt"
    path.write_bytes(_zip({"m/data.pkl": data}) if as_pickle else data)
    found = inspect_model_file(path)
    assert found.kind in ("checkpoint", "legacy checkpoint", "unknown", "torchscript")
    assert isinstance(found.describe(), str)
