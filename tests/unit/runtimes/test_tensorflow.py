"""The SavedModel runtime on SavedModels TensorFlow builds here: outputs of every shape and kind,
TensorFlow's refusals as the client's errors, placement by instance kind, memory freed on close."""

from __future__ import annotations

import gc
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tensorflow as tf  # inferd[tensorflow], which make test installs

from inferd.config.model import InstanceGroup, InstanceKind, ModelConfig
from inferd.errors import InvalidRequestError, ModelLoadError
from inferd.runtimes.base import RuntimeOptions
from inferd.runtimes.tensorflow import SavedModelRuntime
from inferd.testing.models import tensorflow_savedmodel
from inferd.types import DataType


def runtime(folder: Path, kind: InstanceKind = InstanceKind.AUTO, **parameters: str) -> SavedModelRuntime:
    options = RuntimeOptions(InstanceGroup(kind=kind), intra_op_threads=None)
    return SavedModelRuntime(ModelConfig(name="m", parameters=parameters), folder, options)


@pytest.fixture(scope="module")
def scalars(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Outputs TensorFlow gives as scalars: a string, a float, a bfloat16."""

    class Scalars(tf.Module):  # type: ignore[misc]
        @tf.function(input_signature=[tf.TensorSpec([], tf.float32, name="x")])  # type: ignore[misc]
        def serve(self, x: Any) -> dict[str, Any]:
            return {"word": tf.strings.as_string(x), "half": x / 2, "brain": tf.cast(x, tf.bfloat16)}

    folder = tmp_path_factory.mktemp("scalars") / "1"
    module = Scalars()
    tf.saved_model.save(module, str(folder), signatures={"serving_default": module.serve})
    return folder


@pytest.fixture(scope="module")
def multi(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("multi") / "1"
    tensorflow_savedmodel(folder / "model.savedmodel", seed=1)
    return folder


def test_scalar_outputs_are_0_d_arrays_of_their_datatype(scalars: Path) -> None:
    model = runtime(scalars)
    assert {s.name: (s.datatype, s.shape) for s in model.signature.outputs} == {
        "word": (DataType.BYTES, ()),
        "half": (DataType.FP32, ()),
        "brain": (DataType.BF16, ()),
    }
    out = model.execute({"x": np.array(3.0, dtype=np.float32)}, ["word", "half", "brain"])
    assert out["word"].shape == () and out["word"].dtype == object and out["word"][()].startswith(b"3")
    assert out["half"].shape == () and float(out["half"]) == 1.5
    assert out["brain"].shape == () and out["brain"].dtype == DataType.BF16.numpy_dtype


def test_an_input_tensorflow_rejects_is_the_client_s_error_in_tensorflow_s_words(multi: Path) -> None:
    model = runtime(multi)
    inputs = {
        "x": np.ones((2, 5), np.float32),  # 5 columns for a 4-row weight (core checks shapes first in a server)
        "text": np.array([b"a", b"b"], dtype=object),
        "ids": np.ones((2, 3), np.int64),
    }
    with pytest.raises(InvalidRequestError, match=r"^the model rejected the inputs: Matrix size-incompatible"):
        model.execute(inputs, ["y"])


def test_kind_gpu_without_a_gpu_is_a_load_error_and_kind_cpu_runs_on_the_cpu(multi: Path) -> None:
    if not tf.config.list_physical_devices("GPU"):  # tensorflow-cpu, as make test installs
        with pytest.raises(ModelLoadError, match="KIND_GPU asks for a GPU, but TensorFlow sees none"):
            runtime(multi, InstanceKind.GPU)
    model = runtime(multi, InstanceKind.CPU)
    out = model.execute({"x": np.ones((1, 4), np.float32), "text": np.array([b"ab"], dtype=object),
                         "ids": np.ones((1, 3), np.int64)}, ["length"])  # fmt: skip
    assert out["length"].tolist() == [2]


def test_a_closed_model_is_freed_under_a_frozen_collector_and_the_freeze_stays(multi: Path) -> None:
    """A SavedModel's functions live in reference cycles: closed after a server's start-up froze
    the collector (gc.freeze), they stayed for good (about 100 MiB a model of 16 MiB)."""
    import weakref

    runtime(multi).close()  # TensorFlow's own one-time objects, out of the count
    gc.collect()
    before = {id(o) for o in gc.get_objects()}
    model = runtime(multi)
    functions = [
        weakref.ref(o)
        for o in gc.get_objects()
        if id(o) not in before and type(o).__name__ in ("ConcreteFunction", "AtomicFunction")
    ]
    assert functions
    gc.collect()
    gc.freeze()  # as a server's start-up does once its models load
    try:
        model.close()
        assert [f for f in functions if f() is not None] == []
        assert gc.get_freeze_count() > 0
    finally:
        gc.unfreeze()
