"""Python models: `<model>/<version>/model.py` defines a class whose `execute` takes a whole batch as
numpy arrays and returns arrays. It runs in the server's process on the request's own arrays: no
copy and no process hop, which is what Triton's Python backend costs (its users measure 6-8x).

    class Model:  # or TritonPythonModel; or the one class in the file with an `execute`
        # The signature, full shapes (-1: any size; the first is the batch when it batches).
        # Optional when config.pbtxt declares the tensors.
        inputs = [{"name": "x", "datatype": "FP32", "shape": [-1, 16]}]
        outputs = [{"name": "y", "datatype": "FP32", "shape": [-1, 16]}]

        def initialize(self, args):  # optional; args: see `initialize_args`
            ...

        def execute(self, inputs):  # or `async def`: it then runs on the server's event loop
            return {"y": inputs["x"] * 2}

        def finalize(self):  # optional, on unload
            ...

        may_run_inline = True  # optional: execute only computes (no I/O, no sleeps), so inferd
                               # may run it on the event loop while it is faster than a thread hop

BYTES tensors arrive as object arrays of `bytes` (not necessarily UTF-8) and may be returned as
`bytes` or `str` elements. An exception the model raises answers that request with a 400 naming the
model, its version and the exception (a batch that raises is run request by request, so that only
the request that raised fails); outputs that break the declared signature are the model's fault (500).
"""

from __future__ import annotations

import asyncio
import importlib.util
import inspect
import itertools
import logging
import traceback
from collections.abc import Callable, Coroutine, Mapping, Sequence
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np

from inferd.config.loader import DATATYPES_BY_CONFIG_NAME
from inferd.config.model import ModelConfig, ModelSignature, TensorSpec
from inferd.errors import (
    InferdError,
    InternalError,
    ModelLoadError,
    ModelOutputError,
    ModelRaisedError,
    relative_to_model_folder,
)
from inferd.runtimes.base import RuntimeOptions, running_loop, signature_from_config
from inferd.types import DataType

logger = logging.getLogger("inferd.python")

DEFAULT_MODEL_FILENAME = "model.py"
# Class names looked for first, in this order (the second is what Triton's Python backend requires).
CLASS_NAMES = ("Model", "TritonPythonModel")
# What loading a Python model adds beyond its files (the module, the instance): a guess, as the
# model's own allocations cannot be known before it runs.
MEMORY_PER_INSTANCE_BYTES = 1 << 20

_module_numbers = itertools.count()


def estimate_memory_bytes(model_bytes: int) -> int:
    """What one instance of a Python model whose files hold `model_bytes` keeps resident."""
    return model_bytes + MEMORY_PER_INSTANCE_BYTES


