"""`inferd batch`: run a model over a dataset (SageMaker batch transform's knobs), resumable."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import click

from inferd.cli.client_options import client_security_options, client_tls
from inferd.tools.batch.options import AssembleWith, BatchStrategy, JoinSource, SplitType


class BatchUsage(click.ClickException):
    exit_code = 2


def _columns(text: str) -> dict[str, str]:
    mapping: dict[str, str] = {}
    for item in filter(None, (part.strip() for part in text.split(","))):
        column, sep, name = item.partition("=")
        if not sep or not column or not name:
            raise BatchUsage(f"--columns takes COLUMN=INPUT pairs, not {item!r}")
        mapping[column] = name
    return mapping


def _read_endpoints(location: str) -> dict[str, Any]:
    """The endpoints of a file as `inferd serve --endpoints` reads it (its own reader, strictly),
    each as the document core keeps of an endpoint."""
    from inferd.core.endpoints import spec_document
    from inferd.server.endpoint_file import EndpointFileError, read_endpoint_file

    try:
        return {spec.name: spec_document(spec) for spec in read_endpoint_file(location)}
    except EndpointFileError as exc:
        raise BatchUsage(str(exc)) from None


def _choice(
    enum_type: type[SplitType] | type[BatchStrategy] | type[AssembleWith] | type[JoinSource],
) -> click.Choice[str]:
    return click.Choice([member.value for member in enum_type])


@click.command()
@click.argument("model")
@click.option(
    "--model-repository",
    "repositories",
    multiple=True,
    help="The model repository (a folder or fsspec URL; repeat for several), as inferd serve takes it.",
)
@click.option("--model-version", default="", help="The version to run (default: the one the model's policy serves).")
@click.option("--input", "input_uri", required=True, help="A file, a folder or a prefix, local or s3://.")
@click.option(
    "--output",
    "output_uri",
    required=True,
    help="Where the outputs (.out or .parquet files), manifest, errors and summary go.",
)
@click.option(
    "--content-type",
    default="application/jsonlines",
    show_default=True,
    help="application/jsonlines, application/json, text/csv, application/x-npy, application/x-npz, "
    "application/vnd.apache.parquet, text/plain, or any other type for raw files (image/jpeg, ...).",
)
@click.option(
    "--accept",
    default="",
    help="What each input's output is: records in <input>.out (default: JSON Lines, CSV for CSV input), "
    "or application/vnd.apache.parquet: <input>.parquet, a row per answered record with its record number "
    "and a column per output (the output folder then reads as one Parquet dataset).",
)
@click.option(
    "--split-type",
    type=_choice(SplitType),
    help="Line: a record per line; None: a record per file (default: Line for JSON Lines and CSV, None otherwise).",
)
@click.option("--batch-strategy", type=_choice(BatchStrategy), default="MultiRecord", show_default=True)
@click.option(
    "--max-payload-mb",
    type=float,
    default=6.0,
    show_default=True,
    help="A mini-batch's records at most this many MB (0: no bound); a larger record is an error.",
)
@click.option(
    "--max-concurrent-transforms",
    type=click.IntRange(min=1),
    default=None,
    help="Mini-batches running at once (default: 4 on the local engine; 1 on the server engine, SageMaker's "
    "default, which leaves a server's online traffic its latency); on the Ray engine, the actors (default 2).",
)
@click.option("--assemble-with", type=_choice(AssembleWith), default="Line", show_default=True)
@click.option("--input-filter", default="$", show_default=True, help="JSONPath: what of each record the model gets.")
@click.option(
    "--output-filter", default="$", show_default=True, help="JSONPath: what of each output record is written."
)
@click.option(
    "--join-source",
    type=_choice(JoinSource),
    default="None",
    show_default=True,
    help="Input: each output beside its input record (JSON: under SageMakerOutput; CSV: appended).",
)
@click.option(
    "--invocations-timeout-seconds",
    type=click.FloatRange(min=0, min_open=True),
    default=600.0,
    show_default=True,
    help="A mini-batch's time limit.",
)
@click.option(
    "--invocations-max-retries",
    type=click.IntRange(min=0),
    default=3,
    show_default=True,
    help="Tries after the first of a mini-batch that timed out or found the model unavailable.",
)
@click.option(
    "--max-error-rate",
    type=click.FloatRange(0, 1),
    default=0.01,
    show_default=True,
    help="The share of records that may fail before the job stops (exit 1).",
)
@click.option(
    "--outputs", "output_names", default="", help="The outputs to compute and write: NAME,... (default: all)."
)
@click.option("--columns", default="", help="Parquet: COLUMN=INPUT,... (default: each input from its column).")
@click.option(
    "--shard-records",
    type=click.IntRange(min=1),
    default=10_000,
    show_default=True,
    help="Records per shard: the unit a rerun resumes from.",
)
@click.option(
    "--engine",
    type=click.Choice(["local", "server", "ray"]),
    default="local",
    show_default=True,
    help="local: the model of --model-repository loaded in this process; server: the model of the "
    "KServe v2 server at --url, as background work (online requests first); ray: the shards on a Ray "
    "cluster's actors, each loading the model of --model-repository (pip install 'inferd[ray]').",
)
@click.option("--url", default="", help="--engine server: the server (http://host:port or grpc://host:port).")
@click.option(
    "--ray-address",
    default="",
    help="--engine ray: the cluster's head (host:port) to join (default: a Ray of this machine, for the job).",
)
@click.option(
    "--endpoints",
    "endpoints_file",
    default=None,
    help="--engine local or ray: endpoints as inferd serve --endpoints FILE declares them (YAML, a path or "
    "fsspec URL); MODEL may then name one, and each record goes to the variant its key (its file and "
    "position) chooses by the variants' weights.",
)
@click.option("--execution-threads", type=click.IntRange(min=0), default=0, help="Worker threads (0: the default).")
@click.option("--quiet", is_flag=True, help="No progress display; the summary only.")
@client_security_options
def batch(
    model: str,
    repositories: tuple[str, ...],
    model_version: str,
    input_uri: str,
    output_uri: str,
    content_type: str,
    accept: str,
    split_type: str | None,
    batch_strategy: str,
    max_payload_mb: float,
    max_concurrent_transforms: int | None,
    assemble_with: str,
    input_filter: str,
    output_filter: str,
    join_source: str,
    invocations_timeout_seconds: float,
    invocations_max_retries: int,
    max_error_rate: float,
    output_names: str,
    columns: str,
    shard_records: int,
    engine: str,
    endpoints_file: str | None,
    url: str,
    ray_address: str,
    execution_threads: int,
    quiet: bool,
    ca_cert: Path | None,
    client_cert: Path | None,
    client_key: Path | None,
    token: str | None,
) -> None:
    """Run MODEL of a repository over every record of --input and write the outputs to --output,
    one `<input>.out` per input file, in input order, beside `_errors.jsonl` (each record that
    failed: its file, position and why), `_manifest.json` and `_summary.json`. Running the same
    command again after a crash or Ctrl-C resumes: only the shards not finished run again. Exits
    0 when done within --max-error-rate, 1 when it stopped on errors, 2 for bad usage."""
    from rich.console import Console

    from inferd.errors import InferdError
    from inferd.tools.batch.engines import EngineSpec
    from inferd.tools.batch.options import BatchOptions, BatchUsageError
    from inferd.tools.batch.report import RichProgress, summary_table
    from inferd.tools.batch.run import run_batch

    if engine in ("local", "ray") and not repositories:
        raise BatchUsage(f"--engine {engine} needs --model-repository")
    if ray_address and engine != "ray":
        raise BatchUsage("--ray-address is --engine ray's")
    if engine == "server" and not url:
        raise BatchUsage("--engine server needs --url")
    if engine == "server" and repositories:
        raise BatchUsage("--model-repository is --engine local's; the server has its own")
    spec = EngineSpec(
        kind=engine,
        repositories=repositories,
        url=url,
        ray_address=ray_address,
        execution_threads=execution_threads,
        tls=client_tls(ca_cert, client_cert, client_key),
        token=token,
    )

    if endpoints_file is not None and engine == "server":
        raise BatchUsage("--endpoints is the local and Ray engines'; a server's endpoints are its own")
    options = BatchOptions(
        model=model,
        model_version=model_version,
        input=input_uri,
        output=output_uri,
        content_type=content_type,
        accept=accept,
        split_type=SplitType(split_type) if split_type else None,
        batch_strategy=BatchStrategy(batch_strategy),
        max_payload_mb=max_payload_mb,
        max_concurrent_transforms=max_concurrent_transforms or {"server": 1, "ray": 2}.get(engine, 4),
        assemble_with=AssembleWith(assemble_with),
        input_filter=input_filter,
        output_filter=output_filter,
        join_source=JoinSource(join_source),
        invocations_timeout_s=invocations_timeout_seconds,
        invocations_max_retries=invocations_max_retries,
        max_error_rate=max_error_rate,
        columns=_columns(columns),
        outputs=tuple(name.strip() for name in output_names.split(",") if name.strip()),
        shard_records=shard_records,
        endpoints=_read_endpoints(endpoints_file) if endpoints_file else {},
    )
    console = Console(stderr=True)
    progress = None if quiet or not console.is_terminal else RichProgress(console)
    try:
        summary = asyncio.run(run_batch(options, spec, progress=progress))
    except BatchUsageError as exc:
        raise BatchUsage(str(exc)) from None
    except InferdError as exc:
        raise BatchUsage(exc.message) from None
    except KeyboardInterrupt:
        console.print("interrupted: run the same command again to resume (finished shards are kept)")
        raise SystemExit(130) from None
    except Exception as exc:  # the job could not go on: say why in one line, keep what it finished
        console.print(
            f"inferd batch stopped: {type(exc).__name__}: {exc}\n"
            "the shards it finished are kept: run the same command again to resume"
        )
        raise SystemExit(1) from None
    out = Console() if Console().is_terminal else Console(width=200)
    out.print(summary_table(summary, output_uri))
    raise SystemExit(summary.exit_code)
