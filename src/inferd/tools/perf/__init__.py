"""`inferd perf`: a load generator for any KServe v2 server, measuring as perf_analyzer does."""

from inferd.tools.perf.measure import PerfReport, PerfSettings, ServerSide, StepResult, run_perf


def locustfile_path() -> str:
    """The Locust file that ships with inferd (`locust -f "$(inferd perf --locustfile)" ...`)."""
    from pathlib import Path

    return str(Path(__file__).with_name("locustfile.py"))


__all__ = ["PerfReport", "PerfSettings", "ServerSide", "StepResult", "locustfile_path", "run_perf"]
