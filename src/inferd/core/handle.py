"""One loaded model version: its completed config and the instances that execute it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from inferd.config.model import ModelConfig
from inferd.core.executor import InstancePool
from inferd.core.validation import output_names, prepare_inputs
from inferd.errors import InternalError
from inferd.types import InferRequest, InferResponse, Tensor


@dataclass(slots=True)
class ModelHandle:
    config: ModelConfig
    version: int
    pool: InstancePool

    async def infer(self, request: InferRequest) -> InferResponse:
        feeds, batch_size = prepare_inputs(self.config, request)
        names = output_names(self.config, request)
        results = await self.pool.run(feeds, names)
        return InferResponse(
            model_name=self.config.name,
            model_version=str(self.version),
            request_id=request.request_id,
            outputs=tuple(self._output_tensor(name, results.get(name), batch_size) for name in names),
            id=request.id,
        )

    def close(self) -> None:
        self.pool.close()

    def _output_tensor(self, name: str, array: np.ndarray[Any, Any] | None, batch_size: int) -> Tensor:
        spec = self.config.output(name)
        if spec is None or array is None:
            raise InternalError(f"model '{self.config.name}' produced no output '{name}'")
        if spec.reshape is not None:
            # The runtime's shape is `reshape`; clients see `dims` (Triton's reshape semantics).
            dims = tuple(d for d in spec.dims)
            target = (batch_size, *dims) if self.config.max_batch_size > 0 else dims
            if -1 not in target:
                array = array.reshape(target)
        if array.dtype != spec.datatype.numpy_dtype and spec.datatype.numpy_dtype != np.dtype(object):
            raise InternalError(
                f"model '{self.config.name}' output '{name}' is {array.dtype}, but its config says "
                f"{spec.datatype.value}"
            )
        return Tensor(name=name, datatype=spec.datatype, shape=tuple(int(d) for d in array.shape), data=array)
