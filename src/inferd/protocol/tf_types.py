"""TensorFlow's DataType enum (tensorflow/core/framework/types.proto) for the TF Serving doors:
names for the REST metadata, numbers for TensorProto on gRPC. No TensorFlow import."""

from __future__ import annotations

from inferd.datatypes import NAMES
from inferd.types import DataType

# v2 datatype -> (TF enum name, TF enum number), from `inferd.datatypes`.
_TF: dict[DataType, tuple[str, int]] = {datatype: (names.tf_name, names.tf_number) for datatype, names in NAMES.items()}
_BY_NUMBER = {number: datatype for datatype, (_, number) in _TF.items()}

# The signature every inferd model shows under TF Serving: its inputs and outputs as they are.
DEFAULT_SIGNATURE = "serving_default"
PREDICT_METHOD = "tensorflow/serving/predict"


def tf_name(datatype: DataType) -> str:
    return _TF[datatype][0]


def from_tf_number(number: int) -> DataType | None:
    """None for TF types inferd does not serve (complex, resource, ...)."""
    return _BY_NUMBER.get(number)


# inferd's model states (core.registry.ModelState values) as TF Serving's ManagerState names.
_STATES = {"LOADING": "LOADING", "READY": "AVAILABLE", "UNLOADING": "UNLOADING", "UNAVAILABLE": "END"}
# ... and the numbers of ModelVersionStatus.State on gRPC.
STATE_NUMBERS = {"UNKNOWN": 0, "START": 10, "LOADING": 20, "AVAILABLE": 30, "UNLOADING": 40, "END": 50}


def tf_state(state: str) -> str:
    return _STATES.get(state, "UNKNOWN")
