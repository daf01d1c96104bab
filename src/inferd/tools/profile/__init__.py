"""`inferd profile`: what each model costs and gives on this machine (memory, CPU, throughput and
latency at its configuration and at batch 1), as the profile file (`inferd.tools.profiles`) the
planner reads; and the file's merge and scale."""

from inferd.tools.profile.measure import ProfileError, ProfileSettings, measure_profile

__all__ = ["ProfileError", "ProfileSettings", "measure_profile"]
