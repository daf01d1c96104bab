"""`inferd perf`: load any KServe v2 server (inferd or Triton) and measure it, as perf_analyzer does."""

from __future__ import annotations

from pathlib import Path

import click

from inferd.cli.client_options import client_security_options, client_tls


def parse_loads(text: str, *, whole: bool) -> tuple[float, ...]:
    """`1:64:x2` (1, 2, 4, ... 64), `1:8:2` (1, 3, 5, 7), `4`, or `1,2,8`."""
    kind = "concurrency" if whole else "request rate"
    try:
        if ":" in text:
            start_text, end_text, *rest = text.split(":")
            step = rest[0] if rest else "1"
            start, end = float(start_text), float(end_text)
            loads: list[float] = []
            value = start
            factor = float(step[1:]) if step.startswith("x") else None
            increment = None if factor else float(step)
            if (factor is not None and factor <= 1) or (increment is not None and increment <= 0) or len(rest) > 1:
                raise ValueError
            while value <= end + 1e-9 and len(loads) < 1000:
                loads.append(value)
                value = value * factor if factor else value + (increment or 0)
        else:
            loads = [float(part) for part in text.split(",")]
    except ValueError:
        raise click.ClickException(
            f"{kind} {text!r} must be START:END:STEP (STEP added, or xN multiplied), a number, or a list such as 1,2,8"
        ) from None
    if not loads or any(v <= 0 or (whole and v != int(v)) for v in loads):
        raise click.ClickException(f"{kind} {text!r} must be {'whole ' if whole else ''}numbers above 0")
    return tuple(loads)


def _print_locustfile(context: click.Context, parameter: click.Parameter, value: bool) -> None:
    if value:
        from inferd.tools.perf import locustfile_path

        click.echo(locustfile_path())
        context.exit()


@click.command()
@click.option(
    "--locustfile", is_flag=True, expose_value=False, is_eager=True, callback=_print_locustfile,
    help="Print the path of inferd's Locust file (distributed load tests) and exit.",
)  # fmt: skip
@click.option("-m", "--model", required=True, help="The model to load.")
@click.option("-x", "--model-version", default="", help="Its version (default: the one the server serves).")
@click.option(
    "-u", "--url", default="localhost:8000", show_default=True,
    help="The server: http://host:port, grpc://host:port, or host:port with --protocol.",
)  # fmt: skip
@click.option(
    "-i", "--protocol", type=click.Choice(["http", "grpc"]), default=None, help="Default: the url's, or http."
)
@click.option("--json", "json_tensors", is_flag=True, help="HTTP tensors as JSON rather than binary.")
@click.option("--concurrency", "concurrency", help="Requests in flight: 1:64:x2, 1:8:2, 4 or 1,2,8 (default 1).")
@click.option("--request-rate", "request_rate", help="Requests a second, sent on a schedule (open loop): same forms.")
@click.option(
    "--request-distribution", type=click.Choice(["constant", "poisson"]), default="constant", show_default=True
)
@click.option("-b", "--batch-size", type=int, default=1, show_default=True, help="Rows per request.")
@click.option("--shape", "shapes", multiple=True, help="A variable input's shape without the batch: NAME:1,128.")
@click.option("--input-data", default="random", show_default=True, help="zero, random, or a .json / .npz file.")
@click.option(
    "-p", "--measurement-interval", "interval_ms", type=click.FloatRange(min=10), default=5000, show_default=True,
    help="Milliseconds per measurement window.",
)  # fmt: skip
@click.option("-s", "--stability-percentage", type=click.FloatRange(min=0), default=10.0, show_default=True)
@click.option("-r", "--max-trials", type=click.IntRange(min=1), default=10, show_default=True, help="Windows at most.")
@click.option("--percentile", type=click.IntRange(1, 99), default=None, help="Judge stability on this percentile.")
@click.option("--latency-threshold", "latency_limit_ms", type=float, help="Stop the sweep past this latency (ms).")
@click.option("--processes", type=click.IntRange(min=1), default=1, show_default=True, help="Load generator processes.")
@click.option("--timeout", "timeout_s", type=click.FloatRange(min=0.001), default=30.0, show_default=True)
@click.option("--output", type=click.Choice(["table", "csv", "json"]), default="table", show_default=True)
@click.option("-f", "--output-file", type=click.Path(dir_okay=False, path_type=Path), help="Also write .csv or .json.")
@client_security_options
def perf(
    model: str,
    model_version: str,
    url: str,
    protocol: str | None,
    json_tensors: bool,
    concurrency: str | None,
    request_rate: str | None,
    request_distribution: str,
    batch_size: int,
    shapes: tuple[str, ...],
    input_data: str,
    interval_ms: float,
    stability_percentage: float,
    max_trials: int,
    percentile: int | None,
    latency_limit_ms: float | None,
    processes: int,
    timeout_s: float,
    output: str,
    output_file: Path | None,
    ca_cert: Path | None,
    client_cert: Path | None,
    client_key: Path | None,
    token: str | None,
) -> None:
    """Load a model at each concurrency (or request rate) until the figures are stable; print
    throughput, latency percentiles, errors, and the server's queue, compute and batch size."""
    from rich.console import Console

    from inferd.client import parse_url
    from inferd.errors import InferdError
    from inferd.tools.inputs import InputError, parse_shape
    from inferd.tools.perf import report
    from inferd.tools.perf.measure import PerfSettings, run_perf

    if concurrency and request_rate:
        raise click.ClickException("give --concurrency or --request-rate, not both")
    try:
        scheme, address, secure = parse_url(url, protocol)  # type: ignore[arg-type]
        loads = parse_loads(request_rate, whole=False) if request_rate else parse_loads(concurrency or "1", whole=True)
        settings = PerfSettings(
            url=f"{scheme}{'s' if secure else ''}://{address}",
            model=model,
            version=model_version,
            binary=not json_tensors,
            mode="rate" if request_rate else "concurrency",
            loads=loads,
            distribution=request_distribution,  # type: ignore[arg-type]
            batch_size=batch_size,
            shapes=dict(parse_shape(s) for s in shapes),
            input_data=input_data,
            measurement_interval_s=interval_ms / 1000,
            stability_percentage=stability_percentage,
            max_trials=max_trials,
            percentile=percentile,
            latency_limit_ms=latency_limit_ms,
            processes=processes,
            timeout_s=timeout_s,
            tls=client_tls(ca_cert, client_cert, client_key),
            token=token,
        )
        console = Console(stderr=True)
        with report.live_display(console, f"{model} at {settings.url}") as on_window:
            result = run_perf(settings, on_window)
    except (InputError, ValueError) as exc:
        raise click.ClickException(str(exc)) from None
    except InferdError as exc:
        raise click.ClickException(exc.message) from None
    if output == "table":
        out = Console()
        if not out.is_terminal:  # a file or a pipe: the whole table, not one squeezed into 80 columns
            out = Console(width=200)
        out.print(report.steps_table(result.steps, f"{model} at {settings.url}, batch size {batch_size}"))
        out.print(report.summary(result))
    else:
        click.echo(report.as_csv(result) if output == "csv" else report.as_json_text(result), nl=output == "json")
    if output_file is not None:
        output_file.write_text(report.as_json_text(result) if output_file.suffix == ".json" else report.as_csv(result))
