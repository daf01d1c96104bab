"""The sequence batcher through tritonclient against a real `inferd serve`: a stateful Python model
(a running total per correlation id) gets START / END / READY / CORRID control inputs; two
interleaved sequences keep their own totals and (direct strategy) their own batch slot; integer and
string correlation ids; the oldest strategy; a missing id, a request without START and an idle
sequence are the client's errors."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from inferd.testing.models import python_model
from inferd.testing.models import write_config as write_model_config
from inferd.testing.server import ServerProcess, run_server

pytestmark = pytest.mark.e2e

TOTALS = """
import numpy as np


class Model:
    def initialize(self, args):
        self.totals = {}

    def execute(self, inputs):
        x, start, end = inputs["x"][:, 0], inputs["START"][:, 0], inputs["END"][:, 0]
        ready, ids = inputs["READY"][:, 0], inputs["CORRID"][:, 0]
        totals, rows = [], []
        for row in range(len(x)):
            rows.append(row)
            if not ready[row]:
                totals.append(-1)
                continue
            key = ids[row].decode() if isinstance(ids[row], bytes) else int(ids[row])
            if start[row]:
                self.totals[key] = 0
            self.totals[key] += int(x[row])
            totals.append(self.totals[key])
            if end[row]:
                del self.totals[key]
        return {"total": np.array(totals, dtype=np.int32).reshape(-1, 1),
                "row": np.array(rows, dtype=np.int32).reshape(-1, 1),
                "batch": np.full((len(x), 1), len(x), dtype=np.int32)}
"""


def sequence_config(strategy: str, corrid_type: str = "TYPE_UINT64", idle_us: int = 10_000_000) -> str:
    return f"""
backend: "python"
max_batch_size: 4
input [{{ name: "x", data_type: TYPE_INT32, dims: [1] }}]
output [{{ name: "total", data_type: TYPE_INT32, dims: [1] }}, {{ name: "row", data_type: TYPE_INT32, dims: [1] }},
        {{ name: "batch", data_type: TYPE_INT32, dims: [1] }}]
