"""Server settings: what `inferd serve` flags and INFERD_* environment variables decide."""

from __future__ import annotations

import enum

from pydantic import BaseModel, ConfigDict, Field


class LogFormat(enum.Enum):
    JSON = "json"
    TEXT = "text"


DEFAULT_MAX_REQUEST_BYTES = 64 * 1024 * 1024


class ServerSettings(BaseModel):
    model_config = ConfigDict(frozen=True)

    model_repository: str
    """Path of the model repository (Triton layout)."""
    host: str = "0.0.0.0"
    """Address every listener binds to."""
    http_port: int = Field(default=8000, ge=0, le=65535)
    """KServe v2 REST port (default 8000)."""
    grpc_port: int = Field(default=8001, ge=0, le=65535)
    """KServe v2 gRPC port (default 8001)."""
    metrics_port: int = Field(default=8002, ge=0, le=65535)
    """Prometheus /metrics port (default 8002)."""
    log_format: LogFormat = LogFormat.JSON
    log_level: str = "INFO"
    max_request_bytes: int = Field(default=DEFAULT_MAX_REQUEST_BYTES, gt=0)
    """Largest request body (HTTP) or message (gRPC) accepted, in bytes (default 64 MiB)."""
    strict_readiness: bool = False
    """When true, /v2/health/ready needs every model ready; else it needs startup loading done."""
    shutdown_timeout_s: float = Field(default=30.0, ge=0)
    """How long SIGTERM waits for in-flight requests before closing (default 30 s)."""
