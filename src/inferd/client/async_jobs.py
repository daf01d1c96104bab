"""Async inference jobs as the client sees them (`AsyncClient.submit_async` and friends): what
`POST .../infer_async` and `GET /v2/async/{id}` answer, typed."""

from __future__ import annotations

import urllib.parse
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

ENDED = frozenset({"succeeded", "failed", "cancelled", "expired"})


@dataclass(frozen=True, slots=True)
class AsyncJob:
    inference_id: str
    model: str
    state: str  # queued, running, succeeded, failed, cancelled or expired
    output_location: str
    failure_location: str
    status_url: str
    submitted_at: str
    attempts: int = 0
    started_at: str = ""
    ended_at: str = ""
    error: str = ""
    error_code: str = ""
    # On a submit: False when a job of this id was there already (and is what this describes).
    created: bool = True

    @property
    def ended(self) -> bool:
        return self.state in ENDED

    @classmethod
    def from_json(cls, document: Mapping[str, Any]) -> AsyncJob:
        return cls(
            inference_id=str(document["inference_id"]),
            model=str(document["model"]),
            state=str(document["state"]),
            output_location=str(document["output_location"]),
            failure_location=str(document["failure_location"]),
            status_url=str(document["status_url"]),
            submitted_at=str(document["submitted_at"]),
            attempts=int(document.get("attempts", 0)),
            started_at=str(document.get("started_at", "")),
            ended_at=str(document.get("ended_at", "")),
            error=str(document.get("error", "")),
            error_code=str(document.get("error_code", "")),
            created=bool(document.get("created", True)),
        )


def submit_query(inference_id: str, ttl_s: float | None, timeout_s: float | None, priority: int) -> str:
    """A submit's options as its query string ("" when none)."""
    options: dict[str, str] = {}
    if inference_id:
        options["inference_id"] = inference_id
    if ttl_s is not None:
        options["ttl_s"] = repr(ttl_s)
    if timeout_s is not None:
        options["timeout_s"] = repr(timeout_s)
    if priority:
        options["priority"] = str(priority)
    return f"?{urllib.parse.urlencode(options)}" if options else ""