sequence_batching {{
  max_sequence_idle_microseconds: {idle_us}
  control_input [
    {{ name: "START", control [{{ kind: CONTROL_SEQUENCE_START, int32_false_true: [0, 1] }}] }},
    {{ name: "END", control [{{ kind: CONTROL_SEQUENCE_END, int32_false_true: [0, 1] }}] }},
    {{ name: "READY", control [{{ kind: CONTROL_SEQUENCE_READY, int32_false_true: [0, 1] }}] }},
    {{ name: "CORRID", control [{{ kind: CONTROL_SEQUENCE_CORRID, data_type: {corrid_type} }}] }}
  ]
  {strategy}
}}
"""


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    repository = tmp_path_factory.mktemp("repository")
    oldest = "oldest { max_candidate_sequences: 4 max_queue_delay_microseconds: 20000 }"
    for name, config in (("direct", sequence_config("direct { }")),
                         ("named", sequence_config("direct { }", "TYPE_STRING")),
                         ("oldest", sequence_config(oldest)),
                         ("brief", sequence_config("direct { }", idle_us=300_000))):  # fmt: skip
        python_model(repository / name / "1", TOTALS)
        write_model_config(repository / name, config)
    with run_server(repository, tmp_path_factory.mktemp("logs") / "server.log") as process:
        yield process


def step(client: Any, module: Any, model: str, value: int, sequence: int | str, start: bool = False,
         end: bool = False) -> tuple[int, int]:  # fmt: skip
    x = module.InferInput("x", [1, 1], "INT32")
    x.set_data_from_numpy(np.array([[value]], dtype=np.int32))
    result = client.infer(model, [x], sequence_id=sequence, sequence_start=start, sequence_end=end)
    return int(result.as_numpy("total")[0, 0]), int(result.as_numpy("row")[0, 0])


def test_interleaved_sequences_keep_their_totals_and_slots(server: ServerProcess) -> None:
    with httpclient.InferenceServerClient(server.http_url) as client:
        a = [step(client, httpclient, "direct", 1, 1001, start=True)]
        b = [step(client, httpclient, "direct", 10, 1002, start=True)]
        a.append(step(client, httpclient, "direct", 2, 1001))
        b.append(step(client, httpclient, "direct", 20, 1002))
        a.append(step(client, httpclient, "direct", 3, 1001, end=True))
        b.append(step(client, httpclient, "direct", 30, 1002, end=True))
    assert [t for t, _ in a] == [1, 3, 6] and [t for t, _ in b] == [10, 30, 60]
    # Direct: a sequence keeps its slot (row) from START to END; the two hold different ones.
    assert len({r for _, r in a}) == 1 and len({r for _, r in b}) == 1 and a[0][1] != b[0][1]


def test_string_correlation_ids_over_grpc(server: ServerProcess) -> None:
    with grpcclient.InferenceServerClient(server.grpc_url) as client:
        assert step(client, grpcclient, "named", 5, "alpha", start=True)[0] == 5
        assert step(client, grpcclient, "named", 7, "beta", start=True)[0] == 7
        assert step(client, grpcclient, "named", 5, "alpha")[0] == 10
        assert step(client, grpcclient, "named", 1, "beta", end=True)[0] == 8
        assert step(client, grpcclient, "named", 1, "alpha", end=True)[0] == 11
        with pytest.raises(InferenceServerException, match="takes integer correlation ids"):
            step(client, grpcclient, "direct", 1, "alpha", start=True)


def test_concurrent_sequences_with_the_oldest_strategy(server: ServerProcess) -> None:
    totals: dict[int, list[int]] = {}
    batches: list[int] = []

    def run(sequence: int) -> None:
        with grpcclient.InferenceServerClient(server.grpc_url) as client:
            for index in range(5):
                x = grpcclient.InferInput("x", [1, 1], "INT32")
                x.set_data_from_numpy(np.array([[sequence]], dtype=np.int32))
                result = client.infer("oldest", [x], sequence_id=sequence, sequence_start=index == 0,
                                      sequence_end=index == 4)  # fmt: skip
                totals.setdefault(sequence, []).append(int(result.as_numpy("total")[0, 0]))
                batches.append(int(result.as_numpy("batch")[0, 0]))

    threads = [threading.Thread(target=run, args=(sequence,)) for sequence in (1, 2, 3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    # Each sequence's requests in order, each total its own: 1, 2, 3, ... times its id.
    assert totals == {s: [s * (i + 1) for i in range(5)] for s in (1, 2, 3)}
    assert max(batches) <= 3  # at most one request of each sequence in a batch


def test_sequence_mistakes_are_the_clients_errors(server: ServerProcess) -> None:
    with httpclient.InferenceServerClient(server.http_url) as client:
        x = httpclient.InferInput("x", [1, 1], "INT32")
        x.set_data_from_numpy(np.array([[1]], dtype=np.int32))
        with pytest.raises(InferenceServerException, match="must specify a non-zero or non-empty correlation ID"):
            client.infer("direct", [x])
        with pytest.raises(InferenceServerException, match="must specify the START flag"):
            step(client, httpclient, "direct", 1, 77)
        assert step(client, httpclient, "direct", 1, 77, start=True, end=True)[0] == 1
        with pytest.raises(InferenceServerException, match="must specify the START flag"):
            step(client, httpclient, "direct", 1, 77)  # ended: only a new START may follow
        # Idle past max_sequence_idle_microseconds (0.3 s for "brief"): the sequence is ended.
        assert step(client, httpclient, "brief", 4, 78, start=True)[0] == 4
        time.sleep(0.9)
        with pytest.raises(InferenceServerException, match="idle past max_sequence_idle_microseconds"):
            step(client, httpclient, "brief", 4, 78)
        # A second START restarts a running sequence.
        assert step(client, httpclient, "direct", 2, 79, start=True)[0] == 2
        assert step(client, httpclient, "direct", 3, 79, start=True)[0] == 3
        assert step(client, httpclient, "direct", 3, 79, end=True)[0] == 6
