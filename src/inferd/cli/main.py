"""`inferd`: the command group; each verb lives in its own module."""

from __future__ import annotations

import click

from inferd import __version__
from inferd.cli.analyze import analyze
from inferd.cli.async_jobs import async_jobs
from inferd.cli.batch import batch
from inferd.cli.deploy import deploy
from inferd.cli.fleet import fleet
from inferd.cli.health import health
from inferd.cli.optimize import optimize
from inferd.cli.perf import perf
from inferd.cli.plan import plan
from inferd.cli.profile import profile
from inferd.cli.rollout import rollout
from inferd.cli.serve import serve
from inferd.cli.validate import validate


@click.group(context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.version_option(__version__, prog_name="inferd")
def cli() -> None:
    """inferd: serve ONNX models over KServe v2 REST and gRPC, Triton-compatible."""


cli.add_command(serve)
cli.add_command(perf)
cli.add_command(validate)
cli.add_command(optimize)
cli.add_command(analyze)
cli.add_command(profile)
cli.add_command(plan)
cli.add_command(health)
cli.add_command(deploy)
cli.add_command(fleet)
cli.add_command(rollout)
cli.add_command(async_jobs)
cli.add_command(batch)


def main() -> None:
    cli()