class PythonRuntime:
    # A Python model holds the GIL while it computes and may block (I/O, sleeps): never on the
    # loop, however fast it once ran, unless its class declares `may_run_inline = True` (it only
    # computes); then, like an ONNX model, it runs inline while it is faster than a thread hop.
    may_run_inline = False

    def __init__(self, config: ModelConfig, version_dir: Path, options: RuntimeOptions) -> None:
        self._name = config.name
        self._version = version_dir.name
        self._loop = options.event_loop
        # Outside a server (tools, tests): a loop of this instance's own, run by the executing thread.
        self._own_loop: asyncio.AbstractEventLoop | None = None
        self._path = version_dir / (config.default_model_filename or DEFAULT_MODEL_FILENAME)
        self._model_dir = version_dir.parent
        if not self._path.is_file():
            raise ModelLoadError(f"model file {self._path} not found")
        module = self._import()
        model_class = _model_class(module, self._path)
        self._signature = _signature(model_class, config, self._path)
        self._outputs = {spec.name: spec for spec in self._signature.outputs}
        try:
            self._model = model_class()
            initialize = getattr(self._model, "initialize", None)
            if initialize is not None:
                self._call(initialize, initialize_args(config, version_dir, options))
        except Exception as exc:
            if self._own_loop is not None:
                self._own_loop.close()
            if isinstance(exc, InferdError):
                raise
            raise ModelLoadError(f"{self._path}: initialize failed: {_describe(exc, self._path)}") from exc
        self._execute = self._model.execute
        # A generator `execute` yields a request's responses one by one: a decoupled model.
        self.streams = inspect.isgeneratorfunction(self._execute) or inspect.isasyncgenfunction(self._execute)
        if self.streams and not config.decoupled:
            raise ModelLoadError(
                f"{self._path}: execute yields its responses, which only a decoupled model may do: add "
                "model_transaction_policy { decoupled: true } to config.pbtxt"
            )
        self.may_run_inline = getattr(model_class, "may_run_inline", False) is True and not (
            inspect.iscoroutinefunction(self._execute)  # a coroutine runs on the loop: never from it
        )

    @property
    def signature(self) -> ModelSignature:
        return self._signature

    def execute(
        self, inputs: Mapping[str, np.ndarray[Any, Any]], output_names: Sequence[str], deadline_s: float | None = None
    ) -> dict[str, np.ndarray[Any, Any]]:
        try:
            returned = self._call(self._execute, dict(inputs))
        except InferdError:  # the model may raise inferd's own errors, which say what they mean
            raise
        except Exception as exc:
            raise self._raised(exc) from exc
        if not isinstance(returned, Mapping):
            raise ModelOutputError(
                f"model '{self._name}' version {self._version}: execute returned {type(returned).__name__}, "
                "not a dict of output name to array"
            )
        return {name: self._output(name, returned.get(name)) for name in output_names}

    def execute_stream(
        self,
        inputs: Mapping[str, np.ndarray[Any, Any]],
        output_names: Sequence[str],
        emit: Callable[[dict[str, np.ndarray[Any, Any]]], None],
    ) -> None:
        """A decoupled model's responses to one request, each passed to `emit` as the model yields it
        (on a worker thread; an async generator runs on the server's loop meanwhile)."""
        if not self.streams:  # a decoupled model may still answer once, with a dict
            emit(self.execute(inputs, output_names))
            return
        try:
            produced = self._execute(dict(inputs))
            if inspect.isasyncgen(produced):

                async def drain() -> None:
                    async for item in produced:
                        emit(self._response(item, output_names))

                self._run_coroutine(drain())
            else:
                for item in produced:
                    emit(self._response(item, output_names))
        except InferdError:
            raise
        except Exception as exc:
            raise self._raised(exc) from exc

    def _raised(self, exc: Exception) -> ModelRaisedError:
        """The model's exception for its client: what it says may name files of the model's folder
        (a file it could not open), which clients see relative to that folder."""
        raised = ModelRaisedError(f"model '{self._name}' version {self._version} raised {_describe(exc, self._path)}")
        return relative_to_model_folder(raised, str(self._model_dir))

    def _response(self, item: Any, output_names: Sequence[str]) -> dict[str, np.ndarray[Any, Any]]:
        if not isinstance(item, Mapping):
            raise ModelOutputError(
                f"model '{self._name}' version {self._version}: execute yielded {type(item).__name__}, "
                "not a dict of output name to array"
            )
        return {name: self._output(name, item.get(name)) for name in output_names}

    def close(self) -> None:
        finalize = getattr(self._model, "finalize", None)
        try:
            if finalize is not None:
                self._call(finalize)
        except Exception as exc:  # unloading goes on: the model is gone either way
            logger.error(
                "model %s version %s: finalize failed: %s",
                self._name,
                self._version,
                _describe(exc, self._path),
                extra={"model": self._name},
            )
        finally:
            if self._own_loop is not None:
                self._own_loop.close()

    def _import(self) -> ModuleType:
        # A module of its own per instance, under a name no other model shares: instances keep
        # no state in common, and two models' files never see each other's globals.
        module_name = f"inferd_model_{next(_module_numbers)}_{self._name}"
        spec = importlib.util.spec_from_file_location(module_name, self._path)
        if spec is None or spec.loader is None:
            raise ModelLoadError(f"{self._path} cannot be imported as a Python module")
        module = importlib.util.module_from_spec(spec)
        try:
            spec.loader.exec_module(module)
        except Exception as exc:
            raise ModelLoadError(f"{self._path} failed to import: {_describe(exc, self._path)}") from exc
        return module

    def _call(self, method: Any, *args: Any) -> Any:
        """Call a model's method; a coroutine it returns runs to the end on the server's loop."""
        result = method(*args)
        if not inspect.iscoroutine(result):
            return result
        return self._run_coroutine(result)

    def _run_coroutine(self, coroutine: Coroutine[Any, Any, Any]) -> Any:
        loop = self._loop
        if loop is None:
            # One execution at a time per instance, so one thread at a time runs this loop.
            self._own_loop = self._own_loop or asyncio.new_event_loop()
            return self._own_loop.run_until_complete(coroutine)
        if running_loop() is loop:
            coroutine.close()
            raise InternalError(f"model '{self._name}' was executed on the event loop, which it would block")
        # The worker thread waits; the coroutine runs on the loop beside the server's other work.
        return asyncio.run_coroutine_threadsafe(coroutine, loop).result()

    def _output(self, name: str, value: Any) -> np.ndarray[Any, Any]:
        spec = self._outputs.get(name)
        where = f"model '{self._name}' version {self._version} output '{name}'"
        if spec is None:
            raise InternalError(f"{where} is not in the model's signature")
        if value is None:
            raise ModelOutputError(f"{where} is missing from what execute returned")
        array = value if isinstance(value, np.ndarray) else np.asarray(value)
        if spec.datatype is DataType.BYTES:
            array = _as_bytes(array, where)
        elif array.dtype != spec.datatype.numpy_dtype:
            raise ModelOutputError(f"{where} is {array.dtype}, but the model declares {spec.datatype.value}")
        if len(array.shape) != len(spec.shape) or any(
            want >= 0 and got != want for want, got in zip(spec.shape, array.shape, strict=False)
        ):
            raise ModelOutputError(f"{where} has shape {list(array.shape)}, but the model declares {list(spec.shape)}")
        return array


