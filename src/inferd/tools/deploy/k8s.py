"""A plan as Kubernetes objects (plain dicts, written as YAML by `kustomize.py`).

Every instance of the plan is one Deployment ("bin"): inferd in explicit model-control mode,
loading its models from the (S3) repository at start, with requests and limits from the plan,
probes on the health endpoints, graceful termination longer than inferd's own drain, a
HorizontalPodAutoscaler and a PodDisruptionBudget. Each route of the plan (the set of bins that
hold a model) is a Service, and one Ingress sends `/v2/models/{m}` to the route of `m`."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from inferd.tools.plan.plan_file import Plan, PlannedInstance, Route, routes

Manifest = dict[str, Any]
NAME = "app.kubernetes.io/name"
PART_OF = "app.kubernetes.io/part-of"
BIN = "inferd.dev/bin"
HTTP, GRPC, METRICS = 8000, 8001, 8002
USER_ID = 10001
"""The image's non-root user (Dockerfile)."""


@dataclass(frozen=True, slots=True)
class DeploySettings:
    image: str
    model_repository: str
    """Where every bin loads its models from: s3://bucket/prefix (or any URL inferd serve takes)."""
    namespace: str = "inferd"
    credentials_secret: str = "inferd-s3"
    """A Secret with AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY (and AWS_REGION), optional."""
    s3_endpoint: str = ""
    """AWS_ENDPOINT_URL, for S3-compatible stores (MinIO); empty for AWS."""
    shutdown_timeout_s: float = 30.0
    autoscale: Literal["cpu", "queue"] = "cpu"
    max_replicas: int = 4
    queue_target: float = 4.0
    """Queued requests a pod may average before the queue autoscaler adds one."""
    ingress_class: str = "nginx"
    ingress_host: str = ""
    node_selector: bool = True
    """Pin each bin to its planned instance type (node.kubernetes.io/instance-type)."""
    pipeline_front: str = ""
    """The split pipeline: the front's repository (tokenizer, pooling, ensemble; its remote model
    pointing at 127.0.0.1:9000) ..."""
    pipeline_model: str = ""
    """... and the model side's repository, served in the same pod on 127.0.0.1:9000."""
    pipeline_routes: tuple[str, ...] = ()
    """Models the Ingress sends to the pipeline pod."""
    labels: Mapping[str, str] = field(default_factory=dict)


def objects(plan: Plan, settings: DeploySettings) -> dict[str, list[Manifest]]:
    """The base's files and their objects: namespace, one file per bin, routes, ingress, pipeline."""
    plan_routes = routes(plan)
    member_of: dict[str, list[str]] = {}
    for route in plan_routes:
        if len(route.instances) > 1:
            for holder in route.instances:
                member_of.setdefault(holder, []).append(route.name)
    files: dict[str, list[Manifest]] = {"namespace.yaml": [_namespace(settings)]}
    server_mb = float(plan.settings.get("limits", {}).get("server_memory_mb", 0.0) or 0.0)
    for instance in plan.instances:
        files[f"{instance.name}.yaml"] = [
            _deployment(instance, settings, member_of.get(instance.name, []), server_mb),
            service(instance.name, {BIN: instance.name}, settings),
            _autoscaler(instance.name, settings),
            _disruption_budget(instance.name),
        ]
    shared = [service(r.name, {_route_label(r.name): "member"}, settings) for r in plan_routes if len(r.instances) > 1]
    if shared:
        files["routes.yaml"] = shared
    extra: list[tuple[str, str]] = []
    if settings.pipeline_front:
        files["pipeline.yaml"] = _pipeline(settings)
        extra = [(model, "pipeline") for model in settings.pipeline_routes]
    files["ingress.yaml"] = [_ingress(plan_routes, extra, settings)]
    return files


def resource_name(label: str) -> str:
    return f"inferd-{label}"


def labels_of(component: str, settings: DeploySettings) -> dict[str, str]:
    return {NAME: "inferd", PART_OF: "inferd-fleet", "app.kubernetes.io/component": component, **settings.labels}


def _route_label(route: str) -> str:
    return f"inferd.dev/{route}"


