"""The Python runtime: loading a model.py, its signature, execution, and what it reports when the
model's code fails."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from inferd.config.loader import parse_model_config
from inferd.config.model import InstanceGroup, ModelConfig
from inferd.core.loading import load_version
from inferd.core.metrics import NoMetrics
from inferd.errors import ModelLoadError, ModelOutputError, ModelRaisedError
from inferd.runtimes import PYTHON, detect_runtime, load_runtime
from inferd.runtimes.base import RuntimeOptions
from inferd.runtimes.python import PythonRuntime
from inferd.testing.models import python_model
from inferd.types import DataType

DOUBLER = """
import numpy as np

class Model:
    inputs = [{"name": "x", "datatype": "FP32", "shape": [-1, 4]}]
    outputs = [{"name": "y", "datatype": "FP32", "shape": [-1, 4]}]

    def initialize(self, args):
        self.factor = float(args["parameters"].get("factor", "2"))
        self.args = args

    def execute(self, inputs):
        if (inputs["x"] < 0).any():
            raise ValueError("negative input")
        return {"y": inputs["x"] * np.float32(self.factor)}
"""
OPTIONS = RuntimeOptions(instance_group=InstanceGroup(), intra_op_threads=None)


def load(tmp_path: Path, source: str, config: str = "", options: RuntimeOptions = OPTIONS) -> PythonRuntime:
    python_model(tmp_path / "m" / "1", source)
    runtime = load_runtime(parse_model_config(config, model_name="m"), tmp_path / "m" / "1", options)
    assert isinstance(runtime, PythonRuntime)
    return runtime


def test_a_model_py_is_found_and_runs_on_the_callers_arrays(tmp_path: Path) -> None:
    runtime = load(tmp_path, DOUBLER, 'parameters { key: "factor" value { string_value: "3" } }')
    assert detect_runtime(tmp_path / "m" / "1") is PYTHON
    assert runtime.may_run_inline is False
    assert [(s.name, s.datatype, s.shape) for s in runtime.signature.inputs] == [("x", DataType.FP32, (-1, 4))]
    x = np.arange(8, dtype=np.float32).reshape(2, 4)
    np.testing.assert_array_equal(runtime.execute({"x": x}, ["y"])["y"], x * 3)
    args = runtime._model.args
    assert args["model_name"] == "m" and args["model_version"] == "1" and args["max_batch_size"] == 0
    assert args["version_dir"] == str(tmp_path / "m" / "1")


def test_config_is_completed_from_the_class(tmp_path: Path) -> None:
    python_model(tmp_path / "m" / "1", DOUBLER)
    handle, _ = load_version(ModelConfig(name="m"), 1, tmp_path / "m" / "1", tmp_path / "m", NoMetrics())
    try:
        config = handle.config
        assert (config.platform, config.backend, config.max_batch_size) == ("", "python", 4)
        assert [(t.name, t.dims) for t in config.inputs] == [("x", (4,))]
        assert not handle.pool.runs_inline  # a Python model never runs on the event loop
    finally:
        handle.pool.close()


def test_signature_from_config_pbtxt(tmp_path: Path) -> None:
    source = "class Model:\n    def execute(self, inputs):\n        return {'y': inputs['x'] + 1}"
    config = """
    backend: "python"
    max_batch_size: 8
    input [ { name: "x" data_type: TYPE_INT32 dims: [ 3 ] } ]
    output [ { name: "y" data_type: TYPE_INT32 dims: [ 3 ] } ]
    """
    runtime = load(tmp_path, source, config)
    assert [(s.name, s.shape) for s in runtime.signature.outputs] == [("y", (-1, 3))]
    x = np.ones((2, 3), dtype=np.int32)
    np.testing.assert_array_equal(runtime.execute({"x": x}, ["y"])["y"], x + 1)


def test_an_exception_names_the_model_version_and_line(tmp_path: Path) -> None:
    runtime = load(tmp_path, DOUBLER)
    with pytest.raises(ModelRaisedError) as raised:
        runtime.execute({"x": -np.ones((1, 4), dtype=np.float32)}, ["y"])
    message = raised.value.message
    assert "model 'm' version 1 raised ValueError: negative input" in message and "model.py line 13" in message


@pytest.mark.parametrize(
    ("body", "fragment"),
    [
        ("return {'y': inputs['x'].astype('float64')}", "is float64, but the model declares FP32"),
        ("return {'z': inputs['x']}", "output 'y' is missing"),
        ("return {'y': inputs['x'][0]}", "has shape [4], but the model declares [-1, 4]"),
        ("return [inputs['x']]", "execute returned list"),
    ],
)
def test_outputs_that_break_the_signature_are_the_models_fault(tmp_path: Path, body: str, fragment: str) -> None:
    source = DOUBLER.replace('return {"y": inputs["x"] * np.float32(self.factor)}', body)
    runtime = load(tmp_path, source)
    with pytest.raises(ModelOutputError) as raised:
        runtime.execute({"x": np.ones((2, 4), dtype=np.float32)}, ["y"])
    assert fragment in raised.value.message


def test_bytes_pass_through_unchanged_and_str_outputs_become_bytes(tmp_path: Path) -> None:
    source = """
    import numpy as np
    class Model:
        inputs = [{"name": "text", "datatype": "BYTES", "shape": [-1]}]
        outputs = [{"name": "same", "datatype": "BYTES", "shape": [-1]},
                   {"name": "lengths", "datatype": "TYPE_STRING", "shape": [-1]}]
        def execute(self, inputs):
            lengths = np.array([str(len(t)) for t in inputs["text"]])
            return {"same": inputs["text"], "lengths": lengths}
    """
    runtime = load(tmp_path, source)
    blobs = np.array([b"\xff\xfe\x00", "é".encode()], dtype=object)
    out = runtime.execute({"text": blobs}, ["same", "lengths"])
    assert out["same"] is blobs
    assert list(out["lengths"]) == [b"3", b"2"]


ASYNC_MODEL = """
import asyncio, threading
class Model:
    inputs = [{"name": "x", "datatype": "FP32", "shape": [-1]}]
    outputs = [{"name": "y", "datatype": "FP32", "shape": [-1]}]
    async def initialize(self, args):
        self.lock = asyncio.Lock()
    async def execute(self, inputs):
        async with self.lock:
            await asyncio.sleep(0)
        self.thread = threading.current_thread().name
        return {"y": inputs["x"] + 1}
