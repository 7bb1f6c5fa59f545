"""repository/upload.py: whatever a client names, an upload's files land in its own folder
or the load is refused by name; the folder is the server user's alone."""

from __future__ import annotations

import pathlib

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from tensorgate.errors import InvalidArgumentError
from tensorgate.repository.upload import remove_upload, upload_path, write_upload


@given(path=st.text(max_size=40))
@example(path="\ud800/model.py")
@example(path="../../etc/passwd")
@example(path="/abs")
@example(path="/'")  # a quote in a refused path (repr then used double quotes)
@example(path="1/" + "x" * 256)
def test_a_path_is_refused_by_name_or_stays_inside_the_model_s_folder(path: str) -> None:
    try:
        checked = upload_path("file:" + path)
    except InvalidArgumentError as error:
        assert error.message.startswith("load parameter 'file:")
        return
    folder = pathlib.Path("/models/m")
    assert (folder / checked).resolve().is_relative_to(folder)
    assert checked == path


def test_files_are_written_into_a_private_folder_and_removed_with_it(
        tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("tempfile.tempdir", str(tmp_path))
    root = write_upload("m", {"1/model.py": b"code", "1/deep/labels.txt": bytearray(b"a"),
                              "2/model.pt": memoryview(b"pt")})
    assert root.parent == tmp_path and root.stat().st_mode & 0o777 == 0o700
    assert (root / "m" / "1" / "deep" / "labels.txt").read_bytes() == b"a"
    assert (root / "m" / "2" / "model.pt").read_bytes() == b"pt"
    remove_upload(root)
    assert list(tmp_path.iterdir()) == []
    # a path that is a file and a folder both: refused, and nothing left behind
    with pytest.raises(InvalidArgumentError, match="a path may not name both a file and a "
                                                   "folder"):
        write_upload("m", {"1": b"x", "1/model.py": b"code"})
    with pytest.raises(InvalidArgumentError, match="cannot name a folder"):
        write_upload("..", {"1/model.py": b"code"})
    assert list(tmp_path.iterdir()) == []
