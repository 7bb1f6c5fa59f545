"""Triton's checksum repository agent: a model's files checked against the digests its config
gives, before anything of the model is read or run.

    model_repository_agents { agents [ { name: "checksum",
      parameters { key: "MD5:1/model.pt", value: "d726e132f91f16ebee703d96f6f73cb1" } } ] }

Each parameter's key is `<algorithm>:<file>`, the file relative to the model's folder (the
one holding config.pbtxt), its value the file's digest in hex; a file whose digest differs
fails the load, as on Triton. Triton's agent knows MD5 alone; SHA256 and SHA512 are here
too, for a repository that wants a digest no one can forge. Checked at every load (a
reload, a poll's) off the event loop, before a Python model's `auto_complete_config` or
anything else of the model runs, so a changed model.py is refused before it is imported.

Triton loads an agent from a shared library named after it, and fails the load where it
has none; tensorgate has this agent only, and refuses a config naming another (it could
be a decryption or an authentication step the model must not be served without).
"""

from __future__ import annotations

import hashlib
import logging
import pathlib
import time
from dataclasses import dataclass

from tritonclient.grpc import model_config_pb2 as pb

from tensorgate.errors import ModelConfigError

__all__ = ["ALGORITHMS", "AGENT", "MAX_CHECKSUMS", "FileChecksum", "file_checksums",
           "verify_checksums"]

log = logging.getLogger("tensorgate.engine")

AGENT = "checksum"
ALGORITHMS = ("MD5", "SHA256", "SHA512")  # by their names in a key, any case
# A config may come from a client (a load's `config`): each entry reads a whole file
MAX_CHECKSUMS = 1024
_CHUNK = 1 << 20  # read and digested a MiB at a time (hashlib lets go of the GIL for each)


@dataclass(frozen=True)
class FileChecksum:
    """One file of the model's folder and the digest it must have."""

    algorithm: str  # hashlib's name: "md5", "sha256", "sha512"
    path: str       # relative to the model's folder, as the config gives it
    digest: str     # lowercase hex


def file_checksums(config: pb.ModelConfig, source: str) -> tuple[FileChecksum, ...]:
    """The files `config`'s checksum agent names, checked for form (not read yet); a config
    naming any other agent is refused."""
    checksums: list[FileChecksum] = []
    for agent in config.model_repository_agents.agents:
        if agent.name != AGENT:
            raise ModelConfigError(source, f"model_repository_agents names the agent "
                                           f"'{agent.name}', which tensorgate does not have "
                                           f"(it has '{AGENT}', Triton's checksum agent); a "
                                           "model is not served without its agents")
        for key, value in agent.parameters.items():
            checksums.append(_checksum(key, value, source))
    if len(checksums) > MAX_CHECKSUMS:
        raise ModelConfigError(source, f"the checksum agent names {len(checksums)} files; "
                                       f"at most {MAX_CHECKSUMS}")
    return tuple(checksums)


def _checksum(key: str, value: str, source: str) -> FileChecksum:
    said = f"the checksum agent's parameter '{key}'"
    algorithm, colon, path = key.partition(":")
    if not colon or not path:
        raise ModelConfigError(source, f"{said} is not '<algorithm>:<file>' (as "
                                       "'MD5:1/model.pt', the file in the model's folder)")
    canonical = algorithm.upper()  # (as "MD5"; "ſha256" upper-cases to "SHA256" too)
    if canonical not in ALGORITHMS:
        raise ModelConfigError(source, f"{said} names the algorithm '{algorithm}'; it has "
                                       f"{', '.join(ALGORITHMS)}")
    relative = pathlib.PurePosixPath(path)
    if relative.is_absolute() or ".." in relative.parts or "\0" in path:
        raise ModelConfigError(source, f"{said}: '{path}' is not a file within the model's "
                                       "folder (a relative path, without '..')")
    name = canonical.lower()
    try:
        width = 2 * hashlib.new(name).digest_size
    except ValueError as error:  # (an OpenSSL in FIPS mode refuses MD5)
        raise ModelConfigError(source, f"{said}: this server's Python cannot compute "
                                       f"{canonical} ({error}); name the file by its "
                                       "SHA256") from None
    digest = value.strip().lower()
    if len(digest) != width or any(c not in "0123456789abcdef" for c in digest):
        raise ModelConfigError(source, f"{said} has the value '{value}', not a "
                                       f"{canonical} digest ({width} hex digits)")
    return FileChecksum(name, path, digest)


def verify_checksums(directory: pathlib.Path, checksums: tuple[FileChecksum, ...]) -> None:
    """Each file's digest as its checksum says, or the load fails naming the file, the
    digest expected and the one it has. Reads the files: call it off the event loop."""
    if not checksums:
        return
    started = time.monotonic()
    read = 0
    for checksum in checksums:
        file = directory / checksum.path
        digest = hashlib.new(checksum.algorithm)
        try:
            with open(file, "rb") as stream:
                while chunk := stream.read(_CHUNK):
                    digest.update(chunk)
                    read += len(chunk)
        except OSError as error:
            raise ModelConfigError(str(directory), f"its checksum agent names "
                                                   f"'{checksum.path}', which cannot be read: "
                                                   f"{error.strerror or error}") from None
        got = digest.hexdigest()
        if got != checksum.digest:
            raise ModelConfigError(str(directory), f"'{checksum.path}' has the "
                                                   f"{checksum.algorithm.upper()} digest {got}; "
                                                   "its checksum agent expects "
                                                   f"{checksum.digest}: not loaded")
    log.info("%s: %d file(s) as their checksums say (%.1f MB in %.2f s)", directory,
             len(checksums), read / 1e6, time.monotonic() - started)
