"""tensorgate's own data plane behind an ASGI server: the HTTP-layer alternative, measured.

The same Engine, DataPlane, codecs and event loop (asyncio) as `tensorgate serve`; only the
HTTP layer differs: uvicorn's httptools protocol and a raw ASGI app (no framework on top)
instead of our BufferedProtocol front end. uvloop is left out on purpose: it is a loop
choice, measured on its own (bench/RESULTS.md: slower thread hand-off here). What ASGI costs by construction shows in
the copy counter: the body arrives as `bytes` chunks (joined: a copy, and the first tensor
lands wherever the JSON header ends, so FP32 data usually needs realigning: a second copy),
and a response body must be `bytes` (header and tensors joined: a third). bench/compare.py
runs it as the server `tensorgate-asgi` beside `tensorgate`; only the infer route and
readiness are served (enough for the benchmark, not a product).

    .venv/bin/python bench/asgi_front.py MODEL_REPOSITORY PORT
"""

from __future__ import annotations

import json
import pathlib
import re
import sys
from typing import Any

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "src"))

from tensorgate import __version__  # noqa: E402
from tensorgate.dataplane import DataPlane  # noqa: E402
from tensorgate.errors import TensorgateError  # noqa: E402
from tensorgate.pipeline.engine import Engine  # noqa: E402
from tensorgate.protocol.infer_codec import decode_infer_body, encode_infer_response  # noqa: E402
from tensorgate.protocol.status import codes_for  # noqa: E402
from tensorgate.tensor.copies import CopyLedger, record_copy  # noqa: E402

_INFER = re.compile(r"^/v2/models/([^/]+)(?:/versions/([^/]+))?/infer$")


class App:
    """A raw ASGI app: lifespan starts and stops the engine; POST .../infer runs a request."""

    def __init__(self, repository: pathlib.Path) -> None:
        self.repository = repository
        self.dataplane: DataPlane | None = None

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            await self._lifespan(receive, send)
            return
        match = _INFER.match(scope["path"])
        if scope["method"] == "GET" and scope["path"] == "/v2/health/ready":
            await _answer(send, 200, [], [b'{"ready": true}'] if self.dataplane else [])
            return
        if scope["method"] != "POST" or match is None or self.dataplane is None:
            await _answer(send, 404, [], [b'{"error": "not served by the ASGI benchmark app"}'])
            return
        chunks = []
        more = True
        while more:
            message = await receive()
            chunks.append(message.get("body", b""))
            more = message.get("more_body", False)
        body = chunks[0] if len(chunks) == 1 else b"".join(chunks)
        ledger = CopyLedger()
        if len(chunks) > 1:
            record_copy(len(body), "receive", ledger)
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}
        json_length = headers.get("inference-header-content-length")
        try:
            decoded = decode_infer_body(body, len(body),
                                        int(json_length) if json_length is not None else None,
                                        ledger)
            result, outputs, binary, in_shm = await self.dataplane.infer(
                match.group(1), match.group(2), decoded, ledger)
        except TensorgateError as error:
            await _answer(send, codes_for(error)[0], [],
                          [json.dumps({"error": error.message}).encode()])
            return
        parameters = None
        if decoded.parameters.get("tensorgate_report_copies"):
            parameters = {"tensorgate_copied_bytes": ledger.bytes}  # before the join below
        head, tail = encode_infer_response(result.model, result.version, result.id, outputs,
                                           binary, parameters, in_shm)
        extra = [(b"inference-header-content-length", str(len(head)).encode())] if tail else []
        await _answer(send, 200, extra, [head, *tail], ledger)

    async def _lifespan(self, receive: Any, send: Any) -> None:
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                sys.setswitchinterval(0.0005)  # as `tensorgate serve` does
                engine = Engine(self.repository, placement="auto")
                await engine.start()
                self.dataplane = DataPlane(engine, __version__)
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                if self.dataplane is not None:
                    await self.dataplane.engine.shutdown()
                await send({"type": "lifespan.shutdown.complete"})
                return


async def _answer(send: Any, status: int, headers: list[tuple[bytes, bytes]], parts: list[Any],
                  ledger: CopyLedger | None = None) -> None:
    """ASGI wants one `bytes` body (or several messages of bytes): tensors are joined."""
    body = parts[0] if len(parts) == 1 and isinstance(parts[0], bytes) else b"".join(parts)
    if ledger is not None and len(parts) > 1:
        record_copy(len(body), "encode", ledger)
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/octet-stream"),
                            (b"content-length", str(len(body)).encode()), *headers]})
    await send({"type": "http.response.body", "body": body})


def main() -> None:
    import uvicorn
    repository, port = pathlib.Path(sys.argv[1]), int(sys.argv[2])
    uvicorn.run(App(repository), host="127.0.0.1", port=port, log_level="warning",
                access_log=False, lifespan="on", loop="asyncio", http="httptools")


if __name__ == "__main__":
    main()
