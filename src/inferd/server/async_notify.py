"""Who is told that an async job ended: the operator's webhooks and SNS topics (`--async-webhook`,
`--async-success-topic`, `--async-error-topic`), never an address a caller names.

Each notice carries the job's id as its idempotency key (the `Inferd-Idempotency-Key` header of a
webhook's POST, the message attribute of the same name on SNS): notices are sent at least once
(core.async_inference keeps them owed until sent), so a receiver drops repeats by that key.

A webhook's body is signed when a secret is set (`--async-webhook-secret-file`):
`Inferd-Signature: t=UNIX_SECONDS,v1=HEX`, HEX being HMAC-SHA256 over `t` + "." + the body, so a
receiver can tell the server's notices from forgeries and refuse old ones replayed. Any 2xx
answer is a delivery; anything else (or no answer in 10 s) is retried with backoff.

SNS messages are SageMaker's async notification, so consumers written for SageMaker read them.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import time
import urllib.error
import urllib.request
from typing import Any

from inferd.core.async_jobs import IN_QUEUE, Job, JobState, iso_time

TIMEOUT_S = 10.0
IDEMPOTENCY_HEADER = "Inferd-Idempotency-Key"
SIGNATURE_HEADER = "Inferd-Signature"


class JobNotifier:
    def __init__(
        self,
        webhooks: tuple[str, ...] = (),
        secret: bytes | None = None,
        success_topic: str | None = None,
        error_topic: str | None = None,
    ) -> None:
        for url in webhooks:
            if not url.startswith(("http://", "https://")):
                raise ValueError(f"--async-webhook {url!r} must be an http(s):// URL")
        self._webhooks = webhooks
        self._secret = secret
        self._success_topic = success_topic
        self._error_topic = error_topic
        self._sns: Any = None

    @property
    def configured(self) -> bool:
        return bool(self._webhooks or self._success_topic or self._error_topic)

    def notify(self, job: Job) -> None:
        if self._webhooks:
            body = json.dumps(notice(job)).encode()
            for url in self._webhooks:
                self._post(url, body, job.id)
        topic = self._success_topic if job.state is JobState.SUCCEEDED else self._error_topic
        if topic:
            self._publish(topic, job)

    def _post(self, url: str, body: bytes, key: str) -> None:
        headers = {"Content-Type": "application/json", IDEMPOTENCY_HEADER: key}
        if self._secret is not None:
            headers[SIGNATURE_HEADER] = signature(self._secret, body, int(time.time()))
        request = urllib.request.Request(url, body, headers, method="POST")
        try:
            with urllib.request.urlopen(request, timeout=TIMEOUT_S) as response:
                response.read(64 * 1024)
        except urllib.error.HTTPError as exc:
            raise OSError(f"webhook {url} answered {exc.code}") from None

    def _publish(self, topic: str, job: Job) -> None:
        if self._sns is None:
            import boto3  # type: ignore[import-untyped]

            self._sns = boto3.client("sns", region_name=topic.split(":")[3] if topic.count(":") >= 5 else None)
        self._sns.publish(
            TopicArn=topic,
            Message=json.dumps(sagemaker_notice(job)),
            MessageAttributes={IDEMPOTENCY_HEADER: {"DataType": "String", "StringValue": job.id}},
        )


def signature(secret: bytes, body: bytes, timestamp: int) -> str:
    digest = hmac.new(secret, str(timestamp).encode() + b"." + body, hashlib.sha256).hexdigest()
    return f"t={timestamp},v1={digest}"


def notice(job: Job) -> dict[str, Any]:
    """A webhook's body: the job's end, where its result (or failure document) is."""
    document: dict[str, Any] = {
        "inference_id": job.id,
        "model": job.request.model,
        "state": job.state.value,
        "submitted_at": iso_time(job.submitted_at),
        "ended_at": iso_time(job.ended_at) if job.ended_at is not None else None,
        "attempts": job.attempts,
    }
    if job.state is JobState.SUCCEEDED:
        document["output_location"] = job.output_location
    else:
        document["failure_location"] = job.failure_location
        document["error"] = job.error
        document["error_code"] = job.error_code
    return document


def sagemaker_notice(job: Job) -> dict[str, Any]:
    """SageMaker's async inference notification (its SuccessTopic / ErrorTopic message)."""
    succeeded = job.state is JobState.SUCCEEDED
    document: dict[str, Any] = {
        "awsRegion": "",
        "eventTime": iso_time(job.ended_at if job.ended_at is not None else time.time()),
        "receivedTime": iso_time(job.submitted_at),
        "invocationStatus": "Completed" if succeeded else "Failed",
        "requestParameters": {
            "contentType": job.request.content_type,
            "endpointName": job.request.model,
            # An inline body (kept in the queue) has no location: the key is left out, as SageMaker
            # leaves it out for an inline Body.
            **({"inputLocation": job.input_location} if job.input_location != IN_QUEUE else {}),
        },
        "responseParameters": {"contentType": job.request.accept or job.request.content_type},
        "inferenceId": job.id,
        "eventVersion": "1.0",
        "eventSource": "aws:sagemaker",
        "eventName": "InferenceResult",
    }
    if succeeded:
        document["responseParameters"]["outputLocation"] = job.output_location
    else:
        document["responseParameters"]["failureLocation"] = job.failure_location
        document["failureReason"] = job.error
    return document
