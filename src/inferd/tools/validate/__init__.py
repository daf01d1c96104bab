"""`inferd validate`: does a candidate model (an optimized port, a new version, another server)
give the reference's answers, within tolerances a CI job can gate on?"""

from inferd.comparison import OutputComparison, Tolerances
from inferd.tools.validate.run import ValidateSettings, ValidationReport, run_validation

__all__ = ["OutputComparison", "Tolerances", "ValidateSettings", "ValidationReport", "run_validation"]
