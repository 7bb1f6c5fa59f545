"""A hand-written FastAPI + uvicorn server: the baseline many teams start from.

It speaks the subset of the Open Inference Protocol that the benchmark sends, with Triton's
binary tensor extension, so it receives exactly the request bytes tensorgate and Triton get:
`POST /v2/models/{name}/infer` with `Inference-Header-Content-Length`. One model call at a time
in FastAPI's thread pool; no batching (what a hand-written server usually does).

    uvicorn --app-dir bench/peers fastapi_app:app --host 127.0.0.1 --port 8000
"""

from __future__ import annotations

import json

import numpy as np
from fastapi import FastAPI, Request, Response
from fastapi.concurrency import run_in_threadpool

import workloads

app = FastAPI()
models = {name: workloads.load(name) for name in workloads.WORKLOADS}


@app.get("/v2/health/ready")
async def ready() -> dict[str, bool]:
    return {"ready": True}


@app.post("/v2/models/{name}/infer")
async def infer(name: str, request: Request) -> Response:
    body = await request.body()
    split = int(request.headers["inference-header-content-length"])
    header = json.loads(body[:split])
    spec = header["inputs"][0]
    batch = np.frombuffer(body, dtype=np.float32, offset=split).reshape(spec["shape"])
    result = await run_in_threadpool(workloads.run, models[name], batch)
    out = json.dumps({"model_name": name, "outputs": [
        {"name": "OUTPUT__0", "datatype": "FP32", "shape": list(result.shape),
         "parameters": {"binary_data_size": result.nbytes}}]}).encode()
    return Response(out + result.tobytes(), media_type="application/octet-stream",
                    headers={"Inference-Header-Content-Length": str(len(out))})
