"""`inferd deploy`: a plan as manifests a cluster runs."""

from __future__ import annotations

from pathlib import Path

import click

from inferd import __version__


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
    folders = write_k8s(plan, settings, output)
    click.echo(f"{len(plan.instances)} bins, {len(plan.models)} models: {output}")
    for folder in folders:
        click.echo(f"  kubectl apply -k {folder}")
