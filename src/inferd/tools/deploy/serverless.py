"""`inferd deploy k8s --scale-to-zero`: the plan's bins as KServe InferenceServices in serverless
(Knative) mode, each scaling to zero on its own, and async workers that KEDA scales to zero.

A bin's pod is routed to only once its models serve: the runtime's readiness probe asks inferd's
`/v2/health/ready`, which answers 200 only after the startup loads (Knative runs the probe in its
queue-proxy and sends no request before it passes). A pod that is still loading is not scaled
away: Knative's progress deadline is the bin's longest allowed load, and a scale-down waits its
delay after the last request (a longer load than the delay would otherwise be cut by KServe, as
kserve#1247 reported). KServe appends an InferenceService's `args` to its runtime's, so each bin
adds only which models it loads (and no optimized-model cache, which a pod from zero would write
and never read).

Async inference (`--async-queue redis://...`): the bins take submits and answer their status but
run no job (`--async-concurrency 0`: they scale with requests, as any); a Deployment of workers
sharing the Redis Streams queue runs them, scaled by KEDA on each priority stream's consumer
group: its lag (jobs no worker took yet) wakes the first worker from zero and adds workers, its
pending entries (jobs workers run) keep at least one while any runs. A scale-down between workers
may cut a job short: its lease runs out and another worker runs it again (an attempt counted)."""

from __future__ import annotations

from dataclasses import dataclass
from urllib.parse import urlsplit

from inferd.config.async_queue import GROUP, stream_name
from inferd.tools.deploy.k8s import (
    BIN,
    NAME,
    DeploySettings,
    Manifest,
    labels_of,
    pod_spec,
    resource_name,
    resources_of,
    server_container,
    service,
)
from inferd.tools.plan.plan_file import Plan

ASYNC = "async"


@dataclass(frozen=True, slots=True)
class ServerlessSettings:
    scale_target: int = 8
    """Requests in flight a pod takes before Knative adds one (its concurrency target)."""
    max_load_s: int = 600
    """The longest a pod may take from its start to serving its models (Knative's progress deadline)."""
    scale_down_delay_s: int = 300
    """How long a pod stays after its last request before it is scaled away (to zero included)."""
    async_queue: str = ""
    """redis://HOST:PORT/DB: the async queue the async workers share; empty: no async workers."""
    async_payload_path: str = ""
    async_output_path: str = ""
    async_priorities: tuple[int, ...] = (0,)
    """The priorities clients submit jobs with: one stream each."""
    async_concurrency: int = 8
    """Jobs a worker runs at once: KEDA's target of jobs per worker, waiting or running."""


def redis_address(url: str) -> tuple[str, str, bool]:
    """(host:port, database, TLS) of a redis:// or rediss:// URL without credentials (ValueError
    otherwise: a password would be written into the manifests; KEDA takes it from a Secret)."""
    parts = urlsplit(url)
    if parts.scheme not in ("redis", "rediss") or not parts.hostname:
        raise ValueError(f"{url!r}: expected redis://HOST:PORT/DB or rediss://HOST:PORT/DB")
    if parts.username or parts.password:
        raise ValueError(f"{url!r}: credentials in the URL would be written into the manifests; not supported yet")
    database = parts.path.strip("/") or "0"
    if not database.isdigit() or parts.query:
        raise ValueError(f"{url!r}: the path is the database's number, and nothing follows it")
    return f"{parts.hostname}:{parts.port or 6379}", database, parts.scheme == "rediss"


def async_args(serverless: ServerlessSettings, concurrency: int) -> list[str]:
    """The flags of a server that shares the async queue, running `concurrency` jobs at once."""
    return ["--state-dir", "/tmp/state", "--async-queue", serverless.async_queue,
            "--async-payload-path", serverless.async_payload_path, "--async-output-path", serverless.async_output_path,
            "--async-concurrency", str(concurrency)]  # fmt: skip


