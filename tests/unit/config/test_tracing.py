"""When tracing is on, and how: `--otlp-endpoint`, `--trace-sample-ratio` and OpenTelemetry's
standard environment variables (config.tracing)."""

from __future__ import annotations

import pytest

from inferd.config.tracing import TraceExporter, missing_tracing_modules, tracing_settings

OTLP, CONSOLE = TraceExporter.OTLP, TraceExporter.CONSOLE


@pytest.mark.parametrize(
    ("flag", "environ", "exporters"),
    [
        (None, {}, None),
        (None, {"OTEL_SERVICE_NAME": "x", "OTEL_BSP_SCHEDULE_DELAY": "10"}, None),
        ("http://collector:4317", {}, (OTLP,)),
        (None, {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4317"}, (OTLP,)),
        (None, {"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://collector:4317"}, (OTLP,)),
        (None, {"OTEL_TRACES_EXPORTER": "otlp"}, (OTLP,)),
        (None, {"OTEL_TRACES_EXPORTER": "console"}, (CONSOLE,)),
        (None, {"OTEL_TRACES_EXPORTER": "otlp, console"}, (OTLP, CONSOLE)),
        (None, {"OTEL_TRACES_EXPORTER": "none", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4317"}, None),
        (None, {"OTEL_SDK_DISABLED": "true", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4317"}, None),
        (None, {"OTEL_EXPORTER_OTLP_ENDPOINT": ""}, None),
        # The flag is the operator's explicit wish: it wins over the environment.
        ("http://c:4317", {"OTEL_TRACES_EXPORTER": "none"}, (OTLP,)),
        ("http://c:4317", {"OTEL_SDK_DISABLED": "true"}, (OTLP,)),
        ("http://c:4317", {"OTEL_TRACES_EXPORTER": "console"}, (CONSOLE, OTLP)),
    ],
)
def test_when_tracing_is_on(
    flag: str | None, environ: dict[str, str], exporters: tuple[TraceExporter, ...] | None
) -> None:
    settings = tracing_settings(flag, 1.0, environ)
    assert (settings.exporters if settings is not None else None) == exporters
    if settings is not None:
        assert settings.otlp_endpoint == flag


def test_service_name_and_ratio() -> None:
    settings = tracing_settings("http://c:4317", 0.25, {"OTEL_SERVICE_NAME": "scorer"})
    assert settings is not None and settings.service_name == "scorer" and settings.sample_ratio == 0.25
    default = tracing_settings("http://c:4317", 1.0, {})
    assert default is not None and default.service_name == "inferd"


@pytest.mark.parametrize(
    ("environ", "message"),
    [
        ({"OTEL_TRACES_EXPORTER": "zipkin"}, "inferd knows otlp, console, none"),
        ({"OTEL_TRACES_EXPORTER": "otlp", "OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf"}, "OTLP over gRPC only"),
        ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318", "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": "http/json"}, "gRPC"),
    ],
)
def test_what_inferd_cannot_honour_is_refused(environ: dict[str, str], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        tracing_settings(None, 1.0, environ)


def test_the_tracing_extra_is_installed_for_the_tests() -> None:
    assert missing_tracing_modules() == []