"""


def test_async_model_outside_a_server_runs_on_a_loop_of_its_own(tmp_path: Path) -> None:
    runtime = load(tmp_path, ASYNC_MODEL)
    for _ in range(2):  # the same loop each time: what initialize made still works
        np.testing.assert_array_equal(runtime.execute({"x": np.zeros(2, np.float32)}, ["y"])["y"], [1, 1])
    runtime.close()


@pytest.fixture
def server_loop() -> Iterator[asyncio.AbstractEventLoop]:
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, name="the-loop")
    thread.start()
    yield loop
    loop.call_soon_threadsafe(loop.stop)
    thread.join(timeout=10)
    loop.close()


def test_async_model_in_a_server_runs_on_the_servers_loop(
    tmp_path: Path, server_loop: asyncio.AbstractEventLoop
) -> None:
    options = RuntimeOptions(instance_group=InstanceGroup(), intra_op_threads=None, event_loop=server_loop)
    runtime = load(tmp_path, ASYNC_MODEL, options=options)
    np.testing.assert_array_equal(runtime.execute({"x": np.zeros(2, np.float32)}, ["y"])["y"], [1, 1])
    assert runtime._model.thread == "the-loop"


@pytest.mark.parametrize(
    ("source", "fragment"),
    [
        ("x = 1", "needs a class named Model or TritonPythonModel, or exactly one class with an execute"),
        ("import numpy\n\nraise ImportError('no such thing')", "failed to import: ImportError: no such thing"),
        ("class Model:\n    def execute(self, inputs):\n        return {}", "declares its tensors"),
        (
            DOUBLER.replace('self.factor = float(args["parameters"].get("factor", "2"))', "1 / 0"),
            "initialize failed: ZeroDivisionError: division by zero (model.py line 8)",
        ),
        (
            DOUBLER.replace('"FP32", "shape": [-1, 4]}]\n    outputs', '"FP33", "shape": [-1, 4]}]\n    outputs'),
            "datatype",
        ),
    ],
)
def test_load_errors_say_what_is_wrong(tmp_path: Path, source: str, fragment: str) -> None:
    with pytest.raises(ModelLoadError) as raised:
        load(tmp_path, source)
    assert fragment in raised.value.message, raised.value.message


def test_finalize_runs_on_close(tmp_path: Path) -> None:
    marker = tmp_path / "finalized"
    source = DOUBLER + f"\n    def finalize(self):\n        open({str(marker)!r}, 'w').close()\n"
    runtime = load(tmp_path, source)
    runtime.close()
    assert marker.exists()


def test_only_a_model_that_declares_it_only_computes_may_run_inline(tmp_path: Path) -> None:
    inline = DOUBLER.replace("class Model:\n", "class Model:\n    may_run_inline = True\n")
    assert load(tmp_path / "a", inline).may_run_inline is True
    assert load(tmp_path / "b", DOUBLER).may_run_inline is False
    async_inline = ASYNC_MODEL.replace("class Model:\n", "class Model:\n    may_run_inline = True\n")
    runtime = load(tmp_path / "c", async_inline)
    try:
        assert runtime.may_run_inline is False  # its coroutine needs the loop free
    finally:
        runtime.close()  # and the loop its async initialize ran on