def inference_services(plan: Plan, settings: DeploySettings, serverless: ServerlessSettings) -> list[Manifest]:
    """One serverless InferenceService per bin of the plan, served by the `inferd` runtime."""
    server_mb = float(plan.settings.get("limits", {}).get("server_memory_mb", 0.0) or 0.0)
    documents = []
    for instance in plan.instances:
        # A pod from zero starts on an empty disk and loads each model once: writing the models'
        # optimized graphs (the ONNX cache) would only lengthen the load that wakes it.
        args = ["--model-control-mode", "explicit", "--onnx-cache-size", "0"]
        for model in instance.models:
            args += ["--load-model", model]
        if serverless.async_queue:  # submits come here; the workers run them
            args += async_args(serverless, 0)
        documents.append(
            {
                "apiVersion": "serving.kserve.io/v1beta1",
                "kind": "InferenceService",
                "metadata": {
                    "name": resource_name(instance.name),
                    "labels": {**labels_of(instance.name, settings), BIN: instance.name},
                    "annotations": {
                        "serving.kserve.io/deploymentMode": "Serverless",
                        "serving.knative.dev/progress-deadline": f"{serverless.max_load_s}s",
                        "autoscaling.knative.dev/scale-down-delay": f"{serverless.scale_down_delay_s}s",
                        "inferd.dev/models": ",".join(instance.models),
                    },
                },
                "spec": {
                    "predictor": {
                        "minReplicas": 0,
                        "maxReplicas": settings.max_replicas,
                        "scaleMetric": "concurrency",
                        "scaleTarget": serverless.scale_target,
                        # A request held while a pod starts waits as long as a load may take.
                        "timeout": serverless.max_load_s,
                        "model": {
                            "modelFormat": {"name": "triton"},
                            "runtime": "inferd",
                            "protocolVersion": "v2",
                            "storageUri": settings.model_repository.rstrip("/"),
                            "args": args,
                            "resources": resources_of(instance, server_mb),
                        },
                    },
                },
            }
        )
    return documents


def async_workers(settings: DeploySettings, serverless: ServerlessSettings) -> list[Manifest]:
    """The async workers' Deployment (its replicas KEDA's), their Service and the ScaledObject."""
    name = resource_name(ASYNC)
    args = ["serve", "--model-repository", settings.model_repository,
            *async_args(serverless, serverless.async_concurrency),
            "--shutdown-timeout", f"{settings.shutdown_timeout_s:g}", "--log-format", "json"]  # fmt: skip
    container = server_container(
        "inferd", args, settings, {"requests": {"cpu": "1", "memory": "2Gi"}, "limits": {"memory": "4Gi"}}
    )
    labels = {**labels_of(ASYNC, settings), BIN: ASYNC}
    deployment = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name, "labels": labels},
        # No replicas: KEDA owns them (from zero).
        "spec": {
            "selector": {"matchLabels": {NAME: "inferd", BIN: ASYNC}},
            "template": {"metadata": {"labels": labels}, "spec": pod_spec([container], settings, None)},
        },
    }
    address, database, tls = redis_address(serverless.async_queue)
    target = str(serverless.async_concurrency)
    triggers = []
    for priority in serverless.async_priorities:
        where = {"address": address, "databaseIndex": database, "stream": stream_name(priority), "consumerGroup": GROUP}
        if tls:
            where["enableTLS"] = "true"
        triggers += [
            # Jobs no worker took yet: wakes the first worker from zero, adds one a `target` of them.
            {"type": "redis-streams", "name": f"waiting-{priority}",
             "metadata": {**where, "lagCount": target, "activationLagCount": "0"}},
            # Jobs workers run: at least one worker while any runs.
            {"type": "redis-streams", "name": f"running-{priority}",
             "metadata": {**where, "pendingEntriesCount": target}},
        ]  # fmt: skip
    scaled = {
        "apiVersion": "keda.sh/v1alpha1",
        "kind": "ScaledObject",
        "metadata": {"name": name, "labels": labels},
        "spec": {
            "scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": name},
            "minReplicaCount": 0,
            "maxReplicaCount": settings.max_replicas,
            "pollingInterval": 15,
            # The last worker stays this long after the queue empties.
            "cooldownPeriod": serverless.scale_down_delay_s,
            "triggers": triggers,
        },
    }
    return [deployment, service(ASYNC, {BIN: ASYNC}, settings), scaled]
