"""The asynchronous inference API (core.async_inference) over HTTP.

    POST   /v2/models/{m}[/versions/{v}]/infer_async   a v2 body inline, or {"input_location": ...}
    GET    /v2/async/{id}[?wait_s=N]                    the job (long-polled until it ends)
    DELETE /v2/async/{id}                               cancel a queued job
    GET    /v2/async?model=&state=&limit=               jobs, newest first (management)
    POST   /endpoints/{e}/async-invocations             SageMaker's (boto3 invoke_endpoint_async), --sagemaker

A submit is answered 202 at once: `inference_id`, `output_location`, `failure_location` and
`status_url`. Its options are query parameters (`inference_id`, `ttl_s`, `timeout_s`,
`priority`), or fields beside `input_location`; SageMaker's come in its X-Amzn-SageMaker-* headers.

Who may do what: submitting, reading and cancelling a job by its id are inference (data-plane
tokens); a job's id, unless the caller chose it, is a random UUID that only its submitter learns.
Listing every job is management. A caller names no place the server writes: results go where the
operator said, under names made from the id (checked to be a plain name).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any
from urllib.parse import parse_qs

from pydantic import BaseModel, ConfigDict

from inferd.core.async_inference import AsyncInference
from inferd.core.async_jobs import Job, JobDoor, JobQuery, JobRequest, JobState, iso_time
from inferd.core.service import InferenceService
from inferd.errors import (
    AlreadyExistsError,
    InvalidRequestError,
    ModelNotReadyError,
    NotFoundError,
    UnavailableError,
)
from inferd.protocol import json_v2
from inferd.server.auth import Access
from inferd.server.http import json_response
from inferd.server.http11 import HttpRequest, HttpResponse
from inferd.server.routes import READ, Params, Route
from inferd.server.strict_json import decode_strict

_CONTENT_TYPE = b"content-type"
_ACCEPT = b"accept"
_HEADER_LENGTH = b"inference-header-content-length"
# A body this small that names `input_location` is read as the location form; a larger one is a
# v2 body (never parsed here: it may be a gigabyte).
_LOCATION_FORM_MAX_BYTES = 64 * 1024
_MAX_LIST = 1000
# SageMaker's headers (botocore's sagemaker-runtime InvokeEndpointAsync).
SAGEMAKER_INPUT_LOCATION = b"x-amzn-sagemaker-inputlocation"
SAGEMAKER_CONTENT_TYPE = b"x-amzn-sagemaker-content-type"
SAGEMAKER_ACCEPT = b"x-amzn-sagemaker-accept"
SAGEMAKER_INFERENCE_ID = b"x-amzn-sagemaker-inference-id"
SAGEMAKER_TTL = b"x-amzn-sagemaker-requestttlseconds"
SAGEMAKER_TIMEOUT = b"x-amzn-sagemaker-invocationtimeoutseconds"
SAGEMAKER_OUTPUT_EXTENSION = b"x-amzn-sagemaker-s3outputpathextension"
SAGEMAKER_FILENAME = b"x-amzn-sagemaker-filename"


class _LocationBody(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)

    input_location: str
    content_type: str = json_v2.JSON_CONTENT_TYPE.decode()
    inference_header_content_length: int | None = None
    inference_id: str = ""
    ttl_s: float | None = None
    timeout_s: float | None = None
    priority: int = 0


class AsyncApi:
    def __init__(self, service: InferenceService, jobs: AsyncInference | None) -> None:
        """`jobs`: None when the server runs no async inference (then its routes say how to turn it on)."""
        self._service = service
        self._jobs = jobs

    def routes(self) -> list[Route]:
        return [
            Route("/v2/models/{model}/infer_async", ("POST",), self._submit),
            Route("/v2/models/{model}/versions/{version}/infer_async", ("POST",), self._submit),
            Route("/v2/async", READ, self._list, Access.MANAGEMENT),
            Route("/v2/async/{job}", (*READ, "DELETE"), self._job),
        ]

    def sagemaker_route(self, target_model: Callable[[HttpRequest, str], str]) -> Route:
        """`target_model(request, endpoint_name)`: the model (or inferd endpoint) an invocation of
        that endpoint serves, as SageMaker's real-time invocations resolve it."""

        async def submit(request: HttpRequest, params: Params) -> HttpResponse:
            return await self._sagemaker_submit(request, target_model(request, params["endpoint"]))

        return Route("/endpoints/{endpoint}/async-invocations", ("POST",), submit, Access.PLATFORM)

    def _running(self) -> AsyncInference:
        if self._jobs is None:
            raise UnavailableError("async inference is off: start the server with --state-dir DIR to turn it on")
        return self._jobs

    async def _check_target(self, model: str, version: str) -> None:
        """A job for a model (or endpoint) the server knows; one not loaded yet may be (a model of
        the repository, in explicit mode, is loaded for its job)."""
        try:
            self._service.check_model_ready(model, version)
        except ModelNotReadyError:
            pass
        except NotFoundError:
            if version or model not in {entry.name for entry in await self._service.repository_index()}:
                raise

    async def _submit(self, request: HttpRequest, params: Params) -> HttpResponse:
        jobs = self._running()
        model, version = params["model"], params.get("version", "")
        await self._check_target(model, version)
        options: dict[str, Any] = dict(_query(request))
        content_type = (request.headers.get(_CONTENT_TYPE) or json_v2.JSON_CONTENT_TYPE).decode("latin-1")
        header_length = _int_option(request.headers.get(_HEADER_LENGTH), "Inference-Header-Content-Length")
        body: bytes | None = request.body
        body_file = request.body_file
        location: str | None = None
        if body_file is not None and body_file.stat().st_size <= _LOCATION_FORM_MAX_BYTES:
            body, body_file = body_file.read_bytes(), None  # small: read as any body (the file is removed)
        if (
            header_length is None
            and body is not None
            and len(body) <= _LOCATION_FORM_MAX_BYTES
            and b'"input_location"' in body
        ):
            form = decode_strict(_LocationBody, "async submit", body)
            location, content_type, header_length, body = (
                form.input_location, form.content_type, form.inference_header_content_length, None,
            )  # fmt: skip
            options = {
                "inference_id": form.inference_id or options.get("inference_id", ""),
                "ttl_s": form.ttl_s if form.ttl_s is not None else options.get("ttl_s"),
                "timeout_s": form.timeout_s if form.timeout_s is not None else options.get("timeout_s"),
                "priority": form.priority or options.get("priority", 0),
            }
        job_request = JobRequest(model, version, JobDoor.KSERVE, content_type, "", header_length)
        job, created = await jobs.submit(
            job_request, body=body, body_file=body_file, input_location=location, **_submit_options(options)
        )
        document = job_json(job)
        document["created"] = created
        return json_response(document, 202, [(b"location", document["status_url"].encode())])

    async def _sagemaker_submit(self, request: HttpRequest, model: str) -> HttpResponse:
        jobs = self._running()
        await self._check_target(model, "")
        headers = request.headers
        location = headers.get(SAGEMAKER_INPUT_LOCATION)
        inline = request.body or None
        if bool(location) == bool(inline):
            raise InvalidRequestError(
                "an async invocation takes its input from X-Amzn-SageMaker-InputLocation or from its body "
                "(boto3's InputLocation or Body): exactly one of them"
            )
        if headers.get(SAGEMAKER_FILENAME):
            # A name a caller chose could be another job's: results are named by their job's id.
            raise InvalidRequestError(
                "X-Amzn-SageMaker-Filename is not supported: a result is named by its inference id "
                "(ID.out); give X-Amzn-SageMaker-Inference-Id (boto3's InferenceId) to choose the name"
            )
        options = {
            "inference_id": (headers.get(SAGEMAKER_INFERENCE_ID) or b"").decode("latin-1"),
            "ttl_s": _number_option(headers.get(SAGEMAKER_TTL), "X-Amzn-SageMaker-RequestTTLSeconds"),
            "timeout_s": _number_option(headers.get(SAGEMAKER_TIMEOUT), "X-Amzn-SageMaker-InvocationTimeoutSeconds"),
        }
        content_type = (headers.get(SAGEMAKER_CONTENT_TYPE) or json_v2.JSON_CONTENT_TYPE).decode("latin-1")
        accept = (headers.get(SAGEMAKER_ACCEPT) or b"").decode("latin-1")
        job_request = JobRequest(model, "", JobDoor.SAGEMAKER, content_type, accept)
        extension = (headers.get(SAGEMAKER_OUTPUT_EXTENSION) or b"").decode("latin-1")
        job, _ = await jobs.submit(
            job_request, body=inline, input_location=location.decode("latin-1") if location else None,
            output_extension=extension, **_submit_options(options),
        )  # fmt: skip
        answer = [
            (b"x-amzn-sagemaker-outputlocation", job.output_location.encode()),
            (b"x-amzn-sagemaker-failurelocation", job.failure_location.encode()),
        ]
        return json_response({"InferenceId": job.id}, 202, answer)

    async def _job(self, request: HttpRequest, params: Params) -> HttpResponse:
        jobs = self._running()
        if request.method == "DELETE":
            job = await jobs.cancel(params["job"])
            if job.state is not JobState.CANCELLED:
                raise AlreadyExistsError(f"job '{job.id}' is {job.state.value}: only a queued job can be cancelled")
            return json_response(job_json(job))
        wait_s = _number_option(_query(request).get("wait_s"), "wait_s") or 0.0
        return json_response(job_json(await jobs.get(params["job"], wait_s)))

    async def _list(self, request: HttpRequest, params: Params) -> HttpResponse:
        jobs = self._running()
        query = _query(request)
        state = query.get("state")
        try:
            wanted = JobState(state) if state else None
        except ValueError:
            raise InvalidRequestError(f"state {state!r} is none of {', '.join(s.value for s in JobState)}") from None
        limit = int(_number_option(query.get("limit"), "limit") or 100)
        if not 1 <= limit <= _MAX_LIST:
            raise InvalidRequestError(f"limit must be 1 to {_MAX_LIST}")
        found = await jobs.query(JobQuery(str(query.get("model", "")), wanted, limit))
        return json_response({"jobs": [job_json(job) for job in found]})


