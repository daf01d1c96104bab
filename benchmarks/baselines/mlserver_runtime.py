"""A minimal custom MLServer runtime that serves an ONNX model with ONNX Runtime, written the way
MLServer's docs write custom runtimes: decode the V2 inputs with MLServer's codecs, run, encode.
Loaded by MLServer from model-settings.json ("implementation": "mlserver_runtime.OnnxRuntimeModel");
benchmarks/baselines/mlserver_server.py writes that file. Needs the .venv-mlserver venv
(scripts/install_baselines.sh).
"""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
from mlserver import MLModel
from mlserver.codecs import NumpyCodec
from mlserver.types import InferenceRequest, InferenceResponse
from mlserver.utils import get_model_uri


class OnnxRuntimeModel(MLModel):  # type: ignore[misc]
    async def load(self) -> bool:
        options = ort.SessionOptions()
        # Same as inferd and the floor server: on a 2-core machine, spinning intra-op threads steal
        # the event loop's core, so the comparison would measure ORT's spin policy, not serving.
        options.add_session_config_entry("session.intra_op.allow_spinning", "0")
        path = await get_model_uri(self.settings)  # parameters.uri, resolved against the settings' folder
        self._session = ort.InferenceSession(path, options, providers=["CPUExecutionProvider"])
        self._output_names = [o.name for o in self._session.get_outputs()]
        return True

    async def predict(self, payload: InferenceRequest) -> InferenceResponse:
        # With adaptive batching on, MLServer has already concatenated queued requests along axis 0
        # and splits the response rows back per request, so this sees one (possibly larger) batch.
        feeds = {i.name: self.decode(i, default_codec=NumpyCodec) for i in payload.inputs}
        results: list[np.ndarray] = self._session.run(self._output_names, feeds)
        return InferenceResponse(
            model_name=self.name,
            model_version=self.version,
            id=payload.id,
            outputs=[NumpyCodec.encode_output(n, r) for n, r in zip(self._output_names, results, strict=True)],
        )
