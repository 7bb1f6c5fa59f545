"""gRPC over TLS (Triton's --grpc-use-ssl, --grpc-use-ssl-mutual), through tritonclient with
a test CA's certificates (trustme): a large tensor still arrives in place, a stream works,
plaintext and untrusting clients are refused, mutual TLS admits only clients whose
certificate its root signed, hostile handshakes leave the server serving and give their
connections back, an address that flooded has its next connection on probation, and a bad
certificate or key stops the start with a message naming it."""

from __future__ import annotations

import pathlib
import queue
import re
import socket
import ssl
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import trustme
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tritonclient.utils import InferenceServerException

from tests.e2e import h2_client as h2
from tests.e2e.conftest import RunningServer, scrape, start_server, stop_server
from tests.e2e.test_grpc_wire import copied_per_call
from tests.pipeline import repo_builder as rb

WAIT_S = 10.0  # a bound on waiting for the server to give failed handshakes' places back


class Certificates:
    def __init__(self, folder: pathlib.Path) -> None:
        ca = trustme.CA()
        stranger = trustme.CA()  # signs a client certificate the server must not accept
        self.ca = folder / "ca.pem"
        self.cert = folder / "server.pem"
        self.key = folder / "server.key"
        self.other_key = folder / "other.key"
        ca.cert_pem.write_to_path(str(self.ca))
        server = ca.issue_cert("127.0.0.1", "localhost")
        for i, blob in enumerate(server.cert_chain_pems):
            blob.write_to_path(str(self.cert), append=i > 0)
        server.private_key_pem.write_to_path(str(self.key))
        ca.issue_cert("127.0.0.1").private_key_pem.write_to_path(str(self.other_key))
        self.clients = {}
        for name, issuer in (("client", ca), ("stranger", stranger)):
            issued = issuer.issue_cert(f"{name}@tensorgate.test")
            paths = (folder / f"{name}.pem", folder / f"{name}.key")
            issued.cert_chain_pems[0].write_to_path(str(paths[0]))
            issued.private_key_pem.write_to_path(str(paths[1]))
            self.clients[name] = paths
        self.stranger_ca = folder / "stranger-ca.pem"
        stranger.cert_pem.write_to_path(str(self.stranger_ca))


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> Certificates:
    return Certificates(tmp_path_factory.mktemp("certs"))


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory) -> pathlib.Path:
    root = tmp_path_factory.mktemp("tls-models")
    rb.add_torchscript(root, "wide", rb.Identity(), [-1], [-1], max_batch=0)
    rb.add_counter(root, "counter")
    return root


@pytest.fixture(scope="module")
def tls(repo: pathlib.Path, certs: Certificates, tmp_path_factory: pytest.TempPathFactory
        ) -> Iterator[RunningServer]:
    """Server certificate only; 3 connections at most, handshakes of 1 s at most."""
    log = tmp_path_factory.mktemp("tls") / "server.log"
    running = start_server(repo, log, "--grpc-use-ssl", "--grpc-server-cert", str(certs.cert),
                           "--grpc-server-key", str(certs.key), "--max-connections", "3",
                           "--read-timeout-s", "1")
    yield running
    assert stop_server(running) == 0, log.read_text()


@pytest.fixture(scope="module")
def mutual(repo: pathlib.Path, certs: Certificates, tmp_path_factory: pytest.TempPathFactory
           ) -> Iterator[RunningServer]:
    log = tmp_path_factory.mktemp("mutual") / "server.log"
    running = start_server(repo, log, "--grpc-use-ssl-mutual=1", "--grpc-server-cert",
                           str(certs.cert), "--grpc-server-key", str(certs.key),
                           "--grpc-root-cert", str(certs.ca))
    yield running
    assert stop_server(running) == 0, log.read_text()


def _client(server: RunningServer, **tls: object) -> grpcclient.InferenceServerClient:
    return grpcclient.InferenceServerClient(server.grpc_url, **tls)  # type: ignore[arg-type]


def _trusting(certs: Certificates, client: str | None = None) -> dict[str, object]:
    tls: dict[str, object] = {"ssl": True, "root_certificates": str(certs.ca)}
    if client is not None:
        cert, key = certs.clients[client]
        tls.update(certificate_chain=str(cert), private_key=str(key))
    return tls


def _works(server: RunningServer, **tls: object) -> bool:
    with _client(server, **tls) as client:
        return bool(client.is_server_live())


