"""Whether and where the server exports traces: `inferd serve --otlp-endpoint` and
`--trace-sample-ratio`, and OpenTelemetry's standard environment variables.

Tracing is off unless asked for, and when off the server imports none of OpenTelemetry. It is on
when `--otlp-endpoint` is given, or when the environment asks for it the way OpenTelemetry's SDKs
read it: OTEL_TRACES_EXPORTER (`otlp`, `console`, `none`), else an OTLP endpoint
(OTEL_EXPORTER_OTLP_TRACES_ENDPOINT / OTEL_EXPORTER_OTLP_ENDPOINT), unless OTEL_SDK_DISABLED=true.
The exporter reads its other OTEL_EXPORTER_OTLP_* variables (headers, certificates, timeout) and
the batch span processor its OTEL_BSP_* ones itself.
"""

from __future__ import annotations

import enum
import importlib.util
from collections.abc import Mapping

from pydantic import BaseModel, ConfigDict, Field

DEFAULT_SERVICE_NAME = "inferd"
# What `pip install` needs for tracing (pyproject.toml's optional extra).
EXTRA = "inferd[tracing]"
_REQUIRED_MODULES = ("opentelemetry.sdk.trace", "opentelemetry.exporter.otlp.proto.grpc.trace_exporter")


class TraceExporter(enum.Enum):
    OTLP = "otlp"
    """OTLP over gRPC (a collector, Jaeger, Tempo, ...)."""
    CONSOLE = "console"
    """Spans printed as JSON on standard output: for a quick look, not for production."""


class TracingSettings(BaseModel):
    model_config = ConfigDict(frozen=True)

    exporters: tuple[TraceExporter, ...] = Field(min_length=1)
    otlp_endpoint: str | None = None
    """None: the exporter's own choice (OTEL_EXPORTER_OTLP_TRACES_ENDPOINT, OTEL_EXPORTER_OTLP_ENDPOINT,
    else http://localhost:4317)."""
    sample_ratio: float = Field(default=1.0, ge=0.0, le=1.0)
    """Of the requests whose client sent no sampling decision; a traceparent's decision is followed."""
    service_name: str = DEFAULT_SERVICE_NAME


def tracing_settings(
    otlp_endpoint: str | None, sample_ratio: float, environ: Mapping[str, str]
) -> TracingSettings | None:
    """The tracing the flags and the environment ask for; None when off. `--otlp-endpoint` turns
    it on whatever the environment says; without it the environment decides. ValueError for
    settings inferd cannot honour (an exporter or an OTLP protocol it does not have)."""
    exporters = _exporters(environ.get("OTEL_TRACES_EXPORTER"))
    if otlp_endpoint:
        exporters = (*(e for e in exporters or () if e is not TraceExporter.OTLP), TraceExporter.OTLP)
    elif _true(environ.get("OTEL_SDK_DISABLED")):
        return None
    elif exporters is None:
        endpoints = ("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_EXPORTER_OTLP_ENDPOINT")
        exporters = (TraceExporter.OTLP,) if any(environ.get(name) for name in endpoints) else ()
    if not exporters:
        return None
    if TraceExporter.OTLP in exporters:
        protocol = environ.get("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL") or environ.get("OTEL_EXPORTER_OTLP_PROTOCOL")
        if protocol and protocol.strip().lower() != "grpc":
            raise ValueError(
                f"OTEL_EXPORTER_OTLP_PROTOCOL {protocol!r}: inferd exports OTLP over gRPC only; unset it or set 'grpc'"
            )
    return TracingSettings(
        exporters=exporters,
        otlp_endpoint=otlp_endpoint or None,
        sample_ratio=sample_ratio,
        service_name=environ.get("OTEL_SERVICE_NAME", "").strip() or DEFAULT_SERVICE_NAME,
    )


def missing_tracing_modules() -> list[str]:
    """The modules tracing needs that are not installed (found without importing them)."""
    missing = []
    for name in _REQUIRED_MODULES:
        try:
            found = importlib.util.find_spec(name) is not None
        except ImportError:  # a parent package is missing
            found = False
        if not found:
            missing.append(name)
    return missing


def _exporters(value: str | None) -> tuple[TraceExporter, ...] | None:
    """OTEL_TRACES_EXPORTER's list; None when unset, () for `none`."""
    if value is None or not value.strip():
        return None
    exporters: list[TraceExporter] = []
    for name in (part.strip().lower() for part in value.split(",")):
        if name == "none":
            return ()
        try:
            exporter = TraceExporter(name)
        except ValueError:
            known = ", ".join([e.value for e in TraceExporter] + ["none"])
            raise ValueError(f"OTEL_TRACES_EXPORTER {value!r}: inferd knows {known}") from None
        if exporter not in exporters:
            exporters.append(exporter)
    return tuple(exporters)


def _true(value: str | None) -> bool:
    return value is not None and value.strip().lower() == "true"
