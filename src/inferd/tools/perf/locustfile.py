"""A Locust file for distributed load tests of any KServe v2 server (inferd, Triton), as teams
run Locust across many machines when one load generator is not enough:

    locust -f "$(inferd perf --locustfile)" --host http://localhost:8000 --model add_sub
    locust -f "$(inferd perf --locustfile)" --host http://localhost:8000 --model minilm \\
        --shape input_ids:128 --shape attention_mask:128 --shape token_type_ids:128 --headless -u 32 -t 1m

Each simulated user sends inference requests back to back (binary tensors; `--json-tensors` for
JSON), built from the model's metadata as `inferd perf` builds them (`--input-data zero|random|FILE`,
`--batch-size`, `--shape`). A failed request is reported under the server's error code
(OVERLOADED, SHAPE_MISMATCH, ...), so Locust's failure table counts errors by kind.
"""

from __future__ import annotations

import itertools
import json
import random
from pathlib import Path
from typing import Any, ClassVar

from locust import FastHttpUser, events, task

from inferd.client.aio import as_tensors
from inferd.protocol import json_v2
from inferd.tools.inputs import file_samples, parse_shape, request_shapes, synthetic_samples
from inferd.types import InferRequest


@events.init_command_line_parser.add_listener  # type: ignore[untyped-decorator]
def _arguments(parser: Any) -> None:
    parser.add_argument("--model", required=True, help="The model to load")
    parser.add_argument("--model-version", default="", help="Its version (default: the server's choice)")
    parser.add_argument("--batch-size", type=int, default=1)
    parser.add_argument("--shape", action="append", default=[], help="A variable input's shape: NAME:1,128")
    parser.add_argument("--input-data", default="random", help="zero, random, or a .json / .npz file")
    parser.add_argument("--json-tensors", action="store_true", help="Tensors as JSON rather than binary")


class KServeUser(FastHttpUser):
    # Encoded once per process, shared by its users.
    _bodies: ClassVar[list[tuple[bytes, dict[str, str]]]] = []

    def on_start(self) -> None:
        options = self.environment.parsed_options
        self.path = f"/v2/models/{options.model}" + (
            f"/versions/{options.model_version}" if options.model_version else ""
        )
        if not KServeUser._bodies:
            KServeUser._bodies = self._prepare(options)
        self._turn = itertools.cycle(random.sample(KServeUser._bodies, len(KServeUser._bodies)))

    def _prepare(self, options: Any) -> list[tuple[bytes, dict[str, str]]]:
        """The request bodies, encoded once (as perf_analyzer does): the load is the server's work."""
        with self.client.get(self.path, name="metadata") as reply:
            metadata = json_v2.decode_model_metadata(reply.content)
        with self.client.get(f"{self.path}/config", name="config") as reply:
            max_batch_size = int(json.loads(reply.content).get("max_batch_size", 0))
        shapes = request_shapes(metadata, max_batch_size, options.batch_size, dict(map(parse_shape, options.shape)))
        if options.input_data in ("zero", "random"):
            samples = synthetic_samples(metadata, shapes, options.input_data)
        else:
            samples = file_samples(Path(options.input_data), metadata, shapes)
        bodies = []
        for sample in samples:
            body, header_length = json_v2.encode_request(
                InferRequest(options.model, options.model_version, as_tensors(sample)),
                binary=not options.json_tensors,
            )
            headers = {"Content-Type": "application/json"}
            if header_length is not None:
                headers = {
                    "Content-Type": "application/octet-stream",
                    "Inference-Header-Content-Length": str(header_length),
                }
            bodies.append((body, headers))
        return bodies

    @task
    def infer(self) -> None:
        body, headers = next(self._turn)
        with self.client.post(
            f"{self.path}/infer",
            data=body,  # type: ignore[arg-type]  # bytes are sent as they are; the stub says str
            headers=headers,
            name="infer",
            catch_response=True,
        ) as reply:
            if reply.status_code != 200:
                error = json_v2.decode_error_response(reply.status_code or 0, reply.content or b"")
                reply.failure(f"{error.code.value}: HTTP {reply.status_code}")
