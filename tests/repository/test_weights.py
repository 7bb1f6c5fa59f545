"""repository/weights.py: a model's weights read from a mapping and copied out of it mean
what `torch.load(weights_only=True)` gives — the same values, dtypes, shapes and strides,
containers, Parameters, tied storages — and leave nothing of the file mapped."""

from __future__ import annotations

import collections
import os
import pathlib
import warnings
import zipfile
from typing import Any

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from tensorgate.repository.weights import load_weights
from tests.repository.damage import damaged_copy

CPU = torch.device("cpu")


def _same(got: Any, want: Any) -> None:
    assert type(got) is type(want)
    if isinstance(want, torch.Tensor):
        assert got.dtype == want.dtype and got.shape == want.shape
        assert got.stride() == want.stride() and got.storage_offset() == want.storage_offset()
        assert got.requires_grad == want.requires_grad and got.device == want.device
        assert torch.equal(got.detach(), want.detach())
    elif isinstance(want, dict):
        assert list(got) == list(want)
        assert getattr(got, "_metadata", None) == getattr(want, "_metadata", None)
        for key in want:
            _same(got[key], want[key])
    elif isinstance(want, (list, tuple)):
        assert len(got) == len(want)
        for a, b in zip(got, want):
            _same(a, b)
    else:
        assert got == want


def _saved(path: pathlib.Path, value: Any, **options: Any) -> pathlib.Path:
    torch.save(value, path, **options)
    return path


def test_a_state_dict_means_what_torch_load_gives(tmp_path: pathlib.Path) -> None:
    module = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.BatchNorm2d(4),
                                 torch.nn.Linear(5, 2))
    path = _saved(tmp_path / "state.pt", module.state_dict())
    got = load_weights(path, CPU)
    _same(got, torch.load(path, weights_only=True))
    assert isinstance(got, collections.OrderedDict) and got._metadata  # load_state_dict's
    module.load_state_dict(got)


def test_containers_dtypes_views_and_parameters_keep_their_kind(tmp_path: pathlib.Path
                                                                ) -> None:
    base = torch.arange(24, dtype=torch.float64).reshape(4, 6)
    value = {
        "base": base, "row": base[1], "column": base[:, 2], "transposed": base.t(),
        "ints": torch.arange(5, dtype=torch.int16), "halves": torch.rand(3).half(),
        "flags": torch.tensor([True, False]), "empty": torch.empty(0, 3),
        "scalar": torch.tensor(2.5), "grad": torch.ones(2, requires_grad=True),
        "parameter": torch.nn.Parameter(torch.rand(3)),
        "frozen": torch.nn.Parameter(torch.rand(2), requires_grad=False),
        "nested": [torch.rand(2), (torch.rand(1), 3, "text"), {"deep": [base[2:, 1:4]]}],
        "plain": {"n": 7, "name": "w", "f": 0.5, "none": None, "size": torch.Size([2, 3])},
    }
    path = _saved(tmp_path / "mixed.pt", value)
    got = load_weights(path, CPU)
    _same(got, torch.load(path, weights_only=True))
    # views of one storage share one copy, as torch.load's do: tied weights stay tied
    storage = got["base"].untyped_storage().data_ptr()
    assert all(got[k].untyped_storage().data_ptr() == storage
               for k in ("row", "column", "transposed"))
    assert got["nested"][2]["deep"][0].untyped_storage().data_ptr() == storage
    got["base"][1, 0] = -1.0
    assert got["row"][0] == -1.0


def test_nothing_of_the_file_stays_mapped(tmp_path: pathlib.Path) -> None:
    """The copies do not read the file: it may be replaced or cut short while the model
    serves (a mapping of a file cut short faults the process when read)."""
    if not pathlib.Path("/proc/self/maps").exists():
        pytest.skip("needs /proc/self/maps (Linux)")
    path = _saved(tmp_path / "weights-unmapped.pt", {"w": torch.rand(1 << 18)})
    want = torch.load(path, weights_only=True)["w"]
    got = load_weights(path, CPU)
    assert "weights-unmapped.pt" not in pathlib.Path("/proc/self/maps").read_text()
    os.truncate(path, 0)
    assert torch.equal(got["w"], want)


def test_old_format_and_quantized_files_are_read_as_torch_load_reads_them(
        tmp_path: pathlib.Path) -> None:
    base = torch.arange(6.0)
    old = _saved(tmp_path / "old.pt", {"a": base, "b": base[2:]},
                 _use_new_zipfile_serialization=False)
    _same(load_weights(old, CPU), torch.load(old, weights_only=True))
    with warnings.catch_warnings():  # torch's own: quantized tensors, their typed storage
        warnings.simplefilter("ignore", UserWarning)
        quantized = torch.quantize_per_tensor(torch.rand(4), 0.1, 0, torch.quint8)
        path = _saved(tmp_path / "quantized.pt", {"q": quantized, "f": torch.rand(2)})
        got = load_weights(path, CPU)
    assert got["q"].is_quantized and torch.equal(got["q"].int_repr(), quantized.int_repr())
    assert torch.equal(got["f"], torch.load(path, weights_only=True)["f"])