def _tls_copies(server: RunningServer) -> int:
    url = f"http://127.0.0.1:{server.metrics_port}/metrics"
    with urllib.request.urlopen(url, timeout=10) as page:
        text = page.read().decode()
    match = re.search(r'^tensorgate_copies_by_reason_bytes_total\{reason="tls"\} (\d+)', text,
                      re.M)
    return int(match.group(1)) if match else 0


def _refused(server: RunningServer, **tls: object) -> str:
    with _client(server, **tls) as client:
        with pytest.raises(InferenceServerException) as refused:
            client.is_server_live()
    return str(refused.value)


def test_a_tensor_over_tls_arrives_in_place_and_comes_back_whole(
        tls: RunningServer, certs: Certificates) -> None:
    """900 KB each way: decrypted straight into the message buffer (at most the first few
    KiB copied, as without TLS; best of five calls), and what TLS handled is counted."""
    values = np.random.default_rng(3).standard_normal(225_000).astype(np.float32)
    before = _tls_copies(tls)
    with _client(tls, **_trusting(certs)) as client:
        copied = copied_per_call(client, values)
    assert min(copied) <= 64 << 10, copied
    assert _tls_copies(tls) - before >= 5 * 2 * values.nbytes  # each call in and out


def test_a_stream_over_tls_gets_each_response(tls: RunningServer, certs: Certificates) -> None:
    answers: queue.Queue = queue.Queue()
    with _client(tls, **_trusting(certs)) as client:
        client.start_stream(callback=lambda result, error: answers.put((result, error)))
        item = grpcclient.InferInput("INPUT__0", [1, 4], "FP32")
        item.set_data_from_numpy(np.full((1, 4), 3, np.float32))
        client.async_stream_infer("counter", [item], request_id="three")
        client.stop_stream()
    got = []
    while not answers.empty():
        result, error = answers.get_nowait()
        assert error is None, error
        got.append(float(result.as_numpy("OUTPUT__0")[0, 0]))
    assert got == [0.0, 1.0, 2.0]


def test_plaintext_and_untrusting_clients_are_refused_and_the_server_serves_on(
        tls: RunningServer, certs: Certificates) -> None:
    assert "UNAVAILABLE" in _refused(tls)  # plaintext HTTP/2 to a TLS port
    assert "UNAVAILABLE" in _refused(tls, ssl=True, root_certificates=str(certs.stranger_ca))
    deadline = time.monotonic() + WAIT_S  # the refused handshakes hold places a while
    while time.monotonic() < deadline:
        try:
            assert _works(tls, **_trusting(certs))
            return
        except InferenceServerException:
            time.sleep(0.2)
    pytest.fail("the server did not serve a trusting client after two refused ones")


def _hostile_handshake(port: int, data: bytes) -> None:
    """Send `data` where a ClientHello belongs, and end; read until the server closes
    (bounded)."""
    with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
        try:
            sock.sendall(data)
            sock.shutdown(socket.SHUT_WR)
            while sock.recv(4096):
                pass
        except OSError:  # reset: as good as closed
            pass


def test_failed_handshakes_give_their_connections_back(tls: RunningServer,
                                                        certs: Certificates) -> None:
    """A connection counts against --max-connections from its accept, handshake included;
    one whose handshake fails is never seen by our protocol, and its place comes back once
    the handshake's time (--read-timeout-s, here 1 s) is over."""
    port = int(tls.grpc_url.rsplit(":", 1)[1])
    time.sleep(2.5)  # places held by earlier tests' handshakes are back
    for data in (b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n", b"\x16\x03\x01\x00\x05hello",
                 b"\x00" * 64):
        _hostile_handshake(port, data)
    assert "UNAVAILABLE" in _refused(tls, **_trusting(certs))  # all 3 places held
    deadline = time.monotonic() + WAIT_S
    while time.monotonic() < deadline:
        try:
            if _works(tls, **_trusting(certs)):
                break
        except InferenceServerException:
            time.sleep(0.2)
    else:
        pytest.fail(f"no place came back within {WAIT_S} s:\n{tls.log.read_text()}")


def test_an_address_that_flooded_over_tls_has_its_next_connection_on_probation(
        tls: RunningServer, certs: Certificates) -> None:
    """Over TLS too the client's address is known (the TLS transport's peer): rapid reset
    from 127.0.0.6 until the server ends the connection, and its next connection starts on
    probation, counted, its calls answered."""
    port = int(tls.grpc_url.rsplit(":", 1)[1])
    time.sleep(2.5)  # places held by earlier tests' handshakes are back
    context = ssl.create_default_context(cafile=str(certs.ca))
    h2.flood_until_told_to_calm_down(port, "127.0.0.6", context)
    before = _probation(tls)
    client = h2.H2Client(port, source="127.0.0.6", tls=context)
    try:
        answer, _ = client.response(client.call("ServerReady", b""))
        assert answer["grpc-status"] == "0"
    finally:
        client.close()
    assert _probation(tls) == before + 1


