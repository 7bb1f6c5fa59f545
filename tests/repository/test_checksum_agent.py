"""Triton's checksum repository agent: its parameters read and checked for form, and a
model's files checked against them (repository/checksum_agent.py)."""

from __future__ import annotations

import hashlib
import pathlib

import pytest
from google.protobuf import text_format
from hypothesis import given, settings
from hypothesis import strategies as st
from tritonclient.grpc import model_config_pb2 as pb

from tensorgate.errors import ModelConfigError
from tensorgate.repository.checksum_agent import (MAX_CHECKSUMS, FileChecksum, file_checksums,
                                                  verify_checksums)

MD5_OF_ABC = hashlib.md5(b"abc").hexdigest()
SHA256_OF_ABC = hashlib.sha256(b"abc").hexdigest()


def _config(agents: str) -> pb.ModelConfig:
    return text_format.Parse(f'name: "m" model_repository_agents {{ agents [ {agents} ] }}',
                             pb.ModelConfig())


def _checksum(key: str, value: str) -> str:
    return f'{{ name: "checksum" parameters {{ key: "{key}" value: "{value}" }} }}'


def test_each_parameter_is_a_file_and_its_digest() -> None:
    config = _config(", ".join([_checksum("MD5:1/model.pt", MD5_OF_ABC.upper()),
                                _checksum("sha256:labels.txt", SHA256_OF_ABC),
                                _checksum("\u017fha256:other.txt", SHA256_OF_ABC)]))
    assert set(file_checksums(config, "config.pbtxt")) == {
        FileChecksum("md5", "1/model.pt", MD5_OF_ABC),  # a digest in capitals too
        FileChecksum("sha256", "labels.txt", SHA256_OF_ABC),
        FileChecksum("sha256", "other.txt", SHA256_OF_ABC)}  # (a long s upper-cases to S)
    assert file_checksums(pb.ModelConfig(name="m"), "config.pbtxt") == ()


@pytest.mark.parametrize("agents, said", [
    ('{ name: "decrypt" }', r"^config.pbtxt: model_repository_agents names the agent "
                            r"'decrypt', which tensorgate does not have \(it has 'checksum'"),
    (_checksum("model.pt", MD5_OF_ABC), r"parameter 'model.pt' is not '<algorithm>:<file>'"),
    (_checksum("MD5:", MD5_OF_ABC), r"parameter 'MD5:' is not '<algorithm>:<file>'"),
    (_checksum("CRC32:model.pt", "00"), r"names the algorithm 'CRC32'; it has MD5, SHA256, "),
    (_checksum("MD5:../other/1/model.pt", MD5_OF_ABC),
     r"'../other/1/model.pt' is not a file within the model's folder"),
    (_checksum("MD5:/etc/passwd", MD5_OF_ABC), r"'/etc/passwd' is not a file within"),
    (_checksum("MD5:1/model.pt", SHA256_OF_ABC), r"has the value '[0-9a-f]+', not a MD5 "
                                                 r"digest \(32 hex digits\)"),
    (_checksum("SHA256:1/model.pt", "z" * 64), r"not a SHA256 digest \(64 hex digits\)"),
])
def test_a_config_the_agent_cannot_act_on_is_refused(agents: str, said: str) -> None:
    with pytest.raises(ModelConfigError, match=said):
        file_checksums(_config(agents), "config.pbtxt")


def test_an_algorithm_this_python_refuses_is_said_so(monkeypatch: pytest.MonkeyPatch) -> None:
    """As an OpenSSL in FIPS mode refuses MD5 (hashlib raises ValueError)."""
    def fips(name: str, *args: object, **kwargs: object) -> object:
        raise ValueError(f"[digital envelope routines] unsupported: {name}")
    monkeypatch.setattr(hashlib, "new", fips)
    with pytest.raises(ModelConfigError, match=r"parameter 'MD5:1/model.pt': this server's "
                                               r"Python cannot compute MD5 \(.*unsupported: "
                                               r"md5\); name the file by its SHA256$"):
        file_checksums(_config(_checksum("MD5:1/model.pt", MD5_OF_ABC)), "config.pbtxt")


def test_the_files_named_are_bounded() -> None:
    many = " ".join(f'parameters {{ key: "MD5:{i}" value: "{MD5_OF_ABC}" }}'
                    for i in range(MAX_CHECKSUMS + 1))
    with pytest.raises(ModelConfigError, match=f"names {MAX_CHECKSUMS + 1} files; at most "):
        file_checksums(_config(f'{{ name: "checksum" {many} }}'), "config.pbtxt")


def test_files_as_their_checksums_say_pass_and_another_fails_naming_both_digests(
        tmp_path: pathlib.Path) -> None:
    (tmp_path / "1").mkdir()
    (tmp_path / "1" / "model.pt").write_bytes(b"abc")
    (tmp_path / "big.bin").write_bytes(b"x" * (3 << 20))  # read in more than one piece
    big = hashlib.sha512(b"x" * (3 << 20)).hexdigest()
    verify_checksums(tmp_path, (FileChecksum("md5", "1/model.pt", MD5_OF_ABC),
                                FileChecksum("sha512", "big.bin", big)))
    (tmp_path / "1" / "model.pt").write_bytes(b"abd")
    with pytest.raises(ModelConfigError) as refused:
        verify_checksums(tmp_path, (FileChecksum("md5", "1/model.pt", MD5_OF_ABC),))
    assert refused.value.message == (
        f"{tmp_path}: '1/model.pt' has the MD5 digest {hashlib.md5(b'abd').hexdigest()}; its "
        f"checksum agent expects {MD5_OF_ABC}: not loaded")


def test_a_file_that_cannot_be_read_fails_the_check(tmp_path: pathlib.Path) -> None:
    (tmp_path / "1").mkdir()
    for path, why in (("1/model.pt", "No such file or directory"), ("1", "Is a directory")):
        with pytest.raises(ModelConfigError, match=f"its checksum agent names '{path}', which "
                                                   f"cannot be read: {why}"):
            verify_checksums(tmp_path, (FileChecksum("md5", path, MD5_OF_ABC),))


_TEXT = st.text(st.characters(exclude_categories=("Cs",)), max_size=80)  # (proto strings)


@settings(max_examples=300, deadline=None)
@given(agent=st.sampled_from(["checksum", "checksum ", "Checksum", ""]), key=st.one_of(
    _TEXT, st.builds("{}:{}".format, st.sampled_from(["MD5", "sha256", "SHA512", "md4"]),
                     _TEXT)),
       value=st.one_of(_TEXT, st.sampled_from([MD5_OF_ABC, SHA256_OF_ABC])))
def test_any_parameter_is_taken_as_a_file_within_the_folder_or_refused_by_name(
        tmp_path_factory: pytest.TempPathFactory, agent: str, key: str, value: str) -> None:
    config = pb.ModelConfig(name="m")
    config.model_repository_agents.agents.add(name=agent).parameters[key] = value
    try:
        checksums = file_checksums(config, "config.pbtxt")
    except ModelConfigError as error:
        assert error.message.startswith("config.pbtxt: ")
        assert f"'{agent}'" in error.message or f"'{key}'" in error.message
        return
    assert agent == "checksum"
    (checksum,) = checksums
    assert checksum.algorithm in ("md5", "sha256", "sha512")
    relative = pathlib.PurePosixPath(checksum.path)
    assert not relative.is_absolute() and ".." not in relative.parts
    # read within the folder only: what is not there says so, never a file outside
    folder = tmp_path_factory.mktemp("model")
    with pytest.raises(ModelConfigError, match="cannot be read|has the "):
        verify_checksums(folder, checksums)