class Opaque:
    """An object a weights-only load refuses (it would be code)."""


def test_a_file_that_is_not_weights_is_refused_as_torch_load_refuses_it(
        tmp_path: pathlib.Path) -> None:
    path = _saved(tmp_path / "code.pt", {"object": Opaque()})
    with pytest.raises(Exception, match="Weights only load failed"):
        load_weights(path, CPU)


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_weights_land_on_the_gpu(tmp_path: pathlib.Path) -> None:
    base = torch.rand(4, 4)
    path = _saved(tmp_path / "gpu.pt", {"w": base, "row": base[1]})
    got = load_weights(path, torch.device("cuda", 0))
    assert got["w"].device.type == "cuda"
    assert got["row"].untyped_storage().data_ptr() == got["w"].untyped_storage().data_ptr()
    assert torch.equal(got["row"].cpu(), base[1])


def _outcome(read: Any) -> Any:
    try:
        return "read", {key: value.tolist() for key, value in read().items()}
    except Exception as error:  # noqa: BLE001 - which refusal, compared
        return "refused", type(error).__name__


_GOOD = {"w": torch.arange(300, dtype=torch.float32).reshape(3, 100), "b": torch.ones(3)}


@settings(max_examples=60, deadline=None)
@given(cut=st.booleans(), at=st.floats(0, 1, exclude_max=True), bit=st.integers(0, 7))
def test_a_damaged_file_reads_or_is_refused_as_torch_load_does(
        tmp_path_factory: pytest.TempPathFactory, cut: bool, at: float, bit: int) -> None:
    """A file cut short or with one bit flipped: the same values as torch.load's (mapping
    to the CPU, as load_weights does), or a refusal of the same kind (the mapped read falls
    back to torch.load, which names what is wrong). A sweep of every byte and bit of this
    file (the forty-eighth session) left damage where the two differ only in the central
    directory's fields where torch.load reads values that change from call to call (a
    record's compression method: it inflates the stored bytes): no answer to match there,
    and it must be seen to change."""
    good = _saved(tmp_path_factory.mktemp("damaged") / "good.pt", _GOOD).read_bytes()
    path = damaged_copy(good, tmp_path_factory.mktemp("damaged"), cut, at, bit)
    expected = _outcome(lambda: torch.load(path, map_location=CPU, weights_only=True))
    got = _outcome(lambda: load_weights(path, CPU))
    if got != expected:
        again = {str(_outcome(lambda: torch.load(path, map_location=CPU, weights_only=True)))
                 for _ in range(4)}
        assert len(again | {str(expected)}) > 1, (got, expected)  # torch.load's varies


def test_a_record_whose_local_header_lost_its_signature_is_refused_as_torch_load_refuses_it(
        tmp_path: pathlib.Path) -> None:
    """Found by the test above (a bit flipped at 67 % of the file): torch.load's reader
    checks each record's local header, the mapped load did not and read the file."""
    good = _saved(tmp_path / "good.pt", _GOOD)
    with zipfile.ZipFile(good) as archive:
        offsets = [info.header_offset for info in archive.infolist()]
    for at in offsets:
        damaged = bytearray(good.read_bytes())
        damaged[at + 2] ^= 1  # "PK\x03\x04" → "PK\x02\x04"
        path = tmp_path / f"damaged-{at}.pt"
        path.write_bytes(damaged)
        assert _outcome(lambda: load_weights(path, CPU)) == _outcome(
            lambda: torch.load(path, map_location=CPU, weights_only=True)), at


@pytest.mark.parametrize("where", ["zip64 locator", "storage size"])
def test_damage_the_mapped_load_does_not_check_is_judged_as_torch_load_judges_it(
        tmp_path: pathlib.Path, where: str) -> None:
    """Found by a sweep of every byte and bit: the zip64 end locator's disk count damaged
    (zipfile.is_zipfile raised BadZipFile where torch.load reads the file), and a storage's
    element count in the pickle (the mapped load read past its record where torch.load
    refuses the file)."""
    good = _saved(tmp_path / "good.pt", {"w": torch.arange(300, dtype=torch.float32)})
    data = bytearray(good.read_bytes())
    if where == "zip64 locator":
        at = data.rindex(b"PK\x06\x07") + 4  # the number of the disk with the zip64 end
        data[at] ^= 1
    else:
        at = data.index(b"M,\x01")  # the pickle's BININT2 300: the storage's elements
        data[at + 1] ^= 1  # 300 -> 301
    path = tmp_path / "damaged.pt"
    path.write_bytes(data)
    expected = _outcome(lambda: torch.load(path, map_location=CPU, weights_only=True))
    assert expected[0] == ("read" if where == "zip64 locator" else "refused")
    assert _outcome(lambda: load_weights(path, CPU)) == expected