def initialize_args(config: ModelConfig, version_dir: Path, options: RuntimeOptions) -> dict[str, Any]:
    """What a model's `initialize(args)` gets: plain values, so model files need no inferd import."""
    return {
        "model_name": config.name,
        "model_version": version_dir.name,
        "version_dir": str(version_dir),
        "model_dir": str(version_dir.parent),
        "max_batch_size": config.max_batch_size,
        "parameters": dict(config.parameters),
        "instance_kind": options.instance_group.kind.value,
    }


def _model_class(module: ModuleType, path: Path) -> type[Any]:
    for name in CLASS_NAMES:
        found = getattr(module, name, None)
        if isinstance(found, type):
            return _check_class(found, path)
    own = [
        value
        for value in vars(module).values()
        if isinstance(value, type) and value.__module__ == module.__name__ and callable(getattr(value, "execute", None))
    ]
    if len(own) == 1:
        return _check_class(own[0], path)
    found_names = ", ".join(sorted(cls.__name__ for cls in own)) or "none"
    raise ModelLoadError(
        f"{path}: needs a class named {' or '.join(CLASS_NAMES)}, or exactly one class with an execute "
        f"method (found: {found_names})"
    )


def _check_class(cls: type[Any], path: Path) -> type[Any]:
    if not callable(getattr(cls, "execute", None)):
        raise ModelLoadError(f"{path}: class {cls.__name__} has no execute(self, inputs) method")
    return cls


def _signature(cls: type[Any], config: ModelConfig, path: Path) -> ModelSignature:
    """The class's declared tensors, else config.pbtxt's (with the batch dimension added)."""
    declared_inputs, declared_outputs = getattr(cls, "inputs", None), getattr(cls, "outputs", None)
    if declared_inputs is not None or declared_outputs is not None:
        return ModelSignature(
            inputs=tuple(_declared(item, path, "inputs") for item in declared_inputs or ()),
            outputs=tuple(_declared(item, path, "outputs") for item in declared_outputs or ()),
        )
    if not config.inputs or not config.outputs:
        raise ModelLoadError(
            f"{path}: a Python model declares its tensors, as the class attributes inputs and outputs "
            "(lists of {'name', 'datatype', 'shape'}) or as input and output in config.pbtxt"
        )
    return signature_from_config(config)


def _declared(item: Any, path: Path, attribute: str) -> TensorSpec:
    where = f"{path}: {attribute} entry {item!r}"
    if not isinstance(item, Mapping) or not {"name", "datatype", "shape"} <= set(item):
        raise ModelLoadError(f"{where} must be a dict with name, datatype and shape")
    raw_type = str(item["datatype"])
    datatype = DataType.__members__.get(raw_type) or DATATYPES_BY_CONFIG_NAME.get(raw_type)
    if datatype is None:
        raise ModelLoadError(f"{where}: datatype must be one of {', '.join(d.value for d in DataType)}")
    try:
        shape = tuple(int(d) for d in item["shape"])
    except (TypeError, ValueError):
        raise ModelLoadError(f"{where}: shape must be a list of integers (-1 for any size)") from None
    if any(d < -1 or d == 0 for d in shape):
        raise ModelLoadError(f"{where}: shape may hold only positive sizes or -1")
    return TensorSpec(name=str(item["name"]), datatype=datatype, shape=shape)


def _as_bytes(array: np.ndarray[Any, Any], where: str) -> np.ndarray[Any, Any]:
    """BYTES outputs as inferd carries them: an object array of bytes."""
    if array.dtype == object and all(isinstance(item, bytes) for item in array.reshape(-1)):
        return array
    if array.dtype.kind not in "OSU":
        raise ModelOutputError(f"{where} is {array.dtype}, but the model declares BYTES")
    items = []
    for item in array.reshape(-1):
        if isinstance(item, bytes):
            items.append(item)
        elif isinstance(item, str):
            items.append(item.encode("utf-8"))
        else:
            raise ModelOutputError(f"{where} holds a {type(item).__name__}, but BYTES elements are bytes or str")
    return np.array(items, dtype=object).reshape(array.shape)


def _describe(exc: BaseException, path: Path) -> str:
    """The exception with the line of the model's file it came from."""
    lines = [frame for frame in traceback.extract_tb(exc.__traceback__) if frame.filename == str(path)]
    where = f" ({path.name} line {lines[-1].lineno})" if lines else ""
    return f"{type(exc).__name__}: {exc}{where}"


__all__ = ["PythonRuntime", "estimate_memory_bytes", "initialize_args"]
