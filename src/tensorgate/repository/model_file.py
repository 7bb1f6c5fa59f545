"""What a model file holds, told from its zip listing and its pickle's first opcodes, never
by unpickling it: for the error of a load that failed.

The most common mistake in a PyTorch repository is a `model.pt` written by `torch.save` (a
pickled `nn.Module`, a state_dict, a training checkpoint) where TorchScript belongs;
`torch.jit.load` then says the file "is corrupted" ("failed locating file constants.pkl").
Unpickling it to look would run whatever code the pickle names, so this reads what the
archive lists and which class the pickle's first opcodes name (`pickletools.genops` parses
opcodes without executing them), and says what the file is and what to do instead.
"""

from __future__ import annotations

import pathlib
import pickletools
import zipfile
from dataclasses import dataclass
from typing import Any

__all__ = ["ModelFile", "inspect_model_file", "is_aoti_package", "wrong_model_file"]

# opcodes a pickle's top object starts with, before its class or container is known
_STRINGS = {"SHORT_BINUNICODE", "BINUNICODE", "BINUNICODE8", "UNICODE", "SHORT_BINSTRING",
            "BINSTRING", "STRING"}
_SKIPPED = {"PROTO", "FRAME", "MARK", "MEMOIZE", "PUT", "BINPUT", "LONG_BINPUT"}
_CONTAINERS = {"EMPTY_DICT": "dict", "DICT": "dict", "EMPTY_LIST": "list", "LIST": "list",
               "EMPTY_TUPLE": "tuple", "TUPLE": "tuple"}
_OPCODES_READ = 64  # of a pickle, at most (_bounded)
_READ_BYTES = 64 << 10  # of a pickle, at most: its first opcodes are all that is looked at
_LEGACY_MAGIC = 0x1950A86A20F9469CFC6C  # the first pickle of a legacy torch.save file


@dataclass(frozen=True)
class ModelFile:
    """`kind`: "torchscript", "export" (a torch.export program), "aoti" (an AOTInductor
    package), "checkpoint" (torch.save), "legacy checkpoint" (torch.save before PyTorch
    1.6), or "unknown"; `top`: a checkpoint's top object ("dict", "collections.OrderedDict",
    "torch.nn.modules.linear.Linear"), when its opcodes name it."""

    kind: str
    top: str | None = None

    def describe(self) -> str:
        if self.kind == "torchscript":
            return "TorchScript (torch.jit.save)"
        if self.kind == "export":
            return "a torch.export program (torch.export.save)"
        if self.kind == "aoti":
            return "an AOTInductor package (torch._inductor.aoti_compile_and_package)"
        if self.kind in ("checkpoint", "legacy checkpoint"):
            what = ("a dict (a state_dict or a training checkpoint: weights without the code "
                    "that runs them)" if self.top in ("dict", "collections.OrderedDict")
                    else f"a pickled {self.top}" if self.top is not None
                    else "a pickled object")
            legacy = " in its pre-1.6 format" if self.kind == "legacy checkpoint" else ""
            return f"{what} written by torch.save{legacy}"
        return "not a PyTorch archive tensorgate recognises"


def inspect_model_file(path: pathlib.Path) -> ModelFile:
    """What `path` holds (ModelFile.kind), read without running any of it."""
    try:
        with zipfile.ZipFile(path) as archive:
            names = archive.namelist()
            if any("/data/aotinductor/" in name for name in names):  # (aoti_check asks)
                return ModelFile("aoti")
            if any("/code/" in name or name.endswith("/constants.pkl") for name in names):
                return ModelFile("torchscript")
            if any(name.endswith("/models/model.json") for name in names):
                return ModelFile("export")
            pickled = next((name for name in names if name.endswith("/data.pkl")
                            and name.count("/") == 1), None)
            if pickled is None:
                return ModelFile("unknown")
            with archive.open(pickled) as stream:
                return ModelFile("checkpoint", _top_object(_Capped(stream)))
    except zipfile.BadZipFile:
        pass
    except OSError:
        return ModelFile("unknown")
    try:
        with path.open("rb") as stream:
            if stream.peek(1)[:1] != b"\x80":  # a pickle's PROTO, as torch.save writes it
                return ModelFile("unknown")
            return _legacy(_Capped(stream))
    except OSError:
        return ModelFile("unknown")


