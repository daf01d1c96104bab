"""`inferd analyze`: a search over model configurations, each served by its own inferd and measured
with `inferd perf`; the winner's config.pbtxt, an HTML report and the planner's profile file."""

from inferd.tools.analyze.run import (
    AnalyzeError,
    AnalyzeReport,
    AnalyzeSettings,
    Events,
    Measurement,
    ModelResult,
    run_analyze,
)
from inferd.tools.analyze.search import Point

__all__ = [
    "AnalyzeError",
    "AnalyzeReport",
    "AnalyzeSettings",
    "Events",
    "Measurement",
    "ModelResult",
    "Point",
    "run_analyze",
]