def job_json(job: Job) -> dict[str, Any]:
    document: dict[str, Any] = {
        "inference_id": job.id,
        "model": job.request.model,
        "state": job.state.value,
        "status_url": f"/v2/async/{job.id}",
        "output_location": job.output_location,
        "failure_location": job.failure_location,
        "submitted_at": iso_time(job.submitted_at),
        "attempts": job.attempts,
        "priority": job.priority,
    }
    if job.request.version:
        document["version"] = job.request.version
    if job.started_at is not None:
        document["started_at"] = iso_time(job.started_at)
    if job.ended_at is not None:
        document["ended_at"] = iso_time(job.ended_at)
        if job.started_at is not None and job.state in (JobState.SUCCEEDED, JobState.FAILED):
            document["run_s"] = round(job.ended_at - job.started_at, 6)
    for name in ("ttl_s", "timeout_s"):
        if getattr(job, name) is not None:
            document[name] = getattr(job, name)
    if job.error:
        document["error"] = job.error
    if job.error_code:
        document["error_code"] = job.error_code
    if job.dead_lettered:
        document["dead_lettered"] = True
    return document


def _query(request: HttpRequest) -> dict[str, str]:
    return {name: values[-1] for name, values in parse_qs(request.query.decode("latin-1")).items()}


def _submit_options(options: dict[str, Any]) -> dict[str, Any]:
    """The submit's options, checked: a TTL and a timeout over 0, an integer priority."""
    ttl_s = _number_option(options.get("ttl_s"), "ttl_s")
    timeout_s = _number_option(options.get("timeout_s"), "timeout_s")
    for name, value in (("ttl_s", ttl_s), ("timeout_s", timeout_s)):
        if value is not None and value <= 0:
            raise InvalidRequestError(f"{name} must be more than 0 seconds")
    priority = options.get("priority", 0)
    if not isinstance(priority, int):
        priority = _int_option(str(priority).encode(), "priority") or 0
    return {
        "job_id": str(options.get("inference_id") or ""),
        "ttl_s": ttl_s,
        "timeout_s": timeout_s,
        "priority": priority,
    }


def _number_option(raw: object, name: str) -> float | None:
    if raw is None or raw == "" or raw == b"":
        return None
    if isinstance(raw, int | float) and not isinstance(raw, bool):
        value = float(raw)
    else:
        text = raw.decode("latin-1") if isinstance(raw, bytes) else str(raw)
        try:
            value = float(text)
        except ValueError:
            raise InvalidRequestError(f"{name} {text!r} is not a number") from None
    if not math.isfinite(value):
        raise InvalidRequestError(f"{name} must be a finite number")
    return value


def _int_option(raw: bytes | None, name: str) -> int | None:
    if raw is None:
        return None
    try:
        return int(raw)
    except ValueError:
        raise InvalidRequestError(f"{name} {raw.decode('latin-1')!r} is not an integer") from None
