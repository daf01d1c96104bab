"""Where the async queue's jobs wait in Redis (core.redis_job_queue): the names that the servers
sharing it and an autoscaler deployed beside them (`inferd deploy k8s --scale-to-zero`'s KEDA
ScaledObject, which reads each stream's lag) must agree on."""

from __future__ import annotations

# The consumer group every server reads the streams in.
GROUP = "workers"
# What every key of the queue starts with.
DEFAULT_PREFIX = "inferd:async"


def stream_name(priority: int, prefix: str = DEFAULT_PREFIX) -> str:
    """The stream the jobs of `priority` wait in."""
    return f"{prefix}:stream:{priority}"
