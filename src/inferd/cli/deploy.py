"""`inferd deploy`: a plan as manifests a cluster runs."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import click

from inferd import __version__
from inferd.cli.rollout import guard_options

if TYPE_CHECKING:
    from inferd.tools.deploy.endpoints import DeployedEndpoint, RolloutSettings
    from inferd.tools.deploy.serverless import ServerlessSettings


@click.group()
def deploy() -> None:
    """Turn a plan (inferd plan's plan.json) into what a cluster runs."""


@deploy.command()
@click.argument("plan_path", metavar="PLAN", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.option("-o", "--output", type=click.Path(file_okay=False, path_type=Path), required=True,
              help="Where the Kustomize tree goes (base/, overlays/, kserve/).")  # fmt: skip
@click.option("--model-repository", required=True,
              help="The repository every pod loads its models from at start, such as s3://bucket/models.")  # fmt: skip
@click.option("--image", default=f"inferd:{__version__}", show_default=True, help="The inferd image (Dockerfile).")
@click.option("--namespace", default="inferd", show_default=True)
@click.option("--credentials-secret", default="inferd-s3", show_default=True,
              help="A Secret of AWS_* variables for the repository (optional: or an instance role).")  # fmt: skip
@click.option("--s3-endpoint", default="", help="AWS_ENDPOINT_URL for an S3-compatible store (MinIO).")
@click.option("--shutdown-timeout", "shutdown_timeout_s", type=click.FloatRange(min=0), default=30.0,
              show_default=True, help="inferd's drain on SIGTERM; the pods' grace period is longer.")  # fmt: skip
@click.option("--autoscale", type=click.Choice(["cpu", "queue"]), default="cpu", show_default=True,
              help="HPA on CPU, or on inferd_queue_depth (needs prometheus-adapter).")  # fmt: skip
@click.option("--max-replicas", type=click.IntRange(min=1), default=4, show_default=True, help="Pods a bin at most.")
@click.option("--queue-target", type=click.FloatRange(min=0, min_open=True), default=4.0, show_default=True,
              help="With --autoscale queue: queued requests a pod may average.")  # fmt: skip
@click.option("--ingress-class", default="nginx", show_default=True)
@click.option("--host", "ingress_host", default="", help="The Ingress host (default: any).")
@click.option("--no-node-selector", is_flag=True, help="Do not pin bins to their planned instance types.")
@click.option("--pipeline-front", default="", help="Split pipeline: the front's repository (tokenizer, ensemble).")
@click.option("--pipeline-model", default="", help="Split pipeline: the model side's repository (127.0.0.1:9000).")
@click.option("--pipeline-routes", default="", help="Split pipeline: models the Ingress sends to it, comma-separated.")
@click.option("--scale-to-zero", is_flag=True,
              help="kserve/: each bin as a serverless InferenceService that scales to zero (Knative).")  # fmt: skip
@click.option("--scale-target", type=click.IntRange(min=1), default=8, show_default=True,
              help="With --scale-to-zero: requests in flight a pod takes before Knative adds one.")  # fmt: skip
@click.option("--max-load-seconds", type=click.IntRange(min=1), default=600, show_default=True,
              help="With --scale-to-zero: the longest a new pod may take to load its models.")  # fmt: skip
@click.option("--scale-down-delay", "scale_down_delay_s", type=click.IntRange(min=0, max=3600), default=300,
              show_default=True,
              help="With --scale-to-zero: seconds a pod stays after its last request or job.")  # fmt: skip
@click.option("--async-queue", default="",
              help="With --scale-to-zero: redis://HOST:PORT/DB, the async queue: async/ gets workers that KEDA "
                   "scales from zero on its streams' lag.")  # fmt: skip
@click.option("--async-payload-path", default="", help="With --async-queue: s3:// place of async request bodies.")
@click.option("--async-output-path", default="", help="With --async-queue: s3:// place of async results.")
@click.option("--async-concurrency", type=click.IntRange(min=1), default=8, show_default=True,
              help="With --async-queue: jobs a worker runs at once, and KEDA's target of jobs per worker.")  # fmt: skip
@click.option("--async-priorities", default="0", show_default=True,
              help="With --async-queue: the job priorities clients use, comma-separated (a stream each).")  # fmt: skip
@click.option("--endpoints", "endpoints_file", default="", metavar="FILE",
              help="endpoints/: the endpoints FILE declares (inferd serve --endpoints), each variant its own "
                   "pods, the split a Gateway API HTTPRoute's, new revisions of its heaviest variant an Argo "
                   "Rollout's.")  # fmt: skip
@click.option("--gateway", default="", metavar="[NAMESPACE/]NAME",
              help="With --endpoints: the Gateway the HTTPRoutes attach to.")  # fmt: skip
@click.option("--prometheus-url", default="",
              help="With --endpoints: the Prometheus Argo's analysis queries (it scrapes the pods).")  # fmt: skip
@click.option("--rollout-strategy", default="canary:10", show_default=True,
              help="With --endpoints: the Rollout's steps (canary:P, linear:K; the last is Argo's "
                   "promotion).")  # fmt: skip
@click.option("--rollout-bake", default="5m", show_default=True, help="With --endpoints: each step's bake.")
@guard_options
@click.option("--scrape-interval", default="15s", show_default=True,
              help="With --endpoints: the ServiceMonitor's interval (the guards' windows are at least 4 "
                   "of it).")  # fmt: skip
def k8s(
    plan_path: Path,
    output: Path,
    model_repository: str,
    image: str,
    namespace: str,
    credentials_secret: str,
    s3_endpoint: str,
    shutdown_timeout_s: float,
    autoscale: str,
    max_replicas: int,
    queue_target: float,
    ingress_class: str,
    ingress_host: str,
    no_node_selector: bool,
    pipeline_front: str,
    pipeline_model: str,
    pipeline_routes: str,
    scale_to_zero: bool,
    scale_target: int,
    max_load_seconds: int,
    scale_down_delay_s: int,
    async_queue: str,
    async_payload_path: str,
    async_output_path: str,
    async_concurrency: int,
    async_priorities: str,
    endpoints_file: str,
    gateway: str,
    prometheus_url: str,
    rollout_strategy: str,
    rollout_bake: str,
    min_requests: int,
    max_error_rate_delta: float,
    max_p99_ratio: float,
    min_p99_delta: str,
    scrape_interval: str,
) -> None:
    """Write PLAN as Kubernetes manifests: a Deployment, Service, HPA and PDB per bin, a Service per
    set of bins sharing models, an Ingress routing /v2/models/{m} to the bins that hold m, and a
    KServe ServingRuntime with a scale-to-zero InferenceService. Apply with kubectl apply -k."""
    from inferd.tools.deploy import DeploySettings, write_k8s
    from inferd.tools.plan import plan_file

    if bool(pipeline_front) != bool(pipeline_model):
        raise click.ClickException("a split pipeline needs both --pipeline-front and --pipeline-model")
    if pipeline_routes and not pipeline_front:
        raise click.ClickException("--pipeline-routes needs --pipeline-front and --pipeline-model")
    try:
        plan = plan_file.read(plan_path)
    except ValueError as exc:
        raise click.ClickException(str(exc)) from None
    routes = tuple(part.strip() for part in pipeline_routes.split(",") if part.strip())
    clash = sorted(set(routes) & set(plan.models))
    if clash:
        raise click.ClickException(f"--pipeline-routes {clash} are models of the plan: route them to their bins")
    settings = DeploySettings(
        image=image,
        model_repository=model_repository,
        namespace=namespace,
        credentials_secret=credentials_secret,
        s3_endpoint=s3_endpoint,
        shutdown_timeout_s=shutdown_timeout_s,
        autoscale="queue" if autoscale == "queue" else "cpu",
        max_replicas=max_replicas,
        queue_target=queue_target,
        ingress_class=ingress_class,
        ingress_host=ingress_host,
        node_selector=not no_node_selector,
        pipeline_front=pipeline_front,
        pipeline_model=pipeline_model,
        pipeline_routes=routes,
    )
    serverless = None
    if scale_to_zero:
        serverless = _serverless(
            scale_target, max_load_seconds, scale_down_delay_s, async_queue, async_payload_path, async_output_path,
            async_priorities, async_concurrency,
        )  # fmt: skip
    elif async_queue:
        raise click.ClickException("--async-queue goes with --scale-to-zero")
    endpoints = None
    if endpoints_file:
        endpoints = _endpoints(
            endpoints_file, gateway, prometheus_url, rollout_strategy, rollout_bake, min_requests,
            max_error_rate_delta, max_p99_ratio, min_p99_delta, scrape_interval,
        )  # fmt: skip
    folders = write_k8s(plan, settings, output, serverless)
    if endpoints is not None:
        from inferd.tools.deploy.kustomize import write_endpoints

        try:
            folders += write_endpoints(endpoints[0], plan, settings, endpoints[1], output)
        except ValueError as exc:
            raise click.ClickException(str(exc)) from None
    click.echo(f"{len(plan.instances)} bins, {len(plan.models)} models: {output}")
    for folder in folders:
        click.echo(f"  kubectl apply -k {folder}")


def _serverless(
    scale_target: int,
    max_load_s: int,
    scale_down_delay_s: int,
    queue: str,
    payloads: str,
    outputs: str,
    priorities: str,
    concurrency: int,
) -> ServerlessSettings:
    from inferd.tools.deploy.serverless import ServerlessSettings, redis_address

    if queue:
        try:
            redis_address(queue)
        except ValueError as exc:
            raise click.ClickException(f"--async-queue {exc}") from None
        for flag, place in (("--async-payload-path", payloads), ("--async-output-path", outputs)):
            if not place.startswith("s3://"):
                raise click.ClickException(
                    f"--async-queue is shared by the async workers: {flag} must be an s3:// place all of them reach"
                )
    try:
        levels = tuple(sorted({int(part) for part in priorities.split(",") if part.strip()}))
    except ValueError:
        raise click.ClickException(f"--async-priorities {priorities!r}: whole numbers, comma-separated") from None
    return ServerlessSettings(
        scale_target, max_load_s, scale_down_delay_s, queue, payloads, outputs, levels or (0,), concurrency
    )


def _endpoints(
    location: str, gateway: str, prometheus_url: str, strategy: str, bake: str, min_requests: int,
    max_error_rate_delta: float, max_p99_ratio: float, min_p99_delta: str, scrape_interval: str,
) -> tuple[list[DeployedEndpoint], RolloutSettings]:  # fmt: skip
    """The file's endpoints as the deploy tool takes them, and the rollouts' settings."""
    from inferd.core.rollout import parse_duration, parse_strategy
    from inferd.errors import InferdError
    from inferd.server.endpoint_file import EndpointFileError, read_endpoint_file
    from inferd.tools.deploy.endpoints import DeployedEndpoint, DeployedVariant, RolloutSettings

    if not gateway:
        raise click.ClickException("--endpoints needs --gateway [NAMESPACE/]NAME: the Gateway its HTTPRoutes attach to")
    if not prometheus_url:
        raise click.ClickException("--endpoints needs --prometheus-url: the Prometheus Argo's analysis queries")
    try:
        specs = read_endpoint_file(location)
        rollout = RolloutSettings(
            gateway=gateway.rpartition("/")[2],
            gateway_namespace=gateway.rpartition("/")[0],
            prometheus_url=prometheus_url,
            shares=parse_strategy(strategy),
            bake_s=parse_duration(bake),
            min_requests=min_requests,
            max_error_rate_delta=max_error_rate_delta,
            max_p99_ratio=max_p99_ratio,
            min_p99_delta_s=parse_duration(min_p99_delta),
            scrape_interval_s=parse_duration(scrape_interval),
        )
    except (EndpointFileError, InferdError, ValueError) as exc:
        raise click.ClickException(getattr(exc, "message", str(exc))) from None
    if not specs:
        raise click.ClickException(f"--endpoints {location} declares no endpoint")
    endpoints = [
        DeployedEndpoint(
            spec.name,
            tuple(DeployedVariant(v.name, v.model, v.version, v.weight) for v in spec.variants),
            spec.primary.name,
        )
        for spec in specs
    ]
    for spec in specs:
        if spec.sticky or spec.shadows:  # one server's routing: a Gateway's split knows neither
            click.echo(
                f"endpoint '{spec.name}': its sticky header and shadows are one server's, not written for Kubernetes "
                "(each variant's pods serve it alone)",
                err=True,
            )
    return endpoints, rollout