def _namespace(settings: DeploySettings) -> Manifest:
    return {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": settings.namespace}}


def serve_args(repository: str, models: tuple[str, ...], settings: DeploySettings) -> list[str]:
    args = ["serve", "--model-repository", repository, "--model-control-mode", "explicit"]
    for model in models:
        args += ["--load-model", model]
    return [*args, "--shutdown-timeout", f"{settings.shutdown_timeout_s:g}", "--log-format", "json"]


def server_container(name: str, args: list[str], settings: DeploySettings, resources: Manifest) -> Manifest:
    env = [{"name": "AWS_ENDPOINT_URL", "value": settings.s3_endpoint}] if settings.s3_endpoint else []
    probe = {"port": "http"}
    return {
        "name": name,
        "image": settings.image,
        "imagePullPolicy": "IfNotPresent",
        "args": args,
        "env": [{"name": "HOME", "value": "/tmp"}, *env],
        "envFrom": [{"secretRef": {"name": settings.credentials_secret, "optional": True}}],
        "ports": [
            {"name": "http", "containerPort": HTTP, "protocol": "TCP"},
            {"name": "grpc", "containerPort": GRPC, "protocol": "TCP"},
            {"name": "metrics", "containerPort": METRICS, "protocol": "TCP"},
        ],
        "resources": resources,
        # Models come from S3 at start: the startup probe gives that up to 10 minutes; then
        # readiness takes a pod out of its Services at once, liveness restarts one that hangs.
        "startupProbe": {"httpGet": {"path": "/v2/health/ready", **probe}, "periodSeconds": 5, "failureThreshold": 120},
        "readinessProbe": {
            "httpGet": {"path": "/v2/health/ready", **probe},
            "periodSeconds": 5,
            "failureThreshold": 2,
            "timeoutSeconds": 2,
        },
        "livenessProbe": {
            "httpGet": {"path": "/v2/health/live", **probe},
            "periodSeconds": 10,
            "failureThreshold": 3,
            "timeoutSeconds": 3,
        },
        # Endpoints take a moment to drop a terminating pod: keep serving meanwhile, then drain.
        "lifecycle": {"preStop": {"exec": {"command": ["sleep", "5"]}}},
        "securityContext": {
            "allowPrivilegeEscalation": False,
            "readOnlyRootFilesystem": True,
            "runAsNonRoot": True,
            "capabilities": {"drop": ["ALL"]},
        },
        "volumeMounts": [{"name": "tmp", "mountPath": "/tmp"}],
    }


def pod_spec(containers: list[Manifest], settings: DeploySettings, node_type: str | None) -> Manifest:
    spec: Manifest = {
        # Longer than inferd's drain (--shutdown-timeout) plus the preStop pause, so Kubernetes
        # never kills a pod that is still finishing requests.
        "terminationGracePeriodSeconds": math.ceil(settings.shutdown_timeout_s) + 15,
        "securityContext": {
            "runAsNonRoot": True,
            "runAsUser": USER_ID,
            "runAsGroup": USER_ID,
            "fsGroup": USER_ID,
            "seccompProfile": {"type": "RuntimeDefault"},
        },
        "containers": containers,
        "volumes": [{"name": "tmp", "emptyDir": {}}],
    }
    if node_type and settings.node_selector:
        spec["nodeSelector"] = {"node.kubernetes.io/instance-type": node_type}
    return spec


def resources_of(instance: PlannedInstance, server_mb: float) -> Manifest:
    """Requests: what the plan placed on the instance plus inferd itself; limit: what the plan let
    models fill of the instance (so one bin cannot starve another on a shared node)."""
    cpu = max(100, instance.used["cpu_milli"] + 100)
    memory = math.ceil(instance.used["memory_mb"] + server_mb + 128)
    limit = max(memory, math.ceil(instance.capacity["memory_mb"] + server_mb))
    return {"requests": {"cpu": f"{cpu}m", "memory": f"{memory}Mi"}, "limits": {"memory": f"{limit}Mi"}}


def _deployment(
    instance: PlannedInstance, settings: DeploySettings, routes_of: list[str], server_mb: float
) -> Manifest:
    name = resource_name(instance.name)
    selector = {NAME: "inferd", BIN: instance.name}
    pod_labels = {**labels_of(instance.name, settings), BIN: instance.name}
    pod_labels |= {_route_label(route): "member" for route in routes_of}
    container = server_container(
        "inferd",
        serve_args(settings.model_repository, instance.models, settings),
        settings,
        resources_of(instance, server_mb),
    )
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {
            "name": name,
            "labels": {**labels_of(instance.name, settings), BIN: instance.name},
            "annotations": {"inferd.dev/instance-type": instance.type, "inferd.dev/models": str(len(instance.models))},
        },
        "spec": {
            "replicas": 1,
            "selector": {"matchLabels": selector},
            "strategy": {"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": 0, "maxSurge": 1}},
            "template": {
                "metadata": {
                    "labels": pod_labels,
                    "annotations": {
                        "prometheus.io/scrape": "true",
                        "prometheus.io/port": str(METRICS),
                        "prometheus.io/path": "/metrics",
                    },
                },
                "spec": pod_spec([container], settings, instance.type),
            },
        },
    }


def service(label: str, selector: dict[str, str], settings: DeploySettings) -> Manifest:
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": resource_name(label), "labels": labels_of(label, settings)},
        "spec": {
            "selector": {NAME: "inferd", **selector},
            "ports": [
                {"name": "http", "port": HTTP, "targetPort": "http", "protocol": "TCP"},
                {
                    "name": "grpc",
                    "port": GRPC,
                    "targetPort": "grpc",
                    "protocol": "TCP",
                    "appProtocol": "kubernetes.io/h2c",
                },
                {"name": "metrics", "port": METRICS, "targetPort": "metrics", "protocol": "TCP"},
            ],
        },
    }


