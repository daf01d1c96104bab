"""The baseline the write-ups start from: the typical hand-written model server. FastAPI with
pydantic request/response models for KServe v2 JSON, np.asarray, ONNX Runtime inline, on uvicorn
(uvloop + httptools, access log off). One request = one ORT run: no batching, metrics or logging.

    scripts/install_baselines.sh fastapi
    .venv-fastapi/bin/python benchmarks/baselines/fastapi_server.py MODEL.onnx MODEL_NAME PORT

Serves http://127.0.0.1:PORT/v2/models/MODEL_NAME/infer.
"""

from __future__ import annotations

import sys

import numpy as np
import onnxruntime as ort
import uvicorn
from fastapi import FastAPI, HTTPException
from pydantic import BaseModel

DTYPES: dict[str, type[np.generic]] = {"FP32": np.float32, "FP64": np.float64, "INT32": np.int32, "INT64": np.int64}
DATATYPES = {np.dtype(t): name for name, t in DTYPES.items()}


class Tensor(BaseModel):
    name: str
    datatype: str
    shape: list[int]
    data: list[float]  # as typical servers write it; exact for INT32/INT64 below 2**53


class InferRequest(BaseModel):
    id: str | None = None
    inputs: list[Tensor]


class InferResponse(BaseModel):
    model_name: str
    id: str | None = None
    outputs: list[Tensor]


def make_app(model_path: str, model_name: str) -> FastAPI:
    options = ort.SessionOptions()
    # Same as inferd and the floor server: on a 2-core machine, spinning intra-op threads steal
    # the event loop's core, so the comparison would measure ORT's spin policy, not serving.
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    session = ort.InferenceSession(model_path, options, providers=["CPUExecutionProvider"])
    output_names = [o.name for o in session.get_outputs()]
    app = FastAPI()

    # A plain `def` would run in Starlette's thread pool; `async def` runs ORT on the event loop,
    # as the floor server and MLServer's custom runtimes do.
    @app.post(f"/v2/models/{model_name}/infer", response_model=InferResponse)
    async def infer(request: InferRequest) -> InferResponse:
        try:
            feeds = {t.name: np.asarray(t.data, dtype=DTYPES[t.datatype]).reshape(t.shape) for t in request.inputs}
        except (KeyError, ValueError) as error:
            raise HTTPException(status_code=400, detail=f"bad input: {error}") from error
        results = session.run(output_names, feeds)
        outputs = [
            Tensor(name=n, datatype=DATATYPES[r.dtype], shape=list(r.shape), data=r.reshape(-1).tolist())
            for n, r in zip(output_names, results, strict=True)
        ]
        return InferResponse(model_name=model_name, id=request.id, outputs=outputs)

    @app.get("/v2/health/ready")
    async def ready() -> dict[str, bool]:
        return {"ready": True}

    return app


if __name__ == "__main__":
    if len(sys.argv) != 4:
        sys.exit(__doc__)
    uvicorn.run(
        make_app(sys.argv[1], sys.argv[2]),
        host="127.0.0.1",
        port=int(sys.argv[3]),
        loop="uvloop",
        http="httptools",
        log_level="warning",
        access_log=False,
    )
