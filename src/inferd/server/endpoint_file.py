"""`--endpoints FILE`: endpoints declared in a YAML file (a local path, or any fsspec URL such as
`s3://bucket/endpoints.yaml`), read at startup and again every `--repository-poll-secs`. The file
is then the only source of endpoints (GitOps: change the file, not the server): the API's PUT and
DELETE, and rollouts, answer 409.

    endpoints:
      shop:
        variants:
          - {name: blue, model: classifier, version: 1, weight: 90}
          - {name: green, model: classifier, version: 2, weight: 10}
        sticky: X-User-Id
        shadow:
          - {name: candidate, model: classifier, version: 3, sample: 0.1}

Each endpoint is read as the API's PUT body is, strictly, and set with the same checks. A file
that cannot be read or parsed leaves the endpoints as they were (and says why); an endpoint that
cannot be set (a variant that does not serve yet) is left out until a later reading can set it.

Replicas that serve the same file route with the same weights (and the same sticky hash: it
depends on the key and the variants' names alone). A fleet's rollout controller (`inferd rollout
start --controller --endpoints FILE`) changes the weights by writing the file
(`write_endpoint_weights`): every replica follows within one poll.
"""

from __future__ import annotations

import asyncio
import fcntl
import json
import logging
import os
import secrets
from pathlib import Path
from typing import Any

import yaml

from inferd.core.endpoint_control import EndpointControl
from inferd.core.endpoints import EndpointSpec
from inferd.errors import InferdError
from inferd.server.endpoints import decode_endpoint

logger = logging.getLogger(__name__)


class EndpointFileError(ValueError):
    """The file cannot be read, or is not a mapping of endpoints."""


def read_endpoint_file(location: str) -> list[EndpointSpec]:
    """The endpoints the file declares, each read strictly (an error names the endpoint and field)."""
    document = _read_document(location)
    specs = []
    for name, body in (document.get("endpoints") or {}).items():
        try:
            specs.append(decode_endpoint(str(name), json.dumps(body).encode()))
        except InferdError as exc:
            raise EndpointFileError(f"--endpoints {location}: {exc.message}") from None
    return specs


def write_endpoint_weights(location: str, endpoint: str, weights: dict[str, float]) -> None:
    """Set `endpoint`'s variants' weights in the file (the rest of it as it was, though its
    comments are not kept): a fleet's rollout controller, whose replicas follow the file. The new
    file replaces the old at once (a local one by a rename; an object store's PUT is whole)."""
    if _is_url(location):  # an object store has no lock: one controller a file
        _write_weights(location, endpoint, weights)
        return
    path = Path(location.removeprefix("file://"))
    with open(path.with_name(f".{path.name}.lock"), "a+b") as lock:  # controllers of other endpoints wait
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            _write_weights(location, endpoint, weights)
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def _write_weights(location: str, endpoint: str, weights: dict[str, float]) -> None:
    document = _read_document(location)
    body = (document.get("endpoints") or {}).get(endpoint)
    if not isinstance(body, dict) or not isinstance(body.get("variants"), list):
        raise EndpointFileError(f"--endpoints {location}: declares no endpoint '{endpoint}' with variants")
    for variant in body["variants"]:
        if isinstance(variant, dict) and variant.get("name") in weights:
            variant["weight"] = _plain_number(weights[variant["name"]])
    text = yaml.safe_dump(document, sort_keys=False).encode()
    try:
        if _is_url(location):
            import fsspec

            with fsspec.open(location, "wb") as file:
                file.write(text)
        else:
            path = Path(location.removeprefix("file://"))
            partial = path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}.partial")
            partial.write_bytes(text)
            os.replace(partial, path)
    except OSError as exc:
        raise EndpointFileError(f"--endpoints {location}: cannot be written: {exc}") from None


def _read_document(location: str) -> dict[str, Any]:
    try:
        if _is_url(location):
            import fsspec

            with fsspec.open(location, "rb") as file:
                text = file.read()
        else:
            with open(location.removeprefix("file://"), "rb") as file:
                text = file.read()
        document: Any = yaml.safe_load(text)
    except (OSError, yaml.YAMLError, ValueError) as exc:
        raise EndpointFileError(f"--endpoints {location}: cannot be read: {exc}") from None
    if document is None:
        return {}
    if not isinstance(document, dict) or not isinstance(document.get("endpoints") or {}, dict):
        raise EndpointFileError(f"--endpoints {location}: must hold `endpoints:`, a mapping of names to endpoints")
    return document


def _is_url(location: str) -> bool:
    return "://" in location and not location.startswith("file://")


def _plain_number(weight: float) -> float | int:
    """A weight as a person would write it: 90, not 90.0."""
    return int(weight) if float(weight).is_integer() else weight


async def apply_endpoint_file(control: EndpointControl, location: str, told: dict[str, str] | None = None) -> None:
    """Read the file (on a thread: it may be on S3) and serve what it declares. `told`: the
    problems already logged (a follower's): each is logged once, not at every reading."""
    specs = await asyncio.to_thread(read_endpoint_file, location)
    problems = await control.declare(specs)
    for name, problem in problems.items():
        if told is None or told.get(name) != problem:
            logger.warning("--endpoints %s: endpoint '%s' is not served: %s", location, name, problem)
    if told is not None:
        told.clear()
        told.update(problems)


async def follow_endpoint_file(control: EndpointControl, location: str, interval_s: float) -> None:
    """Read the file again every `interval_s` until cancelled; a bad reading changes nothing."""
    told: dict[str, str] = {}
    while True:
        await asyncio.sleep(interval_s)
        try:
            await apply_endpoint_file(control, location, told)
        except EndpointFileError as exc:
            logger.error("%s; the endpoints stay as they were", exc)