def is_aoti_package(path: pathlib.Path) -> bool:
    """Whether a model.pt2 is an AOTInductor package (not a torch.export program)."""
    return inspect_model_file(path).kind == "aoti"


class _Capped:
    """A stream that yields at most _READ_BYTES in all: pickletools reads a string's length
    from the file and then that many bytes, and a hostile file's 2**56 asked Python for an
    impossible buffer (MemoryError; a few GB would have been allocated)."""

    def __init__(self, stream: Any) -> None:
        self._stream = stream
        self._left = _READ_BYTES

    def read(self, size: int = -1) -> bytes:
        size = self._left if size < 0 else min(size, self._left)
        data: bytes = self._stream.read(size)
        self._left -= len(data)
        return data

    def readline(self) -> bytes:
        data: bytes = self._stream.readline(self._left)
        self._left -= len(data)
        return data


def _legacy(stream: Any) -> ModelFile:
    """A torch.save file of the format before the zip (PyTorch 1.6): a pickle of torch's
    magic number, two more small pickles of its own (the protocol version, system
    information), then the object's; anything else is unknown."""
    try:
        numbers = [argument for opcode, argument, _ in _bounded(pickletools.genops(stream))
                   if opcode.name != "PROTO" and isinstance(argument, int)]
        if numbers != [_LEGACY_MAGIC]:
            return ModelFile("unknown")
        for _ in range(2):
            for _ in _bounded(pickletools.genops(stream)):
                pass
    except (ValueError, EOFError, UnicodeDecodeError):
        return ModelFile("unknown")
    return ModelFile("legacy checkpoint", _top_object(stream))


def _bounded(opcodes: Any) -> Any:
    """At most _OPCODES_READ of a pickle's opcodes, then ValueError (a longer pickle is not
    one of torch's own; a top object's class comes within the first few)."""
    for count, opcode in enumerate(opcodes):
        if count >= _OPCODES_READ:
            raise ValueError("not one of torch.save's small pickles")
        yield opcode


def _top_object(stream: Any) -> str | None:
    """The class (module.name) or container a pickle's top object is built from, from its
    first opcodes; None where they do not say."""
    strings: list[str] = []
    try:
        for opcode, argument, _ in _bounded(pickletools.genops(stream)):
            name = opcode.name
            if name in _SKIPPED:
                continue
            if name in _STRINGS:
                strings.append(str(argument))
                continue
            if name in ("GLOBAL", "INST"):
                return str(argument).replace(" ", ".")
            if name == "STACK_GLOBAL" and len(strings) >= 2:
                return f"{strings[-2]}.{strings[-1]}"
            return _CONTAINERS.get(name)
    except (ValueError, EOFError, UnicodeDecodeError):  # not a pickle, cut short, or long
        return None
    return None


def wrong_model_file(path: pathlib.Path, expected: str) -> str | None:
    """Why `path` cannot be loaded as `expected` ("torchscript" for model.pt, "pt2" for
    model.pt2), with what to do instead; None where it is of that kind (or unknown), and
    the loader's own error says more."""
    found = inspect_model_file(path)
    if found.kind == "unknown" or found.kind == expected or (
            expected == "pt2" and found.kind in ("export", "aoti")):
        return None
    said = f"{path.name} is {found.describe()}"
    if found.kind == "torchscript":
        return f"{said}: name it model.pt (a model.pt2 is a torch.export program or an " \
               "AOTInductor package)"
    if found.kind in ("export", "aoti"):
        return f"{said}: name it model.pt2 (a model.pt is TorchScript)"
    return (f"{said}, not a model tensorgate loads (it does not unpickle models: that runs "
            "whatever code the file names). Save TorchScript as model.pt "
            "(torch.jit.script(module).save(path), or torch.jit.trace), a torch.export program "
            "as model.pt2 (torch.export.save), or load the weights in a model.py "
            "(ModelContext.load_weights)")
