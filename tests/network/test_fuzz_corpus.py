"""The fuzzers' saved corpora (tests/testdata/fuzz/), replayed through
tools/fuzz_front_ends.py on every change: each input once, against a served repository, with
the harness's own checks (an unexpected exception, a request run twice, the server no longer
answering, something held once every connection has closed: every 50 inputs here).

The inputs are what coverage-guided runs kept (merged with libFuzzer's -merge=1): each
reached a path the others did not — shared-memory registrations at a region's edges, uploads
decoded in slices, pipelined and chunked bodies, HTTP/2 frames out of turn — and some once
found a bug. Looking for new findings stays a run by hand (the tool's docstring); this only
keeps what was found from coming back. Skipped where atheris is not installed (its wheels
are Linux x86_64: the test extra installs it there)."""

from __future__ import annotations

import os
import pathlib
import re
import shutil
import subprocess
import sys

import pytest

pytest.importorskip("atheris")

ROOT = pathlib.Path(__file__).resolve().parents[2]
TOOL = ROOT / "tools" / "fuzz_front_ends.py"
CORPORA = ROOT / "tests" / "testdata" / "fuzz"


# (front end, corpus, every how many of its inputs): over TLS, half of the gRPC inputs, for
# the ssl layer's reads and writes (a model load, ~1 s under the fuzzer's instrumentation,
# made the whole replay 50 s)
@pytest.mark.parametrize("front_end, corpus, every", [("http", "http", 1), ("grpc", "grpc", 1),
                                                      ("grpc-tls", "grpc", 2)])
def test_the_saved_corpus_replays_without_a_finding(front_end: str, corpus: str, every: int,
                                                    tmp_path: pathlib.Path) -> None:
    saved = sorted((CORPORA / corpus).iterdir())[::every]
    assert len(saved) >= 100, saved
    inputs = tmp_path / "inputs"  # a copy: libFuzzer may write to the folder it is given
    inputs.mkdir()
    for path in saved:
        shutil.copy(path, inputs)
    run = subprocess.run(
        [sys.executable, str(TOOL), front_end, "-runs=0", "-timeout=60", str(inputs)],
        cwd=tmp_path, capture_output=True, text=True, timeout=600,
        env={**os.environ, "TG_FUZZ_CHECK_EVERY": "50"})
    said = run.stdout + run.stderr
    tail = said[-6000:]
    assert run.returncode == 0, tail
    assert not list(tmp_path.glob("crash-*")), tail
    read = re.search(r"seed corpus: files: (\d+)", said)
    assert read is not None and int(read.group(1)) == len(saved), tail
    assert re.search(r"#\d+\s+INITED", said), tail  # every input run, then stopped
