"""The floor: the cost of request handling alone on inferd's stack. A bare ASGI app on uvicorn
(uvloop + httptools) that parses a v2 JSON request with orjson, runs ONNX Runtime inline and
answers with orjson; no batching, validation, metrics or logging.

    python benchmarks/baselines/floor_server.py MODEL.onnx PORT
"""

from __future__ import annotations

import sys
from typing import Any

import numpy as np
import onnxruntime as ort
import orjson
import uvicorn

DTYPES = {"FP32": np.float32, "FP64": np.float64, "INT64": np.int64, "INT32": np.int32}


def make_app(model_path: str) -> Any:
    options = ort.SessionOptions()
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    session = ort.InferenceSession(model_path, options, providers=["CPUExecutionProvider"])
    output_names = [o.name for o in session.get_outputs()]

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        body = b""
        more = True
        while more:
            message = await receive()
            body += message.get("body", b"")
            more = message.get("more_body", False)
        request = orjson.loads(body)
        feeds = {
            i["name"]: np.asarray(i["data"], dtype=DTYPES[i["datatype"]]).reshape(i["shape"]) for i in request["inputs"]
        }
        results = session.run(output_names, feeds)
        outputs = [
            {"name": n, "datatype": "FP32", "shape": list(r.shape), "data": r.reshape(-1)}
            for n, r in zip(output_names, results, strict=True)
        ]
        payload = orjson.dumps({"model_name": "m", "outputs": outputs}, option=orjson.OPT_SERIALIZE_NUMPY)
        await send(
            {
                "type": "http.response.start",
                "status": 200,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(payload)).encode())],
            }
        )
        await send({"type": "http.response.body", "body": payload})

    return app


if __name__ == "__main__":
    uvicorn.run(
        make_app(sys.argv[1]),
        host="127.0.0.1",
        port=int(sys.argv[2]),
        loop="uvloop",
        http="httptools",
        log_level="warning",
        access_log=False,
    )
