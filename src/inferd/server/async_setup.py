"""The server's async inference, as its settings ask (`--state-dir` turns it on): the job queue
in the state directory, the storage places the operator chose, the notifier, and the replay that
runs each job through the door it came by, on an inference call of the background admission class.
"""

from __future__ import annotations

import logging
import socket
import time
from pathlib import Path

from inferd.config.server import ModelControlMode, ServerSettings
from inferd.core.async_inference import Answer, AsyncInference, AsyncSettings
from inferd.core.async_jobs import Job, JobDoor, JobQueue
from inferd.core.job_storage import JobStorage
from inferd.core.redis_job_queue import RedisJobQueue
from inferd.core.scheduler import REALTIME_RECENT_S, Admission
from inferd.core.service import InferenceService
from inferd.core.sqlite_job_queue import SqliteJobQueue
from inferd.errors import ModelNotFoundError, ModelNotReadyError
from inferd.server.async_notify import JobNotifier
from inferd.server.decoded_bytes import DecodedBytesBudget
from inferd.server.inference_call import CallTracing, InferenceCall
from inferd.server.kserve import KServeDoor
from inferd.server.sagemaker import SageMakerDoor

logger = logging.getLogger(__name__)


class AsyncSettingsError(ValueError):
    """Async settings that cannot work together: the server does not start."""


def _queue(settings: ServerSettings, state: Path, storage: JobStorage) -> JobQueue:
    if settings.async_queue is None:
        if not settings.async_concurrency:
            raise AsyncSettingsError("--async-concurrency 0 runs no job here: it needs a shared --async-queue")
        return SqliteJobQueue(state / "jobs.sqlite")
    if not settings.async_queue.startswith(("redis://", "rediss://", "unix://")):
        raise AsyncSettingsError(f"--async-queue {settings.async_queue!r}: expected redis://HOST:PORT/DB")
    # Servers that share a queue run each other's jobs: each must read every body and write every
    # result, so none may live on one server's disk.
    for flag, place in (("--async-payload-path", storage.payload_path), ("--async-output-path", storage.output_path),
                        ("--async-failure-path", storage.failure_path)):  # fmt: skip
        if place.startswith("file://"):
            raise AsyncSettingsError(
                f"--async-queue {settings.async_queue} is shared by servers: {flag} must be a place they all reach "
                f"(s3://...), not {place}"
            )
    try:
        return RedisJobQueue(settings.async_queue, consumer=f"{socket.gethostname()}:{settings.http_port}")
    except Exception as exc:  # the server cannot reach it: say so, and do not start
        raise AsyncSettingsError(f"--async-queue {settings.async_queue}: {exc}") from None


async def _load_on_demand(service: InferenceService, settings: ServerSettings, model: str) -> bool:
    """A job's model of the repository that is not loaded (explicit mode), loaded for it: True when
    it was. (Under a memory budget the dispatcher loads on demand itself; in the other modes every
    model of the repository is loaded already.)"""
    if settings.model_control_mode is not ModelControlMode.EXPLICIT or service.endpoints.is_endpoint(model):
        return False
    if model not in {entry.name for entry in await service.repository_index()}:
        return False
    logger.info("async inference: loading model '%s' for a job (it was not loaded)", model)
    await service.load_model(model)
    return True


def build_async_inference(
    service: InferenceService, settings: ServerSettings, tracing: CallTracing | None = None
) -> AsyncInference | None:
    """None without a state directory (nowhere to keep jobs durably)."""
    if settings.state_dir is None:
        return None
    state = Path(settings.state_dir) / "async"
    decoded = DecodedBytesBudget(settings.max_decoded_bytes_in_flight, settings.max_compression_ratio)
    background = InferenceCall(
        service, max_request_bytes=settings.max_request_bytes, decoded=decoded, tracing=tracing,
        admission=Admission.BACKGROUND,
    )  # fmt: skip
    limits = settings.request_limits
    kserve = KServeDoor(service, background, limits=limits)
    sagemaker = SageMakerDoor(
        service,
        background,
        limits=limits,
        multi_model=settings.sagemaker,
        model_root=Path(settings.sagemaker_model_root),
        default_model=settings.sagemaker_default_model,
    )

    async def replay(job: Job, body: bytes) -> Answer:
        door = kserve if job.request.door is JobDoor.KSERVE else sagemaker
        try:
            return await door.replay(job, body)
        except (ModelNotReadyError, ModelNotFoundError):
            if not await _load_on_demand(service, settings, job.request.model):
                raise
        return await door.replay(job, body)

    output_path = settings.async_output_path or str(state / "results")
    storage = JobStorage(
        payload_path=settings.async_payload_path or str(state / "payloads"),
        output_path=output_path,
        failure_path=settings.async_failure_path or output_path,
        input_roots=settings.async_input_roots,
    )
    secret = None
    if settings.async_webhook_secret_file is not None:
        secret = Path(settings.async_webhook_secret_file).read_bytes().strip()
    dispatcher = service.dispatcher
    notifier = JobNotifier(settings.async_webhooks, secret, settings.async_success_topic, settings.async_error_topic)
    return AsyncInference(
        _queue(settings, state, storage),
        storage,
        replay,
        notifier,
        AsyncSettings(max_attempts=settings.async_max_attempts, concurrency=settings.async_concurrency),
        realtime_active=lambda: time.perf_counter() - dispatcher.realtime_started_s < REALTIME_RECENT_S,
    )
