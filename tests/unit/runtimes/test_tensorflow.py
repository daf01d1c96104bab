"""The SavedModel runtime on SavedModels TensorFlow builds here: outputs of every shape and kind,
TensorFlow's refusals as the client's errors, placement by instance kind, memory freed on close.

Each check runs in a process of its own (`inferd.testing.isolated`): TensorFlow must not run in
the test run's process, where OR-Tools' solver runs too."""

from __future__ import annotations

import gc
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from inferd.config.model import InstanceGroup, InstanceKind, ModelConfig
from inferd.errors import InvalidRequestError, ModelConfigError, ModelLoadError
from inferd.runtimes.base import RuntimeOptions
from inferd.testing.isolated import in_child
from inferd.testing.models import tensorflow_savedmodel
from inferd.types import DataType


def runtime(folder: Path, kind: InstanceKind = InstanceKind.AUTO) -> Any:
    from inferd.runtimes.tensorflow import SavedModelRuntime

    options = RuntimeOptions(InstanceGroup(kind=kind), intra_op_threads=None)
    return SavedModelRuntime(ModelConfig(name="m"), folder, options)


def save_scalars(folder: Path) -> None:
    """Outputs TensorFlow gives as scalars: a string, a float, a bfloat16."""
    import tensorflow as tf

    class Scalars(tf.Module):  # type: ignore[misc]
        @tf.function(input_signature=[tf.TensorSpec([], tf.float32, name="x")])  # type: ignore[misc]
        def serve(self, x: Any) -> dict[str, Any]:
            return {"word": tf.strings.as_string(x), "half": x / 2, "brain": tf.cast(x, tf.bfloat16)}

    module = Scalars()
    tf.saved_model.save(module, str(folder), signatures={"serving_default": module.serve})


@pytest.fixture(scope="module")
def scalars(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("scalars") / "1"
    in_child(save_scalars, folder)
    return folder


@pytest.fixture(scope="module")
def multi(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("multi") / "1"
    in_child(tensorflow_savedmodel, folder / "model.savedmodel", seed=1)
    return folder


def check_scalar_outputs(folder: Path) -> None:
    model = runtime(folder)
    assert {s.name: (s.datatype, s.shape) for s in model.signature.outputs} == {
        "word": (DataType.BYTES, ()),
        "half": (DataType.FP32, ()),
        "brain": (DataType.BF16, ()),
    }
    out = model.execute({"x": np.array(3.0, dtype=np.float32)}, ["word", "half", "brain"])
    assert out["word"].shape == () and out["word"].dtype == object and out["word"][()].startswith(b"3")
    assert out["half"].shape == () and float(out["half"]) == 1.5
    assert out["brain"].shape == () and out["brain"].dtype == DataType.BF16.numpy_dtype


def test_scalar_outputs_are_0_d_arrays_of_their_datatype(scalars: Path) -> None:
    in_child(check_scalar_outputs, scalars)


def check_rejected_input(folder: Path) -> str:
    inputs = {
        "x": np.ones((2, 5), np.float32),  # 5 columns for a 4-row weight (core checks shapes first in a server)
        "text": np.array([b"a", b"b"], dtype=object),
        "ids": np.ones((2, 3), np.int64),
    }
    try:
        runtime(folder).execute(inputs, ["y"])
    except InvalidRequestError as exc:
        return exc.message
    raise AssertionError("TensorFlow took a 5-column x for a 4-row weight")


def test_an_input_tensorflow_rejects_is_the_client_s_error_in_tensorflow_s_words(multi: Path) -> None:
    said = in_child(check_rejected_input, multi)
    assert said.startswith("the model rejected the inputs: Matrix size-incompatible")
    assert "node" not in said and "Op:" not in said  # the graph's trail left out


def check_placement(folder: Path) -> None:
    import tensorflow as tf

    if not tf.config.list_physical_devices("GPU"):  # tensorflow-cpu, as make test installs
        try:
            runtime(folder, InstanceKind.GPU)
        except ModelLoadError as exc:
            assert "KIND_GPU asks for a GPU, but TensorFlow sees none" in exc.message
        else:
            raise AssertionError("KIND_GPU loaded without a GPU")
    model = runtime(folder, InstanceKind.CPU)
    out = model.execute({"x": np.ones((1, 4), np.float32), "text": np.array([b"ab"], dtype=object),
                         "ids": np.ones((1, 3), np.int64)}, ["length"])  # fmt: skip
    assert out["length"].tolist() == [2]


def test_kind_gpu_without_a_gpu_is_a_load_error_and_kind_cpu_runs_on_the_cpu(multi: Path) -> None:
    in_child(check_placement, multi)


def check_freed_under_freeze(folder: Path) -> None:
    import weakref

    runtime(folder).close()  # TensorFlow's own one-time objects, out of the count
    gc.collect()
    before = {id(o) for o in gc.get_objects()}
    model = runtime(folder)
    functions = [
        weakref.ref(o)
        for o in gc.get_objects()
        if id(o) not in before and type(o).__name__ in ("ConcreteFunction", "AtomicFunction")
    ]
    assert functions
    gc.collect()
    gc.freeze()  # as a server's start-up does once its models load
    model.close()
    assert [f for f in functions if f() is not None] == []
    assert gc.get_freeze_count() > 0


def test_a_closed_model_is_freed_under_a_frozen_collector_and_the_freeze_stays(multi: Path) -> None:
    """A SavedModel's functions live in reference cycles: closed after a server's start-up froze
    the collector (gc.freeze), they stayed for good (about 100 MiB a model of 16 MiB)."""
    in_child(check_freed_under_freeze, multi)


def check_mixed_precision(folder: Path) -> None:
    import tensorflow as tf

    mixed_config = ModelConfig(name="m", parameters={"MIXED_PRECISION": "bfloat16"})
    options = RuntimeOptions(InstanceGroup(kind=InstanceKind.CPU), intra_op_threads=None)
    from inferd.runtimes.tensorflow import SavedModelRuntime

    mixed, plain = SavedModelRuntime(mixed_config, folder, options), runtime(folder, InstanceKind.CPU)
    x = np.random.default_rng(7).standard_normal((6, 4)).astype(np.float32)
    feed = {"x": x, "text": np.array([b"a"] * 6, dtype=object), "ids": np.ones((6, 3), np.int64)}
    weights = tf.saved_model.load(str(folder / "model.savedmodel")).w.numpy()
    exact = (tf.constant(x) @ tf.constant(weights)).numpy()
    # Interleaved on one thread: each model's calls keep their own options.
    for _ in range(2):
        computed = mixed.execute(feed, ["y"])["y"]
        assert plain.execute(feed, ["y"])["y"].tolist() == exact.tolist()
    assert computed.dtype == np.float32 and computed.tolist() != exact.tolist()  # rounded through bfloat16
    np.testing.assert_allclose(computed, exact, atol=0.05, rtol=0.02)
    assert mixed.execute(feed, ["length"])["length"].tolist() == [1] * 6  # what is not float is untouched
    try:
        SavedModelRuntime(ModelConfig(name="m", parameters={"MIXED_PRECISION": "fp16"}), folder, options)
    except ModelConfigError as exc:
        assert "MIXED_PRECISION is 'fp16'" in exc.message
    else:
        raise AssertionError("MIXED_PRECISION fp16 loaded")


def test_mixed_precision_bfloat16_rewrites_this_model_s_graph_and_no_other_s(multi: Path) -> None:
    """grappler's oneDNN bfloat16 rewrite for one model's calls: TensorFlow offers it only for the
    whole process, so a float32 model beside it would have changed its answers too."""
    in_child(check_mixed_precision, multi)
