"""`inferd optimize`: a model file or folder to validated, timed ONNX candidates and the winner as a
model folder ready for the repository."""

from inferd.tools.optimize.candidates import CANDIDATES
from inferd.tools.optimize.run import (
    DEFAULT_TOLERANCES,
    OptimizeError,
    OptimizeReport,
    OptimizeSettings,
    as_json,
    run_optimize,
)

__all__ = [
    "CANDIDATES",
    "DEFAULT_TOLERANCES",
    "OptimizeError",
    "OptimizeReport",
    "OptimizeSettings",
    "as_json",
    "run_optimize",
]