def _probation(server: RunningServer) -> int:
    found = re.search(r"^tensorgate_connections_probation_total (\d+)$", scrape(server),
                      re.M)
    assert found is not None
    return int(found.group(1))


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.binary(min_size=1, max_size=2048))
def test_hostile_bytes_at_the_handshake_leave_the_server_serving(
        mutual: RunningServer, certs: Certificates, data: bytes) -> None:
    _hostile_handshake(int(mutual.grpc_url.rsplit(":", 1)[1]), data)
    assert _works(mutual, **_trusting(certs, "client"))


def test_mutual_tls_admits_only_clients_whose_certificate_its_root_signed(
        mutual: RunningServer, certs: Certificates) -> None:
    assert _works(mutual, **_trusting(certs, "client"))
    assert "UNAVAILABLE" in _refused(mutual, **_trusting(certs))  # no certificate
    assert "UNAVAILABLE" in _refused(mutual, **_trusting(certs, "stranger"))
    values = np.arange(1000, dtype=np.float32)
    with _client(mutual, **_trusting(certs, "client")) as client:  # after the hostile ones
        item = grpcclient.InferInput("INPUT__0", [values.size], "FP32")
        item.set_data_from_numpy(values)
        assert client.infer("wide", [item]).as_numpy("OUTPUT__0").tolist() == values.tolist()


def test_a_handshake_left_open_does_not_hold_up_the_stop(repo: pathlib.Path,
                                                          certs: Certificates,
                                                          tmp_path: pathlib.Path) -> None:
    """A client that connects and never says a word: the server still stops at once (from
    Python 3.12 the listener's close waits for every connection, one whose handshake is
    under way too, until its 10 s timeout unless the server ends it)."""
    running = start_server(repo, tmp_path / "server.log", "--grpc-use-ssl",
                           "--grpc-server-cert", str(certs.cert), "--grpc-server-key",
                           str(certs.key))
    port = int(running.grpc_url.rsplit(":", 1)[1])
    with socket.create_connection(("127.0.0.1", port), timeout=5):
        time.sleep(0.2)
        started = time.monotonic()
        assert stop_server(running) == 0, running.log.read_text()
        assert time.monotonic() - started < 5.0


def _serve(*flags: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "tensorgate", "serve", "--http-port", "0",
                           "--grpc-port", "0", "--metrics-port", "0", *flags],
                          capture_output=True, text=True, timeout=60)


def test_what_tls_needs_is_named_when_it_is_missing_or_wrong(certs: Certificates,
                                                             tmp_path: pathlib.Path) -> None:
    answer = _serve("--grpc-use-ssl")
    assert answer.returncode == 2 and ("grpc_use_ssl needs grpc_server_cert and "
                                       "grpc_server_key") in answer.stderr, answer.stderr
    answer = _serve("--grpc-use-ssl-mutual", "true", "--grpc-server-cert", str(certs.cert),
                    "--grpc-server-key", str(certs.key))
    assert answer.returncode == 2 and "grpc_use_ssl_mutual needs grpc_root_cert" in (
        answer.stderr), answer.stderr
    missing = tmp_path / "nowhere.pem"
    answer = _serve("--grpc-use-ssl", "--grpc-server-cert", str(missing),
                    "--grpc-server-key", str(certs.key))
    assert answer.returncode == 1 and (f"gRPC TLS: the server certificate '{missing}' is not "
                                       "a readable file") in answer.stderr, answer.stderr
    answer = _serve("--grpc-use-ssl", "--grpc-server-cert", str(certs.cert),
                    "--grpc-server-key", str(certs.other_key))
    assert answer.returncode == 1 and re.search(
        r"gRPC TLS: the server certificate '.*server\.pem' and key '.*other\.key' could not "
        r"be used: key values mismatch", answer.stderr), answer.stderr
    not_pem = tmp_path / "root.pem"
    not_pem.write_text("not a certificate\n")
    answer = _serve("--grpc-use-ssl-mutual", "--grpc-server-cert", str(certs.cert),
                    "--grpc-server-key", str(certs.key), "--grpc-root-cert", str(not_pem))
    assert answer.returncode == 1 and f"the root certificate '{not_pem}' could not be used" in (
        answer.stderr), answer.stderr