def _autoscaler(label: str, settings: DeploySettings) -> Manifest:
    if settings.autoscale == "queue":
        # inferd_queue_depth through the custom metrics API (prometheus-adapter; see the README).
        metric: Manifest = {
            "type": "Pods",
            "pods": {
                "metric": {"name": "inferd_queue_depth"},
                "target": {"type": "AverageValue", "averageValue": f"{settings.queue_target:g}"},
            },
        }
    else:
        # A bin requests the CPU its models use at their planned rates: above 100% of the request,
        # more traffic came than planned, and another pod of the bin shares it.
        metric = {
            "type": "Resource",
            "resource": {"name": "cpu", "target": {"type": "Utilization", "averageUtilization": 100}},
        }
    return {
        "apiVersion": "autoscaling/v2",
        "kind": "HorizontalPodAutoscaler",
        "metadata": {"name": resource_name(label), "labels": labels_of(label, settings)},
        "spec": {
            "scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": resource_name(label)},
            "minReplicas": 1,
            "maxReplicas": settings.max_replicas,
            "metrics": [metric],
        },
    }


def _disruption_budget(label: str) -> Manifest:
    return {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": {"name": resource_name(label)},
        "spec": {"maxUnavailable": 1, "selector": {"matchLabels": {NAME: "inferd", BIN: label}}},
    }


def _ingress(plan_routes: list[Route], extra: list[tuple[str, str]], settings: DeploySettings) -> Manifest:
    paths = [
        {
            "path": f"/v2/models/{model}",
            "pathType": "Prefix",
            "backend": {"service": {"name": resource_name(route.name), "port": {"name": "http"}}},
        }
        for route in plan_routes
        for model in route.models
    ]
    paths += [
        {
            "path": f"/v2/models/{model}",
            "pathType": "Prefix",
            "backend": {"service": {"name": resource_name(target), "port": {"name": "http"}}},
        }
        for model, target in extra
    ]
    rule: Manifest = {"http": {"paths": paths}}
    if settings.ingress_host:
        rule["host"] = settings.ingress_host
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "Ingress",
        "metadata": {
            "name": "inferd",
            "labels": labels_of("ingress", settings),
            # Inference is a POST: ingress-nginx retries it on another pod only when told it may.
            "annotations": {
                "nginx.ingress.kubernetes.io/proxy-body-size": "64m",
                "nginx.ingress.kubernetes.io/proxy-next-upstream": "error timeout http_502 http_503 non_idempotent",
                "nginx.ingress.kubernetes.io/proxy-next-upstream-tries": "2",
            },
        },
        "spec": {"ingressClassName": settings.ingress_class, "rules": [rule]},
    }


def _pipeline(settings: DeploySettings) -> list[Manifest]:
    """The split tokenizer / model pipeline: two containers in one pod, the front calling the
    model side over loopback (its remote model's url 127.0.0.1:9000)."""
    front = server_container(
        "front",
        serve_args(settings.pipeline_front, ("*",), settings),
        settings,
        {"requests": {"cpu": "500m", "memory": "512Mi"}, "limits": {"memory": "1Gi"}},
    )
    model_args = [
        *serve_args(settings.pipeline_model, ("*",), settings),
        "--host",
        "127.0.0.1",
        "--http-port",
        "9000",
        "--grpc-port",
        "9001",
        "--metrics-port",
        "9002",
    ]
    model = server_container(
        "model", model_args, settings, {"requests": {"cpu": "1", "memory": "1Gi"}, "limits": {"memory": "2Gi"}}
    )
    model["ports"] = [{"name": "model-metrics", "containerPort": 9002, "protocol": "TCP"}]
    # Bound to loopback: probed by command, the image's own health check.
    check = ["inferd", "health", "--url", "http://127.0.0.1:9000"]
    model["startupProbe"] = {"exec": {"command": check}, "periodSeconds": 5, "failureThreshold": 120}
    model["readinessProbe"] = {
        "exec": {"command": check},
        "periodSeconds": 5,
        "failureThreshold": 2,
        "timeoutSeconds": 4,
    }
    model["livenessProbe"] = {
        "exec": {"command": [*check, "--live"]},
        "periodSeconds": 10,
        "failureThreshold": 3,
        "timeoutSeconds": 4,
    }
    labels = {**labels_of("pipeline", settings), BIN: "pipeline"}
    deployment = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": resource_name("pipeline"), "labels": labels},
        "spec": {
            "replicas": 1,
            "selector": {"matchLabels": {NAME: "inferd", BIN: "pipeline"}},
            "template": {
                "metadata": {
                    "labels": labels,
                    "annotations": {
                        "prometheus.io/scrape": "true",
                        "prometheus.io/port": str(METRICS),
                        "prometheus.io/path": "/metrics",
                    },
                },
                "spec": pod_spec([model, front], settings, None),
            },
        },
    }
    return [deployment, service("pipeline", {BIN: "pipeline"}, settings)]
