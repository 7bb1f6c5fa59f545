"""Model upload: a load request's `file:<path>` parameters become the folder the model loads
from, as on Triton ("override model directory"), with the load's `config` as its config.

Uploaded files are code the server runs (a model.py is imported, a TorchScript file is a
program), so the server takes them only when started with --allow-model-upload (and
--model-control-mode explicit). What a client sends is confined: each path is relative, made
of plain names (no "", ".", ".."; no NUL), under the model's own folder; a load has at most
MAX_UPLOAD_FILES files. The folder is made new for each load, private to the server's user,
in the system's temporary directory (TMPDIR), and removed once the model it holds is no
longer served (unloaded, loaded again from elsewhere, or the server stops) or its load fails.

    <tmp>/tensorgate-upload-XXXX/<model>/<version>/model.py   (each file a client sent)
"""

from __future__ import annotations

import binascii
import errno
import os
import pathlib
import shutil
import tempfile
from collections.abc import Callable, Mapping
from typing import Any

from tensorgate.errors import InvalidArgumentError, UnavailableError

__all__ = ["FILE_PREFIX", "MAX_UPLOAD_FILES", "UploadedFiles", "check_upload", "link_folder",
           "decode_base64_file", "remove_upload", "upload_path", "uploaded_files",
           "write_upload"]

FILE_PREFIX = "file:"
MAX_UPLOAD_FILES = 1000  # each is a file made on the server's disk
_MAX_NAME_BYTES = 255  # one path component, as most file systems allow

# the path under the model's folder (as the parameter named it, after "file:") → its bytes
UploadedFiles = dict[str, "bytes | bytearray | memoryview"]


def uploaded_files(parameters: Mapping[str, Any],
                   content: Callable[[str, Any], bytes | bytearray | memoryview] | None
                   ) -> UploadedFiles | None:
    """A load's `file:` parameters as an upload (None when it has none): path after "file:"
    → its content, read by `content` (key, value) as the front end's wire carries it
    (decode_base64_file over HTTP); `content` None (a server that takes no uploads, which
    refuses the load for them): each left unread, empty. Their number is bounded before
    any is read; the paths are checked where they are written (write_upload)."""
    keys = sorted(key for key in parameters if key.startswith(FILE_PREFIX))
    if not keys:
        return None
    if content is None:
        return dict.fromkeys((key[len(FILE_PREFIX):] for key in keys), b"")
    _bounded(len(keys))
    return {key[len(FILE_PREFIX):]: content(key, parameters[key]) for key in keys}


def _bounded(count: int) -> None:
    if count > MAX_UPLOAD_FILES:
        raise InvalidArgumentError(f"a load may upload at most {MAX_UPLOAD_FILES} files, not "
                                   f"{count}")


def _named(key: str) -> str:
    """A parameter's name as an error quotes it: in single quotes whatever it holds (repr
    would switch to double quotes for one holding a quote), escaped, at most 80 chars."""
    return "'" + key[:80].encode("unicode_escape").decode("ascii") + "'"


def upload_path(key: str) -> str:
    """The path a `file:` parameter names under the model's folder, checked: relative, plain
    names only. InvalidArgumentError names the parameter and what is wrong."""
    path = key[len(FILE_PREFIX):]
    parts = path.split("/")
    if not path or "\0" in path or any(part in ("", ".", "..") for part in parts):
        raise InvalidArgumentError(
            f"load parameter {_named(key)}: the path after 'file:' must be relative to the model's "
            "folder, made of names that are neither empty, '.' nor '..' (as 'file:1/model.py')")
    try:
        sizes = [len(part.encode()) for part in parts]
    except UnicodeEncodeError:  # a lone surrogate (JSON's "\ud800"): no file name
        raise InvalidArgumentError(f"load parameter {_named(key)}: its path is not valid "
                                   "Unicode") from None
    if max(sizes) > _MAX_NAME_BYTES:
        raise InvalidArgumentError(f"load parameter {_named(key)}...: a name in its path is "
                                   f"longer than {_MAX_NAME_BYTES} bytes")
    return path


def decode_base64_file(key: str, value: object) -> bytes:
    """An HTTP load's file parameter: its content, base64 as Triton's HTTP API sends it."""
    if not isinstance(value, str):
        raise InvalidArgumentError(f"load parameter {_named(key)} must be a string: the file's "
                                   f"content in base64, not {type(value).__name__}")
    try:  # strictly: what protocol/load_body.py decodes a slice at a time reads the same
        return binascii.a2b_base64(value, strict_mode=True)
    except (binascii.Error, ValueError) as error:
        raise InvalidArgumentError(f"load parameter {_named(key)} is not base64 ({error}): a "
                                   "file's content is sent in base64 over HTTP") from None


def check_upload(files: Mapping[str, bytes | bytearray | memoryview]) -> None:
    """Every path of `files` checked (upload_path), and their number bounded."""
    _bounded(len(files))
    for key in files:
        upload_path(FILE_PREFIX + key)


def write_upload(name: str, files: Mapping[str, bytes | bytearray | memoryview]
                 ) -> pathlib.Path:
    """A new folder holding `<name>/` with `files` in it (paths as upload_path gives them):
    the repository the model then loads from. Blocking: call it off the event loop."""
    _check_folder_name(name, "to upload into")
    check_upload(files)
    root = _new_root(name, "upload")
    try:
        folder = root / name
        folder.mkdir()
        for path, content in files.items():
            target = folder / path
            # every folder on the way is made here, under a root made here: no link of
            # anyone else's can be on it, and a file the same name as a folder fails
            target.parent.mkdir(parents=True, exist_ok=True)
            descriptor = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW,
                                 0o600)
            with os.fdopen(descriptor, "wb") as file:
                file.write(content)
    except OSError as error:
        shutil.rmtree(root, ignore_errors=True)
        where = os.path.relpath(error.filename, folder) if error.filename else "?"
        if error.errno in (errno.ENOSPC, errno.EDQUOT, errno.ENOMEM):
            raise UnavailableError(f"the upload of model '{name}' could not be written "
                                   f"({error.strerror}, at {where})") from None
        raise InvalidArgumentError(f"the upload of model '{name}' could not be written: "
                                   f"{error.strerror}, at {where} (a path may not name both a "
                                   "file and a folder)") from None
    except BaseException:
        shutil.rmtree(root, ignore_errors=True)
        raise
    return root


def link_folder(name: str, folder: pathlib.Path) -> pathlib.Path:
    """A new folder holding `<name>`, a link to the model folder `folder`: the repository a
    model kept elsewhere loads from under that name (Engine.load_folder). Blocking."""
    _check_folder_name(name, "to load from")
    root = _new_root(name, "folder")
    (root / name).symlink_to(folder.resolve(), target_is_directory=True)
    return root


def _check_folder_name(name: str, use: str) -> None:
    if "/" in name or "\0" in name or name in ("", ".", ".."):
        raise InvalidArgumentError(f"model name {name!r} cannot name a folder {use}")


def _new_root(name: str, kind: str) -> pathlib.Path:
    """A new folder of this process's own (mode 0700) for model `name`'s repository."""
    try:
        return pathlib.Path(tempfile.mkdtemp(prefix=f"tensorgate-{kind}-"))
    except OSError as error:
        raise UnavailableError(f"no folder for model '{name}' ({kind}) could be made in "
                               f"{tempfile.gettempdir()}: {error.strerror}") from None


def remove_upload(root: pathlib.Path) -> None:
    """Remove a folder write_upload or link_folder made, not what a link in it leads to
    (blocking: off the event loop)."""
    shutil.rmtree(root, ignore_errors=True)
